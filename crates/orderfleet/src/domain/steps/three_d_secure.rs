//! 3-D Secure: an order whose card needs its buyer to authenticate (`requires_action`, SPEC
//! §1.1, §5). The intake answered `202` with what the buyer's page needs; the order keeps its
//! units and its place in line until its deadline (`action_expires_at`,
//! `PAYMENT_ACTION_TIMEOUT_SECONDS` after that answer). Then Stripe's webhook, or the sweeper
//! when none comes, settles it here, from the order's own PaymentIntent read fresh from Stripe
//! (never from an event's copy, nor from what the buyer's browser says):
//!
//! | the intent, read now | the order |
//! |---|---|
//! | `requires_capture`, the order's (metadata, amount, currency, manual capture) | `authorized`, with `order.stock_check_requested` and `order.accepted`: it flows on as any other |
//! | `requires_capture`, the order's, confirmed by the buyer's page with another card than the one checked, which would hold more than `--max-per-card` | its hold cancelled; `payment_declined` (`card_limit_reached`), counted as nothing |
//! | `requires_capture`, not the order's | its hold cancelled; `payment_declined` (`authentication_failed`) |
//! | `requires_payment_method` (the buyer failed authentication) | the intent cancelled; `payment_declined` (`authentication_failed`), counted as a decline |
//! | `canceled` (outside the fleet) | `payment_declined` (`payment_canceled`), or `authentication_timed_out` past the deadline (the fleet's own cancel, whose commit was lost); counted as nothing |
//! | still `requires_action`, before the deadline | nothing: the buyer is still at it |
//! | still `requires_action`, past the deadline | the intent cancelled, then decided again from the cancel's answer |
//!
//! A buyer who finishes at the deadline is never both released and charged: past it, the fleet
//! cancels, and what Stripe answers the cancel (a released hold, whether or not the buyer
//! finished a moment before) is what the order becomes. Every failure gives the units back
//! to the line, with `order.rejected`.
//!
//! A settle's move the database refuses for good (a trigger, a constraint) takes the one rule
//! of [`crate::domain::steps::refusal`]: the hold cancelled, the order ended `payment_declined` with
//! `order_refused` where the database allows it, the other orders untouched.
//!
//! Whoever settles holds the order's lease (`intake_lease_until`, as for a pending order), so
//! the webhook and the sweeper never settle one order at once.

use std::time::Duration;

use orderfleet_runtime::db::Pool;

use crate::domain::records::order::{Order, StripeEvent, Transition};
use crate::domain::steps::card_cap;
use crate::domain::steps::leased::AuthorizationError;
use crate::domain::steps::refusal::{self, Ended};
use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_payments::{Intent, IntentStatus, PaymentError, Payments};
use orderfleet_words::OrderId;

/// What settling did to the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// This call moved it to `authorized`.
    Authorized,
    /// This call moved it to `payment_declined`, for this reason.
    Declined(FailureReason),
    /// The buyer is still authenticating, before the deadline.
    Waiting,
    /// Someone else moved it first.
    MovedElsewhere,
    /// The database refused its move for good: its hold released, it ended `payment_declined`
    /// with `order_refused` ([`crate::domain::steps::refusal`]); the database's words.
    Refused(String),
}

/// Takes the lease of a `requires_action` order nobody is settling, for `lease`.
pub async fn take(pool: &Pool, id: OrderId, lease: Duration) -> sqlx::Result<Option<Order>> {
    crate::domain::records::order::take_lease(pool, id, OrderStatus::RequiresAction, lease, false).await
}

/// Gives the lease `order` was taken with back, if it is still this settler's.
pub async fn release(pool: &Pool, order: &Order) -> sqlx::Result<()> {
    crate::domain::records::order::release_lease(pool, order, OrderStatus::RequiresAction).await
}

