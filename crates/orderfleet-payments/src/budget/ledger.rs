//! One tick of a member: the fleet's rows read and this member's written back in one short
//! transaction under an advisory lock, so two members never divide the same free capacity.
//! Five round trips (`BEGIN`, the lock, the read, the write, `COMMIT`), four times a second while
//! the process has work, none per Stripe request.
//!
//! - **The ledger's own count.** `stripe_budget_ledger` holds a tick number, which every tick
//!   advances and every member's row records as its renewal, and the round the limits too small
//!   to go round are given by ([`share::water_fill`]). The round moves on once the members'
//!   ticks together have counted [`ROUND`] each, every tick adding the time since its member's
//!   last one on that member's own clock. Neither reads the database's clock.
//! - **Leases by this process's clock.** A row's lease, and a share its member gave up, are
//!   judged from when this process first saw that renewal, or that cut, on its own monotonic
//!   clock ([`Sightings`]). The member wrote it before this process read it, and counts its
//!   lease from before it asked, so it stops sending before this process's count of the same
//!   lease ends (two hosts' monotonic clocks run at one rate to within parts per million). A
//!   step of the database's clock, or a failover to a primary whose clock differs, moves no
//!   one's lease. (`expires_at` and `held_until` are written by the
//!   database's clock, for an operator reading the table; a slowdown's growth back is still
//!   counted by it, and a step there moves a limit between Stripe's and its cut, never past
//!   Stripe's.)
//! - **Nothing is lost to a tick that fails.** The demand and the 429s a tick reads stay
//!   counted until its write commits, and a 429 that comes while the tick is being written
//!   keeps its halved share.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::types::Json;
use tokio::time::Instant;
use uuid::Uuid;

use super::share::{self, Limits, PerEndpoint, Row};
use super::{Endpoint, FleetLimits, LEASE, ROUND, Seen, StripeBudget, WINDOW};

/// The advisory lock's key: `orderfleet.stripe_budget` as an 8-byte number.
const LOCK: i64 = 0x6f66_5f62_7564_6765;

/// A cut halves an endpoint's limit, at most once a [`CUT_EVERY`], never below this.
const SLOWEST: f64 = 0.04;
/// One cut per endpoint per second: the 429s of one burst are one signal, not many.
const CUT_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(1);
/// A cut limit grows back to the whole in this long from nothing.
const RECOVERY_SECONDS: f64 = 30.0;
/// The most time a tick counts since its member's last: requests that come after a quiet spell
/// are demand now, not spread over the spell, and a member back after one counts a tick toward
/// the round, not the spell.
const MOST_ELAPSED: Duration = Duration::from_secs(1);

#[derive(Debug, Deserialize)]
struct MemberJson {
    member: Uuid,
    demand: HashMap<String, u32>,
    share: HashMap<String, u32>,
    held: HashMap<String, u32>,
    held_until: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    /// The ledger's tick at its last renewal, and at its last cut. A row written by a binary
    /// from before the ledger has neither; its `expires_at` and `held_until` still change at
    /// every renewal and cut, which is all a sighting needs.
    #[serde(default)]
    renewed_tick: i64,
    #[serde(default)]
    held_tick: i64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct SlowdownJson {
    factor: f64,
    cut_at: DateTime<Utc>,
}

/// `stripe_budget_ledger`: the ledger's tick, its round, and the members' time counted in
/// the round so far, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
struct Ledger {
    tick: i64,
    round: i64,
    round_ms: i64,
}

impl Ledger {
    /// The ledger after one more tick, of a member `elapsed` after its last, with `members`
    /// live members: the round moves on once they have counted [`ROUND`] each.
    fn next(self, elapsed: Duration, members: u32) -> Self {
        let counted = self.round_ms + elapsed.min(MOST_ELAPSED).as_millis() as i64;
        let per_round = ROUND.as_millis() as i64 * i64::from(members.max(1));
        if counted >= per_round {
            Self { tick: self.tick + 1, round: self.round + 1, round_ms: 0 }
        } else {
            Self { tick: self.tick + 1, round: self.round, round_ms: counted }
        }
    }
}

fn per_endpoint(by_name: &HashMap<String, u32>) -> PerEndpoint {
    Endpoint::ALL.map(|e| by_name.get(e.name()).copied().unwrap_or(0))
}

fn by_name(values: PerEndpoint) -> HashMap<&'static str, u32> {
    Endpoint::ALL.iter().map(|&e| (e.name(), values[e as usize])).collect()
}

