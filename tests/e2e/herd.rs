//! The herd at the door (SPEC §8.7): two intakes, each answering `sold_out` from reads of the
//! product that its own waiting requests share, while units come back in the middle of the
//! herd (a buyer failing 3-D Secure, a raise of the total, declines).
//!
//! §8.7 is judged from outside, from what the buyers saw and the orders PostgreSQL holds. A
//! `sold_out` is wrong for certain when the buyer asked after a unit came back (the return
//! seen committed) and was answered before any order had been made since: the unit was then
//! promised to nobody for the whole of the request. (An order's `created_at` is its
//! statement's start, before its commit, so an order made in time always shows as made in
//! time: the check never blames a right answer.)

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use orderfleet_tests::Fleet;
use orderfleet_tests::audit::Audit;
use serde_json::Value;

/// Buyers asking at once at each intake, each asking again as soon as it is answered.
const LOOPS_PER_INTAKE: usize = 12;

/// One answer of the herd.
#[derive(Debug, Clone)]
struct Asked {
    sent: DateTime<Utc>,
    answered: DateTime<Utc>,
    status: u16,
    code: String,
    intake: usize,
}

/// One loop of the herd at `url`: new buyers, one after another, until `stop`; every
/// twentieth with a card that declines, so a unit that goes to them comes back again.
async fn herd_loop(
    fleet: Arc<Fleet>,
    url: String,
    intake: usize,
    n: usize,
    stop: Arc<AtomicBool>,
) -> Vec<Asked> {
    let mut asked = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let user = format!("herd-{intake}-{n}-{i}");
        let method = if i % 20 == 0 { "pm_card_chargeDeclined" } else { "pm_card_visa" };
        let body = serde_json::json!({ "product_id": "drop", "quantity": 1, "payment_method": method });
        let sent = Utc::now();
        let answer = fleet
            .http
            .post(format!("{url}/v1/orders"))
            .bearer_auth(fleet.token(&user))
            .header("idempotency-key", "k")
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let Ok(answer) = answer else { continue };
        let status = answer.status().as_u16();
        let body = answer.json::<Value>().await.unwrap_or(Value::Null);
        let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
        asked.push(Asked { sent, answered: Utc::now(), status, code, intake });
    }
    asked
}

/// The orders of the product: (id, created_at).
async fn orders(fleet: &Fleet) -> Vec<(uuid::Uuid, DateTime<Utc>)> {
    sqlx::query_as("SELECT id, created_at FROM orders WHERE product_id = 'drop'")
        .fetch_all(&fleet.pool)
        .await
        .unwrap()
}

/// A unit come back: the moment its return was seen committed, and the orders made before it.
struct Return {
    seen: DateTime<Utc>,
    before: HashSet<uuid::Uuid>,
}

/// The `sold_out` answers that are wrong for certain (see the module's doc), for each return.
async fn wrong_sold_outs(fleet: &Fleet, returns: &[Return], asked: &[Asked]) -> Vec<String> {
    let orders = orders(fleet).await;
    let mut wrong = Vec::new();
    for back in returns {
        let first_since =
            orders.iter().filter(|(id, _)| !back.before.contains(id)).map(|(_, created)| *created).min();
        for a in asked.iter().filter(|a| a.code == "sold_out" && a.sent > back.seen) {
            if first_since.is_none_or(|made| made >= a.answered) {
                wrong.push(format!(
                    "intake {} answered sold_out at {} to a request sent at {}, after a unit came back at {} and before any order was made ({first_since:?})",
                    a.intake, a.answered, a.sent, back.seen
                ));
            }
        }
    }
    wrong
}

async fn healthy(fleet: &Fleet, url: &str) {
    fleet_harness::eventually("the intake answers", Duration::from_secs(30), || async {
        let answer = fleet.http.get(format!("{url}/healthz")).send().await.ok()?;
        answer.status().is_success().then_some(())
    })
    .await
    .unwrap();
}

/// The order's status, as its buyer reads it.
async fn status_of(fleet: &Fleet, user: &str, order_id: &str) -> String {
    let view: Value = fleet.get_order(user, order_id).await.unwrap().json().await.unwrap();
    view["status"].as_str().unwrap_or("").to_owned()
}

/// What one herd showed: every answer, and the returns in it.
struct Herd {
    fleet: Arc<Fleet>,
    asked: Vec<Asked>,
    returns: Vec<Return>,
}

