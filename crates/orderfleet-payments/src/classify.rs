//! What a Stripe request is, and what its failure means: the [`Operation`]s and their
//! idempotency keys per attempt, the [`PaymentError`] a failed request becomes (`classify`),
//! and the [`RetryPolicy`] that bounds how long a transient one is tried again. They are apart
//! from the client so that the rules deciding a retry, a decline or the end of an attempt read,
//! and are tested, without a connection.

use std::time::Duration;

use stripe::{ApiErrorsCode, ApiErrorsType, StripeError};

use crate::budget::Endpoint;
use orderfleet_runtime::backoff::Backoff;
use orderfleet_runtime::failure::{Failure, Source};
use orderfleet_words::OrderId;

/// The operations that carry their own idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Creating and confirming a PaymentIntent (manual capture).
    Authorize,
    /// Capturing it.
    Capture,
    /// Cancelling it.
    Cancel,
    /// A lookup; it changes nothing, so it needs no key.
    Retrieve,
    /// A page of Stripe's list; a lookup too.
    List,
    /// A payment method's card, for its fingerprint (the card cap); a lookup too.
    PaymentMethod,
}

impl Operation {
    /// Its name in keys, metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Authorize => "authorize",
            Operation::Capture => "capture",
            Operation::Cancel => "cancel",
            Operation::Retrieve => "retrieve",
            Operation::List => "list",
            Operation::PaymentMethod => "payment_method",
        }
    }

    /// The Stripe idempotency key of this operation in attempt `attempt` (from 1) on this
    /// order: stable across processes, retries and redeliveries of the attempt. The first
    /// attempt's keys are the ones used before attempts were counted.
    pub fn idempotency_key(self, order_id: OrderId, attempt: i32) -> String {
        match attempt {
            ..=1 => format!("orderfleet-{order_id}-{}", self.as_str()),
            n => format!("orderfleet-{order_id}-{}-attempt-{n}", self.as_str()),
        }
    }

    /// The endpoint Stripe counts it on.
    pub fn endpoint(self) -> Endpoint {
        match self {
            Operation::Authorize => Endpoint::Create,
            Operation::Capture => Endpoint::Capture,
            Operation::Cancel => Endpoint::Cancel,
            Operation::Retrieve => Endpoint::Retrieve,
            Operation::List => Endpoint::List,
            Operation::PaymentMethod => Endpoint::PaymentMethod,
        }
    }

    /// Whether requests of this operation carry an idempotency key (they change something).
    pub(super) fn has_key(self) -> bool {
        matches!(self, Operation::Authorize | Operation::Capture | Operation::Cancel)
    }
}

/// How a Stripe request ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaymentError {
    /// The card was declined: permanent, the customer must use another card.
    #[error("card declined ({code})")]
    Declined {
        /// The decline code (`card_declined`, `insufficient_funds`, …).
        code: String,
        /// The issuer's words, for operators only.
        message: String,
        /// The PaymentIntent the decline left, if Stripe made one.
        payment_intent_id: Option<String>,
    },
    /// Stripe refused the request for good (bad state, bad parameters, bad key).
    #[error("refused by the payment provider: {code}: {message}")]
    Refused {
        /// Stripe's error code.
        code: String,
        /// Stripe's words.
        message: String,
        /// The HTTP status.
        status: u16,
    },
    /// Unreachable, timing out, rate-limiting or failing with 5xx after the bounded retries.
    #[error("payment provider unavailable: {0}")]
    Unavailable(String),
    /// Stripe held the PaymentIntent for another request or for its own processing (`429`
    /// `lock_timeout`) through every retry: a wait on that one object, not Stripe down and not
    /// a rate limit (docs.stripe.com/rate-limits#object-lock-timeouts). The request did not
    /// run, so trying it again soon, with the same key, can succeed: transient for that one
    /// request or message, never an outage, never a decline.
    #[error("the payment provider holds the PaymentIntent for another request: {0}")]
    Locked(String),
    /// Stripe answered 5xx to this attempt's request and saved that answer under its key (a
    /// retry with the key gets it again for 24 hours), or answered `idempotency_error` (the key
    /// ran before, with other parameters). What the attempt did is unknown until Stripe is
    /// asked; only if it did nothing may the order's next attempt begin.
    #[error("the payment provider failed this attempt: {0}")]
    AttemptFailed(String),
}

impl PaymentError {
    /// Whether trying again later can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            PaymentError::Unavailable(_) | PaymentError::AttemptFailed(_) | PaymentError::Locked(_)
        )
    }
}

/// Where a failure of a Stripe call happened, in the runtime's failure vocabulary: a
/// dependency, counted and stored as `stripe`.
pub const STRIPE: Source = Source::Service("stripe");

/// How long a worker's step that Stripe held the intent through ([`PaymentError::Locked`])
/// waits before it goes again: Stripe holds an object while another request on it runs.
pub const LOCK_WAIT: Duration = Duration::from_secs(1);

