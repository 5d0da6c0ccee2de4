//! One poller: a long poll at a time, its batch handed to a task of its own.
//!
//! A turn is four steps, each a method below: [`Poller::wait_for_turn`] (the fill delay, the
//! backlog, the gate, permits), [`Poller::receive`] (one long poll), [`Poller::dispatch`]
//! (the batch to its task, under a heartbeat) and, in that task, [`Settle::batch`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::acker::Ack;
use super::gate::{Gate, sleep_or_stop};
use super::hold::{BatchTask, Breaker};
use super::settle::Settle;
use super::{ConsumerConfig, Handler, Received, short_name};
use crate::backlog::Backlog;
use crate::backoff::Backoff;

/// What a worker's pollers share.
#[derive(Clone)]
pub(super) struct Shared {
    /// Messages in flight, across pollers: a poller receives no more than it holds permits for.
    pub(super) permits: Arc<Semaphore>,
    pub(super) acks: mpsc::Sender<Ack>,
    pub(super) in_flight: InFlight,
    pub(super) gate: Arc<Gate>,
    /// Sees an outage in failures no classification called one ([`Breaker`]).
    pub(super) breaker: Arc<Breaker>,
    pub(super) backlog: Arc<Backlog>,
    pub(super) cancel: CancellationToken,
}

/// The batches being handled: their tasks, and their receipts (to release at a forced stop).
#[derive(Default, Clone)]
pub(super) struct InFlight {
    pub(super) tracker: TaskTracker,
    receipts: Arc<Mutex<HashMap<u64, Vec<String>>>>,
    next_id: Arc<AtomicU64>,
    pub(super) stop_heartbeats: CancellationToken,
}

impl InFlight {
    fn register(&self, receipts: Vec<String>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.receipts.lock().expect("not poisoned").insert(id, receipts);
        id
    }

    fn forget(&self, id: u64) {
        self.receipts.lock().expect("not poisoned").remove(&id);
    }

    /// Every receipt still in flight, forgotten.
    pub(super) fn take_all(&self) -> Vec<String> {
        self.receipts.lock().expect("not poisoned").drain().flat_map(|(_, r)| r).collect()
    }
}

pub(super) struct Poller<H> {
    id: usize,
    queue: String,
    sqs: Client,
    config: Arc<ConsumerConfig>,
    handler: Arc<H>,
    shared: Shared,
    /// Receives failed in a row, for the backoff and the log.
    failures: u32,
    last_logged: Option<Instant>,
    /// The last receive came back short: wait a moment before the next, to let the queue fill.
    fill_first: bool,
}

impl<H: Handler> Poller<H> {
    pub(super) fn new(
        id: usize,
        sqs: Client,
        config: Arc<ConsumerConfig>,
        handler: Arc<H>,
        shared: Shared,
    ) -> Self {
        let queue = short_name(&config.queue_url).to_owned();
        Self { id, queue, sqs, config, handler, shared, failures: 0, last_logged: None, fill_first: false }
    }

    /// Turns until the stop signal.
    pub(super) async fn run(mut self) {
        while let Some(permits) = self.wait_for_turn().await {
            crate::failpoint::panic_at("poller_panics");
            let Some(batch) = self.receive(permits.num_permits()).await else { return };
            if !batch.is_empty() {
                self.dispatch(batch, permits);
            }
        }
    }

    /// Waits until this poller may receive, and takes permits for the messages it will ask
    /// for; `None` at the stop signal.
    async fn wait_for_turn(&mut self) -> Option<OwnedSemaphorePermit> {
        let cancel = &self.shared.cancel;
        if std::mem::take(&mut self.fill_first)
            && !self.config.fill_delay.is_zero()
            && !sleep_or_stop(cancel, self.config.fill_delay).await
        {
            return None;
        }
        // Parked first, then the gate: a poller woken after a long park must still find the
        // dependencies up before it receives.
        if self.id > 0 && !self.shared.backlog.wait_deep(cancel).await {
            return None;
        }
        if !self.shared.gate.wait_until_ready(&*self.handler, &self.queue, cancel).await {
            return None;
        }
        let held = tokio::select! {
            biased;
            _ = cancel.cancelled() => return None,
            held = take_permits(&self.shared.permits, self.full_batch(), self.config.fill_delay) => held,
        };
        // No poll starts after the stop signal: it could outlast the grace period.
        (!cancel.is_cancelled()).then_some(held)
    }

