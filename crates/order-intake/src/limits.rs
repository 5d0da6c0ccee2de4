//! What keeps one buyer, a bot farm or a flood from taking the intake for itself.
//!
//! - **Per user** (the token's `sub`): at most `INTAKE_USER_RATE_PER_SECOND` requests a second,
//!   with bursts of `INTAKE_USER_BURST`, across every `/v1` route.
//! - **In all**: at most `INTAKE_RATE_PER_SECOND` requests a second reach the routes.
//! - **In flight**: at most `INTAKE_MAX_IN_FLIGHT` requests are worked on at once; the next is
//!   shed at once rather than queued behind them (tower's load shedding over its concurrency
//!   limit).
//! - **Declines**: a user whose cards were declined `INTAKE_DECLINES_PER_HOUR` times in the
//!   last hour is refused before any Stripe call: a card tester learns nothing more.
//!
//! Every refusal is SPEC §4's `429 rate_limited` with `Retry-After`, and writes nothing. The
//! rate limits are GCRA buckets from the governor crate,
//! not hand-made ones; the per-user buckets of users gone quiet are dropped every minute.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use orderfleet_runtime::config::{ConfigError, Env, Seconds};
use orderfleet_words::UserId;

use crate::error::ApiError;

/// The intake's limits, read once at start; the defaults let a real drop through (a buyer
/// retrying a sold-out answer every five seconds is far inside them) and stop a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsConfig {
    /// `INTAKE_USER_RATE_PER_SECOND`: each user's sustained rate.
    pub user_rate_per_second: NonZeroU32,
    /// `INTAKE_USER_BURST`: each user's burst.
    pub user_burst: NonZeroU32,
    /// `INTAKE_RATE_PER_SECOND`: the whole intake's rate, past which it sheds load.
    pub rate_per_second: NonZeroU32,
    /// `INTAKE_MAX_IN_FLIGHT`: requests handled at once.
    pub max_in_flight: usize,
    /// `INTAKE_DECLINES_PER_HOUR`: declined cards in an hour after which a user's orders are
    /// refused before any Stripe call (card testing); 0: no such gate.
    pub declines_per_hour: u32,
    /// Slow clients: how long the request's headers may take to arrive
    /// (`INTAKE_HEADER_TIMEOUT_SECONDS`)…
    pub header_timeout: Duration,
    /// …its body (`INTAKE_BODY_TIMEOUT_SECONDS`)…
    pub body_timeout: Duration,
    /// …and the whole request (`INTAKE_REQUEST_TIMEOUT_SECONDS`).
    pub request_timeout: Duration,
    /// How long a keep-alive connection may wait, idle, for its next request: longer than
    /// the load balancer's own idle timeout (60 s on an ALB), or the balancer sends a buyer's
    /// request on a connection the intake has just closed and answers 502.
    pub idle_timeout: Duration,
}

impl LimitsConfig {
    /// The defaults SPEC §3 gives.
    pub const DEFAULT: Self = Self {
        user_rate_per_second: NonZeroU32::new(5).unwrap(),
        user_burst: NonZeroU32::new(10).unwrap(),
        rate_per_second: NonZeroU32::new(20_000).unwrap(),
        max_in_flight: 1_024,
        declines_per_hour: 5,
        header_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(10),
        // Above what an order takes: a body (10 s), then, for a retried order, a lookup at
        // Stripe and an authorization, each 27.6 s at its longest (`RetryPolicy::longest_call`).
        // The placement, after the body, is cut off at it too; one that needs more (a cancel
        // after those) waits for its lease, which outlasts it (`order::lease_for`).
        request_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(75),
    };

