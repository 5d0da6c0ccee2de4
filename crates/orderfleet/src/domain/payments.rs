//! Payments through Stripe's API with async-stripe, against Stripe in production and
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
//! A **5xx** is different. Stripe saves the answer of a request that began executing, a 500
//! included, under its key for 24 hours, and replays it to every retry with that key
//! (docs.stripe.com/api/idempotent_requests): retrying with the same key can only get the 500
//! again. So a 5xx to a request with a key ends that attempt at once
//! ([`PaymentError::AttemptFailed`]), and the caller asks Stripe what the attempt did — the
//! intent itself for a capture or a cancel, the intents listed since the order was made, by
//! `metadata[order_id]`, for an authorization — and moves the order to its next attempt, with new keys, only when the
//! attempt did nothing (`crate::domain::order::next_payment_attempt`). An `idempotency_error`
//! (the key ran before, with other parameters: a deploy changed the request while one was in
//! flight) ends the attempt the same way, and is never a decline.
//!
//! Every request, each retry included, first takes a slot of the process's Stripe request
//! budget ([`crate::runtime::budget`]); no slot within the bounded wait is
//! [`PaymentError::Unavailable`] too, without a request made.

use std::collections::HashMap;
use std::time::Duration;

use crate::domain::{Money, OrderId, UserId};
use secrecy::ExposeSecret;
use stripe::{ApiErrorsCode, ApiErrorsType, IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::payment_intent::{
    CancelPaymentIntent, CapturePaymentIntent, CreatePaymentIntent,
    CreatePaymentIntentAutomaticPaymentMethods, CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects,
    ListPaymentIntent, RetrievePaymentIntent,
};
use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod, PaymentIntentStatus};
use stripe_types::{RangeBoundsTs, RangeQueryTs};

use crate::runtime::backoff::Backoff;
use crate::runtime::budget::{Endpoint, FleetLimits, StripeBudget};
use crate::runtime::config::StripeConfig;
use crate::runtime::db::Pool;
use crate::runtime::stripe_http::PooledStripe;

/// How much older than a create's send its intent must be to be a replay: Stripe's `created`
/// is in whole seconds, and the clocks are placed on each other to about a second.
const REPLAYED_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

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
        }
    }

    /// Whether requests of this operation carry an idempotency key (they change something).
    fn has_key(self) -> bool {
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
    /// Stripe answered 5xx to this attempt's request and saved that answer under its key (a
    /// retry with the key gets it again for 24 hours), or answered `idempotency_error` (the key
    /// ran before, with other parameters). What the attempt did is unknown until Stripe is
    /// asked; only if it did nothing may the order's next attempt begin.
    #[error("the payment provider failed this attempt: {0}")]
    AttemptFailed(String),
}

impl PaymentError {
    /// Whether trying again later can succeed.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, PaymentError::Unavailable(_) | PaymentError::AttemptFailed(_))
    }
}

pub use crate::domain::hold::OrderIntent;
use crate::domain::hold::{BuyerAction, Hold};

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

/// The state of a PaymentIntent that matters to the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The PaymentIntent's id.
    pub id: String,
    /// Its status.
    pub status: IntentStatus,
    /// Its amount, in minor units, and its currency (lower case, as Stripe answers it).
    pub amount: i64,
    /// Its currency.
    pub currency: String,
    /// Whether it captures only when told (`capture_method=manual`), as every fleet intent does.
    pub manual_capture: bool,
    /// Its `metadata[order_id]`: the order it was made for.
    pub order_id: Option<String>,
    /// While `requires_action`: what the buyer's page needs to complete it with Stripe.js.
    pub action: Option<Action>,
    /// The code of its last payment error (`payment_intent_authentication_failure` when the
    /// buyer failed 3-D Secure, a card decline's code otherwise).
    pub last_error: Option<String>,
    /// Its charge, when the answer carried it (`expand[]=latest_charge`).
    pub charge: Option<ChargeState>,
    /// Until when Stripe honours the hold (its charge's `payment_method_details.card
    /// .capture_before`, about 7 days for most cards); after it Stripe cancels the intent and a
    /// capture is refused. Known when the answer carried the charge (every request here asks
    /// for it with `expand`); `None` for a capture or a cancel, or when Stripe gave none.
    pub capture_before: Option<chrono::DateTime<chrono::Utc>>,
    /// When Stripe made it (its clock).
    pub created: Option<chrono::DateTime<chrono::Utc>>,
}

