//! A process killed or stopped at the worst moment: a stock worker between its steps, an
//! intake between Stripe's answer and its commit, SIGTERM to every worker mid-burst, a task
//! that dies inside a running process.

use super::*;

async fn a_stock_worker_killed_at(point: &str) {
    // Arrange: a visibility timeout of 22 s, so the dead worker's message comes back sooner
    // than the template's 60 s, but still later than its abandoned long polls (20 s) end: SQS
    // (and LocalStack) hand a message to a poll whose client is gone, so a visibility shorter
    // than the poll would let the dead worker's polls burn the message's receives.
    let case = format!("worker-killed-{point}");
    let mut fleet = Fleet::builder(&case).stock_visibility(22).prepare().await.unwrap();
    let no_sweep = ("SWEEP_INTERVAL_SECONDS", "0");
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet
        .spawn("doomed-stock-worker", "stock-worker", &[("ORDERFLEET_FAILPOINTS", point), no_sweep])
        .unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();

    // Act: the worker dies at the point; a new one takes over.
    let answer = place(&fleet, "kim", "key-1", "sku-1").await;
    assert_eq!(answer.status, 202);
    let died = fleet.wait_exit("doomed-stock-worker", Duration::from_secs(60)).await.unwrap();
    assert!(!died.success(), "the failpoint {point} was not reached");
    fleet.spawn("stock-worker", "stock-worker", &[no_sweep]).unwrap();
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Assert: exactly one capture, order paid.
    let audit = audit(&fleet, &case, "sku-1", 1, 2).await;
    assert_eq!(audit.by_status.get("paid"), Some(&1));
    assert_eq!(fleet.intents().await.unwrap()[0]["capture_count"], 1);
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stock_worker_killed_after_reserving_is_resumed_to_one_capture() {
    a_stock_worker_killed_at("after_reserve").await;
}

/// Killed after Stripe captured, before its commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_stock_worker_killed_after_the_capture_is_resumed_to_one_capture() {
    a_stock_worker_killed_at("after_capture").await;
}

/// Killed after its commit, before it deletes the message.
#[tokio::test(flavor = "multi_thread")]
async fn a_stock_worker_killed_before_its_delete_is_resumed_to_one_capture() {
    a_stock_worker_killed_at("after_paid").await;
}

