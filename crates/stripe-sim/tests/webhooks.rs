//! Stripe's events, delivered to a webhook endpoint: signed, one per transition, at least
//! once (retried after a non-2xx or no answer), twice and out of order on request, and every
//! attempt recorded.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use support::receiver::{Receiver, SECRET, verifies};
use support::{TestSim, eventually};

const WAIT: Duration = Duration::from_secs(10);

/// Waits until `receiver` has events for `id` of exactly these types (in any order).
async fn events_for(receiver: &Receiver, id: &str, expected: &[&str]) {
    let mut expected: Vec<String> = expected.iter().map(|t| (*t).to_owned()).collect();
    expected.sort();
    let what = format!("events {expected:?} for {id}");
    eventually(&what, WAIT, async || {
        let mut types = receiver.types_for(id);
        types.sort();
        (types == expected).then_some(())
    })
    .await;
}

fn id_of(answer: &support::Answer) -> String {
    let pi =
        if answer.body["error"].is_object() { &answer.body["error"]["payment_intent"] } else { &answer.body };
    pi["id"].as_str().unwrap_or_else(|| panic!("no intent in {}", answer.raw)).to_owned()
}

#[tokio::test]
async fn an_event_is_signed_with_the_hmac_of_its_timestamp_and_exact_body() {
    // Arrange
    let receiver = Receiver::start().await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;

    // Act
    let created = sim.post("/v1/payment_intents", support::AUTHORIZE, Some("order-1-attempt-1")).await;

    // Assert
    let id = id_of(&created);
    events_for(&receiver, &id, &["payment_intent.amount_capturable_updated"]).await;
    let delivery = receiver.received().remove(0);
    assert_eq!(delivery.content_type.as_deref(), Some("application/json; charset=utf-8"));
    let signature = delivery.signature.as_deref().expect("a Stripe-Signature header");
    assert!(signature.starts_with("t=") && signature.contains(",v1="), "{signature}");
    assert!(verifies(signature, &delivery.body, SECRET), "{signature} does not verify");
    assert!(!verifies(signature, &delivery.body.replace("2500", "2501"), SECRET), "an altered body verifies");
    assert!(!verifies(signature, &delivery.body, "whsec_other"), "another secret verifies");

    let event = &delivery.event;
    assert!(event["id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(event["object"], "event");
    assert_eq!(event["api_version"], "2026-09-30.endive");
    assert!(event["created"].as_i64().unwrap() > 1_600_000_000);
    assert_eq!(event["livemode"], false);
    assert!(event["pending_webhooks"].as_i64().unwrap() >= 1);
    assert_eq!(event["request"]["id"], created.header("request-id").unwrap());
    assert_eq!(event["request"]["idempotency_key"], "order-1-attempt-1");
    assert_eq!(event["data"]["object"]["object"], "payment_intent");
    assert_eq!(event["data"]["object"]["status"], "requires_capture");
    assert_eq!(event["data"]["object"]["metadata"]["order_id"], "order-1");
}

#[tokio::test]
async fn each_transition_sends_its_event() {
    let receiver = Receiver::start().await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;

    let captured = id_of(&sim.authorize_with("pm_card_visa").await);
    sim.capture(&captured, None).await;
    let declined = id_of(&sim.authorize_with("pm_card_chargeDeclined").await);
    let canceled = id_of(&sim.authorize_with("pm_card_visa").await);
    sim.cancel(&canceled, None).await;
    let expired = id_of(&sim.authorize_with("pm_card_visa").await);
    sim.expire(&expired).await;
    let authenticated = id_of(&sim.authorize_with("pm_card_threeDSecure2Required").await);
    sim.authenticate(&authenticated, "succeed").await;
    let failed = id_of(&sim.authorize_with("pm_card_authenticationRequired").await);
    sim.authenticate(&failed, "fail").await;
    let abandoned = id_of(&sim.authorize_with("pm_card_threeDSecure2Required").await);
    sim.cancel(&abandoned, None).await;

    events_for(
        &receiver,
        &captured,
        &["payment_intent.amount_capturable_updated", "payment_intent.succeeded"],
    )
    .await;
    events_for(&receiver, &declined, &["payment_intent.payment_failed"]).await;
    // On the API version the fleet pins, cancelling a hold refunds nothing: no charge.refunded.
    events_for(
        &receiver,
        &canceled,
        &["payment_intent.amount_capturable_updated", "payment_intent.canceled"],
    )
    .await;
    events_for(&receiver, &expired, &["payment_intent.amount_capturable_updated", "payment_intent.canceled"])
        .await;
    events_for(&receiver, &authenticated, &["payment_intent.amount_capturable_updated"]).await;
    events_for(&receiver, &failed, &["payment_intent.payment_failed"]).await;
    events_for(&receiver, &abandoned, &["payment_intent.canceled"]).await;
    let expiry = receiver
        .received()
        .into_iter()
        .find(|r| r.object()["id"] == expired.as_str() && r.event_type() == "payment_intent.canceled")
        .unwrap();
    assert_eq!(expiry.object()["cancellation_reason"], "automatic");
    assert_eq!(expiry.event["request"], json!({"id": null, "idempotency_key": null}), "Stripe did it");
    let failure = receiver.received().into_iter().find(|r| r.object()["id"] == failed.as_str()).unwrap();
    assert_eq!(failure.object()["last_payment_error"]["code"], "payment_intent_authentication_failure");
}

#[tokio::test]
async fn a_refund_sends_charge_refunded_with_the_charge_as_it_now_is() {
    let receiver = Receiver::start().await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;
    let id = id_of(&sim.authorize_with("pm_card_visa").await);
    sim.capture(&id, None).await;

    let refunded = sim.refund(&format!("payment_intent={id}&amount=1000"), None).await;

    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.raw);
    events_for(
        &receiver,
        &id,
        &["payment_intent.amount_capturable_updated", "payment_intent.succeeded", "charge.refunded"],
    )
    .await;
    let event = receiver.received().into_iter().find(|r| r.event_type() == "charge.refunded").unwrap();
    let charge = event.object();
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["id"], refunded.body["charge"]);
    assert_eq!((charge["amount_refunded"].as_i64(), charge["refunded"].as_bool()), (Some(1000), Some(false)));
    assert_eq!(charge["captured"], true);
    let parsed: stripe_core::Charge =
        miniserde::json::from_str(&event.object().to_string()).expect("a Charge");
    assert_eq!(parsed.amount_refunded, 1000);
}

