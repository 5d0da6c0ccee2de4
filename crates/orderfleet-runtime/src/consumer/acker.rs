//! Acknowledgements, batched: the task every batch's deletes and visibility changes go
//! through, and the heartbeat that keeps a batch's messages invisible while it is handled.
//!
//! The acker sends at most 10 entries per call, when 10 are waiting or when the oldest has
//! waited the flush interval, so a busy worker makes one call per 10 messages and a quiet one
//! answers within milliseconds. The calls go through [`AckCalls`]: SQS in production, a
//! recording fake in the timing tests below.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
pub(super) enum Ack {
    Delete(String),
    /// A receipt handle and its new visibility timeout in seconds (0 hands it back now).
    Visibility(String, i32),
    /// Send everything pending now, then answer.
    Flush(oneshot::Sender<()>),
}

/// The two batch calls acknowledging needs, each with at most 10 entries. Failures are the
/// implementation's to log: an acknowledgement that fails leaves the message to come back,
/// which the handlers' status guards and inbox make harmless.
pub(super) trait AckCalls: Send + Sync + 'static {
    fn delete(&self, receipts: &[String]) -> impl Future<Output = ()> + Send;
    fn change_visibility(&self, entries: &[(String, i32)]) -> impl Future<Output = ()> + Send;
}

pub(super) struct SqsAcks {
    sqs: Client,
    queue_url: String,
}

impl SqsAcks {
    pub(super) fn new(sqs: Client, queue_url: &str) -> Self {
        Self { sqs, queue_url: queue_url.to_owned() }
    }
}

impl AckCalls for SqsAcks {
    async fn delete(&self, receipts: &[String]) {
        let entries: Vec<_> = receipts
            .iter()
            .enumerate()
            .map(|(i, receipt)| {
                DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(receipt).build()
            })
            .collect::<Result<_, _>>()
            .expect("id and receipt handle are set");
        match self
            .sqs
            .delete_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                for failed in out.failed() {
                    // The message comes back and is found done; nothing to retry here.
                    tracing::warn!(
                        code = failed.code(),
                        reason = failed.message(),
                        "a delete failed; the message will be redelivered"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %DisplayErrorContext(&e), count = receipts.len(),
                "DeleteMessageBatch failed; the messages will be redelivered and found done"),
        }
    }

    async fn change_visibility(&self, entries: &[(String, i32)]) {
        let entries: Vec<_> = entries
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
        let call =
            self.sqs.change_message_visibility_batch().queue_url(&self.queue_url).set_entries(Some(entries));
        match call.send().await {
            Ok(out) => {
                for failed in out.failed() {
                    tracing::debug!(
                        code = failed.code(),
                        "a visibility change failed; the queue's own timeout applies"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %DisplayErrorContext(&e),
                "ChangeMessageVisibilityBatch failed; the queue's own timeout applies"),
        }
    }
}

/// Starts the acker; it runs until every sender is gone, then sends what is pending.
pub(super) fn start<C: AckCalls>(
    calls: C,
    flush: Duration,
    batch: usize,
    capacity: usize,
) -> (mpsc::Sender<Ack>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, tokio::spawn(acknowledge(calls, rx, flush, batch)))
}

/// The acker's loop: collect, and send when a batch is full or the oldest entry has waited
/// `flush`.
async fn acknowledge<C: AckCalls>(calls: C, mut rx: mpsc::Receiver<Ack>, flush: Duration, batch: usize) {
    let mut pending = Pending::default();
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let next = tokio::select! {
            ack = rx.recv() => ack,
            () = sleep_until(deadline) => {
                pending.send_all(&calls, batch).await;
                deadline = None;
                continue;
            }
        };
        match next {
            Some(Ack::Delete(receipt)) => pending.deletes.push(receipt),
            Some(Ack::Visibility(receipt, seconds)) => pending.visibility.push((receipt, seconds)),
            Some(Ack::Flush(done)) => {
                pending.send_all(&calls, batch).await;
                // The caller may have stopped waiting; nothing to tell it then.
                let _ = done.send(());
            }
            None => return pending.send_all(&calls, batch).await,
        }
        pending.send_full(&calls, batch).await;
        deadline = match pending.is_empty() {
            true => None,
            false => Some(deadline.unwrap_or_else(|| tokio::time::Instant::now() + flush)),
        };
    }
}

/// Until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Acknowledgements waiting for a batch.
#[derive(Default)]
struct Pending {
    deletes: Vec<String>,
    visibility: Vec<(String, i32)>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.visibility.is_empty()
    }

    /// Sends whichever kind has a full batch waiting.
    async fn send_full<C: AckCalls>(&mut self, calls: &C, batch: usize) {
        if self.deletes.len() >= batch {
            self.send_deletes(calls, batch).await;
        }
        if self.visibility.len() >= batch {
            self.send_visibility(calls, batch).await;
        }
    }

    async fn send_all<C: AckCalls>(&mut self, calls: &C, batch: usize) {
        self.send_deletes(calls, batch).await;
        self.send_visibility(calls, batch).await;
    }

    async fn send_deletes<C: AckCalls>(&mut self, calls: &C, batch: usize) {
        while !self.deletes.is_empty() {
            let chunk: Vec<String> = self.deletes.drain(..self.deletes.len().min(batch)).collect();
            calls.delete(&chunk).await;
        }
    }

    async fn send_visibility<C: AckCalls>(&mut self, calls: &C, batch: usize) {
        // A receipt may be queued twice (a heartbeat, then the failure's backoff, or a release
        // at a stop): the later wins, and a batch must not carry both, since SQS applies its
        // entries in no set order.
        let latest: HashMap<String, usize> =
            self.visibility.iter().enumerate().map(|(i, (receipt, _))| (receipt.clone(), i)).collect();
        let mut index = 0;
        self.visibility.retain(|(receipt, _)| {
            let keep = latest[receipt] == index;
            index += 1;
            keep
        });
        while !self.visibility.is_empty() {
            let chunk: Vec<(String, i32)> =
                self.visibility.drain(..self.visibility.len().min(batch)).collect();
            calls.change_visibility(&chunk).await;
        }
    }
}

