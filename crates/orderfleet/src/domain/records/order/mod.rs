//! Orders and their statuses (SPEC §5).
//!
//! The status only moves forward, and every move is a compare-and-set on the status the
//! writer expects (`UPDATE … WHERE status = $expected`): a duplicated, redelivered or
//! redriven message that finds the order already moved on changes nothing.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use orderfleet_words::{Money, OrderId, Quantity, Sku, UserId};

mod moves;
mod transition;

use crate::domain::records::outbox::OrderNotification;
use crate::domain::words::status::{FailureReason, OrderStatus};
pub use moves::Move;
use orderfleet_words::hold::{BuyerAction, Hold, OrderIntent};
pub use transition::{StripeEvent, Transition, record_event};

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
    /// Its place in line for its product, from 1; `None` for a queued order before the draw.
    pub position: Option<i64>,
    /// Its PaymentIntent at Stripe, once authorized.
    pub payment_intent_id: Option<String>,
    /// What its buyer is told of a failure.
    pub failure_reason: Option<FailureReason>,
    /// When its hold was released (its PaymentIntent cancelled), if it was.
    pub authorization_released_at: Option<DateTime<Utc>>,
    /// The W3C trace context of the request that made the order ([`orderfleet_runtime::trace`]).
    pub traceparent: Option<String>,
    /// Its Stripe attempt, from 1 ([`orderfleet_payments::Operation::idempotency_key`]).
    pub payment_attempt: i32,
    /// The attempt's key has answered a 5xx, which Stripe saved under it
    /// ([`crate::domain::steps::authorization::resume`]).
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
    /// For an order taken in a pre-queue, the opening it was taken for: its first answer was
    /// `202 queued`, which a retry of its key answers again.
    pub queued_for: Option<DateTime<Utc>>,
    /// The most units one card may hold in its product's orders, as in force when it was
    /// promised its units (`--max-per-card`); `None`: no cap, and no payment method is read.
    pub card_cap: Option<i32>,
    /// Its card's `card.fingerprint`, once it was found to fit under [`Order::card_cap`]
    /// ([`crate::domain::steps::authorization`]'s card check), before any PaymentIntent.
    pub card_fingerprint: Option<String>,
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
    pub(crate) currency: orderfleet_words::Currency,
    pub(crate) payment_method: String,
    pub(crate) status: OrderStatus,
    pub(crate) position: Option<i64>,
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
    pub(crate) queued_for: Option<DateTime<Utc>>,
    pub(crate) card_cap: Option<i32>,
    pub(crate) card_fingerprint: Option<String>,
}

