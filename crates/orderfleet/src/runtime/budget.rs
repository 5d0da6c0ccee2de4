//! The Stripe request budget of one process (SPEC §3 `STRIPE_MAX_REQUESTS_PER_SECOND`, §8.9).
//!
//! Stripe limits an account's request rate (25/s per endpoint by default, 100/s per account in
//! live mode) and answers 429 beyond it; operators divide that among the processes that call
//! Stripe, and each process keeps to its share here. Every Stripe request takes a slot first:
//! authorizations, captures, cancels, lookups, the sweeper's searches, the dependency probe,
//! and every retry of any of them.
//!
//! - **Paced, not bursty.** The limiter (governor's GCRA) lets one request through every
//!   `1/n` s with no burst allowance, so no window of one second ever holds more than `n`,
//!   wherever it starts: a bucket allowing bursts of `n` lets through up to `2n - 1` in a
//!   second that straddles a refill. The pace keeps 5 % headroom on top, so that the jitter
//!   between this process and Stripe (a request delayed in a queue, the next one not) cannot
//!   bunch `n + 1` of them into one second at Stripe's end.
//! - **First come, first served.** Waiters queue on a fair mutex, so a slot goes to the
//!   request that has waited longest and none of them starves behind later arrivals.
//! - **A bounded wait.** A request waits at most `max_wait` for its slot, and is refused at
//!   once when the requests queued ahead of it already need longer: the intake then answers
//!   `503 payment_unavailable` with `Retry-After` (the order keeps its units), and a worker
//!   leaves the message for later.
//! - **Measured.** `stripe_budget_wait_seconds` (a histogram of the time each request waited
//!   for its slot) and `stripe_budget_refusals_total` on `/metrics`, by operation.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

/// The pace's headroom over the nominal rate: 5 %.
const HEADROOM: f64 = 1.05;

/// governor's clock, read from tokio's: the same monotonic time in a running process, and the
/// paused clock of a test under `start_paused`, so the budget's tests need no wall clock.
#[derive(Debug, Clone)]
struct TokioClock {
    start: Instant,
}

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

/// The Stripe requests one process may send a second, and how long one may wait for a slot.
pub(crate) struct StripeBudget {
    limiter: RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>,
    clock: TokioClock,
    /// Whose turn it is: tokio's mutex hands itself over in the order it was asked for.
    turn: tokio::sync::Mutex<()>,
    /// Requests waiting for a slot, the one at the head included.
    queued: AtomicUsize,
    per_second: NonZeroU32,
    interval: Duration,
    max_wait: Duration,
}

/// No slot within the bounded wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the Stripe request budget ({per_second}/s) has no slot within {max_wait:?}")]
pub(crate) struct Exhausted {
    /// Requests a second.
    pub per_second: u32,
    /// How long a request may wait for a slot before it is given up.
    pub max_wait: Duration,
}

impl std::fmt::Debug for StripeBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeBudget")
            .field("per_second", &self.per_second)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl StripeBudget {
    /// A budget of `per_second`, each request waiting at most `max_wait`.
    pub fn new(per_second: NonZeroU32, max_wait: Duration) -> Self {
        let interval = Duration::from_secs(1).mul_f64(HEADROOM) / per_second.get();
        let quota = Quota::with_period(interval).expect("a positive interval").allow_burst(NonZeroU32::MIN);
        let clock = TokioClock { start: Instant::now() };
        Self {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            turn: tokio::sync::Mutex::new(()),
            queued: AtomicUsize::new(0),
            per_second,
            interval,
            max_wait,
        }
    }

    /// Waits for this request's slot, for at most the bounded wait.
    pub(crate) async fn acquire(&self, operation: &'static str) -> Result<(), Exhausted> {
        let started = Instant::now();
        let queued = Queued::join(&self.queued);
        // The requests ahead take one interval each; if that alone is past the bound, waiting
        // would only delay the same answer.
        let granted = if self.interval * queued.ahead as u32 > self.max_wait {
            false
        } else {
            tokio::time::timeout(self.max_wait, self.wait_for_slot()).await.is_ok()
        };
        drop(queued);
        let waited = started.elapsed();
        metrics::histogram!("stripe_budget_wait_seconds", "operation" => operation)
            .record(waited.as_secs_f64());
        if granted {
            return Ok(());
        }
        metrics::counter!("stripe_budget_refusals_total", "operation" => operation).increment(1);
        Err(Exhausted { per_second: self.per_second.get(), max_wait: self.max_wait })
    }

    /// Cancel-safe: a waiter dropped in the mutex's queue leaves it, and one dropped while
    /// sleeping has taken no slot (only a passing `check` takes one).
    async fn wait_for_slot(&self) {
        let _turn = self.turn.lock().await;
        while let Err(not_until) = self.limiter.check() {
            tokio::time::sleep(not_until.wait_time_from(self.clock.now())).await;
        }
    }
}