/// When this process first saw each member's renewal and each member's cut, on its own clock.
#[derive(Debug, Default)]
pub(super) struct Sightings(HashMap<Uuid, Sighting>);

#[derive(Debug, Clone, Copy)]
struct Sighting {
    renewal: (i64, DateTime<Utc>),
    renewal_seen: Instant,
    cut: (i64, DateTime<Utc>),
    cut_seen: Instant,
}

impl Sightings {
    /// The rows read at `read_at` (after the read answered), their times on this process's
    /// clock: a lease lasts [`LEASE`] from the first sight of its renewal, and a share given
    /// up is held a [`WINDOW`] from the first sight of its cut. A member no longer in the
    /// table is forgotten.
    fn rows(&mut self, members: Vec<MemberJson>, read_at: Instant) -> Vec<Row> {
        let mut now_seen = HashMap::with_capacity(members.len());
        let rows = members
            .into_iter()
            .map(|m| {
                let renewal = (m.renewed_tick, m.expires_at);
                let cut = (m.held_tick, m.held_until);
                let mut sighting = self.0.get(&m.member).copied().unwrap_or(Sighting {
                    renewal,
                    renewal_seen: read_at,
                    cut,
                    cut_seen: read_at,
                });
                if sighting.renewal != renewal {
                    sighting.renewal = renewal;
                    sighting.renewal_seen = read_at;
                }
                if sighting.cut != cut {
                    sighting.cut = cut;
                    sighting.cut_seen = read_at;
                }
                now_seen.insert(m.member, sighting);
                Row {
                    member: m.member,
                    demand: per_endpoint(&m.demand),
                    share: per_endpoint(&m.share),
                    held: per_endpoint(&m.held),
                    held_until: sighting.cut_seen + WINDOW,
                    expires_at: sighting.renewal_seen + LEASE,
                }
            })
            .collect();
        self.0 = now_seen;
        rows
    }
}

/// How much of an endpoint's limit is in force, a cut having grown back since.
fn factor(slowdown: Option<SlowdownJson>, now: DateTime<Utc>) -> f64 {
    slowdown.map_or(1.0, |s| {
        let since = (now - s.cut_at).as_seconds_f64().max(0.0);
        (s.factor + since / RECOVERY_SECONDS).min(1.0)
    })
}

/// Requests a window this member asks for: what asked in the last tick, at that rate, and
/// what waits now, with a quarter more and one for what comes next.
fn demand((arrivals, queued): (u64, usize), elapsed: Duration, cap: u32) -> u32 {
    let per_window = arrivals as f64 * WINDOW.as_secs_f64() / elapsed.as_secs_f64().max(0.05) + queued as f64;
    if per_window == 0.0 { 0 } else { ((per_window * 1.25).ceil() as u32 + 1).min(cap) }
}

/// What this member brings to a tick, read from its lanes and left there until the tick's
/// write commits.
#[derive(Debug, Clone)]
struct Local {
    member: Uuid,
    limits: FleetLimits,
    /// By endpoint: requests asked for that no tick wrote down yet, and requests waiting.
    arrivals: [(u64, usize); Endpoint::COUNT],
    /// By endpoint: 429s no tick wrote down yet.
    limited: [u32; Endpoint::COUNT],
    /// The shares in force.
    shares: PerEndpoint,
    /// Since this member's last tick that committed, [`MOST_ELAPSED`] at most.
    elapsed: Duration,
}

