//! `make test` runs these. Every scenario under the code's rules keeps every property (each
//! prints the states it visited and the time it took). Under the rules as they were before
//! three fixes, and under two defects planted on purpose, the checker finds the defect, and
//! prints the path.

use order_model::check::{check, find_a_counterexample};
use order_model::model::{CutRule, IdempotencyRule, LineRule, ResumeRule, Scenario, SettleRule};
use order_model::properties::{NEVER_A_DECLINE, ONE_AUTHORIZATION, REJECTED_IN_LINE, THREE_D_SECURE};
use order_model::{OrderProtocol, Rules, scenarios};

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
    the_resume_rule_places_a_second_hold(ResumeRule::SearchBeforeTheResend);
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
