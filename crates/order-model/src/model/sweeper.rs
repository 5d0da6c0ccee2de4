//! The sweeper: the orders an idle sweeper may take up (a pending one nobody holds, a
//! `requires_action` one nobody is settling, an accepted one short of its end or a failed one
//! whose hold is not released, when it sweeps everything), and its next step in the job it took
//! up (the take-up itself is in `mod.rs`'s `next_state`; the jobs are `authorization.rs`'s,
//! `action.rs`'s and `fulfilment.rs`'s). Mirrors the fleet's `domain::sweeper`.

use super::{Action, Done, Next, OrderProtocol, Proc, Sweeps};
use crate::state::*;

impl OrderProtocol {
    /// A busy sweeper takes its job's next step; an idle one takes up an order with no lease
    /// left pending, or (when it sweeps everything) one left unsettled. Passes that end at an
    /// error take up only pending orders (`sweep_pending` comes first in a pass).
    pub(super) fn sweeper_actions(&self, s: &State, actions: &mut Vec<Action>) {
        if let Some(job) = s.sweeper {
            return Self::step_actions(s, Proc::Sweeper, Some(job), actions);
        }
        for (id, o) in s.existing() {
            if o.status == Status::PendingAuthorization && o.lease.is_none() {
                actions.push(Action::SweepPending(id));
            }
            if s.sweeps_halted {
                continue;
            }
            // Past its deadline, or not looked at for a while: any moment. An order left for a
            // person after a refusal, its hold cancelled, is listed again by each pass and
            // nothing else: no step.
            let listed_only = o.refused
                && o.stuck
                && o.intent
                    .is_some_and(|i| s.stripe.intents[usize::from(i)].status == IntentStatus::Canceled);
            if o.status == Status::RequiresAction && o.lease.is_none() && !listed_only {
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

    pub(super) fn sweeper_step(&self, s: &mut State, net: Net) {
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
                match done {
                    Done::Stuck => s.order_mut(job.order()).stuck = true,
                    // The pass ends at the error, and each pass after meets the same order first.
                    Done::DatabaseError => s.sweeps_halted = true,
                    Done::Settled | Done::Later | Done::GaveUp => {}
                }
            }
        }
    }
}
