#![warn(missing_docs)]
//! `stock-worker`: for each stock-check message, reserve the order's stock, then capture its
//! payment or cancel it — [`orderfleet::domain::steps::fulfilment`], which resumes from the order's status,
//! so a redelivered, duplicated or redriven message continues where the last attempt stopped
//! and never does a step twice. This crate only reads the message; what the step says is the
//! message's outcome as it is ([`orderfleet_runtime::failure`]): settled → delete; an outage (Stripe
//! or the database down) → come back after a backoff, and the worker stops receiving until
//! both answer again ([`Handler::ready`]); permanent (a stuck order, or a message that is not
//! a stock check) → left for the DLQ, with the reason. A stock check whose order must wait for
//! an order ahead (after a stock cut) is done with, and the order waits in the [`line`].
//!
//! A product's opening is the stock workers' too (`opener`): each sleeps until the next
//! opening the schedule shows, and one of them draws its queue and promises units down it; each promoted order's `order.promoted` message, on the stock-check queue, is
//! authorized here (`promoted`).

// Instrumenting the handler's future makes the compiler prove `Send` through async-stripe's
// deeply nested types: more than the default recursion limit.
#![recursion_limit = "256"]

pub mod line;
pub mod metrics;
mod opener;
mod promoted;
pub mod service;

use line::Line;
use orderfleet::domain::records::outbox::{Destination, Envelope, EventType};
use orderfleet::domain::steps::fulfilment::{Fulfilment, Step};
use orderfleet_runtime::consumer::{Handler, Outcome, Received};
use orderfleet_runtime::failure::{Failure, Source};
use orderfleet_words::OrderId;
use std::sync::Arc;
use tracing::Instrument;

/// The worker's step.
#[derive(Clone)]
pub struct StockCheck {
    /// Reserves, captures or cancels one order, from its status.
    pub fulfilment: Fulfilment,
    /// Where an order whose turn depends on a pending order ahead waits ([`line`]).
    pub line: Arc<Line>,
}

impl Handler for StockCheck {
    /// Orders are independent: a capture that hangs on Stripe holds up no other message.
    const EACH_ON_ITS_OWN: bool = true;

    async fn handle(&self, batch: Vec<Received>) -> Vec<Outcome> {
        // Each message on its own: the bound on concurrency is the consumer's semaphore.
        // Each in its message's span: its order's trace_id and order_id on every line.
        futures::future::join_all(
            batch.iter().map(|m| self.handle_message(&m.body).instrument(m.span.clone())),
        )
        .await
    }

    /// The database and Stripe both answer.
    async fn ready(&self) -> Result<(), String> {
        orderfleet_runtime::db::probe(&self.fulfilment.pool).await?;
        self.fulfilment.payments.probe().await
    }
}

impl StockCheck {
    /// The step over `fulfilment`, with an empty line that nothing tries again until
    /// [`Line::run`] runs.
    pub fn new(fulfilment: Fulfilment, concurrency: usize) -> Self {
        let line = Arc::new(Line::new(fulfilment.clone(), concurrency));
        Self { fulfilment, line }
    }

    /// The step over `fulfilment`, whose line keeps its orders until the worker stops: for a
    /// worker whose sweeper is off.
    pub fn without_a_sweeper(fulfilment: Fulfilment, concurrency: usize) -> Self {
        let line = Arc::new(Line::new(fulfilment.clone(), concurrency).waiting_until_stopped());
        Self { fulfilment, line }
    }

    /// [`StockCheck::handle_one`]; a stock check whose order must wait for the line is done
    /// with, its order waiting in the [`Line`] (or, when that is full, for the sweeper), so that
    /// it pins no permit and spends no receive.
    pub(crate) async fn handle_message(&self, body: &str) -> Outcome {
        let (order_id, step) = self.handle_one_of(body).await;
        match (order_id, step) {
            (Some(order_id), Step::WaitsForTheLine(reason)) => {
                if self.line.wait(order_id) {
                    tracing::info!(reason, "the order waits for the line here; its stock check is done with");
                } else {
                    tracing::warn!(reason, "the line is full; the order is left to the sweeper");
                }
                Ok(())
            }
            (_, step) => step.outcome(),
        }
    }

    /// Handles one message body. Public so tests can drive it without SQS.
    pub async fn handle_one(&self, body: &str) -> Outcome {
        self.handle_one_of(body).await.1.outcome()
    }

    /// [`StockCheck::handle_one`], with the order's id when the body is a stock check.
    async fn handle_one_of(&self, body: &str) -> (Option<OrderId>, Step) {
        let envelope = match Envelope::parse(body, Destination::StockCheck) {
            Ok(envelope) => envelope,
            Err(refused) => {
                return (
                    None,
                    Step::Failed(Failure::permanent(Source::Message, refused.code, refused.reason)),
                );
            }
        };
        let order_id = envelope.order_id;
        if envelope.event_type == EventType::OrderPromoted {
            return (None, promoted::authorize(&self.fulfilment, order_id).await);
        }
        let step = match envelope.captures_from_its_payload(chrono::Utc::now()) {
            // The commit took the order's units: capture it from what the message says.
            Some(reserved) => self.fulfilment.capture_reserved(reserved).await,
            None => self.fulfilment.advance(order_id).await,
        };
        (Some(order_id), step)
    }
}

/// The handler, shared by the consumer's tasks, handling `concurrency` messages at once;
/// `sweeping` says whether this worker's sweeper runs.
pub fn handler(fulfilment: Fulfilment, concurrency: usize, sweeping: bool) -> Arc<StockCheck> {
    Arc::new(match sweeping {
        true => StockCheck::new(fulfilment, concurrency),
        false => StockCheck::without_a_sweeper(fulfilment, concurrency),
    })
}
