//! One tick of a member: the fleet's rows read and this member's written back in one short
//! transaction under an advisory lock, so two members never divide the same free capacity.
//! Five round trips (`BEGIN`, the lock, the read, the write, `COMMIT`), four times a second while
//! the process has work, none per Stripe request.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::types::Json;
use tokio::time::Instant;
use uuid::Uuid;

use super::share::{self, Limits, PerEndpoint, Row};
use super::{Endpoint, LEASE, Seen, StripeBudget, WINDOW};

/// The advisory lock's key: `orderfleet.stripe_budget` as an 8-byte number.
const LOCK: i64 = 0x6f66_5f62_7564_6765;

/// A cut halves an endpoint's limit, at most once a [`CUT_EVERY`], never below this.
const SLOWEST: f64 = 0.04;
/// One cut per endpoint per second: the 429s of one burst are one signal, not many.
const CUT_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(1);
/// A cut limit grows back to the whole in this long from nothing.
const RECOVERY_SECONDS: f64 = 30.0;

#[derive(Debug, Deserialize)]
struct MemberJson {
    member: Uuid,
    demand: HashMap<String, u32>,
    share: HashMap<String, u32>,
    held: HashMap<String, u32>,
    held_until: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct SlowdownJson {
    factor: f64,
    cut_at: DateTime<Utc>,
}

fn per_endpoint(by_name: &HashMap<String, u32>) -> PerEndpoint {
    Endpoint::ALL.map(|e| by_name.get(e.name()).copied().unwrap_or(0))
}

fn by_name(values: PerEndpoint) -> HashMap<&'static str, u32> {
    Endpoint::ALL.iter().map(|&e| (e.name(), values[e as usize])).collect()
}

