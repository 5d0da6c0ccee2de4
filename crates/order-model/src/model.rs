//! The transitions: every step a process can take next, each as atomic as the code makes it
//! (one SQL statement or transaction, one Stripe request), so the checker interleaves them in
//! every order the real fleet could. README.md maps each [`Transition`] to the code.

use orderfleet::domain::fulfilment::{fits_in_line, fits_whatever_the_pending_do};
use stateright::{Model, Property};

use crate::state::*;

/// The fleet's rules, as they are and as they were before earlier defects were fixed, and
/// defects planted on purpose, so that the checker can show it finds those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// How the stock worker decides an order fits in line.
    pub line: LineRule,
    /// How a cut of the total is judged.
    pub cut: CutRule,
    /// How a resumed authorization treats its attempt's key.
    pub resume: ResumeRule,
    /// How a `requires_action` order past its deadline is settled.
    pub settle: SettleRule,
    /// What a create's `idempotency_error` means.
    pub idempotency_error: IdempotencyRule,
    /// What an authorization's commit does with the order's units, and so what its stock-check
    /// message says.
    pub commit: CommitRule,
    /// Which key a capture from a message that names its attempt goes on with.
    pub message: MessageRule,
    /// Whether fulfilment reads the deadline of an `authorized` order's hold.
    pub lapse: LapseRule,
    /// What a lookup that finds the order's intent before its confirm ends does.
    pub lookup: LookupRule,
    /// Whether the reconciliation (and a webhook) cancels a live intent of a failed order.
    pub safety_net: bool,
    /// When a taken-over pending order lists Stripe's intents before anything else.
    pub resume_lookup: ResumeLookup,
    /// What `409 idempotency_key_in_use` means.
    pub in_use: InUseRule,
}

impl Rules {
    /// The code's rules: since issue 44, a taken-over order whose attempt answered no 5xx and
    /// whose keys are surely kept sends the create again under its attempt's key, with no list
    /// first ([`ResumeLookup::ListOnlyAfterAFailureOrAnExpiredKey`]).
    pub const NOW: Rules =
        Rules { resume_lookup: ResumeLookup::ListOnlyAfterAFailureOrAnExpiredKey, ..Rules::BEFORE_ISSUE_44 };

    /// The code after issue 43 and before issue 44: a lookup that finds the order's intent
    /// before its confirm ends leaves the order pending ([`LookupRule::LeavePending`]), the
    /// safety net cancels a live intent of a failed order, and a resumed authorization always
    /// lists first ([`ResumeLookup::ListAlways`]).
    pub const BEFORE_ISSUE_44: Rules =
        Rules { lookup: LookupRule::LeavePending, safety_net: true, ..Rules::BEFORE_ISSUE_43 };

    /// The code after issue 35 and before issue 43: a lookup that finds the order's intent
    /// before its confirm ends declines the order ([`LookupRule::Decline`]), and nothing
    /// cancels a live intent of a failed order.
    pub const BEFORE_ISSUE_43: Rules =
        Rules { lapse: LapseRule::KnownDeadline, ..Rules::BEFORE_ISSUE_35_POINT_8 };

    /// The code after issue 34 and before issue 35 (point 8): the commit of an authorization
    /// takes the order's units when nothing was cut ([`CommitRule::ReserveWhenNothingCut`]),
    /// and fulfilment never reads the deadline of a hold.
    pub const BEFORE_ISSUE_35_POINT_8: Rules = Rules {
        commit: CommitRule::ReserveWhenNothingCut,
        message: MessageRule::OnToTheOrdersAttempt,
        ..Rules::BEFORE_ISSUE_34
    };

    /// The code before issue 34: the commit moves the order to `authorized`, and the stock
    /// worker reads it and reserves it.
    pub const BEFORE_ISSUE_34: Rules = Rules {
        line: LineRule::WaitForPendingAhead,
        cut: CutRule::KeepTheLineServed,
        resume: ResumeRule::NOW,
        settle: SettleRule::CancelFirst,
        idempotency_error: IdempotencyRule::LikeASaved5xx,
        commit: CommitRule::Authorize,
        message: MessageRule::TheMessagesAttempt,
        lapse: LapseRule::TakesItsUnits,
        lookup: LookupRule::Decline,
        safety_net: false,
        resume_lookup: ResumeLookup::ListAlways,
        in_use: InUseRule::AWait,
    };
}

