//! The Stripe client of one process, [`Payments`]: its construction, the turn of the fleet's
//! Stripe budget that each request takes, the calls (authorize, capture, cancel, retrieve, the
//! probe) and the retries around them (`with_retries`, with the same key, as [`RetryPolicy`]
//! bounds them). A capture or a cancel also waits for its intent's turn (`one_at_a_time`), so
//! this process never sends two changes to one intent at once. What a request's failure means
//! is read in `classify`; what an intent is, in `intent`.

use std::collections::HashMap;
use std::time::Duration;

use secrecy::ExposeSecret;
use stripe::{IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::payment_intent::{
    CancelPaymentIntent, CapturePaymentIntent, CreatePaymentIntent,
    CreatePaymentIntentAutomaticPaymentMethods, CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects,
    RetrievePaymentIntent,
};
use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod};
use stripe_payment::payment_method::RetrievePaymentMethod;

use crate::budget::{Endpoint, FleetLimits, StripeBudget};
use crate::classify::{Operation, PaymentError, RetryPolicy, classify, is_rate_limit, is_saved_failure};
use crate::config::StripeConfig;
use crate::held_here::HeldHere;
use crate::intent::{AttemptDid, EXPAND, Intent, IntentStatus};
use crate::one_at_a_time::OneAtATime;
use crate::stripe_http::PooledStripe;
use orderfleet_runtime::db::Pool;
use orderfleet_words::hold::OrderIntent;
use orderfleet_words::{Money, OrderId, UserId};

/// How much older than a create's send its intent must be to be a replay: Stripe's `created`
/// is in whole seconds, and the clocks are placed on each other to about a second.
const REPLAYED_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// What an order needs authorized.
#[derive(Debug, Clone)]
pub struct AuthorizeRequest<'a> {
    /// The order (its id is the PaymentIntent's `metadata[order_id]`).
    pub order_id: OrderId,
    /// The order's attempt ([`Operation::idempotency_key`]).
    pub attempt: i32,
    /// The buyer (`metadata[user_id]`).
    pub user_id: &'a UserId,
    /// The amount to hold.
    pub amount: &'a Money,
    /// The buyer's PaymentMethod.
    pub payment_method: &'a str,
}

/// The Stripe client of one process: its key, its budget, its retries.
#[derive(Clone)]
pub struct Payments {
    /// async-stripe's requests, over kept-alive connections.
    pub(super) client: PooledStripe,
    pub(super) retry: RetryPolicy,
    /// Shared by every clone: the process's part of the fleet's budget.
    budget: std::sync::Arc<StripeBudget>,
    action_timeout: Duration,
    /// Shared by every clone: the PaymentIntents this process created that held funds at once.
    held_here: std::sync::Arc<HeldHere>,
    /// Shared by every clone: each intent's turn, so its changes go one at a time.
    one_at_a_time: std::sync::Arc<OneAtATime>,
}

impl std::fmt::Debug for Payments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payments").field("retry", &self.retry).finish_non_exhaustive()
    }
}

impl Payments {
    /// The client for `config`, retrying as `retry` says, a member of the fleet's Stripe
    /// budget in `pool`'s database.
    pub fn new(config: &StripeConfig, retry: RetryPolicy, pool: Pool) -> anyhow::Result<Self> {
        orderfleet_runtime::install_crypto_provider();
        let client = PooledStripe::new(config.secret_key.expose_secret(), config.api_base.as_str())
            .map_err(|e| anyhow::anyhow!("failed to build the Stripe client: {e}"))?;
        let limits = FleetLimits {
            account: config.account_requests_per_second.0.get(),
            endpoint: config.endpoint_requests_per_second.0.get(),
            ceiling: config.max_requests_per_second.map(|r| r.0.get()),
        };
        let budget = StripeBudget::new(&pool, limits, retry.budget_wait);
        let action_timeout = config.action_timeout.0;
        let held_here = std::sync::Arc::default();
        let one_at_a_time = std::sync::Arc::default();
        Ok(Self { client, retry, budget, action_timeout, held_here, one_at_a_time })
    }

