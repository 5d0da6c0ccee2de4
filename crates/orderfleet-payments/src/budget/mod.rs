//! The fleet's Stripe request budget (SPEC §3 `STRIPE_ACCOUNT_REQUESTS_PER_SECOND`,
//! `STRIPE_ENDPOINT_REQUESTS_PER_SECOND`, `STRIPE_MAX_REQUESTS_PER_SECOND`; §8.9).
//!
//! Stripe counts requests per account (100 a second in live mode) and per named operation
//! (25 a second on each: create, retrieve, list, capture, cancel), whichever process sends
//! them. Every Stripe request of every process takes a turn here first: authorizations,
//! captures, cancels, lookups, the sweeper's lists, the dependency probe, every retry.
//!
//! **The algorithm: leased shares in PostgreSQL.** Each process that calls Stripe is a
//! member, with a row in `stripe_budget_members`: its demand on each endpoint (requests a
//! window), its share, and its lease. Four times a second while it has work, in one short
//! transaction under an advisory lock (five round trips, none per Stripe request), it reads
//! every row, works out its fair part of each limit given every live member's demand
//! ([`share::target`]), takes what the others leave free ([`share::grant`]), and renews its
//! lease. A process with nothing to do asks for nothing, gives its share up at its next tick,
//! and then makes no statement until a request comes.
//!
//! - **Why it cannot overshoot.** A member's row claims, at any moment, the most it may have
//!   sent in the last window: its share while its lease lasts and one window after, and a
//!   larger share it gave up less than a window ago ([`share::Row::claim`]). A member takes
//!   only what the limit leaves after every other member's claim, under the lock, so the
//!   claims never add up to more than a limit. Locally, its requests go out paced so that no
//!   window holds more than the largest share it had in that window ([`lane`]): a lower share
//!   is put in force before the row says so, a higher one only after the commit. A process
//!   that joins finds the limit claimed and takes nothing until the others give their excess
//!   up at their next tick and a window has passed: while shares settle, the fleet runs
//!   under the limit, never over it. The window is [`WINDOW`], 10 % over Stripe's second, for
//!   the jitter between a request leaving here and reaching Stripe.
//! - **Leases by each process's own clock.** A member stops sending at its lease by its own
//!   monotonic clock, and the others count that lease from when they first saw its renewal,
//!   on theirs; the ledger's tick number tells one renewal from the next ([`ledger`]). No
//!   lease is judged by the database's clock, so a step of that clock, or a failover to a
//!   primary whose clock differs, lets no member take a share another still sends on.
//! - **Nobody starves.** When more members want an endpoint than its limit has units (30
//!   intakes at 25 a second, or 6 after a 429 cut the limit to 4), the units go round: the
//!   ledger's round moves them on by one member every [`ROUND`], so each member wanting is
//!   served within as many rounds as there are members left out. A process's
//!   `STRIPE_MAX_REQUESTS_PER_SECOND` goes round its endpoints the same way, and is paced
//!   over all of them together: no window holds more of the process's requests than it.
//! - **When the database cannot be reached.** A member sends nothing past its lease
//!   ([`LEASE`], counted from before it asked): its requests wait, the intake answers `503
//!   payment_unavailable` and the workers leave their messages for later. A member killed
//!   holds its share until its lease and a window have passed, then its row is deleted. What
//!   a failed tick read (the demand, the 429s) stays counted for the next.
//! - **A 429 slows the whole fleet.** A `429` `rate_limit` from Stripe (a limit lowered; a
//!   `lock_timeout` is about one object, and its caller never reports it here) halves the
//!   process's own share on that endpoint at once, and, at its next tick, the
//!   endpoint's limit for every member (`stripe_budget_slowdowns`, at most once a second); the
//!   limit then grows back by a thirtieth a second. `stripe_rate_limited_total` counts them,
//!   and the alarm in `infra/services.yaml` watches it.
//! - **Measured.** `stripe_budget_wait_seconds` (each request's wait for its turn),
//!   `stripe_budget_refusals_total`, `stripe_budget_share` and `stripe_budget_limit` by
//!   endpoint, and `stripe_budget_ticks_total` by outcome.

mod lane;
mod ledger;
mod share;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use orderfleet_runtime::db::Pool;

