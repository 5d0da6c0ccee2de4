//! The transitions: every step a process can take next, each as atomic as the code makes it
//! (one SQL statement or transaction, one Stripe request), so the checker interleaves them in
//! every order the real fleet could. README.md maps each [`Transition`] to the code.
//!
//! This file holds the model's types (the [`Scenario`] and the [`Rules`] it runs under, the
//! processes, every [`Action`]) and stateright's [`Model`]: the actions each state offers and
//! the step each action takes, handed to the file of the part of the protocol it models. Each
//! of those files is named after the fleet's module it mirrors (`crates/orderfleet/src/domain`):
//!
//! - `door.rs`: a buyer's request at the intake, the door that promises its units, its answer;
//! - `authorization.rs`: a pending order's create, list and next attempt, and the commit of
//!   what they found;
//! - `action.rs`: settling a `requires_action` order (3-D Secure);
//! - `fulfilment.rs`: the stock worker's receive, the reservation in line, capture and cancel;
//! - `sweeper.rs`: the sweeper taking up orders that stopped moving;
//! - `webhook.rs`: Stripe's events, and the webhook applying them;
//! - `payments.rs`: Stripe's side of each request, and what Stripe does on its own;
//! - `product.rs`: the operator's upsert of the total;
//! - `rules.rs`: the fleet's rules, as they are and as they were;
//! - `transition.rs`: the kind of each step, for the map to the code.
//!
//! What no one module of the fleet does stays here: the relay sending a stock-check row, the
//! operator's redrive of the DLQ, a lease running out, a process dying between two steps.

mod action;
mod authorization;
mod door;
mod fulfilment;
mod payments;
mod product;
mod rules;
mod sweeper;
mod transition;
mod webhook;

use stateright::{Model, Property};

pub use self::rules::{
    CommitRule, CutRule, FastPathRule, IdempotencyRule, InUseRule, LapseRule, LineRule, LookupRule,
    MessageRule, RefusalRule, ResumeLookup, ResumeRule, Rules, SettleRule, SoldOutRule,
};
pub use self::transition::Transition;
use crate::state::*;

/// What is checked: who buys, how many units, what the operator does, and what may fail.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The scenario's name in the report.
    pub name: &'static str,
    /// Each buyer's quantity and card.
    pub buyers: Vec<(u8, Card)>,
    /// The product's total units at the start.
    pub total: u8,
    /// Totals the operator may set, each once, at any moment.
    pub upserts: Vec<u8>,
    /// Stock workers.
    pub workers: u8,
    /// What the sweeper does: everything, or only the pending orders, so that the messages
    /// alone must bring every accepted order to its end.
    pub sweeper: Sweeps,
    /// What may go wrong, and how often.
    pub budget: Budget,
    /// Whether Stripe's webhooks reach the fleet (`STRIPE_WEBHOOK_SECRET` set).
    pub webhooks: bool,
    /// Intakes that answer `sold_out` from reads of the product (buyer `b` sends to intake
    /// `b % intakes`); 0: every request goes straight to the door's statement, as the model's
    /// other scenarios have it (the read only adds a way to be told `sold_out`).
    pub intakes: u8,
    /// A buyer whose order the database refuses to move out of `requires_action` (a trigger,
    /// say), and which moves it refuses.
    pub refused: Option<(Buyer, Refuses)>,
}

/// Which of an order's moves out of `requires_action` the database refuses for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refuses {
    /// The move to `authorized` (after its buyer authenticated): its end as
    /// `payment_declined` is allowed.
    TheMoveToAuthorized,
    /// Every move of its status (its lease may still be taken and given back): its end as
    /// `payment_declined` too, so it is left for a person.
    EveryMove,
}

impl Scenario {
    /// `buyers` (each one's units and card) and `total` units, in the setting most scenarios
    /// share: one stock worker, a sweeper that sweeps everything, a total nobody changes, and
    /// nothing going wrong. A scenario then says only where it differs (`with_…`), so what
    /// each one lets happen stands out.
    pub fn new(name: &'static str, buyers: Vec<(u8, Card)>, total: u8) -> Self {
        Self {
            name,
            buyers,
            total,
            upserts: vec![],
            workers: 1,
            sweeper: Sweeps::Everything,
            budget: Budget::default(),
            webhooks: false,
            intakes: 0,
            refused: None,
        }
    }

