//! Orders and their statuses (SPEC §5).
//!
//! The status only moves forward, and every move is a compare-and-set on the status the
//! writer expects (`UPDATE … WHERE status = $expected`): a duplicated, redelivered or
//! redriven message that finds the order already moved on changes nothing.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::outbox::{Destination, EventType};
use crate::domain::{Money, OrderId, Quantity, Sku, UserId};

pub use crate::domain::hold::{BuyerAction, Hold, OrderIntent};
pub use crate::domain::outbox::OrderNotification;
pub use crate::domain::status::{FailureReason, OrderStatus, StatusSet};

/// An order as stored: the one shape every part reads (the intake, the authorization, the
/// stock worker, the sweeper), read with `query_order!` or `order_from!`. What a buyer or a subscriber is
/// shown of it are views built from it (the intake's `Accepted` and `OrderView`,
/// [`OrderNotification`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Order {
    /// Its id, a UUIDv7.
    pub id: OrderId,
    /// Its buyer.
    pub user_id: UserId,
    /// The SHA-256 of the request that made it: the same idempotency key with another body is
    /// refused.
    pub request_hash: Vec<u8>,
    /// The product it buys.
    pub product_id: Sku,
    /// How many units.
    pub quantity: Quantity,
    /// The price times the quantity, fixed by the door.
    #[sqlx(flatten)]
    pub amount: Money,
    /// The Stripe PaymentMethod the buyer gave.
    pub payment_method: String,
    /// Where it is in its life.
    pub status: OrderStatus,
    /// Its place in line for its product, from 1.
    pub position: i64,
    /// Its PaymentIntent at Stripe, once authorized.
    pub payment_intent_id: Option<String>,
    /// What its buyer is told of a failure.
    pub failure_reason: Option<FailureReason>,
    /// When its hold was released (its PaymentIntent cancelled), if it was.
    pub authorization_released_at: Option<DateTime<Utc>>,
    /// The W3C trace context of the request that made the order ([`crate::runtime::trace`]).
    pub traceparent: Option<String>,
    /// Its Stripe attempt, from 1 ([`crate::domain::payments::Operation::idempotency_key`]).
    pub payment_attempt: i32,
    /// The attempt's key has answered a 5xx, which Stripe saved under it
    /// ([`crate::domain::authorization::resume`]).
    pub payment_attempt_failed: bool,
    /// When the attempt began, or, once its key answered a 5xx, when that answer came back.
    pub payment_attempt_at: DateTime<Utc>,
    /// While its card needs 3-D Secure, and after: the PaymentIntent's client secret, which the
    /// buyer's page completes it with (set only for an order that went `requires_action`).
    pub client_secret: Option<String>,
    /// Stripe's `next_action` for the buyer's page, with the client secret.
    pub next_action: Option<serde_json::Value>,
    /// Until when the buyer may authenticate (`PAYMENT_ACTION_TIMEOUT_SECONDS` after the answer).
    pub action_expires_at: Option<DateTime<Utc>>,
    /// Until when whoever works on it (a request, the sweeper, a webhook) holds its lease, as
    /// this copy read it. In the copy its holder took ([`take_lease`], the door), it is the
    /// holder's token: the lease is given back only while it is still this value
    /// ([`release_lease`]), so a holder whose lease lapsed and was taken by another gives back
    /// nothing of the other's.
    pub intake_lease_until: Option<DateTime<Utc>>,
    /// When the door admitted it.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// ONE statement: moves an order still in `status` on to its next Stripe attempt (new
