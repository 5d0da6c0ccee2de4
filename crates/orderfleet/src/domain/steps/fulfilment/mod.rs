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
//!
//! By role: `line` is the arithmetic of who fits in line ([`fits_in_line`],
//! [`fits_whatever_the_pending_do`]), pure and tested on its own; `reserve` reads the line and
//! records the reservation (the SQL of the `authorized` step); `settle` captures, cancels, ends
//! a hold past its deadline, and asks Stripe what an attempt it answered with a saved 5xx did.
//! This file holds [`Fulfilment`] and its step: [`Fulfilment::advance`] and
//! [`Fulfilment::capture_reserved`], what the stock worker and the sweeper call.

mod line;
mod reserve;
mod settle;

use std::time::Duration;

use orderfleet_runtime::db::Pool;

use orderfleet_words::OrderId;

use crate::domain::records::order::{self, Order};
use crate::domain::records::outbox::OrderNotification;
use crate::domain::records::outbox::ReservedAtCommit;
use crate::domain::steps::refusal::{self, Ended};
use crate::domain::words::status::{OrderStatus, StatusSet};
pub use line::{fits_in_line, fits_whatever_the_pending_do};
use orderfleet_payments::{PaymentError, Payments, STRIPE};
use orderfleet_runtime::failure::{Failure, Outcome, Source};
use orderfleet_words::hold::OrderIntent;
use reserve::{Arrival, Reserved};
use settle::Captured;

/// What a fulfilment step came to: the one result the stock worker and the sweeper read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The order needs nothing more from this message.
    Done,
    /// The order's turn waits on a pending order ahead of it in line (after a stock cut): why.
    WaitsForTheLine(String),
    /// It could not go on; the failure says why, and so what becomes of the message.
    Failed(Failure),
}

impl Step {
    /// The message's outcome: done, or the failure. An order waiting for the line is tried
    /// again in 5 s (the worker's line keeps it instead, when it has room).
    pub fn outcome(self) -> Outcome {
        match self {
            Step::Done => Ok(()),
            Step::WaitsForTheLine(reason) => {
                Err(Failure::transient(Source::Order, "waiting_for_the_line", reason)
                    .retry_after(Duration::from_secs(5)))
            }
            Step::Failed(failure) => Err(failure),
        }
    }

    fn stuck(code: &str, reason: String) -> Self {
        Step::Failed(Failure::permanent(Source::Order, code, reason))
    }
}

impl From<Outcome> for Step {
    fn from(outcome: Outcome) -> Self {
        outcome.map_or_else(Step::Failed, |()| Step::Done)
    }
}

