//! A buyer's request at the intake: its send (and retries under the same key), the door that
//! promises the order its units and its place in line or answers sold out, a request that
//! finds its order made already (answered from the row, refused while another holds it, or
//! taking it over), and the answer the buyer gets. Mirrors the fleet's `domain::door` and the
//! intake's `Intake::place` and `Intake::resume` (`crates/order-intake/src/orders.rs`); the
//! authorization a request goes on with is `authorization.rs`'s.

use super::{Action, Done, FastPathRule, Next, OrderProtocol, Proc, SoldOutRule};
use crate::state::*;

impl OrderProtocol {
    /// Each buyer sends (a retry within the budget), or its request takes its next step.
    pub(super) fn buyer_actions(s: &State, actions: &mut Vec<Action>) {
        for (b, buyer) in s.buyers.iter().enumerate() {
            let b = b as Buyer;
            match buyer.request {
                Request::Idle if buyer.sent == 0 || s.budget.retries > 0 => actions.push(Action::Send(b)),
                Request::Idle | Request::Waiting => {}
                Request::Sent => Self::step_actions(s, Proc::Request(b), None, actions),
                Request::Working(auth) => {
                    Self::step_actions(s, Proc::Request(b), Some(Job::Authorize(b, auth)), actions)
                }
            }
        }
    }

    /// A buyer sends its request (again, within the retry budget), remembering which
    /// buyers had been accepted before it (§8.7's arrival order). At an intake that reads the
    /// product, it goes to the door on the fast path, or waits for a read (or, under
    /// [`SoldOutRule::LastRead`], is answered `sold_out` from the last one).
    pub(super) fn send(&self, s: &mut State, b: Buyer) {
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
        if !s.reads.is_empty() {
            self.arrive(s, b);
        }
    }