impl Local {
    fn of(budget: &StripeBudget, started: Instant) -> Self {
        let ticked = budget.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).ticked;
        Self {
            member: budget.member,
            limits: budget.limits,
            arrivals: std::array::from_fn(|e| budget.lanes[e].arrivals()),
            limited: std::array::from_fn(|e| budget.limited[e].load(Ordering::Acquire)),
            shares: std::array::from_fn(|e| budget.lanes[e].share()),
            elapsed: started.saturating_duration_since(ticked).min(MOST_ELAPSED),
        }
    }
}

/// The fleet as a tick read it.
#[derive(Debug, Clone)]
struct Fleet {
    rows: Vec<Row>,
    slowdowns: HashMap<String, SlowdownJson>,
    ledger: Ledger,
    /// The database's clock, for the slowdowns it wrote.
    now: DateTime<Utc>,
    /// This process's clock, once the read answered.
    read_at: Instant,
}

/// What the tick decided, before it is written.
#[derive(Debug, Clone)]
struct Decision {
    demand: PerEndpoint,
    granted: PerEndpoint,
    held: PerEndpoint,
    /// Whether a share went down: `held` is held a window from this write, at this tick.
    lowered: bool,
    cuts: Vec<(&'static str, f64)>,
    gone: Vec<Uuid>,
    endpoint_limit: PerEndpoint,
    target: PerEndpoint,
    /// Live members, this one included.
    members: u32,
    ledger: Ledger,
    /// What the write records, to be taken from the counts once it commits.
    arrivals: [u64; Endpoint::COUNT],
    limited: [u32; Endpoint::COUNT],
}

/// One tick: read, decide, lower what must be lowered, write, commit, then raise.
pub(super) async fn tick(budget: &StripeBudget) -> sqlx::Result<()> {
    let started = Instant::now();
    let mut tx = budget.pool.begin().await?;
    lock(&mut tx).await?;
    let fleet = read(&mut tx, budget).await?;
    let decision = decide(&Local::of(budget, started), &fleet);
    for e in Endpoint::ALL {
        let lane = &budget.lanes[e as usize];
        if decision.granted[e as usize] < lane.share() {
            lane.set(decision.granted[e as usize], None);
        }
    }
    write(&mut tx, budget, &decision).await?;
    tx.commit().await?;
    apply(budget, &decision, started);
    Ok(())
}

/// Every member's row, the slowdowns and the ledger, the rows' times on this process's clock.
async fn read(tx: &mut orderfleet_runtime::pool::Tx, budget: &StripeBudget) -> sqlx::Result<Fleet> {
    let read = sqlx::query!(
        r#"SELECT clock_timestamp() AS "now!",
                  (SELECT coalesce(jsonb_agg(to_jsonb(m) - 'process' - 'updated_at'), '[]')
                     FROM stripe_budget_members m) AS "members!: Json<Vec<MemberJson>>",
                  (SELECT coalesce(jsonb_object_agg(s.endpoint, to_jsonb(s) - 'endpoint'), '{}')
                     FROM stripe_budget_slowdowns s) AS "slowdowns!: Json<HashMap<String, SlowdownJson>>",
                  (SELECT to_jsonb(l) - 'singleton' FROM stripe_budget_ledger l) AS "ledger: Json<Ledger>""#
    )
    .fetch_one(&mut **tx)
    .await?;
    let read_at = Instant::now();
    let rows = budget
        .sightings
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .rows(read.members.0, read_at);
    Ok(Fleet {
        rows,
        slowdowns: read.slowdowns.0,
        ledger: read.ledger.map(|l| l.0).unwrap_or_default(),
        now: read.now,
        read_at,
    })
}

/// This member's row, the cuts, the ledger's next tick and round, and the rows gone.
async fn write(
    tx: &mut orderfleet_runtime::pool::Tx,
    budget: &StripeBudget,
    decision: &Decision,
) -> sqlx::Result<()> {
    let (cut_endpoints, cut_factors): (Vec<&str>, Vec<f64>) = decision.cuts.iter().copied().unzip();
    sqlx::query_file!(
        "src/budget/write.sql",
        budget.member,
        budget.process,
        Json(by_name(decision.demand)) as _,
        Json(by_name(decision.granted)) as _,
        Json(by_name(decision.held)) as _,
        decision.lowered,
        WINDOW.as_millis() as i64,
        decision.ledger.tick,
        LEASE.as_millis() as i64,
        &cut_endpoints as &[&str],
        &cut_factors,
        decision.ledger.round,
        decision.ledger.round_ms,
        &decision.gone,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Takes the budget's lock for this transaction. A member stalled inside its tick (paused,
/// starved, cut off) holds the lock: the server ends its transaction after a second idle in
/// it, and a tick waits a second at most for the lock, so one stalled member cannot stop the
/// others' ticks past their leases.
async fn lock(tx: &mut orderfleet_runtime::pool::Tx) -> sqlx::Result<()> {
    sqlx::query!(
        r#"SELECT set_config('idle_in_transaction_session_timeout', '1000', true) AS "idle!",
                  set_config('lock_timeout', '1000', true) AS "lock_wait!",
                  pg_advisory_xact_lock($1)::text AS "locked!""#,
        LOCK
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(())
}

/// The tick's write committed: the shares granted are in force until the lease counted from
/// before the tick asked, and what it recorded is taken from the counts. A 429 since the
/// tick read them keeps its halved share until the next tick, which it has woken.
fn apply(budget: &StripeBudget, decision: &Decision, started: Instant) {
    for e in Endpoint::ALL {
        let lane = &budget.lanes[e as usize];
        lane.written_down(decision.arrivals[e as usize]);
        let recorded = decision.limited[e as usize];
        let since = budget.limited[e as usize].fetch_sub(recorded, Ordering::AcqRel) - recorded;
        let granted = decision.granted[e as usize];
        if since > 0 {
            lane.set_at_most(granted, started + LEASE);
        } else {
            lane.set(granted, Some(started + LEASE));
        }
        metrics::gauge!(crate::metrics::STRIPE_BUDGET_SHARE.name, "endpoint" => e.name())
            .set(f64::from(granted));
        metrics::gauge!(crate::metrics::STRIPE_BUDGET_LIMIT.name, "endpoint" => e.name())
            .set(f64::from(decision.endpoint_limit[e as usize]));
    }
    let mut seen = budget.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *seen = Seen {
        endpoint_limit: decision.endpoint_limit,
        target: decision.target,
        members: decision.members,
        ticked: started,
    };
}

fn decide(local: &Local, fleet: &Fleet) -> Decision {
    let now = fleet.read_at;
    let mut cuts = Vec::new();
    let endpoint_limit: PerEndpoint = Endpoint::ALL.map(|e| {
        let slowdown = fleet.slowdowns.get(e.name()).copied();
        let mut f = factor(slowdown, fleet.now);
        if local.limited[e as usize] > 0 && slowdown.is_none_or(|s| fleet.now - s.cut_at >= CUT_EVERY) {
            f = (f / 2.0).max(SLOWEST);
            cuts.push((e.name(), f));
        }
        ((f64::from(local.limits.endpoint) * f).floor() as u32).max(1)
    });
    let limits =
        Limits { account: local.limits.account, endpoint: endpoint_limit, ceiling: local.limits.ceiling };
    let mine = fleet.rows.iter().find(|r| r.member == local.member);
    // A demand falls by a quarter a tick at most: a queue that empties for a moment between
    // two waves of buyers does not give its share up, to take it back a window later.
    let demand: PerEndpoint = Endpoint::ALL.map(|e| {
        let now = demand(local.arrivals[e as usize], local.elapsed, endpoint_limit[e as usize]);
        now.max(mine.map_or(0, |r| r.demand[e as usize] * 3 / 4))
    });
    let members = 1 + fleet.rows.iter().filter(|r| r.member != local.member && r.live(now)).count() as u32;
    let ledger = fleet.ledger.next(local.elapsed, members);
    let round = ledger.round.max(0) as u64;
    let target = share::target(local.member, demand, &fleet.rows, &limits, round, now);
    let granted = share::grant(local.member, target, &fleet.rows, &limits, round, now);
    let lowered =
        (0..Endpoint::COUNT).any(|e| granted[e] < local.shares[e].max(mine.map_or(0, |r| r.share[e])));
    let held = if lowered {
        let before = mine.map_or([0; Endpoint::COUNT], |r| r.claim(now));
        std::array::from_fn(|e| before[e].max(local.shares[e]))
    } else {
        mine.map_or([0; Endpoint::COUNT], |r| r.held)
    };
    let gone =
        fleet.rows.iter().filter(|r| r.member != local.member && r.gone(now)).map(|r| r.member).collect();
    Decision {
        demand,
        granted,
        held,
        lowered,
        cuts,
        gone,
        endpoint_limit,
        target,
        members,
        ledger,
        arrivals: local.arrivals.map(|(arrivals, _)| arrivals),
        limited: local.limited,
    }
}

use std::sync::atomic::Ordering;

#[cfg(test)]
mod tests {
    use super::*;

    const CREATE: usize = Endpoint::Create as usize;
    const RETRIEVE: usize = Endpoint::Retrieve as usize;
    const CANCEL: usize = Endpoint::Cancel as usize;

    #[test]
    fn demand_is_the_last_tick_s_rate_and_the_queue_with_room_to_grow() {
        let half = Duration::from_millis(500);
        assert_eq!(demand((0, 0), half, 25), 0);
        assert_eq!(demand((4, 0), half, 25), 12, "8.4 a window, a quarter more, and one");
        assert_eq!(demand((100, 40), half, 25), 25, "never more than the endpoint's limit");
    }

    #[test]
    fn a_cut_limit_grows_back_to_the_whole() {
        let cut_at = DateTime::UNIX_EPOCH;
        let cut = Some(SlowdownJson { factor: 0.5, cut_at });
        assert_eq!(factor(None, cut_at), 1.0);
        assert_eq!(factor(cut, cut_at), 0.5);
        assert!((factor(cut, cut_at + chrono::TimeDelta::seconds(6)) - 0.7).abs() < 1e-9);
        assert_eq!(factor(cut, cut_at + chrono::TimeDelta::seconds(60)), 1.0);
    }

    #[test]
    fn the_round_moves_on_once_the_members_have_ticked_a_round_each() {
        let mut ledger = Ledger::default();
        // Three members, each ticking every 250 ms: 24 ticks are two seconds each.
        for _ in 0..23 {
            ledger = ledger.next(super::super::TICK, 3);
        }
        assert_eq!((ledger.tick, ledger.round), (23, 0));
        ledger = ledger.next(super::super::TICK, 3);
        assert_eq!((ledger.tick, ledger.round, ledger.round_ms), (24, 1, 0));
        // A tick after a quiet spell counts a second, not the spell.
        assert_eq!(Ledger::default().next(Duration::from_secs(60), 1).round_ms, 1_000);
    }

    fn budget(ceiling: Option<u32>) -> std::sync::Arc<StripeBudget> {
        let limits = FleetLimits { account: 100, endpoint: 25, ceiling };
        StripeBudget::new(&orderfleet_runtime::db::unreachable_pool(), limits, Duration::from_secs(4))
    }

    /// A request asks for a create, and waits no time for a turn.
    async fn asked(budget: &StripeBudget) {
        let _ = budget.lanes[CREATE].acquire(Duration::ZERO, 1, None).await;
    }

    /// A fleet with no member but this one, and no slowdown, read now.
    fn alone() -> Fleet {
        Fleet {
            rows: Vec::new(),
            slowdowns: HashMap::new(),
            ledger: Ledger::default(),
            now: DateTime::UNIX_EPOCH,
            read_at: Instant::now(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_tick_that_fails_keeps_its_429_and_its_demand_for_the_next() {
        // Arrange: a create asked for, and a 429 on creates.
        let budget = budget(None);
        asked(&budget).await;
        budget.rate_limited(Endpoint::Create);

        // Act: a tick decides, and its write fails; the next tick decides again.
        let failed = decide(&Local::of(&budget, Instant::now()), &alone());
        tokio::time::advance(super::super::TICK).await;
        let next = decide(&Local::of(&budget, Instant::now()), &alone());

        // Assert
        assert_eq!(failed.cuts.len(), 1);
        assert_eq!(next.cuts.len(), 1, "the 429 is still to record");
        assert!(next.demand[CREATE] > 0, "the create asked for is still demand");

        // Once a write commits, what it recorded is taken, and what came since stays.
        asked(&budget).await;
        apply(&budget, &next, Instant::now());
        assert_eq!(budget.lanes[CREATE].arrivals(), (1, 0));
        assert_eq!(budget.limited[CREATE].load(Ordering::Acquire), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_while_a_tick_is_written_keeps_its_halved_share() {
        // Arrange: the process holds 25 creates.
        let budget = budget(None);
        asked(&budget).await;
        let first = decide(&Local::of(&budget, Instant::now()), &alone());
        apply(&budget, &first, Instant::now());
        assert_eq!(budget.lanes[CREATE].share(), 25);
        asked(&budget).await;

        // Act: a tick decides 25 again; a 429 comes before it is applied.
        let next = decide(&Local::of(&budget, Instant::now()), &alone());
        budget.rate_limited(Endpoint::Create);
        apply(&budget, &next, Instant::now());

        // Assert: the halving stands, and the 429 waits for the next tick to slow the fleet.
        assert!(budget.lanes[CREATE].share() <= 12, "{}", budget.lanes[CREATE].share());
        assert_eq!(budget.limited[CREATE].load(Ordering::Acquire), 1);
    }

    fn on(endpoint: usize, n: u32) -> PerEndpoint {
        let mut v = [0; Endpoint::COUNT];
        v[endpoint] = n;
        v
    }

    /// A member's row as the database holds it, written at `written` by the database's clock.
    fn written(member: u128, share: PerEndpoint, tick: i64, written: DateTime<Utc>) -> MemberJson {
        let lease = chrono::TimeDelta::from_std(LEASE).unwrap();
        MemberJson {
            member: Uuid::from_u128(member),
            demand: by_name(on(CREATE, 50)).into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            share: by_name(share).into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            held: HashMap::new(),
            held_until: written,
            expires_at: written + lease,
            renewed_tick: tick,
            held_tick: tick,
        }
    }

    #[test]
    fn a_forward_step_of_the_database_s_clock_frees_no_live_share() {
        // Arrange: the first intake renewed 25 creates at tick 7, at T by the database's clock,
        // and sends them for the lease counted by its own clock. The second reads its row at
        // once; the database's clock then steps an hour forward, and the second ticks again
        // 250 ms later, before the first's next renewal.
        let mut sightings = Sightings::default();
        let local = Local {
            member: Uuid::from_u128(2),
            limits: FleetLimits { account: 100, endpoint: 25, ceiling: None },
            arrivals: [(50, 10); Endpoint::COUNT],
            limited: [0; Endpoint::COUNT],
            shares: [0; Endpoint::COUNT],
            elapsed: super::super::TICK,
        };
        let t = DateTime::UNIX_EPOCH;
        let first_read = Instant::now();
        sightings.rows(vec![written(1, on(CREATE, 25), 7, t)], first_read);
        let stepped = t + chrono::TimeDelta::hours(1);
        let read_at = first_read + super::super::TICK;

        // Act
        let rows = sightings.rows(vec![written(1, on(CREATE, 25), 7, t)], read_at);
        let fleet =
            Fleet { rows, slowdowns: HashMap::new(), ledger: Ledger::default(), now: stepped, read_at };
        let decision = decide(&local, &fleet);

        // Assert: the first still sends 25, so nothing is free; nor is its row deleted.
        assert_eq!(decision.granted[CREATE], 0, "{decision:?}");
        assert!(decision.gone.is_empty());

        // A member that first sees the row after the step counts its lease from then.
        let rows = Sightings::default().rows(vec![written(1, on(CREATE, 25), 7, t)], read_at);
        let fleet =
            Fleet { rows, slowdowns: HashMap::new(), ledger: Ledger::default(), now: stepped, read_at };
        assert_eq!(decide(&local, &fleet).granted[CREATE], 0);
    }

    /// One member of a simulated fleet: its lanes and what it remembers.
    struct Simulated {
        member: Uuid,
        sightings: Sightings,
        shares: PerEndpoint,
        lease_until: Instant,
        ticked: Instant,
        /// By endpoint: the longest time without a share, and since when it has none.
        longest_without: [Duration; Endpoint::COUNT],
        without_since: [Option<Instant>; Endpoint::COUNT],
    }

    impl Simulated {
        /// Its shares now in force: a stretch without one on an endpoint it wants ends or
        /// begins, counted from `counted_from` on.
        fn served(&mut self, now: Instant, wanted: &[usize], counted_from: Instant) {
            for e in 0..Endpoint::COUNT {
                if self.shares[e] > 0 {
                    if let Some(since) = self.without_since[e].take() {
                        self.longest_without[e] = self.longest_without[e].max(now - since);
                    }
                } else if wanted.contains(&e) && self.without_since[e].is_none() {
                    self.without_since[e] = Some(now.max(counted_from));
                }
            }
        }
    }

    /// The budget's tables, kept here as [`write`]'s statement keeps them in PostgreSQL.
    #[derive(Default)]
    struct Tables {
        members: HashMap<Uuid, MemberJson>,
        ledger: Ledger,
    }

    impl Tables {
        fn write(&mut self, member: Uuid, decision: &Decision, db_now: DateTime<Utc>) {
            let lease = chrono::TimeDelta::from_std(LEASE).unwrap();
            let window = chrono::TimeDelta::from_std(WINDOW).unwrap();
            let old = self.members.get(&member).filter(|_| !decision.lowered);
            let row = MemberJson {
                member,
                demand: names(decision.demand),
                share: names(decision.granted),
                held: names(decision.held),
                held_until: old.map_or(
                    db_now + if decision.lowered { window } else { chrono::TimeDelta::zero() },
                    |o| o.held_until,
                ),
                held_tick: old.map_or(decision.ledger.tick, |o| o.held_tick),
                expires_at: db_now + lease,
                renewed_tick: decision.ledger.tick,
            };
            self.members.insert(member, row);
            for gone in &decision.gone {
                self.members.remove(gone);
            }
            self.ledger = decision.ledger;
        }
    }

    /// The fleet's budget simulated for `seconds`: `members` members, each with demand that
    /// never lets up on `wanted`, ticking every [`super::super::TICK`] in turn through
    /// [`decide`] against [`Tables`]. The database's clock steps `step` forward at 10 s, and
    /// the first member makes no tick from 15 s to 18 s (its database quiet: it sends on until
    /// its lease runs out). At every tick, the shares in force (by each member's own lease)
    /// together stay within each limit. Returns, by member and endpoint, the longest time it
    /// went without a share once the first 5 s had passed.
    fn simulate(
        members: u128,
        limits: FleetLimits,
        wanted: &[usize],
        seconds: u64,
        step: chrono::TimeDelta,
    ) -> Vec<[Duration; Endpoint::COUNT]> {
        let tick = super::super::TICK;
        let origin = Instant::now();
        let counted_from = origin + Duration::from_secs(5);
        let mut fleet: Vec<Simulated> = (1..=members)
            .map(|m| Simulated {
                member: Uuid::from_u128(m),
                sightings: Sightings::default(),
                shares: [0; Endpoint::COUNT],
                lease_until: origin,
                ticked: origin,
                longest_without: [Duration::ZERO; Endpoint::COUNT],
                without_since: [None; Endpoint::COUNT],
            })
            .collect();
        let mut tables = Tables::default();
        let stalled = Duration::from_secs(15)..Duration::from_secs(18);
        let members = members as u32;
        for n in 0..seconds as u32 * 4 * members {
            let m = (n % members) as usize;
            let now = origin + tick * (n / members) + tick / members * m as u32;
            if m == 0 && stalled.contains(&(now - origin)) {
                continue;
            }
            let db_now = DateTime::UNIX_EPOCH
                + if now - origin >= Duration::from_secs(10) { step } else { chrono::TimeDelta::zero() };
            let me = &mut fleet[m];
            let rows = me.sightings.rows(tables.members.values().map(clone_json).collect(), now);
            let local = Local {
                member: me.member,
                limits,
                arrivals: std::array::from_fn(|e| if wanted.contains(&e) { (50, 20) } else { (0, 0) }),
                limited: [0; Endpoint::COUNT],
                shares: me.shares,
                elapsed: now.saturating_duration_since(me.ticked).min(MOST_ELAPSED),
            };
            let read =
                Fleet { rows, slowdowns: HashMap::new(), ledger: tables.ledger, now: db_now, read_at: now };
            let decision = decide(&local, &read);
            tables.write(me.member, &decision, db_now);
            (me.shares, me.lease_until, me.ticked) = (decision.granted, now + LEASE, now);
            me.served(now, wanted, counted_from);
            assert_within(&fleet, &limits, now, now - origin);
        }
        let end = origin + Duration::from_secs(seconds);
        fleet
            .iter()
            .map(|s| {
                std::array::from_fn(|e| {
                    s.longest_without[e].max(s.without_since[e].map_or(Duration::ZERO, |since| end - since))
                })
            })
            .collect()
    }

    /// What the members may send at `now`, by their own leases, within each limit.
    fn assert_within(fleet: &[Simulated], limits: &FleetLimits, now: Instant, at: Duration) {
        let in_force =
            |e: usize| -> u32 { fleet.iter().filter(|s| s.lease_until > now).map(|s| s.shares[e]).sum() };
        for e in 0..Endpoint::COUNT {
            assert!(
                in_force(e) <= limits.endpoint,
                "{} in force on {:?} at {at:?}",
                in_force(e),
                Endpoint::ALL[e]
            );
        }
        let all: u32 = (0..Endpoint::COUNT).map(in_force).sum();
        assert!(all <= limits.account, "{all} in force on the account at {at:?}");
    }

    fn names(values: PerEndpoint) -> HashMap<String, u32> {
        by_name(values).into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    fn clone_json(m: &MemberJson) -> MemberJson {
        MemberJson {
            member: m.member,
            demand: m.demand.clone(),
            share: m.share.clone(),
            held: m.held.clone(),
            held_until: m.held_until,
            expires_at: m.expires_at,
            renewed_tick: m.renewed_tick,
            held_tick: m.held_tick,
        }
    }

    const STRIPE: FleetLimits = FleetLimits { account: 100, endpoint: 25, ceiling: None };

    #[test]
    fn more_intakes_than_a_limit_s_units_are_each_served_within_seconds() {
        for (members, limit, bound) in [(6, 4, 8), (30, 25, 14), (7, 2, 14)] {
            let limits = FleetLimits { endpoint: limit, ..STRIPE };
            let longest = simulate(members, limits, &[CREATE], 60, chrono::TimeDelta::zero());
            let (member, worst) =
                longest.iter().enumerate().map(|(m, l)| (m, l[CREATE])).max_by_key(|(_, l)| *l).unwrap();
            println!("{members} members at {limit}: the longest without a share {worst:?} (member {member})");
            assert!(
                worst <= Duration::from_secs(bound),
                "{members} at {limit}: member {member} waited {worst:?}"
            );
        }
    }

    #[test]
    fn a_ceiling_of_two_serves_each_of_three_operations_within_seconds() {
        let limits = FleetLimits { ceiling: Some(2), ..STRIPE };
        let longest = simulate(
            1,
            limits,
            &[RETRIEVE, Endpoint::Capture as usize, CANCEL],
            60,
            chrono::TimeDelta::zero(),
        );
        println!("the longest without a share, by endpoint: {:?}", longest[0]);
        assert!(longest[0].iter().all(|l| *l <= Duration::from_secs(5)), "{:?}", longest[0]);
    }

    #[test]
    fn a_database_clock_stepping_forward_puts_no_limit_over() {
        for step in [chrono::TimeDelta::seconds(3), chrono::TimeDelta::hours(1)] {
            simulate(4, STRIPE, &[CREATE, CANCEL], 30, step);
        }
    }
}
