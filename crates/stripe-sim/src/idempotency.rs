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
//! - A request whose key's first request is still executing is answered `409`
//!   `idempotency_key_in_use`, and nothing is saved for it: "If incoming parameters fail
//!   validation, or the request conflicts with another request that's executing
//!   concurrently, we don't save the idempotent result" (the same page). Once the first
//!   request ends, its answer is the key's, replayed as above.
//! - Nothing is saved for a request refused before it began executing (parameter
//!   validation), nor for an injected fault that answered 429 or hung: those model Stripe's
//!   front refusing it or the network losing it, so a retry with the same key runs it.
//!
//! Most operations run, and have their answer saved, under the simulator's one lock, so no
//! other request sees them executing. Two faults make one last: `slow_confirm` (the
//! operation ran, and its request goes on executing for a while, its answer saved but not
//! yet the key's: [`IdempotencyStore::save`]) and `timeout` (held before its
//! operation runs, as long as the simulator holds the request: [`IdempotencyStore::hold`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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

impl Scope {
    fn id(&self) -> KeyId {
        (self.account.clone(), self.key.clone())
    }
}

/// A key as the account holds it: (API key, idempotency key).
type KeyId = (String, String);

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
    /// Until when the request that produced it is still executing (`slow_confirm`): the key
    /// is in use until then, and the answer is not yet the key's.
    executing_until: Option<Instant>,
}

pub(crate) enum Lookup<'a> {
    /// First use of the key: run the operation.
    Unused,
    Replay(&'a Saved),
    /// Refused without running: the key was used for another request, or its first request
    /// is still executing.
    Conflict(StripeError),
}

/// A key held by a request that is executing without an answer yet ([`IdempotencyStore::hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    id: KeyId,
    /// Tells this hold from a later one of the same key, after a reset or an expiry.
    ticket: u64,
}

/// Tickets for [`Held`], unique in the process, so a hold taken before a reset never
/// releases one taken after it.
static TICKETS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default)]
pub(crate) struct IdempotencyStore {
    saved: HashMap<KeyId, Saved>,
    /// Keys held by a request still executing, with their holder's ticket.
    held: HashMap<KeyId, u64>,
}

impl IdempotencyStore {
    /// What a request under `scope` finds at `now`.
    pub(crate) fn lookup(&self, scope: &Scope, now: Instant) -> Lookup<'_> {
        let id = scope.id();
        let saved = self.saved.get(&id);
        let executing = saved.and_then(|saved| saved.executing_until).is_some_and(|until| now < until);
        if self.held.contains_key(&id) || executing {
            return Lookup::Conflict(StripeError::idempotency_key_in_use(&scope.key));
        }
        let Some(saved) = saved else { return Lookup::Unused };
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

    /// Saves the answer of a request that goes on executing until `until` (`None`: it has
    /// ended): the key is in use until then, and its answer replayed only after.
    pub(crate) fn save(&mut self, scope: &Scope, reply: Reply, request_id: &str, until: Option<Instant>) {
        let saved = Saved {
            request: scope.request.clone(),
            reply,
            request_id: request_id.to_owned(),
            executing_until: until,
        };
        self.saved.insert(scope.id(), saved);
    }

    /// Holds an unused key for a request that is executing and has no answer yet; `None`
    /// when the key is in use or has an answer already (the request then holds nothing).
    pub(crate) fn hold(&mut self, scope: &Scope, now: Instant) -> Option<Held> {
        if !matches!(self.lookup(scope, now), Lookup::Unused) {
            return None;
        }
        let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
        self.held.insert(scope.id(), ticket);
        Some(Held { id: scope.id(), ticket })
    }

    /// Ends a hold: the request ended without an answer, and nothing is saved for its key.
    pub(crate) fn release(&mut self, held: &Held) {
        if self.held.get(&held.id) == Some(&held.ticket) {
            self.held.remove(&held.id);
        }
    }

    /// Forgets every saved answer whose request has ended, as Stripe prunes keys after 24
    /// hours; answers how many. A key in use stays in use.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let before = self.saved.len();
        self.saved.retain(|_, saved| saved.executing_until.is_some_and(|until| now < until));
        before - self.saved.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::StatusCode;

    use super::*;

    fn scope(account: &str, endpoint: &str, fingerprint: &str) -> Scope {
        Scope {
            account: account.into(),
            key: "k-1".into(),
            request: KeyedRequest { endpoint: endpoint.into(), fingerprint: fingerprint.into() },
        }
    }

