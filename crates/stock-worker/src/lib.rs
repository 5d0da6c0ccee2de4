#![warn(missing_docs)]
//! `stock-worker`: for each stock-check message, reserve the order's stock, then capture its
//! payment or cancel it — [`orderfleet::domain::fulfilment`], which resumes from the order's status,
//! so a redelivered, duplicated or redriven message continues where the last attempt stopped
//! and never does a step twice. This crate only reads the message; what the step says is the
//! message's outcome as it is ([`orderfleet::runtime::failure`]): settled → delete; an outage (Stripe
//! or the database down) → come back after a backoff, and the worker stops receiving until
//! both answer again ([`Handler::ready`]); permanent (a stuck order, or a message that is not
//! a stock check) → left for the DLQ, with the reason.

// Instrumenting the handler's future makes the compiler prove `Send` through async-stripe's
// deeply nested types: more than the default recursion limit.
#![recursion_limit = "256"]

pub mod service;

use std::sync::Arc;
use std::time::Duration;

use orderfleet::domain::fulfilment::{Fulfilment, WAITING_FOR_THE_LINE};
use orderfleet::domain::outbox::{Destination, Envelope};
use orderfleet::runtime::consumer::{Handler, Outcome, Received};
use orderfleet::runtime::failure::{Failure, Source};
use tracing::Instrument;

/// The worker's step.
#[derive(Clone)]
pub struct StockCheck {
    /// Reserves, captures or cancels one order, from its status.
    pub fulfilment: Fulfilment,
}

impl Handler for StockCheck {
    async fn handle(&self, batch: Vec<Received>) -> Vec<Outcome> {
        // Each message on its own: the bound on concurrency is the consumer's semaphore.
        // Each in its message's span: its order's trace_id and order_id on every line.
        futures::future::join_all(
            batch.iter().map(|m| self.handle_waiting_for_the_line(&m.body).instrument(m.span.clone())),
        )
        .await
    }

    /// The database and Stripe both answer.
    async fn ready(&self) -> Result<(), String> {
        orderfleet::runtime::db::probe(&self.fulfilment.pool).await?;
        self.fulfilment.payments.probe().await
    }
}

/// How often a stock check still waiting for an order ahead of it says so.
const WAITING_LOGGED_EVERY: Duration = Duration::from_secs(60);

impl StockCheck {
    /// [`StockCheck::handle_one`], waiting in place (the heartbeat keeps the message
    /// invisible) for as long as the order's turn depends on a pending order ahead: every
    /// receive spent waiting would bring the message nearer the DLQ for no fault of its own.
    /// The order ahead is settled by its buyer's retry or the sweeper; while Stripe is down that
    /// can take the outage's length, and the wait is as long. It says so every minute.
    pub(crate) async fn handle_waiting_for_the_line(&self, body: &str) -> Outcome {
        let started = tokio::time::Instant::now();
        let mut said = started;
        loop {
            match self.handle_one(body).await {
                Err(failure) if failure.code == WAITING_FOR_THE_LINE => {
                    if said.elapsed() >= WAITING_LOGGED_EVERY {
                        let waited = started.elapsed();
                        tracing::warn!(?waited, reason = failure.reason, "still waiting for the line");
                        said = tokio::time::Instant::now();
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Handles one message body. Public so tests can drive it without SQS.
    pub async fn handle_one(&self, body: &str) -> Outcome {
        let envelope = Envelope::parse(body, Destination::StockCheck)
            .map_err(|refused| Failure::permanent(Source::Message, refused.code, refused.reason))?;
        match envelope.captures_from_its_payload(chrono::Utc::now()) {
            // The commit took the order's units: capture it from what the message says.
            Some(reserved) => self.fulfilment.capture_reserved(reserved).await,
            None => self.fulfilment.advance(envelope.order_id).await,
        }
    }
}

/// The handler, shared by the consumer's tasks.
pub fn handler(fulfilment: Fulfilment) -> Arc<StockCheck> {
    Arc::new(StockCheck { fulfilment })
}