/// When a taken-over pending order (a buyer's retry, the sweeper) asks Stripe's list what its
/// attempt did, and when it sends the create again under the attempt's key at once (issue 44).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeLookup {
    /// Before issue 44: the list first, always; the create again only if it finds nothing.
    ListAlways,
    /// Now (`authorization::resume`, `key_kept`): while no 5xx is known for the attempt and the
    /// order is younger than `KEY_KEPT` (23 h, [`Order::old`]), the create again under the
    /// attempt's key, which Stripe answers as the key's first request did, or `409
    /// idempotency_key_in_use` while that request still runs, or runs now; the list first
    /// only after a 5xx, or once Stripe may have forgotten the key.
    ListOnlyAfterAFailureOrAnExpiredKey,
    /// A defect planted to show the age matters: the create again whenever no 5xx is known,
    /// however old the order. A key Stripe forgot runs again, and makes a second intent.
    ListOnlyAfterAFailure,
}

impl ResumeLookup {
    /// Whether a taken-over order sends its attempt's create again without a list first.
    fn resends(self, o: &Order) -> bool {
        match self {
            ResumeLookup::ListAlways => false,
            ResumeLookup::ListOnlyAfterAFailureOrAnExpiredKey => !o.attempt_failed && !o.old,
            ResumeLookup::ListOnlyAfterAFailure => !o.attempt_failed,
        }
    }
}

/// What the fleet makes of `409 idempotency_key_in_use`: a request under a key whose first
/// request Stripe is still executing, saved nothing for (issue 44).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUseRule {
    /// Now (`payments::classify`): a wait, whatever Stripe types it; the order stays pending,
    /// its lease given back, and the same key later gets the first request's answer. The rules
    /// before issue 44 keep it too: until then the model folded the 409 into "unanswered".
    AWait,
    /// The code until 247134b, planted to show the checker finds it: a 409 Stripe types
    /// `idempotency_error` is read by its type, as a key that ran and failed (a saved 5xx);
    /// the attempt is marked, and a list that misses the first request, which has made
    /// nothing yet, moves the order to a new attempt with a new key.
    AsAFailedAttempt,
}

/// What a resumed authorization does when Stripe's list shows the order's intent made, its
/// confirm not ended (`requires_payment_method` with no error, for a moment while a create and
/// confirm is still executing at Stripe) (issue 43, point 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupRule {
    /// Before issue 43: declined on it, its units back; the confirm may then place a hold on
    /// the card of a buyer told no, which nothing looks at again.
    Decline,
    /// Now (`authorization::record`'s `left_pending`): the order stays pending, its lease given
    /// back; a retry or the sweeper looks again.
    LeavePending,
}

impl Default for Rules {
    fn default() -> Self {
        Rules::NOW
    }
}

/// What the commit that moves an order to `authorized` (the intake's, a resumed request's, the
/// sweeper's, a 3-D Secure settle's, the webhook's) does with its units (issue 34).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitRule {
    /// Before issue 34: `authorized`, with its stock-check message; the stock worker reads the
    /// order and reserves it ([`orderfleet::domain::fulfilment`]'s `arrive`), then captures.
    Authorize,
    /// Issue 34's merge: in the same statement, when nothing was cut (`units_promised <=
    /// units_total`) and `stock >= quantity` (`arrive`'s own condition), the units are taken and
    /// the order goes straight to `stock_reserved`; its message says so, with the attempt, and
    /// the stock worker captures under that attempt's key without reading the order first,
    /// then compare-and-sets `stock_reserved → paid` (or goes the refused capture's way).
    /// When the condition fails, as [`CommitRule::Authorize`].
    ReserveWhenNothingCut,
    /// A wrong merge, planted to show the checker finds it: the commit takes the units on
    /// `stock >= quantity` alone, blind to an operator's cut below what the door promised.
    ReserveOnStockAlone,
}

