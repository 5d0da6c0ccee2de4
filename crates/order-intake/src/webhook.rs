//! `POST /webhooks/stripe` (SPEC §4): Stripe's signed events, checked here, applied by
//! [`orderfleet::domain::steps::webhook`].
//!
//! **The signature.** `Stripe-Signature: t=<unix time>,v1=<hex>[,v1=<hex>…]`, each `v1` an
//! HMAC-SHA256 of `"{t}.{raw body}"` keyed with an endpoint's signing secret
//! (docs.stripe.com/webhooks#verify-manually). An event is accepted when any `v1` matches any
//! secret of `STRIPE_WEBHOOK_SECRET` (several during a rotation: Stripe signs with the old and
//! the new secret for a while, each its own `v1`) and `t` is within [`TOLERANCE`] of now, so a
//! captured request cannot be replayed later. Anything else — no header, no `t`, no `v1`, a
//! stale `t`, a body altered after signing — is `400`, with nothing written.
//!
//! async-stripe's `async-stripe-webhook` was weighed and not used: its `construct_event` takes
//! one secret (no rotation) and reads only the last `v1`, and it refuses, as an error the
//! caller cannot tell from a bad signature, a validly signed event of a type it cannot parse,
//! which must be `200` here (Stripe adds types). The check is a few lines over RustCrypto's
//! `hmac` (its `verify_slice` compares in constant time).
//!
//! **The answer.** `200` once the event is applied or found to change nothing (an id applied
//! before, a type the fleet does not use); `503` when it cannot be applied now (the database
//! or Stripe away, the budget spent, the order being settled by the sweeper), so that Stripe
//! delivers it again; `503` too while no secret is configured (the sweeper alone settles).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use orderfleet::domain::steps::webhook::{self, Applied, Event, WebhookError};
use orderfleet_runtime::config::{ConfigError, Env};
use secrecy::{ExposeSecret, SecretString};
use tracing::Instrument;

use crate::AppState;
use crate::error::ApiError;

/// How far a signature's `t` may be from now: Stripe's libraries' default.
pub const TOLERANCE_SECONDS: i64 = 300;

/// The largest event body taken: Stripe's events are a few KiB.
pub const MAX_BODY: usize = 256 * 1024;

/// The most `v1` signatures a header may carry: Stripe sends one per signing secret.
const MOST_SIGNATURES: usize = 8;

/// `STRIPE_WEBHOOK_SECRET`: the endpoint's signing secrets (`whsec_…`), comma-separated.
#[derive(Clone, Default)]
pub struct WebhookSecrets(Vec<SecretString>);

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookSecrets({} secrets)", self.0.len())
    }
}

impl WebhookSecrets {
    /// Reads `STRIPE_WEBHOOK_SECRET`; unset or empty: none (webhooks answered `503`).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let Some(raw) = env.optional::<SecretString>("STRIPE_WEBHOOK_SECRET")? else {
            return Ok(Self::default());
        };
        Self::parse(raw.expose_secret())
            .map_err(|reason| ConfigError::Malformed { name: "STRIPE_WEBHOOK_SECRET", reason })
    }

    fn parse(raw: &str) -> Result<Self, String> {
        let secrets: Vec<&str> = raw.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if let Some(bad) = secrets.iter().position(|s| !s.starts_with("whsec_") || s.len() <= "whsec_".len())
        {
            return Err(format!(
                "expected Stripe signing secrets (whsec_…), comma-separated; secret {} is not one",
                bad + 1
            ));
        }
        Ok(Self(secrets.into_iter().map(|s| SecretString::from(s.to_owned())).collect()))
    }

    /// Whether any secret is configured.
    pub fn is_set(&self) -> bool {
        !self.0.is_empty()
    }

    /// Checks `header` against `body` at `now` (unix seconds).
    pub fn verify(&self, header: Option<&str>, body: &[u8], now: i64) -> Result<(), &'static str> {
        let header = header.ok_or("no Stripe-Signature header")?;
        let (mut timestamp, mut signatures) = (None, Vec::new());
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => timestamp = Some(t.parse::<i64>().map_err(|_| "t is not a unix time")?),
                // Not a SHA-256 in hex: a signature that matches nothing, never a reason to look
                // no further.
                Some(("v1", v1)) if v1.len() == 64 => signatures.extend(hex::decode(v1).ok()),
                _ => {} // other schemes (v0, Stripe's test scheme) are not ours to check
            }
        }
        let timestamp = timestamp.ok_or("no t in Stripe-Signature")?;
        if signatures.is_empty() {
            return Err("no v1 signature in Stripe-Signature");
        }
        // Stripe sends one per signing secret: two during a rotation. A header with hundreds is
        // someone making the intake hash for them.
        if signatures.len() > MOST_SIGNATURES {
            return Err("more v1 signatures than Stripe sends");
        }
        if (now - timestamp).abs() > TOLERANCE_SECONDS {
            return Err("the signature's time is more than 300 s from now");
        }
        // The body is hashed once per secret; each `v1` then costs a finalization, compared in
        // constant time.
        let matches = self.0.iter().any(|secret| {
            let mut mac = Hmac::<sha2_11::Sha256>::new_from_slice(secret.expose_secret().as_bytes())
                .expect("HMAC takes keys of any length");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            signatures.iter().any(|signature| mac.clone().verify_slice(signature).is_ok())
        });
        if matches { Ok(()) } else { Err("no v1 signature matches a secret") }
    }
}

