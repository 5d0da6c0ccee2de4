//! Fulfilling an authorized order: reserve its stock, then capture its payment or cancel it.
//!
//! [`Fulfilment::advance`] resumes from the order's current status, so the stock worker (for
//! each stock-check message, however often it is delivered) and the sweeper (for an order
//! whose message is gone) can both run it, even at once, and no step happens twice:
//!
//! | status | step |
//! |---|---|
//! | `authorized` | ONE transaction: take the units (`stock >= q`) and compare-and-set to `stock_reserved`; if short, compare-and-set to `rejected_out_of_stock` with `order.rejected` instead |
//! | `stock_reserved` | capture (outside any transaction, Stripe key per order), then ONE transaction: `paid` + `order.paid`; a refused capture → `capture_failed`, stock back, `order.rejected` |
//! | `rejected_out_of_stock`, `capture_failed` | cancel the authorization once (Stripe key per order), and record that it is released |
//! | `paid`, `payment_declined`, released | nothing |
//!
//! The cancel comes after the commit that decides it, so no worker cancels an authorization
//! another is about to capture. Transactions lock the product row before the order row,
//! always, so two of them never wait on each other in a circle.

use anyhow::Context;
use sqlx::PgPool;
use uuid::Uuid;

use crate::order::{self, Order, OrderNotification, OrderStatus};
use crate::outbox::{self, EventType, NewMessage};
use crate::payments::{PaymentError, Payments};

/// Where an order stands after [`Fulfilment::advance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Nothing more to do for it.
    Settled,
    /// A dependency failed for now (Stripe, the database): try again later.
    Blocked { reason: String },
    /// It can never go on as it is; a person must look (the reason says why).
    Stuck { reason: String },
}

#[derive(Clone)]
pub struct Fulfilment {
    pub pool: PgPool,
    pub payments: Payments,
}

impl Fulfilment {
    /// Moves the order forward until it needs nothing more.
    pub async fn advance(&self, order_id: Uuid) -> Progress {
        match self.try_advance(order_id).await {
            Ok(progress) => progress,
            Err(e) => Progress::Blocked { reason: format!("{e:#}") },
        }
    }

    async fn try_advance(&self, order_id: Uuid) -> anyhow::Result<Progress> {
        // Each pass does one step and re-reads; the longest path (authorized → stock_reserved
        // → paid) takes three, and the bound only guards against a bug looping.
        for _ in 0..6 {
            let Some(order) = order::load(&self.pool, order_id).await.context("failed to load the order")?
            else {
                return Ok(Progress::Stuck { reason: format!("unknown order {order_id}") });
            };
            match order.status {
                OrderStatus::Authorized => self.reserve(&order).await?,
                OrderStatus::StockReserved => {
                    if let Some(progress) = self.capture(&order).await? {
                        return Ok(progress);
                    }
                }
                OrderStatus::RejectedOutOfStock | OrderStatus::CaptureFailed => {
                    return self.release_authorization(&order).await;
                }
                OrderStatus::Paid | OrderStatus::PaymentDeclined => return Ok(Progress::Settled),
                OrderStatus::PendingAuthorization => {
                    // Fulfilment starts only after the move to `authorized`.
                    return Ok(Progress::Stuck {
                        reason: format!("order {order_id} is still pending authorization"),
                    });
                }
            }
        }
        anyhow::bail!("order {order_id} did not settle")
    }