/// What a capture does after Stripe answered a 5xx it saved under the attempt's key and the
/// intent still holds funds (nothing was done), when the order is already on a later attempt:
/// another handling moved it there after that same 5xx. Before issue 34 the stock worker read
/// the order on every handling, so its key was always the order's attempt; a capture from a
/// message that says reserved (issue 34) uses the attempt the message names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageRule {
    /// As before issue 34 (`Fulfilment::after_a_failed_attempt`): the handling ends, for later.
    /// With a capture from the message, the next handling uses the message's attempt again and
    /// meets the same saved 5xx, for as long as Stripe keeps the key (24 h): only a handling
    /// that reads the order (the sweeper's) goes on.
    TheMessagesAttempt,
    /// The fix the model asks of issue 34: the capture goes on from the order as read, under
    /// the attempt the order is on.
    OnToTheOrdersAttempt,
}

/// What fulfilment makes of an `authorized` order whose hold is past the deadline Stripe gave
/// for it (`capture_before`), which the fleet recorded (`authorization_expires_at`): Stripe
/// has cancelled that hold, so the order can never be captured (issue 35, point 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LapseRule {
    /// Before issue 35 (point 8): the deadline is never read in fulfilment. The order takes its
    /// units like any other, its capture is refused and the units come back; reading the line
    /// after a cut, it counts as taking its units.
    TakesItsUnits,
    /// Now (`Fulfilment::arrive`, `Fulfilment::reserve_in_line`, `Fulfilment::lapse`): the
    /// reservation takes none of its units and ends it `authorization_canceled`, its promised
    /// units back, then releases its hold under the order's key; reading the line, an order
    /// ahead past its deadline counts for nothing (`fits_after_the_line`).
    KnownDeadline,
}

impl CommitRule {
    /// Whether the commit reserves, on the product row as it is.
    fn reserves(self, p: &Product, quantity: u8) -> bool {
        let stock_left = p.stock >= quantity as i8;
        match self {
            CommitRule::Authorize => false,
            CommitRule::ReserveWhenNothingCut => p.promised <= p.total && stock_left,
            CommitRule::ReserveOnStockAlone => stock_left,
        }
    }
}

/// How the stock worker decides, after a cut, whether an order's units are left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineRule {
    /// Before e5dc31d: an order ahead still pending authorization counts as taking its units.
    PendingAheadTakes,
    /// Now: when the answer depends on a pending order ahead, wait for it
    /// ([`fits_whatever_the_pending_do`]).
    WaitForPendingAhead,
}

/// Which totals `fleetctl product upsert` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutRule {
    /// Before e5dc31d: any total not below the units taken.
    AboveTaken,
    /// Now: also not below the units the line holds up to its last order served.
    KeepTheLineServed,
}

/// When a taken-over order whose attempt answered a saved 5xx moves to a new attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeRule {
    /// Before bbf9d45, restated for a list that does not lag: after the attempt's own key,
    /// re-sent, answers a 5xx, move on trusting the list made before that send.
    ListBeforeTheResend,
    /// Now (bbf9d45, 6376119, issue 33): a 5xx marks the attempt and ends its sends, dated when
    /// it comes back; a marked attempt moves on only when a list begun after that date finds
    /// nothing.
    DatedByTheFailure,
}

impl ResumeRule {
    /// The code as it is.
    pub const NOW: ResumeRule = ResumeRule::DatedByTheFailure;

    /// Whether a 5xx marks the attempt and ends its sends.
    fn marks_failures(self) -> bool {
        self != ResumeRule::ListBeforeTheResend
    }
}

/// What settling a `requires_action` order does when its intent still waits for its buyer
/// past the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleRule {
    /// Now ([`orderfleet::domain::action`]): cancel the intent first, then record
    /// `authentication_timed_out` with the units back; a cancel answered a saved 5xx reads the
    /// intent, and moves the order to its next attempt unless the intent is released.
    CancelFirst,
    /// Before the fix this model found: the same, but a cancel answered a saved 5xx is sent
    /// again under the same key at the next settle, and gets the 5xx again for 24 hours.
    CancelFirstSameKeyAfterA5xx,
    /// A defect planted to show the checker finds it: record `authentication_timed_out` and
    /// give the units back without cancelling the intent, which its buyer may still complete.
    TimeOutWithoutCancel,
}

