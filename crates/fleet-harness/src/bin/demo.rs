//! `make demo`: a flash sale through the whole fleet, against the stack `make up` started.
//!
//! Starts stripe-sim and every binary (two stock workers), seeds a product with limited
//! stock through `fleetctl`, fires a burst of orders from many users — some retried with the
//! same Idempotency-Key, one with a card that is declined — waits until every order is
//! terminal, prints what happened and checks SPEC §8's guarantees against stripe-sim's ledger,
//! the database and the SNS topic, then stops what it started (SIGTERM).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_harness::metrics::sum_by_label;
use fleet_harness::{Answer, Fleet, Stack, binary};
use futures::StreamExt;

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

    say("starting stripe-sim, order-intake, outbox-relay, 2 × stock-worker, notification-worker");
    say(&format!("logs: {}/", log_dir.display()));
    let fleet = Fleet::start("demo", stack, log_dir, 2).await?;
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
    let upsert = tokio::process::Command::new(binary("fleetctl"))
        .args(["product", "upsert", "--id", &sku, "--name", "Limited drop", "--price", "4999"])
        .args(["--currency", "usd", "--stock", &options.stock.to_string()])
        .output()
        .await?;
    anyhow::ensure!(
        upsert.status.success(),
        "fleetctl product upsert: {}",
        String::from_utf8_lossy(&upsert.stderr)
    );
    say(&format!("seeded {sku}: {} units at 49.99 usd (fleetctl product upsert)", options.stock));

    // The burst: one order per user, all at once; every 10th user retries the same request
    // (a client that timed out), and the last user's card is declined.
    let users = options.orders;
    let started = Instant::now();
    say(&format!("firing {users} orders from {users} users, 64 at a time"));
    let run = sku.clone();
    let requests = (0..users).flat_map(move |i| {
        let method = if i == users - 1 { "pm_card_chargeDeclined" } else { "pm_card_visa" };
        let copies = if i % 10 == 0 { 2 } else { 1 };
        let run = run.clone();
        // Keys are the client's, per order: this run's own, so a rerun is not a replay.
        (0..copies).map(move |_| (format!("buyer-{i}"), format!("{run}-order-{i}"), method))
    });
    let mut answers: Vec<Answer> = Vec::new();
    let mut retried: BTreeMap<u16, usize> = BTreeMap::new();
    let product = sku.as_str();
    let mut stream =
        futures::stream::iter(requests)
            .map(|(user, key, method)| async move {
                fleet.post_order_retrying(&user, &key, product, 1, method).await
            })
            .buffer_unordered(64);
    let mut last = Instant::now();
    while let Some(result) = stream.next().await {
        let (answer, earlier) = result?;
        for status in earlier {
            *retried.entry(status).or_default() += 1;
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
    let open_at_end: i64 = ["pending_authorization", "authorized", "stock_reserved"]
        .iter()
        .map(|s| statuses.get(*s).copied().unwrap_or(0))
        .sum();

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
    let aws = sum_by_label(&fleet.scrape_metrics().await, "aws_requests_total", "operation");
    let aws_total: f64 = aws.values().sum();

    println!();
    println!("== orderfleet demo: {users} buyers, {} units of {sku} ==", options.stock);
    println!(
        "orders by status      {}",
        statuses.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join("  ")
    );
    println!(
        "intake                {} requests, {replays} replays, final answers {by_status:?}, retried after {retried:?}",
        answers.len()
    );
    println!("authorizations        {} PaymentIntents at stripe-sim", intents.len());
    println!("captures              {captures}");
    println!("cancels               {cancels}");
    println!("holds left            {holds}");
    println!("stock left            {stock_left} (sold {paid} of {})", options.stock);
    println!("notifications         {by_event:?} ({repeated} repeated)");
    println!(
        "AWS requests          {aws_total:.0} in all, {:.2} per order: {}",
        aws_total / orders.max(1) as f64,
        aws.iter().map(|(op, n)| format!("{op}={n:.0}")).collect::<Vec<_>>().join(" ")
    );
    println!("time                  intake {intake_seconds:.1} s, all terminal after {settled_seconds:.1} s");
    println!();

    let checks = [
        (
            "one order and one authorization per Idempotency-Key",
            orders == users as i64 && intents.len() == users,
        ),
        ("at most one capture per order, only for reserved stock", captures == paid),
        (
            "units sold never exceed stock; stock never negative",
            paid <= options.stock as i64 && stock_left >= 0,
        ),
        ("every accepted order is terminal", open_at_end == 0),
        ("no authorization hold left behind", holds == 0),
        ("each (order, event) notification once", repeated == 0 && notes.len() as i64 == accepted * 2),
    ];
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
