//! Stripe, as the fleet's `domain::payments` meets it: each request under its key (a create, a
//! capture, a cancel), replayed once an answer is saved, and the ways one may go (a 500 saved,
//! a 500 after the effect, an answer lost, unreachable, a key in use, a create slow to confirm,
//! an `idempotency_error`); and what happens at Stripe without the fleet: a create still
//! executing making its intent and ending its confirm, holds cancelled outside or lapsing,
//! buyers at their 3-D Secure, keys forgotten, events given up, a 3-D Secure deadline passing,
//! and the safety net's cancel of a failed order's live intent (the fleet's `domain::strays`).
//! Stripe itself is stripe-sim's (`crates/stripe-sim`).

use super::{Action, OrderProtocol};
use crate::state::*;

impl OrderProtocol {
    /// The ways a Stripe request may go from here.
    pub(super) fn nets(state: &State, key: Option<(Op, Buyer, u8)>, out: &mut Vec<Net>) {
        out.push(Net::Ok);
        // A key in use answers `409` whatever else befalls the request, but for one that never
        // reaches Stripe (a 409 lost on the way is no answer too).
        if let Some(key) = key
            && state.stripe.in_use(key)
        {
            if state.budget.faults > 0 {
                out.push(Net::Fault(Fault::Unreachable));
            }
            return;
        }
        if let Some(key @ (Op::Create, ..)) = key
            && state.budget.slow_confirms > 0
            && state.stripe.saved(key).is_none()
        {
            out.push(Net::Fault(Fault::SlowConfirm));
        }
        if state.budget.faults == 0 {
            return;
        }
        out.push(Net::Fault(Fault::Unreachable));
        // A key with an answer saved is replayed: only the network can fail it, or a deploy
        // that changed a create's parameters since it ran (`idempotency_error`).
        match key {
            Some(key) if state.stripe.saved(key).is_none() => {
                out.extend([Fault::Error500, Fault::Error500AfterEffect, Fault::AnswerLost].map(Net::Fault));
            }
            Some((Op::Create, ..)) => out.push(Net::Fault(Fault::OtherParameters)),
            _ => {}
        }
    }

    /// The Stripe request a job's next step makes, if any: `Some(None)` for a lookup.
    pub(super) fn stripe_request(state: &State, job: Job) -> Option<Option<(Op, Buyer, u8)>> {
        match job {
            Job::Authorize(order, Auth::Create { attempt, .. }) => Some(Some((Op::Create, order, attempt))),
            Job::Advance(order, Advance::Capture { attempt, .. }) => {
                Some(Some((Op::Capture, order, attempt)))
            }
            Job::Advance(order, Advance::Cancel { attempt, .. }) => Some(Some((Op::Cancel, order, attempt))),
            Job::Settle(order, Settle::Release { .. } | Settle::ReleaseRefused) => {
                Some(Some((Op::Cancel, order, state.order(order).attempt)))
            }
            Job::Authorize(_, Auth::List { .. })
            | Job::Advance(_, Advance::Retrieve { .. })
            | Job::Settle(_, Settle::Read)
            | Job::Hook(_, Hook::Read) => Some(None),
            _ => None,
        }
    }

    /// A request under `key`: replayed if an answer is saved; otherwise `execute` runs it
    /// (or not, by the fault) and its answer is saved, as Stripe does.
    fn stripe_call(
        s: &mut State,
        key: (Op, Buyer, u8),
        net: Net,
        execute: impl FnOnce(&mut State) -> Reply,
    ) -> Reply {
        match net {
            Net::Fault(Fault::SlowConfirm) => s.budget.slow_confirms -= 1,
            Net::Fault(_) => s.budget.faults -= 1,
            Net::Ok => {}
        }
        if net == Net::Fault(Fault::Unreachable) {
            return Reply::Unanswered;
        }
        // A key whose first request is still executing answers `409 idempotency_key_in_use`,
        // and nothing is saved for this request.
        if s.stripe.in_use(key) {
            return Reply::InUse;
        }
        if let Some(saved) = s.stripe.saved(key) {
            return match net {
                Net::Ok => saved,
                Net::Fault(Fault::OtherParameters) => Reply::IdempotencyError,
                Net::Fault(_) => Reply::Unanswered,
            };
        }
        let (runs, saves, answer) = match net {
            Net::Ok => (true, None, None),
            Net::Fault(Fault::Error500) => (false, Some(Reply::Error500), Some(Reply::Error500)),
            Net::Fault(Fault::Error500AfterEffect) => (true, Some(Reply::Error500), Some(Reply::Error500)),
            Net::Fault(Fault::AnswerLost) => (true, None, Some(Reply::Unanswered)),
            // Goes on executing, its answer saved only once its confirm ends
            // (`Action::ConfirmEnds`).
            Net::Fault(Fault::SlowConfirm) => {
                execute(s);
                return Reply::Unanswered;
            }
            Net::Fault(Fault::Unreachable) => unreachable!("answered above"),
            Net::Fault(Fault::OtherParameters) => {
                unreachable!("only a key that ran answers idempotency_error")
            }
        };
        let reply = if runs { execute(s) } else { Reply::Error500 };
        s.stripe.save(key, saves.unwrap_or(reply));
        answer.unwrap_or(reply)
    }

