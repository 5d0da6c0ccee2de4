//! The operator's pause (SPEC §1.8, §2 `product pause|resume`, §4 `sale_paused`, §8.12): once
//! `fleetctl product pause` returns, no intake promises a unit or takes a queue entry; orders
//! that hold units go on; the resume goes on in line order; an opening that falls due while
//! paused waits for the resume.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleet_harness::eventually;
use futures::StreamExt;
use orderfleet_tests::Fleet;
use orderfleet_tests::drops::{at, upsert};

/// One order request at the intake `url`: its status and error code.
async fn ask(fleet: &Fleet, url: &str, user: &str, product: &str) -> (u16, String, Option<String>) {
    let answer = fleet.post_order(user, "k", product, 1, "pm_card_visa").at(url).await.unwrap();
    let body = answer.body;
    (
        answer.status,
        body["error"]["code"].as_str().unwrap_or(body["status"].as_str().unwrap_or("")).to_owned(),
        answer.retry_after,
    )
}

/// The database's clock now.
async fn db_now(fleet: &Fleet) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()").fetch_one(&fleet.pool).await.unwrap()
}

/// Buyers keep asking at two intakes while the operator pauses the sale: once the command has
/// returned, neither intake promises anything (every answer is `409 sale_paused`, with
/// `Retry-After`); the orders accepted before it go on to be paid; after the resume, new orders
/// are accepted behind every earlier one.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_stops_both_intakes_once_it_returns_and_the_resume_goes_on_in_line() {
    // Arrange: a second intake; buyers asking at both, all the time.
    let mut fleet = Fleet::start("pause", 1).await.unwrap();
    let second = fleet.spawn_intake("order-intake-2", &[]).unwrap();
    let urls = [fleet.intake_url.clone(), second];
    for url in &urls {
        fleet.wait_intake_at(url).await.unwrap();
    }
    upsert(&fleet, "sku-p", 10_000, &[]).await.unwrap();
    let fleet = Arc::new(fleet);
    let asking = Arc::new(AtomicBool::new(true));
    // Four lanes, each a request every 200 ms at most: within the fleet's 25 creates a second.
    let load: Vec<_> = (0..4)
        .map(|lane| {
            let (fleet, asking, url) = (fleet.clone(), asking.clone(), urls[lane % 2].clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut i = 0;
                while asking.load(Ordering::Acquire) {
                    let asked_at = db_now(&fleet).await;
                    let answer = ask(&fleet, &url, &format!("lane-{lane}-buyer-{i}"), "sku-p").await;
                    answers.push((lane % 2, asked_at, db_now(&fleet).await, answer));
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                answers
            })
        })
        .collect();

    // Act: the pause while they ask, then a while paused, then the resume.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let paused = fleet.fleetctl(&["product", "pause", "--id", "sku-p"], &[]).await.unwrap();
    let returned = db_now(&fleet).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = fleet.fleetctl(&["product", "pause", "--id", "sku-p"], &[]).await.unwrap();
    // A request answered before the resume began was answered as paused.
    let resuming = db_now(&fleet).await;
    let resumed = fleet.fleetctl(&["product", "resume", "--id", "sku-p"], &[]).await.unwrap();
    let resumed_at = db_now(&fleet).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    asking.store(false, Ordering::Release);
    let mut answers = Vec::new();
    for lane in load {
        answers.extend(lane.await.unwrap());
    }
    fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert: nothing promised after the command returned, at either intake.
    assert!(paused.contains("paused at"), "{paused}");
    assert!(again.contains("paused already"), "{again}");
    assert!(resumed.contains("resumed"), "{resumed}");
    let promised_during: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE product_id = 'sku-p' AND created_at > $1 AND created_at < $2",
    )
    .bind(returned)
    .bind(resuming)
    .fetch_one(&fleet.pool)
    .await
    .unwrap();
    assert_eq!(promised_during, 0, "an order promised after the pause returned");
    for intake in 0..2 {
        // Asked after the pause returned and answered before the resume began.
        let told: Vec<&(u16, String, Option<String>)> = answers
            .iter()
            .filter(|(i, asked, answered, _)| *i == intake && *asked > returned && *answered < resuming)
            .map(|(_, _, _, answer)| answer)
            .collect();
        assert!(told.len() >= 3, "intake {intake} asked {} times while paused", told.len());
        assert!(
            told.iter()
                .all(|(status, code, retry)| *status == 409 && code == "sale_paused" && retry.is_some()),
            "intake {intake} while paused: {told:?}"
        );
    }
    // The resume goes on: orders accepted after it, behind every earlier one; every order paid.
    let (before, after): (Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT max(position) FILTER (WHERE created_at < $1), min(position) FILTER (WHERE created_at > $2)
           FROM orders WHERE product_id = 'sku-p'",
    )
    .bind(returned)
    .bind(resumed_at)
    .fetch_one(&fleet.pool)
    .await
    .unwrap();
    let (before, after) = (before.expect("orders before the pause"), after.expect("orders after the resume"));
    assert!(before < after, "the line after the resume: {before} then {after}");
    let statuses = fleet.statuses().await.unwrap();
    assert_eq!(statuses.keys().collect::<Vec<_>>(), ["paid"], "{statuses:?}");
    let pauses: Vec<(chrono::DateTime<chrono::Utc>, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("SELECT paused_at, resumed_at FROM product_pauses WHERE product_id = 'sku-p'")
            .fetch_all(&fleet.pool)
            .await
            .unwrap();
    assert_eq!(pauses.len(), 1, "one pause recorded: {pauses:?}");
    assert!(pauses[0].0 <= returned && pauses[0].1.is_some_and(|r| r <= resumed_at), "{pauses:?}");
    Arc::into_inner(fleet).expect("the load is done").stop().await.unwrap();
}