/// idempotency keys), if it is still on `attempt` and that attempt began at least `settled_for`
/// ago; returns the attempt the order is on now, moved or not (`None`: no such order in
/// `status`). Kept on the order, so no crash loses it; a compare-and-set, so two processes
/// that saw the same attempt fail move the order once and then share the new keys.
///
/// `settled_for` is how long ago the lookup that found the attempt did nothing began: the
/// attempt's last answer must be dated before it, or the lookup may have missed its effect.
pub(crate) async fn next_payment_attempt<'e>(
    executor: impl PgExecutor<'e>,
    id: OrderId,
    status: OrderStatus,
    attempt: i32,
    settled_for: std::time::Duration,
) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar!(
        "WITH moved AS (
             UPDATE orders SET payment_attempt = payment_attempt + 1, payment_attempt_at = now(),
                               payment_attempt_failed = false, updated_at = now()
              WHERE id = $1 AND status = $2 AND payment_attempt = $3
                AND payment_attempt_at <= now() - $4 * interval '1 ms'
          RETURNING payment_attempt
         )
         SELECT COALESCE((SELECT payment_attempt FROM moved),
                         (SELECT payment_attempt FROM orders WHERE id = $1 AND status = $2))",
        id as _,
        status as _,
        attempt,
        settled_for.as_millis() as i64,
    )
    .fetch_one(executor)
    .await
}

impl Order {
    /// Its PaymentIntent `id`, to capture or cancel under its current Stripe attempt's key.
    pub fn intent<'a>(&self, id: &'a str) -> OrderIntent<'a> {
        OrderIntent { order_id: self.id, attempt: self.payment_attempt, id }
    }
}

