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

/// The inbox's record of a publish fails as a database outage would (a trigger raises SQLSTATE
/// 57P03, `cannot_connect_now`), until the trigger is dropped.
async fn refuse_inbox_records(fleet: &Fleet) {
    for statement in [
        "CREATE FUNCTION refuse_the_record() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'the database is going away' USING ERRCODE = '57P03'; END $$",
        "CREATE TRIGGER refuse_the_record BEFORE UPDATE ON inbox FOR EACH ROW
           WHEN (NEW.processed_at IS NOT NULL) EXECUTE FUNCTION refuse_the_record()",
    ] {
        sqlx::query(statement).execute(&fleet.pool).await.unwrap();
    }
}

/// Nothing is published twice either.
#[tokio::test(flavor = "multi_thread")]
async fn a_publish_outage_with_the_topic_up_dead_letters_nothing() {
    // Arrange: Publish and PublishBatch lose their connection; everything else answers.
    let (fleet, proxy) = fleet_with_publish_proxy("publish-outage").await;
    fleet.product("sku-1", 1000, 40).await.unwrap();
    proxy.drop_requests_containing("Action=Publish");

    // Act: 40 orders, paid while no notification can go out; the outage lasts a minute, well
    // past the three receives the queue allows a message.
    let outage = Instant::now();
    let answers = futures::future::join_all((0..40).map(|i| {
        let fleet = &fleet;
        async move { place_in_a_burst(fleet, &format!("buyer-{i}"), "key", "sku-1").await }
    }))
    .await;
    assert!(
        answers.iter().all(|a| a.status == 202),
        "{:?}",
        answers.iter().map(|a| (a.status, a.body.to_string())).collect::<Vec<_>>()
    );
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

/// The notification worker, during a Publish outage.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_stopped_then_killed_mid_outage_dead_letters_nothing() {
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

/// SNS's answers to Publish are withheld for 45 s, so the worker publishes again; the
/// notification id tells the copies apart.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeat_after_withheld_publish_answers_is_told_apart_by_its_id() {
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

/// The failure falls between the publish and its record.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_failure_after_a_publish_publishes_nothing_again() {
    // Arrange: SNS answers, but the inbox's record of a publish fails for 40 s as a database
    // outage would (a trigger raises SQLSTATE 57P03, `cannot_connect_now`): no crash, no
    // answer lost, so SPEC §1.4 allows no repeat. 40 s is past the inbox
    // claim (30 s), after which the message used to be claimed and published again.
    let fleet = Fleet::start("publish-then-record-fails", 1).await.unwrap();
    fleet.product("sku-1", 1000, 2).await.unwrap();
    refuse_inbox_records(&fleet).await;

    // Act
    for i in 0..2 {
        assert_eq!(place(&fleet, &format!("buyer-{i}"), "key", "sku-1").await.status, 202);
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(40)).await;
    sqlx::query("DROP TRIGGER refuse_the_record ON inbox").execute(&fleet.pool).await.unwrap();

    // Assert: each of the four notifications delivered once.
    let delivered = fleet.notification_messages(4, Duration::from_secs(60)).await.unwrap();
    let mut by_id: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for outer in &delivered {
        let id = outer["MessageAttributes"]["notification_id"]["Value"].as_str().expect("a notification_id");
        *by_id.entry(id.to_owned()).or_default() += 1;
    }
    assert_eq!(by_id.len(), 4, "{by_id:?}");
    assert!(by_id.values().all(|n| *n == 1), "published again: {by_id:?}");
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}