    pub(super) fn request_step(&self, s: &mut State, buyer: Buyer, net: Net) {
        match s.buyers[usize::from(buyer)].request {
            Request::Idle | Request::Waiting => unreachable!("an idle or waiting request takes no step"),
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
        if s.product.promised + quantity > s.product.total {
            // §8.7: sold out only when every unit is promised ahead or sold.
            if !self.sold_out_for(s, buyer) {
                s.seen.sold_out_with_a_unit_left = true;
            }
            // The intake's next requests wait for reads (`SoldOutReads::door_closed`).
            if !s.reads.is_empty() {
                s.reads[usize::from(self.intake_of(buyer))].fast = false;
            }
            return Self::answer(s, buyer, Answer::SoldOut);
        }
        let p = &mut s.product;
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
            refused: false,
            release_owed: false,
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

impl OrderProtocol {
    /// Whether, as things are, every unit is promised to orders holding them, so that none is
    /// left for `buyer` (§8.7's truth, from the orders themselves, not from the counter the
    /// fleet keeps).
    fn sold_out_for(&self, s: &State, buyer: Buyer) -> bool {
        let held: u8 =
            s.existing().filter(|(_, o)| o.status.holds_a_promise()).map(|(id, _)| self.quantity(id)).sum();
        held + self.quantity(buyer) > s.product.total
    }

    /// The intake a buyer sends to.
    fn intake_of(&self, buyer: Buyer) -> u8 {
        buyer % self.scenario.intakes
    }

    /// A request arrives at an intake that reads the product (`SoldOutReads::arrive`):
    /// straight to the door while the intake's fast path is on; otherwise it waits for a read
    /// that starts after now (which sends a retry whose key made an order to the door, to be
    /// answered from the order), behind every request waiting there, or, under
    /// [`SoldOutRule::LastRead`], is answered `sold_out` from the last read ended.
    fn arrive(&self, s: &mut State, buyer: Buyer) {
        let sold_out = self.sold_out_for(s, buyer);
        let b = &mut s.buyers[usize::from(buyer)];
        b.sold_out_since_sent = sold_out;
        b.request = Request::Waiting;
        let intake = self.intake_of(buyer);
        let reads = s.reads[usize::from(intake)];
        if reads.fast {
            // Every request waiting there arrived before this one.
            let earlier = self.waiting_at(s, intake) & !(1 << buyer);
            return self.to_the_door(s, buyer, earlier);
        }
        if let (SoldOutRule::LastRead, Some(units_left)) = (self.rules.sold_out, reads.last)
            && units_left < self.quantity(buyer)
        {
            Self::sold_out_from_a_read(s, buyer);
        }
    }

    /// A request goes to the door from its intake; `earlier`: the requests (one bit each) that
    /// arrived at the same intake before it. One of those still waiting for a read, asking no
    /// more units than it, is passed (§8.7's line inside one intake); one asking more may be
    /// passed by the units left, as the stock worker's line passes an order too large.
    fn to_the_door(&self, s: &mut State, buyer: Buyer, earlier: u8) {
        let quantity = self.quantity(buyer);
        let passed = (0..s.buyers.len() as u8).any(|e| {
            earlier & 1 << e != 0
                && s.buyers[usize::from(e)].request == Request::Waiting
                && self.quantity(e) <= quantity
        });
        if passed {
            s.seen.passed_in_line = true;
        }
        s.buyers[usize::from(buyer)].request = Request::Sent;
    }

    /// Each intake with requests waiting and no read in flight may begin one; each read in
    /// flight may end.
    pub(super) fn read_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, reads) in s.reads.iter().enumerate() {
            let intake = i as u8;
            if reads.in_flight.is_some() {
                actions.push(Action::ReadEnds(intake));
            } else if self.waiting_at(s, intake) != 0 {
                actions.push(Action::ReadStarts(intake));
            }
        }
    }

    /// The requests waiting at `intake`, one bit each.
    fn waiting_at(&self, s: &State, intake: u8) -> u8 {
        s.buyers
            .iter()
            .enumerate()
            .filter(|(b, buyer)| buyer.request == Request::Waiting && self.intake_of(*b as Buyer) == intake)
            .fold(0, |mask, (b, _)| mask | 1 << b)
    }

    /// An intake's read begins: ONE statement's snapshot of the product and of the waiting
    /// requests' keys (`SoldOutReads::lead`, `read_batch`). It covers the requests waiting
    /// now, every one of which arrived before it; a request arriving later waits for the next.
    pub(super) fn read_starts(&self, s: &mut State, intake: u8) {
        let batch = self.waiting_at(s, intake);
        let ordered = (0..s.buyers.len() as u8)
            .filter(|&b| batch & 1 << b != 0 && s.orders[usize::from(b)].is_some())
            .fold(0, |mask, b| mask | 1 << b);
        let units_left = s.product.total.saturating_sub(s.product.promised);
        s.reads[usize::from(intake)].in_flight = Some(ProductRead { batch, units_left, ordered });
    }

    /// An intake's read ends (`SoldOutReads::answer_batch`): each request it covers that is
    /// still waiting is answered from it (`allot`): a key that made an order goes to the door;
    /// the units left go to the door's requests, as many as they cover (buyer order standing
    /// for arrival order); a request they would have covered alone waits for the next read;
    /// any other is sold out. Units left beyond the batch's, none of it waiting again, turn the
    /// intake's fast path on; under [`FastPathRule::WaitersFirst`] every request still waiting
    /// there (each arrived while the read was in flight) goes to the door with it.
    pub(super) fn read_ends(&self, s: &mut State, intake: u8) {
        let reads = &mut s.reads[usize::from(intake)];
        let read = reads.in_flight.take().expect("a read in flight ends");
        reads.last = Some(read.units_left);
        let mut left = read.units_left;
        let mut again = false;
        for b in 0..s.buyers.len() as u8 {
            if read.batch & 1 << b == 0 || s.buyers[usize::from(b)].request != Request::Waiting {
                continue;
            }
            let quantity = self.quantity(b);
            let ahead = read.batch & ((1 << b) - 1);
            if read.ordered & 1 << b != 0 {
                self.to_the_door(s, b, ahead);
            } else if quantity <= left {
                left -= quantity;
                self.to_the_door(s, b, ahead);
            } else if quantity > read.units_left {
                Self::sold_out_from_a_read(s, b);
            } else {
                again = true;
            }
        }
        if left == 0 || again {
            return;
        }
        s.reads[usize::from(intake)].fast = true;
        if self.rules.fast_path == FastPathRule::WaitersFirst {
            let waiting = self.waiting_at(s, intake);
            for b in (0..s.buyers.len() as u8).filter(|b| waiting & 1 << b != 0) {
                // Released together, after the batch, each arrived before anyone who comes next.
                self.to_the_door(s, b, read.batch);
            }
        }
    }

    /// A waiting request answered `sold_out` from a read, which §8.7 allows only if the
    /// product was sold out for it at some moment since it sent.
    fn sold_out_from_a_read(s: &mut State, buyer: Buyer) {
        if !s.buyers[usize::from(buyer)].sold_out_since_sent {
            s.seen.sold_out_with_a_unit_left = true;
        }
        Self::answer(s, buyer, Answer::SoldOut);
    }

    /// After every step: each waiting request notes whether the product is sold out for it
    /// now.
    pub(super) fn watch_the_waiting(&self, s: &mut State) {
        for b in 0..s.buyers.len() as u8 {
            let buyer = &s.buyers[usize::from(b)];
            if buyer.request == Request::Waiting && !buyer.sold_out_since_sent && self.sold_out_for(s, b) {
                s.buyers[usize::from(b)].sold_out_since_sent = true;
            }
        }
    }
}
