//! The opening (SPEC §1.8, §8.7, §8.12): nothing promised before `opens_at`, a pre-queue that
//! takes one order per buyer with no unit and no PaymentIntent, its draw at the opening, and
//! units promised down the drawn line, a unit that comes back going to the next queued order.

use std::collections::HashMap;
use std::time::Duration;

use fleet_harness::eventually;
use orderfleet_tests::Fleet;
use serde_json::Value;

/// RFC 3339 of now and `seconds` (negative: before now).
fn at(seconds: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::seconds(seconds)).to_rfc3339()
}

/// `fleetctl product upsert` of `id` with `stock` units and the given opening flags.
async fn upsert(fleet: &Fleet, id: &str, stock: i32, opening: &[&str]) -> anyhow::Result<String> {
    let stock = stock.to_string();
    let mut args = vec![
        "product",
        "upsert",
        "--id",
        id,
        "--name",
        id,
        "--price",
        "1500",
        "--currency",
        "usd",
        "--stock",
        &stock,
    ];
    args.extend_from_slice(opening);
    fleet.fleetctl(&args, &[]).await
}

/// The product's orders by status.
async fn statuses(fleet: &Fleet, product: &str) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT status::text, count(*) FROM orders WHERE product_id = $1 GROUP BY status",
    )
    .bind(product)
    .fetch_all(&fleet.pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// Waits until the product is opened; its seed.
async fn opened(fleet: &Fleet, product: &str) -> Vec<u8> {
    eventually("the product opened", Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, Option<Vec<u8>>>(
            "SELECT draw_seed FROM products WHERE id = $1 AND opened_at IS NOT NULL",
        )
        .bind(product)
        .fetch_optional(&fleet.pool)
        .await
        .unwrap()
        .flatten()
    })
    .await
    .unwrap()
}

/// Waits until no order of the product is queued or holds units.
async fn served(fleet: &Fleet, product: &str) -> HashMap<String, i64> {
    eventually("the queue served", Duration::from_secs(120), || async {
        let by_status = statuses(fleet, product).await;
        let waiting = ["queued", "pending_authorization", "requires_action", "authorized", "stock_reserved"];
        (!waiting.iter().any(|s| by_status.contains_key(*s))).then_some(by_status)
    })
    .await
    .unwrap()
}

/// Before its opening, with no pre-queue, nobody is promised anything.
#[tokio::test(flavor = "multi_thread")]
async fn before_the_opening_the_door_answers_not_open() {
    // Arrange
    let fleet = Fleet::start("not-open", 1).await.unwrap();
    upsert(&fleet, "sku-later", 5, &["--opens-at", &at(3_600)]).await.unwrap();

    // Act
    let answer = fleet.post_order("ada", "key-1", "sku-later", 1, "pm_card_visa").await.unwrap();

    // Assert: the seconds until the opening, and nothing written.
    assert_eq!((answer.status, answer.body["error"]["code"].as_str()), (409, Some("not_open")), "{answer:?}");
    let wait: u64 = answer.retry_after.as_deref().unwrap_or("0").parse().unwrap();
    assert!((3_500..=3_600).contains(&wait), "Retry-After {wait}");
    assert!(statuses(&fleet, "sku-later").await.is_empty());
    assert_eq!(fleet.intents().await.unwrap().len(), 0, "no PaymentIntent");
    fleet.stop().await.unwrap();
}

