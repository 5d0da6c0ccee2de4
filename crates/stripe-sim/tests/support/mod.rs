//! A simulator per test, on its own port, driven over plain HTTP with reqwest, the way the
//! fleet's Stripe client and the end-to-end tests reach it.

#![allow(dead_code)] // Each test binary uses its own subset.

pub mod receiver;

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const KEY: &str = "sk_test_stripe_sim_tests";

/// A card confirmed on the server, as SPEC §1.1 has the fleet create it: no redirect-based
/// methods, so no `return_url`.
pub const NO_REDIRECTS: &str = "&automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never&use_stripe_sdk=true";

/// What the fleet sends to authorize an order.
pub const AUTHORIZE: &str = "amount=2500&currency=usd&capture_method=manual&confirm=true&payment_method=pm_card_visa\
     &automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never&use_stripe_sdk=true\
     &metadata[order_id]=order-1&metadata[user_id]=user-1";

pub struct TestSim {
    pub base: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub raw: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn error_type(&self) -> &str {
        self.body["error"]["type"].as_str().unwrap_or_default()
    }

    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }
}

impl TestSim {
    /// A fresh simulator whose API admits `per_second` requests a second, set through
    /// `/_sim/rate_limit` as a test or a demo sets it.
    pub async fn limited_to(per_second: u32) -> Self {
        let sim = Self::start().await;
        sim.set_rate_limit(per_second).await;
        sim
    }

    /// A fresh simulator with one fault armed (`POST /_sim/faults`).
    pub async fn with_fault(operation: &str, mode: &str, count: u32) -> Self {
        let sim = Self::start().await;
        sim.arm(operation, mode, count).await;
        sim
    }

    /// A fresh simulator, as `stripe_sim::serve` serves it.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a free port");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(stripe_sim::serve(listener, async {
            let _ = stopped.await;
        }));
        Self::serving(base, stop, server)
    }

    /// `simulator`, as `stripe_sim::serve_with` serves it.
    pub async fn start_with(simulator: stripe_sim::Simulator) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a free port");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(stripe_sim::serve_with(Arc::new(simulator), listener, async {
            let _ = stopped.await;
        }));
        Self::serving(base, stop, server)
    }

    fn serving(base: String, stop: oneshot::Sender<()>, server: JoinHandle<std::io::Result<()>>) -> Self {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        Self { base, client, stop: Some(stop), server: Some(server) }
    }

    /// Stops the server and waits for it, failing if it takes longer than `within`.
    pub async fn stop(mut self, within: Duration) {
        let _ = self.stop.take().unwrap().send(());
        let server = self.server.take().unwrap();
        tokio::time::timeout(within, server)
            .await
            .expect("the server stops within the deadline")
            .unwrap()
            .unwrap();
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A form POST with the test key, and optionally an idempotency key.
    pub fn post_request(
        &self,
        path: &str,
        form: &str,
        idempotency_key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(self.url(path))
            .bearer_auth(KEY)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.to_owned());
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        request
    }

    pub async fn post(&self, path: &str, form: &str, idempotency_key: Option<&str>) -> Answer {
        answer(self.post_request(path, form, idempotency_key).send().await.expect("an answer")).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        answer(self.client.get(self.url(path)).bearer_auth(KEY).send().await.expect("an answer")).await
    }

    pub async fn create(&self, form: &str) -> Answer {
        self.post("/v1/payment_intents", form, None).await
    }

    /// An authorized (requires_capture) intent's id.
    pub async fn authorized(&self) -> String {
        let created = self.create(AUTHORIZE).await;
        assert_eq!(created.status, StatusCode::OK, "{}", created.raw);
        created.body["id"].as_str().unwrap().to_owned()
    }

    pub async fn capture(&self, id: &str, key: Option<&str>) -> Answer {
        self.post(&action_path(id, "capture"), "", key).await
    }

    pub async fn cancel(&self, id: &str, key: Option<&str>) -> Answer {
        self.post(&action_path(id, "cancel"), "", key).await
    }

    pub async fn fault(&self, fault: Value) -> Answer {
        answer(self.client.post(self.url("/_sim/faults")).json(&fault).send().await.expect("an answer")).await
    }

    pub async fn arm(&self, operation: &str, mode: &str, count: u32) {
        let armed = self.fault(json!({"operation": operation, "mode": mode, "count": count})).await;
        assert_eq!(armed.status, StatusCode::OK, "{}", armed.raw);
    }

    /// `POST /_sim/rate_limit` with `body`, as is.
    pub async fn post_rate_limit(&self, body: &str) -> Answer {
        let request = self
            .client
            .post(self.url("/_sim/rate_limit"))
            .header("content-type", "application/json")
            .body(body.to_owned());
        answer(request.send().await.expect("an answer")).await
    }

    /// Limits the API to `per_second` requests a second (0: no limit), leaving the limit on
    /// each operation as it is, as a caller that knows only the account's limit does.
    pub async fn set_rate_limit(&self, per_second: u32) {
        let set = self.post_rate_limit(&json!({ "per_second": per_second }).to_string()).await;
        assert_eq!(set.status, StatusCode::OK, "{}", set.raw);
        assert_eq!(set.body["per_second"], per_second, "{}", set.raw);
    }

    /// Limits each named operation to `per_endpoint` requests a second (0: no limit), leaving
    /// the account's limit as it is.
    pub async fn set_endpoint_rate_limit(&self, per_endpoint: u32) {
        let set = self.post_rate_limit(&json!({ "per_endpoint": per_endpoint }).to_string()).await;
        assert_eq!(set.status, StatusCode::OK, "{}", set.raw);
        assert_eq!(set.body["per_endpoint"], per_endpoint, "{}", set.raw);
    }

    /// A `/_sim/…` (or `/healthz`) GET, without the API key: these are not Stripe's routes.
    pub async fn get_sim(&self, path: &str) -> Answer {
        answer(self.client.get(self.url(path)).send().await.expect("an answer")).await
    }

    /// `GET /_sim/stats`.
    pub async fn stats(&self) -> Value {
        let stats = self.get_sim("/_sim/stats").await;
        assert_eq!(stats.status, StatusCode::OK, "{}", stats.raw);
        stats.body
    }

    /// `GET /_sim/payment_intents`' `data`.
    pub async fn intents(&self) -> Vec<Value> {
        let listed =
            answer(self.client.get(self.url("/_sim/payment_intents")).send().await.expect("an answer")).await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.raw);
        listed.body["data"].as_array().expect("data is an array").clone()
    }

    pub async fn intent(&self, id: &str) -> Value {
        self.intents().await.into_iter().find(|pi| pi["id"] == id).expect("the intent is listed")
    }
}

