//! The loop every SQS worker runs around its handler: long-poll, process under a bound,
//! acknowledge in batches.
//!
//! A worker is a thin loop around one testable step. The step is a [`Handler`] that turns a
//! batch of received messages into one [`Outcome`] each: `Ok` when the message's effects are
//! committed, or the [`Failure`] that stopped it, classified where it happened. This module
//! owns everything else. A turn of each `poller::Poller` reads as its steps: **wait for a
//! turn** (permits, the backlog, the gate), **receive** (one long poll), **dispatch** (the
//! batch to its own task, under a heartbeat), and **settle** (`settle::Settle`: each outcome
//! becomes its acknowledgement, its metric and its log line).
//!
//! - **Long polling only** (`WaitTimeSeconds` 20, or the shutdown grace if that is shorter,
//!   so that no poll outlives a stopped worker): an idle poller makes about three receive
//!   calls a minute and never spins.
//! - **Concurrency independent of batch size**: a semaphore bounds messages in flight across
//!   all pollers; a poller asks for at most as many messages as it holds permits for, and
//!   waits (briefly) for a full batch's worth of permits rather than asking for a few. A
//!   handler whose messages are independent has each handled and settled on its own
//!   ([`Handler::EACH_ON_ITS_OWN`]): a slow one holds up none of its batch-mates.
//! - **Pollers follow the queue's depth** ([`Backlog`]): the first poller always polls; the
//!   others poll only while receives come back full. A shallow queue is then read by one long
//!   poll per worker, which waits a moment after a short batch so the next one is fuller:
//!   fewer receives, deletes and publishes per message for a few milliseconds.
//! - **Acknowledge after commit, in batches** (`acker`): a done message is deleted with
//!   `DeleteMessageBatch`, a failed one gets a backoff-sized visibility timeout with
//!   `ChangeMessageVisibilityBatch`, flushed every few milliseconds or every 10 entries.
//!   Per-entry failures are read: a delete that fails leaves the message to come back, which
//!   the handler's status guards make harmless.
//! - **An outage holds, and stops receiving** (`hold`): a message an outage stopped (the
//!   failure says so, or the loop sees it: a failing probe right after a dependency's passing
//!   failure, or three different messages failing on one dependency within 10 s) is kept by
//!   its batch's task, invisible under the heartbeat, while every poller of the worker pauses
//!   until the handler's [`Handler::ready`] probe passes; then it is handled again. A paused
//!   worker receives nothing and a held message is not handed out again, so an outage of any
//!   length costs a message at most the receive it came with and dead-letters none (SPEC
//!   §8.10); it resumes by itself.
//! - **A permanent failure never stops the worker**: the message is left for the queue's
//!   redrive policy, which moves it to the DLQ after its third receive, and its reason is
//!   recorded (`message_failures`) for `fleetctl dlq peek`.
//! - **Graceful stop**: on the stop signal the pollers stop receiving; in-flight messages get
//!   the grace period to finish; any still unfinished are released (visibility 0) for another
//!   worker at once instead of waiting out their timeout; pending acknowledgements are flushed.
//! - **Heartbeat**: while a batch is being handled, its messages' visibility is extended every
//!   third of the queue's visibility timeout, so a slow capture is not handed to another
//!   worker mid-flight; it stops when the handler returns.

mod acker;
mod gate;
mod hold;
mod poller;
mod settle;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use crate::backlog::Backlog;
use crate::backoff::Backoff;
pub use crate::failure::{Failure, Kind, Source};
use acker::{Ack, SqsAcks};
use gate::Gate;
use poller::{InFlight, Poller, Shared};

/// A received message, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Received {
    /// SQS's id of this delivery's message.
    pub message_id: String,
    /// What deletes this delivery or changes its visibility.
    pub receipt_handle: String,
    /// The body: an envelope, for the fleet's queues.
    pub body: String,
    /// How many times SQS has handed this message out, this time included.
    pub receive_count: u32,
    /// The order's W3C trace context: the message attribute `traceparent`.
    pub traceparent: Option<String>,
    /// The span to handle the message in (`Received::span_for`).
    pub span: tracing::Span,
}

