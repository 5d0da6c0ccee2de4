//! Authorizing a pending order: the create under its attempt's key and what the reply means, a
//! taken-over order's resume (its create again, or Stripe's list of its intents), the move to a
//! next attempt, and the commit of what was found: `authorized` (or `stock_reserved`, its units
//! taken in the same statement, with its stock-check message), `requires_action`, declined, or
//! left pending for later. Mirrors the fleet's `domain::authorization`; the commit is also
//! `order::Transition::apply`'s, and a 3-D Secure settle's (`action.rs`).

use super::{Done, IdempotencyRule, InUseRule, LookupRule, Next, OrderProtocol};
use crate::state::*;

impl OrderProtocol {
    /// What a reply to a create, or an intent found by the list, means for the order.
    fn found(reply: Reply) -> Found {
        match reply {
            Reply::Intent(id, IntentStatus::RequiresCapture | IntentStatus::Succeeded) => Found::Holding(id),
            Reply::Intent(id, IntentStatus::RequiresAction) => Found::RequiresAction(id),
            Reply::Intent(id, _) | Reply::Declined(id) => Found::Declined(Some(id)),
            Reply::Refused => Found::Declined(None),
            Reply::Error500 | Reply::IdempotencyError | Reply::InUse | Reply::Unanswered => {
                Found::Failed(None)
            }
        }
    }

    pub(super) fn authorize_step(&self, s: &mut State, order: Buyer, auth: Auth, net: Net) -> Next<Auth> {
        match auth {
            Auth::Create { attempt, resumed } => self.create_step(s, order, attempt, resumed, net),
            Auth::List { attempt, failed } => self.list_step(s, order, attempt, failed, net),
            Auth::NextAttempt { attempt, listed } => Self::next_attempt(s, order, attempt, listed),
            Auth::Record(found) => self.record(s, order, found),
        }
    }

    /// The create under the attempt's key; `resumed`: a taken-over order's re-send, with the
    /// attempt's date when the list found nothing. A saved 5xx and an `idempotency_error` are
    /// read alike (`PaymentError::AttemptFailed`): never a decline. A `409
    /// idempotency_key_in_use` is a wait, as no answer is ([`InUseRule`]).
    fn create_step(
        &self,
        s: &mut State,
        order: Buyer,
        attempt: u8,
        resumed: Option<u8>,
        net: Net,
    ) -> Next<Auth> {
        // The send is not dated here: any time may pass between the last date and the send
        // (budget waits, the client's retries, a pause); a 5xx is dated when it comes back.
        let marks = self.rules.resume.marks_failures();
        let reply = match self.create(s, order, attempt, net) {
            // Read by the type Stripe gave it, `idempotency_error` (the code until 247134b).
            Reply::InUse if self.rules.in_use == InUseRule::AsAFailedAttempt => Reply::IdempotencyError,
            reply => reply,
        };
        match (reply, resumed) {
            (Reply::IdempotencyError, _) if self.rules.idempotency_error == IdempotencyRule::AsADecline => {
                Next::Go(Auth::Record(Found::Declined(None)))
            }
            (Reply::Error500 | Reply::IdempotencyError, Some(listed)) if !marks => {
                Next::Go(Auth::NextAttempt { attempt, listed })
            }
            (Reply::Error500 | Reply::IdempotencyError, _) => {
                Next::Go(Auth::Record(Found::Failed(Some(attempt))))
            }
            (reply, _) => Next::Go(Auth::Record(Self::found(reply))),
        }
    }

