//! Fulfilling an accepted order: a stock worker receiving a copy of its stock-check message
//! (capturing at once when it says the order was reserved at its commit), the reservation in
//! line (after a cut, the fleet's own `fits_whatever_the_pending_do` decides), the capture or
//! the cancel, and the look at the intent after a reply that did not say it took effect; an
//! `authorized` order on a hold past its deadline ends rather than reserving. Mirrors the
//! fleet's `domain::fulfilment` (`Fulfilment::advance`, which the stock worker and the sweeper
//! both run) and the stock worker's receive (`crates/stock-worker/src/lib.rs`).

use orderfleet::domain::steps::fulfilment::{fits_in_line, fits_whatever_the_pending_do};

use super::{Action, Done, LapseRule, LineRule, MessageRule, Next, OrderProtocol, Proc};
use crate::state::*;

const MAX_RECEIVES: u8 = 3;

impl OrderProtocol {
    /// A busy worker takes its job's next step; an idle one receives any visible copy.
    pub(super) fn worker_actions(s: &State, actions: &mut Vec<Action>) {
        for (w, held) in s.workers.iter().enumerate() {
            match held {
                Some((_, job)) => Self::step_actions(s, Proc::Worker(w as u8), Some(*job), actions),
                None => {
                    for (o, m) in s.messages.iter().enumerate() {
                        let mut counts = m.visible.clone();
                        counts.dedup();
                        for receives in counts {
                            actions.push(Action::Receive { worker: w as u8, order: o as Buyer, receives });
                        }
                    }
                }
            }
        }
    }

    /// A worker receives a visible copy, unless it has been received too often: then SQS
    /// moves it to the DLQ instead of delivering it. A message that says the order was
    /// reserved at its commit is captured at once, under the attempt it names, without reading
    /// the order; any other is gone on with from the order as read.
    pub(super) fn receive(s: &mut State, worker: u8, order: Buyer, receives: u8) {
        let m = &mut s.messages[usize::from(order)];
        let at = m.visible.iter().position(|r| *r == receives).expect("a visible copy");
        m.visible.remove(at);
        if receives >= MAX_RECEIVES {
            m.dead += 1; // SQS moves it to the DLQ instead of delivering it
            return;
        }
        let o = s.order(order);
        let first = match (o.reserved_at_commit, o.intent) {
            (Some(attempt), Some(intent)) => Advance::Capture { attempt, intent },
            _ => Advance::Load,
        };
        s.workers[usize::from(worker)] = Some((receives + 1, Job::Advance(order, first)));
    }

    /// Worker `w`'s next step; a job that ends unsettled leaves its message to come back.
    /// A stock check whose order must wait for the line is done with: its message deleted,
    /// the order waiting in the worker's line (`stock_worker::line`), which tries it again
    /// as the sweeper does and leaves it to the sweeper at a stop; here the sweeper stands
    /// for both.
    pub(super) fn worker_step(&self, s: &mut State, w: u8, net: Net) {
        let (receives, job) = s.workers[usize::from(w)].expect("a stepping worker holds a message");
        let Some(next) = self.job_step(s, job, net) else {
            s.workers[usize::from(w)] = None;
            return;
        };
        match next {
            Next::Go(job) => s.workers[usize::from(w)] = Some((receives, job)),
            Next::End(done) => {
                s.workers[usize::from(w)] = None;
                if !matches!(done, Done::Settled) {
                    // Not deleted: visible again after its timeout, its receives kept.
                    s.messages[usize::from(job.order())].put_back(receives);
                }
                if let Done::Stuck = done {
                    s.order_mut(job.order()).stuck = true;
                }
            }
        }
    }

    /// Whether the fleet ends this order for its hold past its deadline rather than reserving
    /// it: an `authorized` order whose row says so, under [`LapseRule::KnownDeadline`].
    pub(super) fn lapses(&self, o: &Order) -> bool {
        self.rules.lapse == LapseRule::KnownDeadline && o.status == Status::Authorized && o.lapsed
    }

