//! Settling: each message's outcome becomes its acknowledgement, its metric and its log line,
//! in one place, and the failures are recorded for operators.
//!
//! | outcome | acknowledgement | also |
//! |---|---|---|
//! | `Ok` | delete | |
//! | transient | visible again after [`Failure::retry_in`] if known, else a backoff by receive count | a warning (an info line when the failure named its time) |
//! | outage (only once the batch stops holding it: [`super::hold`]) | visible again after the backoff | the worker's gate closes: no poller receives until the probe passes |
//! | permanent | visible again after the backoff; the redrive policy moves it to the DLQ after its third receive | an error line |
//!
//! Every failure is also recorded in `message_failures` under the message's
//! [`super::failure_key`], so `fleetctl dlq peek` shows why a dead letter died.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::acker::Ack;
use super::gate::Gate;
use super::{ConsumerConfig, Outcome, Received, failure_key};
use crate::backoff::Backoff;
use crate::failure::{Failure, Kind};

/// SQS's longest visibility timeout: 12 hours.
const MAX_VISIBILITY: Duration = Duration::from_secs(43_200);

/// What settling needs to know of a message once the handler has had it.
pub(super) struct Delivered {
    message_id: String,
    receipt: String,
    receive_count: u32,
    /// Its failures' key in `message_failures`.
    key: String,
    /// Its order's `trace_id` and `order_id`, on the message's log line.
    span: tracing::Span,
}

impl Delivered {
    pub(super) fn of(message: &Received) -> Self {
        Self {
            message_id: message.message_id.clone(),
            receipt: message.receipt_handle.clone(),
            receive_count: message.receive_count,
            key: failure_key(&message.body, &message.message_id),
            span: message.span.clone(),
        }
    }
}

pub(super) struct Settle {
    queue: String,
    acks: mpsc::Sender<Ack>,
    gate: Arc<Gate>,
    backoff: Backoff,
    failure_log: Option<crate::db::Pool>,
    /// The stop signal, and how long this worker's polls may still be open after it.
    stopping: tokio_util::sync::CancellationToken,
    open_polls: std::time::Duration,
}

impl Settle {
    pub(super) fn new(
        queue: &str,
        config: &ConsumerConfig,
        acks: mpsc::Sender<Ack>,
        gate: Arc<Gate>,
        stopping: tokio_util::sync::CancellationToken,
    ) -> Self {
        let (backoff, failure_log) = (config.retry_backoff, config.failure_log.clone());
        let open_polls =
            std::time::Duration::from_secs(u64::try_from(config.wait_time_seconds).unwrap_or(20) + 1);
        Self { queue: queue.to_owned(), acks, gate, backoff, failure_log, stopping, open_polls }
    }

    pub(super) fn acks(&self) -> &mpsc::Sender<Ack> {
        &self.acks
    }

    /// Settles every message of a batch, then records the batch's failures in one statement.
    pub(super) async fn batch(&self, settled: Vec<(Delivered, Outcome)>) {
        let mut failures = Vec::new();
        for (message, outcome) in settled {
            let ack = self.settle(&message, &outcome);
            // The acker outlives every batch task, so this send fails only if it panicked.
            let _ = self.acks.send(ack).await;
            if let Err(failure) = outcome {
                failures.push((message, failure));
            }
        }
        if let Some(pool) = &self.failure_log
            && !failures.is_empty()
        {
            record_failures(pool, &self.queue, &failures).await;
        }
    }

