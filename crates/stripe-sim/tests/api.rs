//! The Stripe API as the fleet uses it: PaymentIntents, their rules, idempotency keys.

mod support;

use reqwest::StatusCode;
use support::{AUTHORIZE, KEY, NO_REDIRECTS, TestSim, action_path, request_counts};

#[tokio::test]
async fn a_confirmed_manual_capture_visa_intent_requires_capture() {
    // Arrange
    let sim = TestSim::start().await;

    // Act
    let created = sim.create(AUTHORIZE).await;

    // Assert
    assert_eq!(created.status, StatusCode::OK, "{}", created.raw);
    let pi = &created.body;
    assert!(pi["id"].as_str().unwrap().starts_with("pi_"));
    assert_eq!(pi["object"], "payment_intent");
    assert_eq!(pi["status"], "requires_capture");
    assert_eq!(pi["amount"], 2500);
    assert_eq!(pi["amount_capturable"], 2500);
    assert_eq!(pi["amount_received"], 0);
    assert_eq!(pi["capture_method"], "manual");
    assert_eq!(pi["confirmation_method"], "automatic");
    assert_eq!(pi["currency"], "usd");
    assert_eq!(pi["livemode"], false);
    assert_eq!(pi["metadata"]["order_id"], "order-1");
    assert_eq!(pi["payment_method"], "pm_card_visa");
    assert_eq!(pi["payment_method_types"][0], "card");
    assert!(pi["created"].as_i64().unwrap() > 1_600_000_000);
    assert!(pi["canceled_at"].is_null() && pi["customer"].is_null() && pi["last_payment_error"].is_null());
    assert!(created.header("request-id").unwrap().starts_with("req_"));
    assert_eq!(created.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn an_intent_can_be_retrieved_by_id() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let retrieved = sim.get(&format!("/v1/payment_intents/{id}")).await;

    assert_eq!(retrieved.status, StatusCode::OK);
    assert_eq!(retrieved.body["id"], id.as_str());
    assert_eq!(retrieved.body["status"], "requires_capture");
}

#[tokio::test]
async fn automatic_capture_and_unconfirmed_intents_take_stripes_statuses() {
    let sim = TestSim::start().await;

    let automatic = sim
        .create(&format!("amount=700&currency=eur&confirm=true&payment_method=pm_card_visa{NO_REDIRECTS}"))
        .await;
    let unconfirmed = sim.create("amount=700&currency=eur&payment_method=pm_card_visa").await;
    let bare = sim.create("amount=700&currency=eur").await;

    assert_eq!(automatic.body["status"], "succeeded");
    assert_eq!(automatic.body["amount_received"], 700);
    assert_eq!(unconfirmed.body["status"], "requires_confirmation");
    assert_eq!(bare.body["status"], "requires_payment_method");
}

#[tokio::test]
async fn a_declined_card_answers_402_and_the_intent_remains() {
    let sim = TestSim::start().await;

    let declined = sim
        .create(&format!("amount=2500&currency=usd&capture_method=manual&confirm=true&payment_method=pm_card_chargeDeclined&metadata[order_id]=o-2{NO_REDIRECTS}"))
        .await;

    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED, "{}", declined.raw);
    let error = &declined.body["error"];
    assert_eq!(error["type"], "card_error");
    assert_eq!(error["code"], "card_declined");
    assert_eq!(error["decline_code"], "generic_decline");
    assert_eq!(error["message"], "Your card was declined.");
    assert!(error["doc_url"].as_str().unwrap().starts_with("https://"));
    let pi = &error["payment_intent"];
    assert_eq!(pi["status"], "requires_payment_method");
    assert_eq!(pi["last_payment_error"]["code"], "card_declined");
    assert_eq!(pi["metadata"]["order_id"], "o-2");
    let id = pi["id"].as_str().unwrap();
    let retrieved = sim.get(&format!("/v1/payment_intents/{id}")).await;
    assert_eq!(retrieved.status, StatusCode::OK);
    assert_eq!(retrieved.body["status"], "requires_payment_method");
}