impl PaymentError {
    /// The failure a worker's step ends with when Stripe held the intent through every retry
    /// ([`PaymentError::Locked`]): the message waits on another request's work, not on Stripe
    /// being down, so it is kept in hand and handled again after [`LOCK_WAIT`] while the
    /// worker goes on receiving (never an outage, and no receive spent).
    pub fn locked_failure(reason: String) -> Failure {
        Failure::transient(STRIPE, "lock_timeout", reason).hold_in_hand(LOCK_WAIT)
    }
}

/// Whether Stripe's answer is a `429` about the request rate (a limit lowered, another system
/// on the account), which slows the whole fleet. A `429` with code `lock_timeout` is about one
/// object that another request or Stripe's own processing holds, whatever the rate
/// (docs.stripe.com/rate-limits#object-lock-timeouts), and slows nothing.
pub(super) fn is_rate_limit(error: &StripeError) -> bool {
    matches!(error, StripeError::Stripe(api, 429) if !is_lock_timeout(api))
}

fn is_lock_timeout(api: &stripe::ApiErrors) -> bool {
    matches!(api.code, Some(ApiErrorsCode::LockTimeout))
}

/// How hard to try before calling the provider unavailable.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts at most, the first included.
    pub attempts: u32,
    /// Between attempts.
    pub backoff: Backoff,
    /// Per attempt: a request that hangs is abandoned and retried with the same key.
    pub timeout: Duration,
    /// Per attempt: how long it may wait for a slot of the Stripe request budget.
    pub budget_wait: Duration,
}

impl Default for RetryPolicy {
    /// The intake's: a buyer is waiting, so a request waits at most 4 s for a budget slot; a
    /// call takes 27.6 s at the longest ([`RetryPolicy::longest_call`]).
    fn default() -> Self {
        Self {
            attempts: 3,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(2)),
            timeout: Duration::from_secs(5),
            budget_wait: Duration::from_secs(4),
        }
    }
}

impl RetryPolicy {
    /// The workers' (and the sweeper's): nobody waits on them, and a message given up for
    /// want of a slot costs one of its three receives, so they wait long enough for every
    /// message a worker holds at once (32 by default) to get a slot at 1 request a second;
    /// their visibility heartbeat keeps the message theirs meanwhile.
    pub fn background() -> Self {
        Self { budget_wait: Duration::from_secs(60), ..Self::default() }
    }

    /// The longest one Stripe call can take under this policy, its retries included: every
    /// attempt waits its whole `budget_wait` for a slot (a slot granted at the bound's last
    /// moment) and its whole `timeout` for the answer, and every pause between two attempts is
    /// its backoff's ceiling. The intake's: 3 × (4 s + 5 s) + 0.2 s + 0.4 s = 27.6 s; the
    /// workers': 3 × (60 s + 5 s) + 0.2 s + 0.4 s = 195.6 s. What holds an order's lease
    /// through Stripe calls counts its calls in these (`orderfleet::domain::records::order::lease_for`).
    pub fn longest_call(&self) -> Duration {
        let attempts = self.attempts.max(1);
        let pauses: Duration = (0..attempts - 1).map(|n| self.backoff.ceiling(n)).sum();
        (self.budget_wait + self.timeout) * attempts + pauses
    }
}

/// Whether a cancel's failure may be one Stripe saved under its key, and replays: a 5xx, or a
/// refusal because of the intent's state at that moment.
pub(super) fn is_saved_failure(error: &PaymentError) -> bool {
    match error {
        PaymentError::AttemptFailed(_) => true,
        PaymentError::Refused { code, .. } => code == "payment_intent_unexpected_state",
        _ => false,
    }
}

