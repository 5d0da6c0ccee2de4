//! The opening (SPEC §1.8, §8.7, §8.12): nothing promised before `opens_at`, a pre-queue that
//! takes one order per buyer with no unit and no PaymentIntent, its draw at the opening, and
//! units promised down the drawn line, a unit that comes back going to the next queued order.

use std::collections::HashMap;
use std::time::Duration;

use fleet_harness::eventually;
use futures::StreamExt;
use orderfleet_tests::Fleet;
use orderfleet_tests::drops::{at, upsert};
use serde_json::Value;

/// A product's orders in line order: an order's own place, or, while it is queued after the
/// opening, the place the draw gave it (`queue_places`).
const IN_LINE: &str = "SELECT o.id FROM orders o LEFT JOIN queue_places qp ON qp.order_id = o.id
                        WHERE o.product_id = $1 ORDER BY COALESCE(o.position, qp.position)";

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

/// The stock worker holding the opening dies between the draw and its commit: nothing of its
/// draw is left, and the next worker opens the queue, each order once in line.
#[tokio::test(flavor = "multi_thread")]
async fn an_opener_killed_mid_opening_leaves_nothing_and_the_next_opens() {
    // Arrange: one stock worker, armed to die inside its opening; six buyers queued for two units.
    let mut fleet = Fleet::prepare("opener-killed").await.unwrap();
    for label in ["order-intake", "outbox-relay", "notification-worker"] {
        fleet.spawn(label, label, &[]).unwrap();
    }
    upsert(&fleet, "sku-k", 2, &["--opens-at", &at(600), "--queue-opens-at", &at(-60)]).await.unwrap();
    for i in 0..6 {
        // The intake may still be starting: each buyer sends until answered.
        let answer = eventually("an answer", Duration::from_secs(30), || async {
            fleet.post_order(&format!("buyer-{i}"), "key-1", "sku-k", 1, "pm_card_visa").await.ok()
        })
        .await
        .unwrap();
        assert_eq!(answer.body["status"].as_str(), Some("queued"), "{answer:?}");
    }
    fleet
        .spawn("doomed-stock-worker", "stock-worker", &[("ORDERFLEET_FAILPOINTS", "during_opening")])
        .unwrap();

    // Act: the opening brought to now; the worker dies in it; then another stock worker starts.
    upsert(&fleet, "sku-k", 2, &["--opens-at", &at(1), "--queue-opens-at", &at(-60)]).await.unwrap();
    let died = fleet.wait_exit("doomed-stock-worker", Duration::from_secs(60)).await.unwrap();
    assert!(!died.success(), "the failpoint during_opening was not reached");
    let after_the_death: (bool, i64) = sqlx::query_as(
        "SELECT opened_at IS NOT NULL,
                (SELECT count(*) FROM orders WHERE product_id = 'sku-k' AND position IS NOT NULL)
                + (SELECT count(*) FROM queue_places WHERE product_id = 'sku-k')
           FROM products WHERE id = 'sku-k'",
    )
    .fetch_one(&fleet.pool)
    .await
    .unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    let seed = opened(&fleet, "sku-k").await;
    let by_status = served(&fleet, "sku-k").await;

    // Assert: the dead worker's draw undone whole; the next one's places each order once.
    assert_eq!(after_the_death, (false, 0), "(opened, orders placed) after the death");
    assert_eq!(seed.len(), 32);
    assert_eq!(by_status, HashMap::from([("paid".into(), 2), ("sold_out".into(), 4)]));
    let places: Vec<i64> =
        sqlx::query_scalar("SELECT position FROM orders WHERE product_id = 'sku-k' ORDER BY position")
            .fetch_all(&fleet.pool)
            .await
            .unwrap();
    assert_eq!(places, (1..=6).collect::<Vec<_>>());
    assert_eq!(fleet.intents().await.unwrap().len(), 2, "a PaymentIntent for each unit, none more");
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

/// The places `draws` openings give four queued orders: each round puts the product back before
/// its opening and the orders back in the queue, then draws with `seed()`'s seed; for each
/// round, the orders (0..4, by id) in line order.
async fn draws(
    pool: &orderfleet_runtime::db::Pool,
    rounds: usize,
    seed: impl Fn() -> [u8; 32],
) -> Vec<Vec<usize>> {
    sqlx::query(
        "INSERT INTO products (id, name, price_minor, currency, stock, units_total, opens_at)
         VALUES ('sku-draw', 'draw', 1500, 'usd', 0, 0, now() - interval '1 second')",
    )
    .execute(pool)
    .await
    .unwrap();
    let mut ids: Vec<uuid::Uuid> = (0..4).map(|_| uuid::Uuid::new_v4()).collect();
    ids.sort();
    for (i, id) in ids.iter().enumerate() {
        sqlx::query(
            "INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity,
                                 amount_minor, currency, payment_method, status, position)
             VALUES ($1, $2, 'k', '\\x00', 'sku-draw', 1, 1500, 'usd', 'pm_card_visa', 'queued', NULL)",
        )
        .bind(id)
        .bind(format!("buyer-{i}"))
        .execute(pool)
        .await
        .unwrap();
    }
    let mut lines = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        sqlx::raw_sql(
            "UPDATE products SET opened_at = NULL, draw_seed = NULL, last_position = 0, queue_waiting = false
              WHERE id = 'sku-draw';
             UPDATE orders SET status = 'queued', position = NULL, failure_reason = NULL WHERE product_id = 'sku-draw';
             DELETE FROM queue_places WHERE product_id = 'sku-draw';
             DELETE FROM outbox;",
        )
        .execute(pool)
        .await
        .unwrap();
        let drawn: Option<i32> = sqlx::query_scalar("SELECT open_product('sku-draw', $1)")
            .bind(&seed()[..])
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(drawn, Some(4));
        let line: Vec<uuid::Uuid> =
            sqlx::query_scalar(IN_LINE).bind("sku-draw").fetch_all(pool).await.unwrap();
        lines.push(line.iter().map(|id| ids.iter().position(|i| i == id).unwrap()).collect());
    }
    lines
}

