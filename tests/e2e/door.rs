//! The door (SPEC §1.1, §8.7–9): units promised before any payment call, places in line, line
//! order in the stock worker whatever order its messages arrive in, `product upsert` as the
//! product's total, and the Stripe request budget under a burst.

use std::time::{Duration, Instant};

use fleet_harness::Answer;
use fleet_harness::pgcount::PgCounter;
use orderfleet_tests::Fleet;
use orderfleet_tests::audit::Audit;
use serde_json::Value;

/// stripe-sim, the intake, the relay and the notification worker: everything but the stock
/// workers, which a test starts when it wants its stock checks handled.
async fn without_stock_workers(name: &str, intake_env: &[(&str, &str)]) -> Fleet {
    let mut fleet = Fleet::prepare(name).await.unwrap();
    fleet.spawn("order-intake", "order-intake", intake_env).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.wait_intake().await.unwrap();
    fleet
}

async fn order(fleet: &Fleet, user: &str, product: &str, method: &str) -> Answer {
    fleet.post_order(user, "key-1", product, 1, method).await.unwrap()
}

fn count(intents: &[Value], field: &str) -> i64 {
    intents.iter().map(|i| i[field].as_i64().unwrap_or(0)).sum()
}

async fn audit(fleet: &Fleet, product: &str, notifications: usize) -> Audit {
    let notes = fleet.notifications(notifications, Duration::from_secs(60)).await.unwrap();
    let audit = Audit::of(fleet, product, &notes).await.unwrap();
    audit.assert_guarantees();
    audit
}

/// A replay of the answer, and the order's GET, give the same position.
#[tokio::test(flavor = "multi_thread")]
async fn positions_follow_arrival() {
    // Arrange
    let fleet = Fleet::start("positions", 1).await.unwrap();
    fleet.product("sku-1", 1000, 10).await.unwrap();

    // Act: five buyers, each sending after the one before was answered.
    let mut answers = Vec::new();
    for i in 0..5 {
        answers.push(order(&fleet, &format!("buyer-{i}"), "sku-1", "pm_card_visa").await);
    }

    // Assert
    let positions: Vec<i64> = answers.iter().map(|a| a.body["position"].as_i64().unwrap()).collect();
    assert_eq!(positions, [1, 2, 3, 4, 5], "{answers:?}");
    let replay = order(&fleet, "buyer-2", "sku-1", "pm_card_visa").await;
    assert_eq!((replay.status, replay.replayed), (202, true));
    assert_eq!(replay.body, answers[2].body, "a replay is the first answer");
    let order_id = answers[2].body["order_id"].as_str().unwrap();
    let view: Value = fleet.get_order("buyer-2", order_id).await.unwrap().json().await.unwrap();
    assert_eq!(view["position"], 3, "{view}");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    audit(&fleet, "sku-1", 10).await;
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn declined_cards_give_their_units_back_to_later_buyers() {
    // Arrange: two units, no stock worker yet (so the orders ahead stay unpaid for a while).
    let mut fleet = without_stock_workers("declines-give-back", &[]).await;
    fleet.product("sku-1", 1000, 2).await.unwrap();

    // Act
    let declined = order(&fleet, "ann", "sku-1", "pm_card_chargeDeclined").await;
    let declined_again =
        fleet.post_order("ann", "key-2", "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
    let bob = order(&fleet, "bob", "sku-1", "pm_card_visa").await;
    let cid = order(&fleet, "cid", "sku-1", "pm_card_visa").await;
    let dee = order(&fleet, "dee", "sku-1", "pm_card_visa").await;

    // Assert: the declines held their units only while they were authorized, so the next two
    // buyers got both; the third is sold out, and told to come back while the two are unpaid.
    assert_eq!((declined.status, declined_again.status), (402, 402));
    assert_eq!((bob.status, cid.status), (202, 202), "{bob:?} {cid:?}");
    assert_eq!((bob.body["position"].as_i64(), cid.body["position"].as_i64()), (Some(3), Some(4)));
    assert_eq!(dee.status, 409, "{dee:?}");
    assert_eq!(dee.body["error"]["code"], "sold_out");
    assert_eq!(dee.retry_after.as_deref(), Some("5"), "units may still come back");
    // The two accepted orders' commits took their units (nothing was cut): stock 0.
    assert_eq!(fleet.units("sku-1").await.unwrap(), (2, 0, 2));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(orders, 4, "the sold-out answer wrote an order");

    // Once the two are paid, nothing can come back: no Retry-After.
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&2), "{statuses:?}");
    let eve = order(&fleet, "eve", "sku-1", "pm_card_visa").await;
    assert_eq!((eve.status, eve.retry_after.as_deref()), (409, None), "{eve:?}");
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 4, "two declines and two units sold; none for the sold-out buyers");
    assert_eq!(count(&intents, "cancel_count"), 0);
    audit(&fleet, "sku-1", 4).await;
    fleet.stop().await.unwrap();
}

