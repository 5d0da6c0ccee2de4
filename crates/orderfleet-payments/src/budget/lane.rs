//! One endpoint's pace in this process: requests wait their turn, first come first served,
//! and go out spaced so that no window holds more than the share; and, when the process has a
//! ceiling, spaced over all its endpoints together so that no window holds more than it.
//!
//! The rule: a request goes out at `s` only if `s` is at least `WINDOW / share(s)` after the
//! one before it on its endpoint, `share(s)` being the share at that moment, and only while the
//! lease lasts. Then any window `(u - WINDOW, u]` holds at most the largest share in force
//! during it: with `n` requests in it, each gap at least `WINDOW / max`,
//! `(n - 1) · WINDOW / max < WINDOW`. That largest share is what the fleet's rows claim for this
//! process ([`super::share`]). The ceiling is the same rule over every request of the process
//! ([`Ceiling`]): a request takes its endpoint's turn and the ceiling's at the same instant, so a
//! unit of the ceiling moved from one endpoint to another cannot send twice in a window.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::WINDOW;

/// What this process may send on the endpoint now.
#[derive(Debug, Clone, Copy, Default)]
struct Pace {
    share: u32,
    /// Nothing goes out at or past this; `None` before the first lease.
    lease_until: Option<Instant>,
    last_sent: Option<Instant>,
}

impl Pace {
    /// When the next request may go out, not before `not_before` (the ceiling's next turn):
    /// now, later, or not until the share or lease changes.
    fn next_at(&self, now: Instant, not_before: Option<Instant>) -> Option<Instant> {
        let lease_until = self.lease_until.filter(|&until| until > now)?;
        if self.share == 0 {
            return None;
        }
        let at = self.last_sent.map_or(now, |last| (last + WINDOW / self.share).max(now));
        let at = not_before.map_or(at, |floor| at.max(floor));
        (at < lease_until).then_some(at)
    }
}

/// `STRIPE_MAX_REQUESTS_PER_SECOND`: the pace of every request of the process, whatever its
/// endpoint, one every `WINDOW / ceiling`.
#[derive(Debug)]
pub(crate) struct Ceiling {
    per_window: u32,
    last_sent: Mutex<Option<Instant>>,
}

impl Ceiling {
    pub fn new(per_window: u32) -> Self {
        Self { per_window: per_window.max(1), last_sent: Mutex::new(None) }
    }

    fn last_sent(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.last_sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One endpoint's queue and pace.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    pace: Mutex<Pace>,
    /// Wakes the head of the queue when the share or the lease changes.
    changed: Notify,
    /// Whose turn it is: tokio's mutex hands itself over in the order it was asked for.
    turn: tokio::sync::Mutex<()>,
    /// Requests waiting, the one at the head included.
    queued: AtomicUsize,
    /// Requests that asked and that no tick has yet written down as demand.
    arrivals: AtomicU64,
}

impl Lane {
    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The share in force.
    pub fn share(&self) -> u32 {
        self.pace().share
    }

    /// A new share and lease. A lower share is set before the fleet's row says so, a higher
    /// one after ([`super::ledger`]).
    pub fn set(&self, share: u32, lease_until: Option<Instant>) {
        {
            let mut pace = self.pace();
            pace.share = share;
            if lease_until.is_some() {
                pace.lease_until = lease_until;
            }
        }
        self.changed.notify_waiters();
    }

    /// Half the share in force, in one step under the pace's lock: a new share set meanwhile
    /// (a tick's) is halved, never overwritten by a half of the one before it.
    pub fn halve(&self) {
        {
            let mut pace = self.pace();
            pace.share /= 2;
        }
        self.changed.notify_waiters();
    }

    /// A share no higher than the one in force, and a new lease.
    pub fn set_at_most(&self, share: u32, lease_until: Instant) {
        {
            let mut pace = self.pace();
            pace.share = pace.share.min(share);
            pace.lease_until = Some(lease_until);
        }
        self.changed.notify_waiters();
    }

    /// Requests asked for and not yet written down as demand, and requests waiting now. They
    /// stay counted until [`Lane::written_down`]: a tick that fails loses none.
    pub fn arrivals(&self) -> (u64, usize) {
        (self.arrivals.load(Ordering::Acquire), self.queued.load(Ordering::Acquire))
    }