    pub(super) fn create(&self, s: &mut State, order: Buyer, attempt: u8, net: Net) -> Reply {
        let card = self.card(order);
        Self::stripe_call(s, (Op::Create, order, attempt), net, |s| {
            // §8.8: a PaymentIntent only for an order holding promised units, judged as the
            // create reaches Stripe (a slow one makes its intent later).
            if s.orders[usize::from(order)].as_ref().is_none_or(|o| o.status != Status::PendingAuthorization)
            {
                s.seen.intent_without_a_unit = true;
            }
            if net == Net::Fault(Fault::SlowConfirm) {
                s.stripe.run_later(order, attempt);
                return Reply::Unanswered;
            }
            let (status, reply) = confirmed(card, s.stripe.intents.len() as IntentId);
            s.stripe.make(order, attempt, status);
            reply
        })
    }

    pub(super) fn capture(s: &mut State, order: Buyer, attempt: u8, intent: IntentId, net: Net) -> Reply {
        Self::stripe_call(s, (Op::Capture, order, attempt), net, |s| {
            let i = &mut s.stripe.intents[usize::from(intent)];
            if i.status != IntentStatus::RequiresCapture {
                return Reply::Refused;
            }
            i.status = IntentStatus::Succeeded;
            i.captures += 1;
            // §8.2: only for an order whose stock is reserved.
            if s.orders[usize::from(order)].as_ref().is_none_or(|o| o.status != Status::StockReserved) {
                s.seen.capture_without_stock = true;
            }
            Reply::Intent(intent, IntentStatus::Succeeded)
        })
    }

    /// A cancel under the order's key; it releases a hold, a declined intent, or one waiting for
    /// its buyer's 3-D Secure, and Stripe tells the webhook.
    pub(super) fn cancel(
        &self,
        s: &mut State,
        order: Buyer,
        attempt: u8,
        intent: IntentId,
        net: Net,
    ) -> Reply {
        let webhooks = self.scenario.webhooks;
        Self::stripe_call(s, (Op::Cancel, order, attempt), net, |s| {
            let i = &mut s.stripe.intents[usize::from(intent)];
            if !matches!(
                i.status,
                IntentStatus::RequiresCapture
                    | IntentStatus::RequiresPaymentMethod
                    | IntentStatus::RequiresAction
                    | IntentStatus::Confirming
            ) {
                return Reply::Refused;
            }
            i.status = IntentStatus::Canceled;
            i.cancels += 1;
            s.emit(webhooks, intent, true);
            Reply::Intent(intent, IntentStatus::Canceled)
        })
    }

