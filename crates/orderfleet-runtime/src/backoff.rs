//! Backoff with jitter: retries spread out instead of arriving together.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff: attempt `n` (from 0) waits about `base × 2ⁿ`, capped at `max`, with
/// "equal jitter" (half fixed, half random) so it never collapses to zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// Delays from `base`, doubling, at most `max`.
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The cap for attempt `n`, before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// A jittered delay for attempt `n`, in `[ceiling/2, ceiling]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        let jitter_ms = half.as_millis() as u64;
        let jitter = if jitter_ms == 0 { 0 } else { rand::rng().random_range(0..=jitter_ms) };
        half + Duration::from_millis(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_within_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(3), Duration::from_millis(800));
        assert_eq!(b.ceiling(30), Duration::from_secs(2));
        for attempt in 0..10 {
            let d = b.delay(attempt);
            assert!(d >= b.ceiling(attempt) / 2 && d <= b.ceiling(attempt), "{attempt}: {d:?}");
        }
    }
}
