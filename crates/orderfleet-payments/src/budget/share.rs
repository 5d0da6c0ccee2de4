//! How the fleet's Stripe budget is divided: pure arithmetic on the members' rows, so each
//! rule is tested without a database or a clock.
//!
//! - A member's **target** on an endpoint is its max-min fair part of the endpoint's limit,
//!   given every live member's demand ([`water_fill`]); when the targets together pass the
//!   account's limit, the account's limit is divided the same way over them, and a process's
//!   ceiling over its endpoints. A member that demands nothing gets nothing. When a limit is
//!   too small to give one to each member wanting it, it goes round: the ledger's round
//!   ([`super::ROUND`]) moves it on by one member each round, so each is served within as many
//!   rounds as there are members left out.
//! - What a member may **take** ([`grant`]) is its target, but never more than the limit left
//!   by what every other member may still be sending: its share while its lease, and one
//!   window after, lasts, and the larger share it gave up in the last window ([`Row::claim`]).
//!   A member gives up its excess at its next tick; the capacity comes free for the others a
//!   window later. So the members' claims never add up to more than a limit, whatever the
//!   targets: two members that saw different rounds, or different rows, still take only what
//!   is free.
//! - Times here are this process's own monotonic clock. A row's lease and its given-up share
//!   are counted from when this process first saw them ([`super::ledger`]), never by the
//!   database's clock.

use std::collections::BTreeMap;

use tokio::time::Instant;
use uuid::Uuid;

use super::{Endpoint, WINDOW};

/// Requests per window on each endpoint.
pub(crate) type PerEndpoint = [u32; Endpoint::COUNT];

/// One member of the fleet's budget, as its row says, its times on this process's clock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub member: Uuid,
    /// What it asked for at its last tick.
    pub demand: PerEndpoint,
    /// What it may send, paced over a window, until `expires_at`.
    pub share: PerEndpoint,
    /// A larger share it gave up, which it may have used in the window before `held_until`.
    pub held: PerEndpoint,
    pub held_until: Instant,
    /// Its lease: it sends nothing past this unless it renews.
    pub expires_at: Instant,
}

impl Row {
    /// Whether it may still send: its lease has not run out.
    pub fn live(&self, now: Instant) -> bool {
        now < self.expires_at
    }

    /// What it may have sent in the window up to `now`, on each endpoint: its share while its
    /// lease lasts, then, for one window after, what its last requests still fill of it; and
    /// what a larger share given up less than a window ago still fills.
    ///
    /// A share that stops at `t0` (the lease ran out, or the share was cut from `a` to `a'`)
    /// fills the window ending `x` after `t0` with at most `a · (W − x) / W + a' · x / W + 1`
    /// requests: those sent before `t0` were paced at `a`, those after at `a'`
    /// ([`super::lane`]). So the claim falls by steps through the window, and the capacity it
    /// gives up comes free for the others as it goes, not all at the window's end.
    pub fn claim(&self, now: Instant) -> PerEndpoint {
        let lapse = fading(self.expires_at + WINDOW, now);
        let cut = fading(self.held_until, now);
        std::array::from_fn(|e| {
            let share = if now < self.expires_at { self.share[e] } else { filled(0, self.share[e], lapse) };
            let held = if cut > 0.0 { filled(self.share[e].min(self.held[e]), self.held[e], cut) } else { 0 };
            share.max(held)
        })
    }

    /// Whether its row can go: its lease is over and nothing it sent is still in a window. A
    /// live member with no share keeps its row: its demand is how the others learn to make
    /// room for it.
    pub fn gone(&self, now: Instant) -> bool {
        !self.live(now) && self.claim(now).iter().all(|&c| c == 0)
    }
}

/// The limits the budget divides: the account's, each endpoint's as slowed down after a 429,
/// and this process's own ceiling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limits {
    pub account: u32,
    pub endpoint: PerEndpoint,
    pub ceiling: Option<u32>,
}

