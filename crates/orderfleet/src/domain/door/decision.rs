//! The door's decision, pure: from what a statement saw to what the buyer is told, or the
//! statement to run next. [`super::admit`] runs the statements; everything it decides is here,
//! and tested as a table.
//!
//! A request makes at most two passes through a door, and a look after each door that closed
//! for a reason its snapshot could not see:
//!
//! | the door's statement saw | next |
//! |---|---|
//! | the key used | tell: the key's order |
//! | no such product | tell: `unknown_product` |
//! | the product paused | tell: `sale_paused`, in a few seconds |
//! | the pre-queue open, no entry made | a capped product's first pass: the capped door; else tell: `not_open`, in a second |
//! | the product not open | tell: `not_open`, with the seconds until its pre-queue or its sale opens |
//! | fewer units left than asked | tell: `sold_out`, with whether units may come back |
//! | on the first pass, a product with a cap per buyer | the capped door |
//! | the units there, but taken while it waited for the row; the card gate closed | look again |
//!
//! | the look again saw | next |
//! |---|---|
//! | a twin's order under the key | tell: the key's order |
//! | the product paused (a pause that committed while the door waited for its row) | tell: `sale_paused` |
//! | the card gate closed | tell: card testing, after the wait it says |
//! | no such product; fewer units left than asked | tell: `unknown_product`; `sold_out` |
//! | on the first pass, a cap per buyer; none | the capped door; the door again |
//! | on the second pass, the units there | tell: behind the card gate, after an uncapped door, come back in a moment (the buyer's other orders are being decided); else `sold_out`, the units may come back (they changed hands twice under this request) |
//!
//! The capped door, one transaction under a lock of the buyer's own, tells a twin's order or
//! `purchase_limit_reached` before its door's statement when it can ([`capped`]).

use std::time::Duration;

use super::Refusal;

/// What the door's statement saw, from its one snapshot, when it admitted nobody.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct DoorSaw {
    /// An order under this buyer's key exists.
    pub key_used: bool,
    /// The units not yet promised; `None`: no such product.
    pub units_left: Option<i32>,
    /// The product's cap per buyer.
    pub max_per_buyer: Option<i32>,
    /// Whether an order holding units of the product may still give them back (read only when
    /// the units did not fit).
    pub units_may_return: Option<bool>,
    /// The product is not open: the seconds until its pre-queue or its sale opens (0: its
    /// opening is due, and being made).
    pub opens_in: Option<f64>,
    /// Its pre-queue is open: the door takes queue entries, not promises.
    pub queueing: bool,
    /// An operator paused its sale: no promise, no queue entry.
    pub paused: bool,
}

/// What the look after a closed door saw, afresh: a twin's order, the buyer's card gate, and
/// the product as it is now.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub(super) struct LookAgain {
    /// An order under this buyer's key exists (a twin request's, made meanwhile).
    pub twin: bool,
    /// The buyer's card attempts, counted only with a card-testing limit.
    pub attempts: Option<i64>,
    /// The buyer's declines of the last hour.
    pub declines: i64,
    /// When the decline that keeps the gate closed is an hour old, in seconds.
    pub ages_out_in: Option<f64>,
    /// The units not yet promised; `None`: no such product.
    pub units_left: Option<i32>,
    /// The product's cap per buyer.
    pub max_per_buyer: Option<i32>,
    /// Whether an order holding units of the product may still give them back.
    pub units_may_return: bool,
    /// An operator paused the product: a pause that committed while the door's statement
    /// waited for the product row shows here, not in the statement's snapshot.
    pub paused: bool,
}

/// A door a pass goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Door {
    /// The door's one statement, for products without a cap per buyer, behind the card gate.
    Uncapped,
    /// The capped door's transaction, for a product with this cap per buyer.
    Capped(i32),
}

/// Which pass a request is on: the first, or the second, through this door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    First,
    Second(Door),
}

/// What the buyer is told, before the order a used key made is read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Told {
    /// The key's order: an earlier request's, or a twin's a moment ago.
    KeyUsed,
    /// Nothing was written, for this reason.
    Refused(Refusal),
}

/// What a request does, decided: answer, or pass a door again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Decided {
    /// Its answer.
    Tell(Told),
    /// A second pass, through this door.
    Through(Door),
}

