//! Stripe's idempotency rules for `POST` requests that carry an `Idempotency-Key` header.
//!
//! - Keys belong to the account (the API key), not to an endpoint: reusing a key on another
//!   endpoint, or on the same endpoint with other parameters, is an `idempotency_error`.
//! - The first request's answer, status and body, is saved once the operation began
//!   executing, error answers (a 402 decline, a 400 state error, a 404, **a 500**) included,
//!   and replayed to every later request with the same key and parameters, with
//!   `Idempotent-Replayed: true`, for 24 hours (`POST /_sim/idempotency_keys/expire`). Stripe
//!   says so: "Stripe's idempotency works by saving the resulting status code and body of
//!   the first request made for any given idempotency key, regardless of whether it succeeds
//!   or fails. Subsequent requests with the same key return the same result, including 500
//!   errors" (docs.stripe.com/api/idempotent_requests). An injected `error_500` on a request
//!   with a key is such an answer: the operation did nothing, and its 500 is saved, so a
//!   client that retries with the same key gets the 500 again until it starts a new attempt
//!   with a new key.
//! - Nothing is saved for a request refused before it began executing (parameter
//!   validation), nor for an injected fault that answered 429 or hung: those model Stripe's
//!   front refusing it or the network losing it, so a retry with the same key runs it.
//!
//! Stripe answers 409 to a request whose key is in use by one still executing. Here the
//! lookup, the operation and the saving of its answer happen under one lock, so a concurrent
//! duplicate waits and then replays; no request ever observes a key in flight.

use std::collections::HashMap;

use crate::error::StripeError;
use crate::ledger::Reply;

/// Stripe's limit on key length.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// Who used which key for what.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub(crate) account: String,
    pub(crate) key: String,
    pub(crate) request: KeyedRequest,
}

/// What a key was used for: every later use of the key must be the same request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyedRequest {
    /// `POST /v1/payment_intents/pi_…/capture`.
    pub(crate) endpoint: String,
    /// See [`crate::form::Params::fingerprint`].
    pub(crate) fingerprint: String,
}

/// A saved first answer, and the request it answered.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    request: KeyedRequest,
    pub(crate) reply: Reply,
    /// The `Request-Id` of the request that produced the answer.
    pub(crate) request_id: String,
}

pub(crate) enum Lookup<'a> {
    /// First use of the key: run the operation.
    Unused,
    Replay(&'a Saved),
    Conflict(StripeError),
}

#[derive(Debug, Default)]
pub(crate) struct IdempotencyStore {
    saved: HashMap<(String, String), Saved>,
}

impl IdempotencyStore {
    pub(crate) fn len(&self) -> usize {
        self.saved.len()
    }

    pub(crate) fn lookup(&self, scope: &Scope) -> Lookup<'_> {
        let Some(saved) = self.saved.get(&(scope.account.clone(), scope.key.clone())) else {
            return Lookup::Unused;
        };
        let (first, again) = (&saved.request, &scope.request);
        if first.endpoint != again.endpoint {
            return Lookup::Conflict(StripeError::idempotency(format!(
                "Keys for idempotent requests can only be used for the same endpoint they were first used \
                 for ('{}' vs '{}'). Try using a key other than '{}' if you meant to execute a different \
                 request.",
                first.endpoint, again.endpoint, scope.key
            )));
        }
        if first.fingerprint != again.fingerprint {
            return Lookup::Conflict(StripeError::idempotency(format!(
                "Keys for idempotent requests can only be used with the same parameters they were first \
                 used with. Try using a key other than '{}' if you meant to execute a different request.",
                scope.key
            )));
        }
        Lookup::Replay(saved)
    }

    pub(crate) fn save(&mut self, scope: &Scope, reply: Reply, request_id: &str) {
        let saved = Saved { request: scope.request.clone(), reply, request_id: request_id.to_owned() };
        self.saved.insert((scope.account.clone(), scope.key.clone()), saved);
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    fn scope(account: &str, endpoint: &str, fingerprint: &str) -> Scope {
        Scope {
            account: account.into(),
            key: "k-1".into(),
            request: KeyedRequest { endpoint: endpoint.into(), fingerprint: fingerprint.into() },
        }
    }

    #[test]
    fn a_key_replays_for_the_same_request_and_conflicts_for_another() {
        let mut store = IdempotencyStore::default();
        let first = scope("sk_test_a", "POST /v1/payment_intents", "f1");
        assert!(matches!(store.lookup(&first), Lookup::Unused));
        store.save(&first, Reply { status: StatusCode::OK, body: "{}".into() }, "req_1");

        assert!(matches!(store.lookup(&first), Lookup::Replay(saved) if saved.request_id == "req_1"));
        let other_params = scope("sk_test_a", "POST /v1/payment_intents", "f2");
        assert!(
            matches!(store.lookup(&other_params), Lookup::Conflict(e) if e.message.contains("same parameters"))
        );
        let other_endpoint = scope("sk_test_a", "POST /v1/payment_intents/pi_1/cancel", "f1");
        assert!(
            matches!(store.lookup(&other_endpoint), Lookup::Conflict(e) if e.message.contains("same endpoint"))
        );
    }

    #[test]
    fn keys_belong_to_one_account() {
        let mut store = IdempotencyStore::default();
        store.save(
            &scope("sk_test_a", "POST /v1/payment_intents", "f1"),
            Reply { status: StatusCode::OK, body: "{}".into() },
            "req_1",
        );
        assert!(matches!(
            store.lookup(&scope("sk_test_b", "POST /v1/payment_intents", "f2")),
            Lookup::Unused
        ));
    }
}
