//! 3-D Secure: settling a `requires_action` order from its intent read fresh, by the sweeper or
//! the webhook, whichever holds the order's lease: authorized once its buyer passed; declined
//! once its intent is cancelled, the fleet cancelling it first when its buyer failed or its
//! deadline passed; a cancel answered a saved 5xx moves the order to its next attempt unless
//! the intent is cancelled. A move the database refuses for good (the scenario's trigger) is
//! the one rule of the fleet's `domain::refusal` (the hold cancelled, the order ended
//! `payment_declined` where the database allows it, else left for a person), or, under the
//! rule before it, an error. Mirrors the fleet's `domain::action` (the model's own
//! [`Action`](super::Action), every step, is `mod.rs`'s).

use super::{Done, Next, OrderProtocol, RefusalRule, SettleRule};
use crate::state::*;

impl OrderProtocol {
    /// Settling a `requires_action` order whose lease is held, from its intent read fresh
    /// ([`orderfleet::domain::steps::three_d_secure::settle`]). The lease is given back unless the order moved.
    pub(super) fn settle_step(&self, s: &mut State, order: Buyer, step: Settle, net: Net) -> Next<Settle> {
        let next = match step {
            Settle::Read => self.settle_read(s, order, net),
            Settle::Release { .. } => {
                let (attempt, intent) = Self::attempt_and_intent(s, order);
                // A refusal because the intent is released already counts as done
                // (`Payments::cancel_again` reads it); any other refusal is for a person,
                // and a 5xx or no answer is for later (the same key again).
                let now = s.stripe.intents[usize::from(intent)].status;
                match self.cancel(s, order, attempt, intent, net) {
                    Reply::Intent(..) => Next::Go(Settle::Decline),
                    Reply::Refused if now == IntentStatus::Canceled => Next::Go(Settle::Decline),
                    Reply::Refused => Next::End(Done::GaveUp),
                    Reply::Error500 | Reply::IdempotencyError
                        if self.rules.settle == SettleRule::CancelFirst =>
                    {
                        Self::after_a_saved_cancel_5xx(s, order, attempt, intent)
                    }
                    _ => Next::End(Done::Later),
                }
            }
            Settle::Decline if self.refused_now(s, order, false) => self.commit_refused(s, order),
            Settle::Authorize if self.refused_now(s, order, true) => self.commit_refused(s, order),
            Settle::ReleaseRefused => self.release_refused(s, order, net),
            Settle::EndRefused { released } => self.end_refused(s, order, released),
            Settle::Decline => {
                let quantity = self.quantity(order);
                let o = s.order_mut(order);
                if o.status == Status::RequiresAction {
                    o.status = Status::PaymentDeclined;
                    o.lease = None;
                    s.product.promised -= quantity;
                }
                Next::End(Done::Settled)
            }
            Settle::Authorize => {
                if s.order(order).status == Status::RequiresAction {
                    self.accept(s, order);
                }
                Next::End(Done::Settled)
            }
        };
        if let Next::End(Done::Later | Done::GaveUp | Done::DatabaseError) = next {
            let o = s.order_mut(order);
            if o.status == Status::RequiresAction {
                o.lease = None;
            }
        }
        next
    }

    /// After a settle's cancel answered a 5xx Stripe saved under the attempt's key
    /// (`action::release_intent`): the intent, read (folded into the step, as the retry of a lookup
    /// is), cancelled already: the cancel is done; otherwise
    /// the order moves to its next attempt, whose new cancel key the next settle uses.
    fn after_a_saved_cancel_5xx(s: &mut State, order: Buyer, attempt: u8, intent: IntentId) -> Next<Settle> {
        // Only a cancelled intent is released: one that needs a payment method can still be
        // confirmed by its buyer with another card (not modelled: see the README).
        if s.stripe.intents[usize::from(intent)].status == IntentStatus::Canceled {
            return Next::Go(Settle::Decline);
        }
        let o = s.order_mut(order);
        if o.status == Status::RequiresAction && o.attempt == attempt {
            o.attempt += 1;
            o.dated += 1;
            o.attempt_failed = false;
        }
        Next::End(Done::Later)
    }