/// [`Order`] as `query_as!` reads it: a field a column, its amount's two flat.
#[derive(Debug)]
pub(crate) struct OrderRow {
    pub(crate) id: OrderId,
    pub(crate) user_id: UserId,
    pub(crate) request_hash: Vec<u8>,
    pub(crate) product_id: Sku,
    pub(crate) quantity: Quantity,
    pub(crate) amount_minor: i64,
    pub(crate) currency: crate::domain::Currency,
    pub(crate) payment_method: String,
    pub(crate) status: OrderStatus,
    pub(crate) position: i64,
    pub(crate) payment_intent_id: Option<String>,
    pub(crate) failure_reason: Option<FailureReason>,
    pub(crate) authorization_released_at: Option<DateTime<Utc>>,
    pub(crate) traceparent: Option<String>,
    pub(crate) payment_attempt: i32,
    pub(crate) payment_attempt_failed: bool,
    pub(crate) payment_attempt_at: DateTime<Utc>,
    pub(crate) client_secret: Option<String>,
    pub(crate) next_action: Option<serde_json::Value>,
    pub(crate) action_expires_at: Option<DateTime<Utc>>,
    pub(crate) intake_lease_until: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// The [`Order`] of any row with its columns as fields (an [`OrderRow`], or a `query!` record
/// with more columns). With `?`, each column an order always has is an `Option` (the row of a
/// `LEFT JOIN`), and the order is `None` when it is.
macro_rules! order_from {
    ($row:ident $(, $some:tt)?) => {
        $crate::domain::order::Order {
            id: $row.id $($some)?,
            user_id: $row.user_id $($some)?,
            request_hash: $row.request_hash $($some)?,
            product_id: $row.product_id $($some)?,
            quantity: $row.quantity $($some)?,
            amount: $crate::domain::Money { minor: $row.amount_minor $($some)?, currency: $row.currency $($some)? },
            payment_method: $row.payment_method $($some)?,
            status: $row.status $($some)?,
            position: $row.position $($some)?,
            payment_intent_id: $row.payment_intent_id,
            failure_reason: $row.failure_reason,
            authorization_released_at: $row.authorization_released_at,
            traceparent: $row.traceparent,
            payment_attempt: $row.payment_attempt $($some)?,
            payment_attempt_failed: $row.payment_attempt_failed $($some)?,
            payment_attempt_at: $row.payment_attempt_at $($some)?,
            client_secret: $row.client_secret,
            next_action: $row.next_action,
            action_expires_at: $row.action_expires_at,
            intake_lease_until: $row.intake_lease_until,
            created_at: $row.created_at $($some)?,
            updated_at: $row.updated_at $($some)?,
        }
    };
}
pub(crate) use order_from;

impl From<OrderRow> for Order {
    fn from(row: OrderRow) -> Self {
        order_from!(row)
    }
}

/// `query_as!(OrderRow, …)` of a statement whose answer is [`Order`]'s columns: the statement
/// up to them (`"SELECT"`, `"… RETURNING"`), the rest of it, then its arguments.
macro_rules! query_order {
    ($head:literal, $tail:literal $($args:tt)*) => {
        sqlx::query_as!(
            $crate::domain::order::OrderRow,
            $head + r#" id AS "id: crate::domain::OrderId", user_id AS "user_id: crate::domain::UserId",
                request_hash, product_id AS "product_id: crate::domain::Sku",
                quantity AS "quantity: crate::domain::Quantity", amount_minor,
                currency AS "currency: crate::domain::Currency", payment_method,
                status AS "status: crate::domain::status::OrderStatus", position, payment_intent_id,
                failure_reason AS "failure_reason: crate::domain::status::FailureReason",
                authorization_released_at, traceparent, payment_attempt,
                payment_attempt_failed, payment_attempt_at, client_secret, next_action, action_expires_at,
                intake_lease_until, created_at, updated_at "# + $tail
            $($args)*
        )
    };
}
pub(crate) use query_order;

/// How much longer a lease lasts than the deadline its holder's work is cut off at: a statement
/// the holder sent just before may still run on the server, for up to its statement timeout.
pub const LEASE_MARGIN: std::time::Duration = crate::runtime::db::STATEMENT_TIMEOUT;

/// The lease for a holder whose work on the order (the take included) is cut off at `deadline`:
/// the deadline and [`LEASE_MARGIN`]. The deadlines: a placement's is the request timeout
/// (60 s: a lease of 65 s); settling 3-D Secure makes five Stripe calls at most
/// ([`crate::domain::action::settle_deadline`]), resuming a pending order six
/// ([`crate::domain::authorization::resume_deadline`]), each at most
/// [`crate::domain::payments::RetryPolicy::longest_call`].
pub const fn lease_for(deadline: std::time::Duration) -> std::time::Duration {
    deadline.saturating_add(LEASE_MARGIN)
}

/// ONE statement: takes the lease (`intake_lease_until`) of an order still in `status` that
/// nobody works on (no lease, or an expired one), for `lease`; `None` when it is not to be had.
/// The order returned carries the lease's end as the take set it: the holder's token
/// ([`release_lease`]). With `touch`, the take counts as the order's last change (`updated_at`),
/// so a sweep by age looks at it again only later.
pub(crate) async fn take_lease(
    pool: &crate::runtime::db::Pool,
    id: OrderId,
    status: OrderStatus,
    lease: std::time::Duration,
    touch: bool,
) -> sqlx::Result<Option<Order>> {
    let row = query_order!(
        "UPDATE orders SET intake_lease_until = now() + $2 * interval '1 ms',
                           updated_at = CASE WHEN $4 THEN now() ELSE updated_at END
          WHERE id = $1 AND status = $3
            AND (intake_lease_until IS NULL OR intake_lease_until < now())
         RETURNING",
        "",
        id as _,
        lease.as_millis() as i64,
        status as _,
        touch,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(Order::from))
}

/// Gives back the lease `order` was taken with, so another request or the sweeper may take it
/// at once: only while the order is still in `status` and its lease is still the one this
/// holder took (`order.intake_lease_until`, the token). A holder whose lease lapsed, and was
/// taken by another, so leaves the other's alone.
pub(crate) async fn release_lease(
    pool: &crate::runtime::db::Pool,
    order: &Order,
    status: OrderStatus,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE orders SET intake_lease_until = NULL
          WHERE id = $1 AND status = $2 AND intake_lease_until = $3",
        order.id as _,
        status as _,
        order.intake_lease_until,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The order with this id, if any.
pub async fn load<'e>(executor: impl PgExecutor<'e>, id: OrderId) -> sqlx::Result<Option<Order>> {
    let row = query_order!("SELECT", "FROM orders WHERE id = $1", id as _).fetch_optional(executor).await?;
    Ok(row.map(Order::from))
}

/// The order a buyer's idempotency key made, if any.
pub async fn find_by_key<'e>(
    executor: impl PgExecutor<'e>,
    user: &UserId,
    key: &str,
) -> sqlx::Result<Option<Order>> {
    let row =
        query_order!("SELECT", "FROM orders WHERE user_id = $1 AND idempotency_key = $2", user as _, key)
            .fetch_optional(executor)
            .await?;
    Ok(row.map(Order::from))
}

