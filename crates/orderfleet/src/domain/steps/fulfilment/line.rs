//! The arithmetic of who fits in line: whether an order's units are left after the orders
//! ahead of it have taken theirs ([`fits_in_line`]), and whether that answer is known while
//! some of them are still pending authorization ([`fits_whatever_the_pending_do`]). Pure
//! functions of the quantities, with no database, so the reservation (`reserve`) and the model
//! (`crates/order-model`) decide by the same rule, and the rule is tested here on its own.

/// Whether an order of `quantity` finds its units when `stock` units are not yet taken and
/// `ahead` are the quantities of the orders ahead of it in line that have not taken theirs, in
/// line order. Each order ahead takes its units if they are there when its turn comes, and
/// otherwise is rejected and takes none; so an order behind one too large for what is left
/// may still be served, and no unit stays unsold while a buyer in line could have had it.
pub fn fits_in_line(stock: i32, ahead: &[i32], quantity: i32) -> bool {
    let mut left = stock;
    for &wanted in ahead {
        if wanted <= left {
            left -= wanted;
        }
    }
    quantity <= left
}

/// Whether an order of `quantity` finds its units when `stock` units are not yet taken and
/// `ahead` are the orders ahead of it in line that have not taken theirs, each with whether it
/// is still pending authorization (it may yet take its units, or be declined and take none):
/// `Some` when every way the pending ones can go gives the same answer, `None` when it
/// depends on them. [`fits_in_line`] lets an order too large for what is left be passed over,
/// so the answer is not monotonic in what the pending orders do, and every combination is
/// tried; past `MOST_PENDING_WEIGHED` pending orders ahead it is `None` (wait) unless the
/// units cover every order ahead outright.
pub fn fits_whatever_the_pending_do(stock: i32, ahead: &[(i32, bool)], quantity: i32) -> Option<bool> {
    let everyone: i64 = ahead.iter().map(|(q, _)| i64::from(*q)).sum();
    if i64::from(stock) - everyone >= i64::from(quantity) {
        return Some(true);
    }
    let pending: Vec<usize> = (0..ahead.len()).filter(|&i| ahead[i].1).collect();
    if pending.len() > MOST_PENDING_WEIGHED {
        return None;
    }
    let mut answers = (0u32..1 << pending.len()).map(|taken| {
        let line: Vec<i32> = ahead
            .iter()
            .enumerate()
            .filter(|(i, (_, is_pending))| {
                !is_pending || pending.iter().position(|p| p == i).is_some_and(|bit| taken & (1 << bit) != 0)
            })
            .map(|(_, (q, _))| *q)
            .collect();
        fits_in_line(stock, &line, quantity)
    });
    let first = answers.next().expect("at least one combination");
    answers.all(|answer| answer == first).then_some(first)
}

/// The most pending orders ahead whose every outcome is weighed (2^n combinations).
pub(crate) const MOST_PENDING_WEIGHED: usize = 10;

#[cfg(test)]
mod tests {
    use super::fits_in_line;

    #[test]
    fn with_enough_for_everyone_ahead_an_order_fits() {
        assert!(fits_in_line(10, &[2, 3, 1], 4));
        assert!(!fits_in_line(10, &[2, 3, 1], 5));
    }

    #[test]
    fn an_order_ahead_too_large_for_what_is_left_does_not_hold_back_the_ones_behind_it() {
        // Cut to 3: A(2) takes two, B(3) cannot and is rejected, C(1) takes the last, D(1) loses.
        assert!(fits_in_line(3, &[], 2));
        assert!(!fits_in_line(3, &[2], 3));
        assert!(fits_in_line(3, &[2, 3], 1));
        assert!(!fits_in_line(3, &[2, 3, 1], 1));
    }

    #[test]
    fn an_order_waits_when_a_pending_order_ahead_decides_its_turn_whichever_way_it_goes() {
        use super::fits_whatever_the_pending_do as decide;
        // Cut to 3: P1 (1, pending), A2 (3), then X (2). If P1 takes its unit, A2 is passed
        // over and X fits; if P1 is declined, A2 takes all three and X does not: wait.
        assert_eq!(decide(3, &[(1, true), (3, false)], 2), None);
        // Stock 2: P1 (1, pending), P2 (1, pending), A (2), then X (1). Both pending taking,
        // or neither, leave nothing for X; one of them taking leaves X its unit: wait.
        assert_eq!(decide(2, &[(1, true), (1, true), (2, false)], 1), None);
        // Whatever the pending one does, the answer is the same: decided.
        assert_eq!(decide(3, &[(1, true)], 1), Some(true));
        assert_eq!(decide(1, &[(1, false), (1, true)], 1), Some(false));
        assert_eq!(decide(10, &[(1, true), (2, false)], 3), Some(true));
    }

    #[test]
    fn nothing_left_fits_nothing() {
        assert!(!fits_in_line(0, &[], 1));
        assert!(fits_in_line(0, &[], 0));
    }
}
