//! The reservation of an `authorized` order's units: the SQL that reads the order and the line
//! and records the decision. [`Fulfilment::arrive`] is a delivery's first statement, which
//! takes the units at once when nothing was cut; after a cut, [`Fulfilment::reserve_in_line`]
//! locks the order and then the product row, reads the orders ahead of it
//! (`fits_after_the_line`) and records `stock_reserved` or `rejected_out_of_stock`
//! (`record_reservation`), in one short transaction. What fits is decided by `line`'s
//! arithmetic; what the step does with the answer, in the module's step.

use anyhow::Context;
use uuid::Uuid;

use super::Fulfilment;
use super::line::fits_whatever_the_pending_do;
use crate::domain::records::order::{self, Order};
use crate::domain::records::outbox::OrderNotification;
use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_words::OrderId;

/// What the reservation statement ([`Fulfilment::arrive`]) did, and so what is left to do.
pub(super) enum Arrival {
    /// It moved the order to `stock_reserved`: its units are taken.
    Reserved,
    /// It moved nothing: go on from the order's status as it came back.
    AsItWas,
    /// It is `authorized` and was claimed, but stock was cut below what was promised: its
    /// units need the line read ([`Fulfilment::reserve_in_line`]).
    Short,
    /// It is `authorized` and was claimed, but its hold is past the deadline Stripe gave
    /// (`authorization_expires_at`): it takes no units ([`Fulfilment::lapse`]).
    Lapsed,
}

/// What a reservation step did.
pub(super) enum Reserved {
    /// This step moved the order (to `stock_reserved` or `rejected_out_of_stock`).
    Moved(OrderStatus),
    /// Another delivery had already moved it.
    Lost,
    /// Whether its units are left depends on an order ahead still pending authorization.
    Waiting(String),
    /// Its hold is past its deadline: it takes no units ([`Fulfilment::lapse`]).
    Lapsed,
}