    /// Whether this process created `payment_intent_id` holding funds at once ([`HeldHere`]).
    pub fn held_here(&self, payment_intent_id: &str) -> bool {
        self.held_here.knows(payment_intent_id)
    }

    /// Forgets a hold made here whose commit did not record it on its order (the order had
    /// moved on, or the database failed): it may be a stray, whose event must reach the
    /// webhook's release of strays.
    pub fn not_held_here(&self, payment_intent_id: &str) {
        self.held_here.forget(payment_intent_id);
    }

    /// The longest one call of this client can take ([`RetryPolicy::longest_call`]).
    pub fn longest_call(&self) -> Duration {
        self.retry.longest_call()
    }

    /// How long a buyer has to complete 3-D Secure (`PAYMENT_ACTION_TIMEOUT_SECONDS`).
    pub fn action_timeout(&self) -> Duration {
        self.action_timeout
    }

    /// Whether `intent` was made well before `sent` (this machine's clock, placed on Stripe's):
    /// an answer to a request sent then is a replay of an earlier request's under its key.
    pub fn made_before(&self, intent: &Intent, sent: chrono::DateTime<chrono::Utc>) -> bool {
        let on_stripe = self.client.stripe_time(sent).unwrap_or(sent);
        intent.created.is_some_and(|created| created < on_stripe - REPLAYED_AFTER)
    }

    /// How long a request may wait here for its turn of the fleet's Stripe budget.
    pub fn budget_wait(&self) -> Duration {
        self.retry.budget_wait
    }

    /// The fleet's create rate, in authorizations a second, as this process last saw it.
    pub fn create_rate(&self) -> f64 {
        self.budget.create_rate()
    }

    /// Takes a turn of the fleet's Stripe budget for one request.
    async fn slot(&self, endpoint: Endpoint) -> Result<(), PaymentError> {
        self.budget.acquire(endpoint).await.map_err(|e| PaymentError::Unavailable(format!("throttled: {e}")))
    }

