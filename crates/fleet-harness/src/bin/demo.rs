//! `make demo`: a flash sale through the whole fleet, against the stack `make up` started.
//!
//! Starts stripe-sim (limited, as Stripe is, to 25 requests a second) and every binary (two
//! stock workers), with Stripe budgets that add up to that limit; seeds a product with limited
//! stock through `fleetctl`; lets one buyer in first with a card that is declined (their unit
//! goes back to the line), then fires a burst of orders from many users — some retried with
//! the same Idempotency-Key; waits until every order is terminal, prints what happened and
//! checks SPEC §8's guarantees against stripe-sim's ledger and stats, the database and the SNS
//! topic, then stops what it started (SIGTERM).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_harness::audit::Audit;
use fleet_harness::metrics::sum_by_label;
use fleet_harness::{Answer, Fleet, Stack, percentile};
use futures::StreamExt;

/// Stripe's default limit per endpoint, and the fleet's budgets adding up to it.
const STRIPE_RATE_LIMIT: u32 = 25;
const INTAKE_BUDGET: u32 = 15;
const WORKER_BUDGET: u32 = 5;

struct Options {
    orders: usize,
    stock: i32,
}

fn options() -> anyhow::Result<Options> {
    let mut options = Options { orders: 300, stock: 50 };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--orders" => options.orders = value()?.parse().context("--orders takes a number")?,
            "--stock" => options.stock = value()?.parse().context("--stock takes a number")?,
            "--help" | "-h" => {
                println!("orderfleet-demo [--orders N (300)] [--stock UNITS (50)]");
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other}; see --help"),
        }
    }
    anyhow::ensure!(options.orders >= 2, "--orders must be at least 2");
    Ok(options)
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run the demo with `make demo`"))
}