impl Fulfilment {
    /// The reservation's ONE statement, and a delivery's first step: the order as it is, and,
    /// if it is `authorized`, its units taken on [`Fulfilment::reserve`]'s condition (nothing
    /// was cut). `None`: no such order. The order comes back as this statement left
    /// it: `stock_reserved` if it moved it; otherwise as the statement's snapshot saw it, which
    /// may predate another delivery's move (the next step's compare-and-set finds out).
    pub(super) async fn arrive(&self, order_id: OrderId) -> anyhow::Result<Option<(Order, Arrival)>> {
        // Claims the order if it is `authorized`, takes its units if nothing was cut, and moves
        // it to `stock_reserved`. The order comes back either way, with whether it was claimed:
        // as the statement's snapshot saw it, then given the move's status and time. (The
        // snapshot predates the claim's lock; nothing changes an order's other columns while it
        // is `authorized`, so they are the moved row's too. A writer that did would read them
        // from `moved` here.)
        let row = order::query_order!(
            more,
            r#"WITH claim AS (
                 SELECT id, product_id, quantity, (authorization_expires_at < now()) IS TRUE AS lapsed
                   FROM orders WHERE id = $1 AND status = 'authorized' FOR UPDATE
             ), taken AS (
                 UPDATE products p SET stock = p.stock - c.quantity, updated_at = now()
                   FROM claim c
                  WHERE p.id = c.product_id AND NOT c.lapsed
                    AND p.units_promised <= p.units_total AND p.stock >= c.quantity
              RETURNING p.id
             ), moved AS (
                 UPDATE orders SET status = 'stock_reserved', updated_at = now()
                  WHERE id IN (SELECT id FROM claim) AND EXISTS (SELECT 1 FROM taken)
              RETURNING updated_at
             )
             SELECT"#,
            r#", EXISTS (SELECT 1 FROM claim) AS "claimed!",
                 EXISTS (SELECT 1 FROM claim WHERE lapsed) AS "lapsed!",
                 (SELECT updated_at FROM moved) AS moved_at
               FROM orders WHERE id = $1"#,
            order_id as _,
        )
        .fetch_optional(&self.pool)
        .await
        .context("failed to reserve stock")?;
        let Some(row) = row else { return Ok(None) };
        let (claimed, lapsed, moved_at) = (row.claimed, row.lapsed, row.moved_at);
        let mut order = order::order_from!(row);
        if let Some(moved_at) = moved_at {
            (order.status, order.updated_at) = (OrderStatus::StockReserved, moved_at);
        }
        let arrival = match (claimed, order.status) {
            (true, OrderStatus::StockReserved) => {
                orderfleet_runtime::failpoint::hit("after_reserve");
                Arrival::Reserved
            }
            (true, _) if lapsed => Arrival::Lapsed,
            (true, _) => Arrival::Short,
            (false, _) => Arrival::AsItWas,
        };
        Ok(Some((order, arrival)))
    }

    /// Reserves the order's units, or rejects it (see [`Fulfilment::reserve_in_line`]).
    ///
    /// First, ONE statement for the common case: while no units are promised beyond the total
    /// (nothing was cut), the units not yet taken cover every order still holding a promise
    /// (`stock = total - taken >= promised - taken`), so an order's units are there whatever
    /// its place in line, and the statement takes them on that condition alone. Both sides of
    /// it are columns of the one product row, which PostgreSQL re-checks on the latest version
    /// after waiting for another worker's lock, so the decision is never stale. Only after a
    /// cut does the order need the line read.
    pub(super) async fn reserve(&self, order: &Order) -> anyhow::Result<Reserved> {
        // The statement of a delivery's first step, which does this for the order by its id.
        match self.arrive(order.id).await? {
            Some((_, Arrival::Reserved)) => Ok(Reserved::Moved(OrderStatus::StockReserved)),
            Some((_, Arrival::Short)) => self.reserve_in_line(order).await,
            Some((_, Arrival::Lapsed)) => Ok(Reserved::Lapsed),
            Some((_, Arrival::AsItWas)) | None => Ok(Reserved::Lost),
        }
    }

    /// After a cut: ONE short transaction: lock the order if it is still `authorized`, then the
    /// product row, then decide with the line in view: the order takes its units only if they are
    /// still there **after every order ahead of it in line** that has not taken its own
    /// ([`fits_in_line`](super::fits_in_line)); it moves to `stock_reserved` and the units leave
    /// `stock` (never below zero). If not, it moves to `rejected_out_of_stock` with its
    /// `order.rejected` message, and its promised units go back to the product. An order ahead
    /// still pending authorization may take its units or be declined and take none: when the answer
    /// depends on which, the order waits ([`Reserved::Waiting`]), so it is neither rejected for a
    /// unit that then goes unsold nor given one that an order ahead of it then needs.
    ///
    /// Looking at the orders ahead is what keeps line order whatever order the messages arrive
    /// in: stock is short only after an operator cut it below what the door promised, and then
    /// the orders last in line lose, never an earlier one whose message came late.
    ///
    /// Why a transaction and not one statement: the decision must see every reservation
    /// committed before it. A single statement reads the line from the snapshot it started
    /// with, and when it then waits for another worker's lock on the product row, PostgreSQL
    /// re-checks only that row: the other order's units would count twice, once as taken and
    /// once as still ahead, and the last in line would lose with no cut at all. Here the line
    /// is read after the product row is locked, so nothing can change under the decision. The
    /// lock is held for three short statements and the commit; no network call runs under it.
    /// Returns the move made, or that another delivery had already moved the order.
    pub(super) async fn reserve_in_line(&self, order: &Order) -> anyhow::Result<Reserved> {
        let mut tx =
            orderfleet_runtime::db::begin(&self.pool).await.context("failed to begin a reservation")?;
        let locked = sqlx::query!(
            r#"SELECT position AS "position!", (authorization_expires_at < now()) IS TRUE AS "lapsed!"
                 FROM orders WHERE id = $1 AND status = 'authorized' FOR UPDATE"#,
            order.id as _,
        )
        .fetch_optional(&mut *tx)
        .await
        .context("failed to lock the order")?;
        let position = match locked {
            Some(locked) if !locked.lapsed => locked.position,
            moved_or_lapsed => {
                tx.rollback().await.context("failed to end the reservation")?;
                // Another delivery moved it, or its hold passed its deadline meanwhile.
                return Ok(if moved_or_lapsed.is_some() { Reserved::Lapsed } else { Reserved::Lost });
            }
        };
        let stock = sqlx::query_scalar!(
            "SELECT stock FROM products WHERE id = $1 FOR UPDATE",
            &order.product_id as _
        )
        .fetch_one(&mut *tx)
        .await
        .context("failed to lock the product")?;
        let fits = match fits_after_the_line(&mut tx, order, position, stock).await? {
            Fit::Fits => true,
            Fit::Short => false,
            Fit::Waits(reason) => {
                tx.rollback().await.context("failed to end the reservation")?;
                return Ok(Reserved::Waiting(reason));
            }
        };
        let status = record_reservation(&mut tx, order, fits).await?;
        tx.commit().await.context("failed to commit the reservation")?;
        if status == OrderStatus::StockReserved {
            orderfleet_runtime::failpoint::hit("after_reserve");
        }
        Ok(Reserved::Moved(status))
    }
}

