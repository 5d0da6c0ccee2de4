//! The intake against its own OpenAPI document: the document it serves is the one
//! committed, and Schemathesis, generating requests from it, finds no answer outside it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use orderfleet_tests::Fleet;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The checks the issue names: server errors, status codes, content types, response schemas
/// and response headers.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance";

/// What one Schemathesis run counted.
#[derive(Debug)]
struct Run {
    passed: bool,
    /// The status of every request it sent.
    statuses: Vec<u64>,
    output: String,
}

/// Runs Schemathesis (scripts/schemathesis.sh: pinned, in its own virtualenv) against the
/// live intake with `headers`, every phase, a fixed seed so a failure can be reproduced. One
/// worker: with several (threads), Hypothesis's lambda descriptions call `ast.parse` from
/// several threads at once, and CPython 3.11 then raises a spurious "AST constructor recursion
/// depth mismatch" (python/cpython#106905), seen here as a Runtime Error of the coverage phase.
fn schemathesis(intake_url: &str, log_dir: &Path, name: &str, headers: &[String], max_examples: u32) -> Run {
    let report = log_dir.join(format!("schemathesis-{name}.har"));
    let mut command = Command::new(repo().join("scripts/schemathesis.sh"));
    command
        .args(["run", &format!("{intake_url}/openapi.json")])
        .args(["--checks", CHECKS])
        .args(["--max-examples", &max_examples.to_string()])
        .args(["--seed", "19", "--workers", "1", "--request-timeout", "30", "--no-color"])
        .args(["--report", "har", "--report-har-path"])
        .arg(&report);
    for header in headers {
        command.args(["-H", header]);
    }
    // Without a token, only the token's routes: Stripe's webhook endpoint takes none (its
    // signature instead) and answers 400 or 503, never 401.
    if headers.iter().all(|h| !h.starts_with("Authorization: Bearer ey")) {
        command.args(["--include-tag", "orders"]);
    }
    let out = command.output().expect("scripts/schemathesis.sh runs");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The HAR holds one entry per request it sent.
    let har: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default()).unwrap_or_default();
    let statuses = har["log"]["entries"]
        .as_array()
        .map(|entries| entries.iter().filter_map(|e| e["response"]["status"].as_u64()).collect())
        .unwrap_or_default();
    Run { passed: out.status.success(), statuses, output }
}

/// The summary lines of a run's output, for the test's own output.
fn summary(output: &str) -> String {
    output
        .lines()
        .filter(|l| {
            [
                "API Operations",
                "Test Phases",
                "Test cases",
                "passed",
                "failed",
                "Seed",
                "No issues",
                "Failures",
                "Errors",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The document the intake serves is the committed one (docs/openapi.json).
#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_answer_outside_the_committed_document() {
    // Arrange: a product with plenty of units, and a buyer's token.
    let mut fleet = Fleet::prepare("contract").await.unwrap();
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1000, 1_000_000).await.unwrap();
    let token = fleet.token("schemathesis");

    // Act
    let served = fleet.http.get(format!("{}/openapi.json", fleet.intake_url)).send().await.unwrap();
    let content_type = served.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let served = served.text().await.unwrap();
    let (url, log_dir) = (fleet.intake_url.clone(), fleet.log_dir().to_owned());
    let runs = tokio::task::spawn_blocking(move || {
        [
            ("token", vec![format!("Authorization: Bearer {token}")], 150),
            ("no-token", vec![], 25),
            ("bad-token", vec!["Authorization: Bearer not.a.token".to_owned()], 25),
        ]
        .map(|(name, headers, examples)| (name, schemathesis(&url, &log_dir, name, &headers, examples)))
    })
    .await
    .unwrap();

    // Assert: the document served is the one in docs/, and each run found nothing.
    let committed = std::fs::read_to_string(repo().join("docs/openapi.json")).unwrap();
    assert_eq!(content_type.as_deref(), Some("application/json"));
    assert!(served == committed, "GET /openapi.json differs from docs/openapi.json");
    for (name, run) in &runs {
        let mut counts = std::collections::BTreeMap::new();
        for status in &run.statuses {
            *counts.entry(status).or_insert(0) += 1;
        }
        println!(
            "contract: schemathesis {name}: requests={} by status {counts:?} passed={}\n{}",
            run.statuses.len(),
            run.passed,
            summary(&run.output)
        );
        assert!(run.passed, "schemathesis ({name}) found failures:\n{}", run.output);
    }
    // Also where `make test` prints it after the suite (a passing test's output is captured).
    let counts: Vec<String> = runs
        .iter()
        .map(|(name, run)| format!("{name}: {} requests, passed={}", run.statuses.len(), run.passed))
        .collect();
    std::fs::write(
        fleet.log_dir().join("schemathesis-summary.txt"),
        format!("schemathesis against the live intake: {}\n", counts.join("; ")),
    )
    .unwrap();
    let (_, with_token) = &runs[0];
    assert!(with_token.statuses.len() >= 1_000, "only {} requests with a token", with_token.statuses.len());
    assert!(with_token.statuses.contains(&202), "no order was accepted: the fuzz never got past the edge");
    for (name, run) in &runs[1..] {
        assert!(run.statuses.len() >= 20, "{name}: only {} requests", run.statuses.len());
        assert!(
            run.statuses.iter().all(|s| *s == 401),
            "{name}: not every answer was 401: {:?}",
            run.statuses
        );
    }
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();
    fleet.stop().await.unwrap();
}
