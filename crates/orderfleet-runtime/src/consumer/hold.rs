//! A batch's life, and holding its messages through an outage.
//!
//! A batch is handled under a heartbeat; every outcome is settled ([`Settle`]) but one: a
//! message stopped by a dependency that is down is neither handed back nor dead-lettered. Its
//! batch's task **holds** it (the heartbeat keeps it invisible), closes the worker's gate so
//! no poller receives, waits until the probe passes, and handles it again. SQS counts a
//! receive only when it hands a message out, and a held message is not handed out again: an
//! outage of any length costs a message at most the one receive it came with (SPEC §8.10).
//!
//! What counts as an outage is decided two ways:
//! - **the failure says so**: [`Kind::Outage`], classified where it happened (the database
//!   unreachable, the payment service not answering);
//! - **the loop sees it**: a dependency's failure classified transient is an outage when the
//!   probe fails right after it, or when it is the [`Breaker`]'s third different message
//!   failing on that dependency within its window — what a cut looks like in a shape no
//!   classification foresaw (a connection cut mid-TLS, a proxy answering garbage).
//!
//! A held message is handled again after a backoff and a passing probe, for as long as its
//! failure is classified an outage: a dependency that answers the probe but not the work (a
//! disk full under `SELECT 1`, a service failing captures while lookups answer) is still down, and
//! an outage never dead-letters good work. An outage only *inferred* (a transient failure, then
//! a failing probe or the breaker) is held at most [`MAX_HOLDS`] times: one that keeps failing
//! while its dependencies answer has a problem of its own, and is settled like any other
//! failure (it comes back, and after its third receive goes to the DLQ). At the stop signal
//! the held messages are settled as they are: they come back after a backoff, to another
//! worker.
//!
//! A message **kept in hand** ([`Then::HoldInHand`](crate::failure::Then::HoldInHand)) waits on someone else's work, not on
//! a dependency: another worker's claim on it, say. It is held the same way, but the worker
//! keeps receiving: it is handled again once its `retry_in` has passed, for as long as it says
//! so, and only a stop hands it back; one kept through the stop ([`Then::HoldThroughStop`](crate::failure::Then::HoldThroughStop):
//! its effect happened, only its record is left) is handled again until it is settled or the
//! grace period ends ([`BatchTask::finish_through_stop`]), and only then handed back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::acker::{Ack, with_heartbeat};
use super::gate::{Gate, sleep_or_stop};
use super::settle::{Delivered, Settle};
use super::{Handler, Outcome, Received, failure_key};
use crate::backoff::Backoff;
use crate::failure::{Failure, Kind, Source};

/// How many times a message held for an inferred outage is handled again before it is
/// settled as it is.
pub(super) const MAX_HOLDS: u32 = 10;

/// The wait before a held message is handled again (then the probe must pass too): about 1 s,
/// 2 s, 4 s… up to 30 s, so ten holds span a few minutes of a dependency that answers its
/// probe but not the work.
const HOLD_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// How long the probe that confirms an outage may take.
const PROBE_DEADLINE: Duration = Duration::from_secs(15);

/// Recognises an outage by what the loop sees: [`Breaker::THRESHOLD`] different messages
/// failing on the same dependency within [`Breaker::WINDOW`], none of them permanently.
#[derive(Debug, Default)]
pub(super) struct Breaker {
    recent: Mutex<HashMap<Source, VecDeque<(Instant, String)>>>,
}

impl Breaker {
    const THRESHOLD: usize = 3;
    const WINDOW: Duration = Duration::from_secs(10);

    /// Records a transient failure of message `key` on `source`; true when it trips the
    /// breaker (and the count starts again).
    pub(super) fn trips(&self, source: Source, key: &str) -> bool {
        self.trips_at(source, key, Instant::now())
    }

    fn trips_at(&self, source: Source, key: &str, now: Instant) -> bool {
        let mut recent = self.recent.lock().expect("not poisoned");
        let failures = recent.entry(source).or_default();
        while failures.front().is_some_and(|(at, _)| now.duration_since(*at) > Self::WINDOW) {
            failures.pop_front();
        }
        // The same message failing twice is one message: only different ones say outage.
        failures.retain(|(_, k)| k != key);
        failures.push_back((now, key.to_owned()));
        let tripped = failures.len() >= Self::THRESHOLD;
        if tripped {
            failures.clear();
        }
        tripped
    }
}

