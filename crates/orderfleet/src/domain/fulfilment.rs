//! Fulfilling an authorized order: reserve its stock, then capture its payment or cancel it.
//!
//! [`Fulfilment::advance`] resumes from the order's current status, so the stock worker (for
//! each stock-check message, however often it is delivered) and the sweeper (for an order
//! whose message is gone) can both run it, even at once, and no step happens twice:
//!
//! | status | step |
//! |---|---|
//! | `authorized` | ONE transaction, order row then product row locked: take the units if they are left after every order ahead in line has taken its own, and compare-and-set to `stock_reserved`; if short (only after a cut), compare-and-set to `rejected_out_of_stock` with `order.rejected` instead, giving its promised units back |
//! | `stock_reserved` | capture (outside any transaction, Stripe key per order), then ONE transaction: `paid` + `order.paid`; a refused capture → `capture_failed`, units back (stock and promise), `order.rejected` |
//! | `rejected_out_of_stock`, `capture_failed` | cancel the authorization once (Stripe key per order), and record that it is released |
//! | `paid`, `payment_declined`, released | nothing |
//!
//! Most orders come already `stock_reserved`: the commit that authorized them took their units
//! when nothing was cut (`order::Transition::apply`), and their stock check says what to
//! capture, so the worker captures first and reads the order only if that does not go cleanly
//! ([`Fulfilment::capture_reserved`]).
//!
//! The cancel comes after the commit that decides it, so no worker cancels an authorization
//! another is about to capture. Statements lock the order row before the product row,
//! always, so two of them never wait on each other in a circle.

use std::time::Duration;

use crate::runtime::db::Pool;
use anyhow::Context;
use uuid::Uuid;

use crate::domain::OrderId;

use crate::domain::order::{
    self, FailureReason, Order, OrderNotification, OrderStatus, StatusSet, Transition,
};
use crate::domain::outbox::{EventType, ReservedAtCommit};
use crate::domain::payments::{Intent, IntentStatus, OrderIntent, PaymentError, Payments};
use crate::runtime::failure::{Failure, Outcome, Source};

/// Whether an order of `quantity` finds its units when `stock` units are not yet taken and
/// `ahead` are the quantities of the orders ahead of it in line that have not taken theirs, in
/// line order. Each order ahead takes its units if they are there when its turn comes, and
/// otherwise is rejected and takes none; so an order behind one too large for what is left
/// may still be served, and no unit stays unsold while a buyer in line could have had it.
pub fn fits_in_line(stock: i32, ahead: &[i32], quantity: i32) -> bool {
    let mut left = stock;
    for &wanted in ahead {
        if wanted <= left {
            left -= wanted;
        }
    }
    quantity <= left
}

/// Whether an order of `quantity` finds its units when `stock` units are not yet taken and
/// `ahead` are the orders ahead of it in line that have not taken theirs, each with whether it
/// is still pending authorization (it may yet take its units, or be declined and take none):
/// `Some` when every way the pending ones can go gives the same answer, `None` when it
/// depends on them. [`fits_in_line`] lets an order too large for what is left be passed over,
/// so the answer is not monotonic in what the pending orders do, and every combination is
/// tried; past `MOST_PENDING_WEIGHED` pending orders ahead it is `None` (wait) unless the
/// units cover every order ahead outright.
pub fn fits_whatever_the_pending_do(stock: i32, ahead: &[(i32, bool)], quantity: i32) -> Option<bool> {
    let everyone: i64 = ahead.iter().map(|(q, _)| i64::from(*q)).sum();
    if i64::from(stock) - everyone >= i64::from(quantity) {
        return Some(true);
    }
    let pending: Vec<usize> = (0..ahead.len()).filter(|&i| ahead[i].1).collect();
    if pending.len() > MOST_PENDING_WEIGHED {
        return None;
    }
    let mut answers = (0u32..1 << pending.len()).map(|taken| {
        let line: Vec<i32> = ahead
            .iter()
            .enumerate()
            .filter(|(i, (_, is_pending))| {
                !is_pending || pending.iter().position(|p| p == i).is_some_and(|bit| taken & (1 << bit) != 0)
            })
            .map(|(_, (q, _))| *q)
            .collect();
        fits_in_line(stock, &line, quantity)
    });
    let first = answers.next().expect("at least one combination");
    answers.all(|answer| answer == first).then_some(first)
}