/// The build the fleet ran as (one `cargo build` made this program and the fleet's binaries):
/// the counts in the summary are the same in every build, the latencies and times are not.
const BUILD: &str = if cfg!(debug_assertions) {
    "dev profile, unoptimized (make demo's default): the counts are the product's; for its latencies, \
     ORDERFLEET_BUILD=release make demo, or make bench"
} else {
    "optimized (--release)"
};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<bool> {
    let options = options()?;
    let stack = Stack {
        database_url: var("DATABASE_URL")?,
        stock_queue_url: var("STOCK_QUEUE_URL")?,
        notification_queue_url: var("NOTIFICATION_QUEUE_URL")?,
        topic_arn: var("NOTIFICATION_TOPIC_ARN")?,
        aws_env: Stack::aws_env_from_process(),
    };
    let log_dir = std::env::var_os("ORDERFLEET_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".run"))
        .join("demo");

    say(&format!(
        "starting stripe-sim (limited to {STRIPE_RATE_LIMIT} requests/s), order-intake (Stripe budget {INTAKE_BUDGET}/s), \
         outbox-relay, 2 × stock-worker ({WORKER_BUDGET}/s each), notification-worker"
    ));
    say(&format!("logs: {}/", log_dir.display()));
    let mut fleet = Fleet::prepare("demo", stack, log_dir).await?;
    fleet.stripe_rate_limit(STRIPE_RATE_LIMIT).await?;
    let (intake_budget, worker_budget) = (INTAKE_BUDGET.to_string(), WORKER_BUDGET.to_string());
    let intake = [("STRIPE_MAX_REQUESTS_PER_SECOND", intake_budget.as_str())];
    let worker = [("STRIPE_MAX_REQUESTS_PER_SECOND", worker_budget.as_str())];
    fleet.spawn("order-intake", "order-intake", &intake)?;
    fleet.spawn("outbox-relay", "outbox-relay", &[])?;
    fleet.spawn("stock-worker-0", "stock-worker", &worker)?;
    fleet.spawn("stock-worker-1", "stock-worker", &worker)?;
    fleet.spawn("notification-worker", "notification-worker", &[])?;
    fleet.wait_intake().await?;
    let outcome = sale(&fleet, &options).await;
    say("stopping the fleet (SIGTERM)");
    let unclean = fleet.stop().await?;
    if !unclean.is_empty() {
        say(&format!("these processes did not stop cleanly: {unclean:?}"));
    }
    Ok(outcome? && unclean.is_empty())
}

async fn sale(fleet: &Fleet, options: &Options) -> anyhow::Result<bool> {
    // A product of this run's own, so earlier runs' orders do not count.
    let sku = format!("drop-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"));
    let stock = options.stock.to_string();
    fleet
        .fleetctl(
            &["product", "upsert", "--id", &sku, "--name", "Limited drop", "--price", "4999"]
                .into_iter()
                .chain(["--currency", "usd", "--stock", &stock])
                .collect::<Vec<_>>(),
            &[],
        )
        .await?;
    say(&format!("seeded {sku}: {} units at 49.99 usd (fleetctl product upsert)", options.stock));

    // One buyer first, with a card that is declined: the unit the door promised them goes back
    // to the line before the burst arrives.
    let declined = fleet
        .post_order("buyer-declined", &format!("{sku}-declined"), &sku, 1, "pm_card_chargeDeclined")
        .await?;
    say(&format!(
        "a first buyer's card is declined: {} {} (their unit goes back)",
        declined.status, declined.body["error"]["code"]
    ));

    // The burst: one order per user, all at once; every 10th user retries the same request
    // (a client that timed out).
    let users = options.orders;
    let started = Instant::now();
    say(&format!("firing {users} orders from {users} users, 64 at a time"));
    let run = sku.clone();
    let requests = (0..users).flat_map(move |i| {
        let copies = if i % 10 == 0 { 2 } else { 1 };
        let run = run.clone();
        // Keys are the client's, per order: this run's own, so a rerun is not a replay.
        (0..copies).map(move |_| (format!("buyer-{i}"), format!("{run}-order-{i}")))
    });
    let mut answers: Vec<Answer> = Vec::new();
    let mut sold_out_latency: Vec<Duration> = Vec::new();
    let mut sold_out_buyers = std::collections::HashSet::new();
    let mut retried: BTreeMap<u16, usize> = BTreeMap::new();
    let product = sku.as_str();
    let mut stream = futures::stream::iter(requests)
        .map(|(user, key)| async move {
            let answer = fleet.post_order(&user, &key, product, 1, "pm_card_visa").retrying().await;
            answer.map(|(answer, earlier)| (user, answer, earlier))
        })
        .buffer_unordered(64);
    let mut last = Instant::now();
    while let Some(result) = stream.next().await {
        let (user, answer, earlier) = result?;
        for status in earlier {
            *retried.entry(status).or_default() += 1;
        }
        if answer.status == 409 && answer.body["error"]["code"] == "sold_out" {
            sold_out_latency.push(answer.took);
            sold_out_buyers.insert(user);
        }
        answers.push(answer);
        if last.elapsed() > Duration::from_secs(1) {
            say(&format!("  {} answers so far", answers.len()));
            last = Instant::now();
        }
    }
    let by_status = answers.iter().fold(BTreeMap::<u16, usize>::new(), |mut m, a| {
        *m.entry(a.status).or_default() += 1;
        m
    });
    let replays = answers.iter().filter(|a| a.replayed).count();
    let intake_seconds = started.elapsed().as_secs_f64();
    say(&format!(
        "intake answered {} requests in {intake_seconds:.1} s: {by_status:?} ({replays} idempotent replays; \
         answered first, then retried with the same key: {retried:?})",
        answers.len()
    ));

    say("waiting until every order is terminal");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT status::text, count(*) FROM orders WHERE product_id = $1 GROUP BY 1 ORDER BY 1",
        )
        .bind(&sku)
        .fetch_all(&fleet.pool)
        .await?;
        let open: i64 = rows
            .iter()
            .filter(|(s, _)| matches!(s.as_str(), "pending_authorization" | "authorized" | "stock_reserved"))
            .map(|(_, n)| n)
            .sum();
        let unreleased: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1
                AND status IN ('rejected_out_of_stock', 'capture_failed') AND authorization_released_at IS NULL",
        )
        .bind(&sku)
        .fetch_one(&fleet.pool)
        .await?;
        say(&format!("  {}", rows.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join(" ")));
        if open == 0 && unreleased == 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "orders still open after 300 s; see the logs");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled_seconds = started.elapsed().as_secs_f64();

    // The ledger, the database, the topic.
    let statuses: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT status::text, count(*) FROM orders WHERE product_id = $1 GROUP BY 1",
    )
    .bind(&sku)
    .fetch_all(&fleet.pool)
    .await?
    .into_iter()
    .collect();
    let orders: i64 = statuses.values().sum();
    let accepted = orders - statuses.get("payment_declined").copied().unwrap_or(0);
    let intents = fleet.intents().await?;
    let sum = |field: &str| intents.iter().map(|i| i[field].as_i64().unwrap_or(0)).sum::<i64>();
    let (captures, cancels) = (sum("capture_count"), sum("cancel_count"));
    let holds = intents.iter().filter(|i| i["status"] == "requires_capture").count();
    let stock_left: i32 = sqlx::query_scalar("SELECT stock FROM products WHERE id = $1")
        .bind(&sku)
        .fetch_one(&fleet.pool)
        .await?;
    let paid = statuses.get("paid").copied().unwrap_or(0);

    say("reading the notifications the topic delivered to a subscribed queue");
    let notes = fleet.notifications((accepted * 2) as usize, Duration::from_secs(60)).await?;
    let mut by_event: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut repeated = 0;
    for (event, order) in &notes {
        *by_event.entry(event.clone()).or_default() += 1;
        if !seen.insert((event.clone(), order.clone())) {
            repeated += 1;
        }
    }
    let stats = fleet.stripe_stats().await?;
    let rate_limited = stats["rate_limited"].as_u64().unwrap_or(u64::MAX);
    let busiest_second = stats["max_requests_in_one_second"].as_u64().unwrap_or(0);
    let declines = statuses.get("payment_declined").copied().unwrap_or(0);
    let holds_on_losers = fleet.holds_without_a_unit().await?;
    let mut sold_out_ms: Vec<f64> = sold_out_latency.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let buyers_without_unit = (users as i64 + 1) - paid - declines;
    let aws = sum_by_label(&fleet.scrape_metrics().await, "aws_requests_total", "operation");
    let aws_total: f64 = aws.values().sum();

    println!();
    println!("== orderfleet demo: {} buyers, {} units of {sku} ==", users + 1, options.stock);
    println!(
        "orders by status      {}",
        statuses.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join("  ")
    );
    println!(
        "intake                {} requests, {replays} replays, final answers {by_status:?}, retried after {retried:?}",
        answers.len()
    );
    println!(
        "authorizations        {} PaymentIntents at stripe-sim for {paid} units sold and {declines} declined card(s)",
        intents.len()
    );
    println!("captures              {captures}");
    println!("cancels               {cancels}");
    println!("holds left            {holds}");
    println!("holds on buyers who got nothing  {holds_on_losers}");
    println!(
        "sold out              {} answers to {} buyers, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        sold_out_latency.len(),
        sold_out_buyers.len(),
        percentile(&mut sold_out_ms, 50.0),
        percentile(&mut sold_out_ms, 99.0),
        percentile(&mut sold_out_ms, 100.0)
    );
    println!(
        "stripe-sim            {} requests, {rate_limited} rate-limited (429), busiest second {busiest_second} \
         (limit {STRIPE_RATE_LIMIT}/s)",
        stats["requests"]
    );
    println!("stock left            {stock_left} (sold {paid} of {})", options.stock);
    println!("notifications         {by_event:?} ({repeated} repeated)");
    println!(
        "AWS requests          {aws_total:.0} in all, {:.2} per order: {}",
        aws_total / orders.max(1) as f64,
        aws.iter().map(|(op, n)| format!("{op}={n:.0}")).collect::<Vec<_>>().join(" ")
    );
    println!("time                  intake {intake_seconds:.1} s, all terminal after {settled_seconds:.1} s");
    println!("build                 {BUILD}");
    println!();

    // SPEC §8, as the suite audits it, then what only a drop shows.
    let audit = Audit::of(fleet, &sku, &notes).await?;
    let drop_checks = [
        ("every PaymentIntent of a paid order captured, once", captures == paid),
        ("no PaymentIntent still holding funds at the end", holds == 0),
        (
            "a PaymentIntent only for a unit: PaymentIntents = units sold + declined cards",
            intents.len() as i64 == paid + declines,
        ),
        ("no hold on a buyer who got nothing", holds_on_losers == 0 && cancels == 0),
        (
            "every buyer without a unit heard sold_out at once, with nothing written",
            sold_out_buyers.len() as i64 == buyers_without_unit && orders == paid + declines,
        ),
        ("within Stripe's limits: stripe-sim answered no 429", rate_limited == 0),
    ];
    let checks = audit.guarantees().into_iter().chain(drop_checks);
    let mut all = true;
    for (guarantee, held) in checks {
        println!("{} {guarantee}", if held { "✓" } else { "✗" });
        all &= held;
    }
    Ok(all)
}

fn say(message: &str) {
    println!("demo: {message}");
}