    /// A taken-over order's list of its intents at Stripe, which sees every intent already
    /// created: the live one, else the newest; none found leads to a new attempt (the
    /// attempt's key answered a 5xx) or a re-send of its key.
    fn list_step(&self, s: &mut State, order: Buyer, attempt: u8, failed: bool, net: Net) -> Next<Auth> {
        if net != Net::Ok {
            s.budget.faults -= 1;
            return Next::Go(Auth::Record(Found::Failed(None)));
        }
        let mine = || s.stripe.intents.iter().enumerate().filter(|(_, i)| i.order == order);
        let live = mine().find(|(_, i)| i.status == IntentStatus::RequiresCapture);
        if let Some((id, intent)) = live.or_else(|| mine().next_back()) {
            // Made, its confirm not ended: not final.
            if intent.status == IntentStatus::Confirming && self.rules.lookup == LookupRule::LeavePending {
                return Next::Go(Auth::Record(Found::Failed(None)));
            }
            return Next::Go(Auth::Record(Self::found(Reply::Intent(id as IntentId, intent.status))));
        }
        let listed = s.order(order).dated;
        if failed && self.rules.resume.marks_failures() {
            Next::Go(Auth::NextAttempt { attempt, listed })
        } else {
            Next::Go(Auth::Create { attempt, resumed: Some(listed) })
        }
    }

    /// A taken-over pending order's first step (`authorization::resume`): its attempt's create
    /// again, or Stripe's list, by the rule in force; with the attempt and whether its key
    /// answered a 5xx, as read when the order was taken over.
    pub(super) fn resume(&self, o: &Order) -> Auth {
        let attempt = o.attempt;
        if self.rules.resume_lookup.resends(o) {
            Auth::Create { attempt, resumed: None }
        } else {
            Auth::List { attempt, failed: o.attempt_failed }
        }
    }

    /// Moves a pending order to its next attempt if the list that found nothing began after
    /// the attempt was last dated, and creates under it; otherwise leaves it for later.
    fn next_attempt(s: &mut State, order: Buyer, attempt: u8, listed: u8) -> Next<Auth> {
        let o = s.order_mut(order);
        if o.status != Status::PendingAuthorization {
            return Next::End(Done::Settled); // moved elsewhere: answer from the row
        }
        if o.attempt == attempt && o.dated == listed {
            o.attempt += 1;
            o.dated += 1;
            o.attempt_failed = false;
        }
        if o.attempt == attempt {
            Next::Go(Auth::Record(Found::Failed(None)))
        } else {
            Next::Go(Auth::Create { attempt: o.attempt, resumed: None })
        }
    }

    /// Records what the authorization found, on an order still pending.
    fn record(&self, s: &mut State, order: Buyer, found: Found) -> Next<Auth> {
        let quantity = self.quantity(order);
        let o = s.order_mut(order);
        if o.status != Status::PendingAuthorization {
            return Next::End(Done::Settled);
        }
        match found {
            Found::Holding(id) => {
                o.intent = Some(id);
                self.accept(s, order);
            }
            Found::RequiresAction(id) => {
                o.status = Status::RequiresAction;
                o.intent = Some(id);
                o.lease = None;
                o.action = true;
            }
            Found::Declined(id) => {
                o.status = Status::PaymentDeclined;
                o.intent = id.or(o.intent);
                o.lease = None;
                s.product.promised -= quantity;
            }
            Found::Failed(after_5xx_of) => {
                o.lease = None;
                if after_5xx_of == Some(o.attempt) && self.rules.resume.marks_failures() {
                    o.attempt_failed = true;
                    o.dated += 1;
                }
                return Next::End(Done::Later);
            }
        }
        Next::End(Done::Settled)
    }

    /// The commit that accepts an order (its compare-and-set already passed): `authorized`,
    /// or, when the commit rule takes its units here, `stock_reserved` with the units out of
    /// stock; either way with its stock-check message, which says which.
    pub(super) fn accept(&self, s: &mut State, order: Buyer) {
        let quantity = self.quantity(order);
        let reserves = self.rules.commit.reserves(&s.product, quantity);
        if reserves {
            s.product.stock -= quantity as i8;
        }
        let o = s.order_mut(order);
        o.status = if reserves { Status::StockReserved } else { Status::Authorized };
        o.took |= reserves;
        o.reserved_at_commit = reserves.then_some(o.attempt);
        o.lease = None;
        o.outbox = OutboxRow::Pending;
        o.accepted = true;
    }
}
