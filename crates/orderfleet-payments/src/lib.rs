#![warn(missing_docs)]
//! Stripe, for the fleet: the PaymentIntents client the domain's steps call ([`Payments`]),
//! the fleet's Stripe request budget every request takes a turn of ([`budget`]), the HTTP
//! transport the requests go through ([`stripe_http`]), and Stripe's settings
//! ([`StripeConfig`]).
//!
//! A crate of its own, between the runtime and the domain: it uses the runtime's kit (a pool,
//! the settings' readers, the failure vocabulary, backoff) and the order's words
//! (`orderfleet-words`), and knows no step, record or door of the domain. The domain's steps
//! and recovery call it; its records and its door never do (`scripts/check-shape.py` holds
//! them to that), and the runtime has no Stripe in it.
//!
//! Payments go through Stripe's API with async-stripe, against Stripe in production and
//! stripe-sim locally (`STRIPE_API_BASE`): one code path for both.
//!
//! Every call carries a Stripe idempotency key derived from the order, the operation and the
//! order's **attempt** (`orderfleet-<order>-authorize|capture|cancel`, then
//! `…-attempt-<n>` from the second), so a retry, a redelivery or a redrive days later replays
//! the first result instead of making a second effect. Failures are classified here, next to
//! the call: a card error or an invalid request is permanent; 429, timeouts and dropped
//! connections are transient and retried, with the same key, a bounded number of times
//! before the caller sees [`PaymentError::Unavailable`].
//!
//! A **`429 lock_timeout`** is told apart from a rate limit by its code: another request, or
//! Stripe's own processing, held the intent (docs.stripe.com/rate-limits#object-lock-timeouts,
//! docs.stripe.com/error-codes#lock-timeout). It says nothing about the rate, so it never
//! slows the fleet's budget; the same request goes again after the short jittered backoff, and
//! if the intent is still held after the bounded retries the caller sees
//! [`PaymentError::Locked`], a wait for that one request, never an outage. Within a process, a
//! capture or a cancel waits for the intent's turn, so its changes go one at a time, as Stripe
//! advises.
//!
//! A **5xx** is different. Stripe saves the answer of a request that began executing, a 500
//! included, under its key for 24 hours, and replays it to every retry with that key
//! (docs.stripe.com/api/idempotent_requests): retrying with the same key can only get the 500
//! again. So a 5xx to a request with a key ends that attempt at once
//! ([`PaymentError::AttemptFailed`]), and the caller asks Stripe what the attempt did — the
//! intent itself for a capture or a cancel, the intents listed since the order was made, by
//! `metadata[order_id]`, for an authorization — and moves the order to its next attempt, with
//! new keys, only when the attempt did nothing (the domain's
//! `records::order::next_payment_attempt`). An `idempotency_error` (the key ran before, with
//! other parameters: a deploy changed the request while one was in flight) ends the attempt the
//! same way, and is never a decline.
//!
//! Every request, each retry included, first takes a slot of the process's Stripe request
//! budget ([`budget`]); no slot within the bounded wait is
//! [`PaymentError::Unavailable`] too, without a request made.
//!
//! By role: `client` is [`Payments`], the client itself: its construction, the budget's turn,
//! its calls and their retries; `classify` says what a request is and what its failure means
//! ([`Operation`] and its keys, [`PaymentError`], [`RetryPolicy`]); `intent` is a PaymentIntent
//! as the fleet reads it ([`Intent`]); `list` finds intents by the window they were created in;
//! `held_here` remembers the holds this process made; `one_at_a_time` gives each intent its
//! turn; `config` reads [`StripeConfig`]; [`budget`] and [`stripe_http`] are the budget and the
//! transport; [`metrics`] lists every metric the crate exports.

pub mod budget;
pub mod metrics;
pub mod stripe_http;

mod classify;
mod client;
mod config;
mod held_here;
mod intent;
mod list;
mod one_at_a_time;

pub use classify::{LOCK_WAIT, Operation, PaymentError, RetryPolicy, STRIPE};
pub use client::{AuthorizeRequest, Payments};
pub use config::{RequestsPerSecond, StripeConfig};
pub use intent::{Action, AttemptDid, ChargeState, Intent, IntentStatus};