/// A move of one order from one status to the next, with what the move records and the
/// outbox messages it causes: a value, built with [`Transition::new`] and the `with_` methods,
/// then applied (`Transition::apply`) in one statement.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    /// The order it moves.
    pub order_id: OrderId,
    /// The status it must still be in; if it is not, the move writes nothing.
    pub from: OrderStatus,
    /// The status it moves to.
    pub to: OrderStatus,
    /// What the buyer is told of a failure (`failure_reason`).
    pub failure_reason: Option<FailureReason>,
    /// The authorization hold, recorded with the move.
    pub hold: Option<Hold<'a>>,
    /// The outbox messages the move causes, committed with it.
    pub messages: Vec<crate::domain::outbox::NewMessage>,
    /// For a move to `requires_action`: what the buyer's page needs, and until when.
    pub action: Option<BuyerAction<'a>>,
    /// The move ends the order without a sale: its promised units go back to the door, and
    /// from `stock_reserved`, its units to the stock too, in the same statement.
    pub gives_units_back: bool,
    /// What operators are told of the failure (`decline_detail`), beside the buyer's code.
    pub detail: Option<&'a str>,
    /// The Stripe webhook event that caused the move, recorded with it ([`Transition::commit`]).
    pub event: Option<StripeEvent<'a>>,
    /// The order's hold is gone (cancelled, or lapsed): `authorization_released_at` is set.
    pub hold_released: bool,
}

/// A Stripe webhook event, by its id and type: recorded in `webhook_events` with its effect,
/// so a redelivery is recognised.
#[derive(Debug, Clone, Copy)]
pub struct StripeEvent<'a> {
    /// `evt_…`.
    pub id: &'a str,
    /// `payment_intent.canceled`, ….
    pub kind: &'a str,
}

/// Records that `event` was applied, with what it did (`effect`), unless it already was.
pub async fn record_event<'e>(
    executor: impl PgExecutor<'e>,
    event: StripeEvent<'_>,
    order_id: Option<OrderId>,
    effect: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO webhook_events (id, type, order_id, effect) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO NOTHING",
        event.id,
        event.kind,
        order_id as _,
        effect,
    )
    .execute(executor)
    .await?;
    Ok(())
}

impl<'a> Transition<'a> {
    /// A move of `order_id` from `from` to `to` with nothing else recorded, yet.
    pub fn new(order_id: OrderId, from: OrderStatus, to: OrderStatus) -> Self {
        Self {
            order_id,
            from,
            to,
            failure_reason: None,
            hold: None,
            messages: Vec::new(),
            action: None,
            gives_units_back: false,
            detail: None,
            event: None,
            hold_released: false,
        }
    }

    /// Records that the order's hold is gone with the move.
    pub(crate) fn with_hold_released(self) -> Self {
        Self { hold_released: true, ..self }
    }

    /// Records the webhook event that caused the move with it, when there is one.
    pub(crate) fn with_event(self, event: Option<StripeEvent<'a>>) -> Self {
        Self { event, ..self }
    }