/// What one batch's task needs.
pub(super) struct BatchTask<H> {
    pub(super) handler: Arc<H>,
    pub(super) settle: Settle,
    pub(super) gate: Arc<Gate>,
    pub(super) breaker: Arc<Breaker>,
    pub(super) queue: String,
    /// The queue's visibility timeout, which the heartbeat renews.
    pub(super) visibility: Duration,
    pub(super) cancel: CancellationToken,
    pub(super) stop_heartbeats: CancellationToken,
}

impl<H: Handler> BatchTask<H> {
    /// Handles the batch until every message is settled, giving back a permit for each
    /// message as it is settled: a message held or kept in hand keeps only its own.
    pub(super) async fn run(self, batch: Vec<Received>, mut permits: tokio::sync::OwnedSemaphorePermit) {
        let mut pending = batch;
        let mut holds = 0;
        loop {
            let outcomes = self.handle(&pending).await;
            // Sorting may probe for seconds: under the heartbeat, like the handling.
            let receipts: Vec<String> = pending.iter().map(|m| m.receipt_handle.clone()).collect();
            let sorted = self.sort(pending, outcomes, holds < MAX_HOLDS);
            let (held, settled) = self.heartbeat(sorted, &receipts).await;
            let settled_now = settled.len();
            self.settle.batch(settled).await;
            if held.is_empty() {
                return;
            }
            if settled_now > 0 {
                drop(permits.split(settled_now.min(permits.num_permits())));
            }
            // Messages kept in hand wait on another's work; only an outage pauses the worker.
            let outage = held.iter().any(|(_, failure)| !failure.in_hand());
            if outage && self.gate.pause() {
                let failure = &held[0].1;
                tracing::warn!(
                    queue = self.queue,
                    held = held.len(),
                    source = failure.source.as_str(),
                    code = failure.code,
                    reason = failure.reason,
                    "a dependency is down; holding the messages it stopped and receiving nothing until it answers"
                );
            }
            if outage {
                metrics::counter!(crate::metrics::MESSAGES_HELD.name, "queue" => self.queue.clone())
                    .increment(held.len() as u64);
            }
            let receipts: Vec<String> = held.iter().map(|(m, _)| m.receipt_handle.clone()).collect();
            // Extended now, then every third of the timeout while waiting: no gap between the
            // sorting's heartbeat and the wait's first beat lets a held message go visible.
            let visibility = self.visibility.as_secs() as i32;
            for receipt in &receipts {
                let _ = self.settle.acks().send(Ack::Visibility(receipt.clone(), visibility)).await;
            }
            let again = match outage {
                true => self.heartbeat(self.wait_to_try_again(holds), &receipts).await,
                false => self.heartbeat(self.wait_in_hand(&held), &receipts).await,
            };
            if !again {
                // Stopping: the held messages come back after a backoff, to another worker;
                // those whose effect happened are first given the grace period to be recorded.
                let (finish, give_back): (Vec<_>, Vec<_>) =
                    held.into_iter().partition(|(_, f)| f.through_stop());
                let settled =
                    give_back.into_iter().map(|(m, failure)| (Delivered::of(&m), Err(failure))).collect();
                self.settle.batch(settled).await;
                self.finish_through_stop(finish).await;
                return;
            }
            holds += u32::from(outage);
            pending = held.into_iter().map(|(m, _)| m).collect();
        }
    }

    /// After the stop signal: handles the messages kept through the stop again, every
    /// `retry_in`, settling each as it goes, until none is left. The consumer's grace period
    /// bounds it: at its end the heartbeats stop and what is still here is handed back
    /// (`finish_in_flight`).
    async fn finish_through_stop(&self, mut kept: Vec<(Received, Failure)>) {
        while !kept.is_empty() {
            let pause = kept.iter().filter_map(|(_, f)| f.retry_in()).min().unwrap_or(Duration::from_secs(1));
            let receipts: Vec<String> = kept.iter().map(|(m, _)| m.receipt_handle.clone()).collect();
            self.heartbeat(tokio::time::sleep(pause), &receipts).await;
            let pending: Vec<Received> = kept.into_iter().map(|(m, _)| m).collect();
            let outcomes = self.handle(&pending).await;
            let (again, settled): (Vec<_>, Vec<_>) = pending
                .into_iter()
                .zip(outcomes)
                .partition(|(_, outcome)| outcome.as_ref().is_err_and(|f| f.through_stop()));
            let settled = settled.into_iter().map(|(m, outcome)| (Delivered::of(&m), outcome)).collect();
            self.settle.batch(settled).await;
            kept = again.into_iter().filter_map(|(m, outcome)| Some((m, outcome.err()?))).collect();
        }
    }