/// The most pending orders ahead whose every outcome is weighed (2^n combinations).
pub(crate) const MOST_PENDING_WEIGHED: usize = 10;

/// The code of the failure that says an order's turn waits on a pending order ahead of it.
pub const WAITING_FOR_THE_LINE: &str = "waiting_for_the_line";

/// What the reservation statement ([`Fulfilment::arrive`]) did, and so what is left to do.
enum Arrival {
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
enum Reserved {
    /// This step moved the order (to `stock_reserved` or `rejected_out_of_stock`).
    Moved(OrderStatus),
    /// Another delivery had already moved it.
    Lost,
    /// Whether its units are left depends on an order ahead still pending authorization.
    Waiting(String),
    /// Its hold is past its deadline: it takes no units ([`Fulfilment::lapse`]).
    Lapsed,
}

/// What a capture step did.
enum Captured {
    /// This step moved the order (to `paid` or `capture_failed`).
    Moved(OrderStatus),
    /// Another delivery had already moved it.
    Lost,
    /// Stripe did not answer.
    Blocked(String),
}

/// The stock worker's steps for an authorized order.
#[derive(Clone)]
pub struct Fulfilment {
    /// The database.
    pub pool: Pool,
    /// Stripe.
    pub payments: Payments,
}

impl Fulfilment {
    /// Moves the order forward until it needs nothing more (`Ok`), or says why it could not go
    /// on: Stripe or the database down (an outage), a passing database failure (transient), or
    /// a state no step can go on from (permanent: a person must look). A database error is classified
    /// where it happens ([`crate::runtime::db::failure`]): the database unreachable is an outage (the
    /// worker pauses and probes), a data or integrity error is this order's for good (its
    /// message goes to the DLQ with the reason, the worker goes on), anything else comes back
    /// soon.
    pub async fn advance(&self, order_id: OrderId) -> Outcome {
        self.try_advance(order_id).await.unwrap_or_else(|e| Err(crate::runtime::db::failure(&e)))
    }

    /// A stock check whose authorization's commit took the order's units (nothing was cut):
    /// the capture at once, under the attempt the message names, then ONE statement records
    /// `paid` with `order.paid`. The order is not read first: the capture's key is the one its
    /// reservation was made under, so a second delivery gets Stripe's saved answer and then
    /// finds the order moved, and whatever else moved it (a lapsed hold's webhook) left a
    /// hold that cannot be captured. The message is taken this way only while Stripe keeps
    /// that key (`Envelope::captures_from_its_payload`).
    ///
    /// Stripe unavailable holds the message, as any capture does. Anything else but a clean
    /// capture and record — a saved 5xx, a refusal, the order found elsewhere — goes the way of
    /// any stock check ([`Fulfilment::advance`]): the order read, and advanced from its status
    /// under its attempt as it is now. (A saved 5xx moves the order to its next attempt; a
    /// message that kept capturing under its own would never get past it:
    /// `crates/order-model`, `MessageRule::OnToTheOrdersAttempt`.) A captured intent that
    /// is not the order's (a message that lies) records nothing and is left to a person.
    pub async fn capture_reserved(&self, reserved: &ReservedAtCommit) -> Outcome {
        let order = &reserved.order;
        let intent = OrderIntent {
            order_id: order.order_id,
            attempt: reserved.attempt,
            id: &reserved.payment_intent_id,
        };
        crate::runtime::failpoint::hit("after_reserve");
        match self.payments.capture(intent).await {
            Ok(captured) if captured.order_id.as_deref().is_some_and(|o| o != order.order_id.to_string()) => {
                let reason = format!("the message's PaymentIntent {} is not this order's", captured.id);
                tracing::error!(reason, "a stock check names another order's PaymentIntent");
                return Err(Failure::permanent(Source::Message, "not_the_orders_intent", reason));
            }
            Ok(_) => {}
            Err(PaymentError::Unavailable(why)) => {
                return Err(Failure::outage(Source::Stripe, "unavailable", why));
            }
            Err(_) => return self.advance(order.order_id).await,
        }
        let paid = OrderNotification { status: OrderStatus::Paid, reason: None, ..order.clone() };
        match self.record_paid(order.order_id, paid).await {
            Ok(true) => {
                crate::runtime::failpoint::hit("after_paid");
                Ok(())
            }
            // Another delivery moved it: what is left, if anything, is read from the order.
            Ok(false) => self.advance(order.order_id).await,
            Err(e) => Err(crate::runtime::db::failure(&e)),
        }
    }