/// The [`Order`] of any row with its columns as fields (an [`OrderRow`], or a `query!` record
/// with more columns). With `?`, each column an order always has is an `Option` (the row of a
/// `LEFT JOIN`), and the order is `None` when it is.
macro_rules! order_from {
    ($row:ident $(, $some:tt)?) => {
        $crate::domain::records::order::Order {
            id: $row.id $($some)?,
            user_id: $row.user_id $($some)?,
            request_hash: $row.request_hash $($some)?,
            product_id: $row.product_id $($some)?,
            quantity: $row.quantity $($some)?,
            amount: orderfleet_words::Money { minor: $row.amount_minor $($some)?, currency: $row.currency $($some)? },
            payment_method: $row.payment_method $($some)?,
            status: $row.status $($some)?,
            position: $row.position,
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
            queued_for: $row.queued_for,
            card_cap: $row.card_cap,
            card_fingerprint: $row.card_fingerprint,
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
/// up to them (`"SELECT"`, `"… RETURNING"`), the rest of it, then its arguments. With `more`
/// first, a `query!` whose answer has more columns after the order's (`$tail` begins with
/// them), for [`order_from!`]. The one list of the order's columns in a statement of Rust's;
/// the door's statement, a file (`door/door.sql`), has the other.
macro_rules! query_order {
    (more, $head:literal, $tail:literal $($args:tt)*) => {
        $crate::domain::records::order::query_order!(@columns (sqlx::query!) [] $head, $tail $($args)*)
    };
    ($head:literal, $tail:literal $($args:tt)*) => {
        $crate::domain::records::order::query_order!(
            @columns (sqlx::query_as!) [$crate::domain::records::order::OrderRow,] $head, $tail $($args)*
        )
    };
    (@columns ($($query:tt)*) [$($row:tt)*] $head:literal, $tail:literal $($args:tt)*) => {
        $($query)*(
            $($row)*
            $head + r#" id AS "id: orderfleet_words::OrderId", user_id AS "user_id: orderfleet_words::UserId",
                request_hash, product_id AS "product_id: orderfleet_words::Sku",
                quantity AS "quantity: orderfleet_words::Quantity", amount_minor,
                currency AS "currency: orderfleet_words::Currency", payment_method,
                status AS "status: crate::domain::words::status::OrderStatus", position, payment_intent_id,
                failure_reason AS "failure_reason: crate::domain::words::status::FailureReason",
                authorization_released_at, traceparent, payment_attempt,
                payment_attempt_failed, payment_attempt_at, client_secret, next_action, action_expires_at,
                intake_lease_until, created_at, updated_at, queued_for, card_cap, card_fingerprint "# + $tail
            $($args)*
        )
    };
}
pub(crate) use query_order;

/// How much longer a lease lasts than the deadline its holder's work is cut off at: a statement
/// the holder sent just before may still run on the server, for up to its statement timeout.
pub const LEASE_MARGIN: std::time::Duration = orderfleet_runtime::db::STATEMENT_TIMEOUT;

/// The lease for a holder whose work on the order (the take included) is cut off at `deadline`:
/// the deadline and [`LEASE_MARGIN`]. The deadlines: a placement's is the request timeout
/// (60 s: a lease of 65 s); settling 3-D Secure makes eight Stripe calls at most
/// ([`crate::domain::steps::three_d_secure::settle_deadline`]), resuming a pending order seven
/// ([`crate::domain::steps::authorization::resume_deadline`]), each at most
/// [`orderfleet_payments::RetryPolicy::longest_call`].
pub const fn lease_for(deadline: std::time::Duration) -> std::time::Duration {
    deadline.saturating_add(LEASE_MARGIN)
}

/// ONE statement: takes the lease (`intake_lease_until`) of an order still in `status` that
/// nobody works on (no lease, or an expired one), for `lease`; `None` when it is not to be had.
/// The order returned carries the lease's end as the take set it: the holder's token
/// ([`release_lease`]). With `touch`, the take counts as the order's last change (`updated_at`),
/// so a sweep by age looks at it again only later.
pub(crate) async fn take_lease(
    pool: &orderfleet_runtime::db::Pool,
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
    pool: &orderfleet_runtime::db::Pool,
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

/// Where an order is in its product's line: the product's opening, its place, the queued orders
/// ahead of it still waiting for a unit, and the orders ahead of it waiting for their
/// authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// When the product opens, if it has an opening.
    pub opens_at: Option<DateTime<Utc>>,
    /// Its place: the order's own, or, for an order still queued, the place the opening's draw
    /// gave it (`queue_places`); `None` before the opening.
    pub position: Option<i64>,
    /// Queued orders ahead, still waiting for a unit.
    pub queued_ahead: i64,
    /// Orders ahead waiting for their authorization (`pending_authorization`, `requires_action`).
    pub authorizations_ahead: i64,
}

/// The line ahead of `order`, in ONE statement (none is ahead of an order with no place yet).
/// The queue still waiting is `queue_places`, each row a queued order's place. Its place is
/// read here, not taken from `order`: an order loaded queued may have left the queue since (its
/// place moved onto it), and is then placed all the same.
pub async fn line<'e>(executor: impl PgExecutor<'e>, order: &Order) -> sqlx::Result<Line> {
    sqlx::query_as!(
        Line,
        r#"WITH place AS (
             SELECT COALESCE((SELECT position FROM orders WHERE id = $2),
                             (SELECT position FROM queue_places WHERE order_id = $2)) AS position
         )
         SELECT (SELECT opens_at FROM products WHERE id = $1) AS opens_at,
                (SELECT position FROM place) AS position,
                (SELECT count(*) FROM queue_places
                  WHERE product_id = $1 AND position < (SELECT position FROM place)) AS "queued_ahead!",
                (SELECT count(*) FROM orders WHERE product_id = $1 AND awaiting_authorization(status)
                                               AND position < (SELECT position FROM place))
                    AS "authorizations_ahead!""#,
        &order.product_id as _,
        order.id as _,
    )
    .fetch_one(executor)
    .await
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