/// What a request does after a door's statement: decided, or a look first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Next {
    /// Decided from what the statement saw.
    Decided(Decided),
    /// A look again ([`LookAgain`]): the door closed for a reason its snapshot did not show.
    /// What follows a look is always decided ([`after_look`]).
    LookAgain,
}

/// After a door's statement that admitted nobody, on `pass`, for `quantity` units.
pub(super) fn after_door(saw: DoorSaw, quantity: i32, pass: Pass) -> Next {
    match (saw.key_used, saw.units_left, saw.max_per_buyer) {
        (true, _, _) => Next::Decided(Decided::Tell(Told::KeyUsed)),
        (false, None, _) => Next::Decided(Decided::Tell(Told::Refused(Refusal::UnknownProduct))),
        (false, Some(_), _) if saw.paused => {
            Next::Decided(Decided::Tell(Told::Refused(Refusal::SalePaused(super::PAUSED_RETRY))))
        }
        (false, Some(_), cap) if saw.queueing => match (cap, pass) {
            // A capped product's queue entry is the capped door's, under the buyer's lock.
            (Some(cap), Pass::First) => Next::Decided(Decided::Through(Door::Capped(cap))),
            // Not entered, with no reason the snapshot shows: the window closed as it ran (the
            // opening is being made); come back in a moment.
            _ => Next::Decided(Decided::Tell(Told::Refused(Refusal::NotOpen(Duration::from_secs(1))))),
        },
        (false, Some(_), _) if saw.opens_in.is_some() => {
            let opens_in = saw.opens_in.unwrap_or_default().max(0.0);
            let wait = Duration::from_secs_f64(opens_in).max(Duration::from_secs(1));
            Next::Decided(Decided::Tell(Told::Refused(Refusal::NotOpen(wait))))
        }
        (false, Some(left), _) if left < quantity => {
            let units_may_return = saw.units_may_return.unwrap_or(true);
            Next::Decided(Decided::Tell(Told::Refused(Refusal::SoldOut { units_may_return })))
        }
        (false, Some(_), Some(cap)) if pass == Pass::First => {
            Next::Decided(Decided::Through(Door::Capped(cap)))
        }
        (false, Some(_), _) => Next::LookAgain,
    }
}

/// After a look again, on `pass`, for `quantity` units, with the card-testing limit `gate`.
/// A twin's order comes first: it is what the gate counted or what took the units, and this
/// request answers from it, never `sold_out`.
pub(super) fn after_look(saw: &LookAgain, quantity: i32, gate: u32, pass: Pass) -> Decided {
    if let Some(told) = before_the_units(saw, gate) {
        return Decided::Tell(told);
    }
    match (saw.units_left, saw.max_per_buyer, pass) {
        (None, _, _) => Decided::Tell(Told::Refused(Refusal::UnknownProduct)),
        (Some(left), _, _) if left < quantity => {
            Decided::Tell(Told::Refused(Refusal::SoldOut { units_may_return: saw.units_may_return }))
        }
        (Some(_), Some(cap), Pass::First) => Decided::Through(Door::Capped(cap)),
        (Some(_), None, Pass::First) => Decided::Through(Door::Uncapped),
        // No third pass. Behind the card gate, an uncapped door closed twice while units are
        // left: the buyer's other orders are being decided right now, so never `sold_out`:
        // come back in a moment. Otherwise the units changed hands twice under this request:
        // sold out, and they may come back.
        (Some(_), _, Pass::Second(Door::Uncapped)) if gate > 0 => {
            Decided::Tell(Told::Refused(Refusal::CardTesting(Duration::from_secs(2))))
        }
        (Some(_), _, Pass::Second(_)) => {
            Decided::Tell(Told::Refused(Refusal::SoldOut { units_may_return: true }))
        }
    }
}

/// The answer that does not depend on the units: a twin's order (what the gate counted or what
/// took the units), a pause, or the card gate closed.
pub(super) fn before_the_units(saw: &LookAgain, gate: u32) -> Option<Told> {
    if saw.twin {
        return Some(Told::KeyUsed);
    }
    if saw.paused {
        return Some(Told::Refused(Refusal::SalePaused(super::PAUSED_RETRY)));
    }
    gate_wait(saw, gate).map(|wait| Told::Refused(Refusal::CardTesting(wait)))
}

