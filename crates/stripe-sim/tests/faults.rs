//! Injected faults: each mode, its count, replacement and clearing, and the graceful stop
//! with a request still held.

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use support::{AUTHORIZE, Answer, TestSim, action_path, statuses};

/// A faulted request answered Stripe's 500, and its retry with the same key was answered that
/// 500 again, as the key's saved answer.
fn assert_the_500_is_saved_under_the_key(faulted: &Answer, retried: &Answer) {
    assert_eq!(faulted.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(faulted.error_type(), "api_error");
    assert_eq!(retried.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", retried.raw);
    assert_eq!(retried.header("idempotent-replayed"), Some("true"));
}

#[tokio::test]
async fn an_error_500_fault_is_saved_under_its_key_and_replayed_until_the_key_expires() {
    let sim = TestSim::with_fault("create", "error_500", 1).await;

    let faulted = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-500")).await;
    let retried = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-500")).await;
    let new_key = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-500-attempt-2")).await;

    assert!(faulted.header("request-id").is_some());
    // As on Stripe: the 500 is the key's saved answer, replayed to a retry with the key; the
    // operation did nothing, and a new key runs it.
    assert_the_500_is_saved_under_the_key(&faulted, &retried);
    assert_eq!(new_key.status, StatusCode::OK, "{}", new_key.raw);
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn an_error_500_after_success_fault_takes_effect_and_saves_the_500_under_its_key() {
    let sim = TestSim::with_fault("create", "error_500_after_success", 1).await;

    let faulted = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-500-after")).await;
    let retried = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-500-after")).await;

    // The 500's result is indeterminate, as on Stripe: here the intent was made, and the key
    // replays the 500, so only a lookup finds the intent.
    assert_the_500_is_saved_under_the_key(&faulted, &retried);
    let intents = sim.intents().await;
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0]["status"], "requires_capture");
}

#[tokio::test]
async fn an_error_500_fault_without_a_key_saves_nothing() {
    let sim = TestSim::with_fault("create", "error_500", 1).await;

    let faulted = sim.post("/v1/payment_intents", AUTHORIZE, None).await;
    let again = sim.post("/v1/payment_intents", AUTHORIZE, None).await;

    assert_eq!(faulted.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(again.status, StatusCode::OK, "{}", again.raw);
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn an_error_429_fault_answers_rate_limit_without_effect() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("capture", "error_429", 2).await;

    let first = sim.capture(&id, Some("cap")).await;
    let second = sim.capture(&id, Some("cap")).await;
    let third = sim.capture(&id, Some("cap")).await;

    for faulted in [&first, &second] {
        assert_eq!(faulted.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(faulted.error_type(), "invalid_request_error");
        assert_eq!(faulted.error_code(), "rate_limit");
    }
    assert_eq!(third.status, StatusCode::OK, "{}", third.raw);
    let listed = sim.intent(&id).await;
    assert_eq!(listed["status"], "succeeded");
    assert_eq!(listed["capture_count"], 1);
}

#[tokio::test]
async fn a_lock_timeout_fault_answers_stripe_s_lock_timeout_and_saves_nothing() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("capture", "lock_timeout", 2).await;

    let first = sim.capture(&id, Some("cap")).await;
    let second = sim.capture(&id, Some("cap")).await;
    let third = sim.capture(&id, Some("cap")).await;

    // Stripe's 429 for an object another request holds (docs.stripe.com/error-codes#lock-timeout):
    // its own code, not `rate_limit`, in Stripe's words.
    for faulted in [&first, &second] {
        assert_eq!(faulted.status, StatusCode::TOO_MANY_REQUESTS, "{}", faulted.raw);
        assert_eq!(faulted.error_type(), "invalid_request_error");
        assert_eq!(faulted.error_code(), "lock_timeout");
        let message = faulted.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("This object cannot be accessed right now"), "{message}");
        assert_eq!(faulted.header("idempotent-replayed"), None);
    }
    // Nothing ran and nothing was saved under the key: its retry captures, once.
    assert_eq!(third.status, StatusCode::OK, "{}", third.raw);
    assert_eq!(third.header("idempotent-replayed"), None);
    let listed = sim.intent(&id).await;
    assert_eq!(listed["status"], "succeeded");
    assert_eq!(listed["capture_count"], 1);
}

#[tokio::test]
async fn a_timeout_fault_hangs_past_the_clients_timeout_without_effect() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("cancel", "timeout", 1).await;

    let timed_out = sim
        .post_request(&action_path(&id, "cancel"), "", Some("cancel-1"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;

    let error = timed_out.expect_err("no answer before the client's timeout");
    assert!(error.is_timeout(), "{error:?}");
    let listed = sim.intent(&id).await;
    assert_eq!(listed["status"], "requires_capture");
    assert_eq!(listed["cancel_count"], 0);
    // Its key is in use until the server sees the client gone; then the retry runs.
    let retried =
        support::eventually("the held cancel's key released", Duration::from_secs(10), async || {
            let retried = sim.cancel(&id, Some("cancel-1")).await;
            (retried.status != StatusCode::CONFLICT).then_some(retried)
        })
        .await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.raw);
    assert_eq!(retried.body["status"], "canceled");
}

#[tokio::test]
async fn a_drop_after_success_fault_takes_effect_once_and_a_retry_replays_it() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("capture", "drop_after_success", 1).await;

    let dropped = sim.post_request(&action_path(&id, "capture"), "", Some("capture-1")).send().await;
    let retried = sim.capture(&id, Some("capture-1")).await;

    let error = dropped.expect_err("the connection closes without an answer");
    assert!(!error.is_timeout() && !error.is_status(), "{error:?}");
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.raw);
    assert_eq!(retried.header("idempotent-replayed"), Some("true"));
    assert_eq!(retried.body["status"], "succeeded");
    let listed = sim.intent(&id).await;
    assert_eq!(listed["capture_count"], 1);
    assert_eq!(listed["amount_received"], 2500);
}

