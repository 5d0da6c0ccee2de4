//! SPEC §1.1, §4, §5, §8.11: payments as Stripe takes them today — 3-D Secure, Stripe's signed
//! webhooks, a hold cancelled outside the fleet, refunds and disputes, a key still in use at
//! Stripe (`409 idempotency_key_in_use`), an event Stripe gives up on, a card declined once its
//! buyer has authenticated — end to end against stripe-sim, which signs and delivers its events
//! to the intake.

use std::time::{Duration, Instant};

use orderfleet_tests::Fleet;
use serde_json::Value;

/// Polls the order's status until `wanted`, for at most `within`.
async fn status_becomes(
    fleet: &Fleet,
    order: &str,
    wanted: &str,
    within: Duration,
) -> (String, Option<String>) {
    let deadline = Instant::now() + within;
    loop {
        let (status, reason): (String, Option<String>) =
            sqlx::query_as("SELECT status::text, failure_reason FROM orders WHERE id = $1::uuid")
                .bind(order)
                .fetch_one(&fleet.pool)
                .await
                .unwrap();
        if status == wanted || Instant::now() > deadline {
            return (status, reason);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn intent_of(fleet: &Fleet, order: &str) -> String {
    sqlx::query_scalar("SELECT payment_intent_id FROM orders WHERE id = $1::uuid")
        .bind(order)
        .fetch_one(&fleet.pool)
        .await
        .unwrap()
}

async fn units_promised(fleet: &Fleet, product: &str) -> i32 {
    sqlx::query_scalar("SELECT units_promised FROM products WHERE id = $1")
        .bind(product)
        .fetch_one(&fleet.pool)
        .await
        .unwrap()
}

fn order_id(body: &Value) -> String {
    body["order_id"].as_str().expect("an order id").to_owned()
}

/// It is first accepted as requires_action.
#[tokio::test(flavor = "multi_thread")]
async fn a_3ds_order_is_paid_once_its_buyer_authenticates() {
    // Arrange: an older fleet answered this 402 (and counted as card testing).
    let fleet = Fleet::start("3ds-succeeds", 1).await.unwrap();
    fleet.product("sku-1", 1500, 3).await.unwrap();

    // Act
    let first = fleet.post_order("ann", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();

    // Assert: 202 with what the buyer's page needs; the order keeps its unit and place in line.
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.body["status"], "requires_action");
    assert_eq!(first.body["position"], 1);
    let payment = &first.body["payment"];
    assert!(payment["client_secret"].as_str().unwrap().contains("_secret_"), "{payment}");
    assert_eq!(payment["next_action"]["type"], "use_stripe_sdk");
    assert!(payment["action_expires_at"].is_string());
    assert_eq!(units_promised(&fleet, "sku-1").await, 1);
    let order = order_id(&first.body);
    // A replay is the first answer; a reloaded page reads the same from GET.
    let replay = fleet.post_order("ann", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    assert_eq!((replay.status, replay.replayed, &replay.body), (202, true, &first.body));
    let got: Value = fleet.get_order("ann", &order).await.unwrap().json().await.unwrap();
    assert_eq!((&got["status"], &got["payment"]), (&first.body["status"], payment));

    // Act: the buyer authenticates in their browser; Stripe's webhook tells the fleet.
    fleet.authenticate(&intent_of(&fleet, &order).await, true).await.unwrap();

    // Assert: authorized by the webhook, then paid as any order; one intent, captured once.
    let (status, _) = status_becomes(&fleet, &order, "paid", Duration::from_secs(30)).await;
    assert_eq!(status, "paid");
    let got: Value = fleet.get_order("ann", &order).await.unwrap().json().await.unwrap();
    assert!(got.get("payment").is_none(), "payment shows only while requires_action: {got}");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_events WHERE effect = 'authorized'")
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(applied, 1, "the webhook, not the sweeper, authorized it");
    let audit = orderfleet_tests::audit::Audit::of(
        &fleet,
        "sku-1",
        &fleet.notifications(2, Duration::from_secs(30)).await.unwrap(),
    )
    .await
    .unwrap();
    audit.assert_guarantees();
    fleet.stop().await.unwrap();
}

/// It counts as a decline at the card gate.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_authentication_declines_the_order_with_its_unit_back() {
    // Arrange: three units, and a card-testing limit of one decline an hour.
    let mut fleet = Fleet::builder("3ds-fails").default_limits().prepare().await.unwrap();
    fleet.set_env("INTAKE_DECLINES_PER_HOUR", "1");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 3).await.unwrap();
    let first = fleet.post_order("bob", "k-1", "sku-1", 1, "pm_card_authenticationRequired").await.unwrap();
    assert_eq!((first.status, &first.body["status"]), (202, &Value::from("requires_action")));
    let order = order_id(&first.body);

    // Act
    fleet.authenticate(&intent_of(&fleet, &order).await, false).await.unwrap();

    // Assert: declined with the reason, its unit back for the next buyer, the intent released.
    let (status, reason) = status_becomes(&fleet, &order, "payment_declined", Duration::from_secs(30)).await;
    assert_eq!((status.as_str(), reason.as_deref()), ("payment_declined", Some("authentication_failed")));
    assert_eq!(units_promised(&fleet, "sku-1").await, 0);
    let next = fleet.post_order("cat", "k-1", "sku-1", 2, "pm_card_visa").await.unwrap();
    assert_eq!(next.status, 202, "its unit is there again: {}", next.body);
    // A failed authentication is a decline: the buyer's next card is held back, though a unit
    // is left.
    let again = fleet.post_order("bob", "k-2", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(again.status, 429, "{}", again.body);
    fleet.wait_settled(Duration::from_secs(30)).await.unwrap();
    assert_eq!(fleet.holds_without_a_unit().await.unwrap(), 0);
    fleet.stop().await.unwrap();
}

/// Without webhooks, the sweeper releases it by its deadline.
#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_3ds_released_by_the_sweeper_counts_as_no_decline() {
    // Arrange: no webhook secret (the endpoint answers 503), a 2 s deadline, a sweeper every
    // second, and a card-testing limit of one.
    let mut fleet = Fleet::builder("3ds-abandoned").default_limits().prepare().await.unwrap();
    fleet.set_env("STRIPE_WEBHOOK_SECRET", "");
    fleet.set_env("PAYMENT_ACTION_TIMEOUT_SECONDS", "2");
    fleet.set_env("SWEEP_INTERVAL_SECONDS", "1");
    fleet.set_env("INTAKE_DECLINES_PER_HOUR", "1");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 3).await.unwrap();
    let first = fleet.post_order("dan", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    assert_eq!(first.body["status"], "requires_action", "{}", first.body);
    let order = order_id(&first.body);
    // While it is open it counts toward the limit, as a pending order does.
    let meanwhile = fleet.post_order("dan", "k-2", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(meanwhile.status, 429, "{}", meanwhile.body);

    // Act: the buyer never authenticates.
    let (status, reason) = status_becomes(&fleet, &order, "payment_declined", Duration::from_secs(30)).await;

    // Assert: released by its deadline, the intent cancelled, the unit back; it counts as
    // nothing, so the same buyer may try again at once.
    assert_eq!((status.as_str(), reason.as_deref()), ("payment_declined", Some("authentication_timed_out")));
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0]["status"], "canceled");
    assert_eq!(units_promised(&fleet, "sku-1").await, 0);
    let again = fleet.post_order("dan", "k-3", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(again.status, 202, "{}", again.body);
    fleet.wait_settled(Duration::from_secs(30)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// Its unit comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_hold_that_lapses_before_capture_ends_authorization_canceled() {
    // Arrange: no stock worker, so the order stays authorized.
    let mut fleet = Fleet::prepare("hold-lapses").await.unwrap();
    for bin in ["order-intake", "outbox-relay", "notification-worker"] {
        fleet.spawn(bin, bin, &[]).unwrap();
    }
    fleet.wait_intake().await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    let placed = fleet.post_order("eve", "k-1", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(placed.status, 202);
    let order = order_id(&placed.body);

    // Act: Stripe cancels the hold (it lapsed, or someone cancelled it in the Dashboard).
    fleet.expire_hold(&intent_of(&fleet, &order).await).await.unwrap();

    // Assert: the webhook moves the order on at once; its unit goes back to the line.
    let (status, reason) =
        status_becomes(&fleet, &order, "authorization_canceled", Duration::from_secs(30)).await;
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("authorization_canceled", Some("authorization_canceled"))
    );
    assert_eq!(units_promised(&fleet, "sku-1").await, 0);
    fleet.stop().await.unwrap();
}

/// A dispute is counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_refund_in_the_dashboard_is_recorded_and_notified() {
    // Arrange: two paid orders, one on a card whose payment is disputed after capture.
    let fleet = Fleet::start("refund-and-dispute", 1).await.unwrap();
    fleet.product("sku-1", 1500, 5).await.unwrap();
    let refunded = order_id(&fleet.post_order("fay", "k-1", "sku-1", 2, "pm_card_visa").await.unwrap().body);
    let disputed =
        order_id(&fleet.post_order("gus", "k-1", "sku-1", 1, "pm_card_createDispute").await.unwrap().body);
    fleet.wait_settled(Duration::from_secs(30)).await.unwrap();

    // Act: a partial refund, then the rest.
    let intent = intent_of(&fleet, &refunded).await;
    fleet.refund_at_stripe(&intent, Some(1000)).await.unwrap();
    // The webhook's effect, waited for: a loaded machine may take longer than a fixed pause.
    let partial: (String, i64) =
        fleet_harness::eventually("the partial refund recorded", Duration::from_secs(30), || async {
            let row: (String, i64) =
                sqlx::query_as("SELECT status::text, amount_refunded FROM orders WHERE id = $1::uuid")
                    .bind(&refunded)
                    .fetch_one(&fleet.pool)
                    .await
                    .ok()?;
            (row.1 > 0).then_some(row)
        })
        .await
        .unwrap();
    fleet.refund_at_stripe(&intent, None).await.unwrap();

    // Assert
    assert_eq!(partial, ("paid".to_owned(), 1000), "a partial refund is recorded, status unchanged");
    let (status, _) = status_becomes(&fleet, &refunded, "refunded", Duration::from_secs(30)).await;
    assert_eq!(status, "refunded");
    let notes = fleet.notifications(5, Duration::from_secs(30)).await.unwrap();
    assert!(notes.contains(&("order.refunded".to_owned(), refunded.clone())), "{notes:?}");
    let dispute: Option<String> = sqlx::query_scalar("SELECT dispute_id FROM orders WHERE id = $1::uuid")
        .bind(&disputed)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert!(dispute.is_some_and(|d| d.starts_with("dp_")));
    let metrics = fleet.scrape_metrics().await.join("\n");
    assert!(metrics.contains("stripe_disputes_total 1"), "the dispute is counted for operators");
    fleet.stop().await.unwrap();
}

/// It is answered 400.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_stale_altered_or_unsigned_webhook_changes_nothing() {
    // Arrange: an order awaiting 3-D Secure, and an event that would settle it.
    let fleet = Fleet::start("webhook-abuse", 1).await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    let placed = fleet.post_order("hal", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    let order = order_id(&placed.body);
    let intent = intent_of(&fleet, &order).await;
    let body = serde_json::json!({
        "id": "evt_forged", "object": "event", "type": "payment_intent.canceled",
        "data": {"object": {"id": intent, "object": "payment_intent", "metadata": {"order_id": order}}},
    })
    .to_string();
    let now = chrono::Utc::now().timestamp();
    let secret = fleet_harness::fleet::WEBHOOK_SECRET;
    // An event that passed the check would read the order's intent at Stripe: a request.
    let stripe_requests = || async { fleet.stripe_stats().await.unwrap()["requests"].as_u64().unwrap() };
    let before = stripe_requests().await;

    // Act and assert
    let cases = [
        ("unsigned", body.clone(), None),
        (
            "another secret",
            body.clone(),
            Some(stripe_sim::signature_header("whsec_attacker", now, body.as_bytes())),
        ),
        ("stale", body.clone(), Some(stripe_sim::signature_header(secret, now - 301, body.as_bytes()))),
        (
            "altered after signing",
            body.replace("payment_intent.canceled", "payment_intent.payment_failed"),
            Some(stripe_sim::signature_header(secret, now, body.as_bytes())),
        ),
        ("malformed", body.clone(), Some("t=now,v1=zz".to_owned())),
    ];
    for (case, body, signature) in cases {
        let (status, answer) = fleet.post_webhook(&body, signature.as_deref()).await.unwrap();
        assert_eq!(status, 400, "{case}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_signature", "{case}");
    }
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_events").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(events, 0, "nothing written");
    assert_eq!(status_becomes(&fleet, &order, "?", Duration::ZERO).await.0, "requires_action");
    assert_eq!(stripe_requests().await, before, "no refused event got as far as reading the order's intent");
    // The same event, signed: it is read (one request to Stripe), and changes nothing, the
    // intent being still `requires_action`.
    let signed = stripe_sim::signature_header(secret, now, body.as_bytes());
    assert_eq!(fleet.post_webhook(&body, Some(&signed)).await.unwrap().0, 200);
    assert_eq!(stripe_requests().await, before + 1, "a signed event is applied from the intent read fresh");
    // A validly signed event of a type the fleet does not use is 200, ignored, whatever its
    // object looks like (a Balance has no id).
    for unknown in [
        r#"{"id":"evt_new_kind","object":"event","type":"issuing_card.created","data":{"object":{"id":"ic_1","object":"issuing.card"}}}"#,
        r#"{"id":"evt_balance","object":"event","type":"balance.available","data":{"object":{"object":"balance","available":[]}}}"#,
    ] {
        let signed = stripe_sim::signature_header(secret, now, unknown.as_bytes());
        assert_eq!(fleet.post_webhook(unknown, Some(&signed)).await.unwrap().0, 200, "{unknown}");
    }
    fleet.stop().await.unwrap();
}

/// No buyer who lost is left with a hold.
#[tokio::test(flavor = "multi_thread")]
async fn a_drop_with_a_third_of_its_buyers_on_3ds_keeps_every_guarantee() {
    // Arrange: 60 buyers for 30 units, 18 of them (30 %) on a card that needs 3-D Secure: a
    // third authenticate, a third fail, a third abandon (a 10 s deadline). The 3-D Secure
    // buyers arrive at once, then the 42 others at once. Stripe delivers every webhook twice,
    // each copy up to 300 ms late, so copies cross.
    let mut fleet = Fleet::builder("3ds-drop").prepare().await.unwrap();
    fleet.set_env("PAYMENT_ACTION_TIMEOUT_SECONDS", "10");
    fleet.set_env("SWEEP_INTERVAL_SECONDS", "1");
    fleet.spawn_all(2).await.unwrap();
    fleet.duplicate_webhooks(300).await.unwrap();
    fleet.product("sku-1", 1500, 30).await.unwrap();
    let wave = |buyers: std::ops::Range<usize>, card: &'static str| {
        let fleet = &fleet;
        futures::future::join_all(buyers.map(move |i| async move {
            (i, fleet.post_order(&format!("buyer-{i}"), "k-1", "sku-1", 1, card).await.unwrap())
        }))
    };

    // Act
    let secure = wave(0..18, "pm_card_threeDSecure2Required").await;
    let others = wave(18..60, "pm_card_visa").await;
    for (i, answer) in &secure {
        assert_eq!(answer.body["status"], "requires_action", "buyer {i}: {}", answer.body);
        let intent = intent_of(&fleet, answer.body["order_id"].as_str().unwrap()).await;
        match i % 3 {
            0 => fleet.authenticate(&intent, true).await.unwrap(),
            1 => fleet.authenticate(&intent, false).await.unwrap(),
            _ => {} // abandons
        }
    }

    // Assert: every order ends; SPEC §8 holds; no buyer without a unit carries a hold.
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let audit = orderfleet_tests::audit::Audit::without_notifications(&fleet, "sku-1").await.unwrap();
    println!("{}", audit.figures("3ds-drop", 0));
    audit.assert_guarantees();
    assert_eq!(fleet.holds_without_a_unit().await.unwrap(), 0, "{statuses:?}");
    assert!(others.iter().all(|(_, a)| matches!(a.status, 202 | 409)), "needing 3-D Secure is never a 402");
    // Each buyer who needed 3-D Secure ended as their browser did.
    for (i, answer) in &secure {
        let (status, reason): (String, Option<String>) =
            sqlx::query_as("SELECT status::text, failure_reason FROM orders WHERE id = $1::uuid")
                .bind(answer.body["order_id"].as_str().unwrap())
                .fetch_one(&fleet.pool)
                .await
                .unwrap();
        let wanted = match i % 3 {
            0 => ("paid", None),
            1 => ("payment_declined", Some("authentication_failed")),
            _ => ("payment_declined", Some("authentication_timed_out")),
        };
        assert_eq!((status.as_str(), reason.as_deref()), wanted, "buyer {i}");
    }
    println!("3ds-drop: statuses={statuses:?}");
    fleet.stop().await.unwrap();
}

/// It cannot be applied yet: answered 503, with nothing written.
#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_refused_with_503_is_applied_when_stripe_sends_it_again() {
    // Arrange: an order awaiting 3-D Secure, whose lease another settler (the sweeper, here
    // played by the test) holds for three seconds: the webhook cannot settle it now.
    let fleet = Fleet::start("webhook-503", 1).await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    let placed = fleet.post_order("ivy", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    let order = order_id(&placed.body);
    let intent = intent_of(&fleet, &order).await;
    sqlx::query("UPDATE orders SET intake_lease_until = now() + interval '3 seconds' WHERE id = $1::uuid")
        .bind(&order)
        .execute(&fleet.pool)
        .await
        .unwrap();

    // Act: the buyer authenticates; Stripe sends amount_capturable_updated.
    fleet.authenticate(&intent, true).await.unwrap();

    // Assert: answered 503 while the lease lasts, nothing written; Stripe's retry applies it.
    let (status, _) = status_becomes(&fleet, &order, "paid", Duration::from_secs(60)).await;
    assert_eq!(status, "paid");
    let deliveries = fleet.webhook_deliveries().await.unwrap();
    let capturable: Vec<u64> = deliveries
        .iter()
        .filter(|d| d["type"] == "payment_intent.amount_capturable_updated")
        .map(|d| d["status"].as_u64().unwrap())
        .collect();
    assert_eq!(capturable.first(), Some(&503), "{deliveries:?}");
    assert_eq!(capturable.last(), Some(&200), "{deliveries:?}");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_events WHERE effect = 'authorized'")
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(applied, 1);
    fleet.stop().await.unwrap();
}

/// Its unit comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_settle_whose_cancel_meets_a_saved_500_still_declines_the_order() {
    // Arrange: an order awaiting 3-D Secure; Stripe will answer the next cancel 500, and save
    // that answer under its key (found by the model checker: every later settle re-sent the
    // key, heard the 500 again, and the order stayed requires_action for a day).
    let fleet = Fleet::start("3ds-cancel-500", 1).await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    let placed = fleet.post_order("joe", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    let order = order_id(&placed.body);
    fleet.fault("cancel", "error_500", 1).await.unwrap();

    // Act: the buyer fails 3-D Secure; the webhook's settle cancels the intent and meets the 500.
    fleet.authenticate(&intent_of(&fleet, &order).await, false).await.unwrap();

    // Assert: the intent read after the 500 holds nothing, so the order is declined, its unit
    // back.
    let (status, reason) = status_becomes(&fleet, &order, "payment_declined", Duration::from_secs(30)).await;
    assert_eq!((status.as_str(), reason.as_deref()), ("payment_declined", Some("authentication_failed")));
    assert_eq!(units_promised(&fleet, "sku-1").await, 0);
    fleet.stop().await.unwrap();
}

/// The create still executes at Stripe, which answers the retries 409 idempotency_key_in_use.
#[tokio::test(flavor = "multi_thread")]
async fn an_order_whose_key_is_in_use_at_stripe_is_authorized_on_one_intent() {
    // Arrange: Stripe is slow on the first authorization: the create runs, and its request
    // goes on executing for 10 s after the intake's client gave up (5 s), so the intake's
    // retries under the order's key are answered `409 idempotency_key_in_use` meanwhile.
    let fleet = Fleet::start("stripe-key-in-use", 1).await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    fleet.fault("create", "slow_confirm", 1).await.unwrap();

    // Act: the buyer retries a 503 with the same key, as a client does.
    let (answer, before) =
        fleet.post_order("kim", "k-1", "sku-1", 1, "pm_card_visa").retrying().await.unwrap();

    // Assert: accepted once the first request ended, on the intent it made: no second key, no
    // second hold, never a decline.
    assert_eq!(answer.status, 202, "{:?} after {before:?}", answer.body);
    assert!(before.iter().all(|s| *s == 503), "{before:?}");
    let intake_log = std::fs::read_to_string(fleet.log_dir().join("order-intake.log")).unwrap();
    assert!(intake_log.contains("idempotency_key_in_use"), "the intake never met the 409");
    let order = order_id(&answer.body);
    let attempt: i32 = sqlx::query_scalar("SELECT payment_attempt FROM orders WHERE id = $1::uuid")
        .bind(&order)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(attempt, 1, "the order's first key, never a new one while it was in use");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1, "{intents:?}");
    assert_eq!(
        (intents[0]["status"].as_str(), intents[0]["capture_count"].as_u64()),
        (Some("succeeded"), Some(1))
    );
    let (status, _) = status_becomes(&fleet, &order, "paid", Duration::from_secs(30)).await;
    assert_eq!(status, "paid");
    assert_eq!(fleet.holds_without_a_unit().await.unwrap(), 0);
    fleet.stop().await.unwrap();
}