/// How long until the buyer may try a card again, when the card-testing limit (`gate`) closes
/// the door: when the oldest counted decline is an hour old, or, while orders of theirs are
/// still being authorized, a moment (they end in a second or two).
pub(super) fn gate_wait(saw: &LookAgain, gate: u32) -> Option<Duration> {
    let limit = i64::from(gate);
    let attempts = saw.attempts?;
    if attempts < limit {
        return None;
    }
    Some(match saw.ages_out_in {
        Some(seconds) if saw.declines >= limit => Duration::from_secs_f64(seconds.max(1.0)),
        _ => Duration::from_secs(2),
    })
}

/// The capped door's answer before its door's statement, from the units the buyer's orders of
/// the product hold (`held`, counted under the buyer's lock) and whether a twin's order exists:
/// `None` lets the order through to the statement.
pub(super) fn capped(twin: bool, held: i64, quantity: i32, cap: i32) -> Option<Told> {
    if twin {
        return Some(Told::KeyUsed);
    }
    (held + i64::from(quantity) > i64::from(cap)).then_some(Told::Refused(Refusal::OverLimit))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOLD_OUT: Decided = Decided::Tell(Told::Refused(Refusal::SoldOut { units_may_return: true }));
    const SOLD_FOR_GOOD: Decided = Decided::Tell(Told::Refused(Refusal::SoldOut { units_may_return: false }));
    const UNKNOWN: Decided = Decided::Tell(Told::Refused(Refusal::UnknownProduct));
    const A_MOMENT: Decided = Decided::Tell(Told::Refused(Refusal::CardTesting(Duration::from_secs(2))));

    fn door(key_used: bool, units_left: Option<i32>, cap: Option<i32>, may_return: Option<bool>) -> DoorSaw {
        DoorSaw {
            key_used,
            units_left,
            max_per_buyer: cap,
            units_may_return: may_return,
            ..DoorSaw::default()
        }
    }

    fn look(units_left: Option<i32>, cap: Option<i32>) -> LookAgain {
        LookAgain { units_left, max_per_buyer: cap, units_may_return: true, ..LookAgain::default() }
    }

    #[test]
    fn after_the_door_s_statement() {
        let second = Pass::Second(Door::Uncapped);
        let rows = [
            (
                "the key used",
                door(true, Some(0), None, None),
                Pass::First,
                Next::Decided(Decided::Tell(Told::KeyUsed)),
            ),
            ("no such product", door(false, None, None, None), Pass::First, Next::Decided(UNKNOWN)),
            (
                "too few, some may come back",
                door(false, Some(1), None, Some(true)),
                Pass::First,
                Next::Decided(SOLD_OUT),
            ),
            (
                "too few, every unit sold",
                door(false, Some(1), None, Some(false)),
                Pass::First,
                Next::Decided(SOLD_FOR_GOOD),
            ),
            ("too few, not asked", door(false, Some(0), None, None), Pass::First, Next::Decided(SOLD_OUT)),
            (
                "a cap, first pass",
                door(false, Some(5), Some(3), None),
                Pass::First,
                Next::Decided(Decided::Through(Door::Capped(3))),
            ),
            ("a cap, second pass", door(false, Some(5), Some(3), None), second, Next::LookAgain),
            ("units there, taken meanwhile", door(false, Some(5), None, None), Pass::First, Next::LookAgain),
            ("taken again", door(false, Some(5), None, None), second, Next::LookAgain),
        ];
        for (case, saw, pass, next) in rows {
            assert_eq!(after_door(saw, 2, pass), next, "{case}");
        }
    }

    #[test]
    fn after_the_door_s_statement_before_the_opening() {
        let rows = [
            (
                "not open, 90.2 s to go",
                DoorSaw { opens_in: Some(90.2), ..door(false, Some(5), None, None) },
                Pass::First,
                Next::Decided(Decided::Tell(Told::Refused(Refusal::NotOpen(Duration::from_secs_f64(90.2))))),
            ),
            (
                "the opening due, being made",
                DoorSaw { opens_in: Some(0.0), ..door(false, Some(5), None, None) },
                Pass::First,
                Next::Decided(Decided::Tell(Told::Refused(Refusal::NotOpen(Duration::from_secs(1))))),
            ),
            (
                "not open, the key used",
                DoorSaw { opens_in: Some(90.0), ..door(true, Some(5), None, None) },
                Pass::First,
                Next::Decided(Decided::Tell(Told::KeyUsed)),
            ),
            (
                "the pre-queue open, a capped product",
                DoorSaw { queueing: true, ..door(false, Some(0), Some(2), None) },
                Pass::First,
                Next::Decided(Decided::Through(Door::Capped(2))),
            ),
            (
                "the pre-queue open, not entered",
                DoorSaw { queueing: true, ..door(false, Some(0), None, None) },
                Pass::First,
                Next::Decided(Decided::Tell(Told::Refused(Refusal::NotOpen(Duration::from_secs(1))))),
            ),
        ];
        for (case, saw, pass, next) in rows {
            assert_eq!(after_door(saw, 2, pass), next, "{case}");
        }
    }

    #[test]
    fn after_a_look_again() {
        let twin = LookAgain { twin: true, attempts: Some(9), units_left: Some(0), ..LookAgain::default() };
        let gated =
            LookAgain { attempts: Some(3), declines: 3, ages_out_in: Some(1_200.4), ..look(Some(5), None) };
        let uncapped = Pass::Second(Door::Uncapped);
        let capped = Pass::Second(Door::Capped(3));
        let paused = LookAgain { paused: true, attempts: Some(9), ..look(Some(5), Some(2)) };
        let rows: [(&str, LookAgain, u32, Pass, Decided); 11] = [
            (
                "a pause that committed while the door waited, before the gate and the units",
                paused,
                3,
                capped,
                Decided::Tell(Told::Refused(Refusal::SalePaused(crate::domain::door::PAUSED_RETRY))),
            ),
            (
                "a twin's order before the gate and the units",
                twin,
                3,
                Pass::First,
                Decided::Tell(Told::KeyUsed),
            ),
            (
                "the gate closed by declines",
                gated,
                3,
                Pass::First,
                Decided::Tell(Told::Refused(Refusal::CardTesting(Duration::from_secs_f64(1_200.4)))),
            ),
            ("no such product", look(None, None), 0, Pass::First, UNKNOWN),
            ("too few", look(Some(1), None), 0, Pass::First, SOLD_OUT),
            ("a cap, first pass", look(Some(5), Some(2)), 0, Pass::First, Decided::Through(Door::Capped(2))),
            ("no cap, first pass", look(Some(5), None), 0, Pass::First, Decided::Through(Door::Uncapped)),
            ("second uncapped pass behind the gate", look(Some(5), None), 3, uncapped, A_MOMENT),
            ("second uncapped pass, no gate", look(Some(5), None), 0, uncapped, SOLD_OUT),
            ("second capped pass behind the gate", look(Some(5), Some(3)), 3, capped, SOLD_OUT),
            ("second capped pass", look(Some(5), Some(3)), 0, capped, SOLD_OUT),
        ];
        for (case, saw, gate, pass, next) in rows {
            assert_eq!(after_look(&saw, 2, gate, pass), next, "{case}");
        }
    }

    #[test]
    fn a_closed_gate_waits_for_the_oldest_counted_decline_or_a_moment_while_orders_are_decided() {
        let open = look(Some(5), None);
        let deciding =
            LookAgain { attempts: Some(3), declines: 1, ages_out_in: Some(1_200.0), ..open.clone() };
        assert_eq!(gate_wait(&deciding, 3), Some(Duration::from_secs(2)));
        let almost_aged =
            LookAgain { attempts: Some(3), declines: 3, ages_out_in: Some(0.2), ..open.clone() };
        assert_eq!(gate_wait(&almost_aged, 3), Some(Duration::from_secs(1)));
        assert_eq!(gate_wait(&LookAgain { attempts: Some(2), ..open.clone() }, 3), None);
        assert_eq!(gate_wait(&LookAgain { attempts: None, declines: 9, ..open }, 0), None);
    }

    #[test]
    fn the_capped_door_tells_a_twin_s_order_then_the_cap() {
        assert_eq!(capped(true, 9, 1, 2), Some(Told::KeyUsed));
        assert_eq!(capped(false, 1, 2, 2), Some(Told::Refused(Refusal::OverLimit)));
        assert_eq!(capped(false, 0, 2, 2), None, "exactly at the cap");
    }
}