/// The Stripe calls on the longest path through [`settle`]: the intent read, the read of the
/// card the buyer's page confirmed it with (another than the one checked under a cap per card,
/// [`card_cap::recheck_after_action`]), its cancel, the read after a failed cancel (one
/// refused because the intent moved, or one whose key answered a 5xx), the cancel under a fresh
/// key, and the read after that (`Payments::cancel`); then, if the database refuses the
/// order's end, the refusal rule's cancel of the same intent and the read after it
/// ([`crate::domain::steps::refusal`]).
pub const CALLS_TO_SETTLE: u32 = 8;

/// How long [`settle`] may take, its Stripe calls each at their longest: 8 × 27.6 s = 220.8 s
/// under the intake's policy (a webhook), 8 × 195.6 s = 1,564.8 s under the workers' (the
/// sweeper); its database statements take milliseconds.
pub fn settle_deadline(payments: &Payments) -> Duration {
    payments.longest_call() * CALLS_TO_SETTLE
}

/// Takes the lease of a `requires_action` order (for [`settle_deadline`] and the margin,
/// [`crate::domain::records::order::lease_for`]) and settles it, all within that deadline, so the work
/// never outlives the lease; cut off at it, the order waits for its lease to lapse. `None`:
/// someone else is settling it, or it moved on.
pub async fn take_and_settle(
    pool: &Pool,
    payments: &Payments,
    id: OrderId,
    event: Option<StripeEvent<'_>>,
) -> Result<Option<Settled>, AuthorizationError> {
    let deadline = settle_deadline(payments);
    let work = async {
        let lease = crate::domain::records::order::lease_for(deadline);
        let Some(order) = take(pool, id, lease).await? else { return Ok(None) };
        settle(pool, payments, &order, event).await.map(Some)
    };
    crate::domain::steps::leased::within(deadline, work).await
}

/// Settles a `requires_action` order whose lease the caller holds, from its intent read fresh
/// (see the module's table). The lease is given back whatever happens.
pub async fn settle(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    event: Option<StripeEvent<'_>>,
) -> Result<Settled, AuthorizationError> {
    let settled = settle_leased(pool, payments, order, event).await;
    if !matches!(
        settled,
        Ok(Settled::Authorized | Settled::Declined(_) | Settled::MovedElsewhere | Settled::Refused(_))
    ) {
        release(pool, order).await?;
    }
    settled
}

async fn settle_leased(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    event: Option<StripeEvent<'_>>,
) -> Result<Settled, AuthorizationError> {
    let Some(intent_id) = order.payment_intent_id.as_deref() else {
        return Err(AuthorizationError::LookupRefused(format!("order {} has no PaymentIntent", order.id)));
    };
    let now = payments.retrieve(intent_id).await.map_err(unavailable)?;
    let past_deadline = order.action_expires_at.is_none_or(|until| until <= chrono::Utc::now());
    match decide(order, &now, past_deadline) {
        Decision::Authorize => match within_the_card_cap(pool, payments, order, &now).await? {
            Capped::Fits => authorize(pool, payments, order, &now, event).await,
            Capped::Refused(reason, detail) => {
                // Released first, then recorded, as below.
                release_intent(payments, order, intent_id).await?;
                let refused = Transition::card_refused_after_action(order, reason, &detail);
                decline_with(pool, payments, order, refused, reason, event).await
            }
            Capped::Ended(settled) => Ok(settled),
        },
        Decision::Wait => Ok(Settled::Waiting),
        Decision::Decline(reason) => decline(pool, payments, order, reason, event).await,
        Decision::Release(reason) => {
            // Released first, then recorded: if the record is lost, the next settle finds the
            // intent cancelled. Past the deadline, a buyer who finished before the intent was
            // read is authorized; one who finishes after is released by the cancel, and
            // nothing is charged: never both.
            release_intent(payments, order, intent_id).await?;
            decline(pool, payments, order, reason, event).await
        }
    }
}