/// Pearson's χ² of the counts against the same expected count in every cell.
fn chi_squared(counts: &[usize], expected: f64) -> f64 {
    counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
}

/// The draw is uniform (§8.12): 2,400 openings of four queued orders under the opener's own
/// seeds put every order at every place alike (χ² of the 4 × 4 table of order by place, 9
/// degrees of freedom, under 44.8, its value with a chance of one in a million) and draw each
/// of the 24 lines alike (χ², 23 degrees, under 70.5). The same draw under one seed every
/// time, which is what a draw that ignored its seed or read it from the clock's second would
/// do, fails both.
#[tokio::test(flavor = "multi_thread")]
async fn the_draw_puts_every_queued_order_at_every_place_alike() {
    let db = orderfleet_tests::TestDatabase::migrated().await.unwrap();
    let rounds = 2_400;
    let tables = |lines: &[Vec<usize>]| {
        let mut by_place = vec![0; 16];
        let mut by_line = std::collections::HashMap::<Vec<usize>, usize>::new();
        for line in lines {
            for (place, &order) in line.iter().enumerate() {
                by_place[order * 4 + place] += 1;
            }
            *by_line.entry(line.clone()).or_default() += 1;
        }
        let mut lines: Vec<usize> = by_line.into_values().collect();
        lines.resize(24, 0);
        (chi_squared(&by_place, rounds as f64 / 4.0), chi_squared(&lines, rounds as f64 / 24.0))
    };

    let drawn = draws(&db.pool, rounds, orderfleet::domain::records::product::draw_seed).await;
    let (by_place, by_line) = tables(&drawn);
    let fixed = [7; 32];
    sqlx::query("DELETE FROM orders").execute(&db.pool).await.unwrap();
    sqlx::query("DELETE FROM products").execute(&db.pool).await.unwrap();
    let (fixed_by_place, fixed_by_line) = tables(&draws(&db.pool, rounds, || fixed).await);

    eprintln!(
        "χ² by place {by_place:.1} (9 df), by line {by_line:.1} (23 df); one seed: {fixed_by_place:.0}, {fixed_by_line:.0}"
    );
    assert!(by_place < 44.8, "the places are not uniform: χ² {by_place:.1} over 9 degrees of freedom");
    assert!(by_line < 70.5, "the lines are not uniform: χ² {by_line:.1} over 23 degrees of freedom");
    assert!(fixed_by_place > 44.8 && fixed_by_line > 70.5, "the test tells a fixed draw apart");
    db.drop().await.unwrap();
}

