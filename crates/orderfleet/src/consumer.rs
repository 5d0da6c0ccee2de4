//! The loop every SQS worker runs around its handler: long-poll, process under a bound,
//! acknowledge in batches.
//!
//! A worker is a thin loop around one testable step. The step is a [`Handler`] that turns a
//! batch of received messages into one [`Outcome`] each; this module owns everything else:
//! - **Long polling only** (`WaitTimeSeconds` 20, or the shutdown grace if that is shorter,
//!   so that no poll outlives a stopped worker): an idle poller makes about three receive
//!   calls a minute and never spins.
//! - **Concurrency independent of batch size**: a semaphore bounds messages in flight across
//!   all pollers; a poller asks for at most as many messages as it holds permits for, and
//!   waits (briefly) for a full batch's worth of permits rather than asking for a few.
//! - **Pollers follow the queue's depth** ([`Backlog`]): the first poller always polls; the
//!   others poll only while receives come back full. A shallow queue is then read by one long
//!   poll per worker, which waits a moment after a short batch so the next one is fuller:
//!   fewer receives, deletes and publishes per message for a few milliseconds. An idle
//!   worker makes about three receives a minute in all.
//! - **Acknowledge after commit, in batches**: `Done` messages are deleted with
//!   `DeleteMessageBatch`, `Retry`/`Poison` ones get a backoff-sized visibility timeout with
//!   `ChangeMessageVisibilityBatch`, flushed every few milliseconds or every 10 entries.
//!   Per-entry failures are read: a delete that fails leaves the message to come back, which
//!   the handler's status guards make harmless.
//! - **Dependencies down, receiving stops**: a `Blocked` outcome (the database or Stripe did
//!   not answer) pauses every poller of the worker until the handler's [`Handler::ready`]
//!   probe passes, logging once per interval. A paused worker receives nothing, so an outage
//!   of any length adds no receives to the messages waiting in the queue and dead-letters
//!   none of them; it resumes by itself.
//! - **Poison never stops the worker**: it is left for the queue's redrive policy, which moves
//!   it to the DLQ after its third receive.
//! - **Graceful stop**: on the stop signal the pollers stop receiving; in-flight messages get
//!   the grace period to finish; any still unfinished are released (visibility 0) for another
//!   worker at once instead of waiting out their timeout; pending acknowledgements are flushed.
//! - **Heartbeat**: while a batch is being handled, its messages' visibility is extended every
//!   third of the queue's visibility timeout, so a slow capture is not handed to another
//!   worker mid-flight; it stops when the handler returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, MessageSystemAttributeName,
};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backlog::Backlog;
use crate::backoff::Backoff;

/// A received message, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub receipt_handle: String,
    pub body: String,
    /// How many times SQS has handed this message out, this time included.
    pub receive_count: u32,
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its effects are committed (or it needed none): delete it.
    Done,
    /// A transient failure: let it come back after a backoff sized by its receive count.
    Retry { reason: String },
    /// Not now, for a known time (another worker holds the message's claim until then): let
    /// it come back after `after`, so the wait costs one receive, not a receive per backoff.
    Wait { reason: String, after: Duration },
    /// A dependency is down: like `Retry`, and the worker stops receiving until
    /// [`Handler::ready`] passes.
    Blocked { reason: String },
    /// It can never succeed as it is (unreadable, unknown order or event type): leave it for
    /// the redrive policy to move to the DLQ, where a person reads it.
    Poison { reason: String },
}

impl Outcome {
    /// Its name in `messages_handled_total` and in `message_failures.outcome`.
    fn label(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Retry { .. } => "retry",
            Outcome::Wait { .. } => "wait",
            Outcome::Blocked { .. } => "blocked",
            Outcome::Poison { .. } => "poison",
        }
    }

    /// Why it did not finish; `None` for `Done`.
    fn reason(&self) -> Option<&str> {
        match self {
            Outcome::Done => None,
            Outcome::Retry { reason }
            | Outcome::Wait { reason, .. }
            | Outcome::Blocked { reason }
            | Outcome::Poison { reason } => Some(reason),
        }
    }
}

