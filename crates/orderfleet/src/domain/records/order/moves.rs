//! Every move an order can make: SPEC §5's arrows, each a named constructor of a
//! [`Transition`], so what can happen to an order is read in this one file.
//!
//! Each constructor fixes the move's `from` and `to` and what the move always records with it
//! (the hold, the buyer's reason, the outbox messages, units given back). The caller adds only
//! what comes from outside: the webhook event that caused it. [`Move`] names the arrows,
//! and a test holds the list equal to §5's, read from `docs/spec.md`.
//!
//! Two arrows are made by statements of their own, because they do more than move one row:
//! `authorized` → `stock_reserved` and `authorized` → `rejected_out_of_stock` take or refuse
//! units in line order (`steps/fulfilment/reserve.sql`), and the decline of a pending order
//! records Stripe's words and the intent it declined on (`steps/authorization/record.rs`'s
//! `fail`). They are named in [`Move`] all the same.

use crate::domain::records::outbox::{EventType, OrderNotification};
use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_words::OrderId;
use orderfleet_words::hold::{BuyerAction, Hold};

use super::{Order, Transition};

/// SPEC §5's arrows, by what happens to the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// `pending_authorization` → `authorized`: Stripe holds the amount.
    Authorize,
    /// `pending_authorization` → `requires_action`: the card needs 3-D Secure.
    AskForAction,
    /// `requires_action` → `authorized`: the buyer authenticated.
    Authenticate,
    /// `pending_authorization` → `payment_declined`: the card declined.
    Decline,
    /// `requires_action` → `payment_declined`: authentication failed, timed out, or the intent
    /// was cancelled outside the fleet.
    FailAuthentication,
    /// `authorized` → `stock_reserved`: its units taken from the stock, in line.
    Reserve,
    /// `authorized` → `rejected_out_of_stock`: no stock for it.
    RejectOutOfStock,
    /// `authorized` → `authorization_canceled`: the hold lapsed or was cancelled first.
    LoseHoldBeforeReserve,
    /// `stock_reserved` → `paid`: captured.
    Capture,
    /// `stock_reserved` → `capture_failed`: Stripe refused the capture.
    FailCapture,
    /// `stock_reserved` → `authorization_canceled`: the hold lapsed or was cancelled first.
    LoseHoldBeforeCapture,
    /// `paid` → `refunded`: refunded in full outside the fleet.
    Refund,
    /// `queued` → `pending_authorization`: promised its units, in line order, at the opening
    /// or when a unit came back. Made by the database (`promote_queued`, in the transaction
    /// that opens the product or frees the units), never by a [`Transition`].
    Promise,
    /// `queued` → `sold_out`: no unit left for it, and none can come back. Made by the
    /// database (`promote_queued`), as [`Move::Promise`] is.
    SellOut,
}

impl Move {
    /// Every move, in SPEC §5's order.
    pub const ALL: [Move; 14] = [
        Move::Authorize,
        Move::Reserve,
        Move::Capture,
        Move::AskForAction,
        Move::Authenticate,
        Move::RejectOutOfStock,
        Move::Decline,
        Move::FailAuthentication,
        Move::FailCapture,
        Move::LoseHoldBeforeReserve,
        Move::LoseHoldBeforeCapture,
        Move::Refund,
        Move::Promise,
        Move::SellOut,
    ];

    /// The arrow: the status it leaves and the one it reaches.
    pub const fn arrow(self) -> (OrderStatus, OrderStatus) {
        use OrderStatus::*;
        match self {
            Move::Authorize => (PendingAuthorization, Authorized),
            Move::AskForAction => (PendingAuthorization, RequiresAction),
            Move::Authenticate => (RequiresAction, Authorized),
            Move::Decline => (PendingAuthorization, PaymentDeclined),
            Move::FailAuthentication => (RequiresAction, PaymentDeclined),
            Move::Reserve => (Authorized, StockReserved),
            Move::RejectOutOfStock => (Authorized, RejectedOutOfStock),
            Move::LoseHoldBeforeReserve => (Authorized, AuthorizationCanceled),
            Move::Capture => (StockReserved, Paid),
            Move::FailCapture => (StockReserved, CaptureFailed),
            Move::LoseHoldBeforeCapture => (StockReserved, AuthorizationCanceled),
            Move::Refund => (Paid, Refunded),
            Move::Promise => (Queued, PendingAuthorization),
            Move::SellOut => (Queued, SoldOut),
        }
    }

