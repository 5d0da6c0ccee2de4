//! `make bench BENCH_ARGS=--opening`: a drop that opens at a set time (SPEC §1.8, §8.12):
//! 100,000 buyers (`--buyers`) queue for 1,000 units (`--units`) in its pre-queue,
//! `--concurrency` (256) at a time; then the opening, the queue drawn and its first orders
//! authorized without their buyers within Stripe's live limits (25 creates a second), and a
//! herd of `--herd` (10,000) buyers who come after the opening, while the queue waits.
//!
//! The queue opens a second before the run, its sale an hour later; once every buyer is
//! queued, the operator moves `--opens-at` to 3 s ahead (`fleetctl product upsert`), as one may
//! before the opening. One buyer in 50 of the queue pays with a card that declines, so units
//! come back to the queue while it is served.
//!
//! It prints the entries a second and what each cost (the door's statements, the intake's round
//! trips), how long after `opens_at` the opening was seen done, and the first authorization
//! after it; the creates a second while units were left, against Stripe's 25; the herd's
//! statements per answer; the queue's end (paid, `sold_out`); and every §8 check. Last, one
//! line: `bench-opening: queued=N units=U entries_per_s=… statements_per_entry=…
//! opening_s=… first_authorization_s=… creates_per_s=… herd_statements_per_answer=… audit=ok`.

use std::time::{Duration, Instant};

use fleet_harness::Fleet;
use fleet_harness::audit::Audit;
use futures::StreamExt;

use super::herd::{buy, sold_out_statements};
use super::{costs, say};

pub struct OpeningOptions {
    pub buyers: usize,
    pub units: i32,
    pub concurrency: usize,
    pub herd: usize,
}

const PRODUCT: &str = "opening";

