//! Stripe's webhooks (SPEC §1.7, §4): what Stripe tells the fleet later about a payment — a
//! 3-D Secure outcome, a hold that expired or was cancelled in the Dashboard, a refund, a
//! dispute. The intake checks the signature (`order_intake::webhook`); this module applies a
//! signed event, once in effect, however often and in whatever order Stripe delivers it
//! (at least once, retrying for up to three days).
//!
//! - **Once**: an event's id is recorded in `webhook_events` in the transaction that applies
//!   its effect ([`crate::domain::records::order::Transition::commit`]); a redelivery finds it and
//!   changes nothing. An event that changed nothing is not recorded: applied again, from the
//!   state read again, it changes nothing again.
//! - **Fresh, never the event's copy**: an event only says *look*. What the order becomes is
//!   decided from the order's own PaymentIntent, read from Stripe now, so events arriving out
//!   of order, late or twice decide nothing wrong.
//! - **Cheap**: Stripe is read only when the event could change the order's status (a
//!   `payment_intent.amount_capturable_updated` for an order already `authorized` costs
//!   nothing: every order draws several events). One about a hold this process's own
//!   authorization made, and its commit recorded, costs no statement either
//!   (`Payments::held_here`): that commit takes the order to `authorized` (or on to
//!   `stock_reserved`), and the event has nothing left to do.
//! - **Only through the order's intent**: an event about an intent the order did not record
//!   (a stray, left by an answer lost on the way) never moves the order; if that intent holds
//!   funds it is cancelled. An order still `pending_authorization` is left to whoever holds its
//!   lease (the intake or the sweeper).
//!
//! | event | order | effect |
//! |---|---|---|
//! | `payment_intent.amount_capturable_updated`, `.payment_failed`, `.canceled` | `requires_action` | settled ([`crate::domain::steps::three_d_secure`]) |
//! | `payment_intent.canceled` | `authorized`, `stock_reserved` | `authorization_canceled` if the intent is cancelled: units (and stock, if taken) back, `order.rejected` |
//! | `charge.refunded` | `paid` | `refunded` when refunded in full (`order.refunded`), else the amount recorded; a charge never captured is a released hold, not a refund |
//! | `charge.refunded`, `charge.dispute.created` | `authorized`, `stock_reserved`, its charge captured | `503`: the capture's `paid` is not committed yet; Stripe delivers it again |
//! | `charge.dispute.created` | any other | recorded on the order, counted (`stripe_disputes_total`); no status changes |
//! | `payment_intent.amount_capturable_updated` | failed (`payment_declined`, …) | a safety net: if the order's own intent is live (it holds funds after the order was failed), it is cancelled, counted in `failed_order_holds_released_total{found="webhook"}` |
//! | anything else | | nothing, no Stripe request |

use orderfleet_runtime::db::Pool;
use serde::Deserialize;

use crate::domain::records::order::{self, Order, StripeEvent, Transition, query_order};
use crate::domain::steps::leased::AuthorizationError;
use crate::domain::steps::releases;
use crate::domain::steps::three_d_secure::{self, Settled};
use crate::domain::words::status::StatusSet;
use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_payments::{Intent, IntentStatus, PaymentError, Payments};
use orderfleet_words::OrderId;

/// The event types the fleet applies (SPEC §4); any other is answered `200` and ignored.
pub const HANDLED: [&str; 5] = [AMOUNT_CAPTURABLE_UPDATED, PAYMENT_FAILED, CANCELED, REFUNDED, DISPUTED];
const AMOUNT_CAPTURABLE_UPDATED: &str = "payment_intent.amount_capturable_updated";
const PAYMENT_FAILED: &str = "payment_intent.payment_failed";
const CANCELED: &str = "payment_intent.canceled";
const REFUNDED: &str = "charge.refunded";
const DISPUTED: &str = "charge.dispute.created";

/// A Stripe event, as far as the fleet reads it: its id, its type, and which object it is
/// about. Every other field (the object's state included) is Stripe's copy at the time, and is
/// not trusted. Only `id` and `type` are required: a validly signed event of any type, whatever
/// its object, must be answered `200`, not refused as unreadable.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    /// `evt_…`.
    pub id: String,
    /// `payment_intent.canceled`, ….
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    data: serde_json::Value,
}

