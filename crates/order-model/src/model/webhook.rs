//! Stripe's webhooks: an event delivered (or, within the budget, given up by Stripe), and the
//! webhook applying it: about a `requires_action` order, a settle as the sweeper's
//! (`action.rs`); about a cancelled hold of an `authorized` or `stock_reserved` order, the
//! intent read and the order ended `authorization_canceled` with its units back. An event not
//! applied is delivered again. Mirrors the fleet's `domain::webhook`.

use super::{Action, Done, Next, OrderProtocol, Proc};
use crate::state::*;

impl OrderProtocol {
    /// A busy webhook takes its job's next step; an idle one is delivered any pending event,
    /// or Stripe gives one up (within the budget).
    pub(super) fn webhook_actions(s: &State, actions: &mut Vec<Action>) {
        if let Some((_, job)) = s.webhook {
            return Self::step_actions(s, Proc::Webhook, Some(job), actions);
        }
        let mut events = s.events.clone();
        events.dedup();
        for event in events {
            actions.push(Action::Deliver(event));
            if s.budget.lost_events > 0 {
                actions.push(Action::EventLost(event));
            }
        }
    }

    /// Stripe delivers an event ([`orderfleet::domain::steps::webhook::apply`]): about the order's own
    /// intent, it settles a `requires_action` order (taking its lease: `None`, a 503 and a
    /// redelivery, while another holds it) or looks at an `authorized` or `stock_reserved` one's cancelled hold;
    /// anything else changes nothing (a stray intent's release is not modelled).
    pub(super) fn deliver(s: &mut State, event: Event) -> Option<()> {
        let (intent, canceled) = event;
        let order = s.stripe.intents[usize::from(intent)].order;
        let o = s.order(order);
        let job = match o.status {
            _ if o.intent != Some(intent) => None,
            Status::RequiresAction if o.lease.is_some() => return None,
            Status::RequiresAction => Some(Job::Settle(order, Settle::Read)),
            Status::Authorized | Status::StockReserved if canceled => Some(Job::Hook(order, Hook::Read)),
            _ => None,
        };
        let at = s.events.iter().position(|e| *e == event).expect("a pending event");
        s.events.remove(at);
        if let Some(job @ Job::Settle(..)) = job {
            s.order_mut(order).lease = Some(Holder::Webhook);
            s.webhook = Some((event, job));
        } else if let Some(job) = job {
            s.webhook = Some((event, job));
        }
        Some(())
    }

    /// The webhook's next step; an event not applied (a 503) is delivered again.
    pub(super) fn webhook_step(&self, s: &mut State, net: Net) {
        let (event, job) = s.webhook.expect("a stepping webhook has an event");
        match self.job_step(s, job, net).expect("settling never waits for the line") {
            Next::Go(job) => s.webhook = Some((event, job)),
            Next::End(done) => {
                s.webhook = None;
                // A 503: Stripe delivers the event again.
                if let Done::Later | Done::DatabaseError = done {
                    s.events.push(event);
                    s.events.sort_unstable();
                }
            }
        }
    }

    /// `payment_intent.canceled` for an `authorized` or `stock_reserved` order (most orders
    /// are `stock_reserved` from their commit): its intent read fresh, and if it is cancelled,
    /// `authorization_canceled` with the units back, and the stock too if it was taken
    /// ([`orderfleet::domain::steps::webhook`]'s `hold_canceled`, `lose_hold`).
    pub(super) fn hook_step(&self, s: &mut State, order: Buyer, step: Hook, net: Net) -> Next<Hook> {
        match step {
            Hook::Read => {
                if net != Net::Ok {
                    s.budget.faults -= 1;
                    return Next::End(Done::Later);
                }
                let (_, intent) = Self::attempt_and_intent(s, order);
                match s.stripe.intents[usize::from(intent)].status {
                    IntentStatus::Canceled => Next::Go(Hook::LoseHold),
                    _ => Next::End(Done::Settled),
                }
            }
            Hook::LoseHold => {
                let quantity = self.quantity(order);
                let o = s.order_mut(order);
                let reserved = o.status == Status::StockReserved;
                if o.status == Status::Authorized || reserved {
                    o.status = Status::AuthorizationCanceled;
                    o.released = true;
                    s.product.promised -= quantity;
                    if reserved {
                        s.product.stock += quantity as i8;
                    }
                }
                Next::End(Done::Settled)
            }
        }
    }
}