/// A herd at two intakes (both with `intake_env`) for a product of three units: two sold, one
/// held by a buyer at 3-D Secure. Mid-herd, that buyer fails 3-D Secure (its unit comes back),
/// and later the total is raised to four.
async fn herd(name: &str, intake_env: &[(&str, &str)]) -> Herd {
    // Arrange
    let mut fleet = Fleet::prepare(name).await.unwrap();
    fleet.spawn("order-intake", "order-intake", intake_env).unwrap();
    let second = fleet.spawn_intake("order-intake-2", intake_env).unwrap();
    fleet.spawn("stock-worker", "stock-worker", &[]).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.wait_intake().await.unwrap();
    healthy(&fleet, &second).await;
    fleet.product("drop", 1000, 3).await.unwrap();
    for buyer in ["ann", "bob"] {
        assert_eq!(fleet.post_order(buyer, "k", "drop", 1, "pm_card_visa").await.unwrap().status, 202);
    }
    let secure = fleet.post_order("sue", "k", "drop", 1, "pm_card_threeDSecure2Required").await.unwrap();
    assert_eq!(secure.status, 202, "{secure:?}");
    let sue_s = secure.body["order_id"].as_str().unwrap().to_owned();
    let fleet = Arc::new(fleet);

    // Act: the herd at both intakes; after a second, Sue fails 3-D Secure; two seconds after
    // her unit is back, the total is raised by one; two seconds later the herd stops.
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for (intake, url) in [fleet.intake_url.clone(), second].into_iter().enumerate() {
        for n in 0..LOOPS_PER_INTAKE {
            loops.push(tokio::spawn(herd_loop(fleet.clone(), url.clone(), intake, n, stop.clone())));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut returns = Vec::new();
    let before: HashSet<_> = orders(&fleet).await.into_iter().map(|(id, _)| id).collect();
    let sue_s_intent: String = sqlx::query_scalar("SELECT payment_intent_id FROM orders WHERE id = $1::uuid")
        .bind(&sue_s)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    fleet.authenticate(&sue_s_intent, false).await.unwrap();
    // Watched in the database every 2 ms: the return is seen as soon after its commit as can be.
    let waited = Instant::now();
    loop {
        let status: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1::uuid")
            .bind(&sue_s)
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
        if status == "payment_declined" {
            break;
        }
        assert!(waited.elapsed() < Duration::from_secs(30), "Sue's order is not declined: {status}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    returns.push(Return { seen: Utc::now(), before });
    assert_eq!(status_of(&fleet, "sue", &sue_s).await, "payment_declined");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: HashSet<_> = orders(&fleet).await.into_iter().map(|(id, _)| id).collect();
    fleet.product("drop", 1000, 4).await.unwrap();
    returns.push(Return { seen: Utc::now(), before });
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut asked = Vec::new();
    for herd_loop in loops {
        asked.extend(herd_loop.await.unwrap());
    }
    Herd { fleet, asked, returns }
}

#[tokio::test(flavor = "multi_thread")]
async fn units_that_come_back_go_to_later_buyers_at_either_intake() {
    // Arrange and act
    let Herd { fleet, asked, returns } = herd("herd", &[]).await;

    // Assert: no sold_out that §8.7 forbids, at either intake, after either return; both
    // units that came back were sold (or came back again from a declined card, and went on).
    let wrong = wrong_sold_outs(&fleet, &returns, &asked).await;
    assert!(wrong.is_empty(), "{} wrong sold_out answers: {wrong:#?}", wrong.len());
    // Not vacuous: the herd kept asking, at both intakes, after each unit came back.
    for back in &returns {
        for intake in 0..2 {
            let after = asked.iter().filter(|a| a.intake == intake && a.sent > back.seen).count();
            assert!(after > 0, "nobody asked at intake {intake} after the return at {}", back.seen);
        }
    }
    let sold_out = asked.iter().filter(|a| a.code == "sold_out").count();
    for intake in 0..2 {
        let there = asked.iter().filter(|a| a.intake == intake && a.code == "sold_out").count();
        assert!(there > 0, "intake {intake} told nobody sold_out");
    }
    let accepted = asked.iter().filter(|a| a.status == 202).count();
    assert!(accepted >= 2, "the two units that came back went to the herd: {accepted} accepted");
    // The reads were shared: fewer reads than sold-out answers (each intake's metrics).
    let metrics = fleet.scrape_metrics().await.join("\n");
    let reads: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("intake_sold_out_reads_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum();
    assert!(reads > 0.0 && reads < sold_out as f64, "{reads} reads for {sold_out} sold_out answers");
    eprintln!("{} answers, {sold_out} sold_out, {accepted} accepted, {reads} reads", asked.len());
    let fleet = Arc::into_inner(fleet).expect("the herd's loops are done");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let orders = orders(&fleet).await.len();
    let notes = fleet.notifications(orders, Duration::from_secs(60)).await.unwrap();
    Audit::of(&fleet, "drop", &notes).await.unwrap().assert_guarantees();
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_planted_sold_out_cache_is_caught_saying_sold_out_with_a_unit_back() {
    // Arrange and act: the same herd, with the intakes answering from a read up to two seconds
    // old (the failpoint `sold_out_cache`: a cache with a time to live).
    let planted = [("ORDERFLEET_FAILPOINTS", "sold_out_cache")];
    let Herd { fleet, asked, returns } = herd("herd-planted-cache", &planted).await;

    // Assert: the check that passes above finds the cache's wrong answers.
    let wrong = wrong_sold_outs(&fleet, &returns, &asked).await;
    assert!(!wrong.is_empty(), "the planted cache told nobody sold_out wrongly");
    eprintln!("{} wrong sold_out answers, the first: {}", wrong.len(), wrong[0]);
    let fleet = Arc::into_inner(fleet).expect("the herd's loops are done");
    fleet.stop().await.unwrap();
}
