//! A request whose key's first request is still executing (SPEC §6): Stripe answers it `409
//! idempotency_key_in_use` and saves nothing for it; the first request's answer is the key's
//! once it ends (docs.stripe.com/api/idempotent_requests). Two faults keep a request
//! executing: `slow_confirm` (it ran, and goes on a while) and `timeout` (held, not run).

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use support::{AUTHORIZE, Answer, TestSim, action_path, eventually};

const WAIT: Duration = Duration::from_secs(10);

fn assert_in_use(answer: &Answer, key: &str) {
    assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.raw);
    assert_eq!(answer.error_type(), "invalid_request_error", "{}", answer.raw);
    assert_eq!(answer.error_code(), "idempotency_key_in_use", "{}", answer.raw);
    let message = answer.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("There is currently another in-progress request"), "{message}");
    assert!(message.contains(key), "{message}");
    assert_eq!(answer.header("idempotent-replayed"), None);
}

/// A simulator whose `slow_confirm` requests go on executing for `slow`.
async fn slow_for(slow: Duration) -> TestSim {
    TestSim::start_with(stripe_sim::Simulator::new().with_slow_requests(slow)).await
}

#[tokio::test]
async fn a_retry_while_a_slow_create_still_executes_is_answered_409_and_then_replays_the_first_answer() {
    // Arrange: the create runs, and its request goes on executing for 2 s; its client gives
    // up after 300 ms, as the fleet's does after its timeout.
    let sim = slow_for(Duration::from_secs(2)).await;
    sim.arm("create", "slow_confirm", 1).await;
    let first = sim
        .post_request("/v1/payment_intents", AUTHORIZE, Some("order-1-authorize"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;

    // Act: the client's retry with the key, at once; then again until the first has ended.
    let meanwhile = sim.post("/v1/payment_intents", AUTHORIZE, Some("order-1-authorize")).await;
    let replayed = eventually("the first answer replayed", WAIT, async || {
        let retried = sim.post("/v1/payment_intents", AUTHORIZE, Some("order-1-authorize")).await;
        (retried.status != StatusCode::CONFLICT).then_some(retried)
    })
    .await;

    // Assert: the first got no answer; the retry meanwhile was refused, nothing saved for it;
    // then the key answered with the first request's answer, the intent it made.
    assert!(first.expect_err("no answer").is_timeout());
    assert_in_use(&meanwhile, "order-1-authorize");
    assert_eq!(replayed.status, StatusCode::OK, "{}", replayed.raw);
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    let intents = sim.intents().await;
    assert_eq!(intents.len(), 1, "one create ran");
    assert_eq!(
        (&replayed.body["id"], &replayed.body["status"]),
        (&intents[0]["id"], &"requires_capture".into())
    );
}

#[tokio::test]
async fn a_slow_capture_keeps_its_key_in_use_and_a_retry_with_other_parameters_meets_the_409_first() {
    // Arrange
    let sim = slow_for(Duration::from_secs(2)).await;
    let id = sim.authorized().await;
    sim.arm("capture", "slow_confirm", 1).await;
    let path = action_path(&id, "capture");
    let first =
        sim.post_request(&path, "", Some("capture-1")).timeout(Duration::from_millis(300)).send().await;

    // Act
    let same = sim.capture(&id, Some("capture-1")).await;
    let other = sim.post(&path, "amount_to_capture=100", Some("capture-1")).await;

    // Assert: the capture ran once; both retries are refused as the key is in use.
    assert!(first.is_err());
    assert_in_use(&same, "capture-1");
    assert_in_use(&other, "capture-1");
    let listed = sim.intent(&id).await;
    assert_eq!((listed["status"].as_str(), listed["capture_count"].as_u64()), (Some("succeeded"), Some(1)));
}

#[tokio::test]
async fn a_request_with_the_key_of_a_held_one_is_answered_409_until_its_client_gives_up() {
    // Arrange: a cancel the simulator holds (it does not run), its client still waiting.
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.arm("cancel", "timeout", 1).await;
    let path = action_path(&id, "cancel");
    let held = tokio::spawn(sim.post_request(&path, "", Some("cancel-1")).send());
    eventually("the cancel held", WAIT, async || (sim.stats().await["requests"] == 2).then_some(())).await;

    // Act: another process cancels with the same key; then the first client gives up.
    let twin = sim.cancel(&id, Some("cancel-1")).await;
    held.abort();
    let after = eventually("the key released", WAIT, async || {
        let retried = sim.cancel(&id, Some("cancel-1")).await;
        (retried.status != StatusCode::CONFLICT).then_some(retried)
    })
    .await;

    // Assert: the twin was refused, and nothing was saved for it or for the held cancel: the
    // retry ran the cancel, once.
    assert_in_use(&twin, "cancel-1");
    assert_eq!(after.status, StatusCode::OK, "{}", after.raw);
    assert_eq!(after.header("idempotent-replayed"), None);
    let listed = sim.intent(&id).await;
    assert_eq!((listed["status"].as_str(), listed["cancel_count"].as_u64()), (Some("canceled"), Some(1)));
}

#[tokio::test]
async fn a_request_without_a_key_or_with_another_key_is_not_held_up_by_one_in_use() {
    let sim = slow_for(Duration::from_secs(5)).await;
    sim.arm("create", "slow_confirm", 1).await;
    let first = sim
        .post_request("/v1/payment_intents", AUTHORIZE, Some("k-1"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;

    let other_key = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-2")).await;
    let no_key = sim.create(AUTHORIZE).await;

    assert!(first.is_err());
    assert_eq!(support::statuses(&[other_key, no_key]), [200, 200]);
    assert_eq!(sim.intents().await.len(), 3);
}
