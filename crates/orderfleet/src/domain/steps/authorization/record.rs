//! Recording what Stripe said of an order's authorization, in ONE statement each: the hold
//! (`authorized`, with its outbox rows), a card that needs 3-D Secure (`requires_action`), a
//! decline (`payment_declined`, its units back), a commit the database refuses for good (the
//! rule of [`crate::domain::steps::refusal`]: its hold released, `order_refused`), or an answer that
//! leaves the order pending (its lease given back, for a resume to finish).

use crate::domain::records::order::{Order, Transition};
use crate::domain::steps::refusal::{self, Ended};
use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_payments::{Intent, IntentStatus, PaymentError, Payments};
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;

use super::lease::{release, release_after_a_5xx};
use crate::domain::steps::leased::AuthorizationError;

/// What authorizing did to the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// This call moved it to `authorized`.
    Authorized,
    /// This call moved it to `payment_declined`; the issuer's detail (for operators only).
    Declined(String),
    /// This call moved it to `requires_action`: the buyer completes 3-D Secure.
    RequiresAction,
    /// This call ended it `payment_declined` with `authorization_incomplete`: the fleet's own
    /// attempt never confirmed its intent, which is cancelled. The fleet's fault, not the
    /// buyer's card; what was found (for operators only).
    Incomplete(String),
    /// This call ended it `payment_declined` with `card_limit_reached`, before any
    /// PaymentIntent: its card would hold more of the product than its cap ([`super::card`]).
    OverCardCap,
    /// The database refused its move for good: this call released its hold and ended it
    /// `payment_declined` with `order_refused` ([`crate::domain::steps::refusal`]); the database's words.
    Refused(String),
    /// Someone else (a racing retry, the sweeper) had already moved it; read it again.
    MovedElsewhere,
}

/// Records what Stripe says of the order's authorization (from the call, or from a lookup).
pub async fn record(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    result: Result<Intent, PaymentError>,
) -> Result<Recorded, AuthorizationError> {
    let (intent_id, reason) = match result {
        // Holding funds (or, never with manual capture, already captured): accepted.
        Ok(intent) if matches!(intent.status, IntentStatus::RequiresCapture | IntentStatus::Succeeded) => {
            let moved = commit_authorized(pool, payments, order, &intent).await;
            return committed(pool, payments, order, &intent, moved, Recorded::Authorized).await;
        }
        // The card needs 3-D Secure: the buyer completes it, and the order keeps its units
        // meanwhile. Not a decline.
        Ok(intent) if intent.status == IntentStatus::RequiresAction && intent.action.is_some() => {
            let moved = commit_requires_action(pool, payments, order, &intent).await;
            return committed(pool, payments, order, &intent, moved, Recorded::RequiresAction).await;
        }
        // Found by a lookup: the card was declined (Stripe names the decline), or the intent
        // cancelled; no hold. Nobody can confirm it again: its client secret was never handed
        // out, which happens only when the order moves to `requires_action`.
        Ok(intent) if intent.status == IntentStatus::RequiresPaymentMethod && intent.last_error.is_some() => {
            (Some(intent.id), "card_declined: the authorization did not succeed".to_owned())
        }
        Ok(intent) if intent.status == IntentStatus::Canceled => {
            (Some(intent.id), FailureReason::AuthorizationCanceled.as_str().to_owned())
        }
        // Found by a lookup in a state that is not final: made, its confirm not ended
        // (`requires_payment_method` with no error, `requires_confirmation`, `processing`).
        // It may hold funds a moment later, so the order is never declined on it: it stays
        // pending, its lease given back, and a retry or the sweeper looks again.
        Ok(intent) => return left_pending(pool, payments, order, &intent).await,
        Err(PaymentError::Declined { code, message, payment_intent_id }) => {
            (payment_intent_id, format!("{code}: {message}"))
        }
        // The provider refuses the request itself (an unknown payment method, say): no hold
        // exists, and retrying cannot help.
        Err(PaymentError::Refused { code, message, .. }) => (None, format!("{code}: {message}")),
        // Unanswered: the order stays pending, its lease released; a retry or the sweeper
        // looks it up and goes on (see `resume`).
        Err(PaymentError::Unavailable(reason) | PaymentError::Locked(reason)) => {
            release(pool, order).await?;
            return Err(AuthorizationError::ProviderUnavailable(reason));
        }
        // A 5xx Stripe saved under the attempt's key: the same, and the attempt is marked, so
        // that nothing more is sent under its key (see `resume`).
        Err(PaymentError::AttemptFailed(reason)) => {
            release_after_a_5xx(pool, order).await?;
            return Err(AuthorizationError::ProviderUnavailable(reason));
        }
    };
    let moved = decline(pool, order.id, &reason, intent_id.as_deref()).await?;
    Ok(if moved { Recorded::Declined(reason) } else { Recorded::MovedElsewhere })
}

