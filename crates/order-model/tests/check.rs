//! `make test` runs these. Every scenario under the code's rules keeps every property (each
//! prints the states it visited and the time it took). Under the rules as they were before
//! three fixes, and under two defects planted on purpose, the checker finds the defect, and
//! prints the path.

use std::collections::{HashSet, VecDeque};

use order_model::check::{check, find_a_counterexample, narrate};
use order_model::model::Action;
use order_model::model::{CutRule, IdempotencyRule, LineRule, ResumeRule, Scenario, SettleRule};
use order_model::properties::{NEVER_A_DECLINE, ONE_AUTHORIZATION, REJECTED_IN_LINE, THREE_D_SECURE};
use order_model::state::{Op, Reply, State, Status};
use order_model::{OrderProtocol, Rules, scenarios};
use stateright::{Checker, HasDiscoveries, Model, Property};

/// Checks the scenario under `rules` until it breaks `property`; prints and returns the path.
fn broken_under(scenario: Scenario, rules: Rules, property: &str) -> String {
    let report = find_a_counterexample(OrderProtocol { scenario, rules });
    eprintln!("{report} (under {rules:?})");
    let (_, told) = report
        .counterexamples
        .iter()
        .find(|(broken, _)| *broken == property)
        .unwrap_or_else(|| panic!("no counterexample of {property:?} under {rules:?}"));
    eprintln!("{property}, broken by:\n{told}");
    told.clone()
}

/// Every scenario ([`scenarios::models`]) under the code's rules, so a scenario added there is
/// checked without a test of its own. Each is checked even when one before it broke a
/// property; the test then fails naming every scenario and property broken, each
/// counterexample told above.
#[test]
fn every_scenario_keeps_every_guarantee() {
    let mut broken = Vec::new();
    for model in scenarios::models() {
        let report = check(model);
        eprintln!("{report}");
        for (property, told) in &report.counterexamples {
            eprintln!("\n{property}, broken by:\n{told}");
            broken.push(format!("{}: {property}", report.name));
        }
    }
    assert!(broken.is_empty(), "broken: {broken:?}");
}

#[test]
fn the_stock_workers_rule_before_e5dc31d_rejects_an_order_behind_a_pending_one_that_is_then_declined() {
    let rules = Rules { line: LineRule::PendingAheadTakes, ..Rules::NOW };
    let told = broken_under(scenarios::a_cut_behind_a_pending_order(), rules, REJECTED_IN_LINE);
    // The order behind (B) is rejected while the one ahead (A) is pending; A is then declined.
    assert!(told.contains("B#2 x1 RejectedOutOfStock"), "{told}");
    assert!(told.contains("A#1 x1 PaymentDeclined"), "{told}");
}

#[test]
fn the_upserts_rule_before_e5dc31d_lets_a_cut_reject_an_order_ahead_of_one_already_served() {
    let rules = Rules { cut: CutRule::AboveTaken, ..Rules::NOW };
    let told = broken_under(scenarios::a_cut_after_a_later_order_was_served(), rules, REJECTED_IN_LINE);
    assert!(told.contains("Upsert"), "{told}");
}

/// The second hold both resume rules before 6376119 let through: Stripe failing, a create
/// that took effect and answered 500 went unseen, and the next attempt held the funds again.
fn the_resume_rule_places_a_second_hold(resume: ResumeRule) {
    let rules = Rules { resume, ..Rules::NOW };
    let told = broken_under(scenarios::stripe_failing(), rules, ONE_AUTHORIZATION);
    assert!(told.contains("Error500AfterEffect"), "{told}");
}

#[test]
fn the_resume_rule_before_bbf9d45_places_a_second_hold_when_its_resent_key_answers_a_500_after_taking_effect()
{
    the_resume_rule_places_a_second_hold(ResumeRule::ListBeforeTheResend);
}

/// A defect planted on purpose: past the deadline, a settle that records
/// `authentication_timed_out` and gives the units back without cancelling the intent first.
/// The buyer completes 3-D Secure at the deadline, after the record: a hold is left on a
/// declined order, whose unit went to the next buyer.
#[test]
fn a_settle_that_times_out_without_cancelling_first_leaves_a_hold_on_a_declined_order() {
    let rules = Rules { settle: SettleRule::TimeOutWithoutCancel, ..Rules::NOW };
    let told = broken_under(scenarios::three_d_secure(), rules, THREE_D_SECURE);
    // The deadline passed, the order was declined, then its buyer authenticated: A's intent
    // holds funds on a declined order at the end.
    assert!(told.contains("DeadlinePasses(0)"), "{told}");
    let end = told.lines().last().expect("a path");
    assert!(end.contains("x1 PaymentDeclined") && end.contains(" A: RequiresCapture"), "{told}");
    assert!(told.contains("ok: true }"), "{told}");
}

/// A second defect planted on purpose: a create's `idempotency_error` (its key re-sent with
/// other parameters after a deploy) read as a decline. The key ran before (here its 500 was
/// saved, and the intake died before recording it): a card that authorizes is declined, and
/// had the first run held funds, the hold would be left too.
#[test]
fn an_idempotency_error_read_as_a_decline_declines_a_card_that_authorized() {
    let rules = Rules { idempotency_error: IdempotencyRule::AsADecline, ..Rules::NOW };
    let told = broken_under(scenarios::stripe_failing(), rules, NEVER_A_DECLINE);
    assert!(told.contains("OtherParameters"), "{told}");
    assert!(told.lines().last().is_some_and(|end| end.contains("A#1 x1 PaymentDeclined")), "{told}");
}