/// Stopped while its records fail (a database outage); nothing is published again.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_worker_keeps_recording_its_publishes_within_its_grace() {
    // Arrange: SNS answers, but the inbox's record of a publish fails as a database outage
    // would (a trigger raises SQLSTATE 57P03); one order's two notifications go out and are
    // kept in hand, their records failing. The worker's grace is 30 s: longer than its polls
    // (20 s), so that the outage can outlast every poll still open at the stop (one could take
    // a message handed back and record it once the database is back) and still end in time.
    let mut fleet = Fleet::prepare("stop-while-records-fail").await.unwrap();
    for label in ["order-intake", "outbox-relay", "stock-worker"] {
        fleet.spawn(label, label, &[]).unwrap();
    }
    fleet.spawn("notification-worker", "notification-worker", &[("SHUTDOWN_GRACE_SECONDS", "30")]).unwrap();
    fleet.wait_intake().await.unwrap();
    fleet.product("sku-1", 1000, 1).await.unwrap();
    refuse_inbox_records(&fleet).await;
    assert_eq!(place(&fleet, "buyer", "key", "sku-1").await.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let published = fleet.notification_messages(2, Duration::from_secs(60)).await.unwrap();

    // Act: a graceful stop during the outage, which ends 24 s later: after every poll open at
    // the stop, within the grace. Then another worker, which takes up whatever was handed back.
    fleet.sigterm("notification-worker").unwrap();
    tokio::time::sleep(Duration::from_secs(24)).await;
    sqlx::query("DROP TRIGGER refuse_the_record ON inbox").execute(&fleet.pool).await.unwrap();
    let stopped = fleet.wait_exit("notification-worker", Duration::from_secs(60)).await.unwrap();
    fleet.spawn("notification-worker-2", "notification-worker", &[]).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let again = fleet.notification_messages(0, Duration::from_secs(5)).await.unwrap();

    // Assert: the stopping worker recorded both before it exited (before the fix it handed them
    // back, and the next worker, their claims lapsed, published both again).
    assert!(stopped.success(), "{stopped:?}");
    assert_eq!(published.len(), 2, "{published:?}");
    assert!(again.is_empty(), "published again: {again:?}");
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}

/// The first copy is held through a Publish outage.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_notification_s_second_copy_is_kept_in_hand_not_handed_back() {
    // Arrange: two orders' four notifications, each in the queue twice (SQS delivers at least
    // once; the relay may send a row again), and Publish taken away while the topic answers.
    // One message a receive, so the copies are handled apart: the first copy of each is held
    // through the outage under its inbox claim, which the second copy finds taken
    // (it came back once per claim, about a minute, with a receive
    // spent each time, and reached the DLQ after about three).
    let proxy = FilterProxy::start(localstack_addr()).await.unwrap();
    let mut fleet = Fleet::prepare("second-copy-during-publish-outage").await.unwrap();
    for label in ["order-intake", "outbox-relay", "stock-worker"] {
        fleet.spawn(label, label, &[]).unwrap();
    }
    fleet.wait_intake().await.unwrap();
    fleet.product("sku-1", 1000, 2).await.unwrap();
    for i in 0..2 {
        assert_eq!(place(&fleet, &format!("buyer-{i}"), "key", "sku-1").await.status, 202);
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let queue = fleet.notification.url.clone();
    let bodies = fleet.take_messages(&queue, 4).await.unwrap();
    for body in bodies.iter().chain(&bodies) {
        fleet.sqs.send_message().queue_url(&queue).message_body(body).send().await.unwrap();
    }
    proxy.drop_requests_containing("Action=Publish");

    // Act: the outage outlasts a claim (30 s, extended while the holder waits).
    let sns = proxy.url();
    let worker = [("AWS_ENDPOINT_URL_SNS", sns.as_str()), ("ORDERFLEET_BATCHING", "off")];
    fleet.spawn("notification-worker", "notification-worker", &worker).unwrap();
    tokio::time::sleep(Duration::from_secs(75)).await;

    // Assert: no copy was handed back (each would have its failure recorded for operators);
    // once Publish answers, each notification goes out once and nothing is dead-lettered.
    let queue_name = queue.rsplit('/').next().unwrap();
    let handed_back: Vec<(String, i32)> =
        sqlx::query_as("SELECT reason, failures FROM message_failures WHERE queue = $1")
            .bind(queue_name)
            .fetch_all(&fleet.pool)
            .await
            .unwrap();
    assert!(handed_back.is_empty(), "copies handed back with a receive spent: {handed_back:?}");
    proxy.forward_all();
    let delivered = fleet.notification_messages(4, Duration::from_secs(90)).await.unwrap();
    assert_eq!(delivered.len(), 4, "{delivered:?}");
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}