impl From<MemberJson> for Row {
    fn from(m: MemberJson) -> Self {
        Row {
            member: m.member,
            demand: per_endpoint(&m.demand),
            share: per_endpoint(&m.share),
            held: per_endpoint(&m.held),
            held_until: m.held_until,
            expires_at: m.expires_at,
        }
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
fn demand((arrivals, queued): (u64, usize), elapsed: std::time::Duration, cap: u32) -> u32 {
    let per_window = arrivals as f64 * WINDOW.as_secs_f64() / elapsed.as_secs_f64().max(0.05) + queued as f64;
    if per_window == 0.0 { 0 } else { ((per_window * 1.25).ceil() as u32 + 1).min(cap) }
}

/// What the tick decided, before it is written.
struct Decision {
    demand: PerEndpoint,
    granted: PerEndpoint,
    held: PerEndpoint,
    /// `None`: hold `held` for a window from the write; otherwise the row's own.
    held_until: Option<DateTime<Utc>>,
    cuts: Vec<(&'static str, f64)>,
    gone: Vec<Uuid>,
    endpoint_limit: PerEndpoint,
    target: PerEndpoint,
    /// Live members, this one included.
    members: u32,
}

/// One tick: read, decide, lower what must be lowered, write, commit, then raise.
pub(super) async fn tick(budget: &StripeBudget) -> sqlx::Result<()> {
    let started = Instant::now();
    let mut tx = budget.pool.begin().await?;
    lock(&mut tx).await?;
    let fleet = sqlx::query!(
        r#"SELECT clock_timestamp() AS "now!",
                  (SELECT coalesce(jsonb_agg(to_jsonb(m) - 'process' - 'updated_at'), '[]')
                     FROM stripe_budget_members m) AS "members!: Json<Vec<MemberJson>>",
                  (SELECT coalesce(jsonb_object_agg(s.endpoint, to_jsonb(s) - 'endpoint'), '{}')
                     FROM stripe_budget_slowdowns s) AS "slowdowns!: Json<HashMap<String, SlowdownJson>>""#
    )
    .fetch_one(&mut *tx)
    .await?;
    let rows: Vec<Row> = fleet.members.0.into_iter().map(Row::from).collect();
    let decision = decide(budget, started, &rows, &fleet.slowdowns.0, fleet.now);
    for e in Endpoint::ALL {
        let lane = &budget.lanes[e as usize];
        if decision.granted[e as usize] < lane.share() {
            lane.set(decision.granted[e as usize], None);
        }
    }
    let (cut_endpoints, cut_factors): (Vec<&str>, Vec<f64>) = decision.cuts.iter().copied().unzip();
    sqlx::query!(
        r#"WITH me AS (
               INSERT INTO stripe_budget_members AS m (member, process, demand, share, held, held_until, expires_at)
               VALUES ($1, $2, $3, $4, $5,
                       coalesce($6, clock_timestamp() + $7 * interval '1 ms'),
                       clock_timestamp() + $8 * interval '1 ms')
               ON CONFLICT (member) DO UPDATE
                   SET demand = excluded.demand, share = excluded.share, held = excluded.held,
                       held_until = excluded.held_until, expires_at = excluded.expires_at,
                       updated_at = clock_timestamp()
               RETURNING 1
           ), cut AS (
               INSERT INTO stripe_budget_slowdowns (endpoint, factor, cut_at)
               SELECT endpoint, factor, clock_timestamp() FROM unnest($9::text[], $10::float8[]) AS c(endpoint, factor)
               ON CONFLICT (endpoint) DO UPDATE SET factor = excluded.factor, cut_at = excluded.cut_at
               RETURNING 1
           )
           DELETE FROM stripe_budget_members WHERE member = ANY($11)"#,
        budget.member,
        budget.process,
        Json(by_name(decision.demand)) as _,
        Json(by_name(decision.granted)) as _,
        Json(by_name(decision.held)) as _,
        decision.held_until,
        WINDOW.as_millis() as i64,
        LEASE.as_millis() as i64,
        &cut_endpoints as &[&str],
        &cut_factors,
        &decision.gone,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    apply(budget, &decision, started);
    Ok(())
}

/// Takes the budget's lock for this transaction. A member stalled inside its tick (paused,
/// starved, cut off) holds the lock: the server ends its transaction after a second idle in
/// it, and a tick waits a second at most for the lock, so one stalled member cannot stop the
/// others' ticks past their leases.
async fn lock(tx: &mut crate::pool::Tx) -> sqlx::Result<()> {
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

/// The shares granted, in force until the lease counted from before the tick asked.
fn apply(budget: &StripeBudget, decision: &Decision, started: Instant) {
    for e in Endpoint::ALL {
        budget.lanes[e as usize].set(decision.granted[e as usize], Some(started + LEASE));
        metrics::gauge!("stripe_budget_share", "endpoint" => e.name())
            .set(f64::from(decision.granted[e as usize]));
        metrics::gauge!("stripe_budget_limit", "endpoint" => e.name())
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

fn decide(
    budget: &StripeBudget,
    started: Instant,
    rows: &[Row],
    slowdowns: &HashMap<String, SlowdownJson>,
    now: DateTime<Utc>,
) -> Decision {
    let mut cuts = Vec::new();
    let endpoint_limit: PerEndpoint = Endpoint::ALL.map(|e| {
        let slowdown = slowdowns.get(e.name()).copied();
        let mut f = factor(slowdown, now);
        let limited = budget.limited[e as usize].swap(false, Ordering::AcqRel);
        if limited && slowdown.is_none_or(|s| now - s.cut_at >= CUT_EVERY) {
            f = (f / 2.0).max(SLOWEST);
            cuts.push((e.name(), f));
        }
        ((f64::from(budget.limits.endpoint) * f).floor() as u32).max(1)
    });
    let limits =
        Limits { account: budget.limits.account, endpoint: endpoint_limit, ceiling: budget.limits.ceiling };
    // Since the last tick, or a second at most: requests that come after a quiet spell are
    // demand now, not spread over the spell.
    let elapsed = {
        let seen = budget.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        started.saturating_duration_since(seen.ticked).min(std::time::Duration::from_secs(1))
    };
    let mine = rows.iter().find(|r| r.member == budget.member);
    // A demand falls by a quarter a tick at most: a queue that empties for a moment between
    // two waves of buyers does not give its share up, to take it back a window later.
    let demand: PerEndpoint = Endpoint::ALL.map(|e| {
        let now = demand(budget.lanes[e as usize].take_arrivals(), elapsed, endpoint_limit[e as usize]);
        now.max(mine.map_or(0, |r| r.demand[e as usize] * 3 / 4))
    });
    let target = share::target(budget.member, demand, rows, &limits, now);
    let granted = share::grant(budget.member, target, rows, &limits, now);
    let local: PerEndpoint = Endpoint::ALL.map(|e| budget.lanes[e as usize].share());
    let lowered = (0..Endpoint::COUNT).any(|e| granted[e] < local[e].max(mine.map_or(0, |r| r.share[e])));
    let (held, held_until) = match mine {
        _ if lowered => {
            let before = mine.map_or([0; Endpoint::COUNT], |r| r.claim(now));
            (std::array::from_fn(|e| before[e].max(local[e])), None)
        }
        Some(row) => (row.held, Some(row.held_until)),
        None => ([0; Endpoint::COUNT], Some(now)),
    };
    let gone = rows.iter().filter(|r| r.member != budget.member && r.gone(now)).map(|r| r.member).collect();
    let members = 1 + rows.iter().filter(|r| r.member != budget.member && r.live(now)).count() as u32;
    Decision { demand, granted, held, held_until, cuts, gone, endpoint_limit, target, members }
}

use std::sync::atomic::Ordering;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_the_last_tick_s_rate_and_the_queue_with_room_to_grow() {
        let half = std::time::Duration::from_millis(500);
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
}