    /// The database refuses `buyer`'s order the moves `refuses` says.
    pub fn with_refused(self, buyer: Buyer, refuses: Refuses) -> Self {
        Self { refused: Some((buyer, refuses)), ..self }
    }

    /// Buyers sent to `intakes` intakes, each answering `sold_out` from reads of its own.
    pub fn with_intakes(self, intakes: u8) -> Self {
        Self { intakes, ..self }
    }

    /// Stripe's webhooks on: each event delivered until applied, or lost within the budget.
    pub fn with_webhooks(self) -> Self {
        Self { webhooks: true, ..self }
    }

    /// The totals the operator may set, each once, at any moment.
    pub fn with_upserts(self, upserts: Vec<u8>) -> Self {
        Self { upserts, ..self }
    }

    /// Stock workers receiving at once.
    pub fn with_workers(self, workers: u8) -> Self {
        Self { workers, ..self }
    }

    /// What the sweeper sweeps.
    pub fn with_sweeper(self, sweeper: Sweeps) -> Self {
        Self { sweeper, ..self }
    }

    /// What may go wrong, and how often.
    pub fn with_budget(self, budget: Budget) -> Self {
        Self { budget, ..self }
    }
}

/// What the sweeper sweeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweeps {
    /// Every order that stopped moving.
    Everything,
    /// Only the pending orders.
    OnlyPending,
}

/// The model: a scenario under a set of rules.
#[derive(Clone, Debug)]
pub struct OrderProtocol {
    /// Who does what.
    pub scenario: Scenario,
    /// By which rules.
    pub rules: Rules,
}

/// A process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proc {
    /// A buyer's request.
    Request(Buyer),
    /// A stock worker.
    Worker(u8),
    /// The sweeper.
    Sweeper,
    /// The webhook's handler (one event at a time).
    Webhook,
}

/// Everything that can happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A buyer sends its request (the first, or a retry with the same key and body).
    Send(Buyer),
    /// A process takes its next step; `Net` is how a Stripe request goes.
    Step(Proc, Net),
    /// A process dies between two steps.
    Crash(Proc),
    /// The relay sends an order's stock-check row; `twice`: and dies before marking it sent.
    Relay {
        /// Whose row.
        order: Buyer,
        /// Whether it dies before marking the row sent, so the row goes again.
        twice: bool,
    },
    /// A worker receives a visible copy of an order's message (any order: a standard queue).
    Receive {
        /// Which worker.
        worker: u8,
        /// Whose message.
        order: Buyer,
        /// Its receive count with this receive (the DLQ after 3).
        receives: u8,
    },
    /// An operator redrives the DLQ.
    Redrive,
    /// The sweeper picks a pending order nobody works on.
    SweepPending(Buyer),
    /// The sweeper picks an order stuck on its way to its end.
    SweepFulfilment(Buyer),
    /// The sweeper picks a `requires_action` order nobody is settling.
    SweepAction(Buyer),
    /// Stripe delivers an event to the webhook.
    Deliver(Event),
    /// Stripe gives up on an event (or the webhook's secret is unset).
    EventLost(Event),
    /// A buyer completes 3-D Secure on its intent, or fails it.
    Authenticate {
        /// The intent.
        intent: IntentId,
        /// Whether the buyer passes.
        ok: bool,
    },
    /// An order's `action_expires_at` passes.
    DeadlinePasses(Buyer),
    /// The operator sets the product's total (the scenario's `upserts[i]`).
    Upsert(u8),
    /// An order's lease expires (its holder died, or stalled past it).
    LeaseExpires(Buyer),
    /// Stripe cancels a hold, and the fleet's row does not say so: someone cancelled it in the
    /// Dashboard (or it lapsed past a deadline the fleet did not record).
    HoldCanceledOutside(IntentId),
    /// A hold passes the deadline Stripe gave for it, which the fleet recorded: Stripe cancels
    /// it, and the order's row says its hold is past its deadline.
    HoldLapses(IntentId),
    /// Stripe forgets its saved answers.
    KeysExpire,
    /// A create Stripe is still executing makes its intent, its confirm not ended.
    CreateRuns {
        /// Whose create.
        order: Buyer,
        /// Under which attempt's key.
        attempt: u8,
    },
    /// A create whose confirm was still executing ends it (`slow_confirm`).
    ConfirmEnds(IntentId),
    /// An intake begins a read of the product for the requests waiting on it.
    ReadStarts(u8),
    /// An intake's read ends: each request it covers is answered `sold_out` or goes to the door.
    ReadEnds(u8),
    /// The reconciliation (or a webhook) cancels a live intent of a failed order.
    ReleaseFailedHold(IntentId),
}