#[tokio::test]
async fn an_unknown_payment_method_is_a_missing_resource() {
    let sim = TestSim::start().await;

    let refused = sim.create("amount=100&currency=usd&confirm=true&payment_method=pm_card_nonesuch").await;

    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.error_type(), "invalid_request_error");
    assert_eq!(refused.error_code(), "resource_missing");
    assert_eq!(refused.body["error"]["param"], "payment_method");
    assert!(sim.intents().await.is_empty());
}

#[tokio::test]
async fn missing_or_invalid_amounts_and_currencies_name_the_parameter() {
    let sim = TestSim::start().await;

    for (form, param) in [
        ("currency=usd", "amount"),
        ("amount=0&currency=usd", "amount"),
        ("amount=-5&currency=usd", "amount"),
        ("amount=12.5&currency=usd", "amount"),
        ("amount=100", "currency"),
    ] {
        let refused = sim.create(form).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{form}");
        assert_eq!(refused.error_type(), "invalid_request_error", "{form}");
        assert_eq!(refused.body["error"]["param"], param, "{form}");
    }
}

#[tokio::test]
async fn an_amount_below_stripe_s_minimum_charge_is_refused_as_amount_too_small() {
    let sim = TestSim::start().await;

    let refused =
        sim.post("/v1/payment_intents", &AUTHORIZE.replace("amount=2500", "amount=1"), Some("k-1")).await;
    let again = sim.post("/v1/payment_intents", AUTHORIZE, Some("k-1")).await;

    // Stripe's answer (docs.stripe.com/currencies, "Minimum and maximum charge amounts";
    // docs.stripe.com/error-codes#amount-too-small): a 400 on `amount`, no intent made, and
    // nothing saved under the key, so the key's next request with a real price runs.
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.raw);
    assert_eq!(refused.error_type(), "invalid_request_error");
    assert_eq!(refused.error_code(), "amount_too_small");
    assert_eq!(refused.body["error"]["param"], "amount");
    assert_eq!(refused.body["error"]["message"], "Amount must be at least $0.50 usd");
    assert_eq!(again.status, StatusCode::OK, "{}", again.raw);
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn capturing_twice_is_refused_and_both_attempts_are_counted() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let first = sim.capture(&id, None).await;
    let second = sim.capture(&id, None).await;

    assert_eq!(first.status, StatusCode::OK, "{}", first.raw);
    assert_eq!(first.body["status"], "succeeded");
    assert_eq!(first.body["amount_received"], 2500);
    assert_eq!(first.body["amount_capturable"], 0);
    assert_eq!(second.status, StatusCode::BAD_REQUEST);
    assert_eq!(second.error_type(), "invalid_request_error");
    assert_eq!(second.error_code(), "payment_intent_unexpected_state");
    assert_eq!(second.body["error"]["payment_intent"]["status"], "succeeded");
    assert_eq!(request_counts(&sim.intent(&id).await), (2, 0));
}

#[tokio::test]
async fn a_partial_capture_collects_only_the_amount_to_capture() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let captured = sim.post(&action_path(&id, "capture"), "amount_to_capture=1000", None).await;

    assert_eq!(captured.status, StatusCode::OK, "{}", captured.raw);
    assert_eq!(captured.body["amount_received"], 1000);
    assert_eq!(captured.body["amount_capturable"], 0);
}

#[tokio::test]
async fn a_canceled_intent_cannot_be_captured_or_canceled_again() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let canceled = sim.post(&action_path(&id, "cancel"), "cancellation_reason=abandoned", None).await;
    let capture = sim.capture(&id, None).await;
    let cancel_again = sim.cancel(&id, None).await;

    assert_eq!(canceled.status, StatusCode::OK, "{}", canceled.raw);
    assert_eq!(canceled.body["status"], "canceled");
    assert_eq!(canceled.body["cancellation_reason"], "abandoned");
    assert_eq!(canceled.body["amount_capturable"], 0);
    assert!(canceled.body["canceled_at"].as_i64().is_some());
    assert_eq!(capture.status, StatusCode::BAD_REQUEST);
    assert_eq!(capture.error_code(), "payment_intent_unexpected_state");
    assert!(
        capture.body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("This PaymentIntent could not be captured because it has a status of canceled."),
        "{}",
        capture.raw
    );
    assert_eq!(cancel_again.status, StatusCode::BAD_REQUEST);
    assert_eq!(cancel_again.error_code(), "payment_intent_unexpected_state");
    assert_eq!(request_counts(&sim.intent(&id).await), (1, 2));
}

