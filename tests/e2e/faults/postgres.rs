//! PostgreSQL failing: unreachable behind a proxy, restarted mid-burst, refusing one order's
//! change (a data error), and holding orders the sweeper cannot settle.

use super::*;
use fleet_harness::proxy::Proxy;
use orderfleet_tests::{PostgresServer, TestDatabase};

#[tokio::test(flavor = "multi_thread")]
async fn with_postgres_unreachable_the_workers_delete_nothing_and_resume() {
    // Arrange: the workers reach PostgreSQL through a proxy; the intake and relay do not.
    let db_url = orderfleet_tests::stack_var("DATABASE_URL");
    let authority = db_url.split('@').nth(1).and_then(|rest| rest.split('/').next()).unwrap().to_owned();
    let pg: SocketAddr = authority.replace("localhost", "127.0.0.1").parse().unwrap();
    let proxy = Proxy::start(pg).await.unwrap();
    let mut fleet = Fleet::prepare("postgres-outage").await.unwrap();
    let proxied_url = fleet.db.url.replace(&authority, &proxy.addr.to_string());
    let via_proxy = [("DATABASE_URL", proxied_url.as_str()), ("SWEEP_INTERVAL_SECONDS", "0")];
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("stock-worker", "stock-worker", &via_proxy).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &via_proxy).unwrap();
    fleet.product("sku-1", 1000, 7).await.unwrap();
    assert_eq!(place(&fleet, "ola", "warm-up", "sku-1").await.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Act: cut the workers' database away while orders arrive.
    proxy.cut();
    for i in 0..6 {
        assert_eq!(place(&fleet, &format!("user-{i}"), "key", "sku-1").await.status, 202);
    }
    // A fixed wait: the outage lasts 10 s, to show that meanwhile nothing is deleted or dead;
    // then every check is seen in the queue (the relay's sends, and LocalStack's counts, may
    // lag on a loaded machine: a deleted message cannot come back, so waiting cannot hide one).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let all_there =
        fleet_harness::eventually("the six checks in the queue", Duration::from_secs(30), || async {
            let (visible, in_flight) = depth(&fleet, &fleet.stock.url).await;
            (visible + in_flight == 6).then_some(())
        })
        .await;
    assert!(all_there.is_ok(), "a stock check was deleted without its effects");
    assert!(dlqs_are_empty(&fleet).await, "a good message was dead-lettered during the outage");
    proxy.restore();
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert
    let audit = audit(&fleet, "postgres-unreachable-for-workers", "sku-1", 1, 14).await;
    assert_eq!(audit.by_status.get("paid"), Some(&7));
    assert_eq!(audit.by_status.get("rejected_out_of_stock"), None);
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_reaches_an_orphaned_order_behind_200_it_cannot_settle() {
    // Arrange: 200 old orders the sweeper can never settle (reserved, with no PaymentIntent: a
    // person must look), and one newer authorized order whose stock check is gone.
    let fleet = Fleet::prepare("sweeper-starvation").await.unwrap();
    fleet.product("sku-1", 1000, 500).await.unwrap();
    sqlx::query(
        "INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity, amount_minor,
                             currency, payment_method, status, position, updated_at)
         SELECT gen_random_uuid(), 'stuck-' || n, 'key', '\\x00', 'sku-1', 1, 1000, 'usd', 'pm_card_visa',
                'stock_reserved', n, now() - interval '1 hour'
           FROM generate_series(1, 200) AS n",
    )
    .execute(&fleet.pool)
    .await
    .unwrap();
    let orphan = uuid::Uuid::now_v7();
    let intent = fleet.hold_at_stripe(orphan).await.unwrap();
    sqlx::query(
        "INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity, amount_minor,
                             currency, payment_method, status, payment_intent_id, position, updated_at)
         VALUES ($1, 'orphan', 'key', '\\x00', 'sku-1', 1, 1000, 'usd', 'pm_card_visa', 'authorized', $2, 201,
                 now() - interval '10 minutes')",
    )
    .bind(orphan)
    .bind(intent["id"].as_str().unwrap())
    .execute(&fleet.pool)
    .await
    .unwrap();

    // Act: two passes of the sweeper, each taking its batch of 200.
    for _ in 0..2 {
        fleet.fleetctl(&["sweep", "--fulfilment-after-seconds", "60"], &[]).await.unwrap();
    }

    // Assert: the orphan was reached and finished.
    let status: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1")
        .bind(orphan)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(status, "paid", "the sweeper never reached the orphan behind the stuck orders");
    fleet.stop().await.unwrap();
}

