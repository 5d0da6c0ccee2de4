//! `stock-worker`: for each stock-check message, reserve the order's stock, then capture its
//! payment or cancel it — [`orderfleet::fulfilment`], which resumes from the order's status,
//! so a redelivered, duplicated or redriven message continues where the last attempt stopped
//! and never does a step twice. This crate only reads the message and maps the result:
//! settled → delete; blocked (Stripe or the database down) → come back after a backoff, and
//! the worker stops receiving until both answer again ([`Handler::ready`]);
//! stuck, or a message that is not a stock check → leave it for the DLQ, with the reason.

use std::sync::Arc;

use orderfleet::consumer::{Handler, Outcome, Received};
use orderfleet::fulfilment::{Fulfilment, Progress};
use orderfleet::outbox::{Envelope, EventType};

/// The worker's step.
#[derive(Clone)]
pub struct StockCheck {
    pub fulfilment: Fulfilment,
}

impl Handler for StockCheck {
    async fn handle(&self, batch: Vec<Received>) -> Vec<Outcome> {
        // Each message on its own: the bound on concurrency is the consumer's semaphore.
        futures::future::join_all(batch.iter().map(|m| self.handle_one(&m.body))).await
    }

    /// The database and Stripe both answer.
    async fn ready(&self) -> Result<(), String> {
        sqlx::query("SELECT 1")
            .execute(&self.fulfilment.pool)
            .await
            .map_err(|e| format!("PostgreSQL: {e}"))?;
        self.fulfilment.payments.probe().await
    }
}

impl StockCheck {
    /// Handles one message body. Public so tests can drive it without SQS.
    pub async fn handle_one(&self, body: &str) -> Outcome {
        let envelope: Envelope = match serde_json::from_str(body) {
            Ok(e) => e,
            Err(e) => return Outcome::Poison { reason: format!("not a message envelope: {e}") },
        };
        if EventType::parse(&envelope.event_type) != Some(EventType::StockCheckRequested) {
            return Outcome::Poison {
                reason: format!("unknown event type {:?} on the stock-check queue", envelope.event_type),
            };
        }
        match self.fulfilment.advance(envelope.order_id).await {
            Progress::Settled => Outcome::Done,
            Progress::Blocked { reason } => Outcome::Blocked { reason },
            Progress::Retry { reason } => Outcome::Retry { reason },
            Progress::Stuck { reason } => Outcome::Poison { reason },
        }
    }
}

/// The handler, shared by the consumer's tasks.
pub fn handler(fulfilment: Fulfilment) -> Arc<StockCheck> {
    Arc::new(StockCheck { fulfilment })
}