/// A stock cut below what was promised, whatever order the stock checks arrive in.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_rejects_exactly_the_last_in_line_whatever_the_arrival_order() {
    // Arrange: ten buyers in line for ten units while no stock worker runs, each on a card
    // that needs 3-D Secure, so that every order is still pending (`requires_action`, holding
    // its unit and its place) when the operator cuts; a commit that authorizes an order with
    // nothing cut takes its units at once, and a cut below them is refused.
    let mut fleet =
        without_stock_workers("cut-below-promised", &[("PAYMENT_ACTION_TIMEOUT_SECONDS", "300")]).await;
    fleet.product("sku-1", 1000, 10).await.unwrap();
    let mut order_at = std::collections::HashMap::new();
    for i in 1..=10 {
        let answer = order(&fleet, &format!("buyer-{i}"), "sku-1", "pm_card_threeDSecure2Required").await;
        assert_eq!(
            (answer.body["position"].as_i64(), answer.body["status"].as_str()),
            (Some(i), Some("requires_action")),
            "{answer:?}"
        );
        order_at.insert(answer.body["order_id"].as_str().unwrap().to_owned(), i);
    }

    // Act: the operator cuts the stock to six.
    let said = fleet
        .fleetctl(
            &[
                "product",
                "upsert",
                "--id",
                "sku-1",
                "--name",
                "sku-1",
                "--price",
                "1000",
                "--currency",
                "usd",
                "--stock",
                "6",
            ],
            &[],
        )
        .await
        .unwrap();
    assert!(said.contains("4 units are promised beyond the new total"), "{said}");
    let late = order(&fleet, "late", "sku-1", "pm_card_visa").await;
    assert_eq!(late.status, 409, "the door opened after a cut: {late:?}");
    // Every buyer authenticates, in line order; each commit finds the cut and leaves its order
    // `authorized` for the stock worker to reserve in line.
    let intents: Vec<String> = sqlx::query_scalar("SELECT payment_intent_id FROM orders ORDER BY position")
        .fetch_all(&fleet.pool)
        .await
        .unwrap();
    for intent in &intents {
        fleet.authenticate(intent, true).await.unwrap();
    }
    fleet_harness::eventually("every order authorized", Duration::from_secs(30), || async {
        let authorized: Option<i64> =
            sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = 'authorized'")
                .fetch_one(&fleet.pool)
                .await
                .ok();
        (authorized == Some(10)).then_some(())
    })
    .await
    .unwrap();
    // The relay sent the ten stock checks in line order; they are put back last first, so the
    // worker meets the last in line first.
    let checks = fleet.take_messages(&fleet.stock.url.clone(), 10).await.unwrap();
    for body in checks.iter().rev() {
        fleet.sqs.send_message().queue_url(&fleet.stock.url).message_body(body).send().await.unwrap();
    }
    // One message at a time, in the order they arrive.
    fleet.spawn("stock-worker", "stock-worker", &[("STOCK_WORKER_CONCURRENCY", "1")]).unwrap();
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert: positions 1–6 paid, 7–10 rejected and their holds released.
    let rows: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT id, status::text FROM orders").fetch_all(&fleet.pool).await.unwrap();
    let mut by_position: Vec<(i64, String)> =
        rows.into_iter().map(|(id, status)| (order_at[&id.to_string()], status)).collect();
    by_position.sort();
    let expected: Vec<(i64, String)> =
        (1..=10).map(|p| (p, if p <= 6 { "paid" } else { "rejected_out_of_stock" }.to_owned())).collect();
    assert_eq!(by_position, expected);
    let intents = fleet.intents().await.unwrap();
    assert_eq!((count(&intents, "capture_count"), count(&intents, "cancel_count")), (6, 4));
    assert_eq!(fleet.units("sku-1").await.unwrap(), (6, 0, 6));
    audit(&fleet, "sku-1", 20).await;
    fleet.stop().await.unwrap();
}

/// Places orders of these quantities, one after another (so their positions follow), while no
/// stock worker runs; the ids by position.
async fn line_up(fleet: &Fleet, product: &str, quantities: &[i64]) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, quantity) in quantities.iter().enumerate() {
        let answer = fleet
            .post_order(&format!("buyer-{i}"), "key-1", product, *quantity, "pm_card_visa")
            .await
            .unwrap();
        assert_eq!(
            (answer.status, answer.body["position"].as_u64()),
            (202, Some(i as u64 + 1)),
            "{answer:?}"
        );
        ids.push(answer.body["order_id"].as_str().unwrap().to_owned());
    }
    ids
}

/// Orders of `quantities` in line, each on a card that needs 3-D Secure: every one still
/// pending (`requires_action`), holding its units and its place, until
/// [`authenticate_in_line`]. A line for a cut: an order whose commit found nothing cut has
/// taken its units already (the merged commit), and a cut below them is refused.
async fn line_up_pending(fleet: &Fleet, product: &str, quantities: &[i64]) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, quantity) in quantities.iter().enumerate() {
        let card = "pm_card_threeDSecure2Required";
        let answer =
            fleet.post_order(&format!("buyer-{i}"), "key-1", product, *quantity, card).await.unwrap();
        assert_eq!(
            (answer.status, answer.body["position"].as_u64(), answer.body["status"].as_str()),
            (202, Some(i as u64 + 1), Some("requires_action")),
            "{answer:?}"
        );
        ids.push(answer.body["order_id"].as_str().unwrap().to_owned());
    }
    ids
}

/// Every buyer of `ids` authenticates, in line order; returns once each order is `authorized`
/// (its commit, after a cut, left it for the stock worker to reserve in line).
async fn authenticate_in_line(fleet: &Fleet, ids: &[String]) {
    for id in ids {
        fleet.authenticate_order(id).await.unwrap();
    }
    let want = ids.len() as i64;
    fleet_harness::eventually("every order authorized", Duration::from_secs(30), || async {
        let authorized: Option<i64> = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE id::text = ANY($1) AND status = 'authorized'",
        )
        .bind(ids)
        .fetch_one(&fleet.pool)
        .await
        .ok();
        (authorized == Some(want)).then_some(())
    })
    .await
    .unwrap();
}

