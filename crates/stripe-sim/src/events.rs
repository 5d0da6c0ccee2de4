//! Stripe's events: what happened to a PaymentIntent or its charge, as the JSON Event object
//! a webhook endpoint receives (docs.stripe.com/api/events/object), and the `Stripe-Signature`
//! header that proves it came from the account (docs.stripe.com/webhooks#verify-manually).
//!
//! The simulated endpoint is subscribed to the types the fleet handles (SPEC §4) and
//! `payment_intent.succeeded`; an operation's events are worked out from the intent before and
//! after it ([`changes`]), so every path into a state (a confirm, an authentication, a
//! capture, a cancel, an expiry) announces it the same way.

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::ids;
use crate::intent::{PaymentIntent, Status};

/// The API version async-stripe 1.0.0-rc.10 pins (`stripe_shared::VERSION`), which the fleet
/// sends as `Stripe-Version`; Stripe renders an endpoint's events in its API version.
pub(crate) const API_VERSION: &str = "2026-09-30.endive";

/// The event types the simulated endpoint is subscribed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// An intent reached `requires_capture`: a hold is in place.
    AmountCapturableUpdated,
    /// A confirm was declined, or the buyer failed 3-D Secure.
    PaymentFailed,
    /// Cancelled: by a request, or by Stripe when the hold lapsed.
    Canceled,
    /// Captured (or collected at once).
    Succeeded,
    /// `POST /v1/refunds` refunded (part of) the charge.
    ChargeRefunded,
    /// The cardholder disputed the charge.
    DisputeCreated,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::AmountCapturableUpdated => "payment_intent.amount_capturable_updated",
            EventType::PaymentFailed => "payment_intent.payment_failed",
            EventType::Canceled => "payment_intent.canceled",
            EventType::Succeeded => "payment_intent.succeeded",
            EventType::ChargeRefunded => "charge.refunded",
            EventType::DisputeCreated => "charge.dispute.created",
        }
    }
}

/// Something that happened, with its object as the API showed it at that moment.
#[derive(Debug, Clone)]
pub(crate) struct Happened {
    pub(crate) kind: EventType,
    pub(crate) object: Value,
}

/// What an intent looked like before an operation, to tell what the operation changed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Before {
    status: Option<Status>,
    disputed: bool,
}

impl Before {
    /// A new intent: nothing before.
    pub(crate) const NOTHING: Before = Before { status: None, disputed: false };

    pub(crate) fn of(intent: &PaymentIntent) -> Self {
        Self { status: Some(intent.status), disputed: intent.disputed() }
    }
}

/// The events an operation caused, from the intent `before` it and as it is now. A status is
/// announced when it is entered; `payment_failed` when the intent comes back to
/// `requires_payment_method` with an error (a decline, a failed authentication). On the
/// pinned API version a cancel refunds nothing, so it causes no `charge.refunded`
/// (docs.stripe.com/changelog/basil/2025-03-31/remove-refund-from-partial-capture-and-payment-cancellation-flow).
pub(crate) fn changes(before: Before, intent: &PaymentIntent) -> Vec<Happened> {
    let mut happened = Vec::new();
    if before.status != Some(intent.status) {
        let kind = match intent.status {
            Status::RequiresCapture => Some(EventType::AmountCapturableUpdated),
            Status::Succeeded => Some(EventType::Succeeded),
            Status::Canceled => Some(EventType::Canceled),
            Status::RequiresPaymentMethod if intent.last_payment_error.is_some() => {
                Some(EventType::PaymentFailed)
            }
            _ => None,
        };
        happened.extend(kind.map(|kind| Happened { kind, object: intent.to_json() }));
    }
    if let Some(dispute) = intent.dispute_json().filter(|_| !before.disputed) {
        happened.push(Happened { kind: EventType::DisputeCreated, object: dispute });
    }
    happened
}

/// The API request that caused an event; `None` for what Stripe did by itself (a hold
/// lapsing) or the buyer did in a browser (`/_sim` routes), whose events carry
/// `"request": {"id": null, "idempotency_key": null}`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cause {
    pub(crate) request_id: Option<String>,
    pub(crate) idempotency_key: Option<String>,
}

/// An event, ready to send: its id, its type, and the exact body every delivery sends.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) id: String,
    pub(crate) kind: EventType,
    pub(crate) body: String,
}

