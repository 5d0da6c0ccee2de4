//! Cards that need 3-D Secure: `requires_action` with a `client_secret` and a `next_action`
//! for the buyer's Stripe.js, no charge until the buyer authenticates, and
//! `/_sim/payment_intents/{id}/authenticate` standing in for the buyer's browser.

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use support::receiver::{Receiver, SECRET};
use support::{AUTHORIZE, TestSim, eventually};

#[tokio::test]
async fn a_3ds_card_answers_requires_action_with_a_client_secret_and_a_use_stripe_sdk_next_action() {
    let sim = TestSim::start().await;

    for card in ["pm_card_threeDSecure2Required", "pm_card_authenticationRequired"] {
        // Act
        let created = sim.authorize_with(card).await;

        // Assert
        assert_eq!(created.status, StatusCode::OK, "{card}: {}", created.raw);
        let pi = &created.body;
        let id = pi["id"].as_str().unwrap();
        assert_eq!(pi["status"], "requires_action", "{card}");
        let secret = pi["client_secret"].as_str().unwrap();
        assert!(secret.starts_with(&format!("{id}_secret_")) && secret.len() > id.len() + 8, "{secret}");
        let next_action = &pi["next_action"];
        assert_eq!(next_action["type"], "use_stripe_sdk", "{next_action}");
        assert_eq!(next_action["use_stripe_sdk"]["type"], "stripe_3ds2_fingerprint", "{next_action}");
        assert!(next_action["use_stripe_sdk"]["three_d_secure_2_source"].is_string(), "{next_action}");
        // No charge, no hold, until the buyer authenticates.
        assert!(pi["latest_charge"].is_null(), "{}", created.raw);
        assert_eq!(pi["amount_capturable"], 0);
        assert_eq!(sim.get(&format!("/v1/payment_intents/{id}")).await.body["next_action"], *next_action);
    }
}

#[tokio::test]
async fn every_intent_carries_a_client_secret() {
    let sim = TestSim::start().await;

    let visa = sim.authorize_with("pm_card_visa").await;
    let bare = sim.create("amount=700&currency=eur").await;

    for pi in [&visa.body, &bare.body] {
        let id = pi["id"].as_str().unwrap();
        assert!(pi["client_secret"].as_str().unwrap().starts_with(&format!("{id}_secret_")), "{pi}");
        assert!(pi["next_action"].is_null(), "{pi}");
    }
}

#[tokio::test]
async fn without_use_stripe_sdk_a_return_url_gets_a_redirect_and_none_gets_stripe_js_redirect() {
    let sim = TestSim::start().await;
    let base = AUTHORIZE
        .replace("pm_card_visa", "pm_card_threeDSecure2Required")
        .replace("&use_stripe_sdk=true", "");

    let redirected = sim.create(&format!("{base}&return_url=https://shop.example/back")).await;
    let plain = sim.create(&base).await;

    let redirect = &redirected.body["next_action"];
    assert_eq!(redirect["type"], "redirect_to_url", "{redirect}");
    assert_eq!(redirect["redirect_to_url"]["return_url"], "https://shop.example/back");
    assert!(redirect["redirect_to_url"]["url"].as_str().unwrap().starts_with("https://hooks.stripe.com/"));
    let sdk = &plain.body["next_action"];
    assert_eq!(sdk["type"], "use_stripe_sdk", "{sdk}");
    assert_eq!(sdk["use_stripe_sdk"]["type"], "three_d_secure_redirect", "{sdk}");
}

#[tokio::test]
async fn a_successful_authentication_places_the_hold_as_an_approved_confirm_does() {
    let sim = TestSim::start().await;
    let id =
        sim.authorize_with("pm_card_threeDSecure2Required").await.body["id"].as_str().unwrap().to_owned();

    let authenticated = sim.authenticate(&id, "succeed").await;

    assert_eq!(authenticated.status, StatusCode::OK, "{}", authenticated.raw);
    assert_eq!(authenticated.body["status"], "requires_capture");
    assert_eq!(authenticated.body["amount_capturable"], 2500);
    assert!(authenticated.body["next_action"].is_null());
    let expanded = sim.with_charge(&id).await;
    let charge = &expanded["latest_charge"];
    assert!(charge["id"].as_str().unwrap().starts_with("ch_"), "{expanded}");
    let capture_before = charge["payment_method_details"]["card"]["capture_before"].as_i64().unwrap();
    assert!(capture_before > expanded["created"].as_i64().unwrap() + 6 * 24 * 3600);
    assert_eq!(sim.capture(&id, None).await.body["status"], "succeeded");
}

#[tokio::test]
async fn a_failed_authentication_leaves_the_intent_waiting_for_another_payment_method() {
    let sim = TestSim::start().await;
    let id =
        sim.authorize_with("pm_card_authenticationRequired").await.body["id"].as_str().unwrap().to_owned();

    let failed = sim.authenticate(&id, "fail").await;

    assert_eq!(failed.status, StatusCode::OK, "{}", failed.raw);
    let pi = &failed.body;
    assert_eq!(pi["status"], "requires_payment_method");
    assert!(pi["payment_method"].is_null() && pi["next_action"].is_null() && pi["latest_charge"].is_null());
    let error = &pi["last_payment_error"];
    assert_eq!(error["code"], "payment_intent_authentication_failure");
    assert_eq!(error["type"], "invalid_request_error");
    assert!(error["message"].as_str().unwrap().contains("failed authentication"), "{error}");
    let capture = sim.capture(&id, None).await;
    assert_eq!(capture.error_code(), "payment_intent_unexpected_state");
}