/// The one step a worker does.
pub trait Handler: Send + Sync + 'static {
    /// Handles a batch (1–10 messages) and returns one outcome per message, in order.
    fn handle(&self, batch: Vec<Received>) -> impl Future<Output = Vec<Outcome>> + Send;

    /// Whether the dependencies answer (a cheap probe), asked while the worker is paused
    /// after a `Blocked` outcome. `Err` says what is down.
    fn ready(&self) -> impl Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }
}

/// Shared by a worker's pollers: set by a `Blocked` outcome, cleared by a passing probe.
#[derive(Debug, Default)]
struct Gate {
    paused: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub queue_url: String,
    /// Concurrent long polls while the queue is deep; one while it is shallow.
    pub pollers: usize,
    /// Messages being handled at once, across pollers.
    pub max_in_flight: usize,
    /// Messages per receive, and entries per delete or visibility call (1–10); 10 but to
    /// measure what batching buys.
    pub batch_size: usize,
    /// Visibility timeout for `Retry` and `Poison`, by receive count.
    pub retry_backoff: Backoff,
    /// How long an acknowledgement may wait to share a batch call.
    pub ack_flush_interval: Duration,
    /// After a receive that came back short of a full batch, how long the poller waits before
    /// the next, to let the queue fill; also how long it waits for a full batch's permits
    /// before asking for fewer messages.
    pub fill_delay: Duration,
    pub wait_time_seconds: i32,
    /// The queue's visibility timeout; read from the queue at start when `None`.
    pub visibility_timeout: Option<Duration>,
    /// How long in-flight handling may go on after the stop signal.
    pub shutdown_grace: Duration,
    /// Where to record why a message did not finish (`message_failures`), for operators.
    pub failure_log: Option<sqlx::PgPool>,
}

impl ConsumerConfig {
    pub fn new(queue_url: impl Into<String>) -> Self {
        Self {
            queue_url: queue_url.into(),
            pollers: 2,
            max_in_flight: 32,
            batch_size: 10,
            // Transient failures come back after about 5 s, 10 s, 20 s…: spread out, and still
            // inside the three receives before the DLQ for a poison message.
            retry_backoff: Backoff::new(Duration::from_secs(5), Duration::from_secs(300)),
            ack_flush_interval: Duration::from_millis(20),
            fill_delay: Duration::from_millis(100),
            wait_time_seconds: 20,
            visibility_timeout: None,
            shutdown_grace: Duration::from_secs(20),
            failure_log: None,
        }
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
    let mut config = config;
    // A long poll must not outlast the grace period: a worker that exits with one still open
    // leaves it with SQS, which hands the next messages to the dead poll, where they stay
    // invisible for the visibility timeout (the bench lost its first 19 orders' stock checks
    // for 60 s that way when it stopped a fleet with a 5 s grace and started the next within
    // 20 s). With the default grace (20 s) the polls are the full 20 s.
    let grace_seconds = i32::try_from(config.shutdown_grace.as_secs()).unwrap_or(i32::MAX).max(1);
    config.wait_time_seconds = config.wait_time_seconds.min(grace_seconds);
    if config.visibility_timeout.is_none() {
        config.visibility_timeout = Some(queue_visibility_timeout(&sqs, &config.queue_url).await);
    }
    let permits = Arc::new(Semaphore::new(config.max_in_flight));
    let (ack_tx, ack_rx) = mpsc::channel::<Ack>(config.max_in_flight * 2 + 20);
    let acker = tokio::spawn(acknowledge(
        sqs.clone(),
        config.queue_url.clone(),
        ack_rx,
        config.ack_flush_interval,
        config.batch_size.clamp(1, 10),
    ));
    let in_flight = InFlight::default();
    let gate = Arc::new(Gate::default());
    let backlog = Arc::new(Backlog::default());
    // When the stop signal came: the grace period counts from there.
    let stopped_at = Arc::new(std::sync::OnceLock::new());
    tokio::spawn({
        let (cancel, stopped_at) = (cancel.clone(), stopped_at.clone());
        async move {
            cancel.cancelled().await;
            let _ = stopped_at.set(tokio::time::Instant::now());
        }
    });

    let mut pollers = tokio::task::JoinSet::new();
    for poller in 0..config.pollers.max(1) {
        pollers.spawn(poll(
            poller,
            sqs.clone(),
            config.clone(),
            handler.clone(),
            permits.clone(),
            ack_tx.clone(),
            in_flight.clone(),
            gate.clone(),
            backlog.clone(),
            cancel.clone(),
        ));
    }
    while let Some(result) = pollers.join_next().await {
        if let Err(e) = result {
            tracing::error!(error = %e, "a poller panicked");
        }
    }

    // One grace period in all, from the stop signal: polls in flight, then handlers.
    let stop_by = *stopped_at.get().unwrap_or(&tokio::time::Instant::now()) + config.shutdown_grace;
    in_flight.tracker.close();
    let remaining = stop_by.saturating_duration_since(tokio::time::Instant::now());
    if tokio::time::timeout(remaining, in_flight.tracker.wait()).await.is_err() {
        // What has not finished is handed back now rather than after its visibility timeout;
        // a handler cut off mid-way is a crash to the next worker, which the status guards and
        // Stripe keys make safe to resume.
        in_flight.stop_heartbeats.cancel();
        let unfinished: Vec<String> =
            in_flight.receipts.lock().expect("not poisoned").drain().flat_map(|(_, r)| r).collect();
        tracing::warn!(
            grace = ?config.shutdown_grace,
            count = unfinished.len(),
            "in-flight messages did not finish in the grace period; releasing them to the queue"
        );
        let mut pending: Vec<(String, i32)> = unfinished.into_iter().map(|r| (r, 0)).collect();
        flush_visibility(&sqs, &config.queue_url, &mut pending, 10).await;
    }
    // Deletes and visibility changes still waiting for a batch go out before we exit.
    let (flushed_tx, flushed_rx) = oneshot::channel();
    if ack_tx.send(Ack::Flush(flushed_tx)).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(5), flushed_rx).await;
    }
    drop(ack_tx);
    if in_flight.tracker.is_empty() {
        let _ = acker.await;
    }
    Ok(())
}

