//! At-least-once delivery, exactly-once effects: duplicates of the same message change
//! nothing twice, and a message for a finished order is deleted without effects.

use std::time::Duration;

use orderfleet::domain::records::outbox::{Envelope, EventType};
use orderfleet_tests::Fleet;

/// The envelope the relay would send for the order's outbox row of `event_type`.
async fn envelope(fleet: &Fleet, event_type: EventType) -> String {
    let (message_id, order_id, payload, occurred_at) =
        sqlx::query_as("SELECT id, aggregate_id, payload, created_at FROM outbox WHERE event_type = $1")
            .bind(event_type)
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    let envelope: Envelope<serde_json::Value> =
        Envelope { message_id, event_type, order_id, occurred_at, payload };
    serde_json::to_string(&envelope).unwrap()
}

async fn send_times(fleet: &Fleet, queue_url: &str, body: &str, times: usize) {
    for _ in 0..times {
        fleet.sqs.send_message().queue_url(queue_url).message_body(body).send().await.unwrap();
    }
}

async fn wait_drained(fleet: &Fleet, queue_url: &str) {
    let drained = || async { (fleet.queue_depth(queue_url).await.ok()? == (0, 0)).then_some(()) };
    fleet_harness::eventually(&format!("{queue_url} drained"), Duration::from_secs(30), drained)
        .await
        .unwrap();
}

/// The stock checks the workers have handled so far, whatever the outcome (their metrics).
async fn stock_checks_handled(fleet: &Fleet) -> f64 {
    let queue = orderfleet_runtime::consumer::short_name(&fleet.stock.url);
    let handled = fleet_harness::metrics::sum_by_label(
        &fleet.scrape_metrics().await,
        "messages_handled_total",
        "queue",
    );
    handled.get(queue).copied().unwrap_or(0.0)
}

/// A message for the paid order is then deleted without effect.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_stock_check_delivered_5_times_captures_once() {
    // Arrange: an authorized order whose messages have not been relayed (no relay runs).
    let mut fleet = Fleet::prepare("redelivery").await.unwrap();
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet.product("sku-1", 900, 3).await.unwrap();
    // The intake may still be starting: waited for as everywhere, not within a tighter bound.
    fleet.wait_intake().await.unwrap();
    let answer = fleet.post_order("gina", "key-1", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(answer.status, 202);
    let stock_check = envelope(&fleet, EventType::StockCheckRequested).await;
    let accepted = envelope(&fleet, EventType::OrderAccepted).await;

    // Act: five copies of the stock check, three of the notification, two workers each.
    send_times(&fleet, &fleet.stock.url.clone(), &stock_check, 5).await;
    send_times(&fleet, &fleet.notification.url.clone(), &accepted, 3).await;
    fleet.spawn("stock-worker-0", "stock-worker", &[]).unwrap();
    fleet.spawn("stock-worker-1", "stock-worker", &[]).unwrap();
    fleet.spawn("notification-worker-0", "notification-worker", &[]).unwrap();
    fleet.spawn("notification-worker-1", "notification-worker", &[]).unwrap();
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    wait_drained(&fleet, &fleet.stock.url.clone()).await;
    wait_drained(&fleet, &fleet.notification.url.clone()).await;

    // Assert: one capture, one notification, nothing dead-lettered.
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0]["capture_count"], 1, "{intents:?}");
    assert_eq!(fleet.statuses().await.unwrap().get("paid"), Some(&1));
    let notified = fleet.notifications(1, Duration::from_secs(20)).await.unwrap();
    assert_eq!(notified.len(), 1, "{notified:?}");
    assert_eq!(
        fleet.queue_depth(&fleet.stock.dlq_url).await.unwrap(),
        (0, 0),
        "a duplicate was dead-lettered"
    );

    // Act again: the stock check for the now-paid order.
    let before: (i32, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT stock, updated_at FROM products WHERE id = 'sku-1'")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    let handled_before = stock_checks_handled(&fleet).await;
    send_times(&fleet, &fleet.stock.url.clone(), &stock_check, 1).await;
    // SQS's counts lag a send, so "drained" read at once could be the moment before the copy
    // is counted: first the copy handled, by the workers' own count, then drained (deleted).
    let handled = || async { (stock_checks_handled(&fleet).await > handled_before).then_some(()) };
    fleet_harness::eventually("the copy handled", Duration::from_secs(30), handled).await.unwrap();
    wait_drained(&fleet, &fleet.stock.url.clone()).await;

    // Assert: deleted, and nothing changed.
    let after: (i32, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT stock, updated_at FROM products WHERE id = 'sku-1'")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    assert_eq!(before, after);
    assert_eq!(fleet.intents().await.unwrap()[0]["capture_count"], 1);
    assert_eq!(fleet.queue_depth(&fleet.stock.dlq_url).await.unwrap(), (0, 0));
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_capture_keeps_its_message_invisible_to_the_other_worker() {
    // Arrange: a 3 s visibility timeout, and a capture that hangs past the client's 5 s
    // timeout before its retry succeeds.
    let fleet = Fleet::builder("heartbeat").stock_visibility(3).start(2).await.unwrap();
    fleet.product("sku-1", 900, 3).await.unwrap();
    fleet.fault("capture", "timeout", 1).await.unwrap();

    // Act
    let answer = fleet.post_order("judy", "key-1", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(answer.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    wait_drained(&fleet, &fleet.stock.url.clone()).await;

    // Assert: paid, captured once, and the stock check was received once in all — the
    // heartbeat kept it from the second worker while the first waited on Stripe.
    assert_eq!(fleet.statuses().await.unwrap().get("paid"), Some(&1));
    assert_eq!(fleet.intents().await.unwrap()[0]["capture_count"], 1);
    let received = fleet_harness::metrics::sum_by_label(
        &fleet.scrape_metrics().await,
        "sqs_messages_received_total",
        "queue",
    );
    let stock_queue = fleet.stock.url.rsplit('/').next().unwrap().to_owned();
    assert_eq!(received.get(&stock_queue), Some(&1.0), "{received:?}");
    fleet.stop().await.unwrap();
}