/// The sweeper settles it by the deadline.
#[tokio::test(flavor = "multi_thread")]
async fn an_event_stripe_gives_up_on_leaves_its_order_to_the_sweeper() {
    // Arrange: Stripe as a sandbox gives an event up after three attempts (stripe-sim's take
    // 0.3 s); the sweeper runs every second; an order awaiting 3-D Secure whose lease another
    // settler holds for three seconds, so the intake answers the event 503 each time.
    let mut fleet = Fleet::builder("webhook-given-up").prepare().await.unwrap();
    fleet.set_env("STRIPE_SIM_WEBHOOK_ATTEMPTS", "3");
    fleet.set_env("SWEEP_INTERVAL_SECONDS", "1");
    assert!(fleet.terminate("stripe-sim").await.unwrap().success());
    fleet.spawn("stripe-sim", "stripe-sim", &[]).unwrap();
    fleet_harness::eventually("stripe-sim restarted", Duration::from_secs(30), || async {
        fleet.intents().await.ok().map(|_| ())
    })
    .await
    .unwrap();
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    let placed = fleet.post_order("lou", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    assert_eq!(placed.body["status"], "requires_action", "{}", placed.body);
    let order = order_id(&placed.body);
    sqlx::query("UPDATE orders SET intake_lease_until = now() + interval '3 seconds' WHERE id = $1::uuid")
        .bind(&order)
        .execute(&fleet.pool)
        .await
        .unwrap();

    // Act: the buyer authenticates; Stripe's amount_capturable_updated is refused three times,
    // then given up.
    fleet.authenticate(&intent_of(&fleet, &order).await, true).await.unwrap();
    let given_up =
        fleet_harness::eventually("three attempts of the event", Duration::from_secs(30), || async {
            let deliveries = fleet.webhook_deliveries().await.ok()?;
            let capturable: Vec<u64> = deliveries
                .iter()
                .filter(|d| d["type"] == "payment_intent.amount_capturable_updated")
                .filter_map(|d| d["status"].as_u64())
                .collect();
            (capturable.len() >= 3).then_some(capturable)
        })
        .await
        .unwrap();

    // Assert: no fourth attempt ever; the sweeper authorizes the order from its intent read
    // fresh once its deadline (6 s) has passed, and it is paid as any other.
    assert_eq!(given_up, [503, 503, 503]);
    let (status, _) = status_becomes(&fleet, &order, "paid", Duration::from_secs(60)).await;
    assert_eq!(status, "paid");
    let by_webhook: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_events WHERE effect = 'authorized'")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    assert_eq!(by_webhook, 0, "the sweeper, not a webhook, authorized it");
    let capturable = fleet
        .webhook_deliveries()
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d["type"] == "payment_intent.amount_capturable_updated");
    assert_eq!(capturable.count(), 3, "the event was given up");
    assert_eq!(fleet.intents().await.unwrap()[0]["capture_count"], 1);
    fleet.stop().await.unwrap();
}

