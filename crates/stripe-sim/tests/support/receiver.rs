//! A webhook endpoint for tests: an axum server on its own port that keeps every request it
//! gets and answers `503` to the first few, then `200`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use tokio::net::TcpListener;

pub const SECRET: &str = "whsec_stripe_sim_tests";

/// One request the endpoint got.
#[derive(Debug, Clone)]
pub struct Received {
    pub content_type: Option<String>,
    pub signature: Option<String>,
    pub body: String,
    pub event: Value,
}

impl Received {
    pub fn event_id(&self) -> &str {
        self.event["id"].as_str().unwrap_or_default()
    }

    pub fn event_type(&self) -> &str {
        self.event["type"].as_str().unwrap_or_default()
    }

    /// The event's `data.object`.
    pub fn object(&self) -> &Value {
        &self.event["data"]["object"]
    }
}

#[derive(Default)]
struct Inbox {
    received: Mutex<Vec<Received>>,
    refuse: AtomicU32,
}

pub struct Receiver {
    pub url: String,
    inbox: Arc<Inbox>,
}

impl Receiver {
    /// An endpoint that accepts everything.
    pub async fn start() -> Self {
        Self::refusing_first(0).await
    }

    /// An endpoint that answers `503` to its first `refusals` requests, then `200`.
    pub async fn refusing_first(refusals: u32) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a free port");
        Self::serving(listener, refusals)
    }

    /// An endpoint on `listener`, accepting everything.
    pub fn on(listener: TcpListener) -> Self {
        Self::serving(listener, 0)
    }

    fn serving(listener: TcpListener, refusals: u32) -> Self {
        let url = format!("http://{}/webhooks/stripe", listener.local_addr().unwrap());
        let inbox = Arc::new(Inbox { refuse: AtomicU32::new(refusals), ..Inbox::default() });
        let app = Router::new().route("/webhooks/stripe", post(receive)).with_state(inbox.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, inbox }
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.inbox.received.lock().unwrap().clone()
    }

    /// The types of the events received so far about object `id` (in `data.object.id`,
    /// `data.object.payment_intent` for a charge or a dispute), in arrival order.
    pub fn types_for(&self, id: &str) -> Vec<String> {
        self.received()
            .iter()
            .filter(|r| r.object()["id"] == id || r.object()["payment_intent"] == id)
            .map(|r| r.event_type().to_owned())
            .collect()
    }
}

async fn receive(State(inbox): State<Arc<Inbox>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = String::from_utf8(body.to_vec()).expect("a UTF-8 body");
    let event = serde_json::from_str(&body).unwrap_or(Value::Null);
    inbox.received.lock().unwrap().push(Received {
        content_type: header("content-type"),
        signature: header("stripe-signature"),
        body,
        event,
    });
    let refused = inbox.refuse.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    if refused { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK }
}

/// Whether `header` is a valid `Stripe-Signature` of `body` under `secret`, within 300 s of
/// now, checked the way Stripe's guide says (docs.stripe.com/webhooks#verify-manually): any
/// `v1` equal to the hex HMAC-SHA256 of `"{t}.{body}"`.
pub fn verifies(header: &str, body: &str, secret: &str) -> bool {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for element in header.split(',') {
        match element.split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", v1)) => signatures.push(v1.to_owned()),
            _ => {}
        }
    }
    let Some(timestamp) = timestamp else { return false };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.{body}").as_bytes());
    let expected = hex::encode(mac.finalize().into_bytes());
    (now - timestamp).abs() <= 300 && signatures.contains(&expected)
}