/// `POST /webhooks/stripe`.
pub(crate) async fn receive(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    // Read under our own limit (and the route's body timeout), so that a body too large or
    // too slow is answered in the API's error shape.
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(e)
            if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) =>
        {
            return ApiError::BodyTooLarge.into_response();
        }
        Err(_) => return ApiError::RequestTimeout.into_response(),
    };
    match accept(&state, &headers, &body).await {
        Ok(applied) => {
            let effect = applied.effect();
            tracing::info!(effect, "webhook applied");
            (StatusCode::OK, axum::Json(serde_json::json!({ "received": true, "effect": effect })))
                .into_response()
        }
        Err(error) => error.into_response(),
    }
}

async fn accept(state: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<Applied, ApiError> {
    if !state.webhook_secrets.is_set() {
        return Err(ApiError::WebhookUnavailable("STRIPE_WEBHOOK_SECRET is not set".into()));
    }
    let header = headers.get("stripe-signature").and_then(|v| v.to_str().ok());
    state
        .webhook_secrets
        .verify(header, body, chrono::Utc::now().timestamp())
        .map_err(ApiError::InvalidSignature)?;
    let event = Event::parse(body).map_err(ApiError::MalformedJson)?;
    let span = tracing::info_span!("webhook", event = event.id, kind = event.kind);
    let applied = webhook::apply(&state.pool, &state.payments, &event).instrument(span).await;
    // Every signed event, by type and what it did (`unavailable`: answered 503, Stripe sends it
    // again): what Stripe's webhooks cost the intake, per order, in `make bench`.
    let effect = applied.as_ref().map_or("unavailable", Applied::effect);
    metrics::counter!(crate::metrics::WEBHOOK_EVENTS.name, "type" => event.kind.clone(), "effect" => effect)
        .increment(1);
    applied.map_err(|e| match e {
        WebhookError::Unavailable(reason) => ApiError::WebhookUnavailable(reason),
        WebhookError::Database(e) => ApiError::WebhookUnavailable(format!("database: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, t: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<sha2_11::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    const NOW: i64 = 1_800_000_000;
    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.canceled"}"#;

    #[test]
    fn any_v1_against_any_secret_within_the_tolerance_is_accepted() {
        let secrets = WebhookSecrets::parse("whsec_old, whsec_new").unwrap();
        let new = sign("whsec_new", NOW, BODY);
        let header = format!("t={NOW},v1={},v1={new},v0=ignored", "00".repeat(32));
        assert_eq!(secrets.verify(Some(&header), BODY, NOW + 299), Ok(()));
        let many = format!("t={NOW},{}v1={new}", "v1=00,".repeat(10_000));
        assert_eq!(
            secrets.verify(Some(&many), BODY, NOW),
            Ok(()),
            "v1 values of another length are not signatures"
        );
        let too_many = format!("t={NOW},{}v1={new}", format!("v1={},", "00".repeat(32)).repeat(8));
        assert!(secrets.verify(Some(&too_many), BODY, NOW).is_err(), "more v1 than Stripe sends");
        let old_first = format!("t={NOW},v1={},v1=zz", sign("whsec_old", NOW, BODY));
        assert_eq!(secrets.verify(Some(&old_first), BODY, NOW), Ok(()));
    }

    #[test]
    fn a_forged_stale_altered_or_missing_signature_is_refused() {
        let secrets = WebhookSecrets::parse("whsec_live").unwrap();
        let good = format!("t={NOW},v1={}", sign("whsec_live", NOW, BODY));
        assert!(secrets.verify(Some(&good), BODY, NOW + 301).is_err(), "stale");
        assert!(secrets.verify(Some(&good), BODY, NOW - 301).is_err(), "from the future");
        assert!(secrets.verify(Some(&good), br#"{"id":"evt_2"}"#, NOW).is_err(), "altered body");
        let forged = format!("t={NOW},v1={}", sign("whsec_other", NOW, BODY));
        assert!(secrets.verify(Some(&forged), BODY, NOW).is_err(), "another secret");
        let later = format!("t={},v1={}", NOW + 10, sign("whsec_live", NOW, BODY));
        assert!(secrets.verify(Some(&later), BODY, NOW).is_err(), "t changed after signing");
        for header in [None, Some(""), Some("t=1"), Some("v1=00"), Some("t=x,v1=00")] {
            assert!(secrets.verify(header, BODY, NOW).is_err(), "{header:?}");
        }
    }

    #[test]
    fn secrets_must_be_stripe_signing_secrets() {
        assert!(WebhookSecrets::parse("sk_test_1").is_err());
        assert!(WebhookSecrets::parse("whsec_a,whsec_").is_err());
        assert!(!WebhookSecrets::parse("").unwrap().is_set());
    }
}
