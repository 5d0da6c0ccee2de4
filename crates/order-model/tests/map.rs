//! The maps to the code stay true: the model's (its README.md), where every transition has its
//! row, and the README's "How an order flows", where every step links its files; every function
//! a row names is still defined in its file. Renaming or
//! removing one fails here, pointing at the row to look at again.

use std::path::{Path, PathBuf};

use order_model::model::Transition;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file, and the functions a row names in it.
type Place = (String, Vec<String>);

/// The table's rows: the transition, then each file with the functions named in it.
fn rows() -> Vec<(String, Vec<Place>)> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    table(&readme, "## Transitions and the code that implements them")
}

/// The README's "How an order flows": each step of an order, then each file with the functions
/// named in it.
fn flow() -> Vec<(String, Vec<Place>)> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    table(&readme, "## How an order flows")
}

/// The rows of the table under `heading` (up to the next heading) whose first cell is ticked:
/// `` | `name` | `file`: `function`, …; `file`: … | ``. A file may be a link,
/// `` [`file`](file) ``: only the ticked parts are read.
fn table(markdown: &str, heading: &str) -> Vec<(String, Vec<Place>)> {
    let section = markdown.split(heading).nth(1).expect("the section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`').to_owned();
            let places = cells[2]
                .split(';')
                .map(|place| {
                    let mut ticked = place.split('`').skip(1).step_by(2).map(str::to_owned);
                    let file = ticked.next().expect("a file first");
                    (file, ticked.filter(|t| !t.contains('/')).collect())
                })
                .collect();
            (name, places)
        })
        .collect()
}

/// The functions a table names that its files no longer define, one line each.
fn missing_in(rows: Vec<(String, Vec<Place>)>) -> Vec<String> {
    let mut missing = Vec::new();
    for (name, places) in rows {
        for (file, functions) in places {
            let source = std::fs::read_to_string(workspace().join(&file))
                .unwrap_or_else(|e| panic!("{name}: cannot read {file}: {e}"));
            assert!(!functions.is_empty(), "{name}: {file} names no function");
            for function in functions {
                if !defines(&source, &function) {
                    missing.push(format!("{name}: {file} no longer defines {function}"));
                }
            }
        }
    }
    missing
}

/// Whether `source` defines `function`, or `Type::function` in an `impl` of `Type`.
fn defines(source: &str, function: &str) -> bool {
    let (owner, name) = match function.split_once("::") {
        Some((owner, name)) => (Some(owner), name),
        None => (None, function),
    };
    let has_fn = source.lines().any(|line| {
        let line = line.trim_start();
        let line = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
            .or_else(|| line.strip_prefix("pub(super) "))
            .unwrap_or(line);
        let line = line.strip_prefix("async ").unwrap_or(line);
        line.strip_prefix("fn ").is_some_and(|rest| {
            rest.strip_prefix(name).is_some_and(|after| after.starts_with('(') || after.starts_with('<'))
        })
    });
    let has_owner = owner.is_none_or(|owner| {
        source.lines().any(|line| {
            line.starts_with("impl")
                && line.split(|c: char| !c.is_alphanumeric() && c != '_').any(|word| word == owner)
        })
    });
    has_fn && has_owner
}

#[test]
fn every_transition_of_the_model_is_mapped_to_the_code() {
    let mapped: Vec<String> = rows().into_iter().map(|(transition, _)| transition).collect();
    for transition in Transition::ALL {
        let name = format!("{transition:?}");
        assert!(mapped.contains(&name), "README.md maps no code to the model's transition {name}");
    }
    assert_eq!(
        mapped.len(),
        Transition::ALL.len(),
        "a row for a transition the model does not have: {mapped:?}"
    );
}

#[test]
fn every_function_the_map_names_still_exists_where_it_says() {
    let missing = missing_in(rows());
    assert!(missing.is_empty(), "the model's map to the code is out of date:\n{}", missing.join("\n"));
}

#[test]
fn the_readme_s_flow_links_every_step_to_the_functions_that_do_it() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let steps = flow();
    assert!(steps.len() >= 10, "the flow's table has {} steps", steps.len());
    for (step, places) in &steps {
        for (file, _) in places {
            assert!(readme.contains(&format!("[`{file}`]({file})")), "{step}: {file} is not a link");
        }
    }
    let missing = missing_in(steps);
    assert!(missing.is_empty(), "README.md's flow is out of date:\n{}", missing.join("\n"));
}

#[test]
fn the_check_of_the_map_notices_a_function_that_is_gone() {
    let source = "impl Sender {\n    pub async fn send(&self) {}\n}\nfn claim() {}\n";
    assert!(defines(source, "Sender::send"));
    assert!(defines(source, "claim"));
    assert!(!defines(source, "Sender::sends"));
    assert!(!defines(source, "Receiver::send"));
    assert!(!defines(source, "record"));
}