/// Whether an order fits in its line: its units there, short, or not known while an order
/// ahead is still pending authorization (why).
enum Fit {
    Fits,
    Short,
    Waits(String),
}

/// Whether the order's units are there after every order ahead of it in line that has not taken its
/// own ([`fits_in_line`](super::fits_in_line)), read inside the reservation's transaction after the
/// product row is locked, or that it waits while that depends on an order ahead still pending
/// authorization. In a drop with no cut the units always cover the line, so the line itself
/// is read only when its sum does not.
async fn fits_after_the_line(
    tx: &mut sqlx::PgConnection,
    order: &Order,
    position: i64,
    stock: i32,
) -> anyhow::Result<Fit> {
    // The units promised to the orders ahead of it that have not taken theirs: pending ones,
    // and authorized ones, but for a hold past its deadline, which will never take its units.
    let units_ahead = sqlx::query_scalar!(
        r#"SELECT COALESCE(sum(quantity), 0)::int8 AS "units!" FROM orders
            WHERE product_id = $1 AND position < $2
              AND (awaiting_authorization(status)
                   OR (status = 'authorized' AND (authorization_expires_at < now()) IS NOT TRUE))"#,
        &order.product_id as _,
        position,
    )
    .fetch_one(&mut *tx)
    .await
    .context("failed to sum the units ahead")?;
    if i64::from(stock) - units_ahead >= i64::from(order.quantity.get()) {
        return Ok(Fit::Fits);
    }
    // A pending order ahead may yet take its units or be declined and take none. When the
    // two agree the answer is known; when they do not, this order waits for it.
    let line: Vec<(i32, bool)> = sqlx::query!(
        r#"SELECT quantity, awaiting_authorization(status) AS "pending!" FROM orders
            WHERE product_id = $1 AND position < $2
              AND (awaiting_authorization(status)
                   OR (status = 'authorized' AND (authorization_expires_at < now()) IS NOT TRUE))
            ORDER BY position"#,
        &order.product_id as _,
        position,
    )
    .fetch_all(&mut *tx)
    .await
    .context("failed to read the line")?
    .into_iter()
    .map(|ahead| (ahead.quantity, ahead.pending))
    .collect();
    Ok(match fits_whatever_the_pending_do(stock, &line, order.quantity.get()) {
        Some(true) => Fit::Fits,
        Some(false) => Fit::Short,
        None => {
            let pending = line.iter().filter(|(_, pending)| *pending).count();
            Fit::Waits(format!(
                "whether order {} gets its units depends on {pending} order(s) ahead of it still pending authorization",
                order.id
            ))
        }
    })
}

/// The reservation's decision, in ONE statement (`reserve.sql`): `stock_reserved` with the
/// units out of stock when it `fits`, else `rejected_out_of_stock` with its promised units back
/// and its `order.rejected` message.
/// Returns the status the order moved to.
async fn record_reservation(
    tx: &mut sqlx::PgConnection,
    order: &Order,
    fits: bool,
) -> anyhow::Result<OrderStatus> {
    let reason = FailureReason::OutOfStock;
    let rejected = OrderNotification::of(order, OrderStatus::RejectedOutOfStock, Some(reason));
    sqlx::query_file_scalar!(
        "src/domain/steps/fulfilment/reserve.sql",
        order.id as _,
        &order.product_id as _,
        fits,
        order.quantity as _,
        Uuid::now_v7(),
        serde_json::to_value(&rejected).context("a notification serializes")?,
        reason.as_str(),
    )
    .fetch_one(tx)
    .await
    .context("failed to reserve stock")
}