/// A place in the budget's queue, given up when dropped (however the wait ends).
struct Queued<'a> {
    count: &'a AtomicUsize,
    ahead: usize,
}

impl<'a> Queued<'a> {
    fn join(count: &'a AtomicUsize) -> Self {
        Self { ahead: count.fetch_add(1, Ordering::AcqRel), count }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(per_second: u32, max_wait: Duration) -> StripeBudget {
        StripeBudget::new(NonZeroU32::new(per_second).unwrap(), max_wait)
    }

    #[tokio::test(start_paused = true)]
    async fn no_second_holds_more_than_the_budget() {
        // Arrange: 10/s, and 25 requests at once.
        let budget = std::sync::Arc::new(budget(10, Duration::from_secs(10)));
        let started = Instant::now();

        // Act
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..25 {
            let budget = budget.clone();
            tasks.spawn(async move {
                budget.acquire("test").await.unwrap();
                started.elapsed()
            });
        }
        let mut granted: Vec<Duration> = tasks.join_all().await;
        granted.sort();

        // Assert, on the paused clock: one grant at once, then one every 105 ms (10/s with 5 %
        // headroom), so no second holds more than ten.
        // (tokio's timers tick in whole milliseconds, so a wait may end up to 1 ms late.)
        assert_eq!(granted[0], Duration::ZERO);
        for gap in granted.windows(2).map(|w| w[1] - w[0]) {
            assert!((Duration::from_millis(105)..=Duration::from_millis(106)).contains(&gap), "{granted:?}");
        }
        for window in granted.windows(11) {
            assert!(window[10] - window[0] > Duration::from_secs(1), "{granted:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_cannot_get_a_slot_in_time_is_refused_without_taking_one() {
        // Arrange: 2/s, and a wait of at most 100 ms.
        let budget = budget(2, Duration::from_millis(100));
        budget.acquire("test").await.unwrap();

        // Act: the next slot is 525 ms away.
        let asked = Instant::now();
        let refused = budget.acquire("test").await;
        let waited = asked.elapsed();

        // Assert
        assert_eq!(refused, Err(Exhausted { per_second: 2, max_wait: Duration::from_millis(100) }));
        assert!((Duration::from_millis(100)..=Duration::from_millis(101)).contains(&waited), "{waited:?}");
        tokio::time::sleep(Duration::from_millis(550)).await;
        assert!(budget.acquire("test").await.is_ok(), "the refused request took a slot");
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_longer_than_the_wait_is_refused_at_once() {
        // Arrange: 1/s with a 1.5 s bound; two requests already queued ahead.
        let budget = std::sync::Arc::new(budget(1, Duration::from_millis(1_500)));
        budget.acquire("test").await.unwrap();
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                tokio::spawn(async move { budget.acquire("test").await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;

        // Act
        let started = Instant::now();
        let refused = budget.acquire("test").await;

        // Assert
        assert!(refused.is_err());
        assert_eq!(started.elapsed(), Duration::ZERO, "it waited");
        for task in waiting {
            let _ = task.await;
        }
    }
}
