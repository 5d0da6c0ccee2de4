//! A PaymentIntent as the fleet reads it: [`Intent`], its [`IntentStatus`], the buyer's
//! [`Action`] and its [`ChargeState`], mapped from async-stripe's `PaymentIntent`, and put in
//! the order's words ([`orderfleet_words::hold`]). Every call that reads an intent answers one of
//! these, so the mapping is in one place.

use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod, PaymentIntentStatus};

use orderfleet_words::hold::{BuyerAction, Hold};
use orderfleet_words::{Money, OrderId};

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
    /// The id of its PaymentMethod now: the one it was made with, or another the buyer's page
    /// confirmed it with since (after a decline or a failed authentication); `None` once Stripe
    /// detached a declined one.
    pub payment_method: Option<String>,
}

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
pub(super) const EXPAND: &str = "latest_charge";

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

    /// Whether an intent now in this status can still be moved to `wanted` by a capture or a
    /// cancel: a capture needs a hold (`requires_capture`); a cancel, an intent neither
    /// cancelled nor captured.
    pub fn can_become(self, wanted: IntentStatus) -> bool {
        match wanted {
            IntentStatus::Succeeded => self == IntentStatus::RequiresCapture,
            IntentStatus::Canceled => !matches!(self, IntentStatus::Canceled | IntentStatus::Succeeded),
            _ => false,
        }
    }
}

/// What an attempt Stripe answered with a saved failure did, read from its intent
/// ([`crate::Payments::what_the_attempt_did`]).
#[derive(Debug, Clone)]
pub enum AttemptDid {
    /// The intent is where the attempt wanted it: done.
    Done(Intent),
    /// Nothing: the intent can still get there, under a new key.
    Nothing(Intent),
    /// The intent went elsewhere (a cancel met a capture, a capture met a released hold).
    Elsewhere(Intent),
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
            payment_method: pi.payment_method.as_ref().map(|method| method.id().as_str().to_owned()),
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
