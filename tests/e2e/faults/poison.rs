//! Messages that can never succeed: they reach the DLQ with their reason while good work
//! goes on, keep their failures under their envelope id, and are redriven once fixed.

use super::*;
use orderfleet::domain::records::outbox::{Envelope, EventType};

/// A fixed one, redriven, is handled once.
#[tokio::test(flavor = "multi_thread")]
async fn messages_reach_the_dlq_while_work_goes_on() {
    // Arrange
    let fleet = Fleet::start("poison", 1).await.unwrap();
    fleet.product("sku-1", 1000, 5).await.unwrap();
    let unknown_order = uuid::Uuid::now_v7();
    let envelope = |event_type: &str, order_id: uuid::Uuid| {
        // Written by hand: an unknown event type is not one `Envelope` can hold.
        serde_json::json!({
            "message_id": uuid::Uuid::now_v7(),
            "event_type": event_type,
            "order_id": order_id,
            "occurred_at": chrono::Utc::now(),
            "payload": {},
        })
        .to_string()
    };
    let poison = [
        "this is not JSON".to_owned(),
        envelope("order.shipped", uuid::Uuid::now_v7()),
        envelope("order.stock_check_requested", unknown_order),
    ];

    // Act: three poison messages, and a good order beside them.
    for body in &poison {
        fleet.sqs.send_message().queue_url(&fleet.stock.url).message_body(body).send().await.unwrap();
    }
    assert_eq!(place(&fleet, "pat", "key-1", "sku-1").await.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    eventually("the poison in the DLQ", Duration::from_secs(90), || async {
        (depth(&fleet, &fleet.stock.dlq_url).await.0 >= 3).then_some(())
    })
    .await
    .unwrap();

    // Assert: dead-lettered with their reasons, and the good order went through meanwhile.
    assert_eq!(fleet.statuses().await.unwrap().get("paid"), Some(&1));
    let peek = fleet.fleetctl(&["dlq", "peek", "--queue", "stock"], &[]).await.unwrap();
    for reason in ["not a message envelope", "unknown event type", "unknown order"] {
        assert!(peek.contains(reason), "{reason} not shown:\n{peek}");
    }
    let stats = fleet.fleetctl(&["dlq", "stats"], &[]).await.unwrap();
    println!("{stats}");
    assert!(stats.contains("Stock DLQ: 3 messages"), "{stats}");

    // Act: fix the cause of one (its order arrives, authorized at Stripe), then redrive.
    let intent = fleet.hold_at_stripe(unknown_order).await.unwrap();
    sqlx::query(
        "WITH promised AS (
             UPDATE products SET units_promised = units_promised + 1, last_position = last_position + 1
              WHERE id = 'sku-1' RETURNING last_position
         )
         INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity, amount_minor,
                             currency, payment_method, status, payment_intent_id, position)
         SELECT $1, 'quinn', 'late', '\\x00', 'sku-1', 1, 1000, 'usd', 'pm_card_visa', 'authorized', $2, last_position
           FROM promised",
    )
    .bind(unknown_order)
    .bind(intent["id"].as_str().unwrap())
    .execute(&fleet.pool)
    .await
    .unwrap();
    let redrive = fleet.fleetctl(&["dlq", "redrive", "--queue", "stock"], &[]).await.unwrap();
    assert!(redrive.contains("COMPLETED"), "{redrive}");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Assert: processed once, as a fresh message would be.
    let status: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1")
        .bind(unknown_order)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(status, "paid");
    let intents = fleet.intents().await.unwrap();
    let redriven = intents.iter().find(|i| i["id"] == intent["id"]).unwrap();
    assert_eq!(redriven["capture_count"], 1);
    // The notifications of the hand-made order are outside this audit: only `pat`'s order counts
    // towards its expected two, the late order adds `order.paid`.
    let notes = fleet.notifications(3, Duration::from_secs(30)).await.unwrap();
    let audit = Audit::of(&fleet, "sku-1", &notes).await.unwrap();
    println!("{}", audit.figures("poison-and-redrive", 3));
    assert_eq!(
        audit.double_captures + audit.oversold as usize + audit.lost as usize + audit.holds_left,
        0,
        "{audit:#?}"
    );
    fleet.stop().await.unwrap();
}