    /// Whether the settle's commit of `order`'s move (to `authorized`, or else to
    /// `payment_declined`) is refused for good now: the order is still `requires_action` (a
    /// commit that finds it moved changes nothing, and is not refused) and the database
    /// refuses that move.
    fn refused_now(&self, s: &State, order: Buyer, to_authorized: bool) -> bool {
        s.order(order).status == Status::RequiresAction && self.refuses(order, to_authorized)
    }

    /// The settle's commit refused for good: nothing written. The code's rule cancels the
    /// hold next ([`RefusalRule::EndTheOrder`]); the rule before answers the error.
    fn commit_refused(&self, s: &mut State, order: Buyer) -> Next<Settle> {
        s.order_mut(order).refused = true;
        match self.rules.settle_refusal {
            RefusalRule::EndTheOrder => Next::Go(Settle::ReleaseRefused),
            RefusalRule::AnError => Next::End(Done::DatabaseError),
        }
    }

    /// The refused order's hold cancelled under its key, and the answer read
    /// (`refusal::release`, through `Payments::cancel`): cancelled, or already so; refused
    /// otherwise, for a person; anything else (no answer, a 5xx) owed to the reconciliation.
    /// (A saved 5xx's read and cancel under a fresh key, `Payments::cancel_again`, is folded
    /// into the owed release, which comes to the same end.)
    fn release_refused(&self, s: &mut State, order: Buyer, net: Net) -> Next<Settle> {
        let (attempt, intent) = Self::attempt_and_intent(s, order);
        let released = match self.cancel(s, order, attempt, intent, net) {
            Reply::Intent(..) => true,
            Reply::Refused if s.stripe.intents[usize::from(intent)].status == IntentStatus::Canceled => true,
            Reply::Refused => {
                s.order_mut(order).stuck = true;
                false
            }
            _ => {
                s.order_mut(order).release_owed = true;
                false
            }
        };
        Next::Go(Settle::EndRefused { released })
    }

    /// ONE statement (`refusal::end`): the order, still `requires_action`, ends
    /// `payment_declined` with `order_refused`, its units back and its hold recorded released
    /// if it is. Where the database refuses that too, the order is left for a person (counted,
    /// logged, listed by every sweep), its lease given back, its hold released or owed all the
    /// same; the settler goes on with the other orders.
    fn end_refused(&self, s: &mut State, order: Buyer, released: bool) -> Next<Settle> {
        if s.order(order).status != Status::RequiresAction {
            return Next::End(Done::Settled);
        }
        if self.refuses(order, false) {
            s.order_mut(order).stuck = true;
            return Next::End(Done::GaveUp);
        }
        let quantity = self.quantity(order);
        let o = s.order_mut(order);
        o.status = Status::PaymentDeclined;
        o.released |= released;
        o.lease = None;
        s.product.promised -= quantity;
        Next::End(Done::Settled)
    }

    /// The order's attempt and recorded intent.
    pub(super) fn attempt_and_intent(s: &State, order: Buyer) -> (u8, IntentId) {
        let o = s.order(order);
        (o.attempt, o.intent.expect("an order past pending has its intent"))
    }

    /// The intent read fresh, and the clock: the module table of
    /// [`orderfleet::domain::steps::three_d_secure`] (every intent in the model is its order's own).
    fn settle_read(&self, s: &mut State, order: Buyer, net: Net) -> Next<Settle> {
        if net != Net::Ok {
            s.budget.faults -= 1;
            return Next::End(Done::Later);
        }
        let (_, intent) = Self::attempt_and_intent(s, order);
        let past_deadline = s.order(order).past_deadline;
        match s.stripe.intents[usize::from(intent)].status {
            IntentStatus::RequiresCapture | IntentStatus::Succeeded => Next::Go(Settle::Authorize),
            // A confirm still executing reads as `requires_payment_method` at Stripe.
            IntentStatus::RequiresPaymentMethod | IntentStatus::Confirming => {
                Next::Go(Settle::Release { timed_out: false })
            }
            IntentStatus::Canceled => Next::Go(Settle::Decline),
            IntentStatus::RequiresAction if past_deadline => match self.rules.settle {
                SettleRule::CancelFirst | SettleRule::CancelFirstSameKeyAfterA5xx => {
                    Next::Go(Settle::Release { timed_out: true })
                }
                SettleRule::TimeOutWithoutCancel => Next::Go(Settle::Decline),
            },
            IntentStatus::RequiresAction => Next::End(Done::Later), // the buyer is still at it
        }
    }
}