    fn full_batch(&self) -> usize {
        self.config.batch().min(self.config.max_in_flight.max(1))
    }

    /// One long poll for up to `asked` messages: what it brought (nothing after a failed
    /// receive, once its backoff has passed), or `None` at the stop signal.
    async fn receive(&mut self, asked: usize) -> Option<Vec<Received>> {
        let wait = self.config.wait_time_seconds;
        let receive = self
            .sqs
            .receive_message()
            .queue_url(&self.config.queue_url)
            .max_number_of_messages(asked as i32)
            .wait_time_seconds(wait)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_attribute_names(crate::trace::TRACEPARENT)
            .customize()
            .config_override(
                aws_sdk_sqs::config::Builder::default()
                    .timeout_config(crate::aws::long_poll_timeouts(Duration::from_secs(wait.max(0) as u64))),
            )
            .send();
        // A long poll in flight is let finish, up to the grace period: SQS may hand messages to
        // a poll whose client has gone, where they would sit invisible for the visibility
        // timeout with a receive counted for nothing. What it brings is handled as usual.
        tokio::pin!(receive);
        let result = tokio::select! {
            result = &mut receive => result,
            _ = self.shared.cancel.cancelled() => {
                tokio::time::timeout(self.config.shutdown_grace, &mut receive).await.ok()?
            }
        };
        match result {
            Ok(out) => Some(self.received(out, asked)),
            Err(e) => {
                self.receive_failed(&e).await?;
                Some(Vec::new())
            }
        }
    }

    /// What a receive brought, and what it says about the queue.
    fn received(&mut self, out: ReceiveMessageOutput, asked: usize) -> Vec<Received> {
        self.failures = 0;
        let (messages, damaged) = split_damaged(out.messages.unwrap_or_default());
        for message in damaged {
            // Neither handled nor deleted: handed back after a pause, for a receive that brings
            // it whole. Each one counts toward its redrive, as any receive does; the pause
            // keeps a way that damages every body from spending a message's receives in
            // seconds.
            metrics::counter!(crate::metrics::SQS_MESSAGES_DAMAGED.name, "queue" => self.queue.clone())
                .increment(1);
            tracing::warn!(
                queue = self.queue,
                message_id = message.message_id().unwrap_or_default(),
                "a received message does not match its MD5OfBody; handing it back unhandled"
            );
            if let Some(receipt) = message.receipt_handle {
                let _ = self.shared.acks.try_send(Ack::Visibility(receipt, DAMAGED_BACK_AFTER_SECONDS));
            }
        }
        // Deep only when a whole batch came back: a busy worker asking for a few messages and
        // getting them says nothing about the queue.
        self.shared.backlog.observe(messages.len(), self.full_batch());
        // A short batch means the queue is shallow: wait a moment before asking again, so the
        // next receive (and its delete, and a publish) carries a fuller batch. At load this
        // halves the calls per message for a few milliseconds of latency.
        self.fill_first = !messages.is_empty() && messages.len() < asked;
        metrics::counter!(crate::metrics::SQS_MESSAGES_RECEIVED.name, "queue" => self.queue.clone())
            .increment(messages.len() as u64);
        messages.into_iter().map(received).collect()
    }