/// How much of the window before `until` is still to come at `now`: 1 a window ahead of it,
/// 0 from `until` on.
fn fading(until: Instant, now: Instant) -> f64 {
    (until.saturating_duration_since(now).as_secs_f64() / WINDOW.as_secs_f64()).clamp(0.0, 1.0)
}

/// What a share cut from `from` to `to` still fills of a window, `left` of the window after
/// the cut still to come: `to`, and what the requests paced at `from` still fill, and one for
/// the request that straddles the cut; never more than `from`, nothing once the window is past.
fn filled(to: u32, from: u32, left: f64) -> u32 {
    if from <= to || left <= 0.0 {
        return to;
    }
    let fading = (f64::from(from - to) * left).ceil() as u32;
    (to + fading + 1).min(from)
}

/// Max-min fair integer division of `capacity` among `demands`: nobody gets more than it
/// asks for, and capacity left over goes to those who asked for more, evenly.
///
/// What is too little to go round:
/// - fewer units than those wanting one: one each to as many as there are units, starting at
///   `round` (modulo those wanting) and going on in order, so the unit that leaves one member
///   as the round moves on goes to the next left out, and each is served within as many
///   rounds as there are members left out;
/// - a remainder once each has had some: to the first in order. Every member wanting is
///   served, and a unit moved costs the fleet that unit for a window while the member that
///   gives it up still claims it, so it stays put.
///
/// The order and the round are the same for every member (by member id, and the ledger's
/// round), so every member computes the same division from the same rows.
pub(crate) fn water_fill(capacity: u32, demands: &[u32], round: u64) -> Vec<u32> {
    let mut given = vec![0u32; demands.len()];
    let mut left = capacity;
    let mut wanting: Vec<usize> = (0..demands.len()).filter(|&i| demands[i] > 0).collect();
    if (left as usize) < wanting.len() {
        let first = (round % wanting.len() as u64) as usize;
        for &i in wanting.iter().cycle().skip(first).take(left as usize) {
            given[i] = 1;
        }
        return given;
    }
    while left > 0 && !wanting.is_empty() {
        let each = left / wanting.len() as u32;
        if each == 0 {
            for &i in wanting.iter().take(left as usize) {
                given[i] += 1;
            }
            break;
        }
        for &i in &wanting {
            let more = each.min(demands[i] - given[i]);
            given[i] += more;
            left -= more;
        }
        wanting.retain(|&i| given[i] < demands[i]);
    }
    given
}

/// This member's target: its fair part of each endpoint's limit, then of the account's,
/// among the live members (itself included, with its demand of now), then of its ceiling, in
/// the ledger's `round`.
pub(crate) fn target(
    me: Uuid,
    demand: PerEndpoint,
    rows: &[Row],
    limits: &Limits,
    round: u64,
    now: Instant,
) -> PerEndpoint {
    let mut demands: BTreeMap<Uuid, PerEndpoint> =
        rows.iter().filter(|r| r.member != me && r.live(now)).map(|r| (r.member, r.demand)).collect();
    demands.insert(me, demand);
    let members: Vec<Uuid> = demands.keys().copied().collect();
    let per_endpoint: Vec<Vec<u32>> = (0..Endpoint::COUNT)
        .map(|e| {
            water_fill(limits.endpoint[e], &members.iter().map(|m| demands[m][e]).collect::<Vec<_>>(), round)
        })
        .collect();
    // Member by member, endpoint by endpoint.
    let mut fair: Vec<u32> =
        (0..members.len()).flat_map(|m| per_endpoint.iter().map(move |column| column[m])).collect();
    if fair.iter().sum::<u32>() > limits.account {
        fair = water_fill(limits.account, &fair, round);
    }
    let mine = members.iter().position(|&m| m == me).expect("inserted above") * Endpoint::COUNT;
    let mut target: PerEndpoint = std::array::from_fn(|e| fair[mine + e]);
    if let Some(ceiling) = limits.ceiling.filter(|&c| target.iter().sum::<u32>() > c) {
        let capped = water_fill(ceiling, &target, round);
        target = std::array::from_fn(|e| capped[e]);
    }
    target
}