/// What a commit of the order's `intent` came to: `recorded` if it moved the order, a stray's
/// release if it found the order moved on ([`moved_or_stray`]), the order's failure if the
/// database refused it for good ([`refused_by_database`]).
async fn committed(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
    moved: sqlx::Result<bool>,
    recorded: Recorded,
) -> Result<Recorded, AuthorizationError> {
    match moved {
        Err(e) if orderfleet_runtime::db::refused_for_good(&e) => {
            refused_by_database(pool, payments, order, intent, &e).await
        }
        moved => moved_or_stray(pool, payments, order, intent, moved?, recorded).await,
    }
}

/// The database refused the commit of the order's authorization for good (an integrity or
/// check violation, a trigger's exception): a failure of this order, not of the fleet. The one
/// rule for it ([`crate::domain::steps::refusal`]): its hold cancelled (or its release owed), then the
/// order ends `payment_declined` with [`FailureReason::OrderRefused`] and the database's words;
/// where the database refuses that too, it stays pending for a person
/// ([`AuthorizationError::OrderRefused`]: the sweeper lists it as stuck, with the reason), its
/// hold released all the same. Other buyers go on.
async fn refused_by_database(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
    refusal: &sqlx::Error,
) -> Result<Recorded, AuthorizationError> {
    let target = (order, OrderStatus::PendingAuthorization, Some(intent.id.as_str()));
    match refusal::end_refused(pool, payments, target, refusal, refusal::Path::Authorization).await {
        Ended::Failed(words) => Ok(Recorded::Refused(words)),
        Ended::MovedElsewhere => Ok(Recorded::MovedElsewhere),
        Ended::Stuck(reason) => Err(AuthorizationError::OrderRefused(reason)),
    }
}

/// An order whose intent a lookup found in a state that is not final stays pending, its lease
/// given back: a retry or the sweeper looks again.
async fn left_pending(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
) -> Result<Recorded, AuthorizationError> {
    if unsettled_too_long(intent.created, chrono::Utc::now()) {
        return never_confirmed(pool, payments, order, intent).await;
    }
    metrics::counter!(crate::metrics::AUTHORIZATION_INTENTS_UNSETTLED.name).increment(1);
    tracing::info!(payment_intent = intent.id, status = ?intent.status, "the order's PaymentIntent is not settled at Stripe yet; the order stays pending");
    release(pool, order).await?;
    Err(AuthorizationError::ProviderUnavailable(format!(
        "the order's PaymentIntent {} is {:?} at Stripe, its confirm not ended; looked at again later",
        intent.id, intent.status
    )))
}

/// How long an intent may stay made but not confirmed before the fleet stops waiting for its
/// confirm: a create-and-confirm takes seconds; one still unconfirmed this long after Stripe
/// made it never ran its confirm (a 500 after the intent was made, before the confirm), and
/// nothing will move it.
pub const UNSETTLED_FOR: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// Whether an intent made at `created` (Stripe's clock) has waited for its confirm too long.
pub fn unsettled_too_long(
    created: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    created.is_some_and(|created| now - created > UNSETTLED_FOR)
}

/// An intent that never confirmed ([`UNSETTLED_FOR`]): released, and the order declined on it
/// only once Stripe shows it `canceled` (no hold can follow); otherwise the order stays pending
/// for the next look.
async fn never_confirmed(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
) -> Result<Recorded, AuthorizationError> {
    if let Err(why) = payments.cancel(order.intent(&intent.id)).await {
        release(pool, order).await?;
        return Err(AuthorizationError::ProviderUnavailable(format!(
            "the order's PaymentIntent {} never confirmed, and its cancel did not take effect: {why}",
            intent.id
        )));
    }
    // Not the buyer's card: the fleet's own attempt never ran its confirm (a 5xx on the way),
    // so the order ends with a reason of its own, which the card gate does not count.
    let reason =
        format!("{}: {} never confirmed; cancelled", FailureReason::AuthorizationIncomplete, intent.id);
    let incomplete = FailureReason::AuthorizationIncomplete;
    let moved = fail(pool, order.id, incomplete, &reason, Some(&intent.id)).await?;
    Ok(if moved { Recorded::Incomplete(reason) } else { Recorded::MovedElsewhere })
}

/// `recorded` if this call's commit moved the order. If it found the order moved already (a
/// racing holder, the sweeper), the intent this call made may not be the order's: a second
/// holder's, made under another attempt's key while the first still held the lease. Such a
/// stray holds funds (or can, once its buyer authenticates) that nothing will capture, so it is
/// cancelled now, under a key of its own (`Payments::cancel_stray`). If the cancel cannot be
/// made now, the reconciliation of strays (`crate::domain::recovery::strays`) finds it later.
async fn moved_or_stray(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
    moved: bool,
    recorded: Recorded,
) -> Result<Recorded, AuthorizationError> {
    if moved {
        return Ok(recorded);
    }
    let now = crate::domain::records::order::load(pool, order.id).await?;
    if now.is_some_and(|now| now.payment_intent_id.as_deref() != Some(intent.id.as_str())) {
        // The order had moved on to another intent (or none): this one is a stray.
        if let Err(
            e @ (PaymentError::Unavailable(_) | PaymentError::AttemptFailed(_) | PaymentError::Locked(_)),
        ) = crate::domain::steps::releases::release(payments, order.id, &intent.id, "at_commit").await
        {
            tracing::warn!(payment_intent = intent.id, error = %e, "a stray intent could not be released now; the reconciliation will");
        }
    }
    Ok(Recorded::MovedElsewhere)
}

