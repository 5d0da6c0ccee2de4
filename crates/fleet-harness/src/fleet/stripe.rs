//! The stripe-sim view of the fleet: its faults, rate limits and stats, the PaymentIntents
//! ledger, the buyer's 3-D Secure, holds lapsing, refunds, and the webhooks it sends (or a
//! test posts) to the intake.

use anyhow::Context;
use serde_json::Value;

use super::Fleet;

impl Fleet {
    /// stripe-sim's ledger: every PaymentIntent with its capture and cancel counts.
    pub async fn intents(&self) -> anyhow::Result<Vec<Value>> {
        let ledger: Value =
            self.http.get(format!("{}/_sim/payment_intents", self.stripe_url)).send().await?.json().await?;
        Ok(ledger["data"].as_array().cloned().unwrap_or_default())
    }

    /// Arms a stripe-sim fault: the next `count` requests of `operation` fail in `mode` (SPEC §6).
    pub async fn fault(&self, operation: &str, mode: &str, count: u32) -> anyhow::Result<()> {
        let body = serde_json::json!({ "operation": operation, "mode": mode, "count": count });
        self.sim_control("faults", &body).await
    }

    /// Makes stripe-sim's search lag its writes by `seconds`, as Stripe's does.
    pub async fn search_lag(&self, seconds: u32) -> anyhow::Result<()> {
        self.sim_control("search_lag", &serde_json::json!({ "seconds": seconds })).await
    }

    /// Posts `body` to stripe-sim's `/_sim/{route}`, which must accept it.
    async fn sim_control(&self, route: &str, body: &Value) -> anyhow::Result<()> {
        let response = self.http.post(format!("{}/_sim/{route}", self.stripe_url)).json(body).send().await?;
        anyhow::ensure!(response.status().is_success(), "{route} not accepted: {}", response.status());
        Ok(())
    }

    /// Authorizes 10.00 usd for `order_id` at stripe-sim directly, as the intake would have:
    /// the PaymentIntent, holding funds ([`hold_at_stripe`]).
    pub async fn hold_at_stripe(&self, order_id: uuid::Uuid) -> anyhow::Result<Value> {
        hold_at_stripe(&self.http, &self.stripe_url, order_id).await
    }

    /// `POST /v1/payment_intents` at stripe-sim with `form`, under `idempotency_key` if given
    /// ([`create_at_stripe`]).
    pub async fn create_at_stripe(
        &self,
        idempotency_key: Option<&str>,
        form: &[(&str, &str)],
    ) -> anyhow::Result<reqwest::Response> {
        create_at_stripe(&self.http, &self.stripe_url, idempotency_key, form).await
    }

    /// The buyer's browser completing (or failing) 3-D Secure for `payment_intent`, as
    /// stripe-sim stands in for it (`POST /_sim/payment_intents/{id}/authenticate`).
    pub async fn authenticate(&self, payment_intent: &str, succeed: bool) -> anyhow::Result<()> {
        let outcome = if succeed { "succeed" } else { "fail" };
        let route = format!("payment_intents/{payment_intent}/authenticate");
        self.sim_control(&route, &serde_json::json!({ "outcome": outcome })).await
    }

    /// The buyer of `order_id` (awaiting 3-D Secure) completing it: its PaymentIntent read
    /// from the order, then [`Fleet::authenticate`].
    pub async fn authenticate_order(&self, order_id: &str) -> anyhow::Result<()> {
        let intent: String = sqlx::query_scalar("SELECT payment_intent_id FROM orders WHERE id = $1::uuid")
            .bind(order_id)
            .fetch_one(&self.pool)
            .await?;
        self.authenticate(&intent, true).await
    }

    /// Time passing for `payment_intent`'s hold: it lapses, as Stripe cancels it
    /// (`POST /_sim/payment_intents/{id}/expire`).
    pub async fn expire_hold(&self, payment_intent: &str) -> anyhow::Result<()> {
        self.sim_control(&format!("payment_intents/{payment_intent}/expire"), &serde_json::json!({})).await
    }

    /// Refunds `amount` (everything when `None`) of `payment_intent` at stripe-sim, as an
    /// operator does in Stripe's Dashboard.
    pub async fn refund_at_stripe(&self, payment_intent: &str, amount: Option<i64>) -> anyhow::Result<Value> {
        let mut form = vec![("payment_intent", payment_intent.to_owned())];
        form.extend(amount.map(|a| ("amount", a.to_string())));
        let response = self
            .http
            .post(format!("{}/v1/refunds", self.stripe_url))
            .bearer_auth("sk_test_stripe_sim_placeholder")
            .form(&form)
            .send()
            .await?;
        anyhow::ensure!(response.status().is_success(), "refund refused: {}", response.text().await?);
        Ok(response.json().await?)
    }

    /// stripe-sim's webhook deliveries (`GET /_sim/webhooks`): `{event_id, type, status}` each.
    pub async fn webhook_deliveries(&self) -> anyhow::Result<Vec<Value>> {
        let answer: Value =
            self.http.get(format!("{}/_sim/webhooks", self.stripe_url)).send().await?.json().await?;
        Ok(answer["data"].as_array().cloned().unwrap_or_default())
    }