    /// Whether an order fits after a cut, by the rule in force; `None`: wait. The orders ahead
    /// that have not taken their units count: pending ones, and `authorized` ones but for those
    /// the fleet ends for a hold past its deadline.
    fn fits(&self, s: &State, order: Buyer) -> Option<bool> {
        let me = s.order(order);
        let mut ahead: Vec<(u8, i32, bool)> = s
            .existing()
            .filter(|(_, o)| {
                o.position < me.position
                    && (o.status.awaits_authorization()
                        || (o.status == Status::Authorized && !self.lapses(o)))
            })
            .map(|(id, o)| (o.position, i32::from(self.quantity(id)), o.status.awaits_authorization()))
            .collect();
        ahead.sort_unstable();
        let stock = i32::from(s.product.stock);
        let quantity = i32::from(self.quantity(order));
        match self.rules.line {
            LineRule::PendingAheadTakes => {
                let line: Vec<i32> = ahead.iter().map(|(_, q, _)| *q).collect();
                Some(fits_in_line(stock, &line, quantity))
            }
            LineRule::WaitForPendingAhead => {
                let line: Vec<(i32, bool)> = ahead.iter().map(|(_, q, p)| (*q, *p)).collect();
                fits_whatever_the_pending_do(stock, &line, quantity)
            }
        }
    }

    /// What a capture's or a cancel's reply leads to: `done` when it took effect; otherwise
    /// a look at the intent (after a 5xx, or a refusal that may mean it is done already), or
    /// later, unanswered.
    fn after_a_settling_reply(
        reply: Reply,
        op: Op,
        attempt: u8,
        intent: IntentId,
        done: Advance,
    ) -> Next<Advance> {
        let look = |after| Next::Go(Advance::Retrieve { op, attempt, intent, after });
        match reply {
            Reply::Intent(..) => Next::Go(done),
            Reply::Unanswered | Reply::InUse => Next::End(Done::Later),
            Reply::Error500 | Reply::IdempotencyError => look(After::Error500),
            Reply::Refused | Reply::Declined(_) => look(After::Refused),
        }
    }

    /// `None`: the step cannot be taken now (the order waits for the line).
    pub(super) fn advance_step(
        &self,
        s: &mut State,
        order: Buyer,
        step: Advance,
        net: Net,
    ) -> Option<Next<Advance>> {
        Some(match step {
            Advance::Load => self.load(s, order),
            Advance::Reserve => self.reserve(s, order)?,
            Advance::Capture { attempt, intent } => {
                let reply = Self::capture(s, order, attempt, intent, net);
                Self::after_a_settling_reply(reply, Op::Capture, attempt, intent, Advance::RecordPaid)
            }
            Advance::Retrieve { op, attempt, intent, after } => {
                Self::retrieve(s, order, op, attempt, intent, after, net)
            }
            Advance::NextAttempt { status, attempt } => {
                let o = s.order_mut(order);
                if o.status == status && o.attempt == attempt {
                    o.attempt += 1;
                    o.dated += 1;
                    o.attempt_failed = false;
                } else if o.status == status && self.rules.message == MessageRule::OnToTheOrdersAttempt {
                    // A key the order has left (a capture from the message): on with its own.
                    return Some(Next::Go(Advance::Load));
                }
                Next::End(Done::Later)
            }
            Advance::RecordPaid => {
                let o = s.order_mut(order);
                if o.status != Status::StockReserved {
                    return Some(Next::Go(Advance::Load));
                }
                o.status = Status::Paid;
                Next::End(Done::Settled)
            }
            Advance::FailCapture { attempt, intent, canceled } => {
                self.fail_capture(s, order, attempt, intent, canceled)
            }
            Advance::Cancel { attempt, intent } => {
                let reply = self.cancel(s, order, attempt, intent, net);
                Self::after_a_settling_reply(reply, Op::Cancel, attempt, intent, Advance::MarkReleased)
            }
            Advance::MarkReleased => {
                s.order_mut(order).released = true;
                Next::End(Done::Settled)
            }
        })
    }