/// The batches being handled: their tasks, and their receipts (to release at a forced stop).
#[derive(Default, Clone)]
struct InFlight {
    tracker: TaskTracker,
    receipts: Arc<Mutex<HashMap<u64, Vec<String>>>>,
    next_id: Arc<AtomicU64>,
    stop_heartbeats: CancellationToken,
}

#[allow(clippy::too_many_arguments)]
async fn poll<H: Handler>(
    poller: usize,
    sqs: Client,
    config: ConsumerConfig,
    handler: Arc<H>,
    permits: Arc<Semaphore>,
    acks: mpsc::Sender<Ack>,
    in_flight: InFlight,
    gate: Arc<Gate>,
    backlog: Arc<Backlog>,
    cancel: CancellationToken,
) {
    let queue = short_name(&config.queue_url).to_owned();
    let mut failures = 0u32;
    let mut last_logged: Option<Instant> = None;
    let mut fill_first = false;
    loop {
        if std::mem::take(&mut fill_first) && !config.fill_delay.is_zero() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(config.fill_delay) => {}
            }
        }
        // Parked first, then the gate: a poller woken after a long park must still find the
        // dependencies up before it receives.
        if poller > 0 && !backlog.wait_deep(&cancel).await {
            return;
        }
        if gate.paused.load(Ordering::Acquire)
            && !wait_until_ready(&*handler, &gate, &queue, poller, &cancel).await
        {
            return;
        }
        let full_batch = config.batch_size.clamp(1, 10).min(config.max_in_flight.max(1));
        let held = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            held = take_permits(&permits, full_batch, config.fill_delay) => held,
        };
        // No poll starts after the stop signal: it could outlast the grace period.
        if cancel.is_cancelled() {
            return;
        }
        let asked = held.num_permits();

        let receive = sqs
            .receive_message()
            .queue_url(&config.queue_url)
            .max_number_of_messages(asked as i32)
            .wait_time_seconds(config.wait_time_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .customize()
            .config_override(aws_sdk_sqs::config::Builder::default().timeout_config(
                crate::aws::long_poll_timeouts(Duration::from_secs(config.wait_time_seconds.max(0) as u64)),
            ))
            .send();
        // A long poll in flight is let finish, up to the grace period: SQS may hand messages to
        // a poll whose client has gone, where they would sit invisible for the visibility
        // timeout with a receive counted for nothing. What it brings is handled as usual.
        tokio::pin!(receive);
        let result = tokio::select! {
            result = &mut receive => result,
            _ = cancel.cancelled() => {
                match tokio::time::timeout(config.shutdown_grace, &mut receive).await {
                    Ok(result) => result,
                    Err(_) => return,
                }
            }
        };
        let messages = match result {
            Ok(out) => {
                failures = 0;
                out.messages.unwrap_or_default()
            }
            Err(e) => {
                // Whatever the queue holds, the extra pollers wait until receiving works.
                backlog.observe(0, 1);
                failures += 1;
                let quiet = last_logged.is_some_and(|t| t.elapsed() < Duration::from_secs(30));
                if !quiet {
                    tracing::warn!(queue, poller, failures, error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "receive failed; backing off");
                    last_logged = Some(Instant::now());
                }
                let delay = Backoff::new(Duration::from_millis(200), Duration::from_secs(10)).delay(failures);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        // Deep only when a whole batch came back: a busy worker asking for a few messages and
        // getting them says nothing about the queue.
        backlog.observe(messages.len(), full_batch);
        if messages.is_empty() {
            continue;
        }
        // A short batch means the queue is shallow: wait a moment before this poller asks
        // again, so the next receive (and its delete, and a publish) carries a fuller batch.
        // At load this halves the calls per message for a few milliseconds of latency.
        fill_first = messages.len() < asked;
        metrics::counter!("sqs_messages_received_total", "queue" => queue.clone())
            .increment(messages.len() as u64);
        let mut held = held;
        if messages.len() < asked {
            drop(held.split(asked - messages.len()));
        }

        let batch: Vec<Received> = messages
            .into_iter()
            .map(|m| Received {
                receive_count: m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(1),
                message_id: m.message_id.unwrap_or_default(),
                receipt_handle: m.receipt_handle.unwrap_or_default(),
                body: m.body.unwrap_or_default(),
            })
            .collect();
        let handler = handler.clone();
        let acks = acks.clone();
        let gate = gate.clone();
        let failure_log = config.failure_log.clone();
        let backoff = config.retry_backoff;
        let queue = queue.clone();
        let visibility = config.visibility_timeout.unwrap_or(Duration::from_secs(30));
        let batch_id = in_flight.next_id.fetch_add(1, Ordering::Relaxed);
        in_flight
            .receipts
            .lock()
            .expect("not poisoned")
            .insert(batch_id, batch.iter().map(|m| m.receipt_handle.clone()).collect());
        let registry = in_flight.receipts.clone();
        let stop_heartbeats = in_flight.stop_heartbeats.clone();
        in_flight.tracker.spawn(async move {
            let keys: Vec<String> = batch.iter().map(|m| failure_key(&m.body, &m.message_id)).collect();
            let receipts: Vec<(String, String, u32)> =
                batch.iter().map(|m| (m.message_id.clone(), m.receipt_handle.clone(), m.receive_count)).collect();
            let outcomes =
                with_heartbeat(handler.handle(batch), &receipts, visibility, &acks, &stop_heartbeats).await;
            let mut failures = Vec::new();
            for (((message_id, receipt, receive_count), outcome), key) in receipts.into_iter().zip(outcomes).zip(keys) {
                metrics::counter!("messages_handled_total", "queue" => queue.clone(), "outcome" => outcome.label())
                    .increment(1);
                let delay = match &outcome {
                    // SQS's longest visibility timeout is 12 hours.
                    Outcome::Wait { after, .. } => (*after).min(Duration::from_secs(43_200)),
                    _ => backoff.delay(receive_count.saturating_sub(1)),
                };
                match &outcome {
                    Outcome::Done => {}
                    Outcome::Retry { reason } => {
                        tracing::warn!(queue, message_id, receive_count, ?delay, reason, "transient failure; the message comes back later")
                    }
                    Outcome::Wait { reason, .. } => {
                        tracing::info!(queue, message_id, receive_count, ?delay, reason, "not yet; the message comes back when it can go on")
                    }
                    Outcome::Blocked { reason } => {
                        if !gate.paused.swap(true, Ordering::AcqRel) {
                            tracing::warn!(queue, reason, "a dependency is down; pausing receives until it answers");
                        }
                    }
                    Outcome::Poison { reason } => {
                        tracing::error!(queue, message_id, receive_count, reason, "unprocessable message; it goes to the DLQ after its last receive")
                    }
                }
                let ack = match outcome.reason() {
                    None => Ack::Delete(receipt),
                    // Every other outcome leaves the message to come back after a backoff sized
                    // by its receive count, and records why for operators.
                    Some(reason) => {
                        failures.push(Failure {
                            key,
                            sqs_message_id: message_id,
                            receive_count,
                            outcome: outcome.label(),
                            reason: reason.to_owned(),
                        });
                        Ack::Visibility(receipt, delay.as_secs().max(1) as i32)
                    }
                };
                // The acker outlives every handler task, so this send only fails if it panicked.
                let _ = acks.send(ack).await;
            }
            if let Some(pool) = &failure_log
                && !failures.is_empty()
            {
                record_failures(pool, &queue, &failures).await;
            }
            registry.lock().expect("not poisoned").remove(&batch_id);
            // The permits go back here, after the acknowledgements are queued.
            drop(held);
        });
    }
}

/// Permits for a batch of `want` messages: all of them if they come free within `patience`
/// (a handler finishing), else as many as are free then (at least one, waiting for it).
async fn take_permits(
    permits: &Arc<Semaphore>,
    want: usize,
    patience: Duration,
) -> tokio::sync::OwnedSemaphorePermit {
    let full = permits.clone().acquire_many_owned(want as u32);
    if let Ok(held) = tokio::time::timeout(patience, full).await {
        return held.expect("the semaphore is never closed");
    }
    let mut held = permits.clone().acquire_owned().await.expect("the semaphore is never closed");
    while held.num_permits() < want {
        match permits.clone().try_acquire_owned() {
            Ok(p) => held.merge(p),
            Err(_) => break,
        }
    }
    held
}

/// Records why messages did not finish, for `fleetctl dlq peek`. Best effort: when the
/// database is what failed, this fails too, and the log line is the record.
/// One message's failure, as recorded for operators.
struct Failure {
    key: String,
    sqs_message_id: String,
    receive_count: u32,
    outcome: &'static str,
    reason: String,
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

async fn record_failures(pool: &sqlx::PgPool, queue: &str, failures: &[Failure]) {
    // Two copies of one message in a batch share a key, and one statement may change a row
    // only once: one entry per key, the last copy's failure, counting them all.
    let mut by_key: Vec<(&Failure, i32)> = Vec::new();
    for failure in failures {
        match by_key.iter_mut().find(|(f, _)| f.key == failure.key) {
            Some(entry) => *entry = (failure, entry.1 + 1),
            None => by_key.push((failure, 1)),
        }
    }
    let keys: Vec<&str> = by_key.iter().map(|(f, _)| f.key.as_str()).collect();
    let ids: Vec<&str> = by_key.iter().map(|(f, _)| f.sqs_message_id.as_str()).collect();
    let counts: Vec<i32> = by_key.iter().map(|(f, _)| f.receive_count as i32).collect();
    let outcomes: Vec<&str> = by_key.iter().map(|(f, _)| f.outcome).collect();
    let reasons: Vec<&str> = by_key.iter().map(|(f, _)| f.reason.as_str()).collect();
    let times: Vec<i32> = by_key.iter().map(|(_, n)| *n).collect();
    let recorded = sqlx::query(
        "INSERT INTO message_failures (queue, message_key, sqs_message_id, receive_count, outcome, reason, failures)
         SELECT $1, k, id, n, o, r, t
           FROM UNNEST($2::text[], $3::text[], $4::int[], $5::text[], $6::text[], $7::int[]) AS f(k, id, n, o, r, t)
         ON CONFLICT (queue, message_key) DO UPDATE
            SET sqs_message_id = EXCLUDED.sqs_message_id, receive_count = EXCLUDED.receive_count,
                outcome = EXCLUDED.outcome, reason = EXCLUDED.reason,
                failures = message_failures.failures + EXCLUDED.failures, updated_at = now()",
    )
    .bind(queue)
    .bind(&keys)
    .bind(&ids)
    .bind(&counts)
    .bind(&outcomes)
    .bind(&reasons)
    .bind(&times)
    .execute(pool)
    .await;
    if let Err(e) = recorded {
        // Warn: a failure not recorded leaves a dead letter without its reason.
        tracing::warn!(error = %e, "could not record message failures");
    }
}

/// Probes until the handler's dependencies answer, with backoff and a log line per interval.
/// Returns false if the stop signal came first.
async fn wait_until_ready<H: Handler>(
    handler: &H,
    gate: &Gate,
    queue: &str,
    poller: usize,
    cancel: &CancellationToken,
) -> bool {
    let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(15));
    let mut attempt = 0;
    let mut last_logged: Option<Instant> = None;
    loop {
        if !gate.paused.load(Ordering::Acquire) {
            return true;
        }
        match handler.ready().await {
            Ok(()) => {
                if gate.paused.swap(false, Ordering::AcqRel) {
                    tracing::info!(
                        queue,
                        poller,
                        probes = attempt + 1,
                        "dependencies answer again; receiving"
                    );
                }
                return true;
            }
            Err(reason) => {
                if last_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                    tracing::warn!(
                        queue,
                        poller,
                        reason,
                        "still waiting for a dependency; receiving nothing"
                    );
                    last_logged = Some(Instant::now());
                }
                tokio::select! {
                    _ = cancel.cancelled() => return false,
                    _ = tokio::time::sleep(backoff.delay(attempt)) => {}
                }
                attempt += 1;
            }
        }
    }
}