/// Its message goes toward the DLQ while the other orders are paid.
#[tokio::test(flavor = "multi_thread")]
async fn a_data_error_for_one_order_does_not_pause_the_worker() {
    // Arrange: a trigger refuses one buyer's order its move to paid (the stock worker's step:
    // the commit that authorized it took its unit), as a constraint or a bad row would.
    let fleet = Fleet::start("data-error", 1).await.unwrap();
    fleet.product("sku-1", 1000, 11).await.unwrap();
    refuse_the_move_to(&fleet, "paid").await;

    // Act
    assert_eq!(place(&fleet, "refused", "key", "sku-1").await.status, 202);
    for i in 0..10 {
        assert_eq!(place(&fleet, &format!("buyer-{i}"), "key", "sku-1").await.status, 202);
    }
    let others_paid = || async { (fleet.statuses().await.unwrap().get("paid") == Some(&10)).then_some(()) };
    if let Err(e) = eventually("the others paid", Duration::from_secs(60), others_paid).await {
        panic!("{e:#}: {:?}", fleet.statuses().await.unwrap());
    }

    // Assert: the refused order's message was judged unprocessable, and never as an outage
    // that pauses the worker and probes.
    let outcomes = fleet_harness::metrics::sum_by_label(
        &fleet.scrape_metrics().await,
        "messages_handled_total",
        "outcome",
    );
    assert!(outcomes.get("permanent").copied().unwrap_or(0.0) >= 1.0, "{outcomes:?}");
    assert_eq!(
        outcomes.get("outage").copied().unwrap_or(0.0),
        0.0,
        "a data error paused the worker: {outcomes:?}"
    );
    fleet.stop().await.unwrap();
}

/// Once the database is writable again, the worker leaves its read-only sessions.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_database_dead_letters_nothing() {
    // Arrange: a server of the test's own (changing a role on the shared one would reach every
    // test beside this one). The stock worker's sessions turn read-only, as on a writer a
    // failover demoted: its role is set read-only and its sessions ended, so it reconnects
    // into read-only ones. `SELECT 1` still answers on them.
    let server = PostgresServer::start().unwrap();
    let db = TestDatabase::migrated_on(&server).await.unwrap();
    let fleet = Fleet::builder("read-only-database").database(db).start(1).await.unwrap();
    fleet.product("sku-1", 1000, 6).await.unwrap();
    assert_eq!(place(&fleet, "warm", "key", "sku-1").await.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let role: String = sqlx::query_scalar(
        "SELECT usename::text FROM pg_stat_activity WHERE application_name = 'stock-worker' LIMIT 1",
    )
    .fetch_one(&fleet.pool)
    .await
    .unwrap();
    let set = format!("ALTER ROLE {role} SET default_transaction_read_only = on");
    sqlx::query(sqlx::AssertSqlSafe(set)).execute(&fleet.pool).await.unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'stock-worker'",
    )
    .execute(&fleet.pool)
    .await
    .unwrap();

    // Act: two orders while the worker can only read; longer than their stock checks took to
    // reach the DLQ before the fix (about 35 s).
    for i in 0..2 {
        assert_eq!(place(&fleet, &format!("during-{i}"), "key", "sku-1").await.status, 202);
    }
    tokio::time::sleep(Duration::from_secs(45)).await;

    // Assert: nothing dead-lettered, nothing paid; then writable for new sessions, and the
    // orders are paid: the worker left its read-only sessions.
    assert!(
        dlqs_are_empty(&fleet).await,
        "a good message was dead-lettered while the database was read-only"
    );
    assert_eq!(fleet.statuses().await.unwrap().get("paid"), Some(&1));
    let reset = format!("ALTER ROLE {role} RESET default_transaction_read_only");
    sqlx::query(sqlx::AssertSqlSafe(reset)).execute(&fleet.pool).await.unwrap();
    for i in 0..3 {
        assert_eq!(place(&fleet, &format!("after-{i}"), "key", "sku-1").await.status, 202);
    }
    let paid = || async { (fleet.statuses().await.ok()?.get("paid") == Some(&6)).then_some(()) };
    if let Err(e) = eventually("every order paid", Duration::from_secs(60), paid).await {
        panic!("{e:#}: {:?}", fleet.statuses().await.unwrap());
    }
    audit(&fleet, "read-only-database", "sku-1", 1, 12).await;
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}