/// What one pass of [`Fulfilment::try_advance`]'s loop did.
enum Next {
    /// The order moved to this status.
    Moved(OrderStatus),
    /// Another delivery moved it first: read it again.
    ReadAgain,
    /// The step ends here.
    End(Step),
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
    /// where it happens ([`orderfleet_runtime::db::failure`]): the database unreachable is an outage (the
    /// worker pauses and probes), a data or integrity error is this order's for good (its
    /// message goes to the DLQ with the reason, the worker goes on), anything else comes back
    /// soon.
    pub async fn advance(&self, order_id: OrderId) -> Step {
        self.try_advance(order_id).await.unwrap_or_else(|e| Step::Failed(orderfleet_runtime::db::failure(&e)))
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
    pub async fn capture_reserved(&self, reserved: &ReservedAtCommit) -> Step {
        let order = &reserved.order;
        let intent = OrderIntent {
            order_id: order.order_id,
            attempt: reserved.attempt,
            id: &reserved.payment_intent_id,
        };
        orderfleet_runtime::failpoint::hit("after_reserve");
        match self.payments.capture(intent).await {
            Ok(captured) if captured.order_id.as_deref().is_some_and(|o| o != order.order_id.to_string()) => {
                let reason = format!("the message's PaymentIntent {} is not this order's", captured.id);
                tracing::error!(reason, "a stock check names another order's PaymentIntent");
                return Step::Failed(Failure::permanent(Source::Message, "not_the_orders_intent", reason));
            }
            Ok(_) => {}
            Err(PaymentError::Unavailable(why)) => {
                return Step::Failed(Failure::outage(STRIPE, "unavailable", why));
            }
            Err(PaymentError::Locked(why)) => return Step::Failed(PaymentError::locked_failure(why)),
            Err(_) => return self.advance(order.order_id).await,
        }
        let paid = OrderNotification { status: OrderStatus::Paid, reason: None, ..order.clone() };
        match self.record_paid(order.order_id, paid).await {
            Ok(true) => {
                orderfleet_runtime::failpoint::hit("after_paid");
                Step::Done
            }
            // Another delivery moved it: what is left, if anything, is read from the order.
            Ok(false) => self.advance(order.order_id).await,
            Err(e) => Step::Failed(orderfleet_runtime::db::failure(&e)),
        }
    }

    /// The steps; `Err` is a database error, classified by [`Fulfilment::advance`].
    async fn try_advance(&self, order_id: OrderId) -> anyhow::Result<Step> {
        // Every database step is bounded ([`orderfleet_runtime::db::bounded`]): a connection frozen
        // mid-exchange is an outage, not a message held forever. The first step loads the
        // order and, if `authorized`, reserves its units: one statement.
        let arrived =
            match orderfleet_runtime::db::bounded("failed to reserve stock", self.arrive(order_id)).await {
                Ok(arrived) => arrived,
                Err(e) => match refusal_in(&e) {
                    Some(refusal) => return self.arrival_refused(order_id, refusal).await,
                    None => return Err(e),
                },
            };
        let Some((mut order, mut arrival)) = arrived else {
            let reason = format!("unknown order {order_id}");
            return Ok(Step::Failed(Failure::permanent(Source::Message, "unknown_order", reason)));
        };
        // Each pass does one step; one that lost its compare-and-set reads the order again. The
        // longest path takes three passes; the bound only guards against a bug looping.
        for _ in 0..6 {
            let moved = match order.status {
                OrderStatus::Authorized => {
                    // The first step may have found stock cut (the line must be read), or the
                    // hold past its deadline.
                    let arrival = std::mem::replace(&mut arrival, Arrival::AsItWas);
                    self.reserve_step(&order, arrival).await?
                }
                OrderStatus::StockReserved if order.payment_intent_id.is_none() => Next::End(Step::stuck(
                    "no_payment_intent",
                    format!("order {order_id} has no payment intent"),
                )),
                OrderStatus::StockReserved => match self.capture(&order).await? {
                    Captured::Moved(status) => Next::Moved(status),
                    Captured::Lost => Next::ReadAgain,
                    Captured::Blocked(why) => {
                        Next::End(Step::Failed(Failure::outage(STRIPE, "unavailable", why)))
                    }
                    Captured::Refused(Ok(())) => Next::ReadAgain,
                    Captured::Refused(Err(stuck)) => Next::End(Step::Failed(stuck)),
                    Captured::Locked(why) => Next::End(Step::Failed(PaymentError::locked_failure(why))),
                },
                // Ended holding funds, or on a hold past its deadline (Stripe cancelled it; a cancel
                // under the order's key makes sure): released unless it is already.
                OrderStatus::RejectedOutOfStock
                | OrderStatus::CaptureFailed
                | OrderStatus::AuthorizationCanceled => Next::End(self.release_authorization(&order).await?),
                // Ended, and holding nothing: a cancelled hold is gone already.
                status if status.set() != StatusSet::HoldsUnits => Next::End(Step::Done),
                // Fulfilment starts only after the move to `authorized`.
                _ => Next::End(Step::stuck(
                    "not_authorized",
                    format!("order {order_id} is still pending authorization"),
                )),
            };
            match moved {
                Next::Moved(status) => order.status = status,
                Next::ReadAgain => match self.load(order_id).await? {
                    Some(now) => order = now,
                    None => {
                        return Ok(Step::stuck("order_disappeared", format!("order {order_id} disappeared")));
                    }
                },
                Next::End(step) => return Ok(step),
            }
        }
        anyhow::bail!("order {order_id} did not settle")
    }

    /// The order as it is now, read within the step deadline.
    async fn load(&self, order_id: OrderId) -> anyhow::Result<Option<Order>> {
        orderfleet_runtime::db::bounded("failed to load the order", async {
            order::load(&self.pool, order_id).await.map_err(anyhow::Error::from)
        })
        .await
    }

    /// The `authorized` step: the reservation, with the line read when the first step found
    /// stock short, or the end of an order whose hold the first step found past its deadline.
    /// The status it moved the order to, that another delivery moved it first, or the end of
    /// the step: the order waits for an order ahead still pending, or its refusal's end.
    async fn reserve_step(&self, order: &Order, arrival: Arrival) -> anyhow::Result<Next> {
        let reserved = async {
            match arrival {
                Arrival::Short => self.reserve_in_line(order).await,
                Arrival::Lapsed => Ok(Reserved::Lapsed),
                Arrival::Reserved | Arrival::AsItWas => self.reserve(order).await,
            }
        };
        let reserved = match orderfleet_runtime::db::bounded("failed to reserve stock", reserved).await {
            Ok(reserved) => reserved,
            Err(e) => match refusal_in(&e) {
                Some(refusal) => return Ok(self.after_refusal(order, refusal).await),
                None => return Err(e),
            },
        };
        Ok(match reserved {
            Reserved::Moved(status) => Next::Moved(status),
            Reserved::Lost => Next::ReadAgain,
            Reserved::Lapsed => {
                let lapsed =
                    orderfleet_runtime::db::bounded("failed to end a lapsed hold", self.lapse(order)).await;
                match lapsed {
                    Ok(true) => Next::Moved(OrderStatus::AuthorizationCanceled),
                    Ok(false) => Next::ReadAgain,
                    Err(e) => match refusal_in(&e) {
                        Some(refusal) => self.after_refusal(order, refusal).await,
                        None => return Err(e),
                    },
                }
            }
            Reserved::Waiting(reason) => Next::End(Step::WaitsForTheLine(reason)),
        })
    }

    /// [`Fulfilment::refused`], then the order read again (it ended), or the step's end.
    async fn after_refusal(&self, order: &Order, refusal: &sqlx::Error) -> Next {
        match self.refused(order, refusal).await {
            Ok(()) => Next::ReadAgain,
            Err(stuck) => Next::End(Step::Failed(stuck)),
        }
    }

    /// A move of `order` the database refused for good: the one rule of
    /// [`crate::domain::steps::refusal`] (its hold cancelled, the order ended failed with
    /// `order_refused` where the database allows it). `Err`: the database refuses that end
    /// too, and the message goes to the DLQ with the reason, for a person; its hold is
    /// released all the same, and the worker goes on with its other messages.
    pub(super) async fn refused(&self, order: &Order, refusal: &sqlx::Error) -> Result<(), Failure> {
        let target = (order, order.status, order.payment_intent_id.as_deref());
        match refusal::end_refused(&self.pool, &self.payments, target, refusal, refusal::Path::Fulfilment)
            .await
        {
            Ended::Failed(_) | Ended::MovedElsewhere => Ok(()),
            Ended::Stuck(reason) => Err(Failure::permanent(Source::Order, "order_refused", reason)),
        }
    }

    /// A delivery's first statement ([`Fulfilment::arrive`]) refused for good: the order,
    /// read as it is, takes the rule of [`Fulfilment::refused`] if it is `authorized` (its
    /// reservation was refused); in any other status the refusal is the message's, for a
    /// person.
    async fn arrival_refused(&self, order_id: OrderId, refusal: &sqlx::Error) -> anyhow::Result<Step> {
        let reason = format!("the database refuses order {order_id}'s step: {refusal}");
        match self.load(order_id).await? {
            Some(order) if order.status == OrderStatus::Authorized => {
                Ok(self.refused(&order, refusal).await.into())
            }
            _ => Ok(Step::stuck("order_refused", reason)),
        }
    }
}

/// The database's refusal for good in `error`'s chain, if that is what it is.
fn refusal_in(error: &anyhow::Error) -> Option<&sqlx::Error> {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<sqlx::Error>())
        .find(|e| orderfleet_runtime::db::refused_for_good(e))
}