/// How a job ended.
enum Done {
    /// The order needs nothing more from this message.
    Settled,
    /// Not now (Stripe unanswered, a new attempt begun): the message comes back.
    Later,
    /// For a person: the message goes on towards the DLQ with the reason.
    Stuck,
    /// Logged for a person, the order left as it was: the sweeper looks again on its next
    /// pass (a settle whose cancel Stripe refused).
    GaveUp,
    /// The database refused the step, and the error goes up: a webhook answers 503 (Stripe
    /// delivers the event again), and the sweeper's pass ends there ([`RefusalRule::AnError`]).
    DatabaseError,
}

/// A step's result: the job goes on, or it ended.
enum Next<J> {
    Go(J),
    End(Done),
}

impl OrderProtocol {
    fn quantity(&self, order: Buyer) -> u8 {
        self.scenario.buyers[usize::from(order)].0
    }

    fn card(&self, order: Buyer) -> Card {
        self.scenario.buyers[usize::from(order)].1
    }

    /// Whether the database refuses `order`'s move out of `requires_action`: to `authorized`
    /// (or `stock_reserved`, the same commit), or else to `payment_declined`.
    fn refuses(&self, order: Buyer, to_authorized: bool) -> bool {
        match self.scenario.refused {
            Some((refused, Refuses::TheMoveToAuthorized)) => refused == order && to_authorized,
            Some((refused, Refuses::EveryMove)) => refused == order,
            None => false,
        }
    }

    fn step_actions(state: &State, proc: Proc, job: Option<Job>, actions: &mut Vec<Action>) {
        let mut nets = Vec::new();
        match job.and_then(|job| Self::stripe_request(state, job)) {
            Some(key) => Self::nets(state, key, &mut nets),
            None => nets.push(Net::Ok),
        }
        actions.extend(nets.into_iter().map(|net| Action::Step(proc, net)));
        if state.budget.crashes > 0 {
            actions.push(Action::Crash(proc));
        }
    }

    /// Whether nothing can happen any more: where "eventually" is judged. A buyer who comes
    /// back to a 3-D Secure page past the order's deadline, the order still `requires_action`,
    /// does not count: by then the fleet must have released the order (§8.11), and a buyer
    /// who never comes back would otherwise keep every such state from being judged.
    pub fn is_final(&self, state: &State) -> bool {
        // Most states are plainly not final: a buyer still to send, a request or a job under
        // way (their steps always move), a message to relay or receive.
        let moving = state.buyers.iter().any(|b| b.request != Request::Idle || b.sent == 0)
            || state.workers.iter().any(Option::is_some)
            || state.webhook.is_some()
            || state.messages.iter().any(|m| !m.visible.is_empty())
            || state.existing().any(|(_, o)| o.outbox == OutboxRow::Pending);
        if moving {
            return false;
        }
        let mut actions = Vec::new();
        self.actions(state, &mut actions);
        let late_return = |action: &Action| match *action {
            Action::Authenticate { intent, .. } => {
                let o = state.order(state.stripe.intents[usize::from(intent)].order);
                o.status == Status::RequiresAction && o.past_deadline
            }
            _ => false,
        };
        actions.into_iter().filter(|a| !late_return(a)).all(|action| self.next_state(state, action).is_none())
    }