#[tokio::test]
async fn a_dropped_create_still_creates_the_intent() {
    let sim = TestSim::with_fault("create", "drop_after_success", 1).await;

    let dropped = sim.post_request("/v1/payment_intents", AUTHORIZE, Some("authorize-1")).send().await;
    let retried = sim.post("/v1/payment_intents", AUTHORIZE, Some("authorize-1")).await;

    assert!(dropped.is_err());
    assert_eq!(retried.header("idempotent-replayed"), Some("true"));
    let intents = sim.intents().await;
    assert_eq!(intents.len(), 1);
    assert_eq!(retried.body["id"], intents[0]["id"]);
}

#[tokio::test]
async fn an_any_fault_matches_every_write_but_not_retrieval() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("any", "error_500", 3).await;

    let retrieved = sim.get(&format!("/v1/payment_intents/{id}")).await;
    let create = sim.create(AUTHORIZE).await;
    let capture = sim.capture(&id, None).await;
    let cancel = sim.cancel(&id, None).await;
    let after = sim.capture(&id, None).await;

    assert_eq!(statuses(&[retrieved, create, capture, cancel, after]), [200, 500, 500, 500, 200]);
}

#[tokio::test]
async fn an_operations_own_fault_is_used_before_an_any_fault() {
    let sim = TestSim::start().await;
    sim.arm("any", "error_500", 1).await;
    sim.arm("create", "error_429", 1).await;

    let first = sim.create(AUTHORIZE).await;
    let second = sim.create(AUTHORIZE).await;
    let third = sim.create(AUTHORIZE).await;

    assert_eq!(statuses(&[first, second, third]), [429, 500, 200]);
}