impl Received {
    /// The span of everything done for a message: its order's `trace_id` and `order_id`
    /// (from the `traceparent` attribute and the envelope) on every line logged in it, and its
    /// parent in exported traces. Made once, when the message is received.
    pub(crate) fn span_for(message_id: &str, body: &str, traceparent: Option<&str>) -> tracing::Span {
        #[derive(serde::Deserialize)]
        struct OfOrder {
            order_id: uuid::Uuid,
        }
        // Error-level, so that it stays on whatever `RUST_LOG` keeps (see `trace::order_span`).
        let span = tracing::error_span!(
            "message",
            trace_id = tracing::field::Empty,
            order_id = tracing::field::Empty,
            message_id
        );
        if let Ok(envelope) = serde_json::from_str::<OfOrder>(body) {
            span.record("order_id", tracing::field::display(envelope.order_id));
        }
        crate::trace::follow(&span, traceparent);
        span
    }
}

/// What became of one message ([`crate::failure::Outcome`]): `Ok` when its effects are
/// committed (or it needed none), and it is deleted; otherwise why not, and it comes back
/// later (see `settle::Settle`).
pub use crate::failure::Outcome;

/// The one step a worker does.
pub trait Handler: Send + Sync + 'static {
    /// Whether each message is handled and settled on its own, as soon as it is done, with its
    /// permit back at once; otherwise a batch is handled together (one `PublishBatch` for the
    /// lot, say) and settled when its last message is done. A handler whose messages are
    /// independent says true: one slow message then holds up no other.
    const EACH_ON_ITS_OWN: bool = false;

    /// Handles a batch (1–10 messages; one when [`Handler::EACH_ON_ITS_OWN`]) and returns one
    /// outcome per message, in order.
    fn handle(&self, batch: Vec<Received>) -> impl Future<Output = Vec<Outcome>> + Send;

    /// Whether the dependencies answer (a cheap probe), asked while the worker is paused
    /// after an outage. `Err` says what is down.
    fn ready(&self) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }
}

/// How a consumer polls its queue and handles what it gets.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The queue it consumes.
    pub queue_url: String,
    /// Concurrent long polls while the queue is deep; one while it is shallow.
    pub pollers: usize,
    /// Messages being handled at once, across pollers.
    pub max_in_flight: usize,
    /// Messages per receive, and entries per delete or visibility call (1–10); 10 but to
    /// measure what batching buys.
    pub batch_size: usize,
    /// Visibility timeout of a failed message, by receive count.
    pub retry_backoff: Backoff,
    /// How long an acknowledgement may wait to share a batch call.
    pub ack_flush_interval: Duration,
    /// After a receive that came back short of a full batch, how long the poller waits before
    /// the next, to let the queue fill; also how long it waits for a full batch's permits
    /// before asking for fewer messages.
    pub fill_delay: Duration,
    /// How long a receive waits for messages (a long poll), 1–20 s.
    pub wait_time_seconds: i32,
    /// The queue's visibility timeout; read from the queue at start when `None`.
    pub visibility_timeout: Option<Duration>,
    /// How long in-flight handling may go on after the stop signal.
    pub shutdown_grace: Duration,
    /// Where to record why a message did not finish (`message_failures`), for operators.
    pub failure_log: Option<crate::db::Pool>,
}

