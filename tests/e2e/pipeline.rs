//! The order pipeline end to end: the real binaries against PostgreSQL, LocalStack and
//! stripe-sim, checked against SPEC §8 from stripe-sim's ledger, the database and SNS.

use std::time::Duration;

use orderfleet_tests::Fleet;
use serde_json::Value;

fn count(intents: &[Value], field: &str) -> i64 {
    intents.iter().map(|i| i[field].as_i64().unwrap_or(0)).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_order_is_authorized_captured_paid_and_notified_once_per_event() {
    // Arrange
    let fleet = Fleet::start("happy-path", 1).await.unwrap();
    fleet.product("sku-1", 2500, 5).await.unwrap();

    // Act
    let answer = fleet.post_order("alice", "key-1", "sku-1", 2, "pm_card_visa").await.unwrap();

    // Assert
    assert_eq!(answer.status, 202, "{:?}", answer.body);
    assert_eq!(answer.body["status"], "authorized");
    assert_eq!(answer.body["amount"], 5000);
    assert_eq!(answer.body["currency"], "usd");
    assert_eq!(answer.body["quantity"], 2);
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&1), "{statuses:?}");
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1, "one authorization");
    assert_eq!(intents[0]["status"], "succeeded");
    assert_eq!(count(&intents, "capture_count"), 1);
    assert_eq!(intents[0]["metadata"]["order_id"], answer.body["order_id"]);
    let stock: i32 = sqlx::query_scalar("SELECT stock FROM products WHERE id = 'sku-1'")
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(stock, 3);
    let mut events: Vec<String> =
        fleet.notifications(2, Duration::from_secs(30)).await.unwrap().into_iter().map(|(e, _)| e).collect();
    events.sort();
    assert_eq!(events, ["order.accepted", "order.paid"]);

    // The order as its owner sees it, and as another user does not.
    let order_id = answer.body["order_id"].as_str().unwrap();
    let mine: Value = fleet.get_order("alice", order_id).await.unwrap().json().await.unwrap();
    assert_eq!(mine["status"], "paid");
    let theirs = fleet.get_order("mallory", order_id).await.unwrap();
    assert_eq!(theirs.status().as_u16(), 404);
    fleet.stop().await.unwrap();
}

/// It authorizes 50, cancels none, and turns 150 away sold out.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_200_buyers_for_50_units_sells_exactly_50() {
    // Arrange
    let fleet = Fleet::start("flash-sale", 2).await.unwrap();
    fleet.product("drop", 1000, 50).await.unwrap();

    // Act: 200 users at once, one unit each, each a well-behaved client. The 50 promised
    // units' creates go out at Stripe's 25 a second (the fleet's budget), so the last of them
    // waits over two seconds for its turn; on a busy machine one can pass the 4 s an intake
    // waits and answer `503` with `Retry-After` (its order keeps its unit), and the buyer asks
    // again with the same key, as a client does.
    let answers: Vec<_> = futures::future::join_all((0..200).map(|i| {
        fleet.post_order(&format!("user-{i}"), &format!("key-{i}"), "drop", 1, "pm_card_visa").retrying()
    }))
    .await
    .into_iter()
    .map(|a| a.unwrap().0)
    .collect();

    // Assert (SPEC §8.8): exactly the units are accepted, each with its own place in line;
    // everyone else hears sold_out, with nothing written and no PaymentIntent.
    let accepted: Vec<_> = answers.iter().filter(|a| a.status == 202).collect();
    let sold_out =
        answers.iter().filter(|a| a.status == 409 && a.body["error"]["code"] == "sold_out").count();
    assert_eq!(
        (accepted.len(), sold_out),
        (50, 150),
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    let mut positions: Vec<i64> = accepted.iter().map(|a| a.body["position"].as_i64().unwrap()).collect();
    positions.sort();
    assert_eq!(positions, (1..=50).collect::<Vec<_>>());
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(orders, 50, "a sold-out answer wrote an order");
    let statuses = fleet.wait_settled(Duration::from_secs(180)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&50), "{statuses:?}");
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 50, "one PaymentIntent per unit, none for a buyer who got nothing");
    assert_eq!(count(&intents, "capture_count"), 50, "captures");
    assert_eq!(count(&intents, "cancel_count"), 0, "cancels");
    let holds = intents.iter().filter(|i| i["status"] == "requires_capture").count();
    assert_eq!(holds, 0, "authorization holds left behind");
    let stock: i32 = sqlx::query_scalar("SELECT stock FROM products WHERE id = 'drop'")
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(stock, 0);
    // Once every unit is sold, nothing can come back: sold_out without Retry-After.
    let late = fleet.post_order("late", "key-1", "drop", 1, "pm_card_visa").await.unwrap();
    assert_eq!((late.status, late.retry_after.as_deref()), (409, None), "{:?}", late.body);
    // Every intake and fulfilment commit notified the relay; the burst's leftover notifications
    // must not each wake a claim that finds nothing (the relay spun through thousands of them
    // after a 2,000-order bench burst before it drained them at once).
    let metrics = fleet.scrape_metrics().await;
    let claims = fleet_harness::metrics::sum_by_label(&metrics, "outbox_claims_total", "result");
    let empty = claims.get("empty").copied().unwrap_or(0.0);
    assert!(empty < 50.0, "the relay made {empty} empty claims: {claims:?}");
    // Each process's pool shows how its checkouts went: the burst's went through, none timed out.
    let checkouts = fleet_harness::metrics::sum_by_label(&metrics, "db_pool_checkouts_total", "outcome");
    assert!(checkouts.get("direct").copied().unwrap_or(0.0) > 0.0, "{checkouts:?}");
    assert_eq!(checkouts.get("timed_out").copied().unwrap_or(0.0), 0.0, "{checkouts:?}");
    let pools = fleet_harness::metrics::sum_by_label(&metrics, "db_pool_connections", "pool");
    assert!(pools.keys().any(|pool| pool == "order-intake"), "{pools:?}");
    // Every metric a process serves is one its binary declares: each has its help text.
    for text in &metrics {
        for family in text.lines().filter_map(|line| line.strip_prefix("# TYPE ")) {
            let name = family.split(' ').next().unwrap_or_default();
            assert!(text.contains(&format!("# HELP {name} ")), "{name} is served with no help text");
        }
    }
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declined_card_answers_402_and_sends_no_stock_check() {
    let fleet = Fleet::start("declined", 1).await.unwrap();
    fleet.product("sku-1", 700, 5).await.unwrap();

    let answer = fleet.post_order("bob", "key-1", "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
    assert_eq!(answer.status, 402, "{:?}", answer.body);
    assert_eq!(answer.body["error"]["code"], "payment_declined");
    let replay = fleet.post_order("bob", "key-1", "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
    assert_eq!(replay.status, 402);
    assert!(replay.replayed);
    assert_eq!(replay.body, answer.body);

    let statuses = fleet.statuses().await.unwrap();
    assert_eq!(statuses.get("payment_declined"), Some(&1), "{statuses:?}");
    let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(outbox, 0, "a declined order enqueued messages");
    let intents = fleet.intents().await.unwrap();
    assert!(intents.iter().all(|i| i["status"] != "requires_capture"));
    fleet.stop().await.unwrap();
}
