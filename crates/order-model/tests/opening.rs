//! The opening, model-checked (`order_model::opening`): every scenario keeps every property
//! under the code's rules, and the checker finds each defect planted in them (an opening two
//! processes can both take, a door that ignores the queue, a pause that stops the door alone,
//! a queue entry blind to the pause), printing the path.

use order_model::opening::{
    DOWN_THE_LINE, DRAWN_ONCE, DoorRule, NOTHING_WHILE_PAUSED, OpeningProtocol, OpeningRules,
    OpeningScenario, PauseRule, SOLD_OUT_IN_LINE, TakeRule, check, scenarios,
};

/// Checks the scenario under `rules`, and returns the path that broke `property`.
fn broken_under(scenario: OpeningScenario, rules: OpeningRules, property: &str) -> String {
    let report = check(OpeningProtocol { scenario, rules });
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
fn every_opening_scenario_keeps_every_guarantee() {
    let mut broken = Vec::new();
    for model in scenarios::models() {
        let report = check(model);
        eprintln!("{report}");
        assert!(report.states > 100, "{report}: too few states to have checked anything");
        for (property, told) in &report.counterexamples {
            eprintln!("\n{property}, broken by:\n{told}");
            broken.push(format!("{}: {property}", report.name));
        }
    }
    assert!(broken.is_empty(), "broken: {broken:?}");
}

/// Two openers that each read the product unopened, then draw without a condition, both draw.
#[test]
fn an_opening_two_processes_can_take_is_drawn_twice() {
    let rules = OpeningRules { opening: TakeRule::ReadThenWrite, ..OpeningRules::NOW };
    let told = broken_under(scenarios::two_openers_and_a_kill(), rules, DRAWN_ONCE);
    assert!(told.contains("Begin(0)") && told.contains("Begin(1)"), "{told}");
    assert!(told.contains("draws 2"), "{told}");
}

/// A door that counts only the units left promises a later buyer the unit a queued order
/// ahead waits for, and that order then ends sold_out with the units gone behind it.
#[test]
fn a_door_that_ignores_the_queue_promises_a_later_buyer_ahead_of_it() {
    let rules = OpeningRules { door: DoorRule::IgnoresTheQueue, ..OpeningRules::NOW };
    let told = broken_under(scenarios::units_coming_back_to_the_queue(), rules, DOWN_THE_LINE);
    assert!(told.contains("Door(3)"), "{told}");
    broken_under(scenarios::units_coming_back_to_the_queue(), rules, SOLD_OUT_IN_LINE);
}

/// A pause that stops only the door lets a unit that comes back during it go to the queue.
#[test]
fn a_pause_that_stops_only_the_door_promises_a_returned_unit_while_paused() {
    let rules = OpeningRules { pause: PauseRule::ServedWhilePaused, ..OpeningRules::NOW };
    let told = broken_under(scenarios::a_pause_at_any_moment(), rules, NOTHING_WHILE_PAUSED);
    assert!(told.contains("Pause") && told.contains("Authorize(0)"), "{told}");
}

/// A queue entry that does not read the pause takes entries while the product is paused.
#[test]
fn a_queue_entry_blind_to_the_pause_takes_an_entry_while_paused() {
    let rules = OpeningRules { pause: PauseRule::EntriesWhilePaused, ..OpeningRules::NOW };
    let told = broken_under(scenarios::a_pause_at_any_moment(), rules, NOTHING_WHILE_PAUSED);
    assert!(told.contains("Pause") && told.contains("Enter("), "{told}");
}