impl Event {
    pub(crate) fn new(happened: Happened, cause: &Cause, now: i64) -> Self {
        let id = ids::new("evt");
        let body = json!({
            "id": id,
            "object": "event",
            "api_version": API_VERSION,
            "created": now,
            "data": { "object": happened.object },
            "livemode": false,
            "pending_webhooks": 1,
            "request": { "id": cause.request_id, "idempotency_key": cause.idempotency_key },
            "type": happened.kind.as_str(),
        });
        Self { id, kind: happened.kind, body: body.to_string() }
    }
}

/// The `Stripe-Signature` header for `body` sent at `timestamp` (Unix seconds):
/// `t={timestamp},v1={hex HMAC-SHA256 of "{timestamp}.{body}"}`, keyed with the endpoint's
/// whole signing secret (`whsec_…` included), as Stripe signs (docs.stripe.com/webhooks
/// #verify-manually). A test in another crate can sign an event of its own with it.
pub fn signature_header(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length; `new_from_slice` fails only for fixed-key MACs.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={timestamp},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_hmac_of_the_timestamp_a_dot_and_the_body() {
        let header = signature_header("whsec_test", 1_700_000_000, br#"{"id":"evt_1"}"#);

        let mut mac = Hmac::<Sha256>::new_from_slice(b"whsec_test").unwrap();
        mac.update(br#"1700000000.{"id":"evt_1"}"#);
        assert_eq!(header, format!("t=1700000000,v1={}", hex::encode(mac.finalize().into_bytes())));
    }

    #[test]
    fn the_hmac_is_rfc_4231s() {
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn intent(form: &str) -> PaymentIntent {
        let params = crate::form::Params::parse(form.as_bytes());
        PaymentIntent::new(crate::requests::CreateRequest::parse(&params).unwrap(), 1_700_000_000)
    }

    fn kinds(happened: &[Happened]) -> Vec<&'static str> {
        happened.iter().map(|h| h.kind.as_str()).collect()
    }

    #[test]
    fn a_status_is_announced_when_it_is_entered_and_only_then() {
        let mut pi =
            intent("amount=100&currency=usd&capture_method=manual&payment_method=pm_card_createDispute");
        assert_eq!(kinds(&changes(Before::NOTHING, &pi)), Vec::<&str>::new(), "requires_confirmation is not");

        let before = Before::of(&pi);
        pi.confirm(1_700_000_000).unwrap();
        assert_eq!(kinds(&changes(before, &pi)), ["payment_intent.amount_capturable_updated"]);
        assert!(changes(Before::of(&pi), &pi).is_empty(), "nothing changed, nothing announced");

        let before = Before::of(&pi);
        pi.capture(&crate::requests::CaptureRequest { amount_to_capture: None }, 1_700_000_001).unwrap();
        let happened = changes(before, &pi);
        assert_eq!(kinds(&happened), ["payment_intent.succeeded", "charge.dispute.created"]);
        assert_eq!(happened[1].object["object"], "dispute");
    }

    #[test]
    fn a_decline_is_a_payment_failure_but_a_new_intent_without_a_card_is_not() {
        let mut declined = intent("amount=100&currency=usd&payment_method=pm_card_chargeDeclined");
        let bare = intent("amount=100&currency=usd");
        let _ = declined.confirm(1_700_000_000);
        assert_eq!(kinds(&changes(Before::NOTHING, &declined)), ["payment_intent.payment_failed"]);
        assert!(changes(Before::NOTHING, &bare).is_empty());
    }

    #[test]
    fn an_event_names_its_request_or_null() {
        let happened = Happened { kind: EventType::Canceled, object: json!({"id": "pi_1"}) };
        let by_api = Cause { request_id: Some("req_1".into()), idempotency_key: Some("k".into()) };
        let event = Event::new(happened.clone(), &by_api, 1_700_000_000);
        let automatic = Event::new(happened, &Cause::default(), 1_700_000_000);

        let body: Value = serde_json::from_str(&event.body).unwrap();
        assert!(event.id.starts_with("evt_"));
        assert_eq!(body["id"], event.id.as_str());
        assert_eq!(body["type"], "payment_intent.canceled");
        assert_eq!(body["api_version"], API_VERSION);
        assert_eq!(body["data"]["object"]["id"], "pi_1");
        assert_eq!(body["request"], json!({"id": "req_1", "idempotency_key": "k"}));
        let body: Value = serde_json::from_str(&automatic.body).unwrap();
        assert_eq!(body["request"], json!({"id": null, "idempotency_key": null}));
    }
}