impl ConsumerConfig {
    /// The defaults for `queue_url`.
    pub fn new(queue_url: impl Into<String>) -> Self {
        Self {
            queue_url: queue_url.into(),
            pollers: 2,
            max_in_flight: 32,
            batch_size: 10,
            // Failures come back after about 5 s, 10 s, 20 s…: spread out, and still inside
            // the three receives before the DLQ for a permanent one.
            retry_backoff: Backoff::new(Duration::from_secs(5), Duration::from_secs(300)),
            ack_flush_interval: Duration::from_millis(20),
            fill_delay: Duration::from_millis(100),
            wait_time_seconds: 20,
            visibility_timeout: None,
            shutdown_grace: Duration::from_secs(20),
            failure_log: None,
        }
    }

    /// A worker binary's consumer: its queue and batching as configured, `max_in_flight`
    /// messages at once, the process's shutdown grace, and failures recorded in `pool`.
    pub fn for_worker(
        worker: &crate::config::WorkerConfig,
        runtime: &crate::config::RuntimeConfig,
        max_in_flight: usize,
        pool: crate::db::Pool,
    ) -> Self {
        Self {
            max_in_flight: max_in_flight.max(1),
            shutdown_grace: runtime.shutdown_grace,
            failure_log: Some(pool),
            batch_size: if worker.batching { 10 } else { 1 },
            ..Self::new(worker.queue_url.as_str())
        }
    }

    /// Entries per receive and per acknowledgement call.
    fn batch(&self) -> usize {
        self.batch_size.clamp(1, 10)
    }

    /// The settings as the loop uses them: a long poll that cannot outlast the grace period,
    /// and the queue's visibility timeout read from the queue when not given.
    async fn prepared(mut self, sqs: &Client) -> Self {
        // A long poll must not outlast the grace period: a worker that exits with one still
        // open leaves it with SQS, which hands the next messages to the dead poll, where they
        // stay invisible for the visibility timeout (the bench lost its first 19 orders' stock
        // checks for 60 s that way when it stopped a fleet with a 5 s grace and started the
        // next within 20 s). With the default grace (20 s) the polls are the full 20 s.
        let grace_seconds = i32::try_from(self.shutdown_grace.as_secs()).unwrap_or(i32::MAX).max(1);
        self.wait_time_seconds = self.wait_time_seconds.min(grace_seconds);
        if self.visibility_timeout.is_none() {
            self.visibility_timeout = Some(queue_visibility_timeout(sqs, &self.queue_url).await);
        }
        self
    }
}

/// Runs until `cancel` fires, then finishes in-flight work within the grace period and
/// flushes the pending acknowledgements.
pub async fn run<H: Handler>(
    sqs: Client,
    config: ConsumerConfig,
    handler: Arc<H>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let config = Arc::new(config.prepared(&sqs).await);
    let calls = SqsAcks::new(sqs.clone(), &config.queue_url);
    let capacity = config.max_in_flight * 2 + 20;
    let (acks, acker) = acker::start(calls, config.ack_flush_interval, config.batch(), capacity);
    let shared = Shared {
        permits: Arc::new(Semaphore::new(config.max_in_flight)),
        acks: acks.clone(),
        in_flight: InFlight::default(),
        gate: Arc::new(Gate::default()),
        breaker: Arc::default(),
        backlog: Arc::new(Backlog::default()),
        cancel: cancel.clone(),
    };
    let stopped_at = stop_clock(&cancel);
    let mut pollers = tokio::task::JoinSet::new();
    for id in 0..config.pollers.max(1) {
        let poller = Poller::new(id, sqs.clone(), config.clone(), handler.clone(), shared.clone());
        pollers.spawn(poller.run());
    }
    // A poller ends only at the stop signal. One that panics takes the worker down with an
    // error (in-flight work still finishes or is released below): a worker short of its
    // first poller would receive nothing while looking alive.
    let mut panicked = None;
    while let Some(result) = pollers.join_next().await {
        if let Err(e) = result {
            cancel.cancel();
            panicked.get_or_insert_with(|| crate::tasks::why_it_ended(e));
        }
    }
    // One grace period in all, from the stop signal: polls in flight, then handlers.
    let stop_by = *stopped_at.get().unwrap_or(&tokio::time::Instant::now()) + config.shutdown_grace;
    finish_in_flight(&shared.in_flight, stop_by, &acks, config.shutdown_grace).await;
    // Deletes and visibility changes still waiting for a batch go out before we exit, within
    // a bound: the acker's own calls time out, and this wait does too.
    let (flushed_tx, flushed_rx) = oneshot::channel();
    if acks.send(Ack::Flush(flushed_tx)).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(5), flushed_rx).await;
    }
    // Our senders go; the acker ends when the batch tasks' have gone too, which a task cut
    // off at the grace period never does (it still holds one): wait for it only otherwise.
    let finished = shared.in_flight.tracker.is_empty();
    drop((acks, shared));
    if finished {
        let _ = acker.await;
    }
    match panicked {
        Some(why) => Err(anyhow::anyhow!("a poller of {} {why}", short_name(&config.queue_url))),
        None => Ok(()),
    }
}

