//! The holds this process made that held funds at once ([`HeldHere`]): kept in memory so that
//! the webhook answers their `payment_intent.amount_capturable_updated` without a statement.

/// The PaymentIntents a process's authorizations created holding funds at once (no 3-D
/// Secure): the last [`HeldHere::KEPT`] of them, oldest forgotten first, and none whose
/// commit did not record it on its order (`authorization::record` forgets those: such an
/// intent may be a stray, to be released). Stripe's `payment_intent.amount_capturable_updated`
/// for one of them can change nothing (its order goes, or went, to `authorized` or on to
/// `stock_reserved` by the commit of that authorization, never to `requires_action`), so the
/// webhook answers it without a statement (`orderfleet::domain::steps::webhook::apply`). Another intake
/// process, or this one after a restart, does not know them, and its webhook reads the order,
/// as for any other event.
#[derive(Debug)]
pub(super) struct HeldHere {
    capacity: usize,
    kept: std::sync::Mutex<(std::collections::HashSet<String>, std::collections::VecDeque<String>)>,
}

impl Default for HeldHere {
    fn default() -> Self {
        Self::keeping(Self::KEPT)
    }
}

impl HeldHere {
    /// How many are kept: an hour of a busy intake's authorizations, a few megabytes.
    const KEPT: usize = 100_000;

    fn keeping(capacity: usize) -> Self {
        Self { capacity, kept: std::sync::Mutex::default() }
    }

    pub(super) fn remember(&self, payment_intent_id: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (set, order) = &mut *kept;
        if set.insert(payment_intent_id.to_owned()) {
            order.push_back(payment_intent_id.to_owned());
        }
        while order.len() > self.capacity {
            order.pop_front().map(|oldest| set.remove(&oldest));
        }
    }

    pub(super) fn forget(&self, payment_intent_id: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (set, order) = &mut *kept;
        if set.remove(payment_intent_id) {
            order.retain(|id| id != payment_intent_id);
        }
    }

    pub(super) fn knows(&self, payment_intent_id: &str) -> bool {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.contains(payment_intent_id)
    }
}

#[cfg(test)]
mod tests {
    use super::HeldHere;

    #[test]
    fn the_holds_made_here_are_known_until_newer_ones_push_them_out() {
        let held = HeldHere::keeping(2);
        held.remember("pi_1");
        held.remember("pi_2");
        held.remember("pi_2");
        assert!(held.knows("pi_1") && held.knows("pi_2") && !held.knows("pi_3"));
        held.remember("pi_3");
        assert!(!held.knows("pi_1"), "the oldest is forgotten first");
        assert!(held.knows("pi_2") && held.knows("pi_3"));
        held.forget("pi_2");
        assert!(!held.knows("pi_2") && held.knows("pi_3"), "a hold its commit did not record");
        held.remember("pi_4");
        assert!(held.knows("pi_3") && held.knows("pi_4"));
    }
}