    /// One outcome: its metric, its log line, and the acknowledgement it calls for.
    fn settle(&self, message: &Delivered, outcome: &Outcome) -> Ack {
        let label = outcome.as_ref().map_or_else(|failure| failure.kind.as_str(), |()| "done");
        metrics::counter!(crate::metrics::MESSAGES_HANDLED.name, "queue" => self.queue.clone(), "outcome" => label)
            .increment(1);
        let _in_span = message.span.enter();
        let Err(failure) = outcome else {
            tracing::info!(queue = self.queue, receive_count = message.receive_count, "message handled");
            return Ack::Delete(message.receipt.clone());
        };
        // Every failure leaves the message to come back: when the failure says it can go on,
        // or after a backoff sized by its receive count.
        let delay = failure
            .retry_in()
            .unwrap_or_else(|| self.backoff.delay(message.receive_count.saturating_sub(1)))
            .min(MAX_VISIBILITY);
        // After the stop signal this worker's own long polls may still be open (up to their
        // wait): a message handed back sooner would be received by them again, and handed
        // back again, a receive spent for nothing (seen: four notifications of a stopped, then
        // a killed, worker reached the DLQ). It stays invisible past them.
        let delay = if self.stopping.is_cancelled() { delay.max(self.open_polls) } else { delay };
        // An outage closes the worker's gate: no poller receives until the probe passes.
        let paused_now = failure.kind == Kind::Outage && self.gate.pause();
        self.log(message, failure, delay, paused_now);
        Ack::Visibility(message.receipt.clone(), delay.as_secs().max(1) as i32)
    }

    fn log(&self, message: &Delivered, failure: &Failure, delay: Duration, paused_now: bool) {
        // The message's id, its order and trace come from its span (see `settle`).
        let (queue, receive_count) = (&self.queue, message.receive_count);
        let (source, code, reason) = (failure.source.as_str(), &failure.code, &failure.reason);
        match failure.kind {
            Kind::Transient if failure.retry_in().is_some() => {
                tracing::info!(
                    queue,
                    receive_count,
                    ?delay,
                    source,
                    reason,
                    "not yet; the message comes back when it can go on"
                )
            }
            Kind::Transient => {
                tracing::warn!(
                    queue,
                    receive_count,
                    ?delay,
                    source,
                    code,
                    reason,
                    "transient failure; the message comes back later"
                )
            }
            // One line per outage, from the outcome that closed the gate.
            Kind::Outage if paused_now => {
                tracing::warn!(
                    queue,
                    source,
                    code,
                    reason,
                    "a dependency is down; pausing receives until it answers"
                )
            }
            Kind::Outage => {}
            Kind::Permanent => {
                tracing::error!(
                    queue,
                    receive_count,
                    source,
                    code,
                    reason,
                    "unprocessable message; it goes to the DLQ after its last receive"
                )
            }
        }
    }
}

/// Records why messages did not finish, for `fleetctl dlq peek`. Best effort: when the
/// database is what failed, this fails too, and the log line is the record.
async fn record_failures(pool: &crate::db::Pool, queue: &str, failures: &[(Delivered, Failure)]) {
    // Two copies of one message in a batch share a key, and one statement may change a row
    // only once: one entry per key, the last copy's failure, counting them all.
    let mut by_key: Vec<(&Delivered, &Failure, i32)> = Vec::new();
    for (message, failure) in failures {
        match by_key.iter_mut().find(|(m, _, _)| m.key == message.key) {
            Some(entry) => *entry = (message, failure, entry.2 + 1),
            None => by_key.push((message, failure, 1)),
        }
    }
    let keys: Vec<&str> = by_key.iter().map(|(m, _, _)| m.key.as_str()).collect();
    let ids: Vec<&str> = by_key.iter().map(|(m, _, _)| m.message_id.as_str()).collect();
    let counts: Vec<i32> = by_key.iter().map(|(m, _, _)| m.receive_count as i32).collect();
    let outcomes: Vec<&str> = by_key.iter().map(|(_, f, _)| f.kind.as_str()).collect();
    let reasons: Vec<String> =
        by_key.iter().map(|(_, f, _)| format!("{} {}: {}", f.source.as_str(), f.code, f.reason)).collect();
    let times: Vec<i32> = by_key.iter().map(|(_, _, n)| *n).collect();
    let recorded = sqlx::query_file!(
        "src/consumer/failures.sql",
        queue,
        &keys as _,
        &ids as _,
        &counts,
        &outcomes as _,
        &reasons,
        &times,
    )
    .execute(pool);
    // Bounded: a connection frozen here would hold the batch's task, and its permits, for ever.
    let recorded = crate::db::bounded("failed to record message failures", async {
        recorded.await.map_err(anyhow::Error::from)
    })
    .await;
    if let Err(e) = recorded {
        // Warn: a failure not recorded leaves a dead letter without its reason.
        tracing::warn!(error = format!("{e:#}"), "could not record message failures");
    }
}