/// Runs `work`, extending the visibility of `receipts` to `visibility` every third of it until
/// the work is done, so no other worker receives the messages meanwhile. `stop` ends the
/// extensions early (at a forced stop, before the messages are released).
pub(super) async fn with_heartbeat<T>(
    work: impl Future<Output = T>,
    receipts: &[String],
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
                metrics::counter!(crate::metrics::SQS_VISIBILITY_EXTENSIONS.name).increment(receipts.len() as u64);
                for receipt in receipts {
                    let _ = acks.send(Ack::Visibility(receipt.clone(), visibility.as_secs() as i32)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The loop's timing under tokio's paused clock: what is asserted is when each call
    //! happens on the virtual clock, so a slow machine cannot make these flaky.

    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    /// One call to the fake queue: when (virtual time since the test began), which, entries.
    type Call = (Duration, &'static str, Vec<String>);

    /// What the fake queue was asked.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<Call>>>);

    struct FakeCalls {
        start: Instant,
        recorded: Recorded,
    }

    impl AckCalls for FakeCalls {
        async fn delete(&self, receipts: &[String]) {
            self.recorded.0.lock().unwrap().push((self.start.elapsed(), "delete", receipts.to_vec()));
        }

        async fn change_visibility(&self, entries: &[(String, i32)]) {
            let entries = entries.iter().map(|(r, s)| format!("{r}={s}")).collect();
            self.recorded.0.lock().unwrap().push((self.start.elapsed(), "visibility", entries));
        }
    }

    fn acker(flush: Duration) -> (mpsc::Sender<Ack>, JoinHandle<()>, Recorded) {
        let recorded = Recorded::default();
        let calls = FakeCalls { start: Instant::now(), recorded: recorded.clone() };
        let (tx, task) = start(calls, flush, 10, 100);
        (tx, task, recorded)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_acknowledgement_waits_one_flush_interval_and_no_longer() {
        let (acks, task, recorded) = acker(Duration::from_millis(20));

        acks.send(Ack::Delete("r1".into())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        acks.send(Ack::Delete("r2".into())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(acks);
        task.await.unwrap();

        // One call, at 20 ms: the interval counts from the oldest entry, not the newest.
        let calls = recorded.0.lock().unwrap().clone();
        assert_eq!(calls, [(Duration::from_millis(20), "delete", vec!["r1".to_owned(), "r2".to_owned()])]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_a_flush_sends_the_rest() {
        let (acks, _task, recorded) = acker(Duration::from_secs(10));

        for i in 0..12 {
            acks.send(Ack::Delete(format!("r{i}"))).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let (done, flushed) = oneshot::channel();
        acks.send(Ack::Flush(done)).await.unwrap();
        flushed.await.unwrap();

        let calls = recorded.0.lock().unwrap().clone();
        let sizes: Vec<(Duration, usize)> = calls.iter().map(|(at, _, r)| (*at, r.len())).collect();
        assert_eq!(sizes, [(Duration::ZERO, 10), (Duration::from_millis(1), 2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn of_two_visibility_changes_for_one_receipt_the_later_is_sent_alone() {
        let (acks, task, recorded) = acker(Duration::from_millis(20));

        acks.send(Ack::Visibility("r1".into(), 30)).await.unwrap();
        acks.send(Ack::Visibility("r2".into(), 30)).await.unwrap();
        acks.send(Ack::Visibility("r1".into(), 0)).await.unwrap();
        drop(acks);
        task.await.unwrap();

        let calls = recorded.0.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].2, ["r2=30", "r1=0"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_extends_every_third_of_the_visibility_timeout_until_the_work_ends() {
        let (acks, mut rx) = mpsc::channel(100);
        let start = Instant::now();
        let seen = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(ack) = rx.recv().await {
                if let Ack::Visibility(receipt, seconds) = ack {
                    seen.push((start.elapsed(), receipt, seconds));
                }
            }
            seen
        });

        let work = async {
            tokio::time::sleep(Duration::from_secs(35)).await;
            "done"
        };
        let receipts = ["r1".to_owned()];
        let done =
            with_heartbeat(work, &receipts, Duration::from_secs(30), &acks, &CancellationToken::new()).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(acks);

        assert_eq!(done, "done");
        let seen = seen.await.unwrap();
        let at: Vec<u64> = seen.iter().map(|(t, _, _)| t.as_secs()).collect();
        assert_eq!(at, [10, 20, 30], "every 10 s of a 30 s timeout while the work ran, then none");
        assert!(seen.iter().all(|(_, r, s)| r == "r1" && *s == 30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_heartbeat_extends_nothing() {
        let (acks, mut rx) = mpsc::channel(100);
        let stop = CancellationToken::new();
        stop.cancel();

        let work = tokio::time::sleep(Duration::from_secs(35));
        with_heartbeat(work, &["r1".to_owned()], Duration::from_secs(30), &acks, &stop).await;
        drop(acks);

        assert!(rx.recv().await.is_none());
    }
}