impl Event {
    /// Reads a signed event's body. Any event type parses; only [`HANDLED`] ones are applied.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(body).map_err(|e| format!("not a Stripe event: {e}"))
    }

    fn reference(&self) -> StripeEvent<'_> {
        StripeEvent { id: &self.id, kind: &self.kind }
    }

    /// A field of the event's object (a PaymentIntent, a Charge or a Dispute).
    fn field(&self, name: &str) -> Option<&serde_json::Value> {
        self.data.get("object")?.get(name)
    }

    /// The object's own id (`pi_…`, `ch_…`, `dp_…`).
    fn object_id(&self) -> Option<&str> {
        self.field("id")?.as_str()
    }

    /// The PaymentIntent it is about.
    fn intent_id(&self) -> Option<&str> {
        match self.field("object")?.as_str()? {
            "payment_intent" => self.object_id(),
            // A charge's or a dispute's PaymentIntent: its id, or the object expanded.
            _ => match self.field("payment_intent")? {
                serde_json::Value::String(id) => Some(id),
                expanded => expanded.get("id")?.as_str(),
            },
        }
    }

    /// The order its intent's metadata names, if it is a PaymentIntent's event.
    fn order_id(&self) -> Option<OrderId> {
        self.field("metadata")?.get("order_id")?.as_str()?.parse().ok()
    }
}

/// What applying an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Its effect, now committed with its id (a word for operators and metrics).
    Applied(&'static str),
    /// Its id was applied before: nothing again.
    AlreadyApplied,
    /// A type the fleet does not use.
    Ignored,
}

impl Applied {
    /// What the event did, in a word: its effect, `already_applied` or `ignored` (the answer's
    /// `effect`, and the label of `webhook_events_total`).
    pub fn effect(&self) -> &'static str {
        match self {
            Applied::Applied(effect) => effect,
            Applied::AlreadyApplied => "already_applied",
            Applied::Ignored => "ignored",
        }
    }
}

/// Why an event could not be applied now; Stripe is answered `503` and delivers it again.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Stripe unreachable or the budget spent, or the order being settled by someone else.
    #[error("cannot apply the event now: {0}")]
    Unavailable(String),
    /// The database failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// Applies a signed event (see the module's table).
pub async fn apply(pool: &Pool, payments: &Payments, event: &Event) -> Result<Applied, WebhookError> {
    if !HANDLED.contains(&event.kind.as_str()) {
        return Ok(Applied::Ignored);
    }
    // The hold of an authorization this process made itself: its commit takes (or took) the
    // order to `authorized`, with nothing for this event to do. No statement.
    if event.kind == AMOUNT_CAPTURABLE_UPDATED && event.intent_id().is_some_and(|i| payments.held_here(i)) {
        return Ok(Applied::Applied(NO_CHANGE));
    }
    // The common case, an event about an order that has not been applied, costs one statement.
    let effect = match find_order_unless_applied(pool, event).await? {
        None if already_applied(pool, &event.id).await? => return Ok(Applied::AlreadyApplied),
        None => record(pool, event, None, "no_order").await?,
        Some(order) => match (order.payment_intent_id.as_deref(), event.intent_id()) {
            (Some(recorded), Some(intent)) if recorded == intent => {
                on_the_orders_intent(pool, payments, event, &order).await?
            }
            // Its authorization is being recorded by whoever holds its lease.
            _ if order.status == OrderStatus::PendingAuthorization => {
                record(pool, event, Some(order.id), PENDING).await?
            }
            (_, Some(stray)) => release_stray(pool, payments, event, &order, stray).await?,
            (_, None) => record(pool, event, Some(order.id), "no_intent").await?,
        },
    };
    Ok(Applied::Applied(effect))
}