async fn statuses_in_line(fleet: &Fleet, ids: &[String]) -> Vec<String> {
    let mut statuses = Vec::new();
    for id in ids {
        let status: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1::uuid")
            .bind(id)
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
        statuses.push(status);
    }
    statuses
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_line_handled_all_at_once_by_two_workers_rejects_no_one() {
    // Arrange: every unit promised, in mixed quantities, and the stock checks waiting.
    let mut fleet = without_stock_workers("full-line-at-once", &[]).await;
    fleet.product("sku-1", 1000, 20).await.unwrap();
    let ids = line_up(&fleet, "sku-1", &[1, 2, 3, 1, 2, 3, 1, 2, 3, 2]).await;

    // Act: two workers take the whole line at once, reserving concurrently.
    fleet.spawn("stock-worker-0", "stock-worker", &[]).unwrap();
    fleet.spawn("stock-worker-1", "stock-worker", &[]).unwrap();
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert: nothing was cut, so everyone in line is served.
    assert_eq!(statuses_in_line(&fleet, &ids).await, vec!["paid"; 10]);
    assert_eq!(count(&fleet.intents().await.unwrap(), "cancel_count"), 0);
    assert_eq!(fleet.units("sku-1").await.unwrap(), (20, 0, 20));
    audit(&fleet, "sku-1", 20).await;
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_too_large_after_a_cut_holds_back_no_smaller_one_behind_it() {
    // Arrange: quantities 2, 3, 1, 1 in line for 7 units, waiting for 3-D Secure.
    let mut fleet =
        without_stock_workers("cut-mixed-quantities", &[("PAYMENT_ACTION_TIMEOUT_SECONDS", "300")]).await;
    fleet.product("sku-1", 1000, 7).await.unwrap();
    let ids = line_up_pending(&fleet, "sku-1", &[2, 3, 1, 1]).await;

    // Act: cut to 3; every buyer authenticates; then two workers at the line.
    fleet.product("sku-1", 1000, 3).await.unwrap();
    authenticate_in_line(&fleet, &ids).await;
    fleet.spawn("stock-worker-0", "stock-worker", &[]).unwrap();
    fleet.spawn("stock-worker-1", "stock-worker", &[]).unwrap();
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert: the first takes 2; the second wants 3 of the 1 left and loses; the third takes
    // the last unit; the fourth loses. No unit stays unsold while someone in line wanted it.
    assert_eq!(
        statuses_in_line(&fleet, &ids).await,
        ["paid", "rejected_out_of_stock", "paid", "rejected_out_of_stock"]
    );
    assert_eq!(fleet.units("sku-1").await.unwrap(), (3, 0, 3));
    audit(&fleet, "sku-1", 8).await;
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_key_20_times_at_once_for_the_last_unit_never_answers_sold_out() {
    // Arrange
    let fleet = Fleet::start("same-key-last-unit", 1).await.unwrap();
    fleet.product("sku-1", 1000, 1).await.unwrap();

    // Act
    let answers: Vec<Answer> = futures::future::join_all(
        (0..20).map(|_| fleet.post_order("kim", "key-1", "sku-1", 1, "pm_card_visa")),
    )
    .await
    .into_iter()
    .map(|a| a.unwrap())
    .collect();

    // Assert: one order; every twin is in use or a replay of it, none told the unit is gone.
    for answer in &answers {
        let in_use = answer.status == 409 && answer.body["error"]["code"] == "idempotency_key_in_use";
        assert!(answer.status == 202 || in_use, "{answer:?}");
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(orders, 1);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// A total below the units sold is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_upsert_sells_nothing_twice() {
    // Arrange: five units, three sold.
    let fleet = Fleet::start("upsert-total", 1).await.unwrap();
    let upsert = |stock: &str| {
        let args: Vec<String> = ["product", "upsert", "--id", "sku-1", "--name", "Drop", "--price", "1000"]
            .iter()
            .map(|s| s.to_string())
            .chain(["--currency", "usd", "--stock", stock].iter().map(|s| s.to_string()))
            .collect();
        let fleet = &fleet;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            fleet.fleetctl(&args, &[]).await
        }
    };
    upsert("5").await.unwrap();
    for i in 0..3 {
        assert_eq!(order(&fleet, &format!("early-{i}"), "sku-1", "pm_card_visa").await.status, 202);
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Act: the same upsert again, mid-sale.
    let said = upsert("5").await.unwrap();

    // Assert: five in all, three of them sold: two left, not five.
    assert!(said.contains("5 units for sale in all, 3 sold or reserved"), "{said}");
    assert_eq!(fleet.units("sku-1").await.unwrap(), (5, 2, 3));
    let answers: Vec<u16> = futures::future::join_all(
        (0..3).map(|i| fleet.post_order(&format!("late-{i}"), "key-1", "sku-1", 1, "pm_card_visa")),
    )
    .await
    .into_iter()
    .map(|a| a.unwrap().status)
    .collect();
    let mut sorted = answers.clone();
    sorted.sort();
    assert_eq!(sorted, [202, 202, 409], "{answers:?}");
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&5), "{statuses:?}");

    // A total below the units sold is refused and changes nothing; so are nonsense totals.
    let refused = upsert("4").await.unwrap_err().to_string();
    assert!(refused.contains("refused: product sku-1 has 5 units sold or reserved"), "{refused}");
    for bad in ["-1", "100000001", "many", "2.5"] {
        let error = upsert(bad).await.unwrap_err().to_string();
        assert!(error.contains("--stock"), "{bad}: {error}");
    }
    assert_eq!(fleet.units("sku-1").await.unwrap(), (5, 0, 5));
    audit(&fleet, "sku-1", 10).await;
    fleet.stop().await.unwrap();
}

/// Under a burst of 80 buyers for 30 units.
#[tokio::test(flavor = "multi_thread")]
async fn the_stripe_budgets_keep_a_rate_limited_stripe_from_answering_429() {
    // Arrange: stripe-sim allows 10 requests a second; the fleet's budget, which the intake and
    // the stock worker (sweeper included) share, is 8 for the account and on each endpoint: a
    // margin for a loaded machine's late requests (stripe-sim counts any one-second window).
    let budget = [("STRIPE_ACCOUNT_REQUESTS_PER_SECOND", "8"), ("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", "8")];
    let mut fleet = without_stock_workers("stripe-budget", &budget).await;
    fleet.spawn("stock-worker", "stock-worker", &budget).unwrap();
    fleet.stripe_rate_limit(10).await.unwrap();
    fleet.product("drop", 1000, 30).await.unwrap();

    // Act: 80 buyers at once for 30 units.
    let answers = futures::future::join_all((0..80).map(|i| {
        let fleet = &fleet;
        async move { fleet.post_order(&format!("u{i}"), "k", "drop", 1, "pm_card_visa").retrying().await }
    }))
    .await;
    let statuses = fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert
    let accepted = answers.iter().filter(|a| a.as_ref().is_ok_and(|(a, _)| a.status == 202)).count();
    assert_eq!(accepted, 30);
    assert_eq!(statuses.get("paid"), Some(&30), "{statuses:?}");
    let stats = fleet.stripe_stats().await.unwrap();
    assert_eq!(stats["rate_limited"], 0, "{stats}");
    assert!(stats["max_requests_in_one_second"].as_u64().unwrap() <= 10, "{stats}");
    assert!(stats["requests"].as_u64().unwrap() >= 60, "{stats}");
    audit(&fleet, "drop", 60).await;

    // Control: a lower limit (2, which 40 buyers at once outrun on any machine), with an intake
    // told the fleet's budget is larger, does see 429s; so the figures above are the budget's doing. Once
    // one is seen the limit is lifted, so the control's orders settle at any machine's pace.
    fleet.stripe_rate_limit(2).await.unwrap();
    fleet.terminate("order-intake").await.unwrap();
    let larger =
        [("STRIPE_ACCOUNT_REQUESTS_PER_SECOND", "200"), ("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", "200")];
    fleet.spawn("order-intake", "order-intake", &larger).unwrap();
    fleet.wait_intake().await.unwrap();
    fleet.product("control", 1000, 40).await.unwrap();
    let control =
        futures::future::join_all(
            (0..40).map(|i| {
                let fleet = &fleet;
                async move {
                    fleet.post_order(&format!("c{i}"), "k", "control", 1, "pm_card_visa").retrying().await
                }
            }),
        );
    let first_429 = async {
        let seen = fleet_harness::eventually("a 429 from stripe-sim", Duration::from_secs(60), || async {
            (fleet.stripe_stats().await.ok()?["rate_limited"].as_u64()? > 0).then_some(())
        })
        .await;
        fleet.stripe_rate_limit(0).await.unwrap();
        seen
    };
    let (_, first_429) = tokio::join!(control, first_429);
    let stats = fleet.stripe_stats().await.unwrap();
    assert!(first_429.is_ok(), "the control saw no 429: {stats}");
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// Its order keeps its units and its place in line meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_with_no_stripe_slot_answers_503_then_completes_on_retry() {
    // Arrange: one Stripe request a second, so a burst of eight queues past the 4 s wait;
    // stripe-sim allows 3, so that a request a loaded machine sends late is not a 429.
    let fleet = without_stock_workers("budget-refusal", &[("STRIPE_MAX_REQUESTS_PER_SECOND", "1")]).await;
    fleet.stripe_rate_limit(3).await.unwrap();
    fleet.product("sku-1", 1000, 10).await.unwrap();

    // Act
    let first: Vec<Answer> = futures::future::join_all(
        (0..8).map(|i| fleet.post_order(&format!("u{i}"), "k", "sku-1", 1, "pm_card_visa")),
    )
    .await
    .into_iter()
    .map(|a| a.unwrap())
    .collect();

    // Assert: the refused ones are 503 with Retry-After, their orders pending and still holding
    // their units and places; a retry with the same key finishes each, in the same place.
    let refused: Vec<usize> = (0..8).filter(|&i| first[i].status == 503).collect();
    assert!(!refused.is_empty(), "{:?}", first.iter().map(|a| a.status).collect::<Vec<_>>());
    for &i in &refused {
        assert_eq!(first[i].body["error"]["code"], "payment_unavailable");
        assert!(first[i].retry_after.is_some());
    }
    assert_eq!(fleet.statuses().await.unwrap().get("pending_authorization"), Some(&(refused.len() as i64)));
    assert_eq!(fleet.units("sku-1").await.unwrap().2, 8, "a refused order lost its units");
    for &i in &refused {
        let (answer, _) =
            fleet.post_order(&format!("u{i}"), "k", "sku-1", 1, "pm_card_visa").retrying().await.unwrap();
        assert_eq!(answer.status, 202, "{answer:?}");
    }
    let positions: std::collections::HashSet<i64> = sqlx::query_scalar("SELECT position FROM orders")
        .fetch_all(&fleet.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(positions, (1..=8).collect());
    let metrics = fleet_harness::metrics::sum_by_label(
        &fleet.scrape_metrics().await,
        "stripe_budget_refusals_total",
        "endpoint",
    );
    assert!(
        metrics.get("POST /v1/payment_intents").copied().unwrap_or(0.0) >= refused.len() as f64,
        "{metrics:?}"
    );
    assert_eq!(fleet.stripe_stats().await.unwrap()["rate_limited"], 0);
    fleet.stop().await.unwrap();
}

/// A declined order does not count toward the limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_bot_firing_at_once_gets_only_its_limit_per_buyer() {
    // Arrange: 50 units, at most 2 per buyer.
    let fleet = Fleet::start("max-per-buyer", 1).await.unwrap();
    let upsert = [
        "product",
        "upsert",
        "--id",
        "drop",
        "--name",
        "Drop",
        "--price",
        "1000",
        "--currency",
        "usd",
        "--stock",
        "50",
        "--max-per-buyer",
        "2",
    ];
    let said = fleet.fleetctl(&upsert, &[]).await.unwrap();
    assert!(said.contains("at most 2 per buyer"), "{said}");

    // Act: one user fires 40 orders at once, each under its own key.
    let fleet_ref = &fleet;
    let bot = futures::future::join_all((0..40).map(|i| async move {
        fleet_ref.post_order("bot", &format!("k{i}"), "drop", 1, "pm_card_visa").retrying().await
    }))
    .await;
    // Another buyer: a declined card first, which holds nothing, then two orders, then a third.
    let declined = fleet.post_order("ola", "d", "drop", 1, "pm_card_chargeDeclined").await.unwrap();
    let ola: Vec<Answer> = futures::future::join_all((0..3).map(|i| async move {
        fleet_ref.post_order("ola", &format!("k{i}"), "drop", 1, "pm_card_visa").await
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let replay = fleet.post_order("bot", "k0", "drop", 1, "pm_card_visa").await.unwrap();

    // Assert: two units for the bot, 38 refusals that wrote nothing and reached no Stripe.
    let statuses: Vec<u16> = bot.iter().map(|a| a.as_ref().unwrap().0.status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 2, "{statuses:?}");
    let refused: Vec<&Answer> =
        bot.iter().map(|a| &a.as_ref().unwrap().0).filter(|a| a.status == 409).collect();
    assert_eq!(refused.len(), 38, "{statuses:?}");
    assert!(
        refused.iter().all(|a| a.body["error"]["code"] == "purchase_limit_reached"),
        "{:?}",
        refused[0].body
    );
    assert_eq!(declined.status, 402);
    let ola_statuses: Vec<u16> = ola.iter().map(|a| a.status).collect();
    assert_eq!(ola_statuses.iter().filter(|s| **s == 202).count(), 2, "{ola_statuses:?}");
    assert_eq!(ola_statuses.iter().filter(|s| **s == 409).count(), 1, "{ola_statuses:?}");
    assert!(replay.replayed || replay.status == 409, "a used key answers from its order: {replay:?}");
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(orders, 5, "a refused order was written");
    let intents = fleet.intents().await.unwrap();
    assert_eq!(intents.len(), 5, "a refused order reached Stripe");
    assert_eq!(fleet.units("drop").await.unwrap().2, 4, "promised: 2 for the bot and 2 for ola");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upsert_without_a_cap_removes_it() {
    let fleet = Fleet::start("max-per-buyer-removed", 1).await.unwrap();
    let upsert = |cap: Option<&'static str>| {
        let mut args = vec![
            "product",
            "upsert",
            "--id",
            "sku-1",
            "--name",
            "S",
            "--price",
            "100",
            "--currency",
            "usd",
            "--stock",
            "9",
        ];
        args.extend(cap.map(|c| ["--max-per-buyer", c]).into_iter().flatten());
        args
    };
    fleet.fleetctl(&upsert(Some("1")), &[]).await.unwrap();
    assert_eq!(fleet.post_order("ola", "k1", "sku-1", 1, "pm_card_visa").await.unwrap().status, 202);
    let second = fleet.post_order("ola", "k2", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!((second.status, second.body["error"]["code"].as_str()), (409, Some("purchase_limit_reached")));

    fleet.fleetctl(&upsert(None), &[]).await.unwrap();

    assert_eq!(fleet.post_order("ola", "k3", "sku-1", 1, "pm_card_visa").await.unwrap().status, 202);
    for bad in ["0", "-1", "many"] {
        let refused = fleet.fleetctl(&upsert(Some(bad)), &[]).await;
        assert!(refused.is_err(), "--max-per-buyer {bad} was taken");
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

/// It writes nothing: no new product, and no price changed.
#[tokio::test(flavor = "multi_thread")]
async fn an_upsert_below_stripe_s_minimum_charge_is_refused() {
    // Arrange: a product at a price Stripe charges.
    let fleet = Fleet::prepare("upsert-minimum-charge").await.unwrap();
    let upsert = |id: &'static str, price: &'static str, currency: &'static str| {
        let args = ["product", "upsert", "--id", id, "--name", id, "--price", price];
        let fleet = &fleet;
        async move { fleet.fleetctl(&[&args[..], &["--currency", currency, "--stock", "5"]].concat(), &[]).await }
    };
    upsert("kettle", "1000", "usd").await.unwrap();

    // Act: a new product at one cent, the kettle cut to 49 cents, a new one at ¥49.
    let new = upsert("penny", "1", "usd").await.unwrap_err().to_string();
    let cut = upsert("kettle", "49", "usd").await.unwrap_err().to_string();
    let yen = upsert("yen", "49", "jpy").await.unwrap_err().to_string();

    // Assert: each refused, naming Stripe's minimum (docs.stripe.com/currencies), and nothing
    // written: no new product, the kettle's price as it was. At the minimum it is taken.
    assert!(new.contains("the price 1 is below Stripe's minimum charge for USD, 50 (0.50 USD)"), "{new}");
    assert!(cut.contains("the price 49 is below Stripe's minimum charge for USD, 50 (0.50 USD)"), "{cut}");
    assert!(yen.contains("the price 49 is below Stripe's minimum charge for JPY, 50 (50 JPY)"), "{yen}");
    let products: Vec<(String, i64)> = sqlx::query_as("SELECT id, price_minor FROM products ORDER BY id")
        .fetch_all(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(products, [("kettle".to_owned(), 1000)]);
    upsert("yen", "50", "jpy").await.unwrap();
    fleet.stop().await.unwrap();
}

/// `fleetctl product upsert` for sku `product` with `stock` units: its output, or its error.
async fn upsert_stock(fleet: &Fleet, product: &str, stock: &str) -> anyhow::Result<String> {
    let args = ["product", "upsert", "--id", product, "--name", product, "--price", "1000"];
    fleet.fleetctl(&[&args[..], &["--currency", "usd", "--stock", stock]].concat(), &[]).await
}

/// When the one ahead is declined, the order behind it gets the unit.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_cut_an_order_behind_a_pending_one_waits_for_its_outcome() {
    // Arrange: A (first in line, a card that will be declined) stays pending: its
    // authorization meets a 500, which Stripe saves under its key. B (second) is authorized;
    // no stock worker runs yet.
    let mut fleet =
        without_stock_workers("cut-behind-a-pending-order", &[("PAYMENT_ACTION_TIMEOUT_SECONDS", "300")])
            .await;
    fleet.product("sku-1", 1000, 2).await.unwrap();
    fleet.fault("create", "error_500", 1).await.unwrap();
    let a = fleet.post_order("ann", "key-a", "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    // B waits for 3-D Secure through the cut (a commit with nothing cut takes the units at
    // once, and the cut below them would be refused), then is authorized after it.
    let b = order(&fleet, "bob", "sku-1", "pm_card_threeDSecure2Required").await;
    assert_eq!((b.status, b.body["position"].as_i64()), (202, Some(2)), "{b:?}");

    // Act: cut to one unit. B's turn now depends on A: if A is authorized, A has the unit;
    // if A is declined, B has it. The worker must wait for A, not reject B at once.
    upsert_stock(&fleet, "sku-1", "1").await.unwrap();
    authenticate_in_line(&fleet, &[b.body["order_id"].as_str().unwrap().to_owned()]).await;
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b_now: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE user_id = 'bob'")
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert_eq!(b_now, "authorized", "B was decided while A ahead of it was still pending");
    // A's buyer retries: a new attempt, and the card is declined; its unit goes back.
    let (a_again, _) =
        fleet.post_order("ann", "key-a", "sku-1", 1, "pm_card_chargeDeclined").retrying().await.unwrap();
    assert_eq!(a_again.status, 402, "{a_again:?}");

    // Assert: B got the unit A did not take.
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&1), "{statuses:?}");
    assert_eq!(statuses.get("payment_declined"), Some(&1), "{statuses:?}");
    assert_eq!(statuses.get("rejected_out_of_stock"), None, "{statuses:?}");
    audit(&fleet, "sku-1", 2).await;
    fleet.stop().await.unwrap();
}

/// A SIGTERM while it waits spends none of its message's receives.
#[tokio::test(flavor = "multi_thread")]
async fn an_order_waiting_for_the_line_holds_up_no_other_order() {
    // Arrange: after a cut to one unit, B (second in line) waits for A (first, pending after a
    // saved 500). One stock worker, handling one message at a time, takes B's stock check;
    // its sweeper is off, so only the check's handling can move B.
    let mut fleet =
        without_stock_workers("wait-holds-up-nothing", &[("PAYMENT_ACTION_TIMEOUT_SECONDS", "300")]).await;
    fleet.product("sku-1", 1000, 2).await.unwrap();
    fleet.product("sku-2", 1000, 5).await.unwrap();
    fleet.fault("create", "error_500", 1).await.unwrap();
    let a = fleet.post_order("ann", "key-a", "sku-1", 1, "pm_card_chargeDeclined").await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    let b = order(&fleet, "bob", "sku-1", "pm_card_threeDSecure2Required").await;
    upsert_stock(&fleet, "sku-1", "1").await.unwrap();
    authenticate_in_line(&fleet, &[b.body["order_id"].as_str().unwrap().to_owned()]).await;
    let worker = [("STOCK_WORKER_CONCURRENCY", "1"), ("SWEEP_INTERVAL_SECONDS", "0")];
    fleet.spawn("stock-worker", "stock-worker", &worker).unwrap();
    fleet_harness::eventually("B's stock check taken", Duration::from_secs(30), || async {
        let depth = fleet.queue_depth(&fleet.stock.url).await.ok()?;
        (depth == (0, 1)).then_some(())
    })
    .await
    .unwrap();

    // Act: a buyer of another product, while B waits.
    let c = order(&fleet, "cat", "sku-2", "pm_card_visa").await;
    assert_eq!(c.status, 202, "{c:?}");

    // Assert: C is paid; B's wait held no permit. B's wait has no end while the sweeper is
    // off, so a wide bound (a loaded machine's relay, queue and capture) still catches it.
    let paid = fleet_harness::eventually("C paid", Duration::from_secs(60), || async {
        let status: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE user_id = 'cat'")
            .fetch_one(&fleet.pool)
            .await
            .ok()?;
        (status == "paid").then_some(())
    })
    .await;
    assert!(paid.is_ok(), "C waited behind B's wait: {:?}", fleet.statuses().await);
    // A SIGTERM returns no message to the queue with a receive spent.
    let stopped = fleet.terminate("stock-worker").await.unwrap();
    assert!(stopped.success(), "{stopped:?}");
    let back = fleet
        .sqs
        .receive_message()
        .queue_url(&fleet.stock.url)
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
        )
        .send()
        .await
        .unwrap();
    let spent: Vec<String> = back
        .messages()
        .iter()
        .filter_map(|m| {
            m.attributes()?.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
        })
        .filter(|count| count.as_str() != "1")
        .cloned()
        .collect();
    assert!(spent.is_empty(), "the stop spent receives: {spent:?}");
    assert_eq!(back.messages().len(), 0, "B's check is the sweeper's to finish, not the queue's");
    // B is not lost: once A's buyer retries and is declined, the sweeper gives B the unit.
    let (a_again, _) =
        fleet.post_order("ann", "key-a", "sku-1", 1, "pm_card_chargeDeclined").retrying().await.unwrap();
    assert_eq!(a_again.status, 402, "{a_again:?}");
    fleet.fleetctl(&["sweep", "--fulfilment-after-seconds", "0"], &[]).await.unwrap();
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&2), "{statuses:?}");
    assert_eq!(statuses.get("payment_declined"), Some(&1), "{statuses:?}");
    audit(&fleet, "sku-1", 3).await;
    fleet.stop().await.unwrap();
}

/// The hold passed its deadline, with no webhook to say so.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_cut_a_lapsed_hold_ahead_leaves_its_unit_to_the_one_behind() {
    // Arrange: A and B in line for two units, on 3-D Secure cards, cut to one unit, then both
    // authenticated (each commit finds the cut, so both stay `authorized`). A's hold passes
    // its deadline, which the fleet recorded from Stripe; Stripe cancels it. No webhooks: the
    // fleet must know from the deadline alone.
    let mut fleet = Fleet::prepare("lapsed-hold-in-line").await.unwrap();
    fleet.set_env("STRIPE_WEBHOOK_SECRET", "");
    for label in ["order-intake", "outbox-relay", "notification-worker"] {
        fleet.spawn(label, label, &[("PAYMENT_ACTION_TIMEOUT_SECONDS", "300")]).unwrap();
    }
    fleet.wait_intake().await.unwrap();
    fleet.product("sku-1", 1000, 2).await.unwrap();
    let ids = line_up_pending(&fleet, "sku-1", &[1, 1]).await;
    upsert_stock(&fleet, "sku-1", "1").await.unwrap();
    for id in &ids {
        fleet.authenticate_order(id).await.unwrap();
    }
    // Without webhooks the sweeper reads each intent and records the authentication.
    let sweep = ["sweep", "--pending-after-seconds", "0", "--fulfilment-after-seconds", "3600"];
    fleet.fleetctl(&sweep, &[]).await.unwrap();
    assert_eq!(statuses_in_line(&fleet, &ids).await, ["authorized", "authorized"]);
    sqlx::query(
        "UPDATE orders SET authorization_expires_at = now() - interval '1 minute' WHERE id = $1::uuid",
    )
    .bind(&ids[0])
    .execute(&fleet.pool)
    .await
    .unwrap();
    let a_intent: String = sqlx::query_scalar("SELECT payment_intent_id FROM orders WHERE id = $1::uuid")
        .bind(&ids[0])
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    let expire = format!("{}/_sim/payment_intents/{a_intent}/expire_authorization", fleet.stripe_url);
    assert!(fleet.http.post(expire).send().await.unwrap().status().is_success());
    // B's stock check first, so the worker decides B while A is still `authorized` ahead.
    let mut checks = fleet.take_messages(&fleet.stock.url.clone(), 2).await.unwrap();
    checks.sort_by_key(|body| !body.contains(&ids[1]));
    for body in &checks {
        fleet.sqs.send_message().queue_url(&fleet.stock.url).message_body(body).send().await.unwrap();
    }

    // Act
    fleet.spawn("stock-worker", "stock-worker", &[("STOCK_WORKER_CONCURRENCY", "1")]).unwrap();
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Assert: A, whose hold is gone, takes no unit and ends `authorization_canceled`; B, behind
    // it, gets the unit instead of being rejected for a unit then left unsold.
    assert_eq!(statuses_in_line(&fleet, &ids).await, ["authorization_canceled", "paid"]);
    assert_eq!(fleet.units("sku-1").await.unwrap(), (1, 0, 1));
    audit(&fleet, "sku-1", 4).await;
    fleet.stop().await.unwrap();
}

/// The refusal names the smallest total the product accepts.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_that_would_reject_an_order_ahead_of_a_served_one_is_refused() {
    // Arrange: three in line for three units; A, first, stays pending (a saved 500), while B
    // and C behind it are reserved and paid.
    let mut fleet = without_stock_workers("cut-ahead-of-served", &[]).await;
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    fleet.product("sku-1", 1000, 3).await.unwrap();
    fleet.fault("create", "error_500", 1).await.unwrap();
    let a = fleet.post_order("ann", "key-a", "sku-1", 1, "pm_card_visa").await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    for buyer in ["bob", "cy"] {
        assert_eq!(order(&fleet, buyer, "sku-1", "pm_card_visa").await.status, 202);
    }
    let both_paid = || async { (fleet.statuses().await.unwrap().get("paid") == Some(&2)).then_some(()) };
    fleet_harness::eventually("B and C paid", Duration::from_secs(60), both_paid).await.unwrap();

    // Act: cut to two, which is above the two units sold, but would leave A, ahead of both,
    // without a unit; then cut (and raise) to three.
    let refused = upsert_stock(&fleet, "sku-1", "2").await.unwrap_err().to_string();
    let accepted = upsert_stock(&fleet, "sku-1", "3").await;

    // Assert: refused, naming the smallest total it takes, and nothing changed; three is fine,
    // and A, retried, gets its unit.
    assert!(refused.contains("the smallest total it accepts is 3"), "{refused}");
    assert!(refused.contains("nothing was changed"), "{refused}");
    accepted.unwrap();
    assert_eq!(fleet.units("sku-1").await.unwrap(), (3, 1, 3));
    let (a_again, _) = fleet.post_order("ann", "key-a", "sku-1", 1, "pm_card_visa").retrying().await.unwrap();
    assert_eq!(a_again.status, 202, "{a_again:?}");
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&3), "{statuses:?}");
    audit(&fleet, "sku-1", 6).await;
    fleet.stop().await.unwrap();
}