pub async fn run(fleet: &mut Fleet, options: &OpeningOptions) -> anyhow::Result<()> {
    let (meter, url) = start_fleet(fleet, options).await?;

    // The pre-queue.
    let before = meter.read(fleet);
    let queued_before = door_outcomes(fleet, "queued").await;
    let started = Instant::now();
    let entries = ask(fleet, &url, "queue", options.buyers, options.concurrency, |i| {
        if i % 50 == 7 { "pm_card_chargeDeclined" } else { "pm_card_visa" }
    })
    .await;
    let entry_seconds = started.elapsed().as_secs_f64();
    let spent = meter.read(fleet).since(&before);
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE product_id = $1 AND status = 'queued'")
            .bind(PRODUCT)
            .fetch_one(&fleet.pool)
            .await?;
    anyhow::ensure!(
        queued == options.buyers as i64,
        "{queued} of {} buyers queued: {:?}",
        options.buyers,
        answers_by_code(&entries)
    );
    let door_statements = door_outcomes(fleet, "queued").await - queued_before;
    let intake_round_trips: u64 = spent
        .processes
        .iter()
        .filter(|(label, _)| label.starts_with("order-intake"))
        .map(|(_, r)| r.round_trips)
        .sum();

    // The opening, 3 s ahead.
    let stripe_before = fleet.stripe_stats().await?["requests"].as_u64().unwrap_or(0);
    let opens_at = chrono::Utc::now() + chrono::TimeDelta::seconds(3);
    upsert(fleet, options.units, &opens_at.to_rfc3339()).await?;
    let opening_s = seen_after(opens_at, || async {
        let opened: Option<bool> =
            sqlx::query_scalar("SELECT opened_at IS NOT NULL FROM products WHERE id = $1")
                .bind(PRODUCT)
                .fetch_optional(&fleet.pool)
                .await
                .ok()?;
        opened.unwrap_or(false).then_some(())
    })
    .await?;
    let first_authorization_s = seen_after(opens_at, || async {
        let requests = fleet.stripe_stats().await.ok()?["requests"].as_u64()?;
        (requests > stripe_before).then_some(())
    })
    .await?
        - opening_s;

    // The herd after the opening, while the queue waits.
    let reads_before = sold_out_statements(fleet).await;
    let herd_started = Instant::now();
    let herd = ask(fleet, &url, "late", options.herd, options.concurrency, |_| "pm_card_visa").await;
    let herd_seconds = herd_started.elapsed().as_secs_f64();
    let herd_statements = sold_out_statements(fleet).await - reads_before;
    let herd_codes = answers_by_code(&herd);

    // The queue served to its end.
    fleet_harness::eventually("the queue served", Duration::from_secs(1800), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1 AND (status = 'queued' OR holds_units(status))",
        )
        .bind(PRODUCT)
        .fetch_one(&fleet.pool)
        .await
        .ok()?;
        (waiting == 0).then_some(())
    })
    .await?;
    fleet.wait_settled(Duration::from_secs(600)).await?;
    let by_status = fleet.statuses().await?;
    let intents = fleet.intents().await?;
    let (creates_per_s, median_second) = creates_while_units_lasted(&intents);
    let audit = Audit::without_notifications(fleet, "opening").await?;
    let seed: Option<Vec<u8>> = sqlx::query_scalar("SELECT draw_seed FROM products WHERE id = $1")
        .bind(PRODUCT)
        .fetch_one(&fleet.pool)
        .await?;

    let statements_per_entry = door_statements / options.buyers as f64;
    let herd_per_answer = herd_statements / options.herd.max(1) as f64;
    println!();
    println!("== orderfleet opening: {} queued buyers for {} units ==", options.buyers, options.units);
    println!(
        "pre-queue                 {} entries in {entry_seconds:.1} s = {:.0}/s; {statements_per_entry:.3} door statements each, \
         {:.3} intake round trips each (the Stripe budget's ticks included)",
        options.buyers,
        options.buyers as f64 / entry_seconds,
        intake_round_trips as f64 / options.buyers as f64
    );
    println!(
        "opening                   seen done {opening_s:.2} s after opens_at (the draw of {queued} and the first {} promises, one transaction)",
        options.units
    );
    println!("first authorization       {first_authorization_s:.2} s after the opening was seen done");
    println!(
        "authorizations            {creates_per_s:.1} creates/s from the first to the last, {median_second} in the median second \
         (Stripe's create limit 25/s: {:.0} %)",
        median_second as f64 / 25.0 * 100.0
    );
    println!(
        "herd after the opening    {} answers in {herd_seconds:.1} s: {herd_codes:?}; {herd_statements:.0} statements = \
         {herd_per_answer:.4} per answer",
        options.herd
    );
    println!("orders                    {by_status:?}");
    println!("draw seed                 {}", seed.map(hex).unwrap_or_default());
    println!("guarantees                {}", audit.summary());
    println!();
    println!(
        "bench-opening: queued={} units={} entries_per_s={:.0} statements_per_entry={statements_per_entry:.3} \
         opening_s={opening_s:.2} first_authorization_s={first_authorization_s:.2} creates_per_s={creates_per_s:.1} \
         creates_median_second={median_second} herd_statements_per_answer={herd_per_answer:.4} audit={}",
        options.buyers,
        options.units,
        options.buyers as f64 / entry_seconds,
        if audit.holds() { "ok" } else { "broken" }
    );
    anyhow::ensure!(audit.holds(), "a guarantee broke in the opening: {}", audit.summary());
    Ok(())
}

