//! The rate limits and the request counts (SPEC §6): what a limited request is answered and
//! that it has no effect, the sliding second, the account's limit and each operation's, what
//! is counted and what is not, and the `/_sim/rate_limit` and `/_sim/stats` routes.

mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AUTHORIZE, Answer, TestSim, statuses};

/// Comfortably past the one-second window.
const PAST_THE_WINDOW: Duration = Duration::from_millis(1100);

fn stats(requests: u64, rate_limited: u64, max_requests_in_one_second: u64) -> Value {
    json!({
        "requests": requests,
        "rate_limited": rate_limited,
        "max_requests_in_one_second": max_requests_in_one_second,
    })
}

/// `GET /_sim/stats` without the counts by operation, to compare with [`stats`].
async fn totals(sim: &TestSim) -> Value {
    let mut stats = sim.stats().await;
    for by_endpoint in ["max_requests_in_one_second_by_endpoint", "requests_by_endpoint"] {
        let removed = stats.as_object_mut().and_then(|o| o.remove(by_endpoint));
        assert!(removed.is_some_and(|b| b.is_object()), "{by_endpoint}: {stats}");
    }
    stats
}

fn assert_rate_limited(answer: &Answer) {
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{}", answer.raw);
    assert_eq!(answer.error_type(), "invalid_request_error");
    assert_eq!(answer.error_code(), "rate_limit");
    let message = answer.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("Too many requests hit the API too quickly."), "{message}");
    assert_eq!(answer.header("stripe-should-retry"), Some("true"));
    assert!(answer.header("request-id").is_some_and(|id| id.starts_with("req_")));
}

#[tokio::test]
async fn a_burst_beyond_the_limit_is_answered_429_without_effect_and_counted() {
    let sim = TestSim::limited_to(5).await;

    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..12 {
        answers.push(sim.create(AUTHORIZE).await);
    }
    let took = started.elapsed();

    assert!(took < Duration::from_secs(1), "the burst took {took:?}, longer than the window");
    assert_eq!(statuses(&answers), [[200; 5].as_slice(), &[429; 7]].concat());
    answers[5..].iter().for_each(assert_rate_limited);
    assert_eq!(sim.intents().await.len(), 5, "limited creates create nothing");
    assert_eq!(totals(&sim).await, stats(12, 7, 12));
}

#[tokio::test]
async fn requests_are_admitted_again_once_the_second_has_passed() {
    let sim = TestSim::limited_to(2).await;

    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(sim.get("/v1/payment_intents/pi_missing").await);
    }
    tokio::time::sleep(PAST_THE_WINDOW).await;
    for _ in 0..3 {
        answers.push(sim.get("/v1/payment_intents/pi_missing").await);
    }

    // Admitted retrievals of an unknown intent are Stripe's 404.
    assert_eq!(statuses(&answers), [404, 404, 429, 404, 404, 429]);
    assert_eq!(totals(&sim).await, stats(6, 2, 3));
}

#[tokio::test]
async fn the_sim_routes_are_neither_limited_nor_counted_but_unknown_api_paths_are() {
    let sim = TestSim::limited_to(2).await;

    let first = sim.create(AUTHORIZE).await;
    for _ in 0..5 {
        for path in ["/_sim/payment_intents", "/_sim/faults", "/_sim/rate_limit", "/_sim/stats", "/healthz"] {
            let answer = sim.get_sim(path).await;
            assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.raw);
        }
        sim.set_rate_limit(2).await;
    }
    let unknown = sim.get("/v1/customers").await;
    let limited = sim.get("/v1/customers").await;

    assert_eq!(first.status, StatusCode::OK, "{}", first.raw);
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.raw);
    assert_rate_limited(&limited);
    assert_eq!(totals(&sim).await, stats(3, 1, 3));
}