#[tokio::test]
async fn a_new_fault_replaces_the_old_one_and_count_zero_clears_it() {
    let sim = TestSim::with_fault("create", "error_500", 5).await;

    let replaced = sim.fault(json!({"operation": "create", "mode": "error_429", "count": 1})).await;
    let after_replace = sim.create(AUTHORIZE).await;
    sim.arm("create", "error_500", 5).await;
    let cleared = sim.fault(json!({"operation": "create", "mode": "error_500", "count": 0})).await;
    let after_clear = sim.create(AUTHORIZE).await;

    assert_eq!(replaced.body, json!({"data": [{"operation": "create", "mode": "error_429", "count": 1}]}));
    assert_eq!(after_replace.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(cleared.status, StatusCode::OK);
    assert_eq!(cleared.body, json!({"data": []}));
    assert_eq!(after_clear.status, StatusCode::OK);
}

#[tokio::test]
async fn delete_disarms_every_fault() {
    let sim = TestSim::start().await;
    sim.arm("create", "error_500", 5).await;
    sim.arm("any", "timeout", 5).await;

    let cleared = support::answer(sim.client.delete(sim.url("/_sim/faults")).send().await.unwrap()).await;
    let created = sim.create(AUTHORIZE).await;

    assert_eq!(cleared.body, json!({"data": []}));
    assert_eq!(created.status, StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_operation_or_mode_is_refused() {
    let sim = TestSim::start().await;

    let operation = sim.fault(json!({"operation": "refund", "mode": "error_500", "count": 1})).await;
    let mode = sim.fault(json!({"operation": "create", "mode": "explode", "count": 1})).await;
    let count = sim.fault(json!({"operation": "create", "mode": "error_500", "count": -1})).await;
    let not_json =
        support::answer(sim.client.post(sim.url("/_sim/faults")).body("nope").send().await.unwrap()).await;

    assert_eq!(operation.status, StatusCode::BAD_REQUEST);
    assert_eq!(operation.body["error"]["param"], "operation");
    assert_eq!(mode.status, StatusCode::BAD_REQUEST);
    assert_eq!(mode.body["error"]["param"], "mode");
    assert_eq!(count.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(sim.create(AUTHORIZE).await.status, StatusCode::OK);
}

#[tokio::test]
async fn stopping_the_server_lets_a_held_request_go() {
    let sim = TestSim::with_fault("create", "timeout", 1).await;
    let held = tokio::spawn(sim.post_request("/v1/payment_intents", AUTHORIZE, None).send());
    // Let the request reach the server and be held.
    tokio::time::sleep(Duration::from_millis(200)).await;

    sim.stop(Duration::from_secs(5)).await;

    let answer = held.await.unwrap();
    assert!(answer.is_err(), "a held request gets no answer: {answer:?}");
}

#[tokio::test]
async fn a_list_fault_refuses_the_list_as_invalid_while_a_retrieve_of_the_same_intent_still_answers() {
    // Arrange: an intent, and the next two lists refused as Stripe refuses an invalid request.
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("list", "error_400", 2).await;

    // Act
    let refused = sim.get("/v1/payment_intents?limit=100").await;
    let retrieved = sim.get(&format!("/v1/payment_intents/{id}")).await;
    let created = sim.create(AUTHORIZE).await;
    let refused_again = sim.get("/v1/payment_intents?limit=100").await;
    let listed = sim.get("/v1/payment_intents?limit=100").await;

    // Assert: a 400 `invalid_request_error`, which no retry mends; a retrieve and a create
    // are not lists, and the third list answers.
    for faulted in [&refused, &refused_again] {
        assert_eq!(faulted.status, StatusCode::BAD_REQUEST, "{}", faulted.raw);
        assert_eq!(faulted.error_type(), "invalid_request_error");
    }
    assert_eq!(retrieved.status, StatusCode::OK, "{}", retrieved.raw);
    assert_eq!(created.status, StatusCode::OK, "{}", created.raw);
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.raw);
    assert_eq!(listed.body["data"].as_array().map(Vec::len), Some(2), "{}", listed.raw);
}

#[tokio::test]
async fn an_error_400_fault_on_a_create_is_not_saved_under_its_key() {
    // Arrange: Stripe saves no answer for a request that failed validation
    // (docs.stripe.com/api/idempotent_requests), so the key's retry runs.
    let sim = TestSim::with_fault("create", "error_400", 1).await;

    // Act
    let refused = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-400")).await;
    let retried = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-400")).await;

    // Assert
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.raw);
    assert_eq!(refused.error_type(), "invalid_request_error");
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.raw);
    assert_eq!(retried.header("idempotent-replayed"), None);
    assert_eq!(sim.intents().await.len(), 1);
}