    /// A capture that did not take effect, as the intent read after it says, on an order still
    /// `stock_reserved`: its units back, and `capture_failed` with its hold to cancel, or
    /// `authorization_canceled` when the hold is gone already; an order that moved meanwhile is
    /// read again (`Fulfilment::fail_capture`).
    fn fail_capture(
        &self,
        s: &mut State,
        order: Buyer,
        attempt: u8,
        intent: IntentId,
        canceled: bool,
    ) -> Next<Advance> {
        let quantity = self.quantity(order);
        let o = s.order_mut(order);
        if o.status != Status::StockReserved {
            return Next::Go(Advance::Load);
        }
        // A hold that is gone (it lapsed, or was cancelled outside) is not a failed
        // capture: `authorization_canceled`, released, with nothing to cancel.
        o.status = if canceled { Status::AuthorizationCanceled } else { Status::CaptureFailed };
        o.released |= canceled;
        s.product.stock += quantity as i8;
        s.product.promised -= quantity;
        if canceled {
            return Next::End(Done::Settled);
        }
        Next::Go(Advance::Cancel { attempt, intent })
    }

    /// The stock check's first read: where the order's row says to go on from. A failed order
    /// whose hold is not released yet is released: one rejected, one whose capture failed, and,
    /// under [`LapseRule::KnownDeadline`], one `authorization_canceled` for a hold past its
    /// deadline. Every other move to `authorization_canceled` records the hold released with
    /// it, so under [`LapseRule::TakesItsUnits`] no `authorization_canceled` order is left to
    /// release here.
    fn load(&self, s: &State, order: Buyer) -> Next<Advance> {
        let o = s.order(order);
        let left_alone =
            o.status == Status::AuthorizationCanceled && self.rules.lapse == LapseRule::TakesItsUnits;
        let released = o.released || left_alone;
        match (o.status, o.intent) {
            (Status::Authorized, _) => Next::Go(Advance::Reserve),
            (Status::StockReserved, Some(intent)) => {
                Next::Go(Advance::Capture { attempt: o.attempt, intent })
            }
            (Status::RejectedOutOfStock | Status::CaptureFailed | Status::AuthorizationCanceled, _)
                if released =>
            {
                Next::End(Done::Settled)
            }
            (
                Status::RejectedOutOfStock | Status::CaptureFailed | Status::AuthorizationCanceled,
                Some(intent),
            ) => Next::Go(Advance::Cancel { attempt: o.attempt, intent }),
            (Status::RejectedOutOfStock | Status::CaptureFailed | Status::AuthorizationCanceled, None) => {
                Next::Go(Advance::MarkReleased)
            }
            (Status::Paid | Status::Refunded | Status::PaymentDeclined | Status::SoldOut, _) => {
                Next::End(Done::Settled)
            }
            // The model has no pre-queue: no order of it is ever queued.
            (Status::Queued, _) => Next::End(Done::Stuck),
            (Status::PendingAuthorization | Status::RequiresAction | Status::StockReserved, _) => {
                Next::End(Done::Stuck)
            }
        }
    }

    /// Takes the order's units, or rejects it when they went to orders ahead; `None`: wait
    /// for the line. Under [`LapseRule::KnownDeadline`], an order on a hold past its deadline
    /// takes none and ends instead ([`OrderProtocol::lapse`]).
    fn reserve(&self, s: &mut State, order: Buyer) -> Option<Next<Advance>> {
        let quantity = self.quantity(order);
        let o = s.order(order);
        if o.status != Status::Authorized {
            return Some(Next::Go(Advance::Load)); // lost to another delivery
        }
        let (attempt, intent) = (o.attempt, o.intent.expect("an authorized order has its intent"));
        if self.lapses(o) {
            return Some(self.lapse(s, order, attempt, intent));
        }
        let p = &s.product;
        let fits =
            if p.promised <= p.total && p.stock >= quantity as i8 { true } else { self.fits(s, order)? };
        if fits {
            s.product.stock -= quantity as i8;
            let o = s.order_mut(order);
            o.status = Status::StockReserved;
            o.took = true;
            return Some(Next::Go(Advance::Capture { attempt, intent }));
        }
        let rejection = self.rejection(s, order);
        s.product.promised -= quantity;
        let o = s.order_mut(order);
        o.status = Status::RejectedOutOfStock;
        o.rejection = Some(rejection);
        Some(Next::Go(Advance::Cancel { attempt, intent }))
    }