/// Ten buyers queue for three units; the draw puts them in line, the first three pay.
#[tokio::test(flavor = "multi_thread")]
async fn a_drawn_queue_is_served_in_line_and_the_rest_sold_out() {
    // Arrange: the pre-queue open, the sale in 6 s.
    let fleet = Fleet::start("pre-queue", 1).await.unwrap();
    upsert(&fleet, "sku-q", 3, &["--opens-at", &at(6), "--queue-opens-at", &at(-60)]).await.unwrap();

    // Act: ten buyers queue; one tries again under another key, one under the same.
    let mut ids = HashMap::new();
    for i in 0..10 {
        let user = format!("buyer-{i}");
        let answer = fleet.post_order(&user, "key-1", "sku-q", 1, "pm_card_visa").await.unwrap();
        assert_eq!((answer.status, answer.body["status"].as_str()), (202, Some("queued")), "{answer:?}");
        assert_eq!(answer.body["position"], Value::Null, "{answer:?}");
        assert!(answer.body["opens_at"].is_string(), "{answer:?}");
        ids.insert(answer.body["order_id"].as_str().unwrap().to_owned(), user);
    }
    let again = fleet.post_order("buyer-0", "key-2", "sku-q", 1, "pm_card_visa").await.unwrap();
    assert_eq!(
        (again.status, again.body["error"]["code"].as_str()),
        (409, Some("already_queued")),
        "{again:?}"
    );
    let replay = fleet.post_order("buyer-1", "key-1", "sku-q", 1, "pm_card_visa").await.unwrap();
    assert_eq!((replay.status, replay.replayed, replay.body["status"].as_str()), (202, true, Some("queued")));
    let (id, user) = ids.iter().next().unwrap();
    let view: Value = fleet.get_order(user, id).await.unwrap().json().await.unwrap();
    assert_eq!(
        (view["status"].as_str(), &view["line"]["position"]),
        (Some("queued"), &Value::Null),
        "{view}"
    );
    assert_eq!(fleet.intents().await.unwrap().len(), 0, "no PaymentIntent before the opening");

    // The opening, then a buyer after it: the queue is ahead of them.
    let seed = opened(&fleet, "sku-q").await;
    let late = fleet.post_order("late", "key-1", "sku-q", 1, "pm_card_visa").await.unwrap();
    let by_status = served(&fleet, "sku-q").await;

    // Assert
    assert_eq!(seed.len(), 32, "the draw's seed is kept");
    assert_eq!((late.status, late.body["error"]["code"].as_str()), (409, Some("sold_out")), "{late:?}");
    assert_eq!(by_status, HashMap::from([("paid".into(), 3), ("sold_out".into(), 7)]));
    let line: Vec<(i64, String)> = sqlx::query_as(
        "SELECT position, status::text FROM orders WHERE product_id = 'sku-q' ORDER BY position",
    )
    .fetch_all(&fleet.pool)
    .await
    .unwrap();
    let places: Vec<i64> = line.iter().map(|(p, _)| *p).collect();
    assert_eq!(places, (1..=10).collect::<Vec<_>>(), "the draw places the queue at 1..10");
    assert!(
        line[..3].iter().all(|(_, s)| s == "paid") && line[3..].iter().all(|(_, s)| s == "sold_out"),
        "{line:?}"
    );
    let replay = fleet.post_order("buyer-1", "key-1", "sku-q", 1, "pm_card_visa").await.unwrap();
    assert_eq!((replay.status, replay.body["status"].as_str()), (202, Some("queued")), "the first answer");
    fleet.stop().await.unwrap();
}

/// A declined card's unit goes to the next queued order, down to the one good card.
#[tokio::test(flavor = "multi_thread")]
async fn a_declined_promoted_order_passes_its_unit_down_the_line() {
    // Arrange: one unit, four queued buyers, three of them with a card that is declined.
    let fleet = Fleet::start("queue-declines", 1).await.unwrap();
    upsert(&fleet, "sku-d", 1, &["--opens-at", &at(5), "--queue-opens-at", &at(-60)]).await.unwrap();
    for (user, card) in [
        ("ann", "pm_card_chargeDeclined"),
        ("bob", "pm_card_visa"),
        ("cy", "pm_card_chargeDeclined"),
        ("di", "pm_card_chargeDeclined"),
    ] {
        let answer = fleet.post_order(user, "key-1", "sku-d", 1, card).await.unwrap();
        assert_eq!(answer.body["status"].as_str(), Some("queued"), "{answer:?}");
    }

    // Act
    opened(&fleet, "sku-d").await;
    served(&fleet, "sku-d").await;

    // Assert: whatever the draw, the good card pays; each declined card ahead of it in line
    // was promoted and declined, each behind it sold out.
    let line: Vec<(String, String)> = sqlx::query_as(
        "SELECT user_id, status::text FROM orders WHERE product_id = 'sku-d' ORDER BY position",
    )
    .fetch_all(&fleet.pool)
    .await
    .unwrap();
    let good = line.iter().position(|(user, _)| user == "bob").unwrap();
    assert_eq!(line[good].1, "paid", "{line:?}");
    assert!(line[..good].iter().all(|(_, s)| s == "payment_declined"), "{line:?}");
    assert!(line[good + 1..].iter().all(|(_, s)| s == "sold_out"), "{line:?}");
    fleet.stop().await.unwrap();
}

/// The opening cannot move once it has happened; a pre-queue must come before it.
#[tokio::test(flavor = "multi_thread")]
async fn the_opening_is_refused_a_move_once_it_happened() {
    // Arrange
    let fleet = Fleet::start("opening-moves", 1).await.unwrap();
    upsert(&fleet, "sku-m", 1, &["--opens-at", &at(2)]).await.unwrap();
    opened(&fleet, "sku-m").await;

    // Act
    let moved = upsert(&fleet, "sku-m", 1, &["--opens-at", &at(600)]).await;
    let raised = upsert(&fleet, "sku-m", 2, &[]).await;
    let backwards = upsert(&fleet, "sku-n", 1, &["--opens-at", &at(60), "--queue-opens-at", &at(120)]).await;

    // Assert
    let moved = format!("{:#}", moved.unwrap_err());
    assert!(moved.contains("can no longer move"), "{moved}");
    assert!(raised.is_ok(), "a raise of the stock keeps the opening: {raised:?}");
    let backwards = format!("{:#}", backwards.unwrap_err());
    assert!(backwards.contains("must open before the sale"), "{backwards}");
    fleet.stop().await.unwrap();
}
