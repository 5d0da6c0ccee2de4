//! Orders waiting for the line: after a stock cut, an order whose turn depends on a pending
//! order ahead of it (`waiting_for_the_line`) waits here, not in its message's handling.
//!
//! A message waiting in its handling would pin its permit (with one permit, the worker
//! would stop), keep the message invisible under the heartbeat for as long as the order
//! ahead stays pending, and go back with a receive spent at a stop. So its stock check is
//! done with at once (deleted: it has nothing left to say), and the order is tried again
//! here, every [`Line::EVERY`], by the worker's own step, until its turn is decided. An
//! order is not kept here for ever, nor past a stop: the sweeper advances every `authorized`
//! order that has not moved for five minutes (`SweepPolicy::fulfilment_after`), so an order
//! this worker lets go of, at [`Line::PATIENCE`], at its stop or when the line is full, is
//! finished there. Waiting here only makes it sooner. A worker whose sweeper is off
//! (`SWEEP_INTERVAL_SECONDS=0`) keeps its waiting orders until it stops; at least one stock
//! worker must sweep, or an order let go of at a stop waits for `fleetctl sweep`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use orderfleet::domain::steps::fulfilment::{Fulfilment, Step};
use orderfleet_words::OrderId;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The orders waiting, and how each is tried again.
pub struct Line {
    fulfilment: Fulfilment,
    waiting: Mutex<HashMap<OrderId, Waiting>>,
    /// Orders tried at once: the worker's concurrency, so waiting here takes no more of the
    /// database or of Stripe than handling their messages would.
    at_once: usize,
    /// How long an order waits here: [`Line::PATIENCE`] while this worker sweeps; until its
    /// stop when its sweeper is off (`SWEEP_INTERVAL_SECONDS=0`), since nothing here would
    /// finish an order let go of sooner.
    patience: Duration,
}

/// One order waiting.
#[derive(Clone)]
struct Waiting {
    since: Instant,
    span: tracing::Span,
}

impl Line {
    /// How often each waiting order is tried again.
    pub const EVERY: Duration = Duration::from_secs(1);
    /// How long an order waits here before it is left to the sweeper, which would have
    /// taken it by then anyway.
    pub const PATIENCE: Duration = Duration::from_secs(300);
    /// The most orders waiting here at once; more are left to the sweeper.
    pub const CAPACITY: usize = 10_000;

    /// An empty line, whose orders are tried `at_once` at a time.
    pub fn new(fulfilment: Fulfilment, at_once: usize) -> Self {
        Self { fulfilment, waiting: Mutex::default(), at_once: at_once.max(1), patience: Self::PATIENCE }
    }

    /// This line, its orders waiting until the worker stops: for a worker whose sweeper is off.
    pub fn waiting_until_stopped(self) -> Self {
        Self { patience: Duration::MAX, ..self }
    }

    /// Takes an order in, in the current span; false when the line is full, and the order is
    /// left to the sweeper.
    pub fn wait(&self, order_id: OrderId) -> bool {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        if waiting.len() >= Self::CAPACITY && !waiting.contains_key(&order_id) {
            return false;
        }
        let span = tracing::Span::current();
        waiting.entry(order_id).or_insert(Waiting { since: Instant::now(), span });
        metrics::gauge!(crate::metrics::ORDERS_WAITING_FOR_THE_LINE.name).set(waiting.len() as f64);
        true
    }

    /// How many orders wait.
    pub fn len(&self) -> usize {
        self.waiting.lock().expect("not poisoned").len()
    }

    /// Whether no order waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tries every waiting order again each [`Line::EVERY`] until `stop`; the orders still
    /// waiting then are left to the sweeper.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        while orderfleet_runtime::tasks::sleep_or_stop(&stop, Self::EVERY).await {
            let round: Vec<(OrderId, Waiting)> =
                self.waiting.lock().expect("not poisoned").iter().map(|(id, w)| (*id, w.clone())).collect();
            futures::stream::iter(round)
                .take_while(|_| std::future::ready(!stop.is_cancelled()))
                .for_each_concurrent(self.at_once, |(order_id, waiting)| self.try_again(order_id, waiting))
                .await;
        }
        let left = self.len();
        if left > 0 {
            tracing::info!(left, "stopping; the orders still waiting for the line are left to the sweeper");
        }
    }

    /// One try of one order: out of the line once its turn is decided, or once it has waited
    /// its [`Line::PATIENCE`].
    async fn try_again(&self, order_id: OrderId, waiting: Waiting) {
        let span = waiting.span;
        match self.fulfilment.advance(order_id).instrument(span.clone()).await {
            Step::WaitsForTheLine(reason) => {
                if waiting.since.elapsed() < self.patience {
                    return;
                }
                span.in_scope(|| tracing::warn!(reason, "waited too long for the line; left to the sweeper"));
            }
            Step::Done => {}
            Step::Failed(failure) => {
                let (code, reason) = (failure.code, failure.reason);
                span.in_scope(|| {
                    tracing::warn!(
                        code,
                        reason,
                        "could not go on after its wait for the line; left to the sweeper"
                    )
                });
            }
        }
        let mut waiting = self.waiting.lock().expect("not poisoned");
        waiting.remove(&order_id);
        metrics::gauge!(crate::metrics::ORDERS_WAITING_FOR_THE_LINE.name).set(waiting.len() as f64);
    }
}