/// How much earlier than the order's creation, on Stripe's clock, a lookup's window opens: the
/// database's clock (which dates the order) and this machine's may differ a little (both keep
/// NTP time), and `Date` and `created` count whole seconds. A wider window costs intents read
/// in vain: a page per 100 the account made meanwhile (BENCHMARKS.md, "Finding an attempt").
const WINDOW_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// Intents per page of a lookup: the most Stripe's list gives.
const LIST_PAGE: i64 = 100;

/// What a buyer's page needs to complete a `requires_action` intent (3-D Secure) with
/// Stripe.js's `handleNextAction`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// The intent's client secret: it lets the buyer's browser act on this intent alone.
    pub client_secret: String,
    /// Stripe's `next_action` (`{"type": "use_stripe_sdk", …}`), as Stripe gave it.
    pub next_action: serde_json::Value,
}

impl Intent {
    /// The hold it is, as its order's move records it.
    pub fn hold(&self) -> Hold<'_> {
        Hold { intent_id: &self.id, capture_before: self.capture_before }
    }
}

impl Action {
    /// What its buyer's page needs, as its order's move records it, with the buyer's deadline.
    pub fn for_buyer(&self, until: chrono::DateTime<chrono::Utc>) -> BuyerAction<'_> {
        BuyerAction { client_secret: &self.client_secret, next_action: &self.next_action, until }
    }
}

/// What the intent's charge says of money moved after the authorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChargeState {
    /// Captured: money moved (a refund of an uncaptured charge is a released hold).
    pub captured: bool,
    /// Refunded so far, in minor units.
    pub amount_refunded: i64,
    /// Disputed by the cardholder.
    pub disputed: bool,
}

/// What every request that reads an intent asks Stripe to include whole: the charge, where
/// the hold's deadline is. It costs no extra request.
const EXPAND: &str = "latest_charge";

/// A PaymentIntent's status, as far as the fleet needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentStatus {
    /// Authorized, holding funds until captured or cancelled.
    RequiresCapture,
    /// Captured.
    Succeeded,
    /// Cancelled: no hold.
    Canceled,
    /// Declined, failed 3-D Secure, or not yet confirmed: no hold.
    RequiresPaymentMethod,
    /// Waiting for the buyer (3-D Secure): no hold yet.
    RequiresAction,
    /// Any other status (processing, requires confirmation).
    Other,
}

impl IntentStatus {
    /// Holding funds, or able to soon without the fleet: waiting for its buyer's 3-D Secure, or
    /// its confirm not ended. Such an intent that no order of the fleet will capture is cancelled
    /// (a stray, or a failed order's own).
    pub fn is_live(self) -> bool {
        matches!(self, IntentStatus::RequiresCapture | IntentStatus::RequiresAction | IntentStatus::Other)
    }
}

impl From<&PaymentIntentStatus> for IntentStatus {
    fn from(status: &PaymentIntentStatus) -> Self {
        match status {
            PaymentIntentStatus::RequiresCapture => IntentStatus::RequiresCapture,
            PaymentIntentStatus::Succeeded => IntentStatus::Succeeded,
            PaymentIntentStatus::Canceled => IntentStatus::Canceled,
            PaymentIntentStatus::RequiresPaymentMethod => IntentStatus::RequiresPaymentMethod,
            PaymentIntentStatus::RequiresAction => IntentStatus::RequiresAction,
            _ => IntentStatus::Other,
        }
    }
}

impl From<&PaymentIntent> for Intent {
    fn from(pi: &PaymentIntent) -> Self {
        let charge = match pi.latest_charge.as_ref() {
            Some(stripe_types::Expandable::Object(charge)) => Some(charge),
            _ => None,
        };
        let capture_before = charge
            .and_then(|c| c.payment_method_details.as_ref()?.card.as_ref()?.capture_before)
            .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0));
        let status = IntentStatus::from(&pi.status);
        let action = match (status, &pi.client_secret, &pi.next_action) {
            (IntentStatus::RequiresAction, Some(secret), Some(next)) => {
                Some(Action { client_secret: secret.clone(), next_action: next_action_json(next) })
            }
            _ => None,
        };
        Self {
            id: pi.id.as_str().to_owned(),
            status,
            amount: pi.amount,
            currency: pi.currency.to_string(),
            manual_capture: matches!(pi.capture_method, PaymentIntentCaptureMethod::Manual),
            order_id: pi.metadata.get("order_id").cloned(),
            created: chrono::DateTime::from_timestamp(pi.created, 0),
            action,
            last_error: pi
                .last_payment_error
                .as_ref()
                .and_then(|e| Some(e.code.as_ref()?.as_str().to_owned())),
            charge: charge.map(|c| ChargeState {
                captured: c.captured,
                amount_refunded: c.amount_refunded,
                disputed: c.disputed,
            }),
            capture_before,
        }
    }
}