/// Killed after Stripe authorized, before its commit.
#[tokio::test(flavor = "multi_thread")]
async fn an_intake_killed_after_authorizing_is_finished_by_the_sweeper() {
    // Arrange: the intake dies right after Stripe authorizes; its lease is 8 s.
    let mut fleet = Fleet::prepare("intake-killed").await.unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();
    spawn_intake_that_dies_after_authorizing(&mut fleet);
    // The intake may still be starting: the buyer sends until the order exists.
    let answered = eventually("the order created", Duration::from_secs(20), || async {
        let result = fleet.post_order("max", "key-1", "sku-1", 1, "pm_card_visa").await;
        fleet.statuses().await.unwrap().contains_key("pending_authorization").then_some(result)
    })
    .await
    .unwrap();
    assert!(answered.is_err(), "the client got an answer from a dead intake: {answered:?}");
    assert!(!fleet.wait_exit("doomed-intake", Duration::from_secs(10)).await.unwrap().success());
    assert_eq!(fleet.intents().await.unwrap().len(), 1, "Stripe authorized before the crash");

    // Act: the sweeper, once the lease has run out.
    the_dead_intake_s_lease_lapsed(&fleet).await;
    let report = fleet
        .fleetctl(&["sweep", "--pending-after-seconds", "0", "--fulfilment-after-seconds", "3600"], &[])
        .await
        .unwrap();
    assert!(report.contains("authorizations resolved 1"), "{report}");
    // Nothing was cut, so the sweeper's commit took the order's unit with its authorization.
    assert_eq!(fleet.statuses().await.unwrap().get("stock_reserved"), Some(&1));
    for (label, bin) in [
        ("order-intake", "order-intake"),
        ("outbox-relay", "outbox-relay"),
        ("stock-worker", "stock-worker"),
        ("notification-worker", "notification-worker"),
    ] {
        fleet.spawn(label, bin, &[]).unwrap();
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Assert: paid on the one authorization; the client's retry gets the order.
    let retry = place(&fleet, "max", "key-1", "sku-1").await;
    assert_eq!((retry.status, retry.replayed), (202, true), "{:?}", retry.body);
    let audit = audit(&fleet, "intake-killed-after-authorize", "sku-1", 1, 2).await;
    assert_eq!(audit.by_status.get("paid"), Some(&1));
    assert_eq!(fleet.intents().await.unwrap().len(), 1);
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_a_sweep_in_a_stripe_outage_after_the_order_in_hand() {
    // Arrange: eight orders reserved long ago, their stock checks gone (only the sweeper will
    // find them), and Stripe hanging on every capture: each order costs the sweep three
    // attempts of 5 s.
    let mut fleet = Fleet::prepare("sweep-stop").await.unwrap();
    for label in ["order-intake", "outbox-relay"] {
        fleet.spawn(label, label, &[]).unwrap();
    }
    fleet.product("sku-1", 1000, 8).await.unwrap();
    for i in 0..8 {
        assert_eq!(place(&fleet, &format!("u{i}"), "k", "sku-1").await.status, 202);
    }
    fleet.take_messages(&fleet.stock.url, 8).await.unwrap();
    sqlx::query("UPDATE orders SET updated_at = now() - interval '1 hour'")
        .execute(&fleet.pool)
        .await
        .unwrap();
    fleet.fault("capture", "timeout", 1000).await.unwrap();
    let before = fleet.stripe_stats().await.unwrap()["requests"].as_u64().unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[("SWEEP_INTERVAL_SECONDS", "1")]).unwrap();
    // Its SIGTERM handler in place (it answers /healthz), and the sweep at its first order
    // (stripe-sim has its first capture): waited for, not slept for.
    let health = fleet.metrics_url("stock-worker").unwrap().replace("/metrics", "/healthz");
    fleet_harness::eventually("the sweep at its first capture", Duration::from_secs(60), || async {
        fleet.http.get(&health).send().await.ok()?.error_for_status().ok()?;
        let requests = fleet.stripe_stats().await.ok()?["requests"].as_u64()?;
        (requests > before).then_some(())
    })
    .await
    .unwrap();

    // Act
    fleet.sigterm("stock-worker").unwrap();

    // Assert: the worker stops once the order in hand is done (three attempts, about 17 s),
    // not after the whole sweep (eight orders, over two minutes), which a supervisor would end
    // with SIGKILL. The orders stay for the next sweep.
    let stopped = fleet.wait_exit("stock-worker", Duration::from_secs(60)).await;
    assert!(stopped.as_ref().is_ok_and(|s| s.success()), "{stopped:?}");
    assert_eq!(fleet.statuses().await.unwrap().get("stock_reserved"), Some(&8));
    fleet.stop().await.unwrap();
}

/// Each order is still captured once.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_every_worker_mid_burst_dead_letters_nothing() {
    // Arrange
    let mut fleet = Fleet::start("sigterm-burst", 2).await.unwrap();
    fleet.product("drop", 1000, 150).await.unwrap();

    // Act: 500 buyers for 150 units; a third of the way into the sale, every worker and the
    // relay get SIGTERM.
    let burst = async {
        use futures::StreamExt;
        futures::stream::iter(0..500)
            .map(|i| {
                let fleet = &fleet;
                async move { fleet.post_order(&format!("u{i}"), "k", "drop", 1, "pm_card_visa").retrying().await }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await
    };
    let labels = ["stock-worker-0", "stock-worker-1", "notification-worker", "outbox-relay"];
    let stop = async {
        loop {
            let accepted: i64 =
                sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
            if accepted >= 50 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for label in labels {
            fleet.sigterm(label).unwrap();
        }
    };
    let (answers, ()) = tokio::join!(burst, stop);
    let answered =
        |status: u16| answers.iter().filter(|a| a.as_ref().is_ok_and(|(a, _)| a.status == status)).count();
    assert_eq!((answered(202), answered(409)), (150, 350), "every unit sold at the door, the rest sold out");
    for label in labels {
        let status = fleet.wait_exit(label, Duration::from_secs(60)).await.unwrap();
        assert!(status.success(), "{label} did not stop cleanly: {status}");
    }
    // The restart: the stopped workers' messages wait in the queues until then.
    for (label, bin) in [
        ("stock-worker-0", "stock-worker"),
        ("stock-worker-1", "stock-worker"),
        ("notification-worker", "notification-worker"),
        ("outbox-relay", "outbox-relay"),
    ] {
        fleet.spawn(label, bin, &[]).unwrap();
    }
    fleet.wait_settled(Duration::from_secs(180)).await.unwrap();

    // Assert
    let audit = audit(&fleet, "sigterm-mid-burst", "drop", 4, 300).await;
    assert_eq!(audit.orders, 150);
    assert_eq!(audit.by_status.get("paid"), Some(&150));
    assert_eq!(audit.cancelled_authorizations, 0, "a hold on a buyer who got nothing");
    assert!(dlqs_are_empty(&fleet).await, "a SIGTERM pushed a message to a DLQ");
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_whose_task_dies_exits_non_zero_with_a_line_naming_the_task() {
    // Arrange: each long-running process with one of its tasks made to panic (a failpoint);
    // everything else it needs is there, so only the dead task can end it.
    let mut fleet = Fleet::prepare("a-task-dies").await.unwrap();
    let cases = [
        (
            "stock-worker-sweeper",
            "stock-worker",
            "sweeper_panics",
            "sweeper",
            ("SWEEP_INTERVAL_SECONDS", "1"),
        ),
        ("stock-worker-poller", "stock-worker", "poller_panics", "consumer", ("SWEEP_INTERVAL_SECONDS", "0")),
        (
            "outbox-relay-retention",
            "outbox-relay",
            "retention_panics",
            "retention",
            ("OUTBOX_RETENTION_HOURS", "1"),
        ),
        (
            "outbox-relay-gauges",
            "outbox-relay",
            "gauges_panics",
            "gauges",
            ("OUTBOX_METRICS_INTERVAL_SECONDS", "1"),
        ),
        (
            "notification-worker-poller",
            "notification-worker",
            "poller_panics",
            "consumer",
            ("LOG_FORMAT", "text"),
        ),
    ];
    for (label, bin, point, _, setting) in cases {
        fleet.spawn(label, bin, &[("ORDERFLEET_FAILPOINTS", point), setting]).unwrap();
    }

    // Act + Assert: each exits by itself, non-zero, its last line naming the task and why.
    for (label, _, point, task, _) in cases {
        let status = fleet.wait_exit(label, Duration::from_secs(60)).await.unwrap();
        assert_eq!(status.code(), Some(1), "{label}: {status:?}");
        let log = std::fs::read_to_string(fleet.log_dir().join(format!("{label}.log"))).unwrap();
        let why = format!("the {task} task failed: ");
        let last = log.lines().rfind(|l| l.contains("stopped with an error")).unwrap_or_default();
        assert!(last.contains(&why) && last.contains(&format!("failpoint {point}")), "{label}: {last}");
    }
    fleet.stop().await.unwrap();
}