/// Stripe's test card 4000 0082 6000 3178: 3-D Secure, then declined for insufficient funds.
const AUTHENTICATED_THEN_DECLINED: &str = "pm_card_authenticationRequiredChargeDeclinedInsufficientFunds";

#[tokio::test]
async fn the_3178_card_asks_for_3ds_and_once_authenticated_is_declined_for_insufficient_funds() {
    // Arrange: delivering to an endpoint, to see the events Stripe sends.
    let receiver = Receiver::start().await;
    let sim = TestSim::delivering_to(&receiver.url, SECRET).await;
    let created = sim.authorize_with(AUTHENTICATED_THEN_DECLINED).await;
    assert_eq!(
        (created.status, &created.body["status"]),
        (StatusCode::OK, &"requires_action".into()),
        "{}",
        created.raw
    );
    assert_eq!(created.body["next_action"]["type"], "use_stripe_sdk");
    let id = created.body["id"].as_str().unwrap().to_owned();

    // Act: the buyer authenticates in the browser.
    let authenticated = sim.authenticate(&id, "succeed").await;

    // Assert: no hold; the intent waits for another card, the decline its last_payment_error,
    // and Stripe says so with payment_intent.payment_failed.
    assert_eq!(authenticated.status, StatusCode::OK, "{}", authenticated.raw);
    let pi = sim.with_charge(&id).await;
    assert_eq!(
        (pi["status"].as_str(), pi["amount_capturable"].as_i64()),
        (Some("requires_payment_method"), Some(0))
    );
    assert!(pi["payment_method"].is_null() && pi["next_action"].is_null(), "{pi}");
    let error = &pi["last_payment_error"];
    assert_eq!(error["type"], "card_error", "{error}");
    assert_eq!(
        (error["code"].as_str(), error["decline_code"].as_str()),
        (Some("card_declined"), Some("insufficient_funds"))
    );
    assert_eq!(error["charge"], pi["latest_charge"]["id"]);
    assert_eq!(
        (pi["latest_charge"]["captured"].as_bool(), pi["latest_charge"]["paid"].as_bool()),
        (Some(false), Some(false))
    );
    let failed = eventually("payment_intent.payment_failed", Duration::from_secs(10), async || {
        receiver.received().into_iter().find(|r| r.event_type() == "payment_intent.payment_failed")
    })
    .await;
    assert_eq!(failed.object()["id"], id.as_str());
    assert_eq!(failed.object()["last_payment_error"]["decline_code"], "insufficient_funds");
    assert_eq!(sim.capture(&id, None).await.error_code(), "payment_intent_unexpected_state");
}

#[tokio::test]
async fn the_3178_card_failing_3ds_fails_as_the_other_3ds_cards_do() {
    let sim = TestSim::start().await;
    let id = sim.authorize_with(AUTHENTICATED_THEN_DECLINED).await.body["id"].as_str().unwrap().to_owned();

    let failed = sim.authenticate(&id, "fail").await;

    assert_eq!(failed.body["status"], "requires_payment_method", "{}", failed.raw);
    assert_eq!(failed.body["last_payment_error"]["code"], "payment_intent_authentication_failure");
    assert!(failed.body["latest_charge"].is_null());
}

#[tokio::test]
async fn only_an_intent_requiring_action_can_be_authenticated() {
    let sim = TestSim::start().await;
    let held = sim.authorized().await;
    let pending =
        sim.authorize_with("pm_card_threeDSecure2Required").await.body["id"].as_str().unwrap().to_owned();

    let twice = {
        sim.authenticate(&pending, "succeed").await;
        sim.authenticate(&pending, "fail").await
    };
    let not_pending = sim.authenticate(&held, "succeed").await;
    let unknown = sim.authenticate("pi_nonesuch", "succeed").await;
    let nonsense = sim.authenticate(&pending, "maybe").await;

    for refused in [&twice, &not_pending] {
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.raw);
        assert_eq!(refused.error_code(), "payment_intent_unexpected_state");
    }
    assert_eq!(
        twice.body["error"]["payment_intent"]["status"], "requires_capture",
        "the first outcome holds"
    );
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        (nonsense.status, nonsense.body["error"]["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("outcome"))
    );
}

#[tokio::test]
async fn an_intent_requiring_action_can_be_canceled() {
    let sim = TestSim::start().await;
    let id =
        sim.authorize_with("pm_card_threeDSecure2Required").await.body["id"].as_str().unwrap().to_owned();

    let canceled = sim.cancel(&id, None).await;
    let authenticate = sim.authenticate(&id, "succeed").await;

    assert_eq!(canceled.body["status"], "canceled", "{}", canceled.raw);
    assert!(canceled.body["next_action"].is_null());
    assert_eq!(authenticate.error_code(), "payment_intent_unexpected_state");
}
