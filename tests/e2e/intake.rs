//! SPEC §4: every answer of `POST /v1/orders`, and that a refused request writes nothing.

use std::time::Duration;

use orderfleet_tests::Fleet;

/// A request the intake must refuse, and how.
struct Case<'a> {
    name: &'a str,
    user: Option<&'a str>,
    key: Option<&'a str>,
    body: String,
    status: u16,
    code: &'a str,
}

fn case<'a>(
    name: &'a str,
    user: Option<&'a str>,
    key: Option<&'a str>,
    body: String,
    status: u16,
    code: &'a str,
) -> Case<'a> {
    Case { name, user, key, body, status, code }
}

async fn rows(fleet: &Fleet) -> (i64, i64) {
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&fleet.pool).await.unwrap();
    (orders, outbox)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_key_20_times_at_once_makes_one_order_and_one_authorization() {
    // Arrange
    let fleet = Fleet::start("idempotency", 1).await.unwrap();
    fleet.product("sku-1", 1500, 100).await.unwrap();

    // Act
    let answers = futures::future::join_all(
        (0..20).map(|_| fleet.post_order("carol", "same-key", "sku-1", 1, "pm_card_visa")),
    )
    .await;

    // Assert: one order, one authorization, the same answer to all (or 409 while in flight).
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    let accepted: Vec<_> = answers.iter().filter(|a| a.status == 202).collect();
    let said: Vec<_> = answers.iter().map(|a| (a.status, a.body["error"]["code"].clone())).collect();
    assert!(!accepted.is_empty(), "no 202 among {said:?}");
    assert!(answers.iter().all(|a| a.status == 202 || a.status == 409), "{said:?}");
    assert!(accepted.iter().all(|a| a.body == accepted[0].body));
    assert_eq!(accepted.iter().filter(|a| !a.replayed).count(), 1, "exactly one first answer");
    let in_use = answers.iter().find(|a| a.status == 409);
    if let Some(a) = in_use {
        assert_eq!(a.body["error"]["code"], "idempotency_key_in_use");
    }
    let later = fleet.post_order("carol", "same-key", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!((later.status, later.replayed), (202, true));
    assert_eq!(later.body, accepted[0].body);
    assert_eq!(fleet.intents().await.unwrap().len(), 1);

    // The same key with another body.
    let other = fleet.post_order("carol", "same-key", "sku-1", 2, "pm_card_visa").await.unwrap();
    assert_eq!(other.status, 422);
    assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
    // Another user may use the same key for an order of their own.
    let dave = fleet.post_order("dave", "same-key", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!((dave.status, dave.replayed), (202, false));
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(fleet.statuses().await.unwrap().get("paid"), Some(&2));
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn every_malformed_request_gets_its_code_and_writes_nothing() {
    let fleet = Fleet::start("malformed", 1).await.unwrap();
    fleet.product("sku-1", 1500, 100).await.unwrap();
    let good = r#"{"product_id":"sku-1","quantity":1,"payment_method":"pm_card_visa"}"#;
    let long_key = "k".repeat(256);
    let cases = [
        case("no token", None, Some("k1"), good.to_owned(), 401, "unauthorized"),
        case("no key", Some("erin"), None, good.to_owned(), 400, "idempotency_key_missing"),
        case(
            "a key with a space",
            Some("erin"),
            Some("has space"),
            good.to_owned(),
            400,
            "idempotency_key_invalid",
        ),
        case(
            "a key of 256",
            Some("erin"),
            Some(long_key.as_str()),
            good.to_owned(),
            400,
            "idempotency_key_invalid",
        ),
        case(
            "malformed JSON",
            Some("erin"),
            Some("k2"),
            "{\"product_id\":".to_owned(),
            400,
            "malformed_json",
        ),
        case(
            "an unknown field",
            Some("erin"),
            Some("k3"),
            r#"{"product_id":"sku-1","quantity":1,"payment_method":"pm_card_visa","amount":1}"#.to_owned(),
            422,
            "unknown_field",
        ),
        case(
            "quantity 0",
            Some("erin"),
            Some("k4"),
            r#"{"product_id":"sku-1","quantity":0,"payment_method":"pm_card_visa"}"#.to_owned(),
            422,
            "invalid_quantity",
        ),
        case(
            "quantity 11",
            Some("erin"),
            Some("k5"),
            r#"{"product_id":"sku-1","quantity":11,"payment_method":"pm_card_visa"}"#.to_owned(),
            422,
            "invalid_quantity",
        ),
        case(
            "a missing field",
            Some("erin"),
            Some("k6"),
            r#"{"product_id":"sku-1","quantity":1}"#.to_owned(),
            422,
            "missing_field",
        ),
        case(
            "a body over 16 KiB",
            Some("erin"),
            Some("k7"),
            format!("{{\"pad\":\"{}\"}}", "x".repeat(17 * 1024)),
            413,
            "body_too_large",
        ),
        case(
            "an unknown product",
            Some("erin"),
            Some("k8"),
            r#"{"product_id":"nope","quantity":1,"payment_method":"pm_card_visa"}"#.to_owned(),
            422,
            "unknown_product",
        ),
    ];
    for Case { name, user, key, body, status, code } in cases {
        let answer = fleet.post_raw(user, key, &body).await.unwrap();
        assert_eq!(answer.status, status, "{name}: {:?}", answer.body);
        assert_eq!(answer.body["error"]["code"], code, "{name}");
        assert!(answer.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{name}");
        assert_eq!(rows(&fleet).await, (0, 0), "{name} wrote rows");
    }
    let bad_token = fleet
        .http
        .post(format!("{}/v1/orders", fleet.intake_url))
        .bearer_auth("not-a-jwt")
        .header("idempotency-key", "k9")
        .body(good)
        .send()
        .await
        .unwrap();
    assert_eq!(bad_token.status().as_u16(), 401);
    assert!(fleet.intents().await.unwrap().is_empty(), "a refused request reached Stripe");
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unavailable_provider_answers_503_then_the_same_key_completes() {
    let fleet = Fleet::start("provider-down", 1).await.unwrap();
    fleet.product("sku-1", 1500, 10).await.unwrap();
    // Stripe answers the authorization 500, and saves that answer under its key.
    fleet.fault("create", "error_500", 1).await.unwrap();

    let first = fleet.post_order("frank", "key-1", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(first.status, 503, "{:?}", first.body);
    assert_eq!(first.body["error"]["code"], "payment_unavailable");
    assert!(first.retry_after.is_some(), "no Retry-After");
    assert_eq!(fleet.statuses().await.unwrap().get("pending_authorization"), Some(&1));

    // The client retries as Retry-After says: once Stripe's search can be trusted to show
    // what the first attempt did (nothing), a new attempt with a new key authorizes.
    let (retry, _) = fleet.post_order("frank", "key-1", "sku-1", 1, "pm_card_visa").retrying().await.unwrap();
    assert_eq!(retry.status, 202, "{:?}", retry.body);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1, "one authorization");
    assert_eq!(intents[0]["capture_count"], 1);
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_key_while_the_first_request_is_in_flight_answers_409() {
    // Arrange: the provider hangs on the first authorization, so the first request stays
    // in flight for the client timeout before its retry succeeds.
    let fleet = Fleet::start("in-flight", 1).await.unwrap();
    fleet.product("sku-1", 1500, 10).await.unwrap();
    fleet.fault("create", "timeout", 1).await.unwrap();

    // Act
    let first = fleet.post_order("hana", "key-1", "sku-1", 1, "pm_card_visa");
    // The twin goes once the first holds the key (its order is written), however long that
    // takes on a loaded machine; the first then hangs for the client's timeout (5 s).
    let second = async {
        fleet_harness::eventually("the first request's order written", Duration::from_secs(30), || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.ok()?;
            (n == 1).then_some(())
        })
        .await
        .unwrap();
        fleet.post_order("hana", "key-1", "sku-1", 1, "pm_card_visa").await
    };
    let (first, second) = tokio::join!(first, second);

    // Assert
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(second.status, 409, "{:?}", second.body);
    assert_eq!(second.body["error"]["code"], "idempotency_key_in_use");
    assert_eq!(first.status, 202, "{:?}", first.body);
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1, "the timed-out attempt and its retry made one PaymentIntent");
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_intake_serves_healthz_and_metrics_without_a_token() {
    let fleet = Fleet::start("ops", 1).await.unwrap();
    fleet.product("sku-1", 1500, 10).await.unwrap();
    let _ = fleet.post_order("ivan", "key-1", "sku-1", 1, "pm_card_visa").await.unwrap();

    let health = fleet.http.get(format!("{}/healthz", fleet.intake_url)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let metrics = fleet.http.get(format!("{}/metrics", fleet.intake_url)).send().await.unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.text().await.unwrap();
    assert!(text.contains("intake_orders_total"), "{text}");
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn only_a_token_bound_to_this_service_gets_in() {
    // Arrange
    let fleet = Fleet::start("token-binding", 1).await.unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();
    let now = chrono::Utc::now().timestamp();
    let claims = serde_json::json!({ "sub": "alice", "iss": "orderfleet", "aud": "orderfleet-api", "iat": now, "nbf": now, "exp": now + 600 });
    let sign = |claims: &serde_json::Value| {
        let key = jsonwebtoken::EncodingKey::from_secret(fleet.jwt_secret.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), claims, &key)
            .unwrap()
    };
    let without = |claim: &str| {
        let mut c = claims.clone();
        c.as_object_mut().unwrap().remove(claim);
        c
    };
    let with = |claim: &str, value: serde_json::Value| {
        let mut c = claims.clone();
        c[claim] = value;
        c
    };
    let from_fleetctl = fleet.fleetctl(&["token", "--user", "alice"], &[]).await.unwrap();
    let for_another_api =
        fleet.fleetctl(&["token", "--user", "alice"], &[("AUTH_JWT_AUDIENCE", "another-api")]).await.unwrap();
    let cases = [
        ("fleetctl's token", from_fleetctl.trim().to_owned(), 202),
        ("a token with every claim", sign(&claims), 202),
        ("no aud", sign(&without("aud")), 401),
        ("no iss", sign(&without("iss")), 401),
        ("another audience", for_another_api.trim().to_owned(), 401),
        ("another issuer", sign(&with("iss", "someone-else".into())), 401),
        ("not valid yet", sign(&with("nbf", (now + 600).into())), 401),
    ];

    // Act + Assert
    let body = r#"{"product_id": "sku-1", "quantity": 1, "payment_method": "pm_card_visa"}"#;
    for (i, (name, token, status)) in cases.into_iter().enumerate() {
        let answer = fleet
            .http
            .post(format!("{}/v1/orders", fleet.intake_url))
            .bearer_auth(token)
            .header("idempotency-key", format!("k{i}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{name}");
    }
    fleet.stop().await.unwrap();
}