/// What the card cap says of an authenticated intent ([`card_cap::recheck_after_action`]).
enum Capped {
    /// Authorize it.
    Fits,
    /// Its card, another than the one checked, would hold more than the cap
    /// (`card_limit_reached`), or cannot be read (`payment_declined`): release it; why.
    Refused(FailureReason, String),
    /// Decided otherwise: moved on by someone else, or refused by the database (its one rule).
    Ended(Settled),
}

/// An order held to a cap per card whose buyer's page confirmed the intent with another card
/// than the one checked: that card is checked too, before the order is authorized on it.
async fn within_the_card_cap(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
) -> Result<Capped, AuthorizationError> {
    use card_cap::{RecheckError, Rechecked};
    let (reason, why) = match card_cap::recheck_after_action(pool, payments, order, intent).await {
        Ok(Rechecked::Fits) => return Ok(Capped::Fits),
        Ok(Rechecked::Over(why)) => (FailureReason::CardLimitReached, why),
        Ok(Rechecked::Unreadable(why)) => (FailureReason::PaymentDeclined, why),
        Ok(Rechecked::MovedElsewhere) => return Ok(Capped::Ended(Settled::MovedElsewhere)),
        Err(RecheckError::Stripe(e)) => return Err(unavailable(e)),
        Err(RecheckError::Database(e)) if orderfleet_runtime::db::refused_for_good(&e) => {
            return refused(pool, payments, order, &e).await.map(Capped::Ended);
        }
        Err(RecheckError::Database(e)) => return Err(e.into()),
    };
    tracing::warn!(payment_intent = intent.id, %reason, why, "the card the buyer's page confirmed with is refused");
    Ok(Capped::Refused(reason, why))
}

/// Cancels the order's intent and reads the cancel's result: only an intent Stripe shows
/// `canceled` is released. One that needs a payment method can still be confirmed by the
/// buyer's page (its client secret), with another card, so it is cancelled too; a cancel whose
/// key holds a saved failure goes on under a fresh key (`Payments::cancel`). A cancel that did
/// not take effect leaves the order `requires_action`, its lease given back, for the next
/// settle.
async fn release_intent(
    payments: &Payments,
    order: &Order,
    intent_id: &str,
) -> Result<(), AuthorizationError> {
    payments.cancel(order.intent(intent_id)).await.map(|_| ()).map_err(unavailable)
}

/// What an order in `requires_action` becomes, from its intent as Stripe has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Authorize,
    Wait,
    /// Ended, with no hold left: record it.
    Decline(FailureReason),
    /// Ended, but its intent must be cancelled first (it may hold funds, or the buyer may
    /// still complete it).
    Release(FailureReason),
}

fn decide(order: &Order, intent: &Intent, past_deadline: bool) -> Decision {
    match intent.status {
        IntentStatus::RequiresCapture | IntentStatus::Succeeded if intent.is_for(order.id, &order.amount) => {
            Decision::Authorize
        }
        IntentStatus::RequiresCapture | IntentStatus::Succeeded | IntentStatus::RequiresPaymentMethod => {
            Decision::Release(FailureReason::AuthenticationFailed)
        }
        IntentStatus::Canceled if intent.last_error.as_deref() == Some(FAILED_AUTHENTICATION) => {
            Decision::Decline(FailureReason::AuthenticationFailed)
        }
        IntentStatus::Canceled if past_deadline => Decision::Decline(FailureReason::AuthenticationTimedOut),
        IntentStatus::Canceled => Decision::Decline(FailureReason::PaymentCanceled),
        IntentStatus::RequiresAction | IntentStatus::Other if past_deadline => {
            Decision::Release(FailureReason::AuthenticationTimedOut)
        }
        IntentStatus::RequiresAction | IntentStatus::Other => Decision::Wait,
    }
}

/// Stripe's `last_payment_error.code` when the buyer failed 3-D Secure.
const FAILED_AUTHENTICATION: &str = "payment_intent_authentication_failure";