    /// What happens at Stripe to each intent, and to each create it is still executing: holds
    /// cancelled or lapsing, buyers at their 3-D Secure, creates running and confirms ending,
    /// and the safety net's cancels.
    pub(super) fn stripe_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for &(order, attempt) in &s.stripe.running {
            actions.push(Action::CreateRuns { order, attempt });
        }
        for (i, intent) in s.stripe.intents.iter().enumerate() {
            let i = i as IntentId;
            // The buyer's page has the intent's client secret once the order went
            // `requires_action` (the 202, or `GET`), and may use it at any moment after.
            let o = s.order(intent.order);
            // A hold cancelled outside the fleet is one whose order has not failed: on a failed
            // order it would do the fleet's own work, and hide a hold the fleet left (§8.5).
            let cancellable = intent.status == IntentStatus::RequiresCapture && !o.status.has_failed();
            if cancellable && s.budget.expiries > 0 {
                actions.push(Action::HoldCanceledOutside(i));
            }
            if cancellable && s.budget.lapses > 0 {
                actions.push(Action::HoldLapses(i));
            }
            if intent.status == IntentStatus::RequiresAction && o.action && o.intent == Some(i) {
                actions.extend([true, false].map(|ok| Action::Authenticate { intent: i, ok }));
            }
            if intent.status == IntentStatus::Confirming {
                actions.push(Action::ConfirmEnds(i));
            }
            // The safety net: a failed order's own intent holding funds, or waiting for its
            // buyer, is cancelled by the reconciliation or the webhook; and a release owed on
            // an order the database refused is made by the reconciliation whatever the
            // order's status (`strays::owed_now`).
            let live = matches!(intent.status, IntentStatus::RequiresCapture | IntentStatus::RequiresAction);
            let netted = self.rules.safety_net && o.status.has_failed();
            if live && (netted || o.release_owed) && o.intent == Some(i) {
                actions.push(Action::ReleaseFailedHold(i));
            }
        }
    }

    /// A create's confirm ends as the create would have ended (stripe-sim's `slow_confirm`
    /// makes the intent at once and only hides it behind `mid_request`): a hold for a good
    /// card, a decline for a declining one, waiting for its buyer for one needing 3-D Secure;
    /// and the key's answer saved then.
    fn confirm_ends(&self, s: &mut State, intent: IntentId) {
        let card = self.card(s.stripe.intents[usize::from(intent)].order);
        let i = &mut s.stripe.intents[usize::from(intent)];
        let (status, reply) = confirmed(card, intent);
        i.status = status;
        i.held = status == IntentStatus::RequiresCapture;
        let key = (Op::Create, i.order, i.attempt);
        s.stripe.save(key, reply);
        if status == IntentStatus::RequiresCapture {
            s.emit(self.scenario.webhooks, intent, false);
        }
    }

    /// What happens outside the fleet: Stripe and the buyers' pages, and time passing.
    pub(super) fn outside(&self, s: &mut State, action: Action) {
        match action {
            Action::EventLost(event) => {
                s.budget.lost_events -= 1;
                let at = s.events.iter().position(|e| *e == event).expect("a pending event");
                s.events.remove(at);
            }
            Action::Authenticate { intent, ok } => {
                let i = &mut s.stripe.intents[usize::from(intent)];
                i.status =
                    if ok { IntentStatus::RequiresCapture } else { IntentStatus::RequiresPaymentMethod };
                i.held |= ok;
                s.emit(self.scenario.webhooks, intent, false);
            }
            Action::CreateRuns { order, attempt } => {
                s.stripe.running.retain(|running| *running != (order, attempt));
                s.stripe.make(order, attempt, IntentStatus::Confirming);
            }
            Action::ConfirmEnds(intent) => self.confirm_ends(s, intent),
            Action::ReleaseFailedHold(intent) => {
                let i = &mut s.stripe.intents[usize::from(intent)];
                i.status = IntentStatus::Canceled;
                i.cancels += 1;
                s.emit(self.scenario.webhooks, intent, true);
            }
            Action::DeadlinePasses(order) => s.order_mut(order).past_deadline = true,
            Action::HoldCanceledOutside(intent) => {
                s.budget.expiries -= 1;
                s.stripe.intents[usize::from(intent)].status = IntentStatus::Canceled;
                s.emit(self.scenario.webhooks, intent, true);
            }
            Action::HoldLapses(intent) => {
                s.budget.lapses -= 1;
                let i = &mut s.stripe.intents[usize::from(intent)];
                i.status = IntentStatus::Canceled;
                let order = i.order;
                // The deadline is the one Stripe gave with the hold, which the order records with
                // it (`authorization_expires_at`): its row says the hold is past it.
                s.order_mut(order).lapsed = true;
                s.emit(self.scenario.webhooks, intent, true);
            }
            Action::KeysExpire => {
                s.budget.key_expiries -= 1;
                // Each order a key of which is forgotten is older than `KEY_KEPT`.
                for ((_, order, _), _) in &s.stripe.saved {
                    s.orders[usize::from(*order)].as_mut().expect("a key's order exists").old = true;
                }
                s.stripe.saved.clear();
            }
            _ => unreachable!("the fleet's own steps are taken in next_state"),
        }
    }
}

/// What a confirm of intent `id` with `card` leaves, and answers: a hold for a good card, a
/// decline for a declining one, waiting for its buyer for one needing 3-D Secure.
fn confirmed(card: Card, id: IntentId) -> (IntentStatus, Reply) {
    match card {
        Card::Good => (IntentStatus::RequiresCapture, Reply::Intent(id, IntentStatus::RequiresCapture)),
        Card::Declines => (IntentStatus::RequiresPaymentMethod, Reply::Declined(id)),
        Card::ThreeDSecure => (IntentStatus::RequiresAction, Reply::Intent(id, IntentStatus::RequiresAction)),
    }
}
