//! SNS failing: `Publish` taken away while the topic still answers, and answers withheld
//! long enough that the worker publishes again.

use super::*;
use std::time::Instant;

use fleet_harness::proxy::FilterProxy;

/// The notification worker behind a proxy that can take SNS's Publish away while the topic
/// still answers `GetTopicAttributes` (Publish throttled, or a KMS fault on the topic); the rest
/// of the fleet talks to LocalStack directly.
async fn fleet_with_publish_proxy(case: &str) -> (Fleet, FilterProxy) {
    let proxy = FilterProxy::start(localstack_addr()).await.unwrap();
    let mut fleet = Fleet::prepare(case).await.unwrap();
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    let sns = proxy.url();
    fleet
        .spawn("notification-worker", "notification-worker", &[("AWS_ENDPOINT_URL_SNS", sns.as_str())])
        .unwrap();
    fleet.wait_intake().await.unwrap();
    (fleet, proxy)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_sns_publish_outage_with_the_topic_still_answering_dead_letters_nothing_and_publishes_nothing_twice()
 {
    // Arrange: Publish and PublishBatch lose their connection; everything else answers.
    let (fleet, proxy) = fleet_with_publish_proxy("publish-outage").await;
    fleet.product("sku-1", 1000, 40).await.unwrap();
    proxy.drop_requests_containing("Action=Publish");

    // Act: 40 orders, paid while no notification can go out; the outage lasts a minute, well
    // past the three receives the queue allows a message.
    let outage = Instant::now();
    let answers = futures::future::join_all((0..40).map(|i| {
        let fleet = &fleet;
        async move { place(fleet, &format!("buyer-{i}"), "key", "sku-1").await }
    }))
    .await;
    assert!(answers.iter().all(|a| a.status == 202));
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(outage.elapsed())).await;
    let dropped = proxy.dropped();
    proxy.forward_all();

    // Assert: every notification published once, none dead-lettered.
    assert!(dropped >= 10, "the outage dropped only {dropped} publishes");
    let audit = audit(&fleet, "sns-publish-outage", "sku-1", 1, 80).await;
    assert_eq!(audit.by_status.get("paid"), Some(&40));
    assert!(dlqs_are_empty(&fleet).await, "a notification was dead-lettered by a Publish outage");
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notification_worker_stopped_and_then_killed_during_a_publish_outage_leaves_nothing_dead_lettered()
{
    // Arrange: Publish is down, and ten orders' notifications are in the worker's hands.
    let (mut fleet, proxy) = fleet_with_publish_proxy("publish-outage-stop-and-crash").await;
    fleet.product("sku-1", 1000, 10).await.unwrap();
    proxy.drop_requests_containing("Action=Publish");
    for i in 0..10 {
        assert_eq!(place(&fleet, &format!("buyer-{i}"), "key", "sku-1").await.status, 202);
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Act: SIGTERM cuts the worker off mid-outage; its successor is killed outright; a third
    // starts, and only then does Publish come back. The messages come back to workers while
    // the claims the first two left are still held, and as those claims and the messages'
    // visibility timeouts run out together.
    let sns = proxy.url();
    let via_proxy = [("AWS_ENDPOINT_URL_SNS", sns.as_str())];
    let status = fleet.terminate("notification-worker").await.unwrap();
    assert!(status.success(), "{status}");
    fleet.spawn("notification-worker-2", "notification-worker", &via_proxy).unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    fleet.kill("notification-worker-2").await.unwrap();
    fleet.spawn("notification-worker-3", "notification-worker", &via_proxy).unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    proxy.forward_all();

    // Assert
    let audit = audit(&fleet, "sns-publish-outage-stop-and-crash", "sku-1", 3, 20).await;
    assert_eq!(audit.by_status.get("paid"), Some(&10));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(dlqs_are_empty(&fleet).await, "a notification was dead-lettered across a stop or a crash");
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_answers_withheld_for_45_s_repeat_notifications_which_their_notification_id_tells_apart() {
    // Arrange: SNS takes every PublishBatch, but for 45 s its answers never arrive (the calls
    // time out after SNS published): the one case besides a crash in which a notification can
    // go out twice (SPEC §1.4).
    let (fleet, proxy) = fleet_with_publish_proxy("publish-answers-lost").await;
    fleet.product("sku-1", 1000, 5).await.unwrap();
    proxy.withhold_answers_containing("Action=PublishBatch");

    // Act: five orders paid while the answers are lost; then they come through again.
    for i in 0..5 {
        assert_eq!(place(&fleet, &format!("buyer-{i}"), "key", "sku-1").await.status, 202);
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(45)).await;
    let withheld = proxy.dropped();
    proxy.forward_all();

    // Assert: every notification arrived; repeats are counted, and every copy carries the
    // notification_id of its envelope, by which a subscriber keeps exactly one of each.
    let delivered = fleet.notification_messages(10, Duration::from_secs(90)).await.unwrap();
    let mut by_id: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut kept = std::collections::HashSet::new();
    for outer in &delivered {
        let id = outer["MessageAttributes"]["notification_id"]["Value"].as_str().expect("a notification_id");
        *by_id.entry(id.to_owned()).or_default() += 1;
        let inner: serde_json::Value = serde_json::from_str(outer["Message"].as_str().unwrap()).unwrap();
        let event = outer["MessageAttributes"]["event_type"]["Value"].as_str().unwrap().to_owned();
        kept.insert((id.to_owned(), event, inner["order_id"].as_str().unwrap().to_owned()));
    }
    let repeats = delivered.len() - by_id.len();
    println!(
        "fault-suite: publish-answers-withheld-45s: {withheld} PublishBatch answers withheld, {} notifications, {} deliveries ({repeats} repeats, at most {} of one)",
        by_id.len(),
        delivered.len(),
        by_id.values().max().copied().unwrap_or(0)
    );
    assert!(withheld >= 1, "no answer was withheld");
    assert_eq!(by_id.len(), 10, "each order's two notifications, by notification_id: {by_id:?}");
    let events_per_order: std::collections::HashSet<(String, String)> =
        kept.iter().map(|(_, event, order)| (event.clone(), order.clone())).collect();
    assert_eq!(events_per_order.len(), 10, "one notification_id per (order, event)");
    assert_eq!(kept.len(), 10, "a notification_id names one (order, event): {kept:?}");
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}