/// Waits until some session waits on a lock (a door statement behind the test's row lock).
async fn wait_for_a_statement_waiting_on_a_lock(fleet: &Fleet) {
    eventually("a statement waiting on the product row", Duration::from_secs(30), || async {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                .fetch_one(&fleet.pool)
                .await
                .unwrap();
        (waiting > 0).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_restarts_mid_burst_lose_nothing_and_do_nothing_twice() {
    // Arrange: a PostgreSQL server of the test's own (restarting the shared one would cut
    // every test beside this one), and the whole fleet on it.
    let server = std::sync::Arc::new(PostgresServer::start().unwrap());
    let db = TestDatabase::migrated_on(&server).await.unwrap();
    let fleet = Fleet::builder("postgres-restart").database(db).start(2).await.unwrap();
    fleet.product("drop", 1000, 60).await.unwrap();

    // Act: 200 buyers for 60 units, well-behaved clients that retry a 503 with their key. The
    // server restarts (a fast shutdown: every session terminated, open transactions rolled
    // back) once the first orders are in, with door statements cut off mid-flight; later,
    // while the workers capture, it stops for 3 s before it starts again.
    let burst = async {
        use futures::StreamExt;
        futures::stream::iter(0..200)
            .map(|i| {
                let fleet = &fleet;
                async move {
                    tokio::time::sleep(Duration::from_millis(10 * i)).await;
                    fleet.post_order(&format!("u{i}"), "k", "drop", 1, "pm_card_visa").retrying().await
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await
    };
    let restarts = async {
        for (threshold, down) in [(10, None), (40, Some(Duration::from_secs(3)))] {
            loop {
                let accepted: Result<i64, _> =
                    sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await;
                if accepted.is_ok_and(|n| n >= threshold) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The first restart cuts statements in the middle for certain: the door's, held
            // waiting on the product row, which a transaction of the test's own has locked.
            let mut blocker = None;
            if down.is_none() {
                let mut tx = fleet.pool.begin().await.unwrap();
                sqlx::query("SELECT 1 FROM products WHERE id = 'drop' FOR UPDATE")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                blocker = Some(tx);
                wait_for_a_statement_waiting_on_a_lock(&fleet).await;
            }
            let server = server.clone();
            let restart = move || match down {
                None => server.restart(),
                Some(down) => server.restart_slowly(down),
            };
            tokio::task::spawn_blocking(restart).await.unwrap().unwrap();
            // Its connection is gone with the restart; nothing is left to roll back.
            drop(blocker);
        }
    };
    let (answers, ()) = tokio::join!(burst, restarts);
    let answered =
        |status: u16| answers.iter().filter(|a| a.as_ref().is_ok_and(|(a, _)| a.status == status)).count();
    let retried: usize = answers.iter().flatten().map(|(_, earlier)| earlier.len()).sum();
    assert_eq!((answered(202), answered(409)), (60, 140), "every unit sold at the door, the rest sold out");
    fleet.wait_settled(Duration::from_secs(180)).await.unwrap();

    // Assert: every pool came back by itself; nothing lost, nothing twice, nothing dead-lettered.
    let audit = audit(&fleet, "postgres-restarted-twice", "drop", 2, 120).await;
    println!("fault-suite: postgres-restarted-twice client_retries={retried}");
    assert_eq!(audit.by_status.get("paid"), Some(&60));
    assert_eq!(audit.cancelled_authorizations, 0, "a hold on a buyer who got nothing");
    assert!(dlqs_are_empty(&fleet).await, "a restart pushed a message to a DLQ");
    fleet.stop().await.unwrap();
}

/// The next 3-D Secure order still lapses at its deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_3ds_settle_still_releases_its_hold() {
    // Arrange: no webhooks, so the sweeper settles 3-D Secure (every 2 s, deadlines of 10 s);
    // a trigger refuses the buyer `refused`'s 3-D Secure order any move but its failure.
    let mut fleet = Fleet::prepare("refused-settle").await.unwrap();
    fleet.set_env("STRIPE_WEBHOOK_SECRET", "");
    fleet.set_env("PAYMENT_ACTION_TIMEOUT_SECONDS", "10");
    fleet.set_env("SWEEP_INTERVAL_SECONDS", "2");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_settle() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.user_id = 'refused' AND OLD.status = 'requires_action'
                AND NEW.status IN ('authorized', 'stock_reserved') THEN
                 RAISE EXCEPTION 'refused by a test trigger' USING ERRCODE = 'check_violation';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_settle BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION refuse_settle();",
    )
    .execute(&fleet.pool)
    .await
    .unwrap();
    let card = "pm_card_threeDSecure2Required";
    let refused = fleet.post_order("refused", "key", "sku-1", 1, card).await.unwrap();
    let abandoned = fleet.post_order("abandoned", "key", "sku-1", 1, card).await.unwrap();
    for answer in [&refused, &abandoned] {
        assert_eq!(
            (answer.status, answer.body["status"].as_str()),
            (202, Some("requires_action")),
            "{answer:?}"
        );
    }
    let (refused, abandoned) =
        (refused.body["order_id"].as_str().unwrap(), abandoned.body["order_id"].as_str().unwrap());

    // Act: the first buyer authenticates; the second never does.
    fleet.authenticate_order(refused).await.unwrap();

    // Assert: the refused order ends failed with the database's reason, its hold released
    // (before the fix: `requires_action`, its hold live, and every later sweep ended at it);
    // the abandoned order behind it is still released at its deadline.
    let settled = eventually("both orders settled", Duration::from_secs(60), || async {
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT id::text, status::text, failure_reason FROM orders WHERE status <> 'requires_action'",
        )
        .fetch_all(&fleet.pool)
        .await
        .unwrap();
        (rows.len() == 2).then_some(rows)
    })
    .await;
    let rows = match settled {
        Ok(rows) => rows,
        Err(e) => panic!("{e:#}: {:?}", fleet.statuses().await.unwrap()),
    };
    let of = |id: &str| rows.iter().find(|r| r.0 == id).map(|r| (r.1.as_str(), r.2.as_deref())).unwrap();
    assert_eq!(of(refused), ("payment_declined", Some("order_refused")));
    assert_eq!(of(abandoned), ("payment_declined", Some("authentication_timed_out")));
    // With the database's words (SPEC §8.5: "ended failed with the database's reason").
    let detail: Option<String> = sqlx::query_scalar("SELECT decline_detail FROM orders WHERE id = $1::uuid")
        .bind(refused)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert!(detail.as_deref().is_some_and(|d| d.contains("refused by a test trigger")), "{detail:?}");
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 2, "{intents:?}");
    assert!(intents.iter().all(|i| i["status"] == "canceled"), "a hold is left: {intents:?}");
    assert_eq!(fleet.units("sku-1").await.unwrap().2, 0, "a unit is still promised");
    fleet.stop().await.unwrap();
}
