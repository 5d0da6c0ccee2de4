//! The kind of each step ([`Transition`]), which README.md maps to the functions that take it
//! in the fleet (`tests/map.rs` keeps the map true), and which kind a step is in a state: a
//! commit that takes the order's units is a `ReserveAtCommit`, a reservation that ends an order
//! on a hold past its deadline a `Lapse`. It mirrors no one module of the fleet: each kind names
//! its own. (Not the fleet's `order::Transition`, a move of an order with its outbox rows.)

use super::{Action, OrderProtocol, Proc};
use crate::state::*;

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
    ReadStarts,
    ReadEnds,
    CommitRefused,
    ReleaseRefused,
    EndRefused,
}

impl Transition {
    /// Every kind, for the map's test.
    pub const ALL: [Transition; 46] = [
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
        Transition::ReadStarts,
        Transition::ReadEnds,
        Transition::CommitRefused,
        Transition::ReleaseRefused,
        Transition::EndRefused,
    ];
}

impl OrderProtocol {
    /// Which kind of transition an action is in a state (for the map to the code).
    pub fn transition(&self, state: &State, action: Action) -> Transition {
        match action {
            Action::Send(_) => Transition::Send,
            Action::Step(Proc::Request(b), _) => match state.buyers[usize::from(b)].request {
                Request::Sent if state.orders[usize::from(b)].is_some() => Transition::Resume,
                Request::Sent | Request::Idle | Request::Waiting => Transition::Door,
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
            Action::ReadStarts(_) => Transition::ReadStarts,
            Action::ReadEnds(_) => Transition::ReadEnds,
        }
    }

    /// The kind of a job's next step in a state: a commit that accepts the order and takes its
    /// units in the same statement is [`Transition::ReserveAtCommit`]; a reservation that ends
    /// an order on a hold past its deadline is [`Transition::Lapse`]; a settle's commit the
    /// database refuses is [`Transition::CommitRefused`].
    fn transition_of_step(&self, state: &State, job: Job) -> Transition {
        if let Job::Settle(order, step @ (Settle::Authorize | Settle::Decline)) = job
            && state.order(order).status == Status::RequiresAction
            && self.refuses(order, step == Settle::Authorize)
        {
            return Transition::CommitRefused;
        }
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
            Job::Settle(_, Settle::ReleaseRefused) => Transition::ReleaseRefused,
            Job::Settle(_, Settle::EndRefused { .. }) => Transition::EndRefused,
            Job::Hook(_, Hook::Read) => Transition::ReadHold,
            Job::Hook(_, Hook::LoseHold) => Transition::LoseHold,
        }
    }
}