/// What this member may take now: its target, within what the others' claims leave of each
/// endpoint's limit and of the account's (that divided over its endpoints as in [`target`]).
pub(crate) fn grant(
    me: Uuid,
    target: PerEndpoint,
    rows: &[Row],
    limits: &Limits,
    round: u64,
    now: Instant,
) -> PerEndpoint {
    let mut others = [0u32; Endpoint::COUNT];
    for row in rows.iter().filter(|r| r.member != me) {
        for (sum, claim) in others.iter_mut().zip(row.claim(now)) {
            *sum += claim;
        }
    }
    let granted: PerEndpoint =
        std::array::from_fn(|e| target[e].min(limits.endpoint[e].saturating_sub(others[e])));
    let account_left = limits.account.saturating_sub(others.iter().sum());
    if granted.iter().sum::<u32>() <= account_left {
        return granted;
    }
    let fitted = water_fill(account_left, &granted, round);
    std::array::from_fn(|e| fitted[e])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATE: usize = Endpoint::Create as usize;
    const CAPTURE: usize = Endpoint::Capture as usize;

    /// `ms` after the tests' origin, on this process's clock.
    fn at(ms: u64) -> Instant {
        static ORIGIN: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
        *ORIGIN + std::time::Duration::from_millis(ms)
    }

    fn on(endpoint: usize, n: u32) -> PerEndpoint {
        let mut v = [0; Endpoint::COUNT];
        v[endpoint] = n;
        v
    }

    fn row(member: u128, demand: PerEndpoint, share: PerEndpoint, expires_ms: u64) -> Row {
        Row {
            member: Uuid::from_u128(member),
            demand,
            share,
            held: [0; Endpoint::COUNT],
            held_until: at(0),
            expires_at: at(expires_ms),
        }
    }

    const STRIPE: Limits = Limits { account: 100, endpoint: [25; Endpoint::COUNT], ceiling: None };

    #[test]
    fn water_filling_gives_each_what_it_asks_and_splits_the_rest_evenly() {
        assert_eq!(water_fill(25, &[3, 100, 100], 0), vec![3, 11, 11]);
        assert_eq!(water_fill(25, &[100, 100, 100], 0), vec![9, 8, 8]);
        assert_eq!(water_fill(25, &[0, 4, 0], 0), vec![0, 4, 0]);
        assert_eq!(water_fill(2, &[5, 5, 5], 0), vec![1, 1, 0]);
        assert_eq!(water_fill(0, &[5], 0), vec![0]);
    }

    #[test]
    fn three_intakes_that_each_want_everything_get_a_third_of_the_creates_each() {
        let rows =
            [row(1, on(CREATE, 50), on(CREATE, 8), 2_000), row(2, on(CREATE, 50), on(CREATE, 8), 2_000)];
        let mine = target(Uuid::from_u128(3), on(CREATE, 50), &rows, &STRIPE, 0, at(0));
        assert_eq!(mine, on(CREATE, 8));
        let all = [rows[0].clone(), rows[1].clone(), row(3, on(CREATE, 50), on(CREATE, 8), 2_000)];
        let first = target(Uuid::from_u128(1), on(CREATE, 50), &all, &STRIPE, 0, at(0));
        assert_eq!(first[CREATE], 9, "the remainder goes to the first");
    }

    #[test]
    fn a_member_that_joins_takes_only_what_the_others_do_not_claim() {
        // Arrange: one intake holds every create; a second joins wanting as many.
        let rows = [row(1, on(CREATE, 50), on(CREATE, 25), 2_000)];
        let me = Uuid::from_u128(2);

        // Act
        let wanted = target(me, on(CREATE, 50), &rows, &STRIPE, 0, at(0));
        let taken = grant(me, wanted, &rows, &STRIPE, 0, at(0));

        // Assert: its target is half, but nothing is free until the first gives its half up.
        assert_eq!(wanted[CREATE], 12);
        assert_eq!(taken[CREATE], 0);
    }

    #[test]
    fn a_share_given_up_comes_free_through_one_window() {
        // Arrange: the first intake cut its share from 25 to 13 at 0 ms.
        let mut first = row(1, on(CREATE, 50), on(CREATE, 13), 2_000);
        first.held = on(CREATE, 25);
        first.held_until = at(WINDOW.as_millis() as u64);
        let rows = [first];
        let me = Uuid::from_u128(2);
        let free_at = |ms| grant(me, on(CREATE, 12), &rows, &STRIPE, 0, at(ms))[CREATE];

        // Act
        let w = WINDOW.as_millis() as u64;
        let free = [free_at(0), free_at(w / 2), free_at(w - 50), free_at(w)];

        // Assert: 13 + ⌈12 · left⌉ + 1 is still claimed: nothing free at the cut, 5 halfway
        // through the window, 10 just before its end, 12 at its end.
        assert_eq!(free, [0, 5, 10, 12]);
    }

    #[test]
    fn a_killed_member_s_share_comes_free_through_the_window_after_its_lease() {
        let rows = [row(1, on(CREATE, 50), on(CREATE, 25), 2_000)];
        let me = Uuid::from_u128(2);
        let w = WINDOW.as_millis() as u64;
        let wanted = target(me, on(CREATE, 50), &rows, &STRIPE, 0, at(2_000));
        assert_eq!(wanted[CREATE], 25, "a member past its lease asks for nothing");
        assert_eq!(grant(me, wanted, &rows, &STRIPE, 0, at(2_000))[CREATE], 0);
        assert_eq!(grant(me, wanted, &rows, &STRIPE, 0, at(2_000 + w / 2))[CREATE], 11, "25 - (13 + 1)");
        assert_eq!(grant(me, wanted, &rows, &STRIPE, 0, at(2_000 + w))[CREATE], 25);
        assert!(!rows[0].gone(at(2_000 + w - 50)));
        assert!(rows[0].gone(at(2_000 + w)));
    }

    #[test]
    fn a_member_killed_after_a_cut_claims_nothing_once_its_lease_and_window_are_past() {
        // Arrange: it cut 25 to 8 long ago, then was killed; its lease ran out at 2 s.
        let mut killed = row(1, on(CREATE, 50), on(CREATE, 8), 2_000);
        killed.held = on(CREATE, 25);
        killed.held_until = at(500);

        // Act, Assert
        assert_eq!(killed.claim(at(1_000))[CREATE], 8);
        assert_eq!(killed.claim(at(2_000 + WINDOW.as_millis() as u64))[CREATE], 0);
        assert!(killed.gone(at(2_000 + WINDOW.as_millis() as u64)));
    }

    #[test]
    fn a_live_member_without_a_share_keeps_its_row_so_its_demand_is_seen() {
        let mut newcomer = row(2, on(CREATE, 50), on(CREATE, 0), 1_500);
        newcomer.held_until = at(0);
        assert!(!newcomer.gone(at(100)), "its demand must reach the others");
        assert!(newcomer.gone(at(1_500)));
    }

    #[test]
    fn a_cut_share_fills_at_most_what_its_pace_allowed() {
        assert_eq!(filled(9, 25, 1.0), 25, "never more than before the cut");
        assert_eq!(filled(9, 25, 0.5), 18);
        assert_eq!(filled(9, 25, 0.0), 9);
        assert_eq!(filled(25, 9, 0.5), 25, "no cut");
    }

    #[test]
    fn the_account_limit_holds_across_endpoints() {
        let limits = Limits { account: 30, ..STRIPE };
        let mut demand = on(CREATE, 25);
        demand[CAPTURE] = 25;
        let wanted = target(Uuid::from_u128(1), demand, &[], &limits, 0, at(0));
        assert_eq!(wanted.iter().sum::<u32>(), 30);
        let rows = [row(2, on(CAPTURE, 25), on(CAPTURE, 20), 2_000)];
        let taken = grant(Uuid::from_u128(1), wanted, &rows, &limits, 0, at(0));
        assert_eq!(taken.iter().sum::<u32>(), 10, "{taken:?}");
    }

    #[test]
    fn a_process_ceiling_caps_its_own_target() {
        let limits = Limits { ceiling: Some(7), ..STRIPE };
        assert_eq!(target(Uuid::from_u128(1), on(CREATE, 50), &[], &limits, 0, at(0)), on(CREATE, 7));
    }

    /// The most rounds in a row that one of `members` members, all wanting every create there
    /// is at `limit` a second, gets no target on creates, over 40 rounds.
    fn longest_unserved(members: u128, limit: u32) -> (u128, u64) {
        let mut limits = STRIPE;
        limits.endpoint[CREATE] = limit;
        let rows: Vec<Row> = (1..=members).map(|m| row(m, on(CREATE, 50), on(CREATE, 0), 2_000)).collect();
        let mut unserved = vec![0u64; members as usize];
        let mut longest = (0, 0);
        for round in 0..40u64 {
            for (m, streak) in unserved.iter_mut().enumerate() {
                let member = m as u128 + 1;
                let mine = target(Uuid::from_u128(member), on(CREATE, 50), &rows, &limits, round, at(0));
                *streak = if mine[CREATE] > 0 { 0 } else { *streak + 1 };
                if *streak > longest.1 {
                    longest = (member, *streak);
                }
            }
        }
        longest
    }

    #[test]
    fn more_members_than_units_are_each_served_within_a_few_rounds() {
        for (members, limit) in [(30, 25), (6, 4), (5, 1)] {
            let (member, rounds) = longest_unserved(members, limit);
            assert!(
                rounds <= (members - u128::from(limit)) as u64,
                "{members} members at {limit}: member {member} unserved {rounds} rounds in a row"
            );
        }
    }

    #[test]
    fn a_ceiling_below_the_operations_wanted_serves_each_within_a_few_rounds() {
        let limits = Limits { ceiling: Some(2), ..STRIPE };
        let mut demand = on(CREATE, 25);
        demand[Endpoint::Retrieve as usize] = 25;
        demand[Endpoint::Cancel as usize] = 25;
        let mut last_served = [0u64; Endpoint::COUNT];
        for round in 0..20u64 {
            let mine = target(Uuid::from_u128(1), demand, &[], &limits, round, at(0));
            assert!(mine.iter().sum::<u32>() <= 2, "{mine:?}");
            for e in [CREATE, Endpoint::Retrieve as usize, Endpoint::Cancel as usize] {
                if mine[e] > 0 {
                    last_served[e] = round;
                }
                assert!(
                    round - last_served[e] < 2,
                    "{:?} unserved since round {}: {mine:?}",
                    Endpoint::ALL[e],
                    last_served[e]
                );
            }
        }
    }

    #[test]
    fn nothing_is_granted_on_an_endpoint_slowed_below_what_others_claim() {
        let mut limits = STRIPE;
        limits.endpoint[CREATE] = 6;
        let rows = [row(1, on(CREATE, 50), on(CREATE, 12), 2_000)];
        let me = Uuid::from_u128(2);
        assert_eq!(target(me, on(CREATE, 50), &rows, &limits, 0, at(0))[CREATE], 3);
        assert_eq!(grant(me, on(CREATE, 3), &rows, &limits, 0, at(0))[CREATE], 0);
    }
}