/// What an event about the order's own intent does, by the order's status.
async fn on_the_orders_intent(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
) -> Result<&'static str, WebhookError> {
    let kind = event.kind.as_str();
    match order.status {
        OrderStatus::RequiresAction
            if [AMOUNT_CAPTURABLE_UPDATED, PAYMENT_FAILED, CANCELED].contains(&kind) =>
        {
            settle_action(pool, payments, event, order).await
        }
        OrderStatus::Authorized | OrderStatus::StockReserved if kind == CANCELED => {
            hold_canceled(pool, payments, event, order).await
        }
        OrderStatus::Paid if kind == REFUNDED => refunded(pool, payments, event, order).await,
        // Captured at Stripe, `paid` not yet committed (the stock worker is at it, or will be
        // after its message comes back): answered 503, so Stripe delivers it again once it is.
        OrderStatus::Authorized | OrderStatus::StockReserved if [REFUNDED, DISPUTED].contains(&kind) => {
            match fresh(payments, order).await?.charge {
                Some(charge) if charge.captured => {
                    Err(WebhookError::Unavailable("the order's capture is not recorded yet".into()))
                }
                _ => record(pool, event, Some(order.id), NO_CHANGE).await,
            }
        }
        // A dispute changes no status: recorded on whatever order it is about.
        _ if kind == DISPUTED => disputed(pool, payments, event, order).await,
        status if status.set() == StatusSet::Failed && kind == AMOUNT_CAPTURABLE_UPDATED => {
            release_failed_order_hold(pool, payments, event, order).await
        }
        // Nothing this event says can move the order from where it is: no Stripe request.
        _ => record(pool, event, Some(order.id), NO_CHANGE).await,
    }
}

/// Settles the order under its lease, within the lease's deadline ([`three_d_secure::take_and_settle`]).
async fn settle_action(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
) -> Result<&'static str, WebhookError> {
    match three_d_secure::take_and_settle(pool, payments, order.id, Some(event.reference())).await {
        Ok(None) => Err(WebhookError::Unavailable("the order is being settled by the sweeper".into())),
        Ok(Some(Settled::Authorized)) => Ok("authorized"),
        Ok(Some(Settled::Declined(reason))) => Ok(reason.as_str()),
        Ok(Some(Settled::Refused(_))) => Ok(FailureReason::OrderRefused.as_str()),
        Ok(Some(Settled::Waiting | Settled::MovedElsewhere)) => {
            record(pool, event, Some(order.id), NO_CHANGE).await
        }
        Err(AuthorizationError::ProviderUnavailable(reason)) => Err(WebhookError::Unavailable(reason)),
        // Delivered again, the event would meet the same refusal (Stripe's, or the
        // database's): the order is for a person (its hold released, or owed), and the event
        // is recorded as seen.
        Err(AuthorizationError::LookupRefused(reason) | AuthorizationError::OrderRefused(reason)) => {
            tracing::error!(
                reason,
                event = event.id,
                "a webhook's order cannot be settled; it needs a person"
            );
            record(pool, event, Some(order.id), "unresolved").await
        }
        Err(AuthorizationError::Database(e)) => Err(e.into()),
    }
}

/// `payment_intent.canceled` for an `authorized` or `stock_reserved` order: if the intent is
/// cancelled indeed (the hold expired, or was cancelled in the Dashboard), the order fails, its
/// units go back (and its stock, if it had taken it).
async fn hold_canceled(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
) -> Result<&'static str, WebhookError> {
    let now = fresh(payments, order).await?;
    if now.status != IntentStatus::Canceled {
        return record(pool, event, Some(order.id), NO_CHANGE).await;
    }
    let moved = lose_hold(pool, order, Some(event.reference())).await?;
    match moved {
        true => Ok(FailureReason::AuthorizationCanceled.as_str()),
        false => record(pool, event, Some(order.id), NO_CHANGE).await,
    }
}

/// ONE transaction: an `authorized` or `stock_reserved` order whose hold is gone ends
/// `authorization_canceled`, its units back to the line (and to the stock, if it had taken
/// them), `order.rejected`, with the event that said so. A compare-and-set on the status the
/// order was read in, and once more on `stock_reserved` if a stock worker reserved it
/// meanwhile; moved further (being captured, or ended), it is left to that worker, whose
/// capture meets the hold gone.
async fn lose_hold(pool: &Pool, order: &Order, event: Option<StripeEvent<'_>>) -> sqlx::Result<bool> {
    let moved = lose_hold_from(pool, order, order.status, event).await?;
    if moved || order.status != OrderStatus::Authorized {
        return Ok(moved);
    }
    lose_hold_from(pool, order, OrderStatus::StockReserved, event).await
}