    /// Reads the limits' variables; a bad one names itself.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let d = Self::DEFAULT;
        let positive = |name: &'static str, default: NonZeroU32| -> Result<NonZeroU32, ConfigError> {
            let n: u32 = env.or_default(name, default.get())?;
            NonZeroU32::new(n).ok_or(ConfigError::Malformed { name, reason: "must be at least 1".into() })
        };
        let max_in_flight =
            positive("INTAKE_MAX_IN_FLIGHT", NonZeroU32::new(d.max_in_flight as u32).unwrap())?;
        let timeout = |name: &'static str, default: Duration| -> Result<Duration, ConfigError> {
            let t = env.or_default(name, Seconds(default))?.0;
            if t.is_zero() {
                return Err(ConfigError::Malformed { name, reason: "must be at least 1 second".into() });
            }
            Ok(t)
        };
        Ok(Self {
            user_rate_per_second: positive("INTAKE_USER_RATE_PER_SECOND", d.user_rate_per_second)?,
            user_burst: positive("INTAKE_USER_BURST", d.user_burst)?,
            rate_per_second: positive("INTAKE_RATE_PER_SECOND", d.rate_per_second)?,
            max_in_flight: max_in_flight.get() as usize,
            declines_per_hour: env.or_default("INTAKE_DECLINES_PER_HOUR", d.declines_per_hour)?,
            header_timeout: timeout("INTAKE_HEADER_TIMEOUT_SECONDS", d.header_timeout)?,
            body_timeout: timeout("INTAKE_BODY_TIMEOUT_SECONDS", d.body_timeout)?,
            request_timeout: timeout("INTAKE_REQUEST_TIMEOUT_SECONDS", d.request_timeout)?,
            idle_timeout: timeout("INTAKE_IDLE_TIMEOUT_SECONDS", d.idle_timeout)?,
        })
    }
}

/// The rate limits' state, shared by every request.
pub struct Limits {
    per_user: DefaultKeyedRateLimiter<String>,
    global: DefaultDirectRateLimiter,
    /// What they were built from.
    pub config: LimitsConfig,
}

impl Limits {
    /// Fresh buckets for `config`.
    pub fn new(config: LimitsConfig) -> Self {
        let per_user = Quota::per_second(config.user_rate_per_second).allow_burst(config.user_burst);
        let global = Quota::per_second(config.rate_per_second);
        Self { per_user: RateLimiter::keyed(per_user), global: RateLimiter::direct(global), config }
    }

    /// One request of anyone's: refused when the intake as a whole is over its rate.
    pub(crate) fn check_global(&self) -> Result<(), ApiError> {
        self.global.check().map_err(refused)
    }

    /// One request of `user`'s: refused when this user is over their rate.
    pub(crate) fn check_user(&self, user: &UserId) -> Result<(), ApiError> {
        self.per_user.check_key(&user.as_str().to_owned()).map_err(refused)
    }

    /// Forgets the buckets of users who have been quiet long enough to be full again.
    pub(crate) fn forget_quiet_users(&self) {
        self.per_user.retain_recent();
        self.per_user.shrink_to_fit();
    }
}

/// A bucket's refusal as `429 rate_limited`, to come back when the bucket has a cell again.
fn refused(not_until: governor::NotUntil<<DefaultClock as Clock>::Instant>) -> ApiError {
    rate_limited(not_until.wait_time_from(DefaultClock::default().now()))
}

/// `429 rate_limited`, to try again after `wait` (whole seconds, at least one).
pub fn rate_limited(wait: Duration) -> ApiError {
    ApiError::RateLimited { retry_after_seconds: wait.as_secs_f64().ceil().max(1.0) as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).unwrap()
    }

    #[test]
    fn a_user_over_their_burst_is_refused_with_a_time_to_come_back_and_others_are_not() {
        let limits = Limits::new(LimitsConfig::DEFAULT);
        for _ in 0..LimitsConfig::DEFAULT.user_burst.get() {
            assert!(limits.check_user(&user("bot")).is_ok());
        }
        let refused = limits.check_user(&user("bot")).unwrap_err();
        assert!(matches!(refused, ApiError::RateLimited { retry_after_seconds: 1 }), "{refused:?}");
        assert!(limits.check_user(&user("ola")).is_ok());
    }

    #[test]
    fn zero_or_words_are_refused_by_name() {
        for (name, value) in [
            ("INTAKE_USER_RATE_PER_SECOND", "0"),
            ("INTAKE_MAX_IN_FLIGHT", "none"),
            ("INTAKE_HEADER_TIMEOUT_SECONDS", "0"),
            ("INTAKE_IDLE_TIMEOUT_SECONDS", "soon"),
        ] {
            let error = LimitsConfig::from_env(&Env::from_pairs([(name, value)])).unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
        assert_eq!(LimitsConfig::from_env(&Env::from_pairs([])).unwrap(), LimitsConfig::DEFAULT);
    }
}