#[tokio::test]
async fn a_succeeded_intent_cannot_be_canceled() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;
    sim.capture(&id, None).await;

    let refused = sim.cancel(&id, None).await;

    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.error_code(), "payment_intent_unexpected_state");
}

#[tokio::test]
async fn an_unknown_intent_is_404_resource_missing() {
    let sim = TestSim::start().await;

    for answer in [
        sim.get("/v1/payment_intents/pi_nonesuch").await,
        sim.capture("pi_nonesuch", None).await,
        sim.cancel("pi_nonesuch", None).await,
    ] {
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert_eq!(answer.error_type(), "invalid_request_error");
        assert_eq!(answer.error_code(), "resource_missing");
        assert_eq!(answer.body["error"]["param"], "intent");
    }
}

#[tokio::test]
async fn requests_without_a_test_key_are_401() {
    let sim = TestSim::start().await;
    let url = sim.url("/v1/payment_intents");

    let none = sim.client.post(&url).body(AUTHORIZE).send().await.unwrap();
    let live =
        sim.client.post(&url).bearer_auth("sk_live_abcdefghijklmnop").body(AUTHORIZE).send().await.unwrap();
    let basic = sim.client.post(&url).basic_auth(KEY, Some("")).body(AUTHORIZE).send().await.unwrap();

    for refused in [support::answer(none).await, support::answer(live).await] {
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert_eq!(refused.error_type(), "invalid_request_error");
    }
    assert_eq!(basic.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_route_answers_stripes_404() {
    let sim = TestSim::start().await;

    let unknown = sim.get("/v1/charges").await;
    let wrong_method =
        sim.client.delete(sim.url("/v1/payment_intents")).bearer_auth(KEY).send().await.unwrap();

    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.error_type(), "invalid_request_error");
    assert!(unknown.header("request-id").is_some());
    assert_eq!(wrong_method.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_idempotent_replay_returns_the_first_answer_and_is_not_counted() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let first = sim.capture(&id, Some("capture-1")).await;
    let replay = sim.capture(&id, Some("capture-1")).await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("idempotent-replayed"), None);
    assert_eq!(replay.status, StatusCode::OK);
    assert_eq!(replay.raw, first.raw);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("original-request"), first.header("request-id"));
    assert_ne!(replay.header("request-id"), first.header("request-id"));
    assert_eq!(sim.intent(&id).await["capture_count"], 1);
}