async fn lose_hold_from(
    pool: &Pool,
    order: &Order,
    from: OrderStatus,
    event: Option<StripeEvent<'_>>,
) -> sqlx::Result<bool> {
    let gone = "the hold expired or was cancelled outside the fleet before capture";
    let Some(moved) = Transition::hold_lost(order, from, gone) else { return Ok(false) };
    let moved = moved.with_event(event).commit(pool).await?;
    if moved {
        tracing::warn!(status = %order.status, "the order's hold is gone; its units go back to the line");
    }
    Ok(moved)
}

/// `charge.refunded` for a paid order: refunded in full, it becomes `refunded` with
/// `order.refunded`; in part, the amount is recorded. A charge never captured was a hold
/// released, not a refund.
async fn refunded(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
) -> Result<&'static str, WebhookError> {
    let now = fresh(payments, order).await?;
    let refunded = match now.charge {
        Some(charge) if charge.captured && charge.amount_refunded > 0 => charge.amount_refunded,
        _ => return record(pool, event, Some(order.id), NO_CHANGE).await,
    };
    let mut tx = pool.begin().await?;
    let effect = if refunded >= order.amount.minor {
        let moved = Transition::refunded(order).apply(&mut *tx).await?;
        if moved { "refunded" } else { NO_CHANGE }
    } else {
        "partially_refunded"
    };
    sqlx::query!(
        "UPDATE orders SET amount_refunded = greatest(amount_refunded, $2) WHERE id = $1",
        order.id as _,
        refunded,
    )
    .execute(&mut *tx)
    .await?;
    order::record_event(&mut *tx, event.reference(), Some(order.id), effect).await?;
    tx.commit().await?;
    tracing::info!(refunded, effect, "Stripe refunded the order's payment");
    Ok(effect)
}

/// `charge.dispute.created`: recorded on the order (once), counted for operators; no status
/// change (SPEC §5).
async fn disputed(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
) -> Result<&'static str, WebhookError> {
    let now = fresh(payments, order).await?;
    if !now.charge.is_some_and(|charge| charge.disputed) {
        return record(pool, event, Some(order.id), NO_CHANGE).await;
    }
    let mut tx = pool.begin().await?;
    let marked = sqlx::query!(
        "UPDATE orders SET disputed_at = now(), dispute_id = $2 WHERE id = $1 AND disputed_at IS NULL",
        order.id as _,
        event.object_id().unwrap_or_default(),
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    order::record_event(&mut *tx, event.reference(), Some(order.id), "disputed").await?;
    tx.commit().await?;
    if marked == 1 {
        metrics::counter!(crate::metrics::STRIPE_DISPUTES.name).increment(1);
        tracing::error!(dispute = event.object_id(), "the cardholder disputed the order's payment");
    }
    Ok("disputed")
}

/// An event about an intent that is not the order's: never moves the order; the intent is
/// cancelled if it holds funds (under a key of its own, not the order's).
async fn release_stray(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
    stray: &str,
) -> Result<&'static str, WebhookError> {
    let now = payments.retrieve(stray).await.map_err(unavailable)?;
    if now.status != IntentStatus::RequiresCapture || !now.is_for(order.id, &order.amount) {
        return record(pool, event, Some(order.id), "stray").await;
    }
    payments.cancel_stray(order.id, stray).await.map_err(unavailable)?;
    tracing::warn!(
        payment_intent = stray,
        "a second PaymentIntent held funds for the order; it was cancelled"
    );
    record(pool, event, Some(order.id), "stray_released").await
}

/// A safety net: the own intent of an order that has failed holds funds (it became live after
/// the order was failed, which nothing should let happen). Nothing will capture it, so it is
/// cancelled; Stripe not answering is a `503`, and Stripe delivers the event again.
async fn release_failed_order_hold(
    pool: &Pool,
    payments: &Payments,
    event: &Event,
    order: &Order,
) -> Result<&'static str, WebhookError> {
    let now = fresh(payments, order).await?;
    if !now.status.is_live() {
        return record(pool, event, Some(order.id), NO_CHANGE).await;
    }
    match releases::release(payments, order.id, &now.id, "failed_order_webhook").await {
        Ok(()) => {
            metrics::counter!(crate::metrics::FAILED_ORDER_HOLDS_RELEASED.name, "found" => "webhook")
                .increment(1);
            tracing::error!(payment_intent = now.id, status = %order.status, "the own PaymentIntent of a failed order held funds; it was cancelled");
            record(pool, event, Some(order.id), "failed_order_hold_released").await
        }
        Err(e) if e.is_transient() => Err(unavailable(e)),
        // Refused for good: logged for a person by `release`.
        Err(_) => record(pool, event, Some(order.id), "unresolved").await,
    }
}