    /// Creates and confirms a manual-capture PaymentIntent: a hold, not a charge.
    pub async fn authorize(&self, request: &AuthorizeRequest<'_>) -> Result<Intent, PaymentError> {
        let key = Operation::Authorize.idempotency_key(request.order_id, request.attempt);
        let metadata = HashMap::from([
            ("order_id".to_owned(), request.order_id.to_string()),
            ("user_id".to_owned(), request.user_id.as_str().to_owned()),
            // Which attempt made it: an operator looking at an order's intents in Stripe's
            // dashboard sees which key each came from.
            ("attempt".to_owned(), request.attempt.to_string()),
        ]);
        let currency: stripe_types::Currency = request.amount.currency.as_str().parse().map_err(|_| {
            refused("invalid_currency", format!("unknown currency {}", request.amount.currency.as_str()), 400)
        })?;
        self.with_retries(Operation::Authorize, || {
            CreatePaymentIntent::new(request.amount.minor, currency.clone())
                .capture_method(PaymentIntentCaptureMethod::Manual)
                .confirm(true)
                .payment_method(request.payment_method)
                // A card confirmed on the server: no redirect-based methods, so no return_url
                // (Stripe refuses a confirm that could redirect without one), and a card that
                // needs 3-D Secure hands its next action to the buyer's Stripe.js (SPEC §1.1).
                .automatic_payment_methods(CreatePaymentIntentAutomaticPaymentMethods {
                    allow_redirects: Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never),
                    enabled: true,
                })
                .use_stripe_sdk(true)
                .metadata(metadata.clone())
                .expand([EXPAND.to_owned()])
                .customize()
                .request_strategy(RequestStrategy::Idempotent(idempotency_key(&key)))
                .timeout(self.retry.timeout)
                .send(&self.client)
        })
        .await
        .map(|pi| Intent::from(&pi))
        .inspect(|intent| {
            if intent.status == IntentStatus::RequiresCapture {
                self.held_here.remember(&intent.id);
            }
        })
    }

    /// Captures an authorized PaymentIntent. An intent that is already captured counts as
    /// captured: the first capture's answer was lost and Stripe's key has expired.
    pub async fn capture(&self, intent: OrderIntent<'_>) -> Result<Intent, PaymentError> {
        let key = Operation::Capture.idempotency_key(intent.order_id, intent.attempt);
        self.settle(Operation::Capture, &key, intent.id, CapturePaymentIntent::new(intent.id)).await
    }

    /// Cancels a PaymentIntent, releasing its hold: `Ok` only once Stripe shows it `canceled`
    /// (the cancel's answer, or, after a refusal or a saved failure, the intent read), so a
    /// caller never checks the status again. One the buyer's page could still confirm
    /// (`requires_payment_method`) is not released until it is cancelled.
    pub async fn cancel(&self, intent: OrderIntent<'_>) -> Result<Intent, PaymentError> {
        let key = Operation::Cancel.idempotency_key(intent.order_id, intent.attempt);
        self.settle(Operation::Cancel, &key, intent.id, CancelPaymentIntent::new(intent.id)).await
    }

    /// Cancels a PaymentIntent made for the order that is not the one the order recorded (a
    /// stray, left by an answer lost on the way), under a key of its own
    /// (`orderfleet-<order>-cancel-<intent>`): the order's own cancel key stays the order's.
    pub async fn cancel_stray(
        &self,
        order_id: OrderId,
        payment_intent_id: &str,
    ) -> Result<Intent, PaymentError> {
        let key = format!("orderfleet-{order_id}-cancel-{payment_intent_id}");
        let request = CancelPaymentIntent::new(payment_intent_id);
        self.settle(Operation::Cancel, &key, payment_intent_id, request).await
    }

    /// Sends a capture or a cancel under `key`, with retries; a refusal because the intent is
    /// already where the operation wants it counts as done. A cancel whose key holds a saved
    /// failure (a 5xx, or a refusal while the intent was changing) goes on under a fresh key
    /// ([`Self::cancel_again`]).
    async fn settle<R>(
        &self,
        operation: Operation,
        key: &str,
        payment_intent_id: &str,
        request: R,
    ) -> Result<Intent, PaymentError>
    where
        R: StripeRequest<Output = PaymentIntent>,
    {
        match self.send_settle(operation, key, payment_intent_id, &request).await {
            Ok(intent) => Ok(intent),
            Err(error) if operation == Operation::Cancel => {
                self.cancel_again(key, payment_intent_id, &request, error).await
            }
            Err(error) => self.captured_already(payment_intent_id, error).await,
        }
    }

    /// Sends one change to `payment_intent_id` under `key`, with retries, in the intent's turn:
    /// a `lock_timeout` from Stripe is then never this process racing itself.
    async fn send_settle<R>(
        &self,
        operation: Operation,
        key: &str,
        payment_intent_id: &str,
        request: &R,
    ) -> Result<Intent, PaymentError>
    where
        R: StripeRequest<Output = PaymentIntent>,
    {
        let _turn = self.one_at_a_time.turn(payment_intent_id).await;
        self.with_retries(operation, || {
            request
                .customize()
                .request_strategy(RequestStrategy::Idempotent(idempotency_key(key)))
                .timeout(self.retry.timeout)
                .send(&self.client)
        })
        .await
        .map(|pi| Intent::from(&pi))
    }

    /// After a cancel under `key` failed: only an intent Stripe shows `canceled` is released.
    /// Stripe saves a 5xx, and a refusal made while the intent was changing (a buyer's confirm
    /// in flight), under the key, and replays it for 24 hours; so while the intent can still
    /// be cancelled (`requires_payment_method` included: the buyer's page holds its client
    /// secret and can confirm it with another card), the cancel is sent once more under a key
    /// of this try's own. A cancel is idempotent in effect (a second one is refused, and the
    /// intent read shows it `canceled`), so a fresh key cannot release anything twice.
    async fn cancel_again<R>(
        &self,
        key: &str,
        payment_intent_id: &str,
        request: &R,
        error: PaymentError,
    ) -> Result<Intent, PaymentError>
    where
        R: StripeRequest<Output = PaymentIntent>,
    {
        if !is_saved_failure(&error) {
            return Err(error);
        }
        match self.what_the_attempt_did(payment_intent_id, IntentStatus::Canceled).await? {
            AttemptDid::Done(now) => return Ok(now),
            // Captured: nothing to release; the caller's error says why.
            AttemptDid::Elsewhere(_) => return Err(error),
            AttemptDid::Nothing(_) => {}
        }
        let fresh = format!("{key}-{}", chrono::Utc::now().timestamp_millis());
        metrics::counter!(crate::metrics::STRIPE_CANCELS_RESENT.name).increment(1);
        tracing::warn!(payment_intent = payment_intent_id, %error, "the cancel's key holds a failure and the intent is live; cancelling under a fresh key");
        match self.send_settle(Operation::Cancel, &fresh, payment_intent_id, request).await {
            Ok(intent) => Ok(intent),
            Err(again) if is_saved_failure(&again) => {
                match self.what_the_attempt_did(payment_intent_id, IntentStatus::Canceled).await? {
                    AttemptDid::Done(now) => Ok(now),
                    AttemptDid::Nothing(now) | AttemptDid::Elsewhere(now) => {
                        Err(PaymentError::Unavailable(format!(
                            "the intent is {:?} and its cancel did not take effect ({again}); cancelled again later",
                            now.status
                        )))
                    }
                }
            }
            Err(again) => Err(again),
        }
    }

    /// The one reading of an attempt Stripe answered with a saved failure (a 5xx, or a refusal
    /// while the intent was changing), which a retry under the attempt's key would get again
    /// for 24 hours: what the attempt did, asked of the intent itself (a retrieve is never
    /// stale). The intent where the attempt `wanted` it is done; one that can still get there
    /// was left as it was, so the attempt may go again under a new key (a fresh one for a
    /// cancel, the order's next attempt for a capture); any other went elsewhere.
    pub async fn what_the_attempt_did(
        &self,
        payment_intent_id: &str,
        wanted: IntentStatus,
    ) -> Result<AttemptDid, PaymentError> {
        let now = self.retrieve(payment_intent_id).await?;
        Ok(if now.status == wanted {
            AttemptDid::Done(now)
        } else if now.status.can_become(wanted) {
            AttemptDid::Nothing(now)
        } else {
            AttemptDid::Elsewhere(now)
        })
    }

    /// The intent as Stripe sees it now (the sweeper trusts this over any local belief).
    pub async fn retrieve(&self, payment_intent_id: &str) -> Result<Intent, PaymentError> {
        self.with_retries(Operation::Retrieve, || {
            RetrievePaymentIntent::new(payment_intent_id)
                .expand([EXPAND.to_owned()])
                .customize()
                .timeout(self.retry.timeout)
                .send(&self.client)
        })
        .await
        .map(|pi| Intent::from(&pi))
    }

    /// The `card.fingerprint` of `payment_method` (`GET /v1/payment_methods/{id}`), for the card
    /// cap: Stripe gives one card number one fingerprint in an account, however many payment
    /// methods and customers carry it (docs.stripe.com/api/payment_methods/object,
    /// `card.fingerprint`). `None` for a payment method that is no card. A lookup: no key, and
    /// within the fleet's budget on its own operation.
    pub async fn card_fingerprint(&self, payment_method: &str) -> Result<Option<String>, PaymentError> {
        let id = payment_method.to_owned();
        self.with_retries(Operation::PaymentMethod, || {
            RetrievePaymentMethod::new(id.as_str()).customize().timeout(self.retry.timeout).send(&self.client)
        })
        .await
        .map(|method| method.card.and_then(|card| card.fingerprint))
    }

    /// Whether Stripe answers at all: one lookup of an intent that does not exist, no retries.
    /// "No such intent" is an answer; a timeout, a refused connection or a 5xx is not.
    pub async fn probe(&self) -> Result<(), String> {
        self.slot(Endpoint::Retrieve).await.map_err(|e| format!("Stripe: {e}"))?;
        let result = RetrievePaymentIntent::new("pi_orderfleet_probe")
            .customize()
            .timeout(self.retry.timeout)
            .send(&self.client)
            .await;
        match result.map_err(classify) {
            Ok(_) | Err(PaymentError::Refused { .. }) | Err(PaymentError::Declined { .. }) => Ok(()),
            // An object held at Stripe is an answer: Stripe is up.
            Err(PaymentError::Locked(_)) => Ok(()),
            Err(PaymentError::Unavailable(reason) | PaymentError::AttemptFailed(reason)) => {
                Err(format!("Stripe: {reason}"))
            }
        }
    }

    /// After a refused capture: if the intent is captured already, the earlier capture took
    /// effect and this one is done. (A cancel goes on by [`Self::cancel_again`].)
    async fn captured_already(
        &self,
        payment_intent_id: &str,
        error: PaymentError,
    ) -> Result<Intent, PaymentError> {
        let PaymentError::Refused { ref code, .. } = error else { return Err(error) };
        if code != "payment_intent_unexpected_state" {
            return Err(error);
        }
        let now = self.retrieve(payment_intent_id).await?;
        if now.status == IntentStatus::Succeeded { Ok(now) } else { Err(error) }
    }

    pub(super) async fn with_retries<T, F, Fut>(
        &self,
        operation: Operation,
        mut call: F,
    ) -> Result<T, PaymentError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StripeError>>,
    {
        let mut attempt = 0;
        loop {
            // A refused slot is not retried: the budget is saturated, and the caller's answer
            // (503, or the message left for later) is the backoff.
            self.slot(operation.endpoint()).await?;
            let error = match call().await {
                Ok(answer) => {
                    metrics::counter!(crate::metrics::STRIPE_REQUESTS.name, "operation" => operation.as_str(), "outcome" => "ok")
                        .increment(1);
                    return Ok(answer);
                }
                // A 5xx to a request with a key is saved under the key: retrying it can only
                // get it again. Without a key (a lookup) it is just a passing failure.
                Err(e) => match classify(self.counted_429(operation, e)) {
                    PaymentError::AttemptFailed(reason) if !operation.has_key() => {
                        PaymentError::Unavailable(reason)
                    }
                    error => error,
                },
            };
            if let PaymentError::AttemptFailed(_) = error {
                metrics::counter!(crate::metrics::STRIPE_REQUESTS.name, "operation" => operation.as_str(), "outcome" => "attempt_failed")
                    .increment(1);
                return Err(error);
            }
            let outcome = match &error {
                PaymentError::Locked(_) => "lock_timeout",
                e if e.is_transient() => "transient",
                _ => "permanent",
            };
            metrics::counter!(crate::metrics::STRIPE_REQUESTS.name, "operation" => operation.as_str(), "outcome" => outcome)
                .increment(1);
            attempt += 1;
            if !error.is_transient() || attempt >= self.retry.attempts {
                return Err(error);
            }
            let delay = self.retry.backoff.delay(attempt - 1);
            tracing::warn!(operation = operation.as_str(), attempt, ?delay, %error, "retrying the Stripe call (with the same key, if it has one)");
            tokio::time::sleep(delay).await;
        }
    }
}

impl Payments {
    /// A 429 about the rate (a limit lowered) slows the fleet down; a `lock_timeout` is about
    /// one object, so it is only counted here, and the request goes again after its backoff.
    fn counted_429(&self, operation: Operation, error: StripeError) -> StripeError {
        if is_rate_limit(&error) {
            self.budget.rate_limited(operation.endpoint());
            self.budget.record_429(operation.endpoint(), "rate_limit");
        } else if matches!(error, StripeError::Stripe(_, 429)) {
            metrics::counter!(crate::metrics::STRIPE_LOCK_TIMEOUTS.name, "operation" => operation.as_str())
                .increment(1);
            self.budget.record_429(operation.endpoint(), "lock_timeout");
        }
        error
    }
}

fn idempotency_key(key: &str) -> IdempotencyKey {
    IdempotencyKey::new(key).expect("our keys are 1..=255 characters")
}

fn refused(code: &str, message: String, status: u16) -> PaymentError {
    PaymentError::Refused { code: code.to_owned(), message, status }
}