/// What a create's `idempotency_error` (the key ran before, with other parameters) means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdempotencyRule {
    /// Now (`PaymentError::AttemptFailed`): the key ran, and may hold funds; found out as after
    /// a saved 5xx.
    LikeASaved5xx,
    /// A defect planted to show the checker finds it: a `400` read as a refusal of the card.
    AsADecline,
}

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
        }
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
    /// The reconciliation (or a webhook) cancels a live intent of a failed order.
    ReleaseFailedHold(IntentId),
}

/// The kinds of transition, each mapped to the code in README.md (a test checks the map).
// Each variant is documented by its row in that map: where in the code it happens.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transition {
    Send,
    Door,
    Resume,
    Create,
    List,
    AuthorizeNextAttempt,
    RecordAuthorization,
    ReserveAtCommit,
    Relay,
    Receive,
    Reserve,
    Capture,
    RetrieveAfterFailure,
    SettleNextAttempt,
    RecordPaid,
    FailCapture,
    Cancel,
    MarkReleased,
    Crash,
    Redrive,
    SweepPending,
    SweepFulfilment,
    SweepAction,
    Deliver,
    ReadAction,
    ReleaseAction,
    RecordAction,
    ReadHold,
    LoseHold,
    Upsert,
    LeaseExpires,
    Authenticate,
    DeadlinePasses,
    HoldCanceledOutside,
    HoldLapses,
    Lapse,
    EventLost,
    KeysExpire,
    CreateRuns,
    ConfirmEnds,
    ReleaseFailedHold,
}

impl Transition {
    /// Every kind, for the map's test.
    pub const ALL: [Transition; 41] = [
        Transition::Send,
        Transition::Door,
        Transition::Resume,
        Transition::Create,
        Transition::List,
        Transition::AuthorizeNextAttempt,
        Transition::RecordAuthorization,
        Transition::ReserveAtCommit,
        Transition::Relay,
        Transition::Receive,
        Transition::Reserve,
        Transition::Capture,
        Transition::RetrieveAfterFailure,
        Transition::SettleNextAttempt,
        Transition::RecordPaid,
        Transition::FailCapture,
        Transition::Cancel,
        Transition::MarkReleased,
        Transition::Crash,
        Transition::Redrive,
        Transition::SweepPending,
        Transition::SweepFulfilment,
        Transition::SweepAction,
        Transition::Deliver,
        Transition::ReadAction,
        Transition::ReleaseAction,
        Transition::RecordAction,
        Transition::ReadHold,
        Transition::LoseHold,
        Transition::Upsert,
        Transition::LeaseExpires,
        Transition::Authenticate,
        Transition::DeadlinePasses,
        Transition::HoldCanceledOutside,
        Transition::HoldLapses,
        Transition::Lapse,
        Transition::EventLost,
        Transition::KeysExpire,
        Transition::CreateRuns,
        Transition::ConfirmEnds,
        Transition::ReleaseFailedHold,
    ];
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
}

/// A step's result: the job goes on, or it ended.
enum Next<J> {
    Go(J),
    End(Done),
}

const MAX_RECEIVES: u8 = 3;

impl OrderProtocol {
    fn quantity(&self, order: Buyer) -> u8 {
        self.scenario.buyers[usize::from(order)].0
    }

    fn card(&self, order: Buyer) -> Card {
        self.scenario.buyers[usize::from(order)].1
    }

