//! A buyer's request at the intake: its send (and retries under the same key), the door that
//! promises the order its units and its place in line or answers sold out, a request that
//! finds its order made already (answered from the row, refused while another holds it, or
//! taking it over), and the answer the buyer gets. Mirrors the fleet's `domain::door` and the
//! intake's `Intake::place` and `Intake::resume` (`crates/order-intake/src/orders.rs`); the
//! authorization a request goes on with is `authorization.rs`'s.

use super::{Action, Done, Next, OrderProtocol, Proc};
use crate::state::*;

impl OrderProtocol {
    /// Each buyer sends (a retry within the budget), or its request takes its next step.
    pub(super) fn buyer_actions(s: &State, actions: &mut Vec<Action>) {
        for (b, buyer) in s.buyers.iter().enumerate() {
            let b = b as Buyer;
            match buyer.request {
                Request::Idle if buyer.sent == 0 || s.budget.retries > 0 => actions.push(Action::Send(b)),
                Request::Idle => {}
                Request::Sent => Self::step_actions(s, Proc::Request(b), None, actions),
                Request::Working(auth) => {
                    Self::step_actions(s, Proc::Request(b), Some(Job::Authorize(b, auth)), actions)
                }
            }
        }
    }

    /// A buyer sends its request (again, within the retry budget), remembering which
    /// buyers had been accepted before it (§8.7's arrival order).
    pub(super) fn send(s: &mut State, b: Buyer) {
        let accepted_before = s
            .buyers
            .iter()
            .enumerate()
            .filter(|(_, buyer)| matches!(buyer.first, Some(Answer::Accepted(_))))
            .fold(0u8, |mask, (i, _)| mask | 1 << i);
        let buyer = &mut s.buyers[usize::from(b)];
        if buyer.sent > 0 {
            s.budget.retries -= 1;
        }
        buyer.sent += 1;
        buyer.request = Request::Sent;
        buyer.accepted_before = accepted_before;
    }

    pub(super) fn request_step(&self, s: &mut State, buyer: Buyer, net: Net) {
        match s.buyers[usize::from(buyer)].request {
            Request::Idle => unreachable!("an idle request takes no step"),
            Request::Sent => self.door(s, buyer),
            Request::Working(auth) => match self.authorize_step(s, buyer, auth, net) {
                Next::Go(auth) => s.buyers[usize::from(buyer)].request = Request::Working(auth),
                Next::End(Done::Later) => Self::answer(s, buyer, Answer::Unavailable),
                Next::End(_) => {
                    let answer = Self::answer_of(s.order(buyer)).expect("a recorded order is past pending");
                    Self::answer(s, buyer, answer);
                }
            },
        }
    }

    /// The intake's first statements: the key (an order already made under it), else the door.
    fn door(&self, s: &mut State, buyer: Buyer) {
        let quantity = self.quantity(buyer);
        if let Some(order) = s.orders[usize::from(buyer)].as_mut() {
            if let Some(answer) = Self::answer_of(order) {
                return Self::answer(s, buyer, answer);
            }
            if order.lease.is_some() {
                return Self::answer(s, buyer, Answer::InUse);
            }
            order.lease = Some(Holder::Request(buyer));
            let resumed = self.resume(order);
            s.buyers[usize::from(buyer)].request = Request::Working(resumed);
            return;
        }
        let p = &mut s.product;
        if p.promised + quantity > p.total {
            // §8.7: sold out only when every unit is promised ahead or sold.
            let held: u8 = s
                .existing()
                .filter(|(_, o)| o.status.holds_a_promise())
                .map(|(id, _)| self.quantity(id))
                .sum();
            if held + quantity <= s.product.total {
                s.seen.sold_out_with_a_unit_left = true;
            }
            return Self::answer(s, buyer, Answer::SoldOut);
        }
        p.promised += quantity;
        p.last_position += 1;
        let position = p.last_position;
        // §8.7: positions follow arrival.
        let before = s.buyers[usize::from(buyer)].accepted_before;
        if s.existing().any(|(id, o)| before & (1 << id) != 0 && o.position >= position) {
            s.seen.position_out_of_arrival = true;
        }
        s.orders[usize::from(buyer)] = Some(Order {
            status: Status::PendingAuthorization,
            position,
            attempt: 1,
            intent: None,
            lease: Some(Holder::Request(buyer)),
            released: false,
            dated: 0,
            attempt_failed: false,
            old: false,
            action: false,
            past_deadline: false,
            lapsed: false,
            stuck: false,
            outbox: OutboxRow::None,
            reserved_at_commit: None,
            accepted: false,
            took: false,
            rejection: None,
        });
        s.buyers[usize::from(buyer)].request = Request::Working(Auth::Create { attempt: 1, resumed: None });
    }

    /// The answer an order's row gives a request that finds it past pending.
    fn answer_of(order: &Order) -> Option<Answer> {
        if order.action {
            // `requires_action`, with what the buyer's page needed, whatever became of it.
            return Some(Answer::ActionRequired(order.position));
        }
        match order.status {
            Status::PendingAuthorization | Status::RequiresAction => None,
            Status::PaymentDeclined => Some(Answer::Declined),
            _ => Some(Answer::Accepted(order.position)),
        }
    }

    fn answer(s: &mut State, buyer: Buyer, answer: Answer) {
        let b = &mut s.buyers[usize::from(buyer)];
        b.request = Request::Idle;
        b.answer = Some(answer);
        // After a first `202` or `402`, every answer but a dropped connection is that one again.
        match b.first {
            Some(first) if first != answer && answer != Answer::Dropped => s.seen.answer_changed = true,
            None if matches!(answer, Answer::Accepted(_) | Answer::Declined) => b.first = Some(answer),
            _ => {}
        }
    }
}