/// A redrive gives the message a new SQS id.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_s_failures_follow_its_envelope_id_across_a_redrive() {
    // Arrange: a stock check for an order that does not exist, which can never succeed. On AWS
    // a redrive (StartMessageMoveTask) puts the same body back under a new SQS message id;
    // here the body is sent twice, two SQS ids for one envelope. (LocalStack 4.13.1 keeps the
    // id on a move, so a real redrive there does not show it.)
    let fleet = Fleet::start("failures-by-envelope", 1).await.unwrap();
    let envelope = Envelope {
        message_id: uuid::Uuid::now_v7(),
        event_type: EventType::StockCheckRequested,
        order_id: orderfleet_words::OrderId::new(),
        occurred_at: chrono::Utc::now(),
        payload: serde_json::json!({}),
    };
    let body = serde_json::to_string(&envelope).unwrap();

    // Act
    for _ in 0..2 {
        fleet.sqs.send_message().queue_url(&fleet.stock.url).message_body(&body).send().await.unwrap();
    }
    eventually("both copies handled", Duration::from_secs(60), || async {
        let outcomes = fleet_harness::metrics::sum_by_label(
            &fleet.scrape_metrics().await,
            "messages_handled_total",
            "outcome",
        );
        (outcomes.get("permanent").copied().unwrap_or(0.0) >= 2.0).then_some(())
    })
    .await
    .unwrap();
    // The records follow the acknowledgements: wait for both copies' failures to be counted.
    let counted = || async {
        let most: Option<i32> = sqlx::query_scalar("SELECT max(failures) FROM message_failures")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
        (most >= Some(2)).then_some(())
    };
    eventually("both copies' failures recorded", Duration::from_secs(10), counted).await.unwrap();
    let records: i64 =
        sqlx::query_scalar("SELECT count(*) FROM message_failures").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(records, 1, "a failure history split by SQS id");
    let rows: Vec<(String, i32)> = sqlx::query_as("SELECT message_key, failures FROM message_failures")
        .fetch_all(&fleet.pool)
        .await
        .unwrap();

    // Assert: one record, under the envelope's id, counting both copies' failures.
    assert_eq!(rows[0].0, envelope.message_id.to_string());
    assert!(rows[0].1 >= 2, "{rows:?}");
    fleet.stop().await.unwrap();
}

/// The dead-lettered stock check is redriven with the AWS CLI, as the console does.
#[tokio::test(flavor = "multi_thread")]
async fn a_console_redrive_of_a_stock_check_ends_paid_with_one_capture() {
    // Arrange: a trigger refuses one buyer's order its move to paid, so the capture goes
    // through at Stripe and its record fails on every receive, until the DLQ.
    let fleet = Fleet::start("console-redrive", 1).await.unwrap();
    fleet.product("sku-1", 1000, 2).await.unwrap();
    refuse_the_move_to(&fleet, "paid").await;
    assert_eq!(place(&fleet, "refused", "key", "sku-1").await.status, 202);
    eventually("the stock check in the DLQ", Duration::from_secs(120), || async {
        (depth(&fleet, &fleet.stock.dlq_url).await.0 >= 1).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(fleet.statuses().await.unwrap().get("stock_reserved"), Some(&1));

    // Act: the cause fixed, the DLQ redriven as the console's "Start DLQ redrive" does:
    // StartMessageMoveTask with the DLQ as the source and no destination (back to the queue
    // whose redrive policy names it).
    allow_the_move_to(&fleet, "paid").await;
    let region = orderfleet_tests::stack_var("AWS_REGION");
    let endpoint = orderfleet_tests::stack_var("AWS_ENDPOINT_URL");
    let out = std::process::Command::new(aws_cli())
        .args(["--endpoint-url", &endpoint, "--region", &region, "--output", "json"])
        .args(["sqs", "start-message-move-task", "--source-arn", &fleet.stock.dlq_arn])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "aws sqs start-message-move-task: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(task["TaskHandle"].is_string(), "{task}");
    fleet.wait_settled(Duration::from_secs(90)).await.unwrap();

    // Assert: paid, captured once in all, nothing left in the DLQ, the buyer told once.
    assert_eq!(fleet.statuses().await.unwrap().get("paid"), Some(&1));
    let intents = fleet.intents().await.unwrap();
    assert_eq!((intents.len(), intents[0]["capture_count"].as_i64()), (1, Some(1)), "{intents:?}");
    let audit = audit(&fleet, "console-redrive", "sku-1", 1, 2).await;
    assert_eq!(audit.by_status.get("paid"), Some(&1));
    assert!(dlqs_are_empty(&fleet).await);
    fleet.stop().await.unwrap();
}
