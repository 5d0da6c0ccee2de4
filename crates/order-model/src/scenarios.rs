//! What is checked. Each scenario is small — two or three buyers, a few units — because every
//! interleaving of every step is visited, and the defects of this protocol need few actors:
//! both line-order defects need two orders and a cut. What each scenario lets go wrong is its
//! [`Budget`]; together they cover every kind of failure the model has a step for.

use crate::model::{OrderProtocol, Refuses, Rules, Scenario, Sweeps};
use crate::state::{Budget, Card};

/// A cut while orders are in line: three buyers of one unit each, the first to arrive may be
/// any of them, one card declines, two units, then one. The line-order defects live here.
pub fn a_cut_in_the_line() -> Scenario {
    Scenario::new("a cut in the line", vec![(1, Card::Good), (1, Card::Declines), (1, Card::Good)], 2)
        .with_upserts(vec![1])
        .with_budget(Budget { retries: 1, ..Budget::default() })
}

/// The first line-order defect's ground: an order behind one still pending authorization,
/// whose card then declines, and a cut to one unit, then a raise back to two.
pub fn a_cut_behind_a_pending_order() -> Scenario {
    Scenario::new("a cut behind a pending order", vec![(1, Card::Declines), (1, Card::Good)], 2)
        .with_upserts(vec![1, 2])
        .with_budget(Budget { retries: 1, ..Budget::default() })
}

/// The second's: two good cards for two units, and a cut to one at any moment, a later
/// order's reservation included, and a raise to three.
pub fn a_cut_after_a_later_order_was_served() -> Scenario {
    Scenario::new("a cut after a later order was served", vec![(1, Card::Good), (1, Card::Good)], 2)
        .with_upserts(vec![1, 3])
}

/// Stripe failing in every way on every request (twice in a run), an intake, a worker or the
/// sweeper dying once, a buyer retrying once: one good card and one declined, for one unit.
pub fn stripe_failing() -> Scenario {
    Scenario::new("Stripe failing", vec![(1, Card::Good), (1, Card::Declines)], 1).with_budget(Budget {
        faults: 2,
        crashes: 1,
        retries: 1,
        ..Budget::default()
    })
}

/// The queue's worst: duplicates, redeliveries after a worker dies, the DLQ after three
/// receives and a redrive; two workers at once, and a sweeper that resolves only pending
/// orders, so the messages alone must bring every accepted order to its end.
pub fn messages_without_the_sweeper() -> Scenario {
    Scenario::new("messages without the sweeper's help", vec![(1, Card::Good), (1, Card::Good)], 2)
        .with_workers(2)
        .with_sweeper(Sweeps::OnlyPending)
        .with_budget(Budget { faults: 1, crashes: 2, duplicates: 1, redrives: 1, ..Budget::default() })
}

/// One order and time's work on it: a hold past its deadline (the capture fails), Stripe
/// forgetting its saved answers, a process outliving its lease (two at work on one
/// authorization); with Stripe failing once and a process dying once.
pub fn time_passing() -> Scenario {
    Scenario::new("holds, keys and leases expiring", vec![(1, Card::Good)], 1).with_budget(times_work())
}

/// One of each thing time does to an order (a deadline, a key and a lease expiring), with
/// Stripe failing once, a retry and a process dying once: [`time_passing`]'s budget, and
/// [`three_d_secure`]'s with an event lost besides.
fn times_work() -> Budget {
    Budget { faults: 1, crashes: 1, retries: 1, stalls: 1, expiries: 1, key_expiries: 1, ..Budget::default() }
}

/// Orders of different sizes after a cut: an order too large for what is left is passed
/// over, and the smaller ones behind it are served.
pub fn sizes_after_a_cut() -> Scenario {
    Scenario::new("sizes after a cut", vec![(2, Card::Good), (1, Card::Good), (1, Card::Declines)], 4)
        .with_upserts(vec![2])
}

/// 3-D Secure and Stripe's webhooks: a buyer whose card needs 3-D Secure, who authenticates
/// (or fails) at any moment, before the deadline or after it; the deadline passing at any
/// moment; the webhook and the sweeper both settling the order (each under its lease: one
/// reads while the other acts, and once, a process outlives its lease and both act at once);
/// Stripe failing once (a settle's cancel answering 500 included), an event lost, the hold
/// cancelled outside the fleet once authenticated, a process dying once.
pub fn three_d_secure() -> Scenario {
    Scenario::new("3-D Secure: the webhook racing the sweeper", vec![(1, Card::ThreeDSecure)], 1)
        .with_webhooks()
        .with_budget(Budget { lost_events: 1, ..times_work() })
}

/// 3-D Secure beside a good card: the line holds the 3-D Secure order's units and position
/// (pending, for line order) while its buyer is at it; either order's hold may be cancelled
/// outside the fleet (Stripe's Dashboard, or lapsed) while `authorized` (the webhook ends it)
/// or `stock_reserved` (its refused capture does); an event lost; a process dying once.
pub fn holds_cancelled_outside() -> Scenario {
    Scenario::new(
        "3-D Secure in line, holds cancelled outside",
        vec![(1, Card::ThreeDSecure), (1, Card::Good)],
        2,
    )
    .with_webhooks()
    .with_budget(Budget { crashes: 1, expiries: 1, lost_events: 1, ..Budget::default() })
}