#[tokio::test]
async fn the_dispute_card_sends_charge_dispute_created_once_captured() {
    let receiver = Receiver::start().await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;
    let id = id_of(&sim.authorize_with("pm_card_createDispute").await);

    sim.capture(&id, None).await;

    events_for(
        &receiver,
        &id,
        &["payment_intent.amount_capturable_updated", "payment_intent.succeeded", "charge.dispute.created"],
    )
    .await;
    let event = receiver.received().into_iter().find(|r| r.event_type() == "charge.dispute.created").unwrap();
    let dispute = event.object();
    assert!(dispute["id"].as_str().unwrap().starts_with("dp_"));
    assert_eq!(dispute["object"], "dispute");
    assert_eq!(dispute["amount"], 2500);
    assert_eq!(dispute["currency"], "usd");
    assert_eq!(dispute["payment_intent"], id.as_str());
    assert_eq!(dispute["reason"], "fraudulent");
    assert_eq!(dispute["status"], "needs_response");
    assert_eq!(dispute["charge"], sim.with_charge(&id).await["latest_charge"]["id"]);
    let parsed: stripe_core::Dispute = miniserde::json::from_str(&dispute.to_string()).expect("a Dispute");
    assert_eq!(parsed.reason, "fraudulent");
}

#[tokio::test]
async fn an_endpoint_answering_503_gets_the_event_again_until_it_answers_2xx() {
    let receiver = Receiver::refusing_first(2).await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;

    let id = id_of(&sim.authorize_with("pm_card_visa").await);

    let attempts = eventually("three attempts", WAIT, async || {
        let attempts = sim.webhook_attempts().await;
        (attempts.len() >= 3).then_some(attempts)
    })
    .await;
    let event_id = attempts[0]["event_id"].as_str().unwrap();
    assert!(event_id.starts_with("evt_"));
    assert_eq!(
        attempts,
        [503, 503, 200].map(|status| json!({
            "event_id": event_id,
            "type": "payment_intent.amount_capturable_updated",
            "status": status,
        }))
    );
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.event_id() == event_id && r.object()["id"] == id.as_str()));
    assert!(received.iter().all(|r| verifies(r.signature.as_deref().unwrap(), &r.body, SECRET)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sim.webhook_attempts().await.len(), 3, "no more attempts after a 2xx");
}

/// A simulator delivering to `url` that gives an event up after `attempts`.
async fn attempting(url: &str, attempts: u32) -> TestSim {
    let attempts = NonZeroU32::new(attempts).expect("at least one attempt");
    let endpoint = stripe_sim::WebhookEndpoint::new(url, SECRET);
    TestSim::start_with(
        stripe_sim::Simulator::new().with_webhook_attempts(attempts).with_webhook_endpoint(endpoint),
    )
    .await
}