/// ONE statement: `pending_authorization` → `payment_declined` (compare-and-set), and the
/// units the door promised the order go back to the product for the next buyer. The order row
/// is locked before the product row, as everywhere. The buyer (and `GET /v1/orders/{id}`) is
/// told [`FailureReason::PaymentDeclined`] of any decline, no more, so the intake tells a card
/// tester nothing about the card; `detail` (the issuer's reason) is kept for operators only. `fleetctl order resolve --none` declines through it too.
pub(crate) async fn decline(
    pool: &Pool,
    id: OrderId,
    detail: &str,
    payment_intent_id: Option<&str>,
) -> sqlx::Result<bool> {
    fail(pool, id, FailureReason::PaymentDeclined, detail, payment_intent_id).await
}

/// [`decline`] with `failure_reason` as given: [`FailureReason::PaymentDeclined`],
/// [`FailureReason::AuthorizationIncomplete`] for an intent that never confirmed, released, or
/// [`FailureReason::CardLimitReached`] for an order over its card's cap ([`super::card`]).
pub(super) async fn fail(
    pool: &Pool,
    id: OrderId,
    failure_reason: FailureReason,
    detail: &str,
    payment_intent_id: Option<&str>,
) -> sqlx::Result<bool> {
    // The order's id and trace are on the caller's span (the request's, or the sweeper's).
    tracing::info!(detail, "authorization declined");
    let moved = sqlx::query_scalar!(
        r#"WITH moved AS (
             UPDATE orders SET status = 'payment_declined', failure_reason = $4, decline_detail = $2,
                               payment_intent_id = COALESCE($3, payment_intent_id),
                               intake_lease_until = NULL, updated_at = now()
              WHERE id = $1 AND status = 'pending_authorization'
          RETURNING id, user_id, product_id, quantity, amount_minor, currency, traceparent, queued_for
         ), given_back AS (
             UPDATE products p SET units_promised = p.units_promised - moved.quantity
               FROM moved WHERE p.id = moved.product_id
         ), told AS (
             -- A queued order's buyer had only `202 queued`: `order.rejected` tells them.
             INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
             SELECT gen_random_uuid(), 'order', moved.id, 'order.rejected', 'notification',
                    jsonb_build_object('order_id', moved.id, 'user_id', moved.user_id,
                                       'product_id', moved.product_id, 'quantity', moved.quantity,
                                       'amount', moved.amount_minor, 'currency', moved.currency,
                                       'status', 'payment_declined', 'reason', $4::text),
                    moved.traceparent
               FROM moved WHERE moved.queued_for IS NOT NULL
             ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING
         )
         SELECT count(*) AS "moved!" FROM moved"#,
        id as _,
        detail,
        payment_intent_id,
        failure_reason.as_str(),
    )
    .fetch_one(pool)
    .await?;
    Ok(moved == 1)
}

/// ONE statement: `pending_authorization` → `authorized` (compare-and-set) with the hold (its
/// PaymentIntent and Stripe's deadline for it) and the outbox rows it causes. If the
/// compare-and-set finds the order moved on, nothing is written, and a hold this process made
/// is no longer taken as recorded (`Payments::held_here`): it may be a stray, whose webhook
/// event must reach the release of strays.
async fn commit_authorized(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    hold: &Intent,
) -> sqlx::Result<bool> {
    let moved =
        Transition::authorized(order, OrderStatus::PendingAuthorization, hold.hold()).apply(pool).await;
    if !matches!(moved, Ok(true)) {
        payments.not_held_here(&hold.id);
    }
    moved
}

/// ONE statement: `pending_authorization` → `requires_action` (compare-and-set), with the
/// PaymentIntent, what the buyer's page needs, and the deadline
/// (`PAYMENT_ACTION_TIMEOUT_SECONDS` from now). No message: nothing is accepted yet.
async fn commit_requires_action(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &Intent,
) -> sqlx::Result<bool> {
    let Some(action) = intent.action.as_ref() else { return Ok(false) };
    let timeout = chrono::TimeDelta::from_std(payments.action_timeout()).unwrap_or(chrono::TimeDelta::MAX);
    let until = chrono::Utc::now() + timeout;
    tracing::info!(payment_intent = intent.id, %until, "the card needs 3-D Secure; the buyer completes it");
    Transition::asks_for_action(order, intent.hold(), action.for_buyer(until)).apply(pool).await
}