/// An opening that falls due while the product is paused waits: no draw, and a queue entry is
/// refused `sale_paused` with nothing written; the resume opens it at once.
#[tokio::test(flavor = "multi_thread")]
async fn an_opening_that_falls_due_while_paused_opens_at_the_resume() {
    // Arrange: two queued buyers and the pause, an hour before the opening; then the opening
    // moved to 2 s ahead, as an operator may before it.
    let fleet = Fleet::start("pause-opening", 1).await.unwrap();
    upsert(&fleet, "sku-o", 1, &["--opens-at", &at(3_600), "--queue-opens-at", &at(-60)]).await.unwrap();
    for user in ["ada", "bo"] {
        let queued = fleet.post_order(user, "k", "sku-o", 1, "pm_card_visa").await.unwrap();
        assert_eq!(queued.body["status"], "queued", "{queued:?}");
    }
    fleet.fleetctl(&["product", "pause", "--id", "sku-o"], &[]).await.unwrap();
    let refused = fleet.post_order("cy", "k", "sku-o", 1, "pm_card_visa").await.unwrap();
    upsert(&fleet, "sku-o", 1, &["--opens-at", &at(2)]).await.unwrap();

    // Act: past the opening, paused; then the resume.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let opened_while_paused: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT opened_at FROM products WHERE id = 'sku-o'")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    let late = fleet.post_order("di", "k", "sku-o", 1, "pm_card_visa").await.unwrap();
    let resuming = db_now(&fleet).await;
    fleet.fleetctl(&["product", "resume", "--id", "sku-o"], &[]).await.unwrap();
    let resumed_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT resumed_at FROM product_pauses WHERE product_id = 'sku-o'")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    let opened_at: chrono::DateTime<chrono::Utc> =
        eventually("the product opened", Duration::from_secs(30), || async {
            sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
                "SELECT opened_at FROM products WHERE id = 'sku-o'",
            )
            .fetch_one(&fleet.pool)
            .await
            .unwrap()
        })
        .await
        .unwrap();
    let by_status = eventually("the queue served", Duration::from_secs(60), || async {
        let statuses = fleet.statuses().await.unwrap();
        (statuses.get("paid") == Some(&1) && statuses.get("sold_out") == Some(&1)).then_some(statuses)
    })
    .await
    .unwrap();

    // Assert
    assert_eq!(
        (refused.status, refused.body["error"]["code"].as_str(), refused.retry_after.is_some()),
        (409, Some("sale_paused"), true),
        "{refused:?}"
    );
    assert_eq!((late.status, late.body["error"]["code"].as_str()), (409, Some("sale_paused")), "{late:?}");
    assert_eq!(opened_while_paused, None, "no opening while paused");
    // The resume's own clock (`product_pauses.resumed_at`, inside its transaction) and the
    // opening's: the opener, woken by the resume, opens it at once.
    assert!(opened_at >= resuming, "opened {opened_at} before the resume began {resuming}");
    assert!(
        opened_at - resumed_at < chrono::TimeDelta::milliseconds(2_500),
        "opened {opened_at}, {resumed_at} resumed"
    );
    assert_eq!(by_status.values().sum::<i64>(), 2, "nothing written for the refused buyers: {by_status:?}");
    fleet.stop().await.unwrap();
}

/// A herd before the opening is answered `not_open` from the intake's shared reads: far fewer
/// statements than answers, and nothing written.
#[tokio::test(flavor = "multi_thread")]
async fn a_herd_before_the_opening_is_told_not_open_from_shared_reads() {
    // Arrange
    let fleet = Fleet::start("not-open-herd", 1).await.unwrap();
    upsert(&fleet, "sku-h", 5, &["--opens-at", &at(3_600)]).await.unwrap();
    let before = statements(&fleet).await;

    // Act: 600 buyers, 64 at a time.
    let answers: Vec<(u16, String, Option<String>)> = futures::stream::iter(0..600)
        .map(|i| {
            let (fleet, url) = (&fleet, fleet.intake_url.clone());
            async move { ask(fleet, &url, &format!("early-{i}"), "sku-h").await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let spent = statements(&fleet).await - before;

    // Assert
    assert!(
        answers.iter().all(|(s, code, retry)| *s == 409 && code == "not_open" && retry.is_some()),
        "{answers:?}"
    );
    assert!(spent < 150.0, "{spent} statements for 600 not_open answers");
    assert_eq!(fleet.statuses().await.unwrap().len(), 0, "nothing written");
    fleet.stop().await.unwrap();
}

/// The statements the intake ran for answers that admitted no one: its shared reads and its
/// door statements that closed.
async fn statements(fleet: &Fleet) -> f64 {
    fleet
        .scrape_metrics()
        .await
        .iter()
        .flat_map(|text| text.lines())
        .filter(|l| {
            l.starts_with("intake_sold_out_reads_total")
                || l.starts_with("intake_door_seconds_count{outcome=\"closed\"}")
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}