/// The model on the fleet's rules, with one more property to look for: a state.
struct Probe {
    model: OrderProtocol,
    looking_for: fn(&State) -> bool,
}

impl Model for Probe {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.model.init_states()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.model.actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.model.next_state(state, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::sometimes("the state looked for", |probe: &Probe, s: &State| (probe.looking_for)(s))]
    }
}

/// A state where order A waits in `requires_action`, nobody at work, its buyer having failed
/// 3-D Secure, and the key of the settle's cancel holding a saved 500.
fn a_cancel_500_saved_on_a_failed_authentication(s: &State) -> bool {
    let Some(a) = s.orders[0].as_ref() else { return false };
    let failed = a.intent.is_some_and(|i| {
        s.stripe.intents[usize::from(i)].status == order_model::state::IntentStatus::RequiresPaymentMethod
    });
    a.status == Status::RequiresAction
        && failed
        && a.lease.is_none()
        && s.sweeper.is_none()
        && s.webhook.is_none()
        && s.stripe.saved((Op::Cancel, 0, a.attempt)) == Some(Reply::Error500)
}

/// Found by modelling issue 33 (a liveness defect, which the properties "at the end" cannot
/// judge: the sweeper can always go round again). On the rule before the fix
/// (`SettleRule::CancelFirstSameKeyAfterA5xx`), a settle's cancel that Stripe answers 500 is
/// not followed by a new attempt, as fulfilment's cancel is
/// (`Fulfilment::after_a_failed_attempt`): every later settle re-sends it under the same key
/// and gets the saved 500 again, for as long as Stripe keeps the key (24 h). Here the buyer
/// failed 3-D Secure, and the order stays `requires_action`, its unit held and counted as
/// pending ahead in line, whatever the sweeper and the webhook do, until Stripe forgets the
/// key. The fix (`action::release_intent`) is checked by the next test.
#[test]
fn the_settle_rule_before_the_fix_keeps_an_order_requires_action_after_its_cancel_answered_a_saved_500() {
    let rules = Rules { settle: SettleRule::CancelFirstSameKeyAfterA5xx, ..Rules::NOW };
    let model = OrderProtocol { scenario: scenarios::three_d_secure(), rules };
    let probe = Probe { model: model.clone(), looking_for: a_cancel_500_saved_on_a_failed_authentication };
    let checker = probe.checker().threads(2).finish_when(HasDiscoveries::Any).spawn_bfs().join();
    let path = checker.discovery("the state looked for").expect("the state is reachable");
    let stuck = path.last_state().clone();
    eprintln!("reached by:\n{}", narrate(&model, path));
    // Every state reachable from it while Stripe keeps its keys has A still `requires_action`.
    let reachable = reachable_while_stripe_keeps_its_keys(&model, stuck);
    for state in &reachable {
        assert_eq!(state.orders[0].as_ref().map(|a| a.status), Some(Status::RequiresAction), "A left");
    }
    eprintln!(
        "{} states reachable from it before Stripe forgets the key: A is requires_action in each",
        reachable.len()
    );
}

/// Every state reachable from `start` (itself included) by any step but Stripe forgetting its
/// idempotency keys.
fn reachable_while_stripe_keeps_its_keys(model: &OrderProtocol, start: State) -> Vec<State> {
    let mut seen = HashSet::from([start.clone()]);
    let mut reached = Vec::new();
    let mut next = VecDeque::from([start]);
    while let Some(state) = next.pop_front() {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        for action in actions.into_iter().filter(|a| *a != Action::KeysExpire) {
            if let Some(after) = model.next_state(&state, action)
                && seen.insert(after.clone())
            {
                next.push_back(after);
            }
        }
        reached.push(state);
    }
    reached
}

/// The fix: on the fleet's rule now, an order that waits in `requires_action` with its current
/// attempt's cancel key holding a saved 500 (reached when the 500's own answer was lost, so the
/// settle did not see it) leaves `requires_action` without Stripe forgetting the key: the next
/// settle meets the replayed 500, reads the intent and moves the order on.
#[test]
fn now_a_settle_whose_cancel_answered_a_saved_500_moves_its_order_on_without_stripe_forgetting_the_key() {
    let model = OrderProtocol { scenario: scenarios::three_d_secure(), rules: Rules::NOW };
    let probe = Probe { model: model.clone(), looking_for: a_cancel_500_saved_on_a_failed_authentication };
    let checker = probe.checker().threads(2).finish_when(HasDiscoveries::Any).spawn_bfs().join();
    let Some(path) = checker.discovery("the state looked for") else { return };
    let reachable = reachable_while_stripe_keeps_its_keys(&model, path.last_state().clone());
    let left =
        reachable.iter().any(|s| s.orders[0].as_ref().map(|a| a.status) != Some(Status::RequiresAction));
    assert!(
        left,
        "A stays requires_action in all {} states reachable before Stripe forgets its keys",
        reachable.len()
    );
}