/// The intake, its connections to PostgreSQL through a counter, and the relay and the
/// notification worker (no stock worker: the test starts one when it wants orders paid).
async fn counted_intake(name: &str) -> (Fleet, PgCounter) {
    counted_intake_with(name, false).await
}

/// [`counted_intake`], with Stripe's webhooks served by the intake when `webhooks`.
async fn counted_intake_with(name: &str, webhooks: bool) -> (Fleet, PgCounter) {
    let mut fleet = Fleet::prepare(name).await.unwrap();
    let (counter, counted) = PgCounter::in_front_of(&fleet.stack.database_url).await.unwrap();
    // Without `webhooks`, Stripe's webhooks, which the intake also serves, are left out of an
    // order's count (they arrive when they arrive): the endpoint answers 503, without a
    // statement.
    let mut intake_env = vec![("DATABASE_URL", counted.as_str())];
    if !webhooks {
        intake_env.push(("STRIPE_WEBHOOK_SECRET", ""));
    }
    fleet.spawn("order-intake", "order-intake", &intake_env).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.wait_intake().await.unwrap();
    (fleet, counter)
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_about_an_order_the_intake_authorized_cost_it_no_statement() {
    // Arrange: webhooks on, the intake's statements counted.
    let (mut fleet, counter) = counted_intake_with("webhooks-per-order", true).await;
    // Each event after its request's answer, as Stripe sends them (stripe-sim otherwise may
    // send one before the intake has read the create's answer; that event is read from the
    // database, as before).
    fleet.delay_webhooks(300).await.unwrap();
    fleet.product("sku-1", 1000, 6).await.unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[("SWEEP_INTERVAL_SECONDS", "0")]).unwrap();

    // Act: six orders paid; Stripe tells of each hold (payment_intent.amount_capturable_updated)
    // and each capture (payment_intent.succeeded).
    for buyer in ["ann", "bob", "cid", "dee", "eve", "fay"] {
        assert_eq!(order(&fleet, buyer, "sku-1", "pm_card_visa").await.status, 202);
    }
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&6), "{statuses:?}");
    let answered = || async {
        let deliveries = fleet.webhook_deliveries().await.ok()?;
        let ok = deliveries.iter().filter(|d| d["status"].as_u64() == Some(200)).count();
        (ok >= 12).then_some(deliveries)
    };
    let deliveries =
        fleet_harness::eventually("twelve events answered", Duration::from_secs(30), answered).await.unwrap();

    // Assert: the door and the commit of each order (12), and nothing for its events: the
    // intake knew each hold from its own authorization (before, each hold's event
    // cost a statement that found the order pending or authorized and changed nothing: 18).
    assert_eq!(counter.counts.statements(), 12, "six orders, their events: {deliveries:?}");
    fleet.stop().await.unwrap();
}

