//! Stripe's request rate limits, and counts of the API traffic the simulator saw (SPEC §6).
//!
//! Stripe limits the requests of an account in two ways at once (docs.stripe.com/rate-limits):
//! all of them together (100 a second in live mode, 25 in a sandbox), and each named operation
//! apart (25 a second unless noted): `POST /v1/payment_intents`, `GET /v1/payment_intents/{id}`
//! (every id together), `POST /v1/payment_intents/{id}/capture`… each have a limit of their
//! own, and count against the account's too. A request beyond either is answered 429
//! `rate_limit`. A test or demo sets the limits to show the fleet backing off and retrying
//! instead of failing orders, and reads the counts to show how hard the fleet pushed, overall
//! and on each operation, and how often it was held back.
//!
//! Each limit is a sliding one-second window, not calendar seconds: a request is admitted iff
//! fewer than N requests were admitted in the second before it (overall), and fewer than M on
//! its operation. A burst then meets the same answer whenever it starts, where calendar seconds
//! would let up to 2N through a burst that straddles a second boundary, and tests would flake
//! on when they happened to run. Only admitted requests fill the windows, so a client that
//! keeps retrying still gets N through each second, as with Stripe, rather than being shut out
//! for as long as it retries.
//!
//! [`Traffic`] is told the time rather than reading the clock, so the windows are tested with
//! made-up instants instead of sleeps.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How far back the limits and the busiest-second counts look.
const WINDOW: Duration = Duration::from_secs(1);

/// The named operations the simulator serves, as Stripe's rate limits name them: each is
/// limited apart, whatever the id in its path.
const OPERATIONS: [(&str, &[&str], &str); 9] = [
    ("POST", &["payment_intents"], "POST /v1/payment_intents"),
    ("GET", &["payment_intents"], "GET /v1/payment_intents"),
    ("GET", &["payment_intents", "search"], "GET /v1/payment_intents/search"),
    ("GET", &["payment_intents", "{id}"], "GET /v1/payment_intents/{id}"),
    ("POST", &["payment_intents", "{id}", "capture"], "POST /v1/payment_intents/{id}/capture"),
    ("POST", &["payment_intents", "{id}", "cancel"], "POST /v1/payment_intents/{id}/cancel"),
    ("POST", &["payment_intents", "{id}", "confirm"], "POST /v1/payment_intents/{id}/confirm"),
    ("POST", &["refunds"], "POST /v1/refunds"),
    ("GET", &["payment_methods", "{id}"], "GET /v1/payment_methods/{id}"),
];

/// The named operation a request to `path` with `method` is, as `GET /_sim/stats` spells it
/// (`POST /v1/payment_intents/{id}/capture`); `None` for a path the simulator does not serve,
/// which only the account's limit counts.
pub(crate) fn operation_of(method: &str, path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.strip_prefix("/v1/")?.split('/').collect();
    let fits = |pattern: &[&str]| {
        pattern.len() == segments.len()
            && pattern.iter().zip(&segments).all(|(want, got)| match *want {
                // An id is any segment but the literal the more specific route takes.
                "{id}" => !got.is_empty() && *got != "search",
                literal => literal == *got,
            })
    };
    OPERATIONS.iter().find(|(m, pattern, _)| *m == method && fits(pattern)).map(|(_, _, name)| *name)
}

/// What `GET /_sim/stats` answers: counts of the API (`/v1/…`) requests received since the
/// simulator started or was last reset. The `/_sim` routes are neither limited nor counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestStats {
    /// Every API request received, admitted or not.
    pub requests: u64,
    /// The requests a rate limit (the account's or an operation's) answered with 429.
    /// Injected `error_429` faults are not counted: they are faults a test armed, not the
    /// limits at work.
    pub rate_limited: u64,
    /// The most API requests received (admitted or not) in any one-second window.
    pub max_requests_in_one_second: u64,
    /// The same, for each named operation that was called (`"POST /v1/payment_intents"`, …).
    pub max_requests_in_one_second_by_endpoint: BTreeMap<String, u64>,
    /// The requests received on each named operation that was called, admitted or not.
    pub requests_by_endpoint: BTreeMap<String, u64>,
}

/// What the limits make of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admitted,
    /// Answer 429 `rate_limit` without going further.
    Limited,
}

/// Requests admitted per second by the account's limit and by each operation's; `None`
/// admits everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) per_second: Option<NonZeroU32>,
    pub(crate) per_endpoint: Option<NonZeroU32>,
}

