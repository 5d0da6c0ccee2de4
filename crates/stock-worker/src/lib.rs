//! `stock-worker`: for each stock-check message, reserve the order's stock, then capture its
//! payment or cancel it.
//!
//! [`StockCheck::handle_one`] is the whole step, and resumes from the order's current status,
//! so a redelivered, duplicated or redriven message continues where the last attempt stopped
//! and never does a step twice:
//!
//! | status | step |
//! |---|---|
//! | `authorized` | ONE transaction: compare-and-set to `stock_reserved` and take the units (`stock >= q`); if short, `rejected_out_of_stock` and `order.rejected` instead |
//! | `stock_reserved` | capture (outside any transaction, Stripe key per order), then `paid` + `order.paid`; a refused capture → `capture_failed`, stock back, `order.rejected` |
//! | `rejected_out_of_stock`, `capture_failed` | cancel the authorization if not yet released (Stripe key per order) |
//! | `paid`, `payment_declined`, released | nothing: delete the message |
//!
//! The cancel comes after the commit that decides it, so no worker can cancel an
//! authorization another worker is about to capture.

use std::sync::Arc;

use anyhow::Context;
use orderfleet::consumer::{Handler, Outcome, Received};
use orderfleet::order::{self, Order, OrderNotification, OrderStatus};
use orderfleet::outbox::{self, Envelope, EventType, NewMessage};
use orderfleet::payments::{PaymentError, Payments};
use sqlx::PgPool;

/// The worker's step, with what it needs.
#[derive(Clone)]
pub struct StockCheck {
    pub pool: PgPool,
    pub payments: Payments,
}

/// Why a message will not be processed, ever (it goes to the DLQ).
fn poison(reason: impl Into<String>) -> Outcome {
    Outcome::Poison { reason: reason.into() }
}

impl Handler for StockCheck {
    async fn handle(&self, batch: Vec<Received>) -> Vec<Outcome> {
        // Each message on its own: the bound on concurrency is the consumer's semaphore.
        futures::future::join_all(batch.iter().map(|m| self.handle_one(&m.body))).await
    }
}