    /// The steps; `Err` is a database error, classified by [`Fulfilment::advance`].
    async fn try_advance(&self, order_id: OrderId) -> anyhow::Result<Outcome> {
        let stuck = |code: &str, reason: String| Ok(Err(Failure::permanent(Source::Order, code, reason)));
        // Every database step is bounded ([`crate::runtime::db::bounded`]): a connection frozen
        // mid-exchange is an outage, not a message held forever. The first step loads the
        // order and, if `authorized`, reserves its units: one statement.
        let arrived = crate::runtime::db::bounded("failed to reserve stock", self.arrive(order_id)).await?;
        let Some((mut order, mut arrival)) = arrived else {
            let reason = format!("unknown order {order_id}");
            return Ok(Err(Failure::permanent(Source::Message, "unknown_order", reason)));
        };
        // Each pass does one step; one that lost its compare-and-set reads the order again. The
        // longest path takes three passes; the bound only guards against a bug looping.
        for _ in 0..6 {
            let moved = match order.status {
                OrderStatus::Authorized => {
                    // The first step may have found stock cut (the line must be read), or the
                    // hold past its deadline.
                    let arrival = std::mem::replace(&mut arrival, Arrival::AsItWas);
                    match self.reserve_step(&order, arrival).await? {
                        Ok(moved) => moved,
                        Err(waiting) => return Ok(Err(waiting)),
                    }
                }
                OrderStatus::StockReserved if order.payment_intent_id.is_none() => {
                    return stuck("no_payment_intent", format!("order {order_id} has no payment intent"));
                }
                OrderStatus::StockReserved => match self.capture(&order).await? {
                    Captured::Moved(status) => Some(status),
                    Captured::Lost => None,
                    Captured::Blocked(why) => {
                        return Ok(Err(Failure::outage(Source::Stripe, "unavailable", why)));
                    }
                },
                // Ended holding funds, or on a hold past its deadline (Stripe cancelled it; a cancel
                // under the order's key makes sure): released unless it is already.
                OrderStatus::RejectedOutOfStock
                | OrderStatus::CaptureFailed
                | OrderStatus::AuthorizationCanceled => {
                    return self.release_authorization(&order).await;
                }
                // Ended, and holding nothing: a cancelled hold is gone already.
                status if status.set() != StatusSet::HoldsUnits => return Ok(Ok(())),
                // Fulfilment starts only after the move to `authorized`.
                _ => {
                    return stuck(
                        "not_authorized",
                        format!("order {order_id} is still pending authorization"),
                    );
                }
            };
            match moved {
                Some(status) => order.status = status,
                None => match self.load(order_id).await? {
                    Some(now) => order = now,
                    None => return stuck("order_disappeared", format!("order {order_id} disappeared")),
                },
            }
        }
        anyhow::bail!("order {order_id} did not settle")
    }

    /// The order as it is now, read within the step deadline.
    async fn load(&self, order_id: OrderId) -> anyhow::Result<Option<Order>> {
        crate::runtime::db::bounded("failed to load the order", async {
            order::load(&self.pool, order_id).await.map_err(anyhow::Error::from)
        })
        .await
    }

    /// The `authorized` step: the reservation, with the line read when the first step found
    /// stock short, or the end of an order whose hold the first step found past its deadline.
    /// `Some` of the status it moved the order to, `None` when another delivery moved it
    /// first, `Err` when the order waits for an order ahead still pending.
    async fn reserve_step(
        &self,
        order: &Order,
        arrival: Arrival,
    ) -> anyhow::Result<Result<Option<OrderStatus>, Failure>> {
        let reserved = async {
            match arrival {
                Arrival::Short => self.reserve_in_line(order).await,
                Arrival::Lapsed => Ok(Reserved::Lapsed),
                Arrival::Reserved | Arrival::AsItWas => self.reserve(order).await,
            }
        };
        Ok(match crate::runtime::db::bounded("failed to reserve stock", reserved).await? {
            Reserved::Moved(status) => Ok(Some(status)),
            Reserved::Lost => Ok(None),
            Reserved::Lapsed => {
                let lapsed = crate::runtime::db::bounded("failed to end a lapsed hold", self.lapse(order));
                Ok(lapsed.await?.then_some(OrderStatus::AuthorizationCanceled))
            }
            Reserved::Waiting(reason) => {
                let waiting = Failure::transient(Source::Order, WAITING_FOR_THE_LINE, reason);
                Err(waiting.retry_in(Duration::from_secs(5)))
            }
        })
    }