#[cfg(test)]
impl Limits {
    /// `per_second` overall and `per_endpoint` on each operation; 0 for no limit.
    pub(crate) fn new(per_second: u32, per_endpoint: u32) -> Self {
        Self { per_second: NonZeroU32::new(per_second), per_endpoint: NonZeroU32::new(per_endpoint) }
    }
}

/// The recent requests one limit judges by.
#[derive(Debug, Default)]
struct Window {
    /// When the requests admitted in the last second arrived, oldest first. Kept without a
    /// limit too, so a limit set mid-burst judges the burst as it really was.
    admitted: VecDeque<Instant>,
    /// When every request received in the last second arrived, oldest first.
    received: VecDeque<Instant>,
    /// The most received in any one-second window.
    busiest: u64,
    /// Every request received.
    received_in_all: u64,
}

impl Window {
    /// Counts a request received at `now`.
    fn receive(&mut self, now: Instant) {
        forget_older_than_a_second(&mut self.received, now);
        self.received.push_back(now);
        self.received_in_all += 1;
        let in_one_second = u64::try_from(self.received.len()).unwrap_or(u64::MAX);
        self.busiest = self.busiest.max(in_one_second);
    }

    /// Whether `limit` admits one more request at `now`.
    fn has_room(&mut self, now: Instant, limit: Option<NonZeroU32>) -> bool {
        forget_older_than_a_second(&mut self.admitted, now);
        limit.is_none_or(|limit| self.admitted.len() < limit.get() as usize)
    }
}

/// The rate limits with the recent requests they judge by, and the counts.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    limits: Limits,
    account: Window,
    operations: HashMap<&'static str, Window>,
    requests: u64,
    rate_limited: u64,
    /// TCP connections accepted (`GET /_sim/connections`).
    connections: u64,
}

impl Traffic {
    pub(crate) fn with_limits(limits: Limits) -> Self {
        Self { limits, ..Self::default() }
    }