/// Decides, next to the call, whether a Stripe failure is worth retrying.
pub(super) fn classify(error: StripeError) -> PaymentError {
    match error {
        StripeError::Stripe(api, status) => {
            let code = api
                .code
                .as_ref()
                .map(|c| c.as_str().to_owned())
                .unwrap_or_else(|| api.type_.as_str().to_owned());
            let message = api.message.clone().unwrap_or_default();
            let concurrent_use =
                matches!(api.code, Some(ApiErrorsCode::IdempotencyKeyInUse)) || status == 409;
            match (&api.type_, status) {
                (ApiErrorsType::CardError, _) => PaymentError::Declined {
                    code: api.decline_code.clone().unwrap_or(code),
                    message,
                    payment_intent_id: api.payment_intent.as_ref().map(|pi| pi.id.as_str().to_owned()),
                },
                _ if status >= 500 => PaymentError::AttemptFailed(format!("HTTP {status} {code}: {message}")),
                // The key's first request still runs at Stripe (another process's, or ours cut
                // off by a timeout): whatever Stripe types it, it is a wait, never a key that
                // ran and failed: the same key, later, gets that request's answer.
                _ if concurrent_use => PaymentError::Unavailable(format!("HTTP {status} {code}: {message}")),
                // The key was used before with other parameters (a deploy changed the request
                // while one was in flight): its first request ran, and may hold funds. Never a
                // decline: what the key did is found as after a saved 5xx.
                (ApiErrorsType::IdempotencyError, _) => {
                    PaymentError::AttemptFailed(format!("HTTP {status} idempotency_error: {message}"))
                }
                // Told apart by its code: the request waited for the object in vain and did not
                // run, so the same request, with the same key, goes again after a short pause.
                _ if status == 429 && is_lock_timeout(&api) => {
                    PaymentError::Locked(format!("HTTP {status} {code}: {message}"))
                }
                _ if status == 429 => PaymentError::Unavailable(format!("HTTP {status} {code}: {message}")),
                // A revoked, rotated or wrong key is our problem, not the customer's: nothing
                // is declined or failed for it; the work waits until an operator fixes the key.
                _ if status == 401 || status == 403 => {
                    tracing::error!(status, code, "Stripe refuses our credentials: check STRIPE_SECRET_KEY");
                    PaymentError::Unavailable(format!("misconfigured: HTTP {status} {code}: {message}"))
                }
                _ => PaymentError::Refused { code, message, status },
            }
        }
        StripeError::Timeout => PaymentError::Unavailable("timed out".into()),
        StripeError::ClientError(e) if e.starts_with(crate::stripe_http::UNSAVED_5XX) => {
            PaymentError::Unavailable(e)
        }
        StripeError::ClientError(e) => PaymentError::Unavailable(format!("connection failed: {e}")),
        // A body we cannot read: a proxy's error page, a cut-off answer. Retrying with the same
        // key is safe, and is what finds out what happened.
        StripeError::JSONDeserialize(e) => PaymentError::Unavailable(format!("unreadable answer: {e}")),
        StripeError::ConfigError(e) => {
            tracing::error!(error = e, "the Stripe client is misconfigured");
            PaymentError::Unavailable(format!("misconfigured: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_per_order_and_operation() {
        let order = OrderId::from_uuid(uuid::Uuid::nil());
        assert_eq!(
            Operation::Capture.idempotency_key(order, 1),
            "orderfleet-00000000-0000-0000-0000-000000000000-capture"
        );
        assert_eq!(
            Operation::Capture.idempotency_key(order, 2),
            "orderfleet-00000000-0000-0000-0000-000000000000-capture-attempt-2"
        );
        assert_ne!(Operation::Capture.idempotency_key(order, 1), Operation::Cancel.idempotency_key(order, 1));
    }

    #[test]
    fn the_longest_call_waits_every_slot_and_answer_in_full_with_the_longest_pauses() {
        assert_eq!(RetryPolicy::default().longest_call(), Duration::from_millis(27_600));
        assert_eq!(RetryPolicy::background().longest_call(), Duration::from_millis(195_600));
        let once = RetryPolicy { attempts: 1, ..RetryPolicy::default() };
        assert_eq!(once.longest_call(), Duration::from_secs(9), "no pause after the last attempt");
    }

    fn stripe_error(type_: ApiErrorsType, code: Option<ApiErrorsCode>, status: u16) -> StripeError {
        let api = stripe::ApiErrors {
            advice_code: None,
            charge: None,
            code,
            decline_code: None,
            doc_url: None,
            message: Some("another request with this key is in progress".into()),
            network_advice_code: None,
            network_decline_code: None,
            param: None,
            payment_intent: None,
            payment_method: None,
            payment_method_type: None,
            request_log_url: None,
            setup_intent: None,
            source: None,
            type_,
        };
        StripeError::Stripe(Box::new(api), status)
    }

    #[test]
    fn a_key_in_use_is_a_wait_however_stripe_types_it() {
        for type_ in [ApiErrorsType::IdempotencyError, ApiErrorsType::InvalidRequestError] {
            let in_use = stripe_error(type_.clone(), Some(ApiErrorsCode::IdempotencyKeyInUse), 409);
            assert!(matches!(classify(in_use), PaymentError::Unavailable(_)), "{type_:?}");
        }
        let reused = stripe_error(ApiErrorsType::IdempotencyError, None, 400);
        assert!(matches!(classify(reused), PaymentError::AttemptFailed(_)));
    }

    #[test]
    fn a_lock_timeout_is_a_wait_on_one_object_and_not_a_rate_limit() {
        let lock = || stripe_error(ApiErrorsType::InvalidRequestError, Some(ApiErrorsCode::LockTimeout), 429);
        let rate = || stripe_error(ApiErrorsType::InvalidRequestError, Some(ApiErrorsCode::RateLimit), 429);
        assert!(!is_rate_limit(&lock()));
        assert!(is_rate_limit(&rate()));
        // A 429 with a code of no kind the fleet knows slows the fleet, as Stripe advises.
        assert!(is_rate_limit(&stripe_error(ApiErrorsType::InvalidRequestError, None, 429)));
        let locked = classify(lock());
        assert!(matches!(locked, PaymentError::Locked(_)) && locked.is_transient(), "{locked:?}");
        assert!(matches!(classify(rate()), PaymentError::Unavailable(_)));
    }

    #[test]
    fn timeouts_and_dropped_connections_are_transient() {
        assert!(classify(StripeError::Timeout).is_transient());
        assert!(classify(StripeError::ClientError("connection reset".into())).is_transient());
        // Our own misconfiguration must never turn into a declined card or a failed capture.
        assert!(classify(StripeError::ConfigError("bad".into())).is_transient());
    }
}
