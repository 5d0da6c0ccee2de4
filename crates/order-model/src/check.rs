//! Running the checker over a scenario, and telling what it found in words.

use std::fmt::Write;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

use crate::model::{Action, OrderProtocol};
use crate::state::*;

/// What one check visited and found.
pub struct Report {
    /// The scenario's name.
    pub name: &'static str,
    /// States visited.
    pub states: usize,
    /// Distinct states visited.
    pub unique_states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// How long the check took.
    pub elapsed: Duration,
    /// Each property with a counterexample, and the counterexample told step by step.
    pub counterexamples: Vec<(&'static str, String)>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} states ({} distinct), depth {}, in {:.1} s; ",
            self.name,
            self.states,
            self.unique_states,
            self.max_depth,
            self.elapsed.as_secs_f64()
        )?;
        match self.counterexamples.len() {
            0 => write!(f, "every property holds"),
            n => write!(f, "{n} propert{} broken", if n == 1 { "y" } else { "ies" }),
        }
    }
}

/// Visits every state the scenario can reach (breadth first, so each counterexample is a
/// shortest one), on every core.
pub fn check(model: OrderProtocol) -> Report {
    run(model, false)
}

/// Like [`check`], but stops at the first counterexample found.
pub fn find_a_counterexample(model: OrderProtocol) -> Report {
    run(model, true)
}

fn run(model: OrderProtocol, first: bool) -> Report {
    let name = model.scenario.name;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if first {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let mut counterexamples: Vec<(&'static str, String)> =
        checker.discoveries().into_iter().map(|(property, path)| (property, narrate(&model, path))).collect();
    counterexamples.sort_by_key(|(property, _)| *property);
    Report {
        name,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        counterexamples,
    }
}

/// A counterexample, one line per step: what happened, then the state it left.
pub fn narrate(model: &OrderProtocol, path: Path<State, Action>) -> String {
    let mut told = String::new();
    let steps = path.into_vec();
    if let Some((first, _)) = steps.first() {
        let _ = writeln!(told, "  start: {}", summary(model, first));
    }
    for window in steps.windows(2) {
        let ((before, action), (after, _)) = (&window[0], &window[1]);
        let action = action.expect("every step but the last has its action");
        let kind = model.transition(before, action);
        let _ = writeln!(told, "  {kind:?} {action:?}\n      -> {}", summary(model, after));
    }
    told
}

const NAMES: [&str; 6] = ["A", "B", "C", "D", "E", "F"];

/// The state in one line: the product, each order, each intent.
fn summary(model: &OrderProtocol, s: &State) -> String {
    let p = &s.product;
    let mut line = format!("total {} promised {} stock {}", p.total, p.promised, p.stock);
    for (id, o) in s.existing() {
        let quantity = model.scenario.buyers[usize::from(id)].0;
        let _ = write!(line, " | {}#{} x{} {:?}", NAMES[usize::from(id)], o.position, quantity, o.status);
        if o.attempt > 1 {
            let _ = write!(line, " attempt {}", o.attempt);
        }
        if o.stuck {
            line.push_str(" stuck");
        }
        if o.refused {
            line.push_str(" refused");
        }
        if o.release_owed {
            line.push_str(" release owed");
        }
        if o.lapsed {
            line.push_str(" lapsed");
        }
        if o.old {
            line.push_str(" old");
        }
    }
    for (b, buyer) in s.buyers.iter().enumerate() {
        if buyer.request == Request::Waiting {
            let _ = write!(line, " | {} waits for a read", NAMES[b]);
        }
    }
    for (i, reads) in s.reads.iter().enumerate() {
        if reads.fast {
            let _ = write!(line, " | intake {i}'s fast path on");
        }
    }
    if s.sweeps_halted {
        line.push_str(" | the sweeps end at an error");
    }
    for (order, attempt) in &s.stripe.running {
        let _ = write!(line, " | {}'s create (attempt {attempt}) executing", NAMES[usize::from(*order)]);
    }
    for (i, intent) in s.stripe.intents.iter().enumerate() {
        let _ = write!(line, " | pi{i} {}: {:?}", NAMES[usize::from(intent.order)], intent.status);
    }
    line
}
