//! Crash points for the fault-injection suite: with `ORDERFLEET_FAILPOINTS=name[,name…]` set,
//! the process aborts at once on reaching a named point — no cleanup, no flush, exactly as if
//! it had been SIGKILLed there. Unset (always, in production) a point costs one branch.
//!
//! The points: `after_authorize` (intake: Stripe authorized, nothing committed),
//! `after_reserve` (stock reserved and committed, not captured), `after_capture` (captured,
//! not committed), `after_paid` (paid committed, message not deleted).

use std::sync::OnceLock;

static ARMED: OnceLock<Vec<String>> = OnceLock::new();

/// Aborts the process if `name` is armed.
pub fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| {
        std::env::var("ORDERFLEET_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    });
    if armed.iter().any(|a| a == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}