/// The window a share is counted over: Stripe's second, and 100 ms for the spread of the
/// delays between a request's turn here and its arrival at Stripe. Turns paced to 25 in any
/// window arrive as 25 in any second only while those delays differ by less than the margin.
/// Measured with each turn and each arrival logged, the spread is within it but for a
/// process's first requests, which open its connections: on a busy machine they landed up to
/// 284 ms late (BENCHMARKS.md, "The overshoot, measured").
pub const WINDOW: Duration = Duration::from_millis(1_100);

/// How often a member with work renews its share: four times a second, so a share follows
/// demand, and a process that joins gets its part, within a second and a half.
pub const TICK: Duration = Duration::from_millis(250);

/// The least time between two ticks.
const WAKE_GAP: Duration = Duration::from_millis(50);

/// How long a share lasts without a renewal: five ticks, so a database slow for a second does
/// not stop Stripe requests, and a killed process's share is free again 2.6 s after its last
/// renewal.
pub const LEASE: Duration = Duration::from_millis(1_500);

/// How long a limit too small to go round stays with the same members before it moves on by
/// one ([`share::water_fill`]): a unit that moves is lost to the fleet for about a window (the
/// member giving it up still claims it), so a round is long beside a window, and short enough
/// that with 30 members wanting an endpoint limited to 25, each waits 10 s at most.
pub const ROUND: Duration = Duration::from_secs(2);

/// The named operations Stripe limits apart, as Stripe (and stripe-sim's stats) name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/payment_intents`.
    Create = 0,
    /// `GET /v1/payment_intents/{id}`.
    Retrieve = 1,
    /// `GET /v1/payment_intents`.
    List = 2,
    /// `POST /v1/payment_intents/{id}/capture`.
    Capture = 3,
    /// `POST /v1/payment_intents/{id}/cancel`.
    Cancel = 4,
    /// `GET /v1/payment_methods/{id}`: a card's fingerprint, for the card cap.
    PaymentMethod = 5,
}

impl Endpoint {
    /// How many there are.
    pub const COUNT: usize = 6;
    /// Every one, in order.
    pub const ALL: [Endpoint; Self::COUNT] = [
        Endpoint::Create,
        Endpoint::Retrieve,
        Endpoint::List,
        Endpoint::Capture,
        Endpoint::Cancel,
        Endpoint::PaymentMethod,
    ];

    /// Its name, as Stripe's docs write it.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Create => "POST /v1/payment_intents",
            Endpoint::Retrieve => "GET /v1/payment_intents/{id}",
            Endpoint::List => "GET /v1/payment_intents",
            Endpoint::Capture => "POST /v1/payment_intents/{id}/capture",
            Endpoint::Cancel => "POST /v1/payment_intents/{id}/cancel",
            Endpoint::PaymentMethod => "GET /v1/payment_methods/{id}",
        }
    }
}

/// The limits the fleet keeps to: Stripe's, and this process's own ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetLimits {
    /// `STRIPE_ACCOUNT_REQUESTS_PER_SECOND`.
    pub account: u32,
    /// `STRIPE_ENDPOINT_REQUESTS_PER_SECOND`.
    pub endpoint: u32,
    /// `STRIPE_MAX_REQUESTS_PER_SECOND`, when set.
    pub ceiling: Option<u32>,
}

/// No turn within the bounded wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the fleet's Stripe budget has no turn on {endpoint} within {max_wait:?}")]
pub struct Exhausted {
    /// The endpoint.
    pub endpoint: &'static str,
    /// How long a request may wait for its turn.
    pub max_wait: Duration,
}

/// This process's part of the fleet's Stripe budget. Clones of the client share one.
pub struct StripeBudget {
    lanes: [lane::Lane; Endpoint::COUNT],
    /// `STRIPE_MAX_REQUESTS_PER_SECOND`, paced over every endpoint together.
    ceiling: Option<lane::Ceiling>,
    /// 429s seen on each endpoint that no tick has written down yet.
    limited: [AtomicU32; Endpoint::COUNT],
    /// Wakes the ticker: demand after a quiet spell, or a 429.
    wake: Arc<Notify>,
    ticker: AtomicBool,
    member: Uuid,
    process: String,
    limits: FleetLimits,
    max_wait: Duration,
    pool: Pool,
    /// What the last tick saw: the fleet's limits as slowed, and when this member ticked.
    seen: Mutex<Seen>,
    /// When this process first saw each member's renewal: their leases, by its clock.
    sightings: Mutex<ledger::Sightings>,
    /// The 429 records being written now ([`Self::record_429`]), at most [`RECORDS_IN_FLIGHT`].
    recording: Arc<AtomicU32>,
}