/// The order's intent, read now.
async fn fresh(payments: &Payments, order: &Order) -> Result<Intent, WebhookError> {
    let id = order.payment_intent_id.as_deref().unwrap_or_default();
    payments.retrieve(id).await.map_err(unavailable)
}

fn unavailable(error: PaymentError) -> WebhookError {
    WebhookError::Unavailable(error.to_string())
}

/// Records an event that did not move an order, with what it did. One that changed nothing
/// ([`NO_CHANGE`], most of them: every order draws several events) is not written: applying
/// it again, from the state read again, changes nothing again, and the write would be an
/// order's most frequent one.
async fn record(
    pool: &Pool,
    event: &Event,
    order_id: Option<OrderId>,
    effect: &'static str,
) -> Result<&'static str, WebhookError> {
    if ![NO_CHANGE, PENDING].contains(&effect) {
        order::record_event(pool, event.reference(), order_id, effect).await?;
    }
    Ok(effect)
}

/// The effect of an event that found nothing to change. Not recorded: a redelivery finds
/// nothing to change either, and a record would be a statement more for most events.
const NO_CHANGE: &str = "no_change";

/// The effect of an event about an order still pending authorization, which the request or
/// sweeper holding it will record (in a bench, two `amount_capturable_updated` in three come
/// before the intake's own commit). Not recorded, as [`NO_CHANGE`] is not.
const PENDING: &str = "pending";

async fn already_applied(pool: &Pool, id: &str) -> sqlx::Result<bool> {
    let seen =
        sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM webhook_events WHERE id = $1) AS "seen!""#, id)
            .fetch_one(pool)
            .await?;
    Ok(seen)
}

/// The order the event is about — the one its intent's metadata names, or the one that recorded
/// its intent (a charge's events name only the intent) — unless the event has been applied:
/// ONE statement. `None`: no such order, or the event applied.
async fn find_order_unless_applied(pool: &Pool, event: &Event) -> sqlx::Result<Option<Order>> {
    let row = match (event.order_id(), event.intent_id()) {
        (Some(id), _) => {
            query_order!(
                "SELECT",
                "FROM orders WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM webhook_events WHERE id = $2)",
                id as _,
                &event.id,
            )
            .fetch_optional(pool)
            .await?
        }
        (None, Some(intent)) => {
            query_order!(
                "SELECT",
                "FROM orders WHERE payment_intent_id = $1
                   AND NOT EXISTS (SELECT 1 FROM webhook_events WHERE id = $2)",
                intent,
                &event.id,
            )
            .fetch_optional(pool)
            .await?
        }
        (None, None) => None,
    };
    Ok(row.map(Order::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_intent_and_order_whatever_its_object() {
        let order = OrderId::new();
        let intent = format!(
            r#"{{"id":"evt_1","type":"payment_intent.canceled","data":{{"object":{{"id":"pi_1","object":"payment_intent","metadata":{{"order_id":"{order}"}}}}}}}}"#
        );
        let event = Event::parse(intent.as_bytes()).unwrap();
        assert_eq!((event.intent_id(), event.order_id()), (Some("pi_1"), Some(order)));
        let charge = r#"{"id":"evt_2","type":"charge.refunded","data":{"object":{"id":"ch_1","object":"charge","payment_intent":"pi_2","metadata":{}}}}"#;
        let event = Event::parse(charge.as_bytes()).unwrap();
        assert_eq!((event.intent_id(), event.order_id()), (Some("pi_2"), None));
        let unknown = r#"{"id":"evt_3","type":"balance.available","data":{"object":{"object":"balance"}}}"#;
        assert!(Event::parse(unknown.as_bytes()).is_ok(), "a type the fleet does not use still parses");
        let bare = r#"{"id":"evt_4","type":"v2.core.event"}"#;
        assert!(Event::parse(bare.as_bytes()).is_ok(), "even without an object");
    }
}