fn unavailable(error: PaymentError) -> AuthorizationError {
    match error {
        PaymentError::Unavailable(reason)
        | PaymentError::AttemptFailed(reason)
        | PaymentError::Locked(reason) => AuthorizationError::ProviderUnavailable(reason),
        refused => AuthorizationError::LookupRefused(refused.to_string()),
    }
}

/// ONE statement: `requires_action` → `authorized`, with the hold and the messages every
/// accepted order sends.
async fn authorize(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    hold: &Intent,
    event: Option<StripeEvent<'_>>,
) -> Result<Settled, AuthorizationError> {
    let moved = Transition::authorized(order, OrderStatus::RequiresAction, hold.hold())
        .with_event(event)
        .commit(pool)
        .await;
    let moved = match moved {
        Err(e) if orderfleet_runtime::db::refused_for_good(&e) => {
            return refused(pool, payments, order, &e).await;
        }
        moved => moved?,
    };
    if moved {
        tracing::info!(payment_intent = hold.id, "the buyer completed 3-D Secure; the order is authorized");
    }
    Ok(if moved { Settled::Authorized } else { Settled::MovedElsewhere })
}

/// ONE statement: `requires_action` → `payment_declined` with `reason`, the units back to the
/// line, and `order.rejected`.
async fn decline(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    reason: FailureReason,
    event: Option<StripeEvent<'_>>,
) -> Result<Settled, AuthorizationError> {
    decline_with(pool, payments, order, Transition::authentication_failed(order, reason), reason, event).await
}

/// [`decline`]'s ONE statement, as `failed` writes it.
async fn decline_with(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    failed: Transition<'_>,
    reason: FailureReason,
    event: Option<StripeEvent<'_>>,
) -> Result<Settled, AuthorizationError> {
    let moved = failed.with_event(event).commit(pool).await;
    let moved = match moved {
        Err(e) if orderfleet_runtime::db::refused_for_good(&e) => {
            return refused(pool, payments, order, &e).await;
        }
        moved => moved?,
    };
    if moved {
        tracing::info!(%reason, "3-D Secure did not complete; the order's units go back to the line");
    }
    Ok(if moved { Settled::Declined(reason) } else { Settled::MovedElsewhere })
}

