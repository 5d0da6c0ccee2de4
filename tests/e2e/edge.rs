//! The API as a client meets it: every answer in SPEC §4's error shape, the token
//! checked before anything about the request, a flood without a token that cannot spend the
//! buyers' budget, and the card-testing limit exact under concurrency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use orderfleet_tests::Fleet;
use serde_json::Value;

/// One raw request to the intake: its status, `Allow` header, content type and JSON body.
async fn send(
    fleet: &Fleet,
    method: &str,
    path: &str,
    user: Option<&str>,
) -> (u16, Option<String>, String, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    // reqwest would re-encode a path; the URL is built by hand so `%FF` arrives as sent.
    let url = reqwest::Url::parse(&format!("{}{path}", fleet.intake_url)).unwrap();
    let mut request = fleet.http.request(method, url);
    if let Some(user) = user {
        request = request.bearer_auth(fleet.token(user));
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap_or("").to_owned());
    let (status, allow, content_type) =
        (response.status().as_u16(), header("allow"), header("content-type").unwrap_or_default());
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, allow, content_type, body)
}

/// The token is checked before the path: without one, any `/v1` path is a 401.
#[tokio::test(flavor = "multi_thread")]
async fn every_answer_is_in_the_error_shape() {
    // Arrange
    let fleet = Fleet::start("error-shape", 1).await.unwrap();

    // Act and assert: each request, with or without a token, and the answer it must get.
    let cases: [(&str, &str, Option<&str>, u16, &str); 9] = [
        ("GET", "/nope", None, 404, "not_found"),
        ("GET", "/v1/nope", Some("ola"), 404, "not_found"),
        ("GET", "/v1/nope", None, 401, "unauthorized"),
        ("DELETE", "/v1/orders", Some("ola"), 405, "method_not_allowed"),
        ("DELETE", "/v1/orders", None, 401, "unauthorized"),
        ("POST", "/healthz", None, 405, "method_not_allowed"),
        ("GET", "/v1/orders/%FF", None, 401, "unauthorized"),
        ("GET", "/v1/orders/%FF", Some("ola"), 404, "order_not_found"),
        ("GET", "/v1/orders/not-a-uuid", Some("ola"), 404, "order_not_found"),
    ];
    let mut wrong = Vec::new();
    for (method, path, user, status, code) in cases {
        let (got, allow, content_type, body) = send(&fleet, method, path, user).await;
        let shaped = body["error"]["code"] == code
            && body["error"]["message"].as_str().is_some_and(|m| !m.is_empty())
            && content_type.starts_with("application/json");
        let allowed = status != 405 || allow.is_some_and(|a| !a.is_empty());
        if got != status || !shaped || !allowed {
            wrong.push(format!("{method} {path} token={}: {got} {content_type} {body}", user.is_some()));
        }
    }
    assert!(wrong.is_empty(), "answers outside the error shape:\n{}", wrong.join("\n"));
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_without_a_valid_token_spends_nothing_of_the_buyers_budget() {
    // Arrange: the intake's global rate low, 10 a second (a burst of 10), so that the flood
    // outruns it many times over on any machine that can run the suite (a slow one, eight tests
    // at once, flooded at 316 a second), while the buyers, one every 250 ms, stay well within it.
    const GLOBAL_RATE: f64 = 10.0;
    let mut fleet = Fleet::prepare("tokenless-flood").await.unwrap();
    fleet.set_env("INTAKE_RATE_PER_SECOND", &GLOBAL_RATE.to_string());
    fleet.spawn_all(1).await.unwrap();
    fleet.product("drop", 1000, 100).await.unwrap();
    let fleet = Arc::new(fleet);

    // Act: 32 clients send orders with no token or a forged one as fast as they are answered,
    // while 20 real buyers order, one every 250 ms.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flood_sent, flood_unauthorized) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let flood: Vec<_> = (0..32)
        .map(|i| {
            let (fleet, stop) = (fleet.clone(), stop.clone());
            let (sent, unauthorized) = (flood_sent.clone(), flood_unauthorized.clone());
            tokio::spawn(async move {
                let body = r#"{"product_id":"drop","quantity":1,"payment_method":"pm_card_visa"}"#;
                while !stop.load(Ordering::Relaxed) {
                    let mut request = fleet
                        .http
                        .post(format!("{}/v1/orders", fleet.intake_url))
                        .header("idempotency-key", format!("flood-{i}"))
                        .body(body);
                    if i % 2 == 1 {
                        request = request.bearer_auth("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtYWxsb3J5In0.forged");
                    }
                    if let Ok(response) = request.send().await {
                        sent.fetch_add(1, Ordering::Relaxed);
                        if response.status() == 401 {
                            unauthorized.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut buyers = Vec::new();
    for i in 0..20 {
        buyers.push(fleet.post_order(&format!("buyer-{i}"), "k1", "drop", 1, "pm_card_visa").await.unwrap());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.unwrap();
    }
    let took = started.elapsed().as_secs_f64();

    // Assert: the flood outran the global rate tenfold (had it counted against it, buyers would
    // have heard 429), was refused as unauthorized, and every buyer got their unit.
    let (sent, unauthorized) =
        (flood_sent.load(Ordering::Relaxed), flood_unauthorized.load(Ordering::Relaxed));
    let statuses: Vec<u16> = buyers.iter().map(|a| a.status).collect();
    println!(
        "edge: tokenless-flood requests={sent} ({:.0}/s) unauthorized={unauthorized} buyers=20 accepted={}",
        sent as f64 / took,
        statuses.iter().filter(|s| **s == 202).count()
    );
    assert!(
        sent as f64 / took > 10.0 * GLOBAL_RATE,
        "the flood was too slow to test anything: {sent} in {took:.1} s"
    );
    assert_eq!(unauthorized, sent, "a request without a valid token got another answer than 401");
    assert!(statuses.iter().all(|s| *s == 202), "buyers refused during the flood: {statuses:?}");
    let fleet = Arc::into_inner(fleet).expect("the flood's tasks are done");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// A fleet whose intake has the card-testing limit at its default (five), the per-user rate
/// out of the way so that a buyer's requests arrive together; a product with 100 units.
async fn behind_the_card_gate(name: &str) -> Fleet {
    let mut fleet = Fleet::prepare(name).await.unwrap();
    fleet.set_env("INTAKE_DECLINES_PER_HOUR", "5");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1000, 100).await.unwrap();
    fleet
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_declined_cards_sent_at_once_reach_stripe_at_most_five_times() {
    // Arrange: the default limits (five declines an hour), the per-user rate out of the way so
    // that the twenty arrive together.
    let fleet = behind_the_card_gate("card-testing-race").await;

    // Act: twenty orders by one user, each with a declined card, all at once.
    let answers = futures::future::join_all((0..20).map(|i| {
        let fleet = &fleet;
        async move {
            fleet.post_order("tester", &format!("k{i}"), "sku-1", 1, "pm_card_chargeDeclined").await.unwrap()
        }
    }))
    .await;

    // Assert: at most five reached Stripe; the rest were refused before it, writing nothing.
    let reached = fleet.intents().await.unwrap().len();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    println!("edge: card-testing-race sent=20 reached_stripe={reached} statuses={statuses:?}");
    assert!(reached <= 5, "{reached} declined cards reached Stripe: {statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 402).count(), reached, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 402 || *s == 429), "{statuses:?}");
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(orders, reached as i64, "a refused order was written");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// It is never answered 429.
#[tokio::test(flavor = "multi_thread")]
async fn a_twin_one_decline_short_of_the_limit_is_answered_from_its_order() {
    // Arrange: a buyer four declines into the default limit of five.
    let fleet = behind_the_card_gate("card-gate-twins").await;
    for i in 0..4 {
        let declined =
            fleet.post_order("ola", &format!("d{i}"), "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
        assert_eq!(declined.status, 402);
    }

    // Act: the same request, under one key, sent twice at once, ten times over.
    let mut answers = Vec::new();
    for i in 0..10 {
        let key = format!("twin-{i}");
        let (a, b) = tokio::join!(
            fleet.post_order("ola", &key, "sku-1", 1, "pm_card_visa"),
            fleet.post_order("ola", &key, "sku-1", 1, "pm_card_visa")
        );
        answers.push((a.unwrap(), b.unwrap()));
    }

    // Assert: each pair is one order: a 202 and either its replay or "in use"; the gate, which
    // counted the twin's own pending order, refused neither.
    for (a, b) in &answers {
        let statuses = [a.status, b.status];
        assert!(statuses.contains(&202), "{statuses:?}: {} {}", a.body, b.body);
        for answer in [a, b] {
            let in_use = answer.status == 409 && answer.body["error"]["code"] == "idempotency_key_in_use";
            assert!(answer.status == 202 || in_use, "a twin got {}: {}", answer.status, answer.body);
        }
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// Twenty orders by one buyer with a good card, all at once, while units are left.
#[tokio::test(flavor = "multi_thread")]
async fn good_orders_at_once_behind_the_card_gate_are_never_told_sold_out() {
    // Arrange: the default card-testing limit, units for everyone.
    let fleet = behind_the_card_gate("card-gate-good-cards").await;

    // Act: one buyer, twenty orders with a good card, all at once, three times over.
    let mut statuses = Vec::new();
    for round in 0..3 {
        let answers = futures::future::join_all((0..20).map(|i| {
            let fleet = &fleet;
            async move {
                fleet.post_order("ola", &format!("r{round}-k{i}"), "sku-1", 1, "pm_card_visa").await.unwrap()
            }
        }))
        .await;
        statuses
            .extend(answers.iter().map(|a| (a.status, a.body["error"]["code"].as_str().map(str::to_owned))));
    }

    // Assert: each was accepted or asked to come back (its other orders were being authorized);
    // none heard sold_out with 40 units left.
    println!("edge: card-gate-good-cards {statuses:?}");
    for (status, code) in &statuses {
        assert!(
            *status == 202 || (*status == 429 && code.as_deref() == Some("rate_limited")),
            "{status} {code:?}"
        );
    }
    assert!(statuses.iter().any(|(s, _)| *s == 202));
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// The twin commits while the door waits for the buyer's card lock; the door answers from the
/// twin's order, never a 429.
#[tokio::test(flavor = "multi_thread")]
async fn a_capped_door_behind_a_twin_s_card_lock_answers_from_the_twin() {
    // Arrange: the card gate at five, a buyer four declines in, and a product capped per buyer.
    let fleet = behind_the_card_gate("card-gate-capped-twin").await;
    let upsert = ["product", "upsert", "--id", "capped", "--name", "Capped", "--price", "1000"];
    let rest = ["--currency", "usd", "--stock", "10", "--max-per-buyer", "3"];
    fleet.fleetctl(&[&upsert[..], &rest[..]].concat(), &[]).await.unwrap();
    for i in 0..4 {
        let declined =
            fleet.post_order("ola", &format!("d{i}"), "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
        assert_eq!(declined.status, 402);
    }
    // The twin holds the buyer's card lock, as its door does until it commits.
    let mut twin = fleet.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('cards/' || $1, 0))")
        .bind("ola")
        .execute(&mut *twin)
        .await
        .unwrap();

    // Act: the request, whose capped door waits for that lock; then the twin's order commits.
    let body = r#"{"product_id": "capped", "quantity": 1, "payment_method": "pm_card_visa"}"#;
    let request = order_intake::request::OrderRequest::parse(body.as_bytes()).unwrap();
    let fleet = Arc::new(fleet);
    let sent = tokio::spawn({
        let fleet = fleet.clone();
        async move { fleet.post_order("ola", "twin", "capped", 1, "pm_card_visa").await.unwrap() }
    });
    wait_for_an_advisory_lock(&fleet.pool).await;
    sqlx::query(
        "WITH promised AS (
             UPDATE products SET units_promised = units_promised + 1, last_position = last_position + 1
              WHERE id = 'capped' RETURNING last_position
         )
         INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity, amount_minor,
                             currency, payment_method, intake_lease_until, position)
         SELECT $1, 'ola', 'twin', $2, 'capped', 1, 1000, 'usd', 'pm_card_visa', now() + interval '30 s', last_position
           FROM promised",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(request.fingerprint())
    .execute(&mut *twin)
    .await
    .unwrap();
    twin.commit().await.unwrap();
    let answer = sent.await.unwrap();

    // Assert: the twin's order answers (it is still in its twin's hands), not the card gate,
    // which counted it.
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert_eq!(answer.body["error"]["code"], "idempotency_key_in_use", "{}", answer.body);
    Arc::into_inner(fleet).expect("the request is done").stop().await.unwrap();
}

/// Waits until a backend waits for an advisory lock.
async fn wait_for_an_advisory_lock(pool: &sqlx::PgPool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                .fetch_one(pool)
                .await
                .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no request waited for the card lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
