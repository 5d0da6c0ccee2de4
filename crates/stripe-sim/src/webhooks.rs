//! Webhook delivery: the simulator's events, sent to one endpoint as Stripe sends them
//! (docs.stripe.com/webhooks): a `POST` of the JSON Event, `Content-Type: application/json;
//! charset=utf-8`, signed in `Stripe-Signature` ([`crate::signature_header`]), at least once.
//!
//! An operation queues its events under the simulator's lock (an unbounded channel: queueing
//! never waits); a background task started by [`crate::serve_with`] takes them off the queue
//! and delivers each in a task of its own, so an API answer never waits for the endpoint and a
//! slow endpoint never holds the lock. A delivery that gets no answer (refused connection, no
//! answer within [`ATTEMPT_TIMEOUT`]) or a non-`2xx` is tried again after a backoff that
//! starts at [`FIRST_RETRY`] and doubles up to [`LAST_RETRY`], until a `2xx`, the last of its
//! attempts (`STRIPE_SIM_WEBHOOK_ATTEMPTS`, [`DEFAULT_ATTEMPTS`] unless set), or the server
//! stops. After its last failed attempt the event is given up: nothing sends it again. That is
//! Stripe's rule too: in live mode it retries for up to three days with exponential backoff,
//! in a sandbox three times over a few hours, and then stops (docs.stripe.com/webhooks
//! #retries, docs.stripe.com/webhooks/process-undelivered-events). Stripe's schedule is much
//! slower; this one is quick so that a test sees its retries, and their end.
//! Each copy is signed afresh, with the time of its attempt, as Stripe does for retries.
//!
//! Stripe does not promise order or uniqueness ("endpoints might occasionally receive the
//! same event more than once", "Stripe doesn't guarantee the delivery of events in the order
//! in which they're generated"; docs.stripe.com/webhooks#handle-duplicate-events,
//! #event-ordering). `POST /_sim/webhooks` makes both happen on purpose: each event sent
//! twice, each copy held a random time first ([`DeliveryMode`]).
//!
//! Every attempt is recorded ([`WebhookAttempt`], `GET /_sim/webhooks`), with the status the
//! endpoint answered, 0 when it gave none.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::Rng;
use reqwest::header::{CONTENT_TYPE, HeaderValue, USER_AGENT};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::events::{Event, signature_header};
use crate::ids::unix_now;

/// How long one attempt waits for the endpoint's answer.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait before the first retry.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
pub(crate) const LAST_RETRY: Duration = Duration::from_secs(2);
/// The attempts of one event before it is given up: a sandbox's (docs.stripe.com/webhooks
/// #retries).
pub const DEFAULT_ATTEMPTS: NonZeroU32 = NonZeroU32::new(3).expect("3 is not zero");

/// Where the simulator sends its events, and the secret it signs them with
/// (`STRIPE_SIM_WEBHOOK_URL`, `STRIPE_SIM_WEBHOOK_SECRET`). The secret never prints.
#[derive(Debug, Clone)]
pub struct WebhookEndpoint {
    url: String,
    secret: SecretString,
}

impl WebhookEndpoint {
    /// The endpoint at `url` (e.g. `http://127.0.0.1:8080/webhooks/stripe`), signing with
    /// `secret` (e.g. `whsec_…`).
    pub fn new(url: impl Into<String>, secret: impl Into<String>) -> Self {
        Self { url: url.into(), secret: SecretString::from(secret.into()) }
    }

    /// Where events go.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// One delivery attempt: which event, of which type, and the HTTP status the endpoint
/// answered (0 when it gave none: refused, reset, or timed out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebhookAttempt {
    /// The event's `id` (`evt_…`).
    pub event_id: String,
    /// The event's `type`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The endpoint's answer; 0 for none.
    pub status: u16,
}

/// How events are sent: once, or twice, and held a random `min_delay_ms`..=`max_delay_ms` ms
/// first (Stripe sends them asynchronously, after the request that caused them has answered;
/// a minimum holds each event until its request's answer has surely arrived).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DeliveryMode {
    pub(crate) duplicate: bool,
    pub(crate) min_delay_ms: u64,
    pub(crate) max_delay_ms: u64,
}

impl DeliveryMode {
    fn copies(self) -> usize {
        if self.duplicate { 2 } else { 1 }
    }

    fn delay(self) -> Duration {
        let (min, max) = (self.min_delay_ms, self.max_delay_ms.max(self.min_delay_ms));
        match max {
            0 => Duration::ZERO,
            max => Duration::from_millis(rand::rng().random_range(min..=max)),
        }
    }
}

/// The simulator's webhook side: the endpoint, the queue, the attempts made.
#[derive(Debug)]
pub(crate) struct Webhooks {
    endpoint: Option<WebhookEndpoint>,
    /// The attempts of one event (of each copy, when duplicated) before it is given up.
    attempts: AtomicU32,
    queue: mpsc::UnboundedSender<Event>,
    /// The queue's other end, until the delivery task takes it.
    unsent: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    record: Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    attempts: Vec<WebhookAttempt>,
    mode: DeliveryMode,
}

impl Webhooks {
    pub(crate) fn new(endpoint: Option<WebhookEndpoint>) -> Self {
        let (queue, unsent) = mpsc::unbounded_channel();
        Self {
            endpoint,
            attempts: AtomicU32::new(DEFAULT_ATTEMPTS.get()),
            queue,
            unsent: Mutex::new(Some(unsent)),
            record: Mutex::default(),
        }
    }

    /// Bounds the attempts of each event from now on.
    pub(crate) fn set_attempts(&self, attempts: NonZeroU32) {
        self.attempts.store(attempts.get(), Ordering::Relaxed);
    }