    /// Applies the move ([`Transition::apply`]), and, when a webhook event caused it, records
    /// the event in the same transaction: the effect and the event's id commit together.
    pub(crate) async fn commit(self, pool: &crate::runtime::db::Pool) -> sqlx::Result<bool> {
        let Some(event) = self.event else { return self.apply(pool).await };
        let (order_id, to) = (self.order_id, self.to);
        let mut tx = pool.begin().await?;
        let moved = self.apply(&mut *tx).await?;
        if moved {
            record_event(&mut *tx, event, Some(order_id), to.as_str()).await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    /// Records what the buyer's page needs to complete 3-D Secure, and its deadline.
    pub(crate) fn with_action(self, action: BuyerAction<'a>) -> Self {
        Self { action: Some(action), ..self }
    }

    /// Gives the order's promised units back, keeping `detail` for operators.
    pub(crate) fn giving_units_back(self, detail: &'a str) -> Self {
        Self { gives_units_back: true, detail: Some(detail), ..self }
    }

    /// Records what the buyer is told of the failure.
    pub(crate) fn with_reason(self, failure_reason: FailureReason) -> Self {
        Self { failure_reason: Some(failure_reason), ..self }
    }

    /// Records the authorization hold (its PaymentIntent and deadline).
    pub(crate) fn with_hold(self, hold: Hold<'a>) -> Self {
        Self { hold: Some(hold), ..self }
    }

    /// A message the move causes, for its event type's queue.
    pub(crate) fn with_message(mut self, event_type: EventType, payload: impl Serialize) -> Self {
        self.messages.push(crate::domain::outbox::NewMessage::new(event_type, self.order_id, payload));
        self
    }

    /// ONE statement (`transition.sql`: one round trip and the shortest possible lock): moves
    /// the order from `from` to `to` if, and only if, it is still in `from`, and in the same statement
    /// enqueues the outbox messages the move causes, each carrying the order's trace context,
    /// and gives its units back when the move ends it (the order row is locked before the
    /// product row, as everywhere). Returns whether this call made the move; if not, nothing
    /// was written. The intake's lease is cleared, and the hold recorded when given.
    ///
    /// **A move to `authorized` also takes the order's units** when nothing was cut — the
    /// condition of the stock worker's own reservation ([`crate::domain::fulfilment`]'s
    /// `arrive`): no more units promised than the total, and the units in stock — and then
    /// the order goes on to `stock_reserved` in the same statement (SPEC §5's two moves,
    /// committed as one). Its stock-check message then says so (`reserved`: the attempt and
    /// the PaymentIntent to capture), and the stock worker captures without reading the order
    /// first. After a cut the order stays `authorized`, and the worker reserves it in line.
    /// `crates/order-model` checks this merge (`CommitRule::ReserveWhenNothingCut`), and finds
    /// the defect of one that looks at the stock alone.
    pub(crate) async fn apply<'e>(self, executor: impl PgExecutor<'e>) -> sqlx::Result<bool> {
        let (ids, event_types, destinations, payloads) = columns(&self.messages);
        let moved = sqlx::query_file_scalar!(
            "src/domain/transition.sql",
            self.order_id as _,
            self.from as _,
            self.to as _,
            self.failure_reason.map(FailureReason::as_str),
            self.hold.map(|h| h.intent_id),
            &ids,
            &event_types as _,
            &destinations as _,
            &payloads as _,
            self.hold.and_then(|h| h.capture_before),
            self.action.map(|a| a.client_secret),
            self.action.map(|a| a.next_action),
            self.action.map(|a| a.until),
            self.gives_units_back,
            self.detail,
            self.hold_released,
        )
        .fetch_one(executor)
        .await?;
        Ok(moved == 1)
    }
}

/// The outbox messages of a move as the columns `Transition::apply` unnests: a new id for
/// each, its event type, its destination, its payload.
fn columns(
    messages: &[crate::domain::outbox::NewMessage],
) -> (Vec<Uuid>, Vec<EventType>, Vec<Destination>, Vec<&serde_json::Value>) {
    let ids = messages.iter().map(|_| Uuid::now_v7()).collect();
    let event_types = messages.iter().map(|m| m.event_type).collect();
    let destinations = messages.iter().map(|m| m.event_type.destination()).collect();
    (ids, event_types, destinations, messages.iter().map(|m| &m.payload).collect())
}

/// Records that the authorization hold of an order is gone (its PaymentIntent cancelled).
pub(crate) async fn mark_authorization_released<'e>(
    executor: impl PgExecutor<'e>,
    id: OrderId,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE orders SET authorization_released_at = now(), updated_at = now()
          WHERE id = $1 AND authorization_released_at IS NULL",
        id as _,
    )
    .execute(executor)
    .await?;
    Ok(())
}

impl OrderNotification {
    /// The notification of `order` as it moves to `status`.
    pub fn of(order: &Order, status: OrderStatus, reason: Option<FailureReason>) -> Self {
        Self {
            user_id: order.user_id.clone(),
            order_id: order.id,
            status,
            product_id: order.product_id.clone(),
            quantity: order.quantity,
            amount: order.amount.minor,
            currency: order.amount.currency.clone(),
            reason,
        }
    }
}