    /// Makes stripe-sim hold each webhook event `delay_ms` before sending it once: as Stripe,
    /// after the answer of the request that caused it.
    pub async fn delay_webhooks(&self, delay_ms: u64) -> anyhow::Result<()> {
        let mode =
            serde_json::json!({ "duplicate": false, "min_delay_ms": delay_ms, "max_delay_ms": delay_ms });
        self.sim_control("webhooks", &mode).await
    }

    /// Makes stripe-sim send each webhook event twice, each copy held 0..`max_delay_ms`.
    pub async fn duplicate_webhooks(&self, max_delay_ms: u64) -> anyhow::Result<()> {
        self.sim_control("webhooks", &serde_json::json!({ "duplicate": true, "max_delay_ms": max_delay_ms }))
            .await
    }

    /// Posts `body` to the intake's `/webhooks/stripe` with `signature` as `Stripe-Signature`.
    pub async fn post_webhook(&self, body: &str, signature: Option<&str>) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .post(format!("{}/webhooks/stripe", self.intake_url))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// Limits stripe-sim's request rate (0 clears it), as Stripe limits an account's.
    pub async fn stripe_rate_limit(&self, per_second: u32) -> anyhow::Result<()> {
        self.sim_control("rate_limit", &serde_json::json!({ "per_second": per_second })).await
    }

    /// Limits stripe-sim's request rate per account and on each named operation, as Stripe
    /// does (0 clears either).
    pub async fn stripe_rate_limits(&self, per_second: u32, per_endpoint: u32) -> anyhow::Result<()> {
        let limits = serde_json::json!({ "per_second": per_second, "per_endpoint": per_endpoint });
        self.sim_control("rate_limit", &limits).await
    }

    /// stripe-sim's counts: `requests`, `rate_limited`, `max_requests_in_one_second`.
    pub async fn stripe_stats(&self) -> anyhow::Result<Value> {
        Ok(self.http.get(format!("{}/_sim/stats", self.stripe_url)).send().await?.json().await?)
    }

    /// A new PaymentMethod that behaves as the test card `like` with the card fingerprint
    /// `fingerprint` (`POST /_sim/payment_methods`): one card that several buyers, or one buyer
    /// with several accounts, type in. Its id.
    pub async fn card(&self, like: &str, fingerprint: &str) -> anyhow::Result<String> {
        let body = serde_json::json!({ "like": like, "fingerprint": fingerprint });
        let response =
            self.http.post(format!("{}/_sim/payment_methods", self.stripe_url)).json(&body).send().await?;
        anyhow::ensure!(response.status().is_success(), "payment method not minted: {}", response.status());
        let method: Value = response.json().await?;
        method["id"].as_str().map(str::to_owned).context("no id in the minted payment method")
    }

    /// The requests stripe-sim received on the named operation `endpoint`
    /// (`"GET /v1/payment_methods/{id}"`), admitted or not.
    pub async fn stripe_requests_on(&self, endpoint: &str) -> anyhow::Result<u64> {
        Ok(self.stripe_stats().await?["requests_by_endpoint"][endpoint].as_u64().unwrap_or(0))
    }

    /// The TCP connections stripe-sim accepted (`GET /_sim/connections`).
    pub async fn stripe_connections(&self) -> anyhow::Result<u64> {
        let answer: Value =
            self.http.get(format!("{}/_sim/connections", self.stripe_url)).send().await?.json().await?;
        answer["connections"].as_u64().context("no connections in stripe-sim's answer")
    }
}

/// Authorizes 10.00 usd for `order_id` at the stripe-sim at `stripe_url` directly, outside any
/// fleet key, as the intake would have: the PaymentIntent, holding funds. For a test with no
/// [`Fleet`] too (an in-process stripe-sim).
pub async fn hold_at_stripe(
    http: &reqwest::Client,
    stripe_url: &str,
    order_id: uuid::Uuid,
) -> anyhow::Result<Value> {
    let order_id = order_id.to_string();
    let form = [
        ("amount", "1000"),
        ("currency", "usd"),
        ("capture_method", "manual"),
        ("confirm", "true"),
        ("payment_method", "pm_card_visa"),
        ("automatic_payment_methods[enabled]", "true"),
        ("automatic_payment_methods[allow_redirects]", "never"),
        ("use_stripe_sdk", "true"),
        ("metadata[order_id]", order_id.as_str()),
    ];
    Ok(create_at_stripe(http, stripe_url, None, &form).await?.json().await?)
}

/// `POST /v1/payment_intents` at the stripe-sim at `stripe_url` with `form`, under
/// `idempotency_key` if given: a create as some client (the intake, or a release of it) sent it.
pub async fn create_at_stripe(
    http: &reqwest::Client,
    stripe_url: &str,
    idempotency_key: Option<&str>,
    form: &[(&str, &str)],
) -> anyhow::Result<reqwest::Response> {
    let mut request = http
        .post(format!("{stripe_url}/v1/payment_intents"))
        .bearer_auth("sk_test_stripe_sim_placeholder")
        .form(form);
    if let Some(key) = idempotency_key {
        request = request.header("Idempotency-Key", key);
    }
    Ok(request.send().await?)
}
