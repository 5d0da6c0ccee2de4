//! `make test` runs these. Every scenario under the code's rules keeps every property (each
//! prints the states it visited and the time it took). Under the rules as they were before
//! each of four fixes, the checker finds the defect the fix was for, and prints the path.

use order_model::check::{check, find_a_counterexample};
use order_model::model::{CutRule, LineRule, ResumeRule, Scenario};
use order_model::properties::{ONE_AUTHORIZATION, REJECTED_IN_LINE};
use order_model::{OrderProtocol, Rules, scenarios};

/// Checks the scenario under the code's rules; fails with each counterexample told.
fn keeps_every_guarantee(scenario: Scenario) {
    let report = check(OrderProtocol { scenario, rules: Rules::NOW });
    eprintln!("{report}");
    for (property, told) in &report.counterexamples {
        eprintln!("\n{property}, broken by:\n{told}");
    }
    let broken: Vec<&str> = report.counterexamples.iter().map(|(property, _)| *property).collect();
    assert!(broken.is_empty(), "broken: {broken:?}");
}

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

#[test]
fn a_cut_in_the_line_keeps_every_guarantee() {
    keeps_every_guarantee(scenarios::a_cut_in_the_line());
}

#[test]
fn a_cut_behind_a_pending_order_keeps_every_guarantee() {
    keeps_every_guarantee(scenarios::a_cut_behind_a_pending_order());
}

#[test]
fn a_cut_after_a_later_order_was_served_keeps_every_guarantee() {
    keeps_every_guarantee(scenarios::a_cut_after_a_later_order_was_served());
}

#[test]
fn stripe_failing_keeps_every_guarantee() {
    keeps_every_guarantee(scenarios::stripe_failing());
}

#[test]
fn messages_without_the_sweepers_help_keep_every_guarantee() {
    keeps_every_guarantee(scenarios::messages_without_the_sweeper());
}

#[test]
fn holds_keys_and_leases_expiring_keep_every_guarantee() {
    keeps_every_guarantee(scenarios::time_passing());
}

#[test]
fn sizes_after_a_cut_keep_every_guarantee() {
    keeps_every_guarantee(scenarios::sizes_after_a_cut());
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

#[test]
fn the_resume_rule_before_bbf9d45_places_a_second_hold_when_its_resent_key_answers_a_500_after_taking_effect()
{
    let rules = Rules { resume: ResumeRule::SearchBeforeTheResend, ..Rules::NOW };
    let told = broken_under(scenarios::stripe_failing(), rules, ONE_AUTHORIZATION);
    assert!(told.contains("Error500AfterEffect"), "{told}");
}

#[test]
fn the_resume_rule_of_bbf9d45_places_a_second_hold_when_a_dated_send_goes_out_after_the_lag() {
    let rules = Rules { resume: ResumeRule::DatedBeforeTheSend, ..Rules::NOW };
    let told = broken_under(scenarios::stripe_failing(), rules, ONE_AUTHORIZATION);
    assert!(told.contains("Error500AfterEffect"), "{told}");
}