/// A hold lapsing after a cut: two buyers of one unit each, two units, a cut to one, so that
/// both orders commit `authorized` and wait for the line; one hold passes the deadline the
/// fleet recorded for it, and Stripe cancels it. No webhooks: the fleet must know from the
/// deadline alone, and the order behind a lapsed one must not be rejected for a unit that then
/// goes to nobody.
pub fn hold_lapsing_after_a_cut() -> Scenario {
    Scenario::new("a hold lapsing after a cut", vec![(1, Card::Good), (1, Card::Good)], 2)
        .with_upserts(vec![1])
        .with_budget(Budget { lapses: 1, ..Budget::default() })
}

/// A create that Stripe is slow to run and confirm: no answer comes; for a while Stripe has
/// made nothing for it, its key only in use, then its intent reads as made but not confirmed;
/// the buyer retries, and the sweeper looks too. A re-send of its key meanwhile answers `409
/// idempotency_key_in_use`, which must be a wait, and a lookup meeting the intent must not
/// decline the order, since the confirm then places a hold. One good card, one unit.
pub fn a_slow_confirm() -> Scenario {
    Scenario::new("a create slow to confirm", vec![(1, Card::Good)], 1).with_budget(Budget {
        slow_confirms: 1,
        retries: 1,
        ..Budget::default()
    })
}

/// The other two ends of a slow confirm: a card needing 3-D Secure, whose confirm ends waiting
/// for its buyer, and a declining card, whose confirm ends declined; two units, Stripe's
/// webhooks on, one create slow to confirm (either buyer's), one retry, the sweeper at any
/// moment. A lookup meeting the 3-D Secure card's intent mid-confirm must not decline it (its
/// buyer never hears `402`), and one meeting the declining card's must leave its order pending
/// only until the confirm ends, then decline it (§8.4: no order left pending).
pub fn a_slow_confirm_of_other_cards() -> Scenario {
    Scenario::new(
        "a create slow to confirm: 3-D Secure, a decline",
        vec![(1, Card::ThreeDSecure), (1, Card::Declines)],
        2,
    )
    .with_webhooks()
    .with_budget(Budget { slow_confirms: 1, retries: 1, ..Budget::default() })
}

/// A herd at two intakes: three buyers of one unit each, one unit; each intake answers
/// `sold_out` from reads of its own (buyers A and C at the first, B at the second), each
/// starting as after its door said sold out; a read that sees units beyond its batch's turns
/// its intake's fast path on (requests straight to the door) until the door says sold out
/// again. The unit comes back while buyers are waiting or told: A's card declines, and the
/// operator may raise the total to two; one buyer may retry once. A `sold_out` must be true at
/// some moment between the request and the answer, and no request passes an earlier one at its
/// intake on its way to the door (§8.7).
pub fn a_herd_at_two_intakes() -> Scenario {
    Scenario::new(
        "a herd at two intakes, units coming back",
        vec![(1, Card::Declines), (1, Card::Good), (1, Card::Good)],
        1,
    )
    .with_intakes(2)
    .with_upserts(vec![2])
    .with_budget(Budget { retries: 1, ..Budget::default() })
}

/// A settle the database refuses for good: two buyers whose cards need 3-D Secure, two units;
/// a trigger refuses A's order the moves `refuses` says (its move to `authorized`, after its
/// buyer authenticated, or every move of its status). Each buyer authenticates, fails or
/// walks away at any moment, each deadline passes at any moment, and the webhook and the
/// sweeper settle either order; Stripe gives up one event (the refused order's, say, which
/// the webhook answered 503). A's hold must be released, A must end or be visible, and B,
/// behind it in the sweeper's passes, must still be settled, or released at its deadline.
pub fn a_settle_the_database_refuses(refuses: Refuses) -> Scenario {
    Scenario::new(
        "3-D Secure: a settle the database refuses",
        vec![(1, Card::ThreeDSecure), (1, Card::ThreeDSecure)],
        2,
    )
    .with_refused(0, refuses)
    .with_webhooks()
    .with_budget(Budget { lost_events: 1, ..Budget::default() })
}

/// The same with the sweeper settling alone (no webhooks) and Stripe failing once: the
/// refused order's cancel may go unanswered, its release then owed to the reconciliation,
/// which makes it whatever the order's status.
pub fn a_settle_the_database_refuses_while_stripe_fails(refuses: Refuses) -> Scenario {
    Scenario::new(
        "3-D Secure: a settle the database refuses, Stripe failing",
        vec![(1, Card::ThreeDSecure), (1, Card::ThreeDSecure)],
        2,
    )
    .with_refused(0, refuses)
    .with_budget(Budget { faults: 1, ..Budget::default() })
}

/// Every scenario, as checked by `make test`.
pub fn all() -> Vec<Scenario> {
    vec![
        a_cut_in_the_line(),
        a_cut_behind_a_pending_order(),
        a_cut_after_a_later_order_was_served(),
        stripe_failing(),
        messages_without_the_sweeper(),
        time_passing(),
        sizes_after_a_cut(),
        three_d_secure(),
        holds_cancelled_outside(),
        hold_lapsing_after_a_cut(),
        a_slow_confirm(),
        a_slow_confirm_of_other_cards(),
        a_herd_at_two_intakes(),
        a_settle_the_database_refuses(Refuses::TheMoveToAuthorized),
        a_settle_the_database_refuses_while_stripe_fails(Refuses::TheMoveToAuthorized),
    ]
}

/// The scenarios under the code's rules.
pub fn models() -> Vec<OrderProtocol> {
    all().into_iter().map(|scenario| OrderProtocol { scenario, rules: Rules::NOW }).collect()
}