    /// ONE transaction: the units and the order's compare-and-set (or its rejection).
    async fn reserve(&self, order: &Order) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await.context("failed to begin")?;
        let taken = sqlx::query(
            "UPDATE products SET stock = stock - $2, updated_at = now() WHERE id = $1 AND stock >= $2",
        )
        .bind(&order.product_id)
        .bind(order.quantity)
        .execute(&mut *tx)
        .await
        .context("failed to take stock")?;
        let reserved = taken.rows_affected() == 1;
        let (to, reason) = if reserved {
            (OrderStatus::StockReserved, None)
        } else {
            (OrderStatus::RejectedOutOfStock, Some("out_of_stock"))
        };
        let moved = order::transition(&mut *tx, order.id, OrderStatus::Authorized, to, reason)
            .await
            .context("failed to move the order")?;
        if !moved {
            // Another delivery got here first; rolling back gives the units back, and the next
            // pass reads where the other left the order.
            tx.rollback().await.context("failed to roll back")?;
            return Ok(());
        }
        if !reserved {
            let rejected =
                OrderNotification::of(order, OrderStatus::RejectedOutOfStock, Some("out_of_stock"));
            outbox::enqueue(&mut tx, &[NewMessage::new(EventType::OrderRejected, order.id, rejected)])
                .await?;
        }
        tx.commit().await.context("failed to commit the reservation")?;
        if reserved {
            crate::failpoint::hit("after_reserve");
        }
        Ok(())
    }

    /// Captures outside any transaction, then records the result. `Some` ends the pass.
    async fn capture(&self, order: &Order) -> anyhow::Result<Option<Progress>> {
        let Some(intent) = order.payment_intent_id.as_deref() else {
            return Ok(Some(Progress::Stuck { reason: format!("order {} has no payment intent", order.id) }));
        };
        match self.payments.capture(order.id, intent).await {
            Ok(_) => {
                crate::failpoint::hit("after_capture");
                let mut tx = self.pool.begin().await?;
                if order::transition(&mut *tx, order.id, OrderStatus::StockReserved, OrderStatus::Paid, None)
                    .await?
                {
                    let paid = OrderNotification::of(order, OrderStatus::Paid, None);
                    outbox::enqueue(&mut tx, &[NewMessage::new(EventType::OrderPaid, order.id, paid)])
                        .await?;
                }
                tx.commit().await.context("failed to commit the capture")?;
                crate::failpoint::hit("after_paid");
                Ok(None)
            }
            Err(PaymentError::Unavailable(reason)) => Ok(Some(Progress::Blocked { reason })),
            Err(refused) => {
                // The provider will not capture (the authorization expired or was cancelled):
                // the order fails cleanly, its units go back, and the user hears of it.
                let reason = format!("capture refused: {refused}");
                let mut tx = self.pool.begin().await?;
                sqlx::query("UPDATE products SET stock = stock + $2, updated_at = now() WHERE id = $1")
                    .bind(&order.product_id)
                    .bind(order.quantity)
                    .execute(&mut *tx)
                    .await?;
                let moved = order::transition(
                    &mut *tx,
                    order.id,
                    OrderStatus::StockReserved,
                    OrderStatus::CaptureFailed,
                    Some(&reason),
                )
                .await?;
                if !moved {
                    tx.rollback().await?;
                    return Ok(None);
                }
                let failed = OrderNotification::of(order, OrderStatus::CaptureFailed, Some(&reason));
                outbox::enqueue(&mut tx, &[NewMessage::new(EventType::OrderRejected, order.id, failed)])
                    .await?;
                tx.commit().await?;
                Ok(None)
            }
        }
    }

    /// Cancels the authorization of an order that will not be captured, once.
    async fn release_authorization(&self, order: &Order) -> anyhow::Result<Progress> {
        if order.authorization_released_at.is_some() {
            return Ok(Progress::Settled);
        }
        let Some(intent) = order.payment_intent_id.as_deref() else {
            order::mark_authorization_released(&self.pool, order.id).await?;
            return Ok(Progress::Settled);
        };
        match self.payments.cancel(order.id, intent).await {
            Ok(_) => {
                order::mark_authorization_released(&self.pool, order.id).await?;
                Ok(Progress::Settled)
            }
            Err(PaymentError::Unavailable(reason)) => Ok(Progress::Blocked { reason }),
            Err(refused) => Ok(Progress::Stuck {
                reason: format!("cannot cancel the authorization of order {}: {refused}", order.id),
            }),
        }
    }
}