/// Its unit comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_card_declined_after_authentication_ends_payment_declined() {
    // Arrange: one unit; Stripe's test card 4000 0082 6000 3178, which asks for 3-D Secure and,
    // once the buyer has authenticated, is declined for insufficient funds.
    let fleet = Fleet::start("3ds-then-declined", 1).await.unwrap();
    fleet.product("sku-1", 1500, 1).await.unwrap();
    let card = "pm_card_authenticationRequiredChargeDeclinedInsufficientFunds";
    let placed = fleet.post_order("max", "k-1", "sku-1", 1, card).await.unwrap();
    assert_eq!(
        (placed.status, &placed.body["status"]),
        (202, &Value::from("requires_action")),
        "{}",
        placed.body
    );
    let order = order_id(&placed.body);
    let intent = intent_of(&fleet, &order).await;

    // Act: the buyer authenticates; Stripe declines and sends payment_intent.payment_failed.
    fleet.authenticate(&intent, true).await.unwrap();

    // Assert: declined (SPEC §5 has no reason of its own for a decline after authentication:
    // the fleet says `authentication_failed`), the intent released, the unit back for the
    // next buyer, no hold left on a buyer who got nothing.
    let (status, reason) = status_becomes(&fleet, &order, "payment_declined", Duration::from_secs(30)).await;
    assert_eq!((status.as_str(), reason.as_deref()), ("payment_declined", Some("authentication_failed")));
    assert_eq!(units_promised(&fleet, "sku-1").await, 0);
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0]["status"], "canceled", "{}", intents[0]);
    assert_eq!(intents[0]["last_payment_error"]["decline_code"], "insufficient_funds");
    let next = fleet.post_order("ned", "k-1", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(next.status, 202, "its unit is there again: {}", next.body);
    fleet.wait_settled(Duration::from_secs(30)).await.unwrap();
    assert_eq!(fleet.holds_without_a_unit().await.unwrap(), 0);
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_3ds_is_released_at_its_deadline_not_the_next_sweep() {
    // Arrange: no webhooks, a 6 s deadline, and a sweep only every ten minutes.
    let mut fleet = Fleet::prepare("3ds-deadline").await.unwrap();
    fleet.set_env("STRIPE_WEBHOOK_SECRET", "");
    fleet.set_env("PAYMENT_ACTION_TIMEOUT_SECONDS", "6");
    fleet.set_env("SWEEP_INTERVAL_SECONDS", "600");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 3).await.unwrap();
    let first = fleet.post_order("eve", "k-1", "sku-1", 1, "pm_card_threeDSecure2Required").await.unwrap();
    assert_eq!(first.body["status"], "requires_action", "{}", first.body);
    let order = order_id(&first.body);
    let deadline: chrono::DateTime<chrono::Utc> =
        first.body["payment"]["action_expires_at"].as_str().unwrap().parse().unwrap();

    // Act: the buyer never authenticates.
    let (status, reason) = status_becomes(&fleet, &order, "payment_declined", Duration::from_secs(60)).await;

    // Assert: released within seconds of its deadline (before the fix: at the next sweep, up to
    // its period later), its hold cancelled and its unit back.
    assert_eq!((status.as_str(), reason.as_deref()), ("payment_declined", Some("authentication_timed_out")));
    let released: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT updated_at FROM orders WHERE id = $1::uuid")
            .bind(&order)
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    let late = released - deadline;
    assert!(late < chrono::TimeDelta::seconds(5), "released {late} after its deadline");
    assert_eq!(fleet.intents().await.unwrap()[0]["status"], "canceled");
    assert_eq!(units_promised(&fleet, "sku-1").await, 0);
    fleet.stop().await.unwrap();
}
