//! The operator's `fleetctl product upsert`: a new total, applied when the check accepts it
//! (never below the units taken and, under the code's rule, never below the units the line
//! holds up to its last order served). Mirrors the fleet's `domain::product` (`upsert`).

use super::{CutRule, OrderProtocol};
use crate::state::*;

impl OrderProtocol {
    /// The operator's upsert `i`, applied when `fleetctl` would accept it.
    pub(super) fn upsert(&self, s: &mut State, i: u8) {
        s.upserts_done |= 1 << i;
        let asked = self.scenario.upserts[usize::from(i)];
        if self.upsert_accepted(s, asked) {
            let p = &mut s.product;
            p.stock += asked as i8 - p.total as i8;
            p.total = asked;
        }
    }

    /// `fleetctl product upsert`'s check ([`orderfleet::domain::records::product::upsert`]).
    fn upsert_accepted(&self, s: &State, asked: u8) -> bool {
        let taken = s.product.total as i8 - s.product.stock;
        if (asked as i8) < taken {
            return false;
        }
        match self.rules.cut {
            CutRule::AboveTaken => true,
            CutRule::KeepTheLineServed => {
                let last_served =
                    s.existing().filter(|(_, o)| o.status.has_taken()).map(|(_, o)| o.position).max();
                let least: u8 = match last_served {
                    None => 0,
                    Some(last) => s
                        .existing()
                        .filter(|(_, o)| o.position <= last && o.status.holds_a_promise())
                        .map(|(id, _)| self.quantity(id))
                        .sum(),
                };
                asked >= least
            }
        }
    }
}