    pub(crate) fn max_attempts(&self) -> NonZeroU32 {
        NonZeroU32::new(self.attempts.load(Ordering::Relaxed)).unwrap_or(DEFAULT_ATTEMPTS)
    }

    /// Queues `events` for delivery; with no endpoint there is nobody to tell.
    pub(crate) fn send(&self, events: Vec<Event>) {
        if self.endpoint.is_none() {
            return;
        }
        for event in events {
            tracing::debug!(event_id = %event.id, event_type = event.kind.as_str(), "event queued");
            // Fails only once the delivery task is gone (the server stopped): nobody to tell.
            let _ = self.queue.send(event);
        }
    }

    pub(crate) fn attempts(&self) -> Vec<WebhookAttempt> {
        lock(&self.record).attempts.clone()
    }

    pub(crate) fn forget_attempts(&self) {
        lock(&self.record).attempts.clear();
    }

    pub(crate) fn mode(&self) -> DeliveryMode {
        lock(&self.record).mode
    }

    pub(crate) fn set_mode(&self, mode: DeliveryMode) {
        lock(&self.record).mode = mode;
    }

    fn recorded(&self, attempt: WebhookAttempt) {
        lock(&self.record).attempts.push(attempt);
    }
}

/// A poisoned lock means a panic elsewhere; the record is still the best there is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts delivering `sim`'s events until `stop` fires, if it has an endpoint and nobody
/// started it yet.
pub(crate) fn start(webhooks: &Arc<Webhooks>, stop: CancellationToken) {
    let Some(endpoint) = webhooks.endpoint.clone() else { return };
    let Some(unsent) = lock(&webhooks.unsent).take() else { return };
    tracing::info!(url = endpoint.url(), "delivering webhooks");
    tokio::spawn(deliver_all(webhooks.clone(), unsent, endpoint, stop));
}

/// The delivery task: one task per copy of each event, until `stop`.
async fn deliver_all(
    webhooks: Arc<Webhooks>,
    mut unsent: mpsc::UnboundedReceiver<Event>,
    endpoint: WebhookEndpoint,
    stop: CancellationToken,
) {
    // No TLS in this reqwest build: stripe-sim delivers to local http:// endpoints.
    let client = match reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot build the webhook client; no webhooks will be sent");
            return;
        }
    };
    let mut deliveries = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(_) = deliveries.join_next(), if !deliveries.is_empty() => {}
            event = unsent.recv() => {
                let Some(event) = event else { break };
                let mode = webhooks.mode();
                for _ in 0..mode.copies() {
                    let copy = Delivery { client: client.clone(), endpoint: endpoint.clone(), event: event.clone() };
                    deliveries.spawn(copy.run(webhooks.clone(), mode.delay()));
                }
            }
        }
    }
    // Dropping the set aborts the deliveries still retrying: the server has stopped.
    drop(deliveries);
}

/// One copy of one event, on its way.
struct Delivery {
    client: reqwest::Client,
    endpoint: WebhookEndpoint,
    event: Event,
}

impl Delivery {
    /// Waits `delay`, then sends until the endpoint answers `2xx`, or gives the event up after
    /// the last of its attempts.
    async fn run(self, webhooks: Arc<Webhooks>, delay: Duration) {
        tokio::time::sleep(delay).await;
        let attempts = webhooks.max_attempts().get();
        let mut backoff = FIRST_RETRY;
        for attempt in 1..=attempts {
            let status = self.attempt().await;
            webhooks.recorded(WebhookAttempt {
                event_id: self.event.id.clone(),
                event_type: self.event.kind.as_str().to_owned(),
                status,
            });
            if (200..300).contains(&status) {
                return;
            }
            if attempt == attempts {
                break;
            }
            tracing::debug!(event_id = %self.event.id, status, attempt, ?backoff, "webhook not accepted; will retry");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(LAST_RETRY);
        }
        tracing::warn!(
            event_id = %self.event.id,
            event_type = self.event.kind.as_str(),
            attempts,
            "webhook not accepted by its last attempt; the event is given up"
        );
    }

    /// One `POST`; the status answered, or 0 for none.
    async fn attempt(&self) -> u16 {
        let signature =
            signature_header(self.endpoint.secret.expose_secret(), unix_now(), self.event.body.as_bytes());
        let sent = self
            .client
            .post(&self.endpoint.url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"))
            .header(USER_AGENT, HeaderValue::from_static("Stripe/1.0 (+https://stripe.com/docs/webhooks)"))
            .header("Stripe-Signature", signature)
            .body(self.event.body.clone())
            .send()
            .await;
        match sent {
            Ok(response) => response.status().as_u16(),
            Err(error) => {
                tracing::debug!(event_id = %self.event.id, %error, "webhook endpoint gave no answer");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicating_mode_sends_two_copies_each_held_at_most_the_delay() {
        let mode = DeliveryMode { duplicate: true, min_delay_ms: 0, max_delay_ms: 50 };
        assert_eq!((DeliveryMode::default().copies(), mode.copies()), (1, 2));
        assert_eq!(DeliveryMode::default().delay(), Duration::ZERO);
        assert!((0..100).all(|_| mode.delay() <= Duration::from_millis(50)));
    }

    #[test]
    fn the_secret_never_prints() {
        let endpoint = WebhookEndpoint::new("http://127.0.0.1:1/hook", "whsec_do_not_print");
        assert!(!format!("{endpoint:?}").contains("whsec_do_not_print"));
        assert_eq!(endpoint.url(), "http://127.0.0.1:1/hook");
    }
}