    /// A job's next step; `None` when it cannot be taken now.
    fn job_step(&self, s: &mut State, job: Job, net: Net) -> Option<Next<Job>> {
        Some(match job {
            Job::Authorize(order, auth) => match self.authorize_step(s, order, auth, net) {
                Next::Go(auth) => Next::Go(Job::Authorize(order, auth)),
                Next::End(done) => Next::End(done),
            },
            Job::Advance(order, step) => match self.advance_step(s, order, step, net)? {
                Next::Go(step) => Next::Go(Job::Advance(order, step)),
                Next::End(done) => Next::End(done),
            },
            Job::Settle(order, step) => match self.settle_step(s, order, step, net) {
                Next::Go(step) => Next::Go(Job::Settle(order, step)),
                Next::End(done) => Next::End(done),
            },
            Job::Hook(order, step) => match self.hook_step(s, order, step, net) {
                Next::Go(step) => Next::Go(Job::Hook(order, step)),
                Next::End(done) => Next::End(done),
            },
        })
    }
}

impl Model for OrderProtocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.scenario.buyers.len();
        vec![State {
            product: Product {
                total: self.scenario.total,
                promised: 0,
                stock: self.scenario.total as i8,
                last_position: 0,
            },
            reads: vec![IntakeReads::default(); usize::from(self.scenario.intakes)],
            orders: vec![None; n],
            buyers: vec![
                BuyerState {
                    request: Request::Idle,
                    sent: 0,
                    answer: None,
                    first: None,
                    accepted_before: 0,
                    sold_out_since_sent: false,
                };
                n
            ],
            messages: vec![Messages::default(); n],
            workers: vec![None; usize::from(self.scenario.workers)],
            sweeper: None,
            sweeps_halted: false,
            webhook: None,
            events: vec![],
            stripe: Stripe::default(),
            budget: self.scenario.budget,
            upserts_done: 0,
            seen: Seen::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        Self::buyer_actions(s, actions);
        self.read_actions(s, actions);
        Self::worker_actions(s, actions);
        self.sweeper_actions(s, actions);
        Self::webhook_actions(s, actions);
        self.environment_actions(s, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Send(b) => self.send(&mut s, b),
            Action::Step(Proc::Request(b), net) => self.request_step(&mut s, b, net),
            Action::Step(Proc::Worker(w), net) => self.worker_step(&mut s, w, net),
            Action::Step(Proc::Sweeper, net) => self.sweeper_step(&mut s, net),
            Action::Step(Proc::Webhook, net) => self.webhook_step(&mut s, net),
            Action::Crash(proc) => Self::crash(&mut s, proc),
            Action::Relay { order, twice } => {
                if twice {
                    s.budget.duplicates -= 1;
                } else {
                    s.order_mut(order).outbox = OutboxRow::Sent;
                }
                s.messages[usize::from(order)].put_back(0);
            }
            Action::Receive { worker, order, receives } => Self::receive(&mut s, worker, order, receives),
            Action::Redrive => {
                s.budget.redrives -= 1;
                for m in &mut s.messages {
                    m.visible.extend(std::iter::repeat_n(0, usize::from(m.dead)));
                    m.visible.sort_unstable();
                    m.dead = 0;
                }
            }
            Action::SweepPending(order) => {
                let o = s.order_mut(order);
                o.lease = Some(Holder::Sweeper);
                let resumed = self.resume(o);
                s.sweeper = Some(Job::Authorize(order, resumed));
            }
            Action::SweepFulfilment(order) => s.sweeper = Some(Job::Advance(order, Advance::Load)),
            Action::SweepAction(order) => {
                s.order_mut(order).lease = Some(Holder::Sweeper);
                s.sweeper = Some(Job::Settle(order, Settle::Read));
            }
            Action::Deliver(event) => Self::deliver(&mut s, event)?,
            Action::Upsert(i) => self.upsert(&mut s, i),
            Action::LeaseExpires(order) => Self::lease_expires(&mut s, order)?,
            Action::ReadStarts(intake) => self.read_starts(&mut s, intake),
            Action::ReadEnds(intake) => self.read_ends(&mut s, intake),
            _ => self.outside(&mut s, action),
        }
        if !s.reads.is_empty() {
            self.watch_the_waiting(&mut s);
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}

impl OrderProtocol {
    /// What happens around the processes: the relay, leases running out, an operator's
    /// redrive and upserts, buyers at their 3-D Secure, and time passing (deadlines, holds
    /// and keys expiring).
    fn environment_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (id, o) in s.existing() {
            if o.outbox == OutboxRow::Pending {
                actions.push(Action::Relay { order: id, twice: false });
                if s.budget.duplicates > 0 {
                    actions.push(Action::Relay { order: id, twice: true });
                }
            }
            if o.lease.is_some() {
                actions.push(Action::LeaseExpires(id));
            }
        }
        if s.budget.redrives > 0 && s.messages.iter().any(|m| m.dead > 0) {
            actions.push(Action::Redrive);
        }
        for (i, _) in self.scenario.upserts.iter().enumerate() {
            if s.upserts_done & (1 << i) == 0 {
                actions.push(Action::Upsert(i as u8));
            }
        }
        self.stripe_actions(s, actions);
        for (id, o) in s.existing() {
            if o.status == Status::RequiresAction && !o.past_deadline {
                actions.push(Action::DeadlinePasses(id));
            }
        }
        // Stripe forgets a key 24 hours after its first use; every job here takes seconds or
        // minutes, so the keys a job uses are forgotten before it starts or after it ends.
        if s.budget.key_expiries > 0 && !s.stripe.saved.is_empty() && Self::all_idle(s) {
            actions.push(Action::KeysExpire);
        }
    }

    /// Whether no process is in the middle of a job.
    fn all_idle(s: &State) -> bool {
        s.buyers.iter().all(|b| !matches!(b.request, Request::Working(_)))
            && s.workers.iter().all(Option::is_none)
            && s.sweeper.is_none()
            && s.webhook.is_none()
    }

    /// A process dies mid-step: a request's connection drops, a worker's message comes back.
    fn crash(s: &mut State, proc: Proc) {
        s.budget.crashes -= 1;
        match proc {
            Proc::Request(b) => {
                let buyer = &mut s.buyers[usize::from(b)];
                buyer.request = Request::Idle;
                buyer.answer = Some(Answer::Dropped);
            }
            Proc::Worker(w) => {
                let (receives, job) = s.workers[usize::from(w)].take().expect("a crashing worker is busy");
                s.messages[usize::from(job.order())].put_back(receives);
            }
            Proc::Sweeper => s.sweeper = None,
            Proc::Webhook => {
                // No 2xx: Stripe delivers the event again.
                let (event, _) = s.webhook.take().expect("a crashing webhook is busy");
                s.events.push(event);
                s.events.sort_unstable();
            }
        }
    }

    /// An order's lease runs out; under a holder still working on it, only within the
    /// budget of stalls (`None` beyond it).
    fn lease_expires(s: &mut State, order: Buyer) -> Option<()> {
        let holder = s.order(order).lease.expect("a lease to expire");
        if Self::working_on(s, holder, order) {
            if s.budget.stalls == 0 {
                return None;
            }
            s.budget.stalls -= 1;
        }
        s.order_mut(order).lease = None;
        Some(())
    }

    /// Whether `holder` is working on `order` right now.
    fn working_on(s: &State, holder: Holder, order: Buyer) -> bool {
        match holder {
            Holder::Request(b) => {
                b == order && matches!(s.buyers[usize::from(b)].request, Request::Working(_))
            }
            Holder::Sweeper => {
                matches!(s.sweeper, Some(Job::Authorize(o, _) | Job::Settle(o, _)) if o == order)
            }
            Holder::Webhook => matches!(s.webhook, Some((_, Job::Settle(o, _))) if o == order),
        }
    }
}