    /// Sets the limits (0 clears one). The windows are not emptied: requests admitted in the
    /// last second count against the new limits, as "N in one second" says.
    pub(crate) fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn stats(&self) -> RequestStats {
        RequestStats {
            requests: self.requests,
            rate_limited: self.rate_limited,
            max_requests_in_one_second: self.account.busiest,
            max_requests_in_one_second_by_endpoint: self
                .operations
                .iter()
                .map(|(name, window)| ((*name).to_owned(), window.busiest))
                .collect(),
            requests_by_endpoint: self
                .operations
                .iter()
                .map(|(name, window)| ((*name).to_owned(), window.received_in_all))
                .collect(),
        }
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

    /// Judges and counts one API request arriving at `now` for `operation` (see
    /// [`operation_of`]; `None`: only the account's limit applies). Calls must come in time
    /// order (the caller reads the clock under the simulator's lock).
    pub(crate) fn arrive(&mut self, now: Instant, operation: Option<&'static str>) -> Verdict {
        self.requests += 1;
        self.account.receive(now);
        let mut endpoint = operation.map(|name| self.operations.entry(name).or_default());
        if let Some(window) = endpoint.as_deref_mut() {
            window.receive(now);
        }
        let account_has_room = self.account.has_room(now, self.limits.per_second);
        let endpoint_has_room =
            endpoint.as_deref_mut().is_none_or(|window| window.has_room(now, self.limits.per_endpoint));
        if !(account_has_room && endpoint_has_room) {
            self.rate_limited += 1;
            return Verdict::Limited;
        }
        self.account.admitted.push_back(now);
        if let Some(window) = endpoint {
            window.admitted.push_back(now);
        }
        Verdict::Admitted
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

    const CREATE: Option<&str> = Some("POST /v1/payment_intents");
    const RETRIEVE: Option<&str> = Some("GET /v1/payment_intents/{id}");

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn limited_to(per_second: u32, per_endpoint: u32) -> Traffic {
        Traffic::with_limits(Limits::new(per_second, per_endpoint))
    }

    fn stats(requests: u64, rate_limited: u64, max_requests_in_one_second: u64) -> RequestStats {
        RequestStats { requests, rate_limited, max_requests_in_one_second, ..RequestStats::default() }
    }

    #[test]
    fn the_window_slides_with_each_admitted_request() {
        let start = Instant::now();
        let mut traffic = limited_to(2, 0);
        let verdicts: Vec<Verdict> = [0, 100, 200, 999, 1000, 1050, 1100]
            .into_iter()
            .map(|at| traffic.arrive(start + ms(at), None))
            .collect();

        use Verdict::{Admitted, Limited};
        // 1000 ms: the request at 0 has left the window; 1050: the one at 100 has not yet.
        assert_eq!(verdicts, [Admitted, Admitted, Limited, Limited, Admitted, Limited, Admitted]);
        // At 1050 ms the last second held 100, 200, 999, 1000 and 1050, limited or not.
        assert_eq!(traffic.stats(), stats(7, 3, 5));
    }

    #[test]
    fn limited_requests_do_not_fill_the_window() {
        let start = Instant::now();
        let mut traffic = limited_to(1, 0);
        assert_eq!(traffic.arrive(start, None), Verdict::Admitted);
        assert_eq!(traffic.arrive(start + ms(500), None), Verdict::Limited);
        assert_eq!(traffic.arrive(start + ms(1000), None), Verdict::Admitted);
    }

    #[test]
    fn the_busiest_second_counts_every_request_in_any_trailing_window() {
        let start = Instant::now();
        let mut traffic = limited_to(1, 0);
        for at in [0, 100, 200, 1150, 1160, 1170, 1180, 1190, 5000] {
            traffic.arrive(start + ms(at), None);
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
        assert!((0..100).all(|i| traffic.arrive(start + ms(i), CREATE) == Verdict::Admitted));
        assert_eq!(traffic.limits(), Limits::default());

        traffic.set_limits(Limits::new(100, 0));
        assert_eq!(
            traffic.arrive(start + ms(100), None),
            Verdict::Limited,
            "the burst counts against the new limit"
        );
        traffic.set_limits(Limits::new(0, 100));
        assert_eq!(traffic.arrive(start + ms(101), CREATE), Verdict::Limited, "on its operation too");
        traffic.set_limits(Limits::default());
        assert_eq!(traffic.arrive(start + ms(102), CREATE), Verdict::Admitted);
        assert_eq!(traffic.stats().rate_limited, 2);
        assert_eq!(traffic.stats().max_requests_in_one_second, 103);
    }

    #[test]
    fn each_operation_has_a_window_of_its_own_under_the_accounts() {
        // Arrange: 3 a second overall, 2 on each operation.
        let start = Instant::now();
        let mut traffic = limited_to(3, 2);

        // Act: three creates, then two retrievals of (any) intents, in the same second.
        let verdicts: Vec<Verdict> =
            [(0, CREATE), (10, CREATE), (20, CREATE), (30, RETRIEVE), (40, RETRIEVE)]
                .into_iter()
                .map(|(at, operation)| traffic.arrive(start + ms(at), operation))
                .collect();

        // Assert: the third create meets its operation's limit; the first retrieval is
        // admitted on its own, and the second meets the account's (two creates + one).
        use Verdict::{Admitted, Limited};
        assert_eq!(verdicts, [Admitted, Admitted, Limited, Admitted, Limited]);
        let stats = traffic.stats();
        assert_eq!((stats.requests, stats.rate_limited, stats.max_requests_in_one_second), (5, 2, 5));
        let by_endpoint = BTreeMap::from([
            ("GET /v1/payment_intents/{id}".to_owned(), 2),
            ("POST /v1/payment_intents".to_owned(), 3),
        ]);
        assert_eq!(stats.max_requests_in_one_second_by_endpoint, by_endpoint);
    }

    #[test]
    fn an_operation_is_named_by_its_method_and_its_path_with_the_id_left_out() {
        let named = |method, path| operation_of(method, path);
        assert_eq!(named("POST", "/v1/payment_intents"), Some("POST /v1/payment_intents"));
        assert_eq!(named("GET", "/v1/payment_intents"), Some("GET /v1/payment_intents"));
        assert_eq!(named("GET", "/v1/payment_intents/search"), Some("GET /v1/payment_intents/search"));
        assert_eq!(named("GET", "/v1/payment_intents/pi_1"), Some("GET /v1/payment_intents/{id}"));
        assert_eq!(named("GET", "/v1/payment_intents/pi_2"), named("GET", "/v1/payment_intents/pi_1"));
        let capture = "POST /v1/payment_intents/{id}/capture";
        assert_eq!(named("POST", "/v1/payment_intents/pi_1/capture"), Some(capture));
        assert_eq!(
            named("POST", "/v1/payment_intents/pi_1/cancel"),
            Some("POST /v1/payment_intents/{id}/cancel")
        );
        assert_eq!(named("POST", "/v1/refunds"), Some("POST /v1/refunds"));
        for (method, path) in
            [("GET", "/v1/customers"), ("DELETE", "/v1/payment_intents"), ("POST", "/_sim/reset")]
        {
            assert_eq!(named(method, path), None, "{method} {path}");
        }
    }
}