impl StockCheck {
    /// Handles one message body. Public so tests can drive it without SQS.
    pub async fn handle_one(&self, body: &str) -> Outcome {
        let envelope: Envelope = match serde_json::from_str(body) {
            Ok(e) => e,
            Err(e) => return poison(format!("not a message envelope: {e}")),
        };
        if EventType::parse(&envelope.event_type) != Some(EventType::StockCheckRequested) {
            return poison(format!("unknown event type {:?} on the stock-check queue", envelope.event_type));
        }
        match self.advance(envelope.order_id).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Retry { reason: format!("{e:#}") },
        }
    }

    /// Moves the order forward until it needs nothing more from this message.
    async fn advance(&self, order_id: uuid::Uuid) -> anyhow::Result<Outcome> {
        // Each pass does one step and re-reads; a handful of passes covers the longest path
        // (authorized → stock_reserved → paid), the bound only guards against a bug looping.
        for _ in 0..6 {
            let Some(order) = order::load(&self.pool, order_id).await.context("failed to load the order")?
            else {
                return Ok(poison(format!("unknown order {order_id}")));
            };
            match order.status {
                OrderStatus::Authorized => self.reserve(&order).await?,
                OrderStatus::StockReserved => match self.capture(&order).await? {
                    Some(outcome) => return Ok(outcome),
                    None => continue,
                },
                OrderStatus::RejectedOutOfStock | OrderStatus::CaptureFailed => {
                    return self.release_authorization(&order).await;
                }
                OrderStatus::Paid | OrderStatus::PaymentDeclined => return Ok(Outcome::Done),
                OrderStatus::PendingAuthorization => {
                    // A stock check is only enqueued with the move to `authorized`.
                    return Ok(poison(format!("order {order_id} is still pending authorization")));
                }
            }
        }
        anyhow::bail!("order {order_id} did not settle")
    }

    /// ONE transaction: the order's compare-and-set and the stock it takes (or its rejection).
    async fn reserve(&self, order: &Order) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await.context("failed to begin")?;
        let moved =
            order::transition(&mut *tx, order.id, OrderStatus::Authorized, OrderStatus::StockReserved, None)
                .await
                .context("failed to reserve the order")?;
        if !moved {
            // Another delivery got here first; the next pass reads where it left the order.
            return Ok(());
        }
        let taken = sqlx::query(
            "UPDATE products SET stock = stock - $2, updated_at = now() WHERE id = $1 AND stock >= $2",
        )
        .bind(&order.product_id)
        .bind(order.quantity)
        .execute(&mut *tx)
        .await
        .context("failed to take stock")?;
        if taken.rows_affected() == 0 {
            // Short: the order is rejected instead, in the same transaction, so what other
            // transactions see is `authorized` → `rejected_out_of_stock`.
            sqlx::query(
                "UPDATE orders SET status = 'rejected_out_of_stock', failure_reason = 'out_of_stock', updated_at = now()
                  WHERE id = $1",
            )
            .bind(order.id)
            .execute(&mut *tx)
            .await
            .context("failed to reject the order")?;
            let rejected =
                OrderNotification::of(order, OrderStatus::RejectedOutOfStock, Some("out_of_stock"));
            outbox::enqueue(&mut tx, &[NewMessage::new(EventType::OrderRejected, order.id, rejected)])
                .await?;
        }
        tx.commit().await.context("failed to commit the reservation")?;
        Ok(())
    }

    /// Captures outside any transaction, then records the result. `Some` ends the message.
    async fn capture(&self, order: &Order) -> anyhow::Result<Option<Outcome>> {
        let Some(intent) = order.payment_intent_id.as_deref() else {
            return Ok(Some(poison(format!("order {} has no payment intent", order.id))));
        };
        match self.payments.capture(order.id, intent).await {
            Ok(_) => {
                let mut tx = self.pool.begin().await?;
                if order::transition(&mut *tx, order.id, OrderStatus::StockReserved, OrderStatus::Paid, None)
                    .await?
                {
                    let paid = OrderNotification::of(order, OrderStatus::Paid, None);
                    outbox::enqueue(&mut tx, &[NewMessage::new(EventType::OrderPaid, order.id, paid)])
                        .await?;
                }
                tx.commit().await.context("failed to commit the capture")?;
                Ok(None)
            }
            Err(PaymentError::Unavailable(reason)) => Ok(Some(Outcome::Retry { reason })),
            Err(refused) => {
                // The provider will not capture (the authorization expired or was cancelled):
                // the order fails cleanly, its stock goes back, and the user hears of it.
                let reason = format!("capture refused: {refused}");
                let mut tx = self.pool.begin().await?;
                let moved = order::transition(
                    &mut *tx,
                    order.id,
                    OrderStatus::StockReserved,
                    OrderStatus::CaptureFailed,
                    Some(&reason),
                )
                .await?;
                if moved {
                    sqlx::query("UPDATE products SET stock = stock + $2, updated_at = now() WHERE id = $1")
                        .bind(&order.product_id)
                        .bind(order.quantity)
                        .execute(&mut *tx)
                        .await?;
                    let failed = OrderNotification::of(order, OrderStatus::CaptureFailed, Some(&reason));
                    outbox::enqueue(&mut tx, &[NewMessage::new(EventType::OrderRejected, order.id, failed)])
                        .await?;
                }
                tx.commit().await?;
                Ok(None)
            }
        }
    }

    /// Cancels the authorization of an order that will not be captured, once.
    async fn release_authorization(&self, order: &Order) -> anyhow::Result<Outcome> {
        if order.authorization_released_at.is_some() {
            return Ok(Outcome::Done);
        }
        let Some(intent) = order.payment_intent_id.as_deref() else {
            order::mark_authorization_released(&self.pool, order.id).await?;
            return Ok(Outcome::Done);
        };
        match self.payments.cancel(order.id, intent).await {
            Ok(_) => {
                order::mark_authorization_released(&self.pool, order.id).await?;
                Ok(Outcome::Done)
            }
            Err(PaymentError::Unavailable(reason)) => Ok(Outcome::Retry { reason }),
            Err(refused) => {
                // Nothing left to release (already captured can't be here: the status says
                // not captured). Leave it to a person with the reason.
                Ok(poison(format!("cannot cancel the authorization of order {}: {refused}", order.id)))
            }
        }
    }
}

/// The handler, shared by the consumer's tasks.
pub fn handler(pool: PgPool, payments: Payments) -> Arc<StockCheck> {
    Arc::new(StockCheck { pool, payments })
}
