//! SQS failing: unreachable behind a proxy, a `DeleteMessageBatch` that hangs, and a queue
//! that does not exist (a permanent outbox failure).

use super::*;
use fleet_harness::proxy::{FilterProxy, Proxy};

/// SQS is unreachable; everything drains afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn the_intake_keeps_accepting_through_an_outage() {
    // Arrange: every fleet process reaches SQS and SNS only through a proxy.
    let proxy = Proxy::start(localstack_addr()).await.unwrap();
    let mut fleet = Fleet::prepare("sqs-outage").await.unwrap();
    let endpoint = proxy.url();
    let via_proxy = [("AWS_ENDPOINT_URL", endpoint.as_str())];
    for (label, bin) in [
        ("order-intake", "order-intake"),
        ("outbox-relay", "outbox-relay"),
        ("stock-worker", "stock-worker"),
        ("notification-worker", "notification-worker"),
    ] {
        fleet.spawn(label, bin, &via_proxy).unwrap();
    }
    fleet.product("sku-1", 1000, 9).await.unwrap();
    assert_eq!(place(&fleet, "ned", "warm-up", "sku-1").await.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    // Settled is not relayed: the warm-up's order.paid row may still wait for the relay, and
    // the cut must find the outbox empty, or it would count 17 rows below, not 16. Nor is
    // relayed published: a cut that lost SNS's answer to the warm-up's publish would have it
    // published again (§1.4's one repeat), and the audit would count it twice.
    eventually("the warm-up's messages relayed and published", Duration::from_secs(30), || async {
        let (unsent, unpublished): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM outbox WHERE status <> 'sent'),
                    (SELECT count(*) FROM outbox o WHERE o.destination = 'notification'
                        AND NOT EXISTS (SELECT 1 FROM inbox i
                                         WHERE i.message_id = o.id AND i.processed_at IS NOT NULL))",
        )
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
        (unsent == 0 && unpublished == 0).then_some(())
    })
    .await
    .unwrap();

    // Act: cut SQS away, take orders, wait, restore.
    proxy.cut();
    for i in 0..8 {
        let answer = place(&fleet, &format!("user-{i}"), "key", "sku-1").await;
        assert_eq!(answer.status, 202, "the intake needs no SQS: {:?}", answer.body);
    }
    // A fixed wait: the outage lasts 6 s, to show that meanwhile no row is charged a retry.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let waiting: Vec<(String, i32)> =
        sqlx::query_as("SELECT status::text, retry_count FROM outbox WHERE status <> 'sent'")
            .fetch_all(&fleet.pool)
            .await
            .unwrap();
    assert_eq!(waiting.len(), 16, "each accepted order's two messages wait in the outbox");
    assert!(waiting.iter().all(|(status, retries)| status != "dead" && *retries == 0), "{waiting:?}");
    proxy.restore();
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert
    let audit = audit(&fleet, "sqs-unreachable", "sku-1", 1, 18).await;
    assert_eq!(audit.by_status.get("paid"), Some(&9));
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}

/// It is retried once the queue is fixed.
#[tokio::test(flavor = "multi_thread")]
async fn a_permanent_outbox_failure_is_dead_with_its_reason() {
    // Arrange: the relay is configured with a notification queue that does not exist.
    let mut fleet = Fleet::prepare("dead-outbox").await.unwrap();
    let missing = format!("{}-missing", fleet.notification.url);
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet
        .spawn("misconfigured-relay", "outbox-relay", &[("NOTIFICATION_QUEUE_URL", missing.as_str())])
        .unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();

    // Act
    assert_eq!(place(&fleet, "rae", "key-1", "sku-1").await.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let dead = eventually("both rows dead", Duration::from_secs(30), || async {
        let dead = fleet.fleetctl(&["outbox", "dead"], &[]).await.unwrap();
        dead.starts_with("2 dead").then_some(dead)
    })
    .await
    .unwrap();

    // Assert: dead at once, with the code and reason, and nothing retried meanwhile.
    assert!(dead.starts_with("2 dead"), "{dead}");
    assert!(dead.contains("NonExistentQueue") || dead.contains("QueueDoesNotExist"), "{dead}");
    assert!(dead.contains("after 1 attempts"), "{dead}");

    // Act: fix the relay, retry the dead rows.
    assert!(fleet.terminate("misconfigured-relay").await.unwrap().success());
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    let retried = fleet.fleetctl(&["outbox", "retry", "--all"], &[]).await.unwrap();
    assert!(retried.starts_with("2 outbox rows re-queued"), "{retried}");

    // Assert: delivered, once.
    let audit = audit(&fleet, "permanent-outbox-failure", "sku-1", 2, 2).await;
    assert_eq!(audit.by_status.get("paid"), Some(&1));
    let (dead_rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox WHERE status = 'dead'")
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(dead_rows, 0);
    fleet.stop().await.unwrap();
}

/// Nor does it repeat a notification.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_delete_message_batch_keeps_no_worker_from_stopping() {
    // Arrange: the notification worker reaches SQS through a proxy that never answers
    // DeleteMessageBatch (its connections held open); everything else answers.
    let proxy = FilterProxy::start(localstack_addr()).await.unwrap();
    let mut fleet = Fleet::prepare("delete-hangs").await.unwrap();
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    let sqs = proxy.url();
    fleet
        .spawn("notification-worker", "notification-worker", &[("AWS_ENDPOINT_URL_SQS", sqs.as_str())])
        .unwrap();
    fleet.wait_intake().await.unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();
    proxy.hang_requests_containing("AmazonSQS.DeleteMessageBatch");

    // Act: five orders' ten notifications go out while their deletes hang; then a SIGTERM.
    for i in 0..5 {
        assert_eq!(place(&fleet, &format!("buyer-{i}"), "key", "sku-1").await.status, 202);
    }
    let published = fleet.notifications(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(published.len(), 10, "publishing stalled behind the hung deletes");
    assert!(proxy.dropped() > 0, "no delete was held");
    fleet.sigterm("notification-worker").unwrap();
    let stopped = fleet.wait_exit("notification-worker", Duration::from_secs(60)).await;

    // Assert: it stopped within its grace and the bound on its calls; the messages it could
    // not delete come back to a new worker, which deletes them without a second publish.
    assert!(stopped.is_ok(), "a hung DeleteMessageBatch kept the worker from stopping: {stopped:?}");
    proxy.forward_all();
    fleet.spawn("notification-worker-2", "notification-worker", &[]).unwrap();
    eventually("the undeleted notifications settled", Duration::from_secs(90), || async {
        (depth(&fleet, &fleet.notification.url).await == (0, 0)).then_some(())
    })
    .await
    .unwrap();
    let repeats = fleet.notifications(0, Duration::from_secs(3)).await.unwrap();
    assert!(repeats.is_empty(), "published twice: {repeats:?}");
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}