/// The most 429 records one process writes at once: they share the budget's one connection
/// with its ticks, so a burst of 429s beyond it is dropped from `drop status`'s count rather
/// than queued in front of the ticks that slow the fleet down.
const RECORDS_IN_FLIGHT: u32 = 2;

#[derive(Debug, Clone, Copy)]
struct Seen {
    endpoint_limit: [u32; Endpoint::COUNT],
    /// This process's fair part of each endpoint at the last tick ([`share::target`]).
    target: [u32; Endpoint::COUNT],
    /// The live members at the last tick, this one included.
    members: u32,
    ticked: Instant,
}

impl std::fmt::Debug for StripeBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeBudget")
            .field("member", &self.member)
            .field("limits", &self.limits)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl StripeBudget {
    /// This process's membership of the fleet's budget in `pool`'s database, on a connection
    /// of its own (`<process> stripe-budget`: a tick must not queue behind the process's
    /// other steps while its lease runs), opened at once and kept: a tick waits at most a lease
    /// for its connection, and on a busy host opening one (a backend forked, the password's
    /// SCRAM exchange) took longer, so that a process's first Stripe request found no turn. It
    /// first ticks when the first request asks for a turn.
    pub fn new(pool: &Pool, limits: FleetLimits, max_wait: Duration) -> Arc<Self> {
        let process = std::env::args()
            .next()
            .and_then(|p| std::path::Path::new(&p).file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "orderfleet".to_owned());
        let one = orderfleet_runtime::pool::Limits {
            max_connections: 1,
            min_connections: 1,
            acquire_timeout: LEASE,
        };
        let pool = pool.sibling(&format!("{process} stripe-budget"), one);
        Arc::new(Self {
            lanes: Default::default(),
            ceiling: limits.ceiling.map(lane::Ceiling::new),
            limited: Default::default(),
            wake: Arc::new(Notify::new()),
            ticker: AtomicBool::new(false),
            member: Uuid::new_v4(),
            process,
            limits,
            max_wait,
            pool,
            seen: Mutex::new(Seen {
                endpoint_limit: [limits.endpoint.min(limits.account); Endpoint::COUNT],
                target: [limits.endpoint.min(limits.account).min(limits.ceiling.unwrap_or(u32::MAX));
                    Endpoint::COUNT],
                members: 1,
                ticked: Instant::now(),
            }),
            sightings: Mutex::default(),
            recording: Arc::default(),
        })
    }

    /// Waits for this request's turn on `endpoint`, for at most the bounded wait.
    pub async fn acquire(self: &Arc<Self>, endpoint: Endpoint) -> Result<(), Exhausted> {
        self.start_ticker();
        let lane = &self.lanes[endpoint as usize];
        if lane.share() == 0 {
            self.wake.notify_one();
        }
        let started = Instant::now();
        // The share this process is headed for: its target at the last tick (the endpoint's
        // limit before the first), an even part of the limit among the members it saw (after
        // a quiet spell, its target is nothing), or the share in force, whichever is largest,
        // and never more than the process's ceiling.
        let seen = *self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let fair = seen.endpoint_limit[endpoint as usize] / seen.members.max(1);
        let headed_for = seen.target[endpoint as usize]
            .max(fair)
            .max(lane.share())
            .min(self.limits.ceiling.unwrap_or(u32::MAX));
        let granted = lane.acquire(self.max_wait, headed_for, self.ceiling.as_ref()).await;
        metrics::histogram!(crate::metrics::STRIPE_BUDGET_WAIT.name, "endpoint" => endpoint.name())
            .record(started.elapsed().as_secs_f64());
        if granted {
            return Ok(());
        }
        metrics::counter!(crate::metrics::STRIPE_BUDGET_REFUSALS.name, "endpoint" => endpoint.name())
            .increment(1);
        Err(Exhausted { endpoint: endpoint.name(), max_wait: self.max_wait })
    }

    /// Stripe answered `429` on `endpoint`: this process halves its share there at once, and
    /// its next tick, now, slows the fleet down.
    pub fn rate_limited(&self, endpoint: Endpoint) {
        metrics::counter!(crate::metrics::STRIPE_RATE_LIMITED.name, "endpoint" => endpoint.name())
            .increment(1);
        // Counted first, so a tick that reads the count after the halving also repeats it.
        self.limited[endpoint as usize].fetch_add(1, Ordering::AcqRel);
        self.lanes[endpoint as usize].halve();
        self.wake.notify_one();
    }

    /// Stripe answered `429` on `endpoint` (`code`: `rate_limit` or `lock_timeout`): recorded
    /// with its time for the operator's `fleetctl drop status`, by a task of its own, so the
    /// request goes on at once; rows older than ten minutes go as it writes.
    pub fn record_429(&self, endpoint: Endpoint, code: &'static str) {
        let recording = self.recording.clone();
        if recording.fetch_add(1, Ordering::AcqRel) >= RECORDS_IN_FLIGHT {
            recording.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(
                endpoint = endpoint.name(),
                code,
                "a 429 not recorded for drop status: two are being written"
            );
            return;
        }
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let written = sqlx::query!(
                "WITH old AS (DELETE FROM stripe_429s WHERE at < clock_timestamp() - interval '10 minutes')
                 INSERT INTO stripe_429s (endpoint, code) VALUES ($1, $2)",
                endpoint.name(),
                code
            )
            .execute(&pool)
            .await;
            recording.fetch_sub(1, Ordering::AcqRel);
            if let Err(error) = written {
                tracing::debug!(%error, "cannot record a 429 for drop status");
            }
        });
    }

    /// The fleet's create rate as this process last saw it, in requests a second: what a
    /// buyer waiting behind others for an authorization can count on.
    pub fn create_rate(&self) -> f64 {
        let seen = *self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f64::from(seen.endpoint_limit[Endpoint::Create as usize].min(self.limits.account))
            / WINDOW.as_secs_f64()
    }

    fn start_ticker(self: &Arc<Self>) {
        if !self.ticker.swap(true, Ordering::AcqRel) {
            tokio::spawn(run(Arc::downgrade(self), self.wake.clone()));
        }
    }

    /// Whether it has nothing to renew: no share, nothing asked for or waiting, no 429.
    fn idle(&self) -> bool {
        self.lanes.iter().all(|l| l.share() == 0 && !l.busy())
            && self.limited.iter().all(|l| l.load(Ordering::Acquire) == 0)
    }
}