#[tokio::test]
async fn a_replayed_create_makes_one_intent() {
    let sim = TestSim::start().await;

    let first = sim.post("/v1/payment_intents", AUTHORIZE, Some("authorize-1")).await;
    // The same parameters in another order are the same request.
    let reordered = AUTHORIZE.split('&').rev().collect::<Vec<_>>().join("&");
    let replay = sim.post("/v1/payment_intents", &reordered, Some("authorize-1")).await;

    assert_eq!(replay.body["id"], first.body["id"]);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn a_declined_answer_is_replayed_too() {
    let sim = TestSim::start().await;
    let form =
        &format!("amount=100&currency=usd&confirm=true&payment_method=pm_card_chargeDeclined{NO_REDIRECTS}");

    let first = sim.post("/v1/payment_intents", form, Some("decline-1")).await;
    let replay = sim.post("/v1/payment_intents", form, Some("decline-1")).await;

    assert_eq!(first.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(replay.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(replay.raw, first.raw);
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_is_an_idempotency_error() {
    let sim = TestSim::start().await;
    let first = sim.post("/v1/payment_intents", AUTHORIZE, Some("authorize-2")).await;
    let id = first.body["id"].as_str().unwrap();

    let other_amount = AUTHORIZE.replace("amount=2500", "amount=2600");
    let other_params = sim.post("/v1/payment_intents", &other_amount, Some("authorize-2")).await;
    let other_endpoint = sim.cancel(id, Some("authorize-2")).await;

    for refused in [&other_params, &other_endpoint] {
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.raw);
        assert_eq!(refused.error_type(), "idempotency_error");
    }
    assert!(other_params.body["error"]["message"].as_str().unwrap().contains("same parameters"));
    assert_eq!(sim.intents().await.len(), 1);
    assert_eq!(sim.intent(id).await["cancel_count"], 0);
}

#[tokio::test]
async fn a_request_refused_for_its_parameters_saves_nothing_under_its_key() {
    let sim = TestSim::start().await;

    let invalid = sim.post("/v1/payment_intents", "currency=usd", Some("fix-me")).await;
    let corrected = sim.post("/v1/payment_intents", AUTHORIZE, Some("fix-me")).await;

    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert_eq!(corrected.status, StatusCode::OK, "{}", corrected.raw);
    assert_eq!(corrected.header("idempotent-replayed"), None);
}

#[tokio::test]
async fn retrieval_ignores_idempotency_keys() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let path = format!("/v1/payment_intents/{id}");
    let retrieved =
        sim.client.get(sim.url(&path)).bearer_auth(KEY).header("idempotency-key", "k").send().await.unwrap();
    let created_with_same_key = sim.post("/v1/payment_intents", AUTHORIZE, Some("k")).await;

    assert_eq!(retrieved.status(), StatusCode::OK);
    assert_eq!(created_with_same_key.status, StatusCode::OK);
    assert_eq!(created_with_same_key.header("idempotent-replayed"), None);
}

#[tokio::test]
async fn the_sim_listing_shows_every_intent_in_creation_order_with_counts() {
    let sim = TestSim::start().await;
    let first = sim.authorized().await;
    let second = sim.authorized().await;
    sim.cancel(&second, None).await;

    let intents = sim.intents().await;

    assert_eq!(intents.len(), 2);
    assert_eq!(intents[0]["id"], first.as_str());
    assert_eq!(intents[1]["id"], second.as_str());
    assert_eq!(intents[0]["object"], "payment_intent");
    assert_eq!(intents[0]["metadata"]["order_id"], "order-1");
    assert_eq!(request_counts(&intents[0]), (0, 0));
    assert_eq!(request_counts(&intents[1]), (0, 1));
    assert_eq!(intents[1]["status"], "canceled");
}

#[tokio::test]
async fn reset_forgets_intents_and_keys() {
    let sim = TestSim::start().await;
    sim.post("/v1/payment_intents", AUTHORIZE, Some("before-reset")).await;

    let reset = sim.client.post(sim.url("/_sim/reset")).send().await.unwrap();
    let after = sim.post("/v1/payment_intents", AUTHORIZE, Some("before-reset")).await;

    assert_eq!(reset.status(), StatusCode::OK);
    assert_eq!(after.header("idempotent-replayed"), None);
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn the_create_the_fleet_sent_before_issue_33_is_refused_as_stripe_refuses_it() {
    let sim = TestSim::start().await;

    // Act: confirm=true with a payment method and neither automatic_payment_methods nor
    // payment_method_types, which on the pinned API version means automatic payment methods
    // that may redirect, and no return_url.
    let refused = sim
        .create("amount=2500&currency=usd&capture_method=manual&confirm=true&payment_method=pm_card_visa")
        .await;

    // Assert
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.error_type(), "invalid_request_error");
    let message = refused.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("you must provide a `return_url`"), "{message}");
    // The fleet's create now: a card confirmed on the server, redirects ruled out.
    let accepted = sim.create(AUTHORIZE).await;
    assert_eq!(accepted.body["status"], "requires_capture", "{}", accepted.body);
    assert_eq!(accepted.body["automatic_payment_methods"]["allow_redirects"], "never");
}

#[tokio::test]
async fn a_create_naming_payment_method_types_is_refused_as_the_pinned_version_refuses_it_and_saves_nothing()
{
    // Arrange: a create naming its card types, as an older fleet's did.
    let sim = TestSim::start().await;
    let named = format!("{AUTHORIZE}&payment_method_types[]=card");

    // Act
    let refused = sim.post("/v1/payment_intents", &named, Some("order-9-authorize")).await;
    let corrected = sim.post("/v1/payment_intents", AUTHORIZE, Some("order-9-authorize")).await;

    // Assert: Stripe's 400 on 2026-09-30.endive; nothing made, nothing saved under the key.
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.raw);
    assert_eq!(refused.error_type(), "invalid_request_error");
    assert_eq!(refused.error_code(), "payment_method_types_no_longer_supported");
    assert_eq!(refused.body["error"]["param"], "payment_method_types");
    assert_eq!(corrected.status, StatusCode::OK, "{}", corrected.raw);
    assert_eq!(corrected.header("idempotent-replayed"), None);
    assert_eq!(sim.intents().await.len(), 1);
}