    /// The reservation's ONE statement, and a delivery's first step: the order as it is, and,
    /// if it is `authorized`, its units taken on [`Fulfilment::reserve`]'s condition (nothing
    /// was cut). `None`: no such order. The order comes back as this statement left
    /// it: `stock_reserved` if it moved it; otherwise as the statement's snapshot saw it, which
    /// may predate another delivery's move (the next step's compare-and-set finds out).
    async fn arrive(&self, order_id: OrderId) -> anyhow::Result<Option<(Order, Arrival)>> {
        // Claims the order if it is `$2` (`authorized`), takes its units if nothing was cut, and
        // moves it to `$3` (`stock_reserved`). The order comes back either way, with whether it
        // was claimed: as the statement's snapshot saw it, with the move's status and time. (The
        // snapshot predates the claim's lock; nothing changes an order's other columns while it
        // is `authorized`, so they are the moved row's too. A writer that did would read them
        // from `moved` here.)
        let row = sqlx::query!(
            r#"WITH claim AS (
                 SELECT id, product_id, quantity, (authorization_expires_at < now()) IS TRUE AS lapsed
                   FROM orders WHERE id = $1 AND status = $2 FOR UPDATE
             ), taken AS (
                 UPDATE products p SET stock = p.stock - c.quantity, updated_at = now()
                   FROM claim c
                  WHERE p.id = c.product_id AND NOT c.lapsed
                    AND p.units_promised <= p.units_total AND p.stock >= c.quantity
              RETURNING p.id
             ), moved AS (
                 UPDATE orders SET status = $3, updated_at = now()
                  WHERE id IN (SELECT id FROM claim) AND EXISTS (SELECT 1 FROM taken)
              RETURNING updated_at
             )
             SELECT id AS "id: OrderId", user_id AS "user_id: crate::domain::UserId", request_hash,
                    product_id AS "product_id: crate::domain::Sku", quantity AS "quantity: crate::domain::Quantity",
                    amount_minor, currency AS "currency: crate::domain::Currency", payment_method,
                    CASE WHEN EXISTS (SELECT 1 FROM moved) THEN $3 ELSE status END AS "status!: OrderStatus",
                    position, payment_intent_id, failure_reason AS "failure_reason: FailureReason",
                    authorization_released_at, traceparent,
                    payment_attempt, payment_attempt_failed, payment_attempt_at, client_secret, next_action, action_expires_at,
                    intake_lease_until, created_at, COALESCE((SELECT updated_at FROM moved), updated_at) AS "updated_at!",
                    EXISTS (SELECT 1 FROM claim) AS "claimed!",
                    EXISTS (SELECT 1 FROM claim WHERE lapsed) AS "lapsed!"
               FROM orders WHERE id = $1"#,
            order_id as _,
            OrderStatus::Authorized as _,
            OrderStatus::StockReserved as _,
        )
        .fetch_optional(&self.pool)
        .await
        .context("failed to reserve stock")?;
        let Some(row) = row else { return Ok(None) };
        let (claimed, lapsed) = (row.claimed, row.lapsed);
        let order = order::order_from!(row);
        let arrival = match (claimed, order.status) {
            (true, OrderStatus::StockReserved) => {
                crate::runtime::failpoint::hit("after_reserve");
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
    async fn reserve(&self, order: &Order) -> anyhow::Result<Reserved> {
        // The statement of a delivery's first step, which does this for the order by its id.
        match self.arrive(order.id).await? {
            Some((_, Arrival::Reserved)) => Ok(Reserved::Moved(OrderStatus::StockReserved)),
            Some((_, Arrival::Short)) => self.reserve_in_line(order).await,
            Some((_, Arrival::Lapsed)) => Ok(Reserved::Lapsed),
            Some((_, Arrival::AsItWas)) | None => Ok(Reserved::Lost),
        }
    }

    /// After a cut: ONE short transaction: lock the order if it is still `authorized`, then
    /// the product row, then decide with the line in view: the order takes its units only if they are
    /// still there **after every order ahead of it in line** that has not taken its own
    /// ([`fits_in_line`]); it moves to `stock_reserved` and the units leave `stock` (never below
    /// zero). If not, it moves to `rejected_out_of_stock` with its `order.rejected` message, and
    /// its promised units go back to the product. An order ahead still pending authorization
    /// may take its units or be declined and take none: when the answer depends on which, the
    /// order waits ([`Reserved::Waiting`]), so it is neither rejected for a unit that then
    /// goes unsold nor given one that an order ahead of it then needs.
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
    async fn reserve_in_line(&self, order: &Order) -> anyhow::Result<Reserved> {
        let mut tx = crate::runtime::db::begin(&self.pool).await.context("failed to begin a reservation")?;
        let locked = sqlx::query!(
            r#"SELECT position, (authorization_expires_at < now()) IS TRUE AS "lapsed!"
                 FROM orders WHERE id = $1 AND status = $2 FOR UPDATE"#,
            order.id as _,
            OrderStatus::Authorized as _,
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
            Ok(fits) => fits,
            Err(waiting) => {
                tx.rollback().await.context("failed to end the reservation")?;
                return Ok(waiting);
            }
        };
        let status = record_reservation(&mut tx, order, fits).await?;
        tx.commit().await.context("failed to commit the reservation")?;
        if status == OrderStatus::StockReserved {
            crate::runtime::failpoint::hit("after_reserve");
        }
        Ok(Reserved::Moved(status))
    }

    /// Captures outside any transaction, then records the result in one statement.
    async fn capture(&self, order: &Order) -> anyhow::Result<Captured> {
        let Some(intent) = order.payment_intent_id.as_deref() else {
            // Cannot happen (an authorized order has its intent); a person must look.
            anyhow::bail!("order {} has no payment intent", order.id);
        };
        let captured = self.payments.capture(order.intent(intent)).await;
        let captured = self.after_a_failed_attempt(order, intent, IntentStatus::Succeeded, captured).await?;
        match captured {
            Ok(_) => {
                let moved =
                    self.record_paid(order.id, OrderNotification::of(order, OrderStatus::Paid, None)).await?;
                crate::runtime::failpoint::hit("after_paid");
                Ok(if moved { Captured::Moved(OrderStatus::Paid) } else { Captured::Lost })
            }
            Err(PaymentError::Unavailable(reason) | PaymentError::AttemptFailed(reason)) => {
                Ok(Captured::Blocked(reason))
            }
            Err(refused) => {
                // The provider will not capture (the authorization expired or was cancelled):
                // the order fails cleanly, its units go back, and the user hears of it. The
                // order row is locked before the product row, as in `reserve`.
                // Stripe's words are for operators (the log and `decline_detail`); the buyer,
                // in `GET` and in the notification, reads only the code.
                let detail = format!("capture refused: {refused}");
                tracing::warn!(detail, "the payment provider refused the capture");
                // A hold that is gone (it lapsed, or was cancelled in the Dashboard) is not a
                // failed capture: the order ends `authorization_canceled` (SPEC §5).
                let ended = match self.payments.retrieve(intent).await {
                    Ok(now) if now.status == IntentStatus::Canceled => OrderStatus::AuthorizationCanceled,
                    Ok(_) => OrderStatus::CaptureFailed,
                    Err(e) if e.is_transient() => return Ok(Captured::Blocked(e.to_string())),
                    Err(_) => OrderStatus::CaptureFailed,
                };
                crate::runtime::db::bounded(
                    "failed to record the refused capture",
                    self.fail_capture(order, &detail, ended),
                )
                .await
            }
        }
    }

    /// After a capture: ONE statement (bounded) moves the order `stock_reserved` → `paid` with
    /// its `order.paid` message; whether this call made the move.
    async fn record_paid(&self, order_id: OrderId, paid: OrderNotification) -> anyhow::Result<bool> {
        crate::runtime::failpoint::hit("after_capture");
        let record = Transition::new(order_id, OrderStatus::StockReserved, OrderStatus::Paid)
            .with_message(EventType::OrderPaid, paid)
            .apply(&self.pool);
        crate::runtime::db::bounded("failed to record the capture", async {
            record.await.map_err(anyhow::Error::from)
        })
        .await
    }

    /// A capture Stripe refused: ONE statement moves the order to `ended` — `capture_failed`,
    /// or `authorization_canceled` when its hold is gone (no cancel then) — with its
    /// `order.rejected` message, keeps Stripe's `detail` where only operators look, and gives
    /// its units back to the stock and the door.
    async fn fail_capture(
        &self,
        order: &Order,
        detail: &str,
        ended: OrderStatus,
    ) -> anyhow::Result<Captured> {
        let reason = match ended {
            OrderStatus::AuthorizationCanceled => FailureReason::AuthorizationCanceled,
            _ => FailureReason::CaptureFailed,
        };
        let failed = OrderNotification::of(order, ended, Some(reason));
        let transition = Transition::new(order.id, OrderStatus::StockReserved, ended)
            .with_reason(reason)
            .with_message(EventType::OrderRejected, failed)
            .giving_units_back(detail);
        let transition = match ended {
            OrderStatus::AuthorizationCanceled => transition.with_hold_released(),
            _ => transition,
        };
        Ok(match transition.apply(&self.pool).await? {
            true => Captured::Moved(ended),
            false => Captured::Lost,
        })
    }

    /// After Stripe answered a capture or a cancel with a 5xx, which it saved under the
    /// attempt's key (a retry with the key would get it again for 24 hours): asks Stripe what
    /// the attempt did, from the intent itself (a retrieve is never stale). Already where the
    /// call wanted it (`wanted`; for a cancel, also never holding funds): done. Still holding
    /// funds: the attempt did nothing, so the order moves to its next attempt, whose new keys
    /// the step uses when it runs again (the failure stays, and the message is held until
    /// Stripe answers). Any other state is the call's refusal. Other results pass through.
    async fn after_a_failed_attempt(
        &self,
        order: &Order,
        intent: &str,
        wanted: IntentStatus,
        result: Result<Intent, PaymentError>,
    ) -> anyhow::Result<Result<Intent, PaymentError>> {
        let Err(PaymentError::AttemptFailed(reason)) = result else { return Ok(result) };
        let now = match self.payments.retrieve(intent).await {
            Ok(now) => now,
            Err(e) => return Ok(Err(PaymentError::Unavailable(format!("{reason}; then {e}")))),
        };
        let released = wanted == IntentStatus::Canceled && now.status == IntentStatus::RequiresPaymentMethod;
        if now.status == wanted || released {
            return Ok(Ok(now));
        }
        if now.status != IntentStatus::RequiresCapture {
            let message = format!("{reason}; the intent is now {:?}", now.status);
            return Ok(Err(PaymentError::Refused {
                code: "payment_intent_unexpected_state".into(),
                message,
                status: 400,
            }));
        }
        let next = crate::runtime::db::bounded("failed to start the next payment attempt", async {
            order::next_payment_attempt(
                &self.pool,
                order.id,
                order.status,
                order.payment_attempt,
                Duration::ZERO,
            )
            .await
            .map_err(anyhow::Error::from)
        })
        .await?;
        tracing::warn!(
            attempt = next,
            reason,
            "Stripe saved a failure under this attempt's key and did nothing; the next attempt has new keys"
        );
        Ok(Err(PaymentError::AttemptFailed(format!("{reason}; nothing done, the next attempt has new keys"))))
    }

    /// Cancels the authorization of an order that will not be captured, once.
    /// An `authorized` order whose hold is past the deadline Stripe gave for it
    /// (`authorization_expires_at`): Stripe cancels such a hold by itself, so the order could
    /// never be captured. ONE statement ends it `authorization_canceled`, as the webhook of the
    /// cancelled hold would, with its `order.rejected` message and its promised units back to
    /// the door, before it takes a unit an order behind it could have had. Its hold is then
    /// released under the order's key ([`Fulfilment::release_authorization`]). Whether this
    /// call made the move.
    async fn lapse(&self, order: &Order) -> anyhow::Result<bool> {
        let reason = FailureReason::AuthorizationCanceled;
        let ended = OrderNotification::of(order, OrderStatus::AuthorizationCanceled, Some(reason));
        let moved = Transition::new(order.id, OrderStatus::Authorized, OrderStatus::AuthorizationCanceled)
            .with_reason(reason)
            .with_message(EventType::OrderRejected, ended)
            .giving_units_back(
                "the hold passed the deadline Stripe gave for it before the order's units were reserved",
            )
            .apply(&self.pool)
            .await?;
        if moved {
            tracing::warn!(
                "the order's hold is past its deadline; it takes no units, which go back to the line"
            );
        }
        Ok(moved)
    }

    async fn release_authorization(&self, order: &Order) -> anyhow::Result<Outcome> {
        if order.authorization_released_at.is_some() {
            return Ok(Ok(()));
        }
        let mark_released = || {
            crate::runtime::db::bounded("failed to record the released authorization", async {
                order::mark_authorization_released(&self.pool, order.id).await.map_err(anyhow::Error::from)
            })
        };
        let Some(intent) = order.payment_intent_id.as_deref() else {
            mark_released().await?;
            return Ok(Ok(()));
        };
        let cancelled = self.payments.cancel(order.intent(intent)).await;
        match self.after_a_failed_attempt(order, intent, IntentStatus::Canceled, cancelled).await? {
            Ok(_) => {
                mark_released().await?;
                Ok(Ok(()))
            }
            Err(PaymentError::Unavailable(reason) | PaymentError::AttemptFailed(reason)) => {
                Ok(Err(Failure::outage(Source::Stripe, "unavailable", reason)))
            }
            Err(refused) => {
                let reason = format!("cannot cancel the authorization of order {}: {refused}", order.id);
                Ok(Err(Failure::permanent(Source::Stripe, "cancel_refused", reason)))
            }
        }
    }
}

/// Whether the order's units are there after every order ahead of it in line that has not
/// taken its own ([`fits_in_line`]), read inside the reservation's transaction after the
/// product row is locked: `Err` of [`Reserved::Waiting`] when it depends on an order ahead
/// still pending authorization. In a drop with no cut the units always cover the line, so the
/// line itself is read only when its sum does not.
async fn fits_after_the_line(
    tx: &mut sqlx::PgConnection,
    order: &Order,
    position: i64,
    stock: i32,
) -> anyhow::Result<Result<bool, Reserved>> {
    // The units promised to the orders ahead of it that have not taken theirs: pending ones,
    // and authorized ones, but for a hold past its deadline, which will never take its units.
    let units_ahead = sqlx::query_scalar!(
        r#"SELECT COALESCE(sum(quantity), 0)::int8 AS "units!" FROM orders
            WHERE product_id = $1 AND position < $2
              AND (awaiting_authorization(status)
                   OR (status = $3 AND (authorization_expires_at < now()) IS NOT TRUE))"#,
        &order.product_id as _,
        position,
        OrderStatus::Authorized as _,
    )
    .fetch_one(&mut *tx)
    .await
    .context("failed to sum the units ahead")?;
    if i64::from(stock) - units_ahead >= i64::from(order.quantity.get()) {
        return Ok(Ok(true));
    }
    // A pending order ahead may yet take its units or be declined and take none. When the
    // two agree the answer is known; when they do not, this order waits for it.
    let line: Vec<(i32, bool)> = sqlx::query!(
        r#"SELECT quantity, awaiting_authorization(status) AS "pending!" FROM orders
            WHERE product_id = $1 AND position < $2
              AND (awaiting_authorization(status)
                   OR (status = $3 AND (authorization_expires_at < now()) IS NOT TRUE))
            ORDER BY position"#,
        &order.product_id as _,
        position,
        OrderStatus::Authorized as _,
    )
    .fetch_all(&mut *tx)
    .await
    .context("failed to read the line")?
    .into_iter()
    .map(|ahead| (ahead.quantity, ahead.pending))
    .collect();
    Ok(fits_whatever_the_pending_do(stock, &line, order.quantity.get()).ok_or_else(|| {
        let pending = line.iter().filter(|(_, pending)| *pending).count();
        Reserved::Waiting(format!(
            "whether order {} gets its units depends on {pending} order(s) ahead of it still pending authorization",
            order.id
        ))
    }))
}

/// The reservation's decision, in ONE statement: `$9` (`stock_reserved`) with the units out
/// of stock when it `fits` (`$3`), else `$10` (`rejected_out_of_stock`) with its promised
/// units back and its `order.rejected` message.
/// Returns the status the order moved to.
async fn record_reservation(
    tx: &mut sqlx::PgConnection,
    order: &Order,
    fits: bool,
) -> anyhow::Result<OrderStatus> {
    let reason = FailureReason::OutOfStock;
    let rejected = OrderNotification::of(order, OrderStatus::RejectedOutOfStock, Some(reason));
    sqlx::query_scalar!(
        r#"WITH product AS (
         UPDATE products
            SET stock = stock - CASE WHEN $3 THEN $4 ELSE 0 END,
                units_promised = units_promised - CASE WHEN $3 THEN 0 ELSE $4 END,
                updated_at = now()
          WHERE id = $2
     ), moved AS (
         UPDATE orders
            SET status = CASE WHEN $3 THEN $9::order_status ELSE $10::order_status END,
                failure_reason = CASE WHEN $3 THEN failure_reason ELSE $11 END,
                updated_at = now()
          WHERE id = $1
      RETURNING id, status, traceparent
     ), rejection AS (
         INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
         SELECT $5, 'order', moved.id, $7, $8, $6, moved.traceparent
           FROM moved WHERE moved.status = $10::order_status
         ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING
     )
     SELECT status AS "status: OrderStatus" FROM moved"#,
        order.id as _,
        &order.product_id as _,
        fits,
        order.quantity as _,
        Uuid::now_v7(),
        serde_json::to_value(&rejected).context("a notification serializes")?,
        EventType::OrderRejected as _,
        EventType::OrderRejected.destination() as _,
        OrderStatus::StockReserved as _,
        OrderStatus::RejectedOutOfStock as _,
        reason.as_str(),
    )
    .fetch_one(tx)
    .await
    .context("failed to reserve stock")
}

#[cfg(test)]
mod tests {
    use super::fits_in_line;