    fn ok() -> Reply {
        Reply { status: StatusCode::OK, body: "{}".into() }
    }

    fn in_use(lookup: &Lookup<'_>) -> bool {
        matches!(lookup, Lookup::Conflict(e) if e.status == StatusCode::CONFLICT && e.code == Some("idempotency_key_in_use"))
    }

    #[test]
    fn a_key_replays_for_the_same_request_and_conflicts_for_another() {
        let now = Instant::now();
        let mut store = IdempotencyStore::default();
        let first = scope("sk_test_a", "POST /v1/payment_intents", "f1");
        assert!(matches!(store.lookup(&first, now), Lookup::Unused));
        store.save(&first, ok(), "req_1", None);

        assert!(matches!(store.lookup(&first, now), Lookup::Replay(saved) if saved.request_id == "req_1"));
        let other_params = scope("sk_test_a", "POST /v1/payment_intents", "f2");
        assert!(
            matches!(store.lookup(&other_params, now), Lookup::Conflict(e) if e.message.contains("same parameters"))
        );
        let other_endpoint = scope("sk_test_a", "POST /v1/payment_intents/pi_1/cancel", "f1");
        assert!(
            matches!(store.lookup(&other_endpoint, now), Lookup::Conflict(e) if e.message.contains("same endpoint"))
        );
    }

    #[test]
    fn keys_belong_to_one_account() {
        let mut store = IdempotencyStore::default();
        store.save(&scope("sk_test_a", "POST /v1/payment_intents", "f1"), ok(), "req_1", None);
        assert!(matches!(
            store.lookup(&scope("sk_test_b", "POST /v1/payment_intents", "f2"), Instant::now()),
            Lookup::Unused
        ));
    }

    #[test]
    fn a_key_whose_request_is_still_executing_is_in_use_until_it_ends_then_replays() {
        // Arrange: the first request's answer is known, and it executes for 10 s more.
        let start = Instant::now();
        let mut store = IdempotencyStore::default();
        let first = scope("sk_test_a", "POST /v1/payment_intents", "f1");
        store.save(&first, ok(), "req_1", Some(start + Duration::from_secs(10)));

        // Act
        let meanwhile = store.lookup(&first, start + Duration::from_secs(9));
        let other_params = store.lookup(&scope("sk_test_a", "POST /v1/payment_intents", "f2"), start);
        let meanwhile = (in_use(&meanwhile), in_use(&other_params));
        let after = store.lookup(&first, start + Duration::from_secs(10));

        // Assert
        assert_eq!(meanwhile, (true, true));
        assert!(matches!(after, Lookup::Replay(saved) if saved.request_id == "req_1"));
    }

    #[test]
    fn a_held_key_is_in_use_until_released_and_then_unused() {
        let now = Instant::now();
        let mut store = IdempotencyStore::default();
        let first = scope("sk_test_a", "POST /v1/payment_intents/pi_1/capture", "f1");

        let held = store.hold(&first, now).expect("an unused key is held");
        let second_hold = store.hold(&first, now);
        let meanwhile = in_use(&store.lookup(&first, now));
        store.release(&held);

        assert_eq!((second_hold, meanwhile), (None, true));
        assert!(matches!(store.lookup(&first, now), Lookup::Unused), "nothing was saved");
    }

    #[test]
    fn a_stale_release_leaves_a_newer_hold_of_the_key_alone() {
        let now = Instant::now();
        let mut store = IdempotencyStore::default();
        let first = scope("sk_test_a", "POST /v1/payment_intents", "f1");
        let stale = store.hold(&first, now).unwrap();
        // The simulator reset meanwhile.
        store = IdempotencyStore::default();
        let newer = store.hold(&first, now).unwrap();

        store.release(&stale);

        assert!(in_use(&store.lookup(&first, now)));
        store.release(&newer);
        assert!(matches!(store.lookup(&first, now), Lookup::Unused));
    }

    #[test]
    fn expiring_keys_forgets_ended_answers_and_keeps_keys_in_use() {
        let now = Instant::now();
        let mut store = IdempotencyStore::default();
        let ended = scope("sk_test_a", "POST /v1/payment_intents", "f1");
        let executing = Scope { key: "k-2".into(), ..ended.clone() };
        store.save(&ended, ok(), "req_1", None);
        store.save(&executing, ok(), "req_2", Some(now + Duration::from_secs(10)));

        assert_eq!(store.expire(now), 1);
        assert!(matches!(store.lookup(&ended, now), Lookup::Unused));
        assert!(in_use(&store.lookup(&executing, now)));
    }
}