impl TestSim {
    /// A fresh simulator delivering its events to `url`, signed with `secret`.
    pub async fn delivering_to(url: &str, secret: &str) -> Self {
        let endpoint = stripe_sim::WebhookEndpoint::new(url, secret);
        Self::start_with(stripe_sim::Simulator::new().with_webhook_endpoint(endpoint)).await
    }

    /// A confirmed manual-capture intent paid with `payment_method`, as the fleet creates it.
    pub async fn authorize_with(&self, payment_method: &str) -> Answer {
        self.create(
            &AUTHORIZE.replace("payment_method=pm_card_visa", &format!("payment_method={payment_method}")),
        )
        .await
    }

    /// `POST /_sim/payment_intents/{id}/authenticate` with `{"outcome": outcome}`.
    pub async fn authenticate(&self, id: &str, outcome: &str) -> Answer {
        self.post_sim(&format!("/_sim/payment_intents/{id}/authenticate"), json!({ "outcome": outcome }))
            .await
    }

    /// `POST /_sim/payment_intents/{id}/expire`.
    pub async fn expire(&self, id: &str) -> Answer {
        self.post_sim(&format!("/_sim/payment_intents/{id}/expire"), json!({})).await
    }

    /// A `/_sim/…` POST of `body`, without the API key.
    pub async fn post_sim(&self, path: &str, body: Value) -> Answer {
        answer(self.client.post(self.url(path)).json(&body).send().await.expect("an answer")).await
    }

    /// `POST /v1/refunds`.
    pub async fn refund(&self, form: &str, idempotency_key: Option<&str>) -> Answer {
        self.post("/v1/refunds", form, idempotency_key).await
    }

    /// The intent with its charge expanded, as `GET /v1/payment_intents/{id}` answers it.
    pub async fn with_charge(&self, id: &str) -> Value {
        let retrieved = self.get(&format!("/v1/payment_intents/{id}?expand[]=latest_charge")).await;
        assert_eq!(retrieved.status, StatusCode::OK, "{}", retrieved.raw);
        retrieved.body
    }

    /// `GET /_sim/webhooks`' `data`: every delivery attempt so far.
    pub async fn webhook_attempts(&self) -> Vec<Value> {
        let listed = self.get_sim("/_sim/webhooks").await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.raw);
        listed.body["data"].as_array().expect("data is an array").clone()
    }
}

/// Polls `condition` until it holds, failing with `what` after `within`.
pub async fn eventually<T>(what: &str, within: Duration, mut condition: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/v1/payment_intents/{id}/{action}`: where an intent is captured or canceled.
pub fn action_path(id: &str, action: &str) -> String {
    format!("/v1/payment_intents/{id}/{action}")
}

/// The answers' statuses, in order: a sequence of requests checked at a glance.
pub fn statuses(answers: &[Answer]) -> Vec<u16> {
    answers.iter().map(|a| a.status.as_u16()).collect()
}

/// A listed intent's (`/_sim/payment_intents`) capture and cancel request counts.
pub fn request_counts(listed: &Value) -> (u64, u64) {
    let count = |name: &str| listed[name].as_u64().unwrap_or_else(|| panic!("no {name} in {listed}"));
    (count("capture_count"), count("cancel_count"))
}

pub async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let raw = response.text().await.expect("a body");
    let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
    Answer { status, headers, body, raw }
}