/// When the stop signal came: the grace period counts from there.
fn stop_clock(cancel: &CancellationToken) -> Arc<std::sync::OnceLock<tokio::time::Instant>> {
    let stopped_at = Arc::new(std::sync::OnceLock::new());
    let (cancel, clock) = (cancel.clone(), stopped_at.clone());
    tokio::spawn(async move {
        cancel.cancelled().await;
        let _ = clock.set(tokio::time::Instant::now());
    });
    stopped_at
}

/// Waits for the batches in flight until `stop_by`; what has not finished then is handed
/// back to the queue at once rather than after its visibility timeout. A handler cut off
/// mid-way is a crash to the next worker, which the status guards and idempotency keys make safe
/// to resume.
async fn finish_in_flight(
    in_flight: &InFlight,
    stop_by: tokio::time::Instant,
    acks: &tokio::sync::mpsc::Sender<Ack>,
    grace: Duration,
) {
    in_flight.tracker.close();
    if tokio::time::timeout_at(stop_by, in_flight.tracker.wait()).await.is_ok() {
        return;
    }
    // Heartbeats stop first, so none extends a message after its release.
    in_flight.stop_heartbeats.cancel();
    let unfinished = in_flight.take_all();
    tracing::warn!(
        ?grace,
        count = unfinished.len(),
        "in-flight messages did not finish in the grace period; releasing them to the queue"
    );
    for receipt in unfinished {
        let _ = acks.send(Ack::Visibility(receipt, 0)).await;
    }
}

/// The queue's own visibility timeout, which the heartbeat keeps renewing.
async fn queue_visibility_timeout(sqs: &Client, queue_url: &str) -> Duration {
    use aws_sdk_sqs::types::QueueAttributeName;
    let read = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::VisibilityTimeout)
        .send()
        .await;
    let seconds = read
        .ok()
        .and_then(|out| out.attributes)
        .and_then(|a| a.get(&QueueAttributeName::VisibilityTimeout).cloned())
        .and_then(|v| v.parse::<u64>().ok());
    match seconds {
        Some(s) => Duration::from_secs(s),
        None => {
            tracing::warn!(queue_url, "cannot read the queue's visibility timeout; assuming 30 s");
            Duration::from_secs(30)
        }
    }
}

/// The key a message's failures are recorded under: its envelope's `message_id`, which it keeps
/// through a DLQ and a redrive (SQS gives a redriven message a new message id), or its SQS
/// message id when the body is not an envelope. `fleetctl dlq peek` looks failures up by it.
pub fn failure_key(body: &str, sqs_message_id: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Keyed {
        message_id: uuid::Uuid,
    }
    serde_json::from_str::<Keyed>(body)
        .map(|k| k.message_id.to_string())
        .unwrap_or_else(|_| sqs_message_id.to_owned())
}

/// The queue's name, from its URL, for logs and metric labels.
pub fn short_name(queue_url: &str) -> &str {
    queue_url.rsplit('/').next().unwrap_or(queue_url)
}