    /// The move from `from` to `to`, if SPEC §5 has that arrow.
    pub fn between(from: OrderStatus, to: OrderStatus) -> Option<Move> {
        Move::ALL.into_iter().find(|m| m.arrow() == (from, to))
    }

    /// The move that ends an order in `from` failed, its units back for the next buyer: the
    /// arrow of a decline from a pending order, of a cancelled hold from one authorized (never
    /// `rejected_out_of_stock`: that says the units ran out before its turn), of a refused
    /// capture from one reserved. `None` where the order holds no units.
    pub const fn failing(from: OrderStatus) -> Option<Move> {
        match from {
            OrderStatus::PendingAuthorization => Some(Move::Decline),
            OrderStatus::RequiresAction => Some(Move::FailAuthentication),
            OrderStatus::Authorized => Some(Move::LoseHoldBeforeReserve),
            OrderStatus::StockReserved => Some(Move::FailCapture),
            _ => None,
        }
    }

    fn of<'a>(self, order_id: OrderId) -> Transition<'a> {
        let (from, to) = self.arrow();
        Transition::new(order_id, from, to)
    }
}

impl<'a> Transition<'a> {
    /// A move of `order_id` from `from` to `to` with nothing else recorded, yet.
    fn new(order_id: OrderId, from: OrderStatus, to: OrderStatus) -> Self {
        Self {
            order_id,
            from,
            to,
            failure_reason: None,
            hold: None,
            messages: Vec::new(),
            action: None,
            gives_units_back: false,
            detail: None,
            event: None,
            hold_released: false,
        }
    }

    /// [`Move::Authorize`] (or [`Move::Authenticate`] from `requires_action`): the hold
    /// recorded, `order.stock_check_requested` and `order.accepted` sent.
    pub fn authorized(order: &Order, from: OrderStatus, hold: Hold<'a>) -> Self {
        let step = match from {
            OrderStatus::RequiresAction => Move::Authenticate,
            _ => Move::Authorize,
        };
        let accepted = OrderNotification::of(order, OrderStatus::Authorized, None);
        step.of(order.id)
            .with_hold(hold)
            .with_message(EventType::StockCheckRequested, &accepted)
            .with_message(EventType::OrderAccepted, &accepted)
    }

    /// [`Move::AskForAction`]: the hold and what the buyer's page needs, until its deadline. No
    /// message: nothing is accepted yet.
    /// An order promoted from a pre-queue was authorized without its buyer, who learns of the
    /// 3-D Secure it needs from `order.action_required`; any other buyer had it in the `202`.
    pub fn asks_for_action(order: &Order, hold: Hold<'a>, action: BuyerAction<'a>) -> Self {
        let asked = Move::AskForAction.of(order.id).with_hold(hold).with_action(action);
        match order.queued_for {
            Some(_) => {
                let required = OrderNotification::of(order, OrderStatus::RequiresAction, None);
                asked.with_message(EventType::OrderActionRequired, &required)
            }
            None => asked,
        }
    }

    /// [`Move::FailAuthentication`] with `reason` (`authentication_failed`,
    /// `authentication_timed_out`, `payment_canceled`): the units back, `order.rejected`.
    pub fn authentication_failed(order: &Order, reason: FailureReason) -> Self {
        Move::FailAuthentication.of(order.id).failed(order, reason, reason.as_str())
    }

    /// [`Move::FailAuthentication`] with `reason` and `detail` for operators: the card the
    /// buyer's page confirmed with is over the product's cap per card, or Stripe will not show
    /// it (`card_limit_reached`, `payment_declined`).
    pub fn card_refused_after_action(order: &Order, reason: FailureReason, detail: &'a str) -> Self {
        Move::FailAuthentication.of(order.id).failed(order, reason, detail)
    }

    /// [`Move::Capture`]: `order.paid`, whose notification (`paid`) the caller has from the
    /// order or from the stock-check message.
    pub fn captured(order_id: OrderId, paid: OrderNotification) -> Self {
        Move::Capture.of(order_id).with_message(EventType::OrderPaid, paid)
    }

    /// [`Move::FailCapture`]: Stripe's `detail` for operators, the units back to the stock and
    /// the door, `order.rejected`.
    pub fn capture_failed(order: &Order, detail: &'a str) -> Self {
        Move::FailCapture.of(order.id).failed(order, FailureReason::CaptureFailed, detail)
    }