/// The ticker: renews the share every [`TICK`] while there is work, and sleeps otherwise
/// until a request or a 429 wakes it. It ends with the budget.
async fn run(budget: Weak<StripeBudget>, wake: Arc<Notify>) {
    let mut last = Instant::now() - WAKE_GAP;
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let idle = match budget.upgrade() {
            Some(budget) => budget.idle(),
            None => return,
        };
        if idle {
            woken.await;
        } else {
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = woken => {}
            }
        }
        // Ticks woken by requests come at most one a [`WAKE_GAP`]: a process with no share yet
        // is woken by every request.
        tokio::time::sleep_until(last + WAKE_GAP).await;
        last = Instant::now();
        let Some(budget) = budget.upgrade() else { return };
        // A database that does not answer (frozen, a dropped route) ends the tick at the
        // lease: its connection is closed, and the next tick opens another.
        let outcome = match tokio::time::timeout(LEASE, ledger::tick(&budget)).await {
            Ok(Ok(())) => "ok",
            Ok(Err(error)) => {
                tracing::warn!(%error, "the Stripe budget's tick failed; this process sends nothing to Stripe once its lease runs out");
                "failed"
            }
            Err(_) => {
                tracing::warn!(
                    "the Stripe budget's tick got no answer from PostgreSQL within the lease; this process sends nothing to Stripe until one comes"
                );
                "failed"
            }
        };
        metrics::counter!(crate::metrics::STRIPE_BUDGET_TICKS.name, "outcome" => outcome).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_ceiling_of_one_spaces_a_create_and_a_retrieve_a_window_apart() {
        // Arrange: a process with a ceiling of 1, whose one unit moves from creates to
        // retrieves between two requests.
        let limits = FleetLimits { account: 100, endpoint: 25, ceiling: Some(1) };
        let budget =
            StripeBudget::new(&orderfleet_runtime::db::unreachable_pool(), limits, Duration::from_secs(4));
        let lease = Some(Instant::now() + Duration::from_secs(3600));
        budget.lanes[Endpoint::Create as usize].set(1, lease);

        // Act
        budget.acquire(Endpoint::Create).await.unwrap();
        let created = Instant::now();
        budget.lanes[Endpoint::Create as usize].set(0, None);
        budget.lanes[Endpoint::Retrieve as usize].set(1, lease);
        budget.acquire(Endpoint::Retrieve).await.unwrap();

        // Assert
        assert!(created.elapsed() >= WINDOW, "{:?} apart", created.elapsed());
    }
}
