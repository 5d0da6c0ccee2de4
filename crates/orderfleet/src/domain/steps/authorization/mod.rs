//! Authorizing a `pending_authorization` order: the Stripe call outside any transaction,
//! then ONE transaction that records the result — `authorized` with its outbox rows, or
//! `payment_declined`, which gives the order's promised units back. The intake runs it for a
//! new order or a retried key; the sweeper runs it for an order whose intake died or gave up
//! (the provider was down).
//!
//! Whoever runs it holds the order's lease (`intake_lease_until`), so two requests never
//! authorize the same order at once; and the Stripe key is the order's own
//! (`orderfleet-<order>-authorize`), so running it again replays the first authorization
//! rather than making a second one.
//!
//! By role, each file going down to the next, never back: `resume` (an order taken over, and
//! its deadline) → `authorize` (the Stripe call) → `card` (the card's cap, checked before the
//! first PaymentIntent) → `record` (its answer, in ONE statement) → `lease` (the order's lease
//! taken and given back).

mod authorize;
mod card;
mod lease;
mod record;
mod resume;

pub(crate) use crate::domain::steps::leased::within;
pub use authorize::{authorize, waiting_ahead};
pub use lease::{release, take_over};
pub(crate) use record::decline;
pub use record::{Recorded, UNSETTLED_FOR, record, unsettled_too_long};
pub use resume::{CALLS_TO_RESUME, KEY_KEPT, resume, resume_deadline, take_over_and_resume};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_is_waited_for_ten_minutes_after_stripe_made_it_then_released() {
        let now = chrono::Utc::now();
        assert!(!unsettled_too_long(Some(now - chrono::TimeDelta::minutes(9)), now));
        assert!(unsettled_too_long(Some(now - chrono::TimeDelta::minutes(11)), now));
        assert!(!unsettled_too_long(None, now), "no creation time: waited for");
    }
}
