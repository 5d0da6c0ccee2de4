//! Crash points for the fault-injection suite: with `ORDERFLEET_FAILPOINTS=name[,name…]` set,
//! the process aborts at once on reaching a named point — no cleanup, no flush, exactly as if
//! it had been SIGKILLed there.
//!
//! They exist only in builds with the `failpoints` feature, which the end-to-end tests enable
//! (the workspace build unifies it into the binaries they run). A binary built on its own
//! (`cargo build --release -p order-intake`, as an image does) has none: there `hit` is empty
//! and the variable means nothing, so no setting can make a production process abort.
//! `scripts/test.sh` checks that no binary's own build pulls the feature in.
//!
//! The points: `after_authorize` (intake: the payment authorized, nothing committed),
//! `after_reserve` (stock reserved and committed, not captured: a stock worker that reserved,
//! or that took the message of an order reserved at its commit), `after_capture` (captured,
//! not committed), `after_paid` (paid committed, message not deleted), `during_opening` (a stock
//! worker's opener: the queue drawn, not committed). One point plants a
//! defect instead of a crash ([`planted`]).

#[cfg(feature = "failpoints")]
use std::sync::OnceLock;

#[cfg(feature = "failpoints")]
static ARMED: OnceLock<Vec<String>> = OnceLock::new();

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn panic_at(_name: &str) {}

/// Without the `failpoints` feature: never.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn planted(_name: &str) -> bool {
    false
}

/// Whether the defect `name` is planted: the point `sold_out_cache` (the intake answers
/// `sold_out` from a read up to two seconds old, as a cache with a time to live would), which
/// the end-to-end suite plants to show that its check of §8.7 finds such a cache.
#[cfg(feature = "failpoints")]
pub fn planted(name: &str) -> bool {
    armed(name)
}

/// Aborts the process if `name` is armed.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    if armed(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}

/// Panics (the task it runs in dies, the process goes on) if `name` is armed: the points
/// `sweeper_panics`, `retention_panics`, `gauges_panics`, `poller_panics`.
#[cfg(feature = "failpoints")]
pub fn panic_at(name: &str) {
    if armed(name) {
        panic!("failpoint {name}");
    }
}

#[cfg(feature = "failpoints")]
fn armed(name: &str) -> bool {
    let armed = ARMED.get_or_init(|| {
        std::env::var("ORDERFLEET_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    });
    armed.iter().any(|a| a == name)
}