    async fn handle(&self, batch: &[Received]) -> Vec<Outcome> {
        let receipts: Vec<String> = batch.iter().map(|m| m.receipt_handle.clone()).collect();
        self.heartbeat(self.handler.handle(batch.to_vec()), &receipts).await
    }

    /// `work`, while the messages of `receipts` stay invisible.
    async fn heartbeat<T>(&self, work: impl Future<Output = T>, receipts: &[String]) -> T {
        with_heartbeat(work, receipts, self.visibility, self.settle.acks(), &self.stop_heartbeats).await
    }

    /// Splits the outcomes into the messages to hold (stopped by an outage: always when the
    /// failure says so, while holds are left when the outage is inferred) and the ones to
    /// settle now.
    async fn sort(
        &self,
        batch: Vec<Received>,
        outcomes: Vec<Outcome>,
        may_hold_inferred: bool,
    ) -> (Vec<(Received, Failure)>, Vec<(Delivered, Outcome)>) {
        let mut outage_seen = false;
        for (message, outcome) in batch.iter().zip(&outcomes) {
            if let Err(failure) = outcome
                && is_dependencys(failure)
                && self.breaker.trips(failure.source, &failure_key(&message.body, &message.message_id))
            {
                tracing::warn!(
                    queue = self.queue,
                    source = failure.source.as_str(),
                    "several messages failed on the same dependency in a short time: an outage"
                );
                outage_seen = true;
            }
        }
        // A passing failure of a dependency, right after which it does not answer its probe,
        // is an outage too. One probe for the whole batch.
        if !outage_seen && outcomes.iter().any(|o| o.as_ref().is_err_and(is_dependencys)) {
            let probe = tokio::time::timeout(PROBE_DEADLINE, self.handler.ready()).await;
            outage_seen = !matches!(probe, Ok(Ok(())));
        }
        let (mut held, mut settled) = (Vec::new(), Vec::new());
        for (message, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Err(failure) if failure.in_hand() => held.push((message, failure)),
                Err(failure)
                    if failure.kind == Kind::Outage
                        || (may_hold_inferred && outage_seen && is_dependencys(&failure)) =>
                {
                    held.push((message, failure));
                }
                outcome => settled.push((Delivered::of(&message), outcome)),
            }
        }
        (held, settled)
    }

    /// Waits until the soonest of the messages kept in hand may go on; false at the stop signal.
    async fn wait_in_hand(&self, kept: &[(Received, Failure)]) -> bool {
        let soonest = kept.iter().filter_map(|(_, f)| f.retry_in()).min().unwrap_or(Duration::from_secs(1));
        sleep_or_stop(&self.cancel, soonest).await
    }

    /// Waits a backoff, then until the probe passes; false at the stop signal.
    async fn wait_to_try_again(&self, holds: u32) -> bool {
        sleep_or_stop(&self.cancel, HOLD_BACKOFF.delay(holds)).await
            && self.gate.wait_until_ready(&*self.handler, &self.queue, &self.cancel).await
    }
}

/// A dependency's passing failure that did not name when to try again: the kind an outage in
/// an unforeseen shape takes.
fn is_dependencys(failure: &Failure) -> bool {
    failure.kind == Kind::Transient && failure.source.is_dependency() && failure.retry_in().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_different_messages_failing_on_one_dependency_within_the_window_trip_the_breaker() {
        let breaker = Breaker::default();
        let t0 = Instant::now();
        assert!(!breaker.trips_at(Source::Database, "a", t0));
        // The same message again is still one message.
        assert!(!breaker.trips_at(Source::Database, "a", t0 + Duration::from_secs(1)));
        // Another dependency counts on its own.
        assert!(!breaker.trips_at(Source::Sqs, "b", t0 + Duration::from_secs(1)));
        assert!(!breaker.trips_at(Source::Database, "b", t0 + Duration::from_secs(2)));
        assert!(breaker.trips_at(Source::Database, "c", t0 + Duration::from_secs(3)));
        // Tripped, it starts again; failures older than the window are forgotten.
        assert!(!breaker.trips_at(Source::Database, "d", t0 + Duration::from_secs(4)));
        assert!(!breaker.trips_at(Source::Database, "e", t0 + Duration::from_secs(20)));
        assert!(!breaker.trips_at(Source::Database, "f", t0 + Duration::from_secs(31)));
    }
}