    /// What the line looked like as an order is rejected, for §8.7 to judge at the end.
    fn rejection(&self, s: &State, order: Buyer) -> Rejection {
        let me = s.order(order).position;
        let ahead = || s.existing().filter(move |(_, o)| o.position < me);
        let ahead_given_back =
            ahead().filter(|(_, o)| o.took && o.status.has_failed()).map(|(id, _)| self.quantity(id)).sum();
        let authorized = |lapsed: bool| {
            ahead()
                .filter(|(_, o)| o.status == Status::Authorized && o.lapsed == lapsed)
                .fold(0u8, |mask, (id, _)| mask | 1 << id)
        };
        // Which orders ahead were within their deadline matters only if a hold may still lapse:
        // otherwise it would split states that differ in nothing else.
        let may_lapse = s.budget.lapses > 0;
        let ahead_within_deadline = if may_lapse { authorized(false) } else { 0 };
        let ahead_lapsed = authorized(true);
        Rejection { total: s.product.total, ahead_given_back, ahead_lapsed, ahead_within_deadline }
    }

    /// An `authorized` order whose hold is past its deadline (`Fulfilment::lapse`, after the
    /// reservation's first statement, or `reserve_in_line`, found it so and took nothing):
    /// ONE statement ends it `authorization_canceled` with its promised units back (it took
    /// no stock), then its hold is released under the order's key, as a rejected order's is
    /// (Stripe cancelled it already: the cancel's refusal is read as done). The code's read
    /// and its compare-and-set are one step here: the deadline, once passed, stays passed, so
    /// the read decides the same at the compare-and-set, and a move by another in between
    /// (the webhook's) is the move before this step, which then reads the order again.
    fn lapse(&self, s: &mut State, order: Buyer, attempt: u8, intent: IntentId) -> Next<Advance> {
        s.product.promised -= self.quantity(order);
        s.order_mut(order).status = Status::AuthorizationCanceled;
        Next::Go(Advance::Cancel { attempt, intent })
    }

    /// A look at the intent after a capture's or a cancel's reply that did not say it took
    /// effect: done, a new attempt, a failed capture, or stuck for a person.
    fn retrieve(
        s: &mut State,
        order: Buyer,
        op: Op,
        attempt: u8,
        intent: IntentId,
        after: After,
        net: Net,
    ) -> Next<Advance> {
        if net != Net::Ok {
            s.budget.faults -= 1;
            return Next::End(Done::Later);
        }
        let now = s.stripe.intents[usize::from(intent)].status;
        let status = s.order(order).status;
        match (op, now, after) {
            (Op::Capture, IntentStatus::Succeeded, _) => Next::Go(Advance::RecordPaid),
            (Op::Cancel, IntentStatus::Canceled | IntentStatus::RequiresPaymentMethod, _) => {
                Next::Go(Advance::MarkReleased)
            }
            (_, IntentStatus::RequiresCapture, After::Error500) => Next::Go(Advance::NextAttempt {
                status: if op == Op::Capture { Status::StockReserved } else { status },
                attempt,
            }),
            (Op::Capture, now, _) => {
                Next::Go(Advance::FailCapture { attempt, intent, canceled: now == IntentStatus::Canceled })
            }
            (_, _, _) => {
                s.order_mut(order).stuck = true;
                Next::End(Done::Stuck)
            }
        }
    }
}