/// The `line` a waiting buyer reads tells an honest wait: with the fleet's create budget at 4 a
/// second, the last of 24 queued buyers promised its units at the opening is told its place, the
/// authorizations ahead of it, and a wait that the time until the queue's authorizations are
/// done (its own the last of them at that rate) is within a factor of two of, and two seconds.
#[tokio::test(flavor = "multi_thread")]
async fn a_promoted_order_s_estimated_wait_is_the_wait_it_gets() {
    // Arrange: the fleet's Stripe budget at 4 creates a second; 24 buyers queue for 24 units.
    let mut fleet = Fleet::prepare("line-estimate").await.unwrap();
    fleet.set_env("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", "4");
    fleet.spawn_all(1).await.unwrap();
    upsert(&fleet, "sku-e", 24, &["--opens-at", &at(3_600), "--queue-opens-at", &at(-60)]).await.unwrap();
    let mut ids = HashMap::new();
    for i in 0..24 {
        let user = format!("buyer-{i}");
        let queued = fleet.post_order(&user, "k", "sku-e", 1, "pm_card_visa").await.unwrap();
        assert_eq!(queued.body["status"], "queued", "{queued:?}");
        ids.insert(queued.body["order_id"].as_str().unwrap().to_owned(), user);
    }
    upsert(&fleet, "sku-e", 24, &["--opens-at", &at(1)]).await.unwrap();
    opened(&fleet, "sku-e").await;

    // Act: the last in line reads its line at once, then waits for its authorization.
    let (last, user): (uuid::Uuid, String) = {
        let line: Vec<uuid::Uuid> =
            sqlx::query_scalar(IN_LINE).bind("sku-e").fetch_all(&fleet.pool).await.unwrap();
        let id = *line.last().unwrap();
        (id, ids[&id.to_string()].clone())
    };
    let read_at = std::time::Instant::now();
    let view: Value = fleet.get_order(&user, &last.to_string()).await.unwrap().json().await.unwrap();
    eventually("the queue authorized", Duration::from_secs(60), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = 'sku-e' AND status = 'pending_authorization'",
        )
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
        (waiting == 0).then_some(())
    })
    .await
    .unwrap();
    let waited = read_at.elapsed().as_secs_f64();

    // Assert
    let line = &view["line"];
    assert_eq!(
        (view["status"].as_str(), line["position"].as_i64()),
        (Some("pending_authorization"), Some(24)),
        "{view}"
    );
    assert_eq!(line["queued_ahead"], 0, "{view}");
    let ahead = line["authorizations_ahead"].as_i64().unwrap();
    assert!((1..=23).contains(&ahead), "{view}");
    let estimate = line["estimated_wait_seconds"].as_f64().unwrap();
    let stats = fleet.stripe_stats().await.unwrap();
    eprintln!("estimated {estimate} s with {ahead} ahead; waited {waited:.1} s; stripe-sim {stats}");
    assert!(
        waited <= estimate * 2.0 + 2.0 && waited >= estimate / 2.0 - 2.0,
        "estimated {estimate} s, waited {waited:.1} s: {view}"
    );
    fleet.stop().await.unwrap();
}

/// A queue longer than one transaction ends: 700 buyers queue for one unit; once it is paid,
/// the 699 left end `sold_out`, 500 in a transaction (the openers end the rest), never all in
/// the transaction that sold the last unit, which a queue of 100,000 would hold past its
/// statement timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_queue_longer_than_one_transaction_ends_sold_out() {
    // Arrange
    let fleet = Fleet::start("long-queue", 1).await.unwrap();
    upsert(&fleet, "sku-l", 1, &["--opens-at", &at(3_600), "--queue-opens-at", &at(-60)]).await.unwrap();
    let queued: Vec<u16> = futures::stream::iter(0..700)
        .map(|i| {
            let fleet = &fleet;
            async move {
                fleet.post_order(&format!("buyer-{i}"), "k", "sku-l", 1, "pm_card_visa").await.unwrap().status
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;

    assert!(queued.iter().all(|s| *s == 202), "{queued:?}");

    // Act
    upsert(&fleet, "sku-l", 1, &["--opens-at", &at(1)]).await.unwrap();
    opened(&fleet, "sku-l").await;
    let by_status = served(&fleet, "sku-l").await;

    // Assert
    assert_eq!(by_status, HashMap::from([("paid".into(), 1), ("sold_out".into(), 699)]));
    fleet.stop().await.unwrap();
}