    /// The ways a Stripe request may go from here.
    fn nets(state: &State, key: Option<(Op, Buyer, u8)>, out: &mut Vec<Net>) {
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
    fn stripe_request(state: &State, job: Job) -> Option<Option<(Op, Buyer, u8)>> {
        match job {
            Job::Authorize(order, Auth::Create { attempt, .. }) => Some(Some((Op::Create, order, attempt))),
            Job::Advance(order, Advance::Capture { attempt, .. }) => {
                Some(Some((Op::Capture, order, attempt)))
            }
            Job::Advance(order, Advance::Cancel { attempt, .. }) => Some(Some((Op::Cancel, order, attempt))),
            Job::Settle(order, Settle::Release { .. }) => {
                Some(Some((Op::Cancel, order, state.order(order).attempt)))
            }
            Job::Authorize(_, Auth::List { .. })
            | Job::Advance(_, Advance::Retrieve { .. })
            | Job::Settle(_, Settle::Read)
            | Job::Hook(_, Hook::Read) => Some(None),
            _ => None,
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

    /// Which kind of transition an action is in a state (for the map to the code).
    pub fn transition(&self, state: &State, action: Action) -> Transition {
        match action {
            Action::Send(_) => Transition::Send,
            Action::Step(Proc::Request(b), _) => match state.buyers[usize::from(b)].request {
                Request::Sent if state.orders[usize::from(b)].is_some() => Transition::Resume,
                Request::Sent | Request::Idle => Transition::Door,
                Request::Working(auth) => self.transition_of_step(state, Job::Authorize(b, auth)),
            },
            Action::Step(Proc::Worker(w), _) => state.workers[usize::from(w)]
                .map_or(Transition::Receive, |(_, job)| self.transition_of_step(state, job)),
            Action::Step(Proc::Sweeper, _) => {
                state.sweeper.map_or(Transition::SweepFulfilment, |job| self.transition_of_step(state, job))
            }
            Action::Step(Proc::Webhook, _) => {
                state.webhook.map_or(Transition::Deliver, |(_, job)| self.transition_of_step(state, job))
            }
            Action::Crash(_) => Transition::Crash,
            Action::Relay { .. } => Transition::Relay,
            Action::Receive { .. } => Transition::Receive,
            Action::Redrive => Transition::Redrive,
            Action::SweepPending(_) => Transition::SweepPending,
            Action::SweepFulfilment(_) => Transition::SweepFulfilment,
            Action::SweepAction(_) => Transition::SweepAction,
            Action::Deliver(_) => Transition::Deliver,
            Action::EventLost(_) => Transition::EventLost,
            Action::Authenticate { .. } => Transition::Authenticate,
            Action::DeadlinePasses(_) => Transition::DeadlinePasses,
            Action::Upsert(_) => Transition::Upsert,
            Action::LeaseExpires(_) => Transition::LeaseExpires,
            Action::HoldCanceledOutside(_) => Transition::HoldCanceledOutside,
            Action::HoldLapses(_) => Transition::HoldLapses,
            Action::KeysExpire => Transition::KeysExpire,
            Action::CreateRuns { .. } => Transition::CreateRuns,
            Action::ConfirmEnds(_) => Transition::ConfirmEnds,
            Action::ReleaseFailedHold(_) => Transition::ReleaseFailedHold,
        }
    }

    /// The kind of a job's next step in a state: a commit that accepts the order and takes its
    /// units in the same statement is [`Transition::ReserveAtCommit`]; a reservation that ends
    /// an order on a hold past its deadline is [`Transition::Lapse`].
    fn transition_of_step(&self, state: &State, job: Job) -> Transition {
        if let Job::Advance(order, Advance::Reserve) = job
            && self.lapses(state.order(order))
        {
            return Transition::Lapse;
        }
        let commits_from = match job {
            Job::Authorize(order, Auth::Record(Found::Holding(_))) => {
                Some((order, Status::PendingAuthorization))
            }
            Job::Settle(order, Settle::Authorize) => Some((order, Status::RequiresAction)),
            _ => None,
        };
        let reserves = commits_from.is_some_and(|(order, from)| {
            state.order(order).status == from
                && self.rules.commit.reserves(&state.product, self.quantity(order))
        });
        if reserves { Transition::ReserveAtCommit } else { Self::transition_of(job) }
    }

    /// The kind of a job's next step.
    fn transition_of(job: Job) -> Transition {
        match job {
            Job::Authorize(_, Auth::Create { .. }) => Transition::Create,
            Job::Authorize(_, Auth::List { .. }) => Transition::List,
            Job::Authorize(_, Auth::NextAttempt { .. }) => Transition::AuthorizeNextAttempt,
            Job::Authorize(_, Auth::Record(_)) => Transition::RecordAuthorization,
            Job::Advance(_, Advance::Load | Advance::Reserve) => Transition::Reserve,
            Job::Advance(_, Advance::Capture { .. }) => Transition::Capture,
            Job::Advance(_, Advance::Retrieve { .. }) => Transition::RetrieveAfterFailure,
            Job::Advance(_, Advance::NextAttempt { .. }) => Transition::SettleNextAttempt,
            Job::Advance(_, Advance::RecordPaid) => Transition::RecordPaid,
            Job::Advance(_, Advance::FailCapture { .. }) => Transition::FailCapture,
            Job::Advance(_, Advance::Cancel { .. }) => Transition::Cancel,
            Job::Advance(_, Advance::MarkReleased) => Transition::MarkReleased,
            Job::Settle(_, Settle::Read) => Transition::ReadAction,
            Job::Settle(_, Settle::Release { .. }) => Transition::ReleaseAction,
            Job::Settle(_, Settle::Decline | Settle::Authorize) => Transition::RecordAction,
            Job::Hook(_, Hook::Read) => Transition::ReadHold,
            Job::Hook(_, Hook::LoseHold) => Transition::LoseHold,
        }
    }

    /// Whether nothing can happen any more: where "eventually" is judged.
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
        actions.into_iter().all(|action| self.next_state(state, action).is_none())
    }

    // ---- Stripe -------------------------------------------------------------------------

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

    fn create(&self, s: &mut State, order: Buyer, attempt: u8, net: Net) -> Reply {
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

    fn capture(s: &mut State, order: Buyer, attempt: u8, intent: IntentId, net: Net) -> Reply {
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
    fn cancel(&self, s: &mut State, order: Buyer, attempt: u8, intent: IntentId, net: Net) -> Reply {
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

    // ---- authorizing (the intake, the sweeper) ------------------------------------------

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

    fn authorize_step(&self, s: &mut State, order: Buyer, auth: Auth, net: Net) -> Next<Auth> {
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
            // Made, its confirm not ended: not final (issue 43, point 1).
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
    fn resume(&self, o: &Order) -> Auth {
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
    /// stock; either way with its stock-check message, which says which (issue 34).
    fn accept(&self, s: &mut State, order: Buyer) {
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

    // ---- fulfilling (the stock worker, the sweeper) -------------------------------------

    /// Whether the fleet ends this order for its hold past its deadline rather than reserving
    /// it: an `authorized` order whose row says so, under [`LapseRule::KnownDeadline`].
    fn lapses(&self, o: &Order) -> bool {
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
    fn advance_step(&self, s: &mut State, order: Buyer, step: Advance, net: Net) -> Option<Next<Advance>> {
        let quantity = self.quantity(order);
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
                let o = s.order_mut(order);
                if o.status != Status::StockReserved {
                    return Some(Next::Go(Advance::Load));
                }
                // A hold that is gone (it lapsed, or was cancelled outside) is not a failed
                // capture: `authorization_canceled`, released, with nothing to cancel.
                o.status = if canceled { Status::AuthorizationCanceled } else { Status::CaptureFailed };
                o.released |= canceled;
                s.product.stock += quantity as i8;
                s.product.promised -= quantity;
                if canceled {
                    return Some(Next::End(Done::Settled));
                }
                Next::Go(Advance::Cancel { attempt, intent })
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

    /// The stock check's first read: where the order's row says to go on from. A failed order
    /// whose hold is not released yet is released: one rejected, one whose capture failed, and
    /// (since issue 35, point 8) one `authorization_canceled` for a hold past its deadline. The
    /// other moves to `authorization_canceled` record the hold released with them; before, the
    /// code released none of them (no such order was unreleased then).
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
            (Status::Paid | Status::Refunded | Status::PaymentDeclined, _) => Next::End(Done::Settled),
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

    // ---- 3-D Secure and the webhook ---------------------------------------------------

    /// Settling a `requires_action` order whose lease is held, from its intent read fresh
    /// ([`orderfleet::domain::action::settle`]). The lease is given back unless the order moved.
    fn settle_step(&self, s: &mut State, order: Buyer, step: Settle, net: Net) -> Next<Settle> {
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
        if let Next::End(Done::Later | Done::GaveUp) = next {
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

    /// The order's attempt and recorded intent.
    fn attempt_and_intent(s: &State, order: Buyer) -> (u8, IntentId) {
        let o = s.order(order);
        (o.attempt, o.intent.expect("an order past pending has its intent"))
    }

    /// The intent read fresh, and the clock: the module table of
    /// [`orderfleet::domain::action`] (every intent in the model is its order's own).
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

    /// `payment_intent.canceled` for an `authorized` or `stock_reserved` order (most orders
    /// are `stock_reserved` from their commit): its intent read fresh, and if it is cancelled,
    /// `authorization_canceled` with the units back, and the stock too if it was taken
    /// ([`orderfleet::domain::webhook`]'s `hold_canceled`, `lose_hold`).
    fn hook_step(&self, s: &mut State, order: Buyer, step: Hook, net: Net) -> Next<Hook> {
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

    /// Stripe delivers an event ([`orderfleet::domain::webhook::apply`]): about the order's own
    /// intent, it settles a `requires_action` order (taking its lease: `None`, a 503 and a
    /// redelivery, while another holds it) or looks at an `authorized` or `stock_reserved` one's cancelled hold;
    /// anything else changes nothing (a stray intent's release is not modelled).
    fn deliver(s: &mut State, event: Event) -> Option<()> {
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
    fn webhook_step(&self, s: &mut State, net: Net) {
        let (event, job) = s.webhook.expect("a stepping webhook has an event");
        match self.job_step(s, job, net).expect("settling never waits for the line") {
            Next::Go(job) => s.webhook = Some((event, job)),
            Next::End(done) => {
                s.webhook = None;
                if let Done::Later = done {
                    s.events.push(event);
                    s.events.sort_unstable();
                }
            }
        }
    }

    // ---- the buyer's request ------------------------------------------------------------

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

    fn request_step(&self, s: &mut State, buyer: Buyer, net: Net) {
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

    /// Whether no process is in the middle of a job.
    fn all_idle(s: &State) -> bool {
        s.buyers.iter().all(|b| !matches!(b.request, Request::Working(_)))
            && s.workers.iter().all(Option::is_none)
            && s.sweeper.is_none()
            && s.webhook.is_none()
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
            orders: vec![None; n],
            buyers: vec![
                BuyerState {
                    request: Request::Idle,
                    sent: 0,
                    answer: None,
                    first: None,
                    accepted_before: 0
                };
                n
            ],
            messages: vec![Messages::default(); n],
            workers: vec![None; usize::from(self.scenario.workers)],
            sweeper: None,
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
        Self::worker_actions(s, actions);
        self.sweeper_actions(s, actions);
        Self::webhook_actions(s, actions);
        self.environment_actions(s, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Send(b) => Self::send(&mut s, b),
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
            _ => self.outside(&mut s, action),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}

/// The actions each state offers, by who takes them.
impl OrderProtocol {
    /// Each buyer sends (a retry within the budget), or its request takes its next step.
    fn buyer_actions(s: &State, actions: &mut Vec<Action>) {
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

    /// A busy worker takes its job's next step; an idle one receives any visible copy.
    fn worker_actions(s: &State, actions: &mut Vec<Action>) {
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

    /// A busy sweeper takes its job's next step; an idle one takes up an order with no lease
    /// left pending, or (when it sweeps everything) one left unsettled.
    fn sweeper_actions(&self, s: &State, actions: &mut Vec<Action>) {
        if let Some(job) = s.sweeper {
            return Self::step_actions(s, Proc::Sweeper, Some(job), actions);
        }
        for (id, o) in s.existing() {
            if o.status == Status::PendingAuthorization && o.lease.is_none() {
                actions.push(Action::SweepPending(id));
            }
            // Past its deadline, or not looked at for a while: any moment.
            if o.status == Status::RequiresAction && o.lease.is_none() {
                actions.push(Action::SweepAction(id));
            }
            // Failed holding a hold not yet released (`authorization_canceled` only for a hold
            // past its deadline: every other way there records it released).
            let unreleased = !o.released
                && matches!(
                    o.status,
                    Status::RejectedOutOfStock | Status::CaptureFailed | Status::AuthorizationCanceled
                );
            let unsettled = matches!(o.status, Status::Authorized | Status::StockReserved) || unreleased;
            if unsettled && self.scenario.sweeper == Sweeps::Everything {
                actions.push(Action::SweepFulfilment(id));
            }
        }
    }

    /// A busy webhook takes its job's next step; an idle one is delivered any pending event,
    /// or Stripe gives one up (within the budget).
    fn webhook_actions(s: &State, actions: &mut Vec<Action>) {
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

    /// What happens at Stripe to each intent, and to each create it is still executing: holds
    /// cancelled or lapsing, buyers at their 3-D Secure, creates running and confirms ending,
    /// and the safety net's cancels.
    fn stripe_actions(&self, s: &State, actions: &mut Vec<Action>) {
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
            // buyer, is cancelled by the reconciliation or the webhook.
            let live = matches!(intent.status, IntentStatus::RequiresCapture | IntentStatus::RequiresAction);
            if self.rules.safety_net && live && o.status.has_failed() && o.intent == Some(i) {
                actions.push(Action::ReleaseFailedHold(i));
            }
        }
    }
}

/// The transitions of [`Model::next_state`] longer than a few lines.
impl OrderProtocol {
    /// A buyer sends its request (again, within the retry budget), remembering which
    /// buyers had been accepted before it (§8.7's arrival order).
    fn send(s: &mut State, b: Buyer) {
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

    /// Worker `w`'s next step; a job that ends unsettled leaves its message to come back.
    /// A stock check whose order must wait for the line is done with: its message deleted,
    /// the order waiting in the worker's line (`stock_worker::line`), which tries it again
    /// as the sweeper does and leaves it to the sweeper at a stop; here the sweeper stands
    /// for both.
    fn worker_step(&self, s: &mut State, w: u8, net: Net) {
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

    fn sweeper_step(&self, s: &mut State, net: Net) {
        let job = s.sweeper.expect("a stepping sweeper has a job");
        // An order whose turn waits on the line is left for the next sweep
        // (`waiting_for_the_line` is a transient failure to the sweeper).
        let Some(next) = self.job_step(s, job, net) else {
            s.sweeper = None;
            return;
        };
        match next {
            Next::Go(job) => s.sweeper = Some(job),
            Next::End(done) => {
                s.sweeper = None;
                if let Done::Stuck = done {
                    s.order_mut(job.order()).stuck = true;
                }
            }
        }
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

    /// A worker receives a visible copy, unless it has been received too often: then SQS
    /// moves it to the DLQ instead of delivering it. A message that says the order was
    /// reserved at its commit is captured at once, under the attempt it names, without reading
    /// the order (issue 34); any other is gone on with from the order as read.
    fn receive(s: &mut State, worker: u8, order: Buyer, receives: u8) {
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

    /// The operator's upsert `i`, applied when `fleetctl` would accept it.
    fn upsert(&self, s: &mut State, i: u8) {
        s.upserts_done |= 1 << i;
        let asked = self.scenario.upserts[usize::from(i)];
        if self.upsert_accepted(s, asked) {
            let p = &mut s.product;
            p.stock += asked as i8 - p.total as i8;
            p.total = asked;
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
    fn outside(&self, s: &mut State, action: Action) {
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
}

impl OrderProtocol {
    /// `fleetctl product upsert`'s check ([`orderfleet::domain::product::upsert`]).
    fn upsert_accepted(&self, s: &State, asked: u8) -> bool {
        let taken = s.product.total as i8 - s.product.stock;
        if (asked as i8) < taken {
            return false;
        }
        match self.rules.cut {
            CutRule::AboveTaken => true,
            CutRule::KeepTheLineServed => {
                let last_served =
                    s.existing().filter(|(_, o)| o.status.has_taken()).map(|(_, o)| o.position).max();
                let least: u8 = match last_served {
                    None => 0,
                    Some(last) => s
                        .existing()
                        .filter(|(_, o)| o.position <= last && o.status.holds_a_promise())
                        .map(|(id, _)| self.quantity(id))
                        .sum(),
                };
                asked >= least
            }
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