    /// Backs off after a failed receive, logging once per 30 s; `None` at the stop signal.
    async fn receive_failed(&mut self, e: &impl std::error::Error) -> Option<()> {
        // Whatever the queue holds, the extra pollers wait until receiving works.
        self.shared.backlog.observe(0, 1);
        self.failures += 1;
        if self.last_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
            let (queue, poller, failures) = (&self.queue, self.id, self.failures);
            tracing::warn!(queue, poller, failures, error = %aws_sdk_sqs::error::DisplayErrorContext(e), "receive failed; backing off");
            self.last_logged = Some(Instant::now());
        }
        let delay = Backoff::new(Duration::from_millis(200), Duration::from_secs(10)).delay(self.failures);
        sleep_or_stop(&self.shared.cancel, delay).await.then_some(())
    }

    /// Hands the batch to a task of its own ([`BatchTask`]), or each message to one of its own
    /// ([`Handler::EACH_ON_ITS_OWN`]): the handler runs under a heartbeat, then every outcome is
    /// settled, but for the messages an outage stopped, which the task holds until the
    /// dependency answers. The permits for messages that did not come go back now; the rest
    /// when their task is settled.
    fn dispatch(&self, batch: Vec<Received>, mut permits: OwnedSemaphorePermit) {
        if batch.len() < permits.num_permits() {
            // Permits for messages the receive did not bring: back to the pool at once.
            drop(permits.split(permits.num_permits() - batch.len()));
        }
        if H::EACH_ON_ITS_OWN && batch.len() > 1 {
            for message in batch {
                let permit = permits.split(1).expect("a permit for each message");
                self.dispatch_task(vec![message], permit);
            }
            return;
        }
        self.dispatch_task(batch, permits);
    }

    /// Spawns the task of one batch, which gives `permits` back as its messages are settled.
    fn dispatch_task(&self, batch: Vec<Received>, permits: OwnedSemaphorePermit) {
        let receipts: Vec<String> = batch.iter().map(|m| m.receipt_handle.clone()).collect();
        let in_flight = self.shared.in_flight.clone();
        let batch_id = in_flight.register(receipts);
        let task = BatchTask {
            handler: self.handler.clone(),
            settle: Settle::new(
                &self.queue,
                &self.config,
                self.shared.acks.clone(),
                self.shared.gate.clone(),
                self.shared.cancel.clone(),
            ),
            gate: self.shared.gate.clone(),
            breaker: self.shared.breaker.clone(),
            queue: self.queue.clone(),
            visibility: self.config.visibility_timeout.unwrap_or(Duration::from_secs(30)),
            cancel: self.shared.cancel.clone(),
            stop_heartbeats: in_flight.stop_heartbeats.clone(),
        };
        self.shared.in_flight.tracker.spawn(async move {
            // The permits go back as their messages are settled, after their acknowledgements
            // are queued.
            task.run(batch, permits).await;
            in_flight.forget(batch_id);
        });
    }
}

/// How long a message whose body came damaged stays invisible before it is received again.
const DAMAGED_BACK_AFTER_SECONDS: i32 = 30;

/// The messages whose body is the one SQS stored, and the ones damaged on the way.
///
/// SQS sends with every message `MD5OfBody`, the MD5 of the body it stored; a body that does
/// not match it was changed on the way (a proxy, a bug). The AWS SDKs for Java and Python check
/// it and retry; the SDK for Rust does not, so the consumer does. A message without the
/// digest is taken as it is.
pub(super) fn split_damaged(messages: Vec<Message>) -> (Vec<Message>, Vec<Message>) {
    messages.into_iter().partition(|m| match (m.body(), m.md5_of_body()) {
        (Some(body), Some(expected)) => body_matches(body, expected),
        _ => true,
    })
}

fn body_matches(body: &str, md5_of_body: &str) -> bool {
    use md5::Digest;
    hex::encode(md5::Md5::digest(body.as_bytes())).eq_ignore_ascii_case(md5_of_body)
}

fn received(m: Message) -> Received {
    let mut received = Received {
        receive_count: m
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|c| c.parse().ok())
            .unwrap_or(1),
        traceparent: m
            .message_attributes()
            .and_then(|a| a.get(crate::trace::TRACEPARENT))
            .and_then(|v| v.string_value())
            .map(str::to_owned),
        message_id: m.message_id.unwrap_or_default(),
        receipt_handle: m.receipt_handle.unwrap_or_default(),
        body: m.body.unwrap_or_default(),
        span: tracing::Span::none(),
    };
    received.span = Received::span_for(&received.message_id, &received.body, received.traceparent.as_deref());
    received
}

/// Permits for a batch of `want` messages: all of them if they come free within `patience`
/// (a handler finishing), else as many as are free then (at least one, waiting for it).
async fn take_permits(permits: &Arc<Semaphore>, want: usize, patience: Duration) -> OwnedSemaphorePermit {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &str, md5_of_body: &str) -> Message {
        Message::builder().message_id(body).body(body).md5_of_body(md5_of_body).receipt_handle("r").build()
    }

    #[test]
    fn a_message_whose_body_does_not_match_its_md5_is_set_apart() {
        // MD5("hello"), as SQS computes it.
        let whole = message("hello", "5d41402abc4b2a76b9719d911017c592");
        let damaged = message("hellO", "5d41402abc4b2a76b9719d911017c592");
        let unchecked = Message::builder().body("no digest").build();
        let (kept, set_apart) = split_damaged(vec![whole, damaged, unchecked]);
        assert_eq!(kept.iter().map(|m| m.body().unwrap()).collect::<Vec<_>>(), ["hello", "no digest"]);
        assert_eq!(set_apart.len(), 1);
        assert_eq!(set_apart[0].body(), Some("hellO"));
    }
}