    /// [`Move::LoseHoldBeforeReserve`] or [`Move::LoseHoldBeforeCapture`], from `from`: the
    /// hold is gone (it lapsed, or was cancelled outside the fleet), the units back,
    /// `order.rejected`.
    pub fn hold_lost(order: &Order, from: OrderStatus, detail: &'a str) -> Option<Self> {
        let step = match from {
            OrderStatus::Authorized => Move::LoseHoldBeforeReserve,
            OrderStatus::StockReserved => Move::LoseHoldBeforeCapture,
            _ => return None,
        };
        Some(
            step.of(order.id)
                .failed(order, FailureReason::AuthorizationCanceled, detail)
                .with_hold_released(),
        )
    }

    /// [`Move::LoseHoldBeforeReserve`] for a hold past the deadline Stripe gave for it: the
    /// units back, `order.rejected`; the hold is released after, under the order's key.
    pub fn lapsed(order: &Order, detail: &'a str) -> Self {
        Move::LoseHoldBeforeReserve.of(order.id).failed(order, FailureReason::AuthorizationCanceled, detail)
    }

    /// [`Move::Refund`]: `order.refunded`.
    pub fn refunded(order: &Order) -> Self {
        let refunded = OrderNotification::of(order, OrderStatus::Refunded, None);
        Move::Refund.of(order.id).with_message(EventType::OrderRefunded, &refunded)
    }

    /// The move [`Move::failing`] names for an order in `from` whose move the database refused:
    /// `order_refused`, the database's `words` for operators, the units back, and
    /// `order.rejected` for a buyer who was told to wait (an order past `pending_authorization`).
    pub fn refused(order: &Order, from: OrderStatus, words: &'a str) -> Option<Self> {
        let step = Move::failing(from)?;
        let (_, to) = step.arrow();
        let reason = FailureReason::OrderRefused;
        let moved = step.of(order.id).with_reason(reason).giving_units_back(words);
        Some(match from {
            OrderStatus::PendingAuthorization => moved,
            _ => moved.with_message(EventType::OrderRejected, OrderNotification::of(order, to, Some(reason))),
        })
    }

    /// An order ended failed with `reason`: the units back, `detail` for operators,
    /// `order.rejected`.
    fn failed(self, order: &Order, reason: FailureReason, detail: &'a str) -> Self {
        let rejected = OrderNotification::of(order, self.to, Some(reason));
        self.with_reason(reason).with_message(EventType::OrderRejected, &rejected).giving_units_back(detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §5's arrows, read from the contract: each `a` → `b` in the section's first
    /// paragraph, a chain `a` → `b` → `c` giving two, `a` or `b` → `c` two.
    fn spec_arrows() -> Vec<(String, String)> {
        let spec = include_str!("../../../../../../docs/spec.md");
        let section = spec.split("## 5. Order statuses").nth(1).expect("SPEC §5");
        let arrows = section.split("\nTerminal:").next().expect("§5's arrows");
        // Parenthesised remarks name statuses that are not arrows.
        let mut plain = String::new();
        let mut depth = 0_i32;
        for c in arrows.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for clause in plain.split(';') {
            let steps: Vec<Vec<String>> = clause
                .split('→')
                .map(|part| part.split('`').skip(1).step_by(2).map(str::to_owned).collect())
                .collect();
            for pair in steps.windows(2) {
                let (sources, targets) = (&pair[0], &pair[1]);
                let to = targets.first().expect("a status after every arrow");
                for from in sources {
                    found.push((from.clone(), to.clone()));
                }
            }
        }
        found
    }

    #[test]
    fn the_moves_are_the_arrows_of_spec_section_5() {
        let mut spec = spec_arrows();
        let mut here: Vec<_> = Move::ALL
            .iter()
            .map(|m| {
                let (from, to) = m.arrow();
                (from.as_str().to_owned(), to.as_str().to_owned())
            })
            .collect();
        spec.sort();
        here.sort();
        assert_eq!(here, spec);
    }

    #[test]
    fn every_failing_move_ends_the_order_failed() {
        use crate::domain::words::status::StatusSet;
        for from in [
            OrderStatus::PendingAuthorization,
            OrderStatus::RequiresAction,
            OrderStatus::Authorized,
            OrderStatus::StockReserved,
        ] {
            let (left, to) = Move::failing(from).expect("an order holding units can fail").arrow();
            assert_eq!(left, from);
            assert_eq!(to.set(), StatusSet::Failed, "{from} → {to}");
        }
        assert_eq!(Move::failing(OrderStatus::Paid), None, "a sold unit is never given back");
        assert_eq!(Move::failing(OrderStatus::PaymentDeclined), None);
    }
}