/// Stripe's `next_action` as JSON for the buyer's page: its `type`, and the object of that
/// type (only `use_stripe_sdk` for a card confirmed with `use_stripe_sdk=true`; any other is
/// named by its type, which Stripe.js's `handleNextAction` reads from the intent itself).
fn next_action_json(next: &stripe_shared::PaymentIntentNextAction) -> serde_json::Value {
    let sdk = next
        .use_stripe_sdk
        .as_ref()
        .and_then(|value| serde_json::from_str::<serde_json::Value>(&miniserde::json::to_string(value)).ok());
    match sdk {
        Some(sdk) => serde_json::json!({ "type": next.type_, "use_stripe_sdk": sdk }),
        None => serde_json::json!({ "type": next.type_ }),
    }
}

impl Intent {
    /// Whether it is the one the fleet made for this order: its metadata names the order, and
    /// it holds the order's amount in its currency with manual capture. The buyer's browser
    /// can act on an intent through its client secret; the fleet trusts only what this says.
    pub fn is_for(&self, order_id: OrderId, amount: &Money) -> bool {
        self.order_id.as_deref() == Some(order_id.to_string().as_str())
            && self.amount == amount.minor
            && self.currency.eq_ignore_ascii_case(amount.currency.as_str())
            && self.manual_capture
    }
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
    /// through Stripe calls counts its calls in these ([`crate::domain::order::lease_for`]).
    pub fn longest_call(&self) -> Duration {
        let attempts = self.attempts.max(1);
        let pauses: Duration = (0..attempts - 1).map(|n| self.backoff.ceiling(n)).sum();
        (self.budget_wait + self.timeout) * attempts + pauses
    }
}

/// The Stripe client of one process: its key, its budget, its retries.
#[derive(Clone)]
pub struct Payments {
    /// async-stripe's requests, over kept-alive connections.
    client: PooledStripe,
    retry: RetryPolicy,
    /// Shared by every clone: the process's part of the fleet's budget.
    budget: std::sync::Arc<StripeBudget>,
    action_timeout: Duration,
    /// Shared by every clone: the PaymentIntents this process created that held funds at once.
    held_here: std::sync::Arc<HeldHere>,
}

/// The PaymentIntents a process's authorizations created holding funds at once (no 3-D
/// Secure): the last [`HeldHere::KEPT`] of them, oldest forgotten first, and none whose
/// commit did not record it on its order (`authorization::record` forgets those: such an
/// intent may be a stray, to be released). Stripe's `payment_intent.amount_capturable_updated`
/// for one of them can change nothing (its order goes, or went, to `authorized` or on to
/// `stock_reserved` by the commit of that authorization, never to `requires_action`), so the
/// webhook answers it without a statement ([`crate::domain::webhook::apply`]). Another intake
/// process, or this one after a restart, does not know them, and its webhook reads the order,
/// as for any other event.
#[derive(Debug)]
struct HeldHere {
    capacity: usize,
    kept: std::sync::Mutex<(std::collections::HashSet<String>, std::collections::VecDeque<String>)>,
}

impl Default for HeldHere {
    fn default() -> Self {
        Self::keeping(Self::KEPT)
    }
}

impl HeldHere {
    /// How many are kept: an hour of a busy intake's authorizations, a few megabytes.
    const KEPT: usize = 100_000;

    fn keeping(capacity: usize) -> Self {
        Self { capacity, kept: std::sync::Mutex::default() }
    }

    fn remember(&self, payment_intent_id: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (set, order) = &mut *kept;
        if set.insert(payment_intent_id.to_owned()) {
            order.push_back(payment_intent_id.to_owned());
        }
        while order.len() > self.capacity {
            order.pop_front().map(|oldest| set.remove(&oldest));
        }
    }

    fn forget(&self, payment_intent_id: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (set, order) = &mut *kept;
        if set.remove(payment_intent_id) {
            order.retain(|id| id != payment_intent_id);
        }
    }