    #[test]
    fn with_enough_for_everyone_ahead_an_order_fits() {
        assert!(fits_in_line(10, &[2, 3, 1], 4));
        assert!(!fits_in_line(10, &[2, 3, 1], 5));
    }

    #[test]
    fn an_order_ahead_too_large_for_what_is_left_does_not_hold_back_the_ones_behind_it() {
        // Cut to 3: A(2) takes two, B(3) cannot and is rejected, C(1) takes the last, D(1) loses.
        assert!(fits_in_line(3, &[], 2));
        assert!(!fits_in_line(3, &[2], 3));
        assert!(fits_in_line(3, &[2, 3], 1));
        assert!(!fits_in_line(3, &[2, 3, 1], 1));
    }

    #[test]
    fn an_order_waits_when_a_pending_order_ahead_decides_its_turn_whichever_way_it_goes() {
        use super::fits_whatever_the_pending_do as decide;
        // Cut to 3: P1 (1, pending), A2 (3), then X (2). If P1 takes its unit, A2 is passed
        // over and X fits; if P1 is declined, A2 takes all three and X does not: wait.
        assert_eq!(decide(3, &[(1, true), (3, false)], 2), None);
        // Stock 2: P1 (1, pending), P2 (1, pending), A (2), then X (1). Both pending taking,
        // or neither, leave nothing for X; one of them taking leaves X its unit: wait.
        assert_eq!(decide(2, &[(1, true), (1, true), (2, false)], 1), None);
        // Whatever the pending one does, the answer is the same: decided.
        assert_eq!(decide(3, &[(1, true)], 1), Some(true));
        assert_eq!(decide(1, &[(1, false), (1, true)], 1), Some(false));
        assert_eq!(decide(10, &[(1, true), (2, false)], 3), Some(true));
    }

    #[test]
    fn nothing_left_fits_nothing() {
        assert!(!fits_in_line(0, &[], 1));
        assert!(fits_in_line(0, &[], 0));
    }
}