#[tokio::test]
async fn a_parameter_an_endpoint_does_not_take_is_refused_as_unknown_on_every_endpoint() {
    // Arrange: a held intent, and one captured, to refund.
    let sim = TestSim::start().await;
    let held = sim.authorized().await;
    let captured = sim.authorized().await;
    assert_eq!(sim.capture(&captured, None).await.status, StatusCode::OK);

    // Act: each endpoint given a parameter that belongs to another one, or to none.
    let refused = [
        (sim.create(&format!("{AUTHORIZE}&order_id=o-1")).await, "order_id"),
        (sim.get(&format!("/v1/payment_intents/{held}?limit=1")).await, "limit"),
        (sim.get("/v1/payment_intents?page=next&limit=1").await, "page"),
        (
            sim.get("/v1/payment_intents/search?query=metadata['order_id']:'o'&created[gte]=1").await,
            "created",
        ),
        (sim.post(&action_path(&held, "capture"), "amount=100", None).await, "amount"),
        (sim.post(&action_path(&held, "cancel"), "reason=duplicate", None).await, "reason"),
        (
            sim.refund(&format!("payment_intent={captured}&cancellation_reason=duplicate"), None).await,
            "cancellation_reason",
        ),
    ];

    // Assert: Stripe's 400, in Stripe's words, naming the parameter; nothing happened.
    for (answer, param) in &refused {
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{param}: {}", answer.raw);
        assert_eq!(
            (answer.error_type(), answer.error_code()),
            ("invalid_request_error", "parameter_unknown"),
            "{param}"
        );
        assert_eq!(answer.body["error"]["param"], *param);
        assert_eq!(answer.body["error"]["message"], format!("Received unknown parameter: {param}"));
    }
    assert_eq!(sim.intents().await.len(), 2);
    let held = sim.intent(&held).await;
    assert_eq!(
        (held["status"].as_str(), held["capture_count"].as_u64()),
        (Some("requires_capture"), Some(0))
    );
}

#[tokio::test]
async fn every_parameter_the_fleet_and_its_harness_send_is_taken() {
    // Arrange: the fleet's create (async-stripe's encoding of it: `expand[0]`, `metadata[…]`),
    // and the parameters Stripe documents beside them that a client may send.
    let sim = TestSim::start().await;
    let create = format!(
        "{AUTHORIZE}&metadata[attempt]=1&expand[0]=latest_charge&description=Order&statement_descriptor_suffix=SKU\
         &payment_method_options[card][request_three_d_secure]=automatic&receipt_email=a@example.com"
    );

    // Act
    let created = sim.post("/v1/payment_intents", &create, Some("order-1-authorize")).await;
    let id = created.body["id"].as_str().unwrap_or_default().to_owned();
    let created_at = created.body["created"].as_i64().unwrap_or_default();
    let answers = [
        sim.get(&format!("/v1/payment_intents/{id}?expand[0]=latest_charge")).await,
        sim.get(&format!(
            "/v1/payment_intents?created[gte]={}&created[lte]={}&limit=100&expand[0]=data.latest_charge",
            created_at - 60,
            created_at + 60
        ))
        .await,
        sim.get(&format!("/v1/payment_intents?limit=100&starting_after={id}")).await,
        sim.get("/v1/payment_intents/search?query=metadata['order_id']:'order-1'&limit=10&expand[]=data.latest_charge").await,
        sim.post(&action_path(&id, "capture"), "amount_to_capture=2500&expand[0]=latest_charge", Some("c-1")).await,
        sim.refund(&format!("payment_intent={id}&amount=100&reason=requested_by_customer&metadata[k]=v"), None).await,
    ];
    let other = sim.authorized().await;
    let canceled =
        sim.post(&action_path(&other, "cancel"), "cancellation_reason=abandoned", Some("x-1")).await;

    // Assert
    assert_eq!(created.status, StatusCode::OK, "{}", created.raw);
    for answer in answers.iter().chain([&canceled]) {
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.raw);
    }
}