/// Runs `work`, extending the visibility of `receipts` every third of `visibility` until it
/// is done.
async fn with_heartbeat<T>(
    work: impl Future<Output = T>,
    receipts: &[(String, String, u32)],
    visibility: Duration,
    acks: &mpsc::Sender<Ack>,
    stop: &CancellationToken,
) -> T {
    let period = (visibility / 3).max(Duration::from_secs(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = ticker.tick(), if !stop.is_cancelled() => {
                metrics::counter!("sqs_visibility_extensions_total").increment(receipts.len() as u64);
                for (_, receipt, _) in receipts {
                    let _ = acks.send(Ack::Visibility(receipt.clone(), visibility.as_secs() as i32)).await;
                }
            }
        }
    }
}

/// The queue's own visibility timeout, which the heartbeat keeps renewing.
async fn queue_visibility_timeout(sqs: &Client, queue_url: &str) -> Duration {
    let read = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
        .send()
        .await;
    let seconds = read
        .ok()
        .and_then(|out| out.attributes)
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout).cloned())
        .and_then(|v| v.parse::<u64>().ok());
    match seconds {
        Some(s) => Duration::from_secs(s),
        None => {
            tracing::warn!(queue_url, "cannot read the queue's visibility timeout; assuming 30 s");
            Duration::from_secs(30)
        }
    }
}