/// The database refused a settle's move for good: the one rule of [`crate::domain::steps::refusal`],
/// as on every path. The order's hold is cancelled (or owed), and the order ends
/// `payment_declined` with `order_refused` where the database allows it, or is for a person
/// ([`AuthorizationError::OrderRefused`]), its hold released all the same.
async fn refused(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    refusal: &sqlx::Error,
) -> Result<Settled, AuthorizationError> {
    let target = (order, OrderStatus::RequiresAction, order.payment_intent_id.as_deref());
    match refusal::end_refused(pool, payments, target, refusal, refusal::Path::Settle).await {
        Ended::Failed(words) => Ok(Settled::Refused(words)),
        Ended::MovedElsewhere => Ok(Settled::MovedElsewhere),
        Ended::Stuck(reason) => Err(AuthorizationError::OrderRefused(reason)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orderfleet_words::Money;

    fn order() -> Order {
        let now = chrono::Utc::now();
        Order {
            id: OrderId::new(),
            user_id: orderfleet_words::UserId::parse("ann").unwrap(),
            request_hash: Vec::new(),
            product_id: orderfleet_words::Sku::parse("sku-1").unwrap(),
            quantity: orderfleet_words::Quantity::parse(1).unwrap(),
            amount: Money { minor: 1000, currency: orderfleet_words::Currency::parse("USD").unwrap() },
            payment_method: "pm_card_threeDSecure2Required".into(),
            status: OrderStatus::RequiresAction,
            position: Some(1),
            payment_intent_id: Some("pi_1".into()),
            failure_reason: None,
            authorization_released_at: None,
            traceparent: None,
            payment_attempt: 1,
            payment_attempt_failed: false,
            payment_attempt_at: now,
            client_secret: Some("pi_1_secret_x".into()),
            next_action: Some(serde_json::json!({"type": "use_stripe_sdk"})),
            action_expires_at: Some(now),
            intake_lease_until: None,
            created_at: now,
            updated_at: now,
            queued_for: None,
            card_cap: None,
            card_fingerprint: None,
        }
    }

    fn intent(order: &Order, status: IntentStatus) -> Intent {
        Intent {
            id: "pi_1".into(),
            status,
            amount: order.amount.minor,
            currency: order.amount.currency.as_str().to_lowercase(),
            manual_capture: true,
            order_id: Some(order.id.to_string()),
            action: None,
            last_error: None,
            charge: None,
            capture_before: None,
            created: None,
            payment_method: Some(order.payment_method.clone()),
        }
    }

    #[tokio::test]
    async fn a_webhook_s_settle_holds_its_lease_through_eight_stripe_calls_at_their_longest() {
        // Arrange: the intake's Stripe client, which settles 3-D Secure for a webhook.
        let env = orderfleet_runtime::config::Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_action")]);
        let config = orderfleet_payments::StripeConfig::from_env(&env).unwrap();
        let retry = orderfleet_payments::RetryPolicy::default();
        let payments = Payments::new(&config, retry, orderfleet_runtime::db::unreachable_pool()).unwrap();

        // Act
        let lease = crate::domain::records::order::lease_for(settle_deadline(&payments));

        // Assert: a read, a card's read, a cancel, a read, a cancel and a read, the refusal
        // rule's cancel and read, 27.6 s each at their longest, and the margin.
        assert_eq!(settle_deadline(&payments), payments.longest_call() * 8);
        assert_eq!(lease, Duration::from_millis(8 * 27_600 + 5_000));
    }

    #[test]
    fn an_authenticated_intent_of_the_order_authorizes_it_and_one_that_is_not_the_order_s_is_released() {
        let order = order();
        let held = intent(&order, IntentStatus::RequiresCapture);
        assert_eq!(decide(&order, &held, false), Decision::Authorize);
        assert_eq!(decide(&order, &held, true), Decision::Authorize, "finished in time, seen late");
        let cheaper = Intent { amount: 1, ..held.clone() };
        assert_eq!(decide(&order, &cheaper, false), Decision::Release(FailureReason::AuthenticationFailed));
        let automatic = Intent { manual_capture: false, ..held.clone() };
        assert_eq!(decide(&order, &automatic, false), Decision::Release(FailureReason::AuthenticationFailed));
        let another = Intent { order_id: Some(OrderId::new().to_string()), ..held };
        assert_eq!(decide(&order, &another, false), Decision::Release(FailureReason::AuthenticationFailed));
    }

    #[test]
    fn the_deadline_releases_a_waiting_intent_and_decides_a_cancelled_one() {
        let order = order();
        let waiting = intent(&order, IntentStatus::RequiresAction);
        assert_eq!(decide(&order, &waiting, false), Decision::Wait);
        assert_eq!(decide(&order, &waiting, true), Decision::Release(FailureReason::AuthenticationTimedOut));
        let canceled = intent(&order, IntentStatus::Canceled);
        assert_eq!(decide(&order, &canceled, true), Decision::Decline(FailureReason::AuthenticationTimedOut));
        assert_eq!(decide(&order, &canceled, false), Decision::Decline(FailureReason::PaymentCanceled));
        let failed = intent(&order, IntentStatus::RequiresPaymentMethod);
        assert_eq!(decide(&order, &failed, false), Decision::Release(FailureReason::AuthenticationFailed));
        let failed_then_canceled = Intent {
            last_error: Some(FAILED_AUTHENTICATION.into()),
            ..intent(&order, IntentStatus::Canceled)
        };
        assert_eq!(
            decide(&order, &failed_then_canceled, true),
            Decision::Decline(FailureReason::AuthenticationFailed)
        );
    }
}