    fn knows(&self, payment_intent_id: &str) -> bool {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.contains(payment_intent_id)
    }
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
        crate::install_crypto_provider();
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
        Ok(Self { client, retry, budget, action_timeout, held_here })
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
        match self.send_settle(operation, key, &request).await {
            Ok(intent) => Ok(intent),
            Err(error) if operation == Operation::Cancel => {
                self.cancel_again(key, payment_intent_id, &request, error).await
            }
            Err(error) => self.captured_already(payment_intent_id, error).await,
        }
    }

    async fn send_settle<R>(
        &self,
        operation: Operation,
        key: &str,
        request: &R,
    ) -> Result<Intent, PaymentError>
    where
        R: StripeRequest<Output = PaymentIntent>,
    {
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
        let now = self.retrieve(payment_intent_id).await?;
        match now.status {
            IntentStatus::Canceled => return Ok(now),
            // Captured: nothing to release; the caller's error says why.
            IntentStatus::Succeeded => return Err(error),
            _ => {}
        }
        let fresh = format!("{key}-{}", chrono::Utc::now().timestamp_millis());
        metrics::counter!("stripe_cancels_resent_total").increment(1);
        tracing::warn!(payment_intent = payment_intent_id, %error, "the cancel's key holds a failure and the intent is live; cancelling under a fresh key");
        match self.send_settle(Operation::Cancel, &fresh, request).await {
            Ok(intent) => Ok(intent),
            Err(again) if is_saved_failure(&again) => {
                let now = self.retrieve(payment_intent_id).await?;
                if now.status == IntentStatus::Canceled {
                    Ok(now)
                } else {
                    Err(PaymentError::Unavailable(format!(
                        "the intent is {:?} and its cancel did not take effect ({again}); cancelled again later",
                        now.status
                    )))
                }
            }
            Err(again) => Err(again),
        }
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
            Err(PaymentError::Unavailable(reason) | PaymentError::AttemptFailed(reason)) => {
                Err(format!("Stripe: {reason}"))
            }
        }
    }

    /// The PaymentIntent made for an order, found by its `metadata[order_id]` among the intents
    /// Stripe's list API shows created since the order was (`since`, this machine's clock). This
    /// is how a resumed authorization learns what an attempt whose answer was lost, or whose
    /// key answered a 5xx or an `idempotency_error`, really did, without trusting an idempotency
    /// key that Stripe may have pruned (24 h).
    ///
    /// The list, not the search: Stripe's search lags its writes (under a minute normally, up to
    /// an hour in its incidents, which is when 5xx answers come), and its docs say not to use it
    /// to read after a write; the list does not lag (docs.stripe.com/search#data-freshness). It
    /// filters by `created`, on Stripe's clock, so the window is shifted by Stripe's clock as
    /// the `Date` of its answers shows it, and opened [`WINDOW_MARGIN`] early. Metadata is
    /// matched here, page by page (100 intents a page, newest first).
    ///
    /// `until`, when known, closes the window: an attempt whose key answered a 5xx made its
    /// intent, if any, before that answer came back, so intents made after it need not be read
    /// (after an incident on a busy account, the many made since).
    pub(crate) async fn find_by_order(
        &self,
        order_id: OrderId,
        since: chrono::DateTime<chrono::Utc>,
        until: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<Intent>, PaymentError> {
        let window = |client: &PooledStripe| {
            let on_stripe = |ours| client.stripe_time(ours).unwrap_or(ours);
            (on_stripe(since) - WINDOW_MARGIN, until.map(|until| on_stripe(until) + WINDOW_MARGIN))
        };
        let knew_the_clock = self.client.stripe_time(since).is_some();
        let first = window(&self.client);
        let mut intents = self.list_within(order_id, first).await?;
        // The first answer of this process taught the clock: the window was placed on ours,
        // and is read again where it lies on Stripe's if that differs.
        if !knew_the_clock && window(&self.client) != first {
            intents = self.list_within(order_id, window(&self.client)).await?;
        }
        // Several intents would mean a second authorization was made; the live one (holding
        // funds) is the one that matters.
        let live = intents.iter().find(|i| i.status == IntentStatus::RequiresCapture).cloned();
        Ok(live.or_else(|| intents.into_iter().next()))
    }

    /// The order's intents among those created within `(from, until)` (Stripe's clock; no end
    /// when `until` is `None`): every page.
    async fn list_within(
        &self,
        order_id: OrderId,
        window: (chrono::DateTime<chrono::Utc>, Option<chrono::DateTime<chrono::Utc>>),
    ) -> Result<Vec<Intent>, PaymentError> {
        let order = order_id.to_string();
        self.list_pages(window, |pi| pi.metadata.get("order_id") == Some(&order)).await
    }

    /// Every PaymentIntent Stripe's list shows created from `since` to `until` (this machine's
    /// clock, placed on Stripe's, and opened [`WINDOW_MARGIN`] early): every page. For the
    /// reconciliation of strays (`crate::domain::strays`).
    pub(crate) async fn list_created(
        &self,
        since: chrono::DateTime<chrono::Utc>,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Intent>, PaymentError> {
        let on_stripe = |ours| self.client.stripe_time(ours).unwrap_or(ours);
        self.list_pages((on_stripe(since) - WINDOW_MARGIN, Some(on_stripe(until))), |_| true).await
    }

    /// The intents that `keep` keeps among those created within `(from, until)` (Stripe's
    /// clock; no end when `until` is `None`), page by page, 100 a page, newest first.
    async fn list_pages(
        &self,
        (from, until): (chrono::DateTime<chrono::Utc>, Option<chrono::DateTime<chrono::Utc>>),
        keep: impl Fn(&PaymentIntent) -> bool,
    ) -> Result<Vec<Intent>, PaymentError> {
        let created = RangeQueryTs::Bounds(RangeBoundsTs {
            gte: Some(from.timestamp()),
            lte: until.map(|until| until.timestamp()),
            ..RangeBoundsTs::default()
        });
        let mut kept = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut request =
                ListPaymentIntent::new().created(created).limit(LIST_PAGE).expand([format!("data.{EXPAND}")]);
            if let Some(last) = &after {
                request = request.starting_after(last.clone());
            }
            let page = self
                .with_retries(Operation::List, || {
                    request.customize().timeout(self.retry.timeout).send(&self.client)
                })
                .await?;
            kept.extend(page.data.iter().filter(|pi| keep(pi)).map(Intent::from));
            match page.data.last() {
                Some(last) if page.has_more => after = Some(last.id.as_str().to_owned()),
                _ => return Ok(kept),
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

    async fn with_retries<T, F, Fut>(&self, operation: Operation, mut call: F) -> Result<T, PaymentError>
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
                    metrics::counter!("stripe_requests_total", "operation" => operation.as_str(), "outcome" => "ok")
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
                metrics::counter!("stripe_requests_total", "operation" => operation.as_str(), "outcome" => "attempt_failed")
                    .increment(1);
                return Err(error);
            }
            let outcome = if error.is_transient() { "transient" } else { "permanent" };
            metrics::counter!("stripe_requests_total", "operation" => operation.as_str(), "outcome" => outcome)
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
    /// A 429 (the limit, or a concurrent update's `lock_timeout`) slows the fleet down.
    fn counted_429(&self, operation: Operation, error: StripeError) -> StripeError {
        if matches!(error, StripeError::Stripe(_, 429)) {
            self.budget.rate_limited(operation.endpoint());
        }
        error
    }
}

fn idempotency_key(key: &str) -> IdempotencyKey {
    IdempotencyKey::new(key).expect("our keys are 1..=255 characters")
}

/// Whether a cancel's failure may be one Stripe saved under its key, and replays: a 5xx, or a
/// refusal because of the intent's state at that moment.
fn is_saved_failure(error: &PaymentError) -> bool {
    match error {
        PaymentError::AttemptFailed(_) => true,
        PaymentError::Refused { code, .. } => code == "payment_intent_unexpected_state",
        _ => false,
    }
}

fn refused(code: &str, message: String, status: u16) -> PaymentError {
    PaymentError::Refused { code: code.to_owned(), message, status }
}

/// Decides, next to the call, whether a Stripe failure is worth retrying.
fn classify(error: StripeError) -> PaymentError {
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
        StripeError::ClientError(e) if e.starts_with(crate::runtime::stripe_http::UNSAVED_5XX) => {
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
mod held_here_tests {
    use super::HeldHere;

    #[test]
    fn the_holds_made_here_are_known_until_newer_ones_push_them_out() {
        let held = HeldHere::keeping(2);
        held.remember("pi_1");
        held.remember("pi_2");
        held.remember("pi_2");
        assert!(held.knows("pi_1") && held.knows("pi_2") && !held.knows("pi_3"));
        held.remember("pi_3");
        assert!(!held.knows("pi_1"), "the oldest is forgotten first");
        assert!(held.knows("pi_2") && held.knows("pi_3"));
        held.forget("pi_2");
        assert!(!held.knows("pi_2") && held.knows("pi_3"), "a hold its commit did not record");
        held.remember("pi_4");
        assert!(held.knows("pi_3") && held.knows("pi_4"));
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
    fn timeouts_and_dropped_connections_are_transient() {
        assert!(classify(StripeError::Timeout).is_transient());
        assert!(classify(StripeError::ClientError("connection reset".into())).is_transient());
        // Our own misconfiguration must never turn into a declined card or a failed capture.
        assert!(classify(StripeError::ConfigError("bad".into())).is_transient());
    }
}