#[derive(Debug)]
enum Ack {
    Delete(String),
    Visibility(String, i32),
    /// Send everything pending now, then answer.
    Flush(oneshot::Sender<()>),
}

/// Batches acknowledgements: at most 10 per call, sent when 10 are waiting or when the oldest
/// has waited `flush` (so latency stays low when traffic is light).
async fn acknowledge(
    sqs: Client,
    queue_url: String,
    mut rx: mpsc::Receiver<Ack>,
    flush: Duration,
    batch: usize,
) {
    let mut deletes: Vec<String> = Vec::new();
    let mut visibility: Vec<(String, i32)> = Vec::new();
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let next = tokio::select! {
            ack = rx.recv() => ack,
            _ = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {
                flush_all(&sqs, &queue_url, &mut deletes, &mut visibility, batch).await;
                deadline = None;
                continue;
            }
        };
        match next {
            Some(Ack::Delete(receipt)) => deletes.push(receipt),
            Some(Ack::Visibility(receipt, seconds)) => visibility.push((receipt, seconds)),
            Some(Ack::Flush(done)) => {
                flush_all(&sqs, &queue_url, &mut deletes, &mut visibility, batch).await;
                let _ = done.send(());
            }
            None => {
                flush_all(&sqs, &queue_url, &mut deletes, &mut visibility, batch).await;
                return;
            }
        }
        if deletes.len() >= batch {
            flush_deletes(&sqs, &queue_url, &mut deletes, batch).await;
        }
        if visibility.len() >= batch {
            flush_visibility(&sqs, &queue_url, &mut visibility, batch).await;
        }
        deadline = if deletes.is_empty() && visibility.is_empty() {
            None
        } else {
            Some(deadline.unwrap_or_else(|| tokio::time::Instant::now() + flush))
        };
    }
}