    /// A tick wrote `arrivals` of them down.
    pub fn written_down(&self, arrivals: u64) {
        let _ = self
            .arrivals
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(arrivals)));
    }

    /// Whether requests asked since the last tick, or wait now.
    pub fn busy(&self) -> bool {
        self.arrivals.load(Ordering::Acquire) > 0 || self.queued.load(Ordering::Acquire) > 0
    }

    /// Waits for this request's turn, at most `max_wait`, within the process's `ceiling` when
    /// it has one; false when none came. A request is refused at once when the requests ahead
    /// of it would need longer even at `most`, the share this process is headed for (its
    /// share follows the queue, a tick later). Cancel-safe: a waiter dropped takes no turn.
    pub async fn acquire(&self, max_wait: Duration, most: u32, ceiling: Option<&Ceiling>) -> bool {
        self.arrivals.fetch_add(1, Ordering::AcqRel);
        let ahead = self.queued.fetch_add(1, Ordering::AcqRel);
        let _queued = Leave(&self.queued);
        if WINDOW / most.max(1) * ahead as u32 > max_wait {
            return false;
        }
        tokio::time::timeout(max_wait, self.turn(ceiling)).await.is_ok()
    }

    async fn turn(&self, ceiling: Option<&Ceiling>) {
        let _turn = self.turn.lock().await;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let next = {
                // The endpoint's pace, then the ceiling's: always in this order, and both
                // marked at the one instant the request goes out.
                let mut pace = self.pace();
                let mut whole = ceiling.map(|c| (c.per_window, c.last_sent()));
                let not_before = whole
                    .as_ref()
                    .and_then(|(per_window, last)| last.map(|last| last + WINDOW / *per_window));
                match pace.next_at(now, not_before) {
                    Some(at) if at <= now => {
                        pace.last_sent = Some(now);
                        if let Some((_, last)) = whole.as_mut() {
                            **last = Some(now);
                        }
                        return;
                    }
                    next => next,
                }
            };
            // Woken at the time computed, or by a new share or lease; a turn the ceiling gave
            // another endpoint meanwhile is seen when it wakes, and it sleeps again.
            match next {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

/// A place in the queue, given up however the wait ends.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn lane(share: u32) -> Arc<Lane> {
        let lane = Arc::new(Lane::default());
        lane.set(share, Some(Instant::now() + Duration::from_secs(3600)));
        lane
    }

    async fn grants(lane: &Arc<Lane>, n: usize) -> Vec<Duration> {
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let lane = lane.clone();
            tasks.spawn(async move {
                assert!(lane.acquire(Duration::from_secs(60), 25, None).await);
                started.elapsed()
            });
        }
        let mut granted = tasks.join_all().await;
        granted.sort();
        granted
    }

    #[tokio::test(start_paused = true)]
    async fn no_window_holds_more_than_the_share() {
        let lane = lane(10);
        let granted = grants(&lane, 25).await;
        assert_eq!(granted[0], Duration::ZERO);
        for w in granted.windows(11) {
            assert!(w[10] - w[0] >= WINDOW, "{granted:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ceiling_holds_over_every_lane_together() {
        // Arrange: three endpoints with a share of 2 each, in a process with a ceiling of 2.
        let ceiling = Arc::new(Ceiling::new(2));
        let lanes = [lane(2), lane(2), lane(2)];

        // Act: six requests on each at once.
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for lane in &lanes {
            for _ in 0..6 {
                let (lane, ceiling) = (lane.clone(), ceiling.clone());
                tasks.spawn(async move {
                    assert!(lane.acquire(Duration::from_secs(60), 25, Some(&ceiling)).await);
                    started.elapsed()
                });
            }
        }
        let mut sent = tasks.join_all().await;
        sent.sort();

        // Assert: no window holds three of the process's requests.
        for w in sent.windows(3) {
            assert!(w[2] - w[0] >= WINDOW, "{sent:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lowered_share_spaces_the_next_request_at_once() {
        let lane = lane(10);
        assert!(lane.acquire(Duration::from_secs(1), 25, None).await);
        lane.set(2, None);
        let started = Instant::now();
        assert!(lane.acquire(Duration::from_secs(5), 25, None).await);
        assert!(started.elapsed() >= WINDOW / 2 - Duration::from_millis(1), "{:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_goes_out_without_a_share_or_past_the_lease_and_a_new_one_wakes_the_queue() {
        // Arrange: no share yet.
        let lane = Arc::new(Lane::default());
        let waiting = {
            let lane = lane.clone();
            tokio::spawn(async move { lane.acquire(Duration::from_secs(5), 25, None).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished());

        // Act
        lane.set(5, Some(Instant::now() + Duration::from_millis(100)));

        // Assert
        assert!(waiting.await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!lane.acquire(Duration::from_millis(500), 25, None).await, "past its lease");
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_longer_than_the_wait_at_the_largest_share_is_refused_at_once_and_counted_as_demand() {
        let lane = lane(1);
        assert!(lane.acquire(Duration::from_secs(1), 1, None).await);
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let lane = lane.clone();
                tokio::spawn(async move { lane.acquire(Duration::from_secs(5), 1, None).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        assert!(!lane.acquire(Duration::from_millis(1_500), 1, None).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(lane.arrivals(), (4, 2));
        lane.written_down(3);
        assert_eq!(lane.arrivals(), (1, 2), "what no tick wrote down stays counted");
        for task in waiting {
            assert!(task.await.unwrap());
        }
    }
}