#[tokio::test]
async fn zero_clears_the_limit_and_a_malformed_setting_is_a_400() {
    let sim = TestSim::limited_to(1).await;
    let admitted = sim.create(AUTHORIZE).await;
    let limited = sim.create(AUTHORIZE).await;

    sim.set_rate_limit(0).await;
    let mut unlimited = Vec::new();
    for _ in 0..5 {
        unlimited.push(sim.create(AUTHORIZE).await);
    }

    assert_eq!(admitted.status, StatusCode::OK, "{}", admitted.raw);
    assert_rate_limited(&limited);
    assert_eq!(statuses(&unlimited), [200; 5]);
    assert_eq!(sim.get_sim("/_sim/rate_limit").await.body, json!({"per_second": 0, "per_endpoint": 0}));

    sim.set_rate_limit(3).await;
    for malformed in
        [r#"{"per_second": -1}"#, r#"{"per_second": "5"}"#, r#"{"per_second": 1.5}"#, "{}", "five", ""]
            .into_iter()
            .chain([r#"{"per_endpoint": -1}"#, r#"{"per_second": 1, "per_endpoints": 2}"#])
    {
        let refused = sim.post_rate_limit(malformed).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{malformed}: {}", refused.raw);
        assert_eq!(refused.error_type(), "invalid_request_error", "{malformed}");
        assert_eq!(refused.body["error"]["param"], "per_second", "{malformed}");
    }
    assert_eq!(
        sim.get_sim("/_sim/rate_limit").await.body,
        json!({"per_second": 3, "per_endpoint": 0}),
        "left as it was"
    );
}

#[tokio::test]
async fn a_limited_create_does_not_use_up_its_idempotency_key() {
    let sim = TestSim::limited_to(1).await;
    let first = sim.create(AUTHORIZE).await;

    let limited = sim.post("/v1/payment_intents", AUTHORIZE, Some("order-7-authorize")).await;
    let intents_after_the_limited_create = sim.intents().await.len();
    tokio::time::sleep(PAST_THE_WINDOW).await;
    let retried = sim.post("/v1/payment_intents", AUTHORIZE, Some("order-7-authorize")).await;

    assert_eq!(first.status, StatusCode::OK, "{}", first.raw);
    assert_rate_limited(&limited);
    assert_eq!(intents_after_the_limited_create, 1);
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.raw);
    assert_eq!(retried.header("idempotent-replayed"), None, "the retry ran for real");
    assert_eq!(sim.intents().await.len(), 2);
}

#[tokio::test]
async fn reset_zeroes_the_stats_and_keeps_the_limit() {
    let sim = TestSim::limited_to(1).await;
    for _ in 0..3 {
        sim.create(AUTHORIZE).await;
    }
    assert_eq!(totals(&sim).await, stats(3, 2, 3));

    let reset = answer_of(sim.client.post(sim.url("/_sim/reset"))).await;
    let admitted = sim.create(AUTHORIZE).await;
    let limited = sim.create(AUTHORIZE).await;

    assert_eq!(reset.status, StatusCode::OK, "{}", reset.raw);
    assert_eq!(sim.get_sim("/_sim/rate_limit").await.body, json!({"per_second": 1, "per_endpoint": 0}));
    // The window starts empty after a reset, as the counts do.
    assert_eq!(admitted.status, StatusCode::OK, "{}", admitted.raw);
    assert_rate_limited(&limited);
    assert_eq!(totals(&sim).await, stats(2, 1, 2));
}

#[tokio::test]
async fn an_injected_429_is_a_fault_not_the_limit() {
    let sim = TestSim::with_fault("create", "error_429", 1).await;

    let faulted = sim.create(AUTHORIZE).await;

    assert_eq!(faulted.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(faulted.error_code(), "rate_limit");
    let message = faulted.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{message}");
    assert_eq!(totals(&sim).await, stats(1, 0, 1));
}

#[tokio::test]
async fn a_simulator_built_with_a_limit_serves_it_from_the_start() {
    let sim = TestSim::start_with(stripe_sim::Simulator::new().with_rate_limit(1)).await;

    let setting = sim.get_sim("/_sim/rate_limit").await;
    let admitted = sim.get("/v1/payment_intents/pi_missing").await;
    let limited = sim.get("/v1/payment_intents/pi_missing").await;

    assert_eq!(setting.body, json!({"per_second": 1, "per_endpoint": 0}));
    assert_eq!(admitted.status, StatusCode::NOT_FOUND, "{}", admitted.raw);
    assert_rate_limited(&limited);
}

#[tokio::test]
async fn a_burst_on_one_operation_beyond_its_limit_is_answered_429_while_other_operations_go_through() {
    // Arrange: no limit on the account, 3 a second on each operation.
    let sim = TestSim::start().await;
    sim.set_endpoint_rate_limit(3).await;

    // Act: five creates, then retrievals of three different intents, in one burst.
    let mut creates = Vec::new();
    for _ in 0..5 {
        creates.push(sim.create(AUTHORIZE).await);
    }
    let mut retrievals = Vec::new();
    for id in ["pi_a", "pi_b", "pi_c", "pi_d"] {
        retrievals.push(sim.get(&format!("/v1/payment_intents/{id}")).await);
    }

    // Assert: the creates beyond 3 are refused as the account's limit refuses, and have no
    // effect; the retrievals are another operation, and every id counts on the same one.
    assert_eq!(statuses(&creates), [200, 200, 200, 429, 429]);
    creates[3..].iter().for_each(assert_rate_limited);
    assert_eq!(sim.intents().await.len(), 3);
    assert_eq!(statuses(&retrievals), [404, 404, 404, 429]);
    let stats = sim.stats().await;
    assert_eq!((stats["requests"].as_u64(), stats["rate_limited"].as_u64()), (Some(9), Some(3)));
    assert_eq!(
        stats["max_requests_in_one_second_by_endpoint"],
        json!({"POST /v1/payment_intents": 5, "GET /v1/payment_intents/{id}": 4})
    );
    // Every request received on each, admitted or refused.
    assert_eq!(
        stats["requests_by_endpoint"],
        json!({"POST /v1/payment_intents": 5, "GET /v1/payment_intents/{id}": 4})
    );
}

#[tokio::test]
async fn an_operation_within_its_own_limit_still_meets_the_accounts() {
    // Arrange: 3 a second overall, 2 on each operation.
    let sim = TestSim::limited_to(3).await;
    sim.set_endpoint_rate_limit(2).await;
    let intent = sim.authorized().await;

    // Act
    let second_create = sim.create(AUTHORIZE).await;
    let capture = sim.capture(&intent, None).await;
    let cancel = sim.cancel(&intent, None).await;

    // Assert: the cancel is its operation's first, but the account's third in the second.
    assert_eq!(statuses(&[second_create, capture]), [200, 200]);
    assert_rate_limited(&cancel);
    assert_eq!(
        sim.stats().await["max_requests_in_one_second_by_endpoint"],
        json!({
            "POST /v1/payment_intents": 2,
            "POST /v1/payment_intents/{id}/capture": 1,
            "POST /v1/payment_intents/{id}/cancel": 1,
        })
    );
}

#[tokio::test]
async fn a_limit_left_out_of_a_setting_stays_as_it_was_and_zero_clears_it() {
    let sim = TestSim::start().await;

    let account = sim.post_rate_limit(r#"{"per_second": 5}"#).await;
    let both = sim.post_rate_limit(r#"{"per_endpoint": 2}"#).await;
    let cleared = sim.post_rate_limit(r#"{"per_second": 0}"#).await;
    let setting = sim.get_sim("/_sim/rate_limit").await;

    assert_eq!(account.body, json!({"per_second": 5, "per_endpoint": 0}), "{}", account.raw);
    assert_eq!(both.body, json!({"per_second": 5, "per_endpoint": 2}), "{}", both.raw);
    assert_eq!(cleared.body, json!({"per_second": 0, "per_endpoint": 2}), "{}", cleared.raw);
    assert_eq!(setting.body, cleared.body);
}

#[tokio::test]
async fn reset_forgets_the_counts_by_operation_and_keeps_their_limit() {
    let sim = TestSim::start_with(stripe_sim::Simulator::new().with_endpoint_rate_limit(1)).await;
    sim.get("/v1/payment_intents?limit=1").await;
    let limited = sim.get("/v1/payment_intents?limit=1").await;
    assert_rate_limited(&limited);

    let reset = answer_of(sim.client.post(sim.url("/_sim/reset"))).await;
    let searched = sim.get("/v1/payment_intents/search?query=metadata['order_id']:'o-1'").await;
    let limited = sim.get("/v1/payment_intents/search?query=metadata['order_id']:'o-1'").await;

    assert_eq!(reset.status, StatusCode::OK, "{}", reset.raw);
    assert_eq!(searched.status, StatusCode::OK, "{}", searched.raw);
    assert_rate_limited(&limited);
    assert_eq!(
        sim.stats().await["max_requests_in_one_second_by_endpoint"],
        json!({"GET /v1/payment_intents/search": 2})
    );
}

async fn answer_of(request: reqwest::RequestBuilder) -> Answer {
    support::answer(request.send().await.expect("an answer")).await
}