/// The fleet (an intake, the relay, two stock workers, the notification worker), stripe-sim
/// and the fleet's budget at Stripe's live limits, and the product: its queue open, its sale an
/// hour ahead. The intake's base URL.
async fn start_fleet(fleet: &mut Fleet, options: &OpeningOptions) -> anyhow::Result<(costs::Meter, String)> {
    let common = [
        ("RUST_LOG", "warn"),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
        ("SWEEP_INTERVAL_SECONDS", "5"),
        ("INTAKE_MAX_IN_FLIGHT", "4096"),
    ];
    fleet.stripe_rate_limits(100, 25).await?;
    let mut meter = costs::Meter::new(&fleet.stack.database_url).await?;
    meter.spawn(fleet, "order-intake", "order-intake", &common).await?;
    meter.spawn(fleet, "outbox-relay", "outbox-relay", &common).await?;
    meter.spawn(fleet, "stock-worker-0", "stock-worker", &common).await?;
    meter.spawn(fleet, "stock-worker-1", "stock-worker", &common).await?;
    meter.spawn(fleet, "notification-worker", "notification-worker", &common).await?;
    fleet.wait_intake().await?;
    let queue_opens_at = (chrono::Utc::now() - chrono::TimeDelta::seconds(1)).to_rfc3339();
    let opens_at = (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339();
    fleet
        .fleetctl(
            &[
                "product",
                "upsert",
                "--id",
                PRODUCT,
                "--name",
                PRODUCT,
                "--price",
                "1000",
                "--currency",
                "usd",
                "--stock",
                &options.units.to_string(),
                "--opens-at",
                &opens_at,
                "--queue-opens-at",
                &queue_opens_at,
            ],
            &[],
        )
        .await?;
    say(&format!(
        "an opening: {} buyers queue for {} units, {} at a time; then {} buyers after the opening; \
         stripe-sim and the fleet's budget at 100/s, 25/s on each operation",
        options.buyers, options.units, options.concurrency, options.herd
    ));
    Ok((meter, fleet.intake_url.clone()))
}

/// `fleetctl product upsert` of the product, opening at `opens_at`.
async fn upsert(fleet: &Fleet, units: i32, opens_at: &str) -> anyhow::Result<()> {
    fleet
        .fleetctl(
            &[
                "product",
                "upsert",
                "--id",
                PRODUCT,
                "--name",
                PRODUCT,
                "--price",
                "1000",
                "--currency",
                "usd",
                "--stock",
                &units.to_string(),
                "--opens-at",
                opens_at,
            ],
            &[],
        )
        .await?;
    Ok(())
}

/// `buyers` each ask once for a unit, `concurrency` at a time, each with `method(i)`.
async fn ask(
    fleet: &Fleet,
    url: &str,
    who: &str,
    buyers: usize,
    concurrency: usize,
    method: impl Fn(usize) -> &'static str,
) -> Vec<super::herd::Asked> {
    futures::stream::iter(0..buyers)
        .map(|i| buy(fleet, url, PRODUCT, i, method(i), who))
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Each final answer's status and code, counted.
fn answers_by_code(asked: &[super::herd::Asked]) -> std::collections::BTreeMap<String, usize> {
    let mut counted = std::collections::BTreeMap::new();
    for (status, code, _) in asked.iter().filter_map(|a| a.last()) {
        *counted.entry(format!("{status} {code}")).or_default() += 1;
    }
    counted
}

/// The seconds from `at` until `seen` first holds, looked at every 20 ms.
async fn seen_after<F, Fut>(at: chrono::DateTime<chrono::Utc>, seen: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if seen().await.is_some() {
            return Ok((chrono::Utc::now() - at).as_seconds_f64());
        }
        anyhow::ensure!(Instant::now() < deadline, "not seen within 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The door's statements that answered `outcome`, from the intake's metrics.
async fn door_outcomes(fleet: &Fleet, outcome: &str) -> f64 {
    let line = format!("intake_door_seconds_count{{outcome=\"{outcome}\"}}");
    fleet
        .scrape_metrics()
        .await
        .iter()
        .flat_map(|text| text.lines())
        .filter(|l| l.starts_with(&line))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// PaymentIntents made a second from the first to the last, and in the median whole second
/// (the first and last, part seconds, left out).
fn creates_while_units_lasted(intents: &[serde_json::Value]) -> (f64, u64) {
    let created: Vec<i64> = intents.iter().filter_map(|i| i["created"].as_i64()).collect();
    let (Some(first), Some(last)) = (created.iter().min(), created.iter().max()) else { return (0.0, 0) };
    let span = (last - first).max(1);
    let mut seconds: Vec<u64> =
        (first + 1..*last).map(|at| created.iter().filter(|c| **c == at).count() as u64).collect();
    seconds.sort_unstable();
    (
        created.len().saturating_sub(1) as f64 / span as f64,
        seconds.get(seconds.len() / 2).copied().unwrap_or(0),
    )
}

fn hex(bytes: Vec<u8>) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