#[tokio::test]
async fn an_event_the_endpoint_never_accepts_is_given_up_after_its_third_attempt() {
    // Arrange: an endpoint that answers 503 to everything.
    let receiver = Receiver::refusing_first(u32::MAX).await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;

    // Act
    let id = id_of(&sim.authorize_with("pm_card_visa").await);
    eventually("three attempts", WAIT, async || (sim.webhook_attempts().await.len() >= 3).then_some(()))
        .await;
    // Time is the subject: the fourth attempt would have come 400 ms after the third.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Assert: one entry per attempt, three in all, and the endpoint saw three requests.
    let attempts = sim.webhook_attempts().await;
    assert_eq!(attempts.iter().map(|a| a["status"].as_u64().unwrap()).collect::<Vec<_>>(), [503, 503, 503]);
    assert!(attempts.iter().all(|a| a["event_id"] == attempts[0]["event_id"]), "{attempts:?}");
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.object()["id"] == id.as_str()));
}

#[tokio::test]
async fn the_attempts_of_an_event_are_as_many_as_the_simulator_is_told() {
    let receiver = Receiver::refusing_first(u32::MAX).await;
    let sim = attempting(&receiver.url, 5).await;

    sim.authorize_with("pm_card_visa").await;
    eventually("five attempts", WAIT, async || (sim.webhook_attempts().await.len() >= 5).then_some(())).await;
    // Time is the subject: the sixth would have come 1.6 s after the fifth.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    assert_eq!(sim.webhook_attempts().await.len(), 5);
    assert_eq!(receiver.received().len(), 5);
}

#[tokio::test]
async fn an_endpoint_that_does_not_answer_is_retried_until_it_does() {
    // A port with nobody listening: the connection is refused, so no status. Attempts enough
    // to outlast the start of the endpoint.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let sim = attempting(&format!("http://{addr}/webhooks/stripe"), 100).await;

    sim.authorize_with("pm_card_visa").await;
    eventually("two unanswered attempts", WAIT, async || {
        (sim.webhook_attempts().await.iter().filter(|a| a["status"] == 0).count() >= 2).then_some(())
    })
    .await;
    let receiver = Receiver::on(tokio::net::TcpListener::bind(addr).await.unwrap());

    let delivered = eventually("a delivery once the endpoint is up", WAIT, async || {
        let received = receiver.received();
        (!received.is_empty()).then_some(received)
    })
    .await;
    assert_eq!(delivered[0].event_type(), "payment_intent.amount_capturable_updated");
    let attempts = eventually("the 200 recorded", WAIT, async || {
        let attempts = sim.webhook_attempts().await;
        (attempts.last()?["status"] == 200).then_some(attempts)
    })
    .await;
    assert!(attempts[..attempts.len() - 1].iter().all(|a| a["status"] == 0), "{attempts:?}");
}

#[tokio::test]
async fn duplicate_mode_sends_each_event_twice_each_copy_retried_on_its_own() {
    let receiver = Receiver::refusing_first(1).await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;
    let set = sim.post_sim("/_sim/webhooks", json!({"duplicate": true, "max_delay_ms": 50})).await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.raw);

    let id = id_of(&sim.authorize_with("pm_card_visa").await);

    // One copy is refused once and sent again: three requests, two of them accepted.
    let attempts = eventually("both copies accepted", WAIT, async || {
        let attempts = sim.webhook_attempts().await;
        (attempts.iter().filter(|a| a["status"] == 200).count() == 2).then_some(attempts)
    })
    .await;
    let mut statuses: Vec<u64> = attempts.iter().map(|a| a["status"].as_u64().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 200, 503], "{attempts:?}");
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.event_id() == received[0].event_id()), "one event, sent twice");
    assert!(received.iter().all(|r| r.body == received[0].body), "the same body every time");
    assert!(received.iter().all(|r| r.object()["id"] == id.as_str()));
}

#[tokio::test]
async fn the_webhook_routes_refuse_a_malformed_mode_and_are_not_counted() {
    let receiver = Receiver::start().await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;
    sim.set_rate_limit(1).await;

    let bad = sim.post_sim("/_sim/webhooks", json!({"duplicate": "yes"})).await;
    let unknown = sim.post_sim("/_sim/webhooks", json!({"twice": true})).await;
    let listed = sim.get_sim("/_sim/webhooks").await;
    let listed_again = sim.get_sim("/_sim/webhooks").await;

    assert_eq!((bad.status, unknown.status), (StatusCode::BAD_REQUEST, StatusCode::BAD_REQUEST));
    assert_eq!((listed.status, listed_again.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(listed.body["data"], json!([]));
    assert_eq!(sim.stats().await["requests"], 0);
}

#[tokio::test]
async fn without_an_endpoint_nothing_is_sent_or_recorded() {
    let sim = TestSim::start().await;

    sim.authorize_with("pm_card_visa").await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert!(sim.webhook_attempts().await.is_empty());
}
