//! `POST /v1/refunds` as on Stripe, the charge as it shows refunds and disputes, and the
//! dispute test card.

mod support;

use reqwest::StatusCode;
use support::TestSim;

/// A captured (succeeded) intent of 2500 usd, paid with `card`: its id.
async fn paid(sim: &TestSim, card: &str) -> String {
    let id = sim.authorize_with(card).await.body["id"].as_str().unwrap().to_owned();
    let captured = sim.capture(&id, None).await;
    assert_eq!(captured.body["status"], "succeeded", "{}", captured.raw);
    id
}

#[tokio::test]
async fn a_full_refund_answers_a_refund_and_marks_the_charge_refunded() {
    // Arrange
    let sim = TestSim::start().await;
    let id = paid(&sim, "pm_card_visa").await;

    // Act
    let refund = sim
        .refund(&format!("payment_intent={id}&reason=requested_by_customer&metadata[order_id]=o-1"), None)
        .await;

    // Assert
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.raw);
    let body = &refund.body;
    assert!(body["id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(body["object"], "refund");
    assert_eq!(body["amount"], 2500);
    assert_eq!(body["currency"], "usd");
    assert_eq!(body["payment_intent"], id.as_str());
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["reason"], "requested_by_customer");
    assert_eq!(body["metadata"]["order_id"], "o-1");
    assert!(body["created"].as_i64().unwrap() > 1_600_000_000);
    let charge = &sim.with_charge(&id).await["latest_charge"];
    assert_eq!(body["charge"], charge["id"]);
    assert_eq!(charge["amount_refunded"], 2500);
    assert_eq!(charge["amount_captured"], 2500);
    assert_eq!(charge["refunded"], true);
    assert_eq!(charge["captured"], true);
    assert_eq!(charge["disputed"], false);
    assert_eq!(charge["payment_intent"], id.as_str());
}

#[tokio::test]
async fn partial_refunds_add_up_to_what_was_captured_and_no_further() {
    let sim = TestSim::start().await;
    let id = paid(&sim, "pm_card_visa").await;
    let charge = sim.with_charge(&id).await["latest_charge"]["id"].as_str().unwrap().to_owned();

    let first = sim.refund(&format!("payment_intent={id}&amount=1000"), None).await;
    let partly = sim.with_charge(&id).await["latest_charge"].clone();
    let too_much = sim.refund(&format!("charge={charge}&amount=1501"), None).await;
    let rest = sim.refund(&format!("charge={charge}"), None).await;
    let again = sim.refund(&format!("payment_intent={id}&amount=1"), None).await;

    assert_eq!(first.body["amount"], 1000, "{}", first.raw);
    assert_eq!((partly["amount_refunded"].as_i64(), partly["refunded"].as_bool()), (Some(1000), Some(false)));
    assert_eq!(too_much.status, StatusCode::BAD_REQUEST, "{}", too_much.raw);
    assert_eq!(too_much.error_code(), "amount_too_large");
    assert_eq!(too_much.body["error"]["param"], "amount");
    assert_eq!(rest.body["amount"], 1500, "the default is what is left: {}", rest.raw);
    assert_eq!(rest.body["payment_intent"], id.as_str());
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert_eq!(again.error_code(), "charge_already_refunded");
    let charge = &sim.with_charge(&id).await["latest_charge"];
    assert_eq!((charge["amount_refunded"].as_i64(), charge["refunded"].as_bool()), (Some(2500), Some(true)));
}

#[tokio::test]
async fn an_intent_not_captured_is_not_refunded_and_a_cancel_refunds_nothing() {
    let sim = TestSim::start().await;
    let held = sim.authorized().await;
    let pending =
        sim.authorize_with("pm_card_threeDSecure2Required").await.body["id"].as_str().unwrap().to_owned();
    let canceled = sim.authorized().await;
    sim.cancel(&canceled, None).await;

    for id in [&held, &pending, &canceled] {
        let refused = sim.refund(&format!("payment_intent={id}"), None).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{id}: {}", refused.raw);
        assert_eq!(refused.error_type(), "invalid_request_error");
    }
    assert_eq!(sim.with_charge(&held).await["status"], "requires_capture");
    // Since 2025-03-31.basil, cancelling a hold no longer refunds its charge.
    let charge = &sim.with_charge(&canceled).await["latest_charge"];
    assert_eq!(
        (charge["captured"].as_bool(), charge["refunded"].as_bool(), charge["amount_refunded"].as_i64()),
        (Some(false), Some(false), Some(0))
    );
}

#[tokio::test]
async fn a_refund_names_an_existing_intent_or_charge() {
    let sim = TestSim::start().await;
    let id = paid(&sim, "pm_card_visa").await;
    let other = paid(&sim, "pm_card_visa").await;
    let other_charge = sim.with_charge(&other).await["latest_charge"]["id"].as_str().unwrap().to_owned();

    let neither = sim.refund("amount=100", None).await;
    let unknown_intent = sim.refund("payment_intent=pi_nonesuch", None).await;
    let unknown_charge = sim.refund("charge=ch_nonesuch", None).await;
    let mismatched = sim.refund(&format!("payment_intent={id}&charge={other_charge}"), None).await;
    let bad_reason = sim.refund(&format!("payment_intent={id}&reason=because"), None).await;
    let zero = sim.refund(&format!("payment_intent={id}&amount=0"), None).await;

    assert_eq!(neither.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        (unknown_intent.error_code(), unknown_intent.body["error"]["param"].as_str()),
        ("resource_missing", Some("payment_intent"))
    );
    assert_eq!(
        (unknown_charge.error_code(), unknown_charge.body["error"]["param"].as_str()),
        ("resource_missing", Some("charge"))
    );
    for refused in [&mismatched, &bad_reason, &zero] {
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.raw);
    }
    assert_eq!(sim.with_charge(&id).await["latest_charge"]["amount_refunded"], 0, "nothing refunded");
}

#[tokio::test]
async fn a_refund_under_an_idempotency_key_is_made_once_and_replayed() {
    let sim = TestSim::start().await;
    let id = paid(&sim, "pm_card_visa").await;
    let form = format!("payment_intent={id}&amount=500");

    let first = sim.refund(&form, Some("refund-1")).await;
    let replayed = sim.refund(&form, Some("refund-1")).await;
    let reused = sim.refund(&format!("payment_intent={id}&amount=600"), Some("refund-1")).await;

    assert_eq!(first.status, StatusCode::OK, "{}", first.raw);
    assert_eq!(replayed.body["id"], first.body["id"]);
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(reused.error_type(), "idempotency_error");
    assert_eq!(sim.with_charge(&id).await["latest_charge"]["amount_refunded"], 500);
}

#[tokio::test]
async fn the_dispute_card_authorizes_like_visa_and_is_disputed_once_captured() {
    let sim = TestSim::start().await;
    let authorized = sim.authorize_with("pm_card_createDispute").await;
    let id = authorized.body["id"].as_str().unwrap().to_owned();
    let before = sim.with_charge(&id).await["latest_charge"].clone();

    sim.capture(&id, None).await;
    let after = sim.with_charge(&id).await["latest_charge"].clone();
    let refund = sim.refund(&format!("payment_intent={id}"), None).await;

    assert_eq!(authorized.body["status"], "requires_capture", "{}", authorized.raw);
    assert_eq!(before["disputed"], false);
    assert_eq!(after["disputed"], true);
    assert_eq!(refund.error_code(), "charge_disputed", "{}", refund.raw);
}