#[tokio::test]
async fn the_list_is_newest_first_in_pages_within_a_created_range_and_never_lags() {
    // Arrange: search lags by an hour, as Stripe's may during an incident; three intents.
    let sim = TestSim::start().await;
    let lag =
        sim.client.post(format!("{}/_sim/search_lag", sim.base)).json(&serde_json::json!({"seconds": 3600}));
    assert!(lag.send().await.unwrap().status().is_success());
    let mut ids = Vec::new();
    for order in ["o-1", "o-2", "o-3"] {
        let created = sim.create(&format!("{AUTHORIZE}&metadata[order]={order}")).await;
        ids.push(created.body["id"].as_str().unwrap().to_owned());
    }
    let created = sim.get(&format!("/v1/payment_intents/{}", ids[0])).await.body["created"].as_i64().unwrap();

    // Act
    let first = sim.get("/v1/payment_intents?limit=2").await;
    let after = first.body["data"][1]["id"].as_str().unwrap().to_owned();
    let second = sim.get(&format!("/v1/payment_intents?limit=2&starting_after={after}")).await;
    let in_range =
        sim.get(&format!("/v1/payment_intents?created[gte]={created}&created[lte]={}", created + 3600)).await;
    let before = sim.get(&format!("/v1/payment_intents?created[lt]={created}")).await;
    let searched = sim.get("/v1/payment_intents/search?query=metadata['order']:'o-1'").await;

    // Assert: newest first, two pages, the range, and none of the search's lag.
    let ids_of = |answer: &support::Answer| -> Vec<String> {
        answer.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|pi| pi["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(first.body["object"], "list");
    assert_eq!(ids_of(&first), [ids[2].clone(), ids[1].clone()]);
    assert_eq!(first.body["has_more"], true);
    assert_eq!(ids_of(&second), [ids[0].clone()]);
    assert_eq!(second.body["has_more"], false);
    assert_eq!(ids_of(&in_range).len(), 3);
    assert!(ids_of(&before).is_empty());
    assert_eq!(
        searched.body["data"].as_array().unwrap().len(),
        0,
        "the search shows what it has indexed only"
    );
}

#[tokio::test]
async fn a_list_with_a_limit_out_of_range_or_an_unknown_cursor_is_refused_with_its_parameter() {
    let sim = TestSim::start().await;

    let zero = sim.get("/v1/payment_intents?limit=0").await;
    let many = sim.get("/v1/payment_intents?limit=101").await;
    let unknown = sim.get("/v1/payment_intents?starting_after=pi_nonesuch").await;
    let backwards = sim.get("/v1/payment_intents?ending_before=pi_nonesuch").await;

    assert_eq!((zero.status, zero.body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")));
    assert_eq!((many.status, many.body["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")));
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert_eq!(unknown.error_code(), "resource_missing");
    assert_eq!(unknown.body["error"]["param"], "starting_after");
    assert_eq!(
        backwards.body["error"]["param"], "ending_before",
        "a backward page is refused, not answered wrongly"
    );
}

#[tokio::test]
async fn expire_lets_a_hold_lapse_as_stripe_does() {
    let sim = TestSim::start().await;
    let id = sim.authorized().await;

    let expired =
        sim.client.post(format!("{}/_sim/payment_intents/{id}/expire", sim.base)).send().await.unwrap();
    let now = sim.get(&format!("/v1/payment_intents/{id}")).await;

    assert!(expired.status().is_success(), "{}", expired.status());
    assert_eq!(now.body["status"], "canceled");
    assert_eq!(now.body["cancellation_reason"], "automatic");
}