/// Sends every pending delete and visibility change.
async fn flush_all(
    sqs: &Client,
    queue_url: &str,
    deletes: &mut Vec<String>,
    visibility: &mut Vec<(String, i32)>,
    batch: usize,
) {
    flush_deletes(sqs, queue_url, deletes, batch).await;
    flush_visibility(sqs, queue_url, visibility, batch).await;
}

async fn flush_deletes(sqs: &Client, queue_url: &str, pending: &mut Vec<String>, batch: usize) {
    while !pending.is_empty() {
        let chunk: Vec<String> = pending.drain(..pending.len().min(batch)).collect();
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, receipt)| {
                DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(receipt).build()
            })
            .collect::<Result<_, _>>()
            .expect("id and receipt handle are set");
        match sqs.delete_message_batch().queue_url(queue_url).set_entries(Some(entries)).send().await {
            Ok(out) => {
                for failed in out.failed() {
                    // The message comes back and is handled again; the status guards make that
                    // a no-op. Nothing to retry here.
                    tracing::warn!(
                        code = failed.code(),
                        reason = failed.message(),
                        "a delete failed; the message will be redelivered"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), count = chunk.len(),
                "DeleteMessageBatch failed; the messages will be redelivered and found done")
            }
        }
    }
}

async fn flush_visibility(sqs: &Client, queue_url: &str, pending: &mut Vec<(String, i32)>, batch: usize) {
    // A receipt may be queued twice (a heartbeat, then the retry's backoff): the later wins,
    // and a batch must not carry both, since SQS applies its entries in no set order.
    let mut latest: HashMap<String, usize> = HashMap::new();
    for (i, (receipt, _)) in pending.iter().enumerate() {
        latest.insert(receipt.clone(), i);
    }
    let mut index = 0;
    pending.retain(|(receipt, _)| {
        let keep = latest[receipt] == index;
        index += 1;
        keep
    });
    while !pending.is_empty() {
        let chunk: Vec<(String, i32)> = pending.drain(..pending.len().min(batch)).collect();
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, (receipt, seconds))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(*seconds)
                    .build()
            })
            .collect::<Result<_, _>>()
            .expect("id and receipt handle are set");
        match sqs
            .change_message_visibility_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                for failed in out.failed() {
                    tracing::debug!(
                        code = failed.code(),
                        "a visibility change failed; the queue's own timeout applies"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e),
                "ChangeMessageVisibilityBatch failed; the queue's own timeout applies"),
        }
    }
}

/// The queue's name, from its URL, for logs and metric labels.
pub fn short_name(queue_url: &str) -> &str {
    queue_url.rsplit('/').next().unwrap_or(queue_url)
}