/// How many records of its sold-out answers (one statement a second at most, for `fleetctl
/// drop status`) the intake may have written since `began`: one for each second begun.
fn records_within(began: Instant) -> u64 {
    began.elapsed().as_secs() + 1
}

/// Waits until the intake has recorded `answers` sold-out answers for `product`.
async fn answers_recorded(fleet: &Fleet, product: &str, answers: i64) {
    let recorded = || async {
        let sum: Option<i64> =
            sqlx::query_scalar("SELECT sum(sold_out)::int8 FROM door_answers WHERE product_id = $1")
                .bind(product)
                .fetch_one(&fleet.pool)
                .await
                .ok()?;
        (sum == Some(answers)).then_some(())
    };
    fleet_harness::eventually("the sold-out answers recorded", Duration::from_secs(10), recorded)
        .await
        .unwrap();
}

/// A sold-out answer costs the intake one.
#[tokio::test(flavor = "multi_thread")]
async fn an_order_costs_two_statements_at_the_intake_one_at_the_stock_worker() {
    // Arrange: two units; the intake's statements counted on their way to PostgreSQL.
    let (mut fleet, counter) = counted_intake("statements-per-answer").await;
    fleet.product("sku-1", 1000, 2).await.unwrap();
    let statements = || counter.counts.statements();

    // Act and assert: each accepted order is the door and the commit of its authorization (the
    // key's lookup is the door's); each sold-out answer is the door alone, with or without
    // units that may come back.
    let before = statements();
    for buyer in ["ann", "bob"] {
        assert_eq!(order(&fleet, buyer, "sku-1", "pm_card_visa").await.status, 202);
    }
    assert_eq!(statements() - before, 4, "two accepted orders");
    let (before, began) = (statements(), Instant::now());
    let cid = order(&fleet, "cid", "sku-1", "pm_card_visa").await;
    assert_eq!((cid.status, cid.retry_after.as_deref()), (409, Some("5")), "{cid:?}");
    let spent = statements() - before;
    assert!(
        (1..=1 + records_within(began)).contains(&spent),
        "a sold-out answer while units may come back: the door, and at most the second's record: {spent}"
    );

    // The stock worker's statements counted too (its sweeper off): per order, the move to
    // paid alone. The commit of the authorization took the units (nothing was cut), and its
    // stock check says what to capture, so the worker reads nothing first.
    let (worker_counter, worker_url) = PgCounter::in_front_of(&fleet.stack.database_url).await.unwrap();
    let worker_env = [("DATABASE_URL", worker_url.as_str()), ("SWEEP_INTERVAL_SECONDS", "0")];
    fleet.spawn("stock-worker", "stock-worker", &worker_env).unwrap();
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&2), "{statuses:?}");
    // Beside them, the opener's two at the worker's start (its LISTEN, and its look at the
    // schedule, which shows no opening: it sleeps a minute).
    assert_eq!(worker_counter.counts.statements(), 2 + 2, "two orders through the stock worker");
    let (before, began) = (statements(), Instant::now());
    for i in 0..10 {
        let late = order(&fleet, &format!("late-{i}"), "sku-1", "pm_card_visa").await;
        assert_eq!((late.status, late.retry_after.as_deref()), (409, None), "{late:?}");
    }
    let spent = statements() - before;
    assert!(
        (10..=10 + records_within(began)).contains(&spent),
        "ten final sold-out answers: ten reads, and at most one record of them a second: {spent}"
    );
    // Once all eleven answers are recorded, nothing is left to record: the replay's count is
    // its own.
    answers_recorded(&fleet, "sku-1", 11).await;
    let before = statements();
    let replay = order(&fleet, "ann", "sku-1", "pm_card_visa").await;
    assert_eq!((replay.status, replay.replayed), (202, true), "a used key replays, sold out or not");
    assert_eq!(
        statements() - before,
        3,
        "a replay while sold out: the read (its key has an order), the door, then the order it finds"
    );

    // An upsert that adds units opens the door to the very next buyer.
    fleet.product("sku-1", 1000, 3).await.unwrap();
    assert_eq!(order(&fleet, "dee", "sku-1", "pm_card_visa").await.status, 202);
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&3), "{statuses:?}");
    audit(&fleet, "sku-1", 6).await;
    fleet.stop().await.unwrap();
}
