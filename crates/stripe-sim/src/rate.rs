//! Stripe's request rate limit, and counts of the API traffic the simulator saw (SPEC §6).
//!
//! Stripe answers requests beyond an account's rate with 429 `rate_limit`. A test or demo
//! sets a limit to show the fleet backing off and retrying instead of failing orders, and
//! reads the counts to show how hard the fleet pushed and how often it was held back.
//!
//! The limit is a sliding one-second window, not calendar seconds: a request is admitted iff
//! fewer than N requests were admitted in the second before it. A burst then meets the same
//! answer whenever it starts, where calendar seconds would let up to 2N through a burst that
//! straddles a second boundary, and tests would flake on when they happened to run. Only
//! admitted requests fill the window, so a client that keeps retrying still gets N through
//! each second, as with Stripe, rather than being shut out for as long as it retries.
//!
//! [`Traffic`] is told the time rather than reading the clock, so the window is tested with
//! made-up instants instead of sleeps.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How far back the limit and `max_requests_in_one_second` look.
const WINDOW: Duration = Duration::from_secs(1);

/// What `GET /_sim/stats` answers: counts of the API (`/v1/…`) requests received since the
/// simulator started or was last reset. The `/_sim` routes are neither limited nor counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RequestStats {
    /// Every API request received, admitted or not.
    pub requests: u64,
    /// The requests the rate limit answered with 429. Injected `error_429` faults are not
    /// counted: they are faults a test armed, not the limit at work.
    pub rate_limited: u64,
    /// The most API requests received (admitted or not) in any one-second window.
    pub max_requests_in_one_second: u64,
}

/// What the limit makes of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admitted,
    /// Answer 429 `rate_limit` without going further.
    Limited,
}

/// The rate limit with the recent requests it judges by, and the counts.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    /// Requests admitted per second; `None` admits everything.
    limit: Option<NonZeroU32>,
    /// When the requests admitted in the last second arrived, oldest first. Kept without a
    /// limit too, so a limit set mid-burst judges the burst as it really was.
    admitted: VecDeque<Instant>,
    /// When every request received in the last second arrived, oldest first.
    received: VecDeque<Instant>,
    stats: RequestStats,
    /// TCP connections accepted (`GET /_sim/connections`).
    connections: u64,
}

impl Traffic {
    /// `per_second` requests a second; 0 for no limit.
    pub(crate) fn with_limit(per_second: u32) -> Self {
        Self { limit: NonZeroU32::new(per_second), ..Self::default() }
    }

    /// Sets the limit (0 clears it). The window is not emptied: requests admitted in the last
    /// second count against the new limit, as "N in one second" says.
    pub(crate) fn set_limit(&mut self, per_second: u32) {
        self.limit = NonZeroU32::new(per_second);
    }

    /// Requests admitted per second; 0 for no limit.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.map_or(0, NonZeroU32::get)
    }

    pub(crate) fn stats(&self) -> RequestStats {
        self.stats
    }

    /// Counts a TCP connection accepted.
    pub(crate) fn connected(&mut self) {
        self.connections += 1;
    }

    /// TCP connections accepted since the start or the last reset: how many a client opened
    /// for its requests. A client that keeps its connections pays one TLS handshake with
    /// Stripe for many requests; one that does not pays one a request.
    pub(crate) fn connections(&self) -> u64 {
        self.connections
    }

    /// Judges and counts one API request arriving at `now`. Calls must come in time order
    /// (the caller reads the clock under the simulator's lock).
    pub(crate) fn arrive(&mut self, now: Instant) -> Verdict {
        forget_older_than_a_second(&mut self.received, now);
        self.received.push_back(now);
        self.stats.requests += 1;
        let in_one_second = u64::try_from(self.received.len()).unwrap_or(u64::MAX);
        self.stats.max_requests_in_one_second = self.stats.max_requests_in_one_second.max(in_one_second);

        forget_older_than_a_second(&mut self.admitted, now);
        let full = self.limit.is_some_and(|limit| self.admitted.len() >= limit.get() as usize);
        if full {
            self.stats.rate_limited += 1;
            Verdict::Limited
        } else {
            self.admitted.push_back(now);
            Verdict::Admitted
        }
    }
}

/// Drops the instants a second or more before `now`: a request exactly one second ago is out
/// of the window.
fn forget_older_than_a_second(arrivals: &mut VecDeque<Instant>, now: Instant) {
    while arrivals.front().is_some_and(|&at| now.duration_since(at) >= WINDOW) {
        arrivals.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn the_window_slides_with_each_admitted_request() {
        let start = Instant::now();
        let mut traffic = Traffic::with_limit(2);
        let verdicts: Vec<Verdict> = [0, 100, 200, 999, 1000, 1050, 1100]
            .into_iter()
            .map(|at| traffic.arrive(start + ms(at)))
            .collect();

        use Verdict::{Admitted, Limited};
        // 1000 ms: the request at 0 has left the window; 1050: the one at 100 has not yet.
        assert_eq!(verdicts, [Admitted, Admitted, Limited, Limited, Admitted, Limited, Admitted]);
        // At 1050 ms the last second held 100, 200, 999, 1000 and 1050, limited or not.
        assert_eq!(
            traffic.stats(),
            RequestStats { requests: 7, rate_limited: 3, max_requests_in_one_second: 5 }
        );
    }

    #[test]
    fn limited_requests_do_not_fill_the_window() {
        let start = Instant::now();
        let mut traffic = Traffic::with_limit(1);
        assert_eq!(traffic.arrive(start), Verdict::Admitted);
        assert_eq!(traffic.arrive(start + ms(500)), Verdict::Limited);
        assert_eq!(traffic.arrive(start + ms(1000)), Verdict::Admitted);
    }

    #[test]
    fn the_busiest_second_counts_every_request_in_any_trailing_window() {
        let start = Instant::now();
        let mut traffic = Traffic::with_limit(1);
        for at in [0, 100, 200, 1150, 1160, 1170, 1180, 1190, 5000] {
            traffic.arrive(start + ms(at));
        }
        // (190 ms, 1190 ms] holds 200 and the five from 1150 on, limited or not; no calendar
        // second holds more than five.
        assert_eq!(traffic.stats().max_requests_in_one_second, 6);
        assert_eq!(traffic.stats().requests, 9);
    }

    #[test]
    fn no_limit_admits_everything_and_zero_clears_a_limit() {
        let start = Instant::now();
        let mut traffic = Traffic::default();
        assert!((0..100).all(|i| traffic.arrive(start + ms(i)) == Verdict::Admitted));
        assert_eq!(traffic.limit(), 0);

        traffic.set_limit(100);
        assert_eq!(
            traffic.arrive(start + ms(100)),
            Verdict::Limited,
            "the burst counts against the new limit"
        );
        traffic.set_limit(0);
        assert_eq!(traffic.arrive(start + ms(101)), Verdict::Admitted);
        assert_eq!(traffic.stats().rate_limited, 1);
        assert_eq!(traffic.stats().max_requests_in_one_second, 102);
    }
}
