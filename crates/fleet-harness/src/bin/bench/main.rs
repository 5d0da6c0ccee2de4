// The harness's binaries build statements at run time to look at the fleet from outside
// (clippy.toml), and read a scenario top to bottom.
#![allow(clippy::too_many_lines, clippy::disallowed_methods)]
//! `make bench`: N orders through the whole fleet against LocalStack, PostgreSQL and
//! stripe-sim, and in the same run LocalStack's own ceiling for batched messages.
//!
//! It prints orders per second end to end, intake latency p50/p99, accepted → paid latency
//! p50/p99, SQS and SNS requests per order by operation (the fleet's own counts, from each
//! process's `/metrics`), database transactions per order (`pg_stat_database`), an idle
//! poller's receives per minute, LocalStack's raw ceiling (batched send → receive → delete of
//! N messages, no business logic) and the fleet's ratio to it; then one line:
//! `bench: orders=N orders_per_s=X requests_per_order=Y ceiling_msgs_per_s=Z ratio=R`.
//!
//! It runs on a database of its own (created and dropped here) and on the stack's queues
//! (purged first). `--no-batching` runs the fleet with one message per AWS call, to show what
//! batching buys. The stock is as large as the number of buyers, so every order is sold and
//! requests per order stay comparable with earlier runs; the Stripe budgets are set out of the
//! way (1,000/s), since this run measures the queues, not Stripe.
//!
//! `--drop` runs a drop through the door instead ([`mod@drop`]); `--herd`, a herd at the door
//! ([`herd`]); `--opening`, a drop that opens at a set time with a pre-queue ([`opening`]).

mod costs;
mod drop;
mod herd;
mod opening;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
use fleet_harness::audit::Audit;
use fleet_harness::metrics::sum_by_label;
use fleet_harness::{Fleet, Stack, percentile, replace_database};
use futures::StreamExt;
use orderfleet_runtime::aws::Aws;
use sqlx::{Connection, PgConnection};

struct Options {
    drop: Option<drop::DropOptions>,
    herd: Option<herd::HerdOptions>,
    opening: Option<opening::OpeningOptions>,
    orders: usize,
    concurrency: usize,
    batching: bool,
    idle_seconds: u64,
    ceiling_concurrency: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut options = Options {
        drop: None,
        herd: None,
        opening: None,
        orders: 2000,
        concurrency: 64,
        batching: true,
        idle_seconds: 60,
        ceiling_concurrency: 4,
    };
    let mut drop = drop::DropOptions { buyers: 10_000, units: 100, concurrency: 64, stripe_limit: 25 };
    let mut drop_mode = false;
    let (mut herd_mode, mut intakes, mut buyers, mut concurrency) = (false, 1, None, None);
    let (mut opening_mode, mut units, mut late) = (false, None, 10_000);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--orders" => options.orders = value()?.parse().context("--orders takes a number")?,
            "--concurrency" => {
                options.concurrency = value()?.parse().context("--concurrency takes a number")?;
                concurrency = Some(options.concurrency);
            }
            "--herd" => herd_mode = true,
            "--intakes" => intakes = value()?.parse().context("--intakes takes a number")?,
            "--idle-seconds" => {
                options.idle_seconds = value()?.parse().context("--idle-seconds takes a number")?
            }
            "--ceiling-concurrency" => {
                options.ceiling_concurrency =
                    value()?.parse().context("--ceiling-concurrency takes a number")?
            }
            "--no-batching" => options.batching = false,
            "--drop" => drop_mode = true,
            "--buyers" => {
                drop.buyers = value()?.parse().context("--buyers takes a number")?;
                buyers = Some(drop.buyers);
            }
            "--units" => {
                drop.units = value()?.parse().context("--units takes a number")?;
                units = Some(drop.units);
            }
            "--opening" => opening_mode = true,
            "--late" => late = value()?.parse().context("--late takes a number")?,
            "--stripe-limit" => {
                drop.stripe_limit = value()?.parse().context("--stripe-limit takes a number")?
            }
            "--help" | "-h" => {
                println!(
                    "orderfleet-bench [--orders N (2000)] [--concurrency C (64)] [--idle-seconds S (60)] [--no-batching] [--ceiling-concurrency K (4)]\n\
                     orderfleet-bench --drop [--buyers N (10000)] [--units U (100)] [--concurrency C (64)] [--stripe-limit R (25)]\n\
                     orderfleet-bench --herd [--buyers N (100000)] [--units U (100)] [--concurrency C (256)] [--intakes I (1)]\n\
                     orderfleet-bench --opening [--buyers N (100000)] [--units U (1000)] [--concurrency C (256)] [--late H (10000)]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other}; see --help"),
        }
    }
    anyhow::ensure!(options.orders >= 10, "--orders must be at least 10");
    anyhow::ensure!(drop.stripe_limit >= 3, "--stripe-limit must be at least 3 (a budget of one each)");
    drop.concurrency = options.concurrency;
    anyhow::ensure!(intakes >= 1, "--intakes must be at least 1");
    if opening_mode {
        options.opening = Some(opening::OpeningOptions {
            buyers: buyers.unwrap_or(100_000),
            units: units.unwrap_or(1000),
            concurrency: concurrency.unwrap_or(256),
            herd: late,
        });
    } else if herd_mode {
        options.herd = Some(herd::HerdOptions {
            buyers: buyers.unwrap_or(100_000),
            units: drop.units,
            concurrency: concurrency.unwrap_or(256),
            intakes,
        });
    } else if drop_mode {
        options.drop = Some(drop);
    }
    Ok(options)
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run the benchmark with `make bench`"))
}

fn say(message: &str) {
    println!("bench: {message}");
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let options = options()?;
    let admin_url = var("DATABASE_URL")?;
    if options.drop.is_some() || options.herd.is_some() || options.opening.is_some() {
        let (database, database_url, mut admin) = bench_database(&admin_url).await?;
        let result = async {
            let (mut fleet, pool) = prepare_fleet(&database_url).await?;
            let outcome = match (&options.drop, &options.herd, &options.opening) {
                (_, _, Some(opening)) => opening::run(&mut fleet, opening).await,
                (_, Some(herd), None) => herd::run(&mut fleet, herd).await,
                (Some(drop), None, None) => drop::run(&mut fleet, drop).await,
                (None, None, None) => unreachable!("a drop, a herd or an opening"),
            };
            fleet.stop().await?;
            std::mem::drop(pool);
            outcome
        }
        .await;
        drop_database(&mut admin, &database).await?;
        return result;
    }
    let aws = Aws::load().await?;
    let sqs = aws.sqs();

    say(&format!("LocalStack's ceiling: {} messages, batched send → receive → delete", options.orders));
    let localstack = LocalStackCpu::find();
    let cpu_before = localstack.seconds();
    let started = Instant::now();
    let ceiling_rate = ceiling(&sqs, options.orders, options.ceiling_concurrency).await?;
    let ceiling = Ceiling {
        msgs_per_s: ceiling_rate,
        localstack: cpu_before
            .zip(localstack.seconds())
            .map(|(a, b)| (b - a, started.elapsed().as_secs_f64())),
    };
    say(&format!("  {ceiling_rate:.0} messages/s"));

    let (database, database_url, mut admin) = bench_database(&admin_url).await?;
    let result = fleet_run(&options, &database_url, &database, &mut admin, ceiling).await;
    drop_database(&mut admin, &database).await?;
    result
}

/// A database of the run's own, so its transaction count is the fleet's alone: its name, its
/// URL, and a connection to the server's admin database.
async fn bench_database(admin_url: &str) -> anyhow::Result<(String, String, PgConnection)> {
    let database = format!("orderfleet_bench_{}", chrono::Utc::now().format("%Y%m%d%H%M%S"));
    let mut admin = PgConnection::connect(admin_url).await.context("failed to reach PostgreSQL")?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}"))).execute(&mut admin).await?;
    let database_url = replace_database(admin_url, &database);
    Ok((database, database_url, admin))
}

async fn drop_database(admin: &mut PgConnection, database: &str) -> anyhow::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)")))
        .execute(admin)
        .await?;
    Ok(())
}

/// The bench database migrated, the stack's queues purged, stripe-sim started (no topic
/// observer: a benchmark should not pay for SNS delivering to one more queue); no fleet
/// binaries yet.
async fn prepare_fleet(database_url: &str) -> anyhow::Result<(Fleet, orderfleet_runtime::db::Pool)> {
    let sqs = Aws::load().await?.sqs();
    let pool = fleet_harness::fleet_pool(database_url, 10).await?;
    orderfleet_runtime::db::migrate(&pool).await?;
    let stack = Stack {
        database_url: database_url.to_owned(),
        stock_queue_url: var("STOCK_QUEUE_URL")?,
        notification_queue_url: var("NOTIFICATION_QUEUE_URL")?,
        topic_arn: var("NOTIFICATION_TOPIC_ARN")?,
        aws_env: Stack::aws_env_from_process(),
    };
    for url in [&stack.stock_queue_url, &stack.notification_queue_url] {
        sqs.purge_queue().queue_url(url).send().await.with_context(|| format!("failed to purge {url}"))?;
    }
    let log_dir = std::env::var_os("ORDERFLEET_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".run"))
        .join("bench");
    say(&format!("logs in {}/", log_dir.display()));
    let fleet = Fleet::prepare_observed("bench", stack, log_dir, false).await?;
    Ok((fleet, pool))
}

/// LocalStack's raw rate, and the CPU its process spent on it (seconds, over wall seconds).
struct Ceiling {
    msgs_per_s: f64,
    localstack: Option<(f64, f64)>,
}

/// The CPU time of LocalStack's process, when it runs on this host (`make up` in host mode
/// records its pid): what each order costs LocalStack, against what a bare message does.
struct LocalStackCpu {
    pid: Option<u32>,
}

impl LocalStackCpu {
    fn find() -> Self {
        let run_dir =
            std::env::var_os("ORDERFLEET_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| ".run".into());
        let pid =
            std::fs::read_to_string(run_dir.join("localstack.pid")).ok().and_then(|p| p.trim().parse().ok());
        Self { pid }
    }

    /// User plus system CPU seconds so far.
    fn seconds(&self) -> Option<f64> {
        costs::cpu_seconds(self.pid?)
    }
}

async fn fleet_run(
    options: &Options,
    database_url: &str,
    database: &str,
    admin: &mut PgConnection,
    ceiling: Ceiling,
) -> anyhow::Result<()> {
    let (mut fleet, pool) = prepare_fleet(database_url).await?;
    let batching = if options.batching { "on" } else { "off" };
    say(&format!("starting the fleet (batching {batching})"));
    // The production grace (SPEC's default), so the workers long-poll the full 20 s.
    let env = [
        ("ORDERFLEET_BATCHING", batching),
        ("SWEEP_INTERVAL_SECONDS", "0"),
        ("RUST_LOG", "warn"),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
        ("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", "1000"),
        ("STRIPE_ACCOUNT_REQUESTS_PER_SECOND", "4000"),
    ];
    let mut meter = costs::Meter::new(database_url).await?;
    meter.spawn(&mut fleet, "order-intake", "order-intake", &env).await?;
    meter.spawn(&mut fleet, "outbox-relay", "outbox-relay", &env).await?;
    meter.spawn(&mut fleet, "stock-worker-0", "stock-worker", &env).await?;
    meter.spawn(&mut fleet, "stock-worker-1", "stock-worker", &env).await?;
    meter.spawn(&mut fleet, "notification-worker", "notification-worker", &env).await?;
    fleet.product("bench", 1000, options.orders as i32).await?;
    wait_for_intake(&fleet).await?;
    let outcome = measure(&fleet, &meter, options, admin, database, ceiling).await;
    fleet.stop().await?;
    drop(pool);
    outcome
}

async fn wait_for_intake(fleet: &Fleet) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.http.get(format!("{}/healthz", fleet.intake_url)).send().await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "the intake did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn transactions(admin: &mut PgConnection, database: &str) -> anyhow::Result<i64> {
    // Other backends report their counts when idle or every second or so; a short pause
    // before reading lets them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n: i64 =
        sqlx::query_scalar("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1")
            .bind(database)
            .fetch_one(&mut *admin)
            .await?;
    Ok(n)
}

/// The fleet's own counters, read before the orders and after them: each figure per order is
/// a difference of two readings.
struct Counters {
    /// SQS and SNS requests by operation, from each process's `/metrics`.
    requests: BTreeMap<String, f64>,
    /// Stripe's webhook events the intake received, by what each did (`webhook_events_total`).
    webhooks: BTreeMap<String, f64>,
    /// Transactions committed or rolled back in the bench's database.
    transactions: i64,
    /// Round trips and CPU seconds.
    costs: costs::Snapshot,
}

impl Counters {
    async fn read(
        fleet: &Fleet,
        meter: &costs::Meter,
        admin: &mut PgConnection,
        database: &str,
    ) -> anyhow::Result<Self> {
        let scraped = fleet.scrape_metrics().await;
        let requests = sum_by_label(&scraped, "aws_requests_total", "operation");
        let webhooks = sum_by_label(&scraped, "webhook_events_total", "effect");
        let transactions = transactions(admin, database).await?;
        Ok(Self { requests, webhooks, transactions, costs: meter.read(fleet) })
    }
}

async fn aws_requests(fleet: &Fleet) -> BTreeMap<String, f64> {
    sum_by_label(&fleet.scrape_metrics().await, "aws_requests_total", "operation")
}

/// What stripe-sim counted, and the connections the fleet opened to it.
struct StripeCounts {
    requests: u64,
    /// Answered 429.
    rate_limited: u64,
    /// Requests in the busiest second.
    busiest_second: u64,
    connections: u64,
}

impl StripeCounts {
    async fn read(fleet: &Fleet) -> anyhow::Result<Self> {
        let stats = fleet.stripe_stats().await?;
        let count = |name: &str| stats[name].as_u64().unwrap_or(0);
        Ok(Self {
            requests: count("requests"),
            rate_limited: count("rate_limited"),
            busiest_second: count("max_requests_in_one_second"),
            connections: fleet.stripe_connections().await?,
        })
    }

    /// Connections opened per 100 requests: how well the fleet's clients keep them alive.
    fn connections_per_100(&self) -> f64 {
        self.connections as f64 * 100.0 / self.requests.max(1) as f64
    }
}

/// `status=count …`, as the bench and the drop print the orders by status.
fn by_status_line(by_status: &BTreeMap<String, i64>) -> String {
    by_status.iter().map(|(s, c)| format!("{s}={c}")).collect::<Vec<_>>().join(" ")
}

async fn measure(
    fleet: &Fleet,
    meter: &costs::Meter,
    options: &Options,
    admin: &mut PgConnection,
    database: &str,
    ceiling: Ceiling,
) -> anyhow::Result<()> {
    let localstack = LocalStackCpu::find();
    let n = options.orders;
    let before = Counters::read(fleet, meter, admin, database).await?;

    say(&format!("{n} orders from {n} users, {} at a time", options.concurrency));
    let localstack_before = localstack.seconds();
    let started = Instant::now();
    let answers = send_orders(fleet, n, options.concurrency).await;
    let intake_seconds = started.elapsed().as_secs_f64();
    let statuses = count_by_status(&answers);
    say(&format!("  intake done in {intake_seconds:.1} s: {statuses:?}"));

    let terminal_at = wait_until_done(fleet, started).await?;
    let total_seconds = started.elapsed().as_secs_f64();
    let localstack_fleet = localstack_before.zip(localstack.seconds()).map(|(a, b)| b - a);
    // The last deletes go out within the acknowledgement flush interval; let them.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let after = Counters::read(fleet, meter, admin, database).await?;
    let stripe = StripeCounts::read(fleet).await?;
    let by_status: BTreeMap<String, i64> = fleet.statuses().await?.into_iter().collect();
    let (paid_ms, outbox_lag_ms) = settled_latencies(fleet).await?;
    let idle = idle_receives(fleet, options.idle_seconds).await;
    // The figures count only if the run kept every guarantee.
    let audit = Audit::without_notifications(fleet, "bench").await?;

    let mut figures = Figures {
        n,
        batching: options.batching,
        accepted: answers.iter().filter(|(s, _)| *s == 202).count(),
        statuses,
        by_status,
        terminal_seconds: terminal_at.as_secs_f64(),
        total_seconds,
        intake_ms: answers.iter().map(|(_, d)| d.as_secs_f64() * 1000.0).collect(),
        paid_ms,
        outbox_lag_ms,
        requests: requests_between(&before.requests, &after.requests),
        webhooks: counted_between(&before.webhooks, &after.webhooks),
        transactions: after.transactions - before.transactions,
        spent: after.costs.since(&before.costs),
        stripe,
        idle,
        audit,
        ceiling,
        localstack_fleet,
    };
    figures.print();
    anyhow::ensure!(figures.audit.holds(), "a guarantee broke in the run: {}", figures.audit.summary());
    Ok(())
}

/// Sends `n` orders from `n` users, `concurrency` at a time: each answer's status (0 when
/// none came) and latency.
async fn send_orders(fleet: &Fleet, n: usize, concurrency: usize) -> Vec<(u16, Duration)> {
    let answered = Arc::new(AtomicUsize::new(0));
    futures::stream::iter(0..n)
        .map(|i| {
            let answered = answered.clone();
            async move {
                let sent = Instant::now();
                let status = match fleet
                    .post_order(&format!("b{i}"), &format!("bench-{i}"), "bench", 1, "pm_card_visa")
                    .await
                {
                    Ok(answer) => answer.status,
                    Err(_) => 0,
                };
                let done = answered.fetch_add(1, Ordering::Relaxed) + 1;
                if done.is_multiple_of(500) {
                    say(&format!("  {done} answered"));
                }
                (status, sent.elapsed())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// How many answers had each status.
fn count_by_status(answers: &[(u16, Duration)]) -> BTreeMap<u16, usize> {
    answers.iter().fold(BTreeMap::new(), |mut m, (s, _)| {
        *m.entry(*s).or_default() += 1;
        m
    })
}

/// Waits until the run is done: every order terminal with its hold released, and every
/// notification published (each notification message marked processed in the inbox).
/// Returns when, after `started`, the orders were all terminal.
async fn wait_until_done(fleet: &Fleet, started: Instant) -> anyhow::Result<Duration> {
    let mut terminal_at = None;
    loop {
        let (open, unpublished): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM orders
                      WHERE status IN ('pending_authorization', 'authorized', 'stock_reserved')
                         OR (status = 'rejected_out_of_stock' AND authorization_released_at IS NULL)),
                    (SELECT count(*) FROM outbox o WHERE o.destination = 'notification'
                        AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.message_id = o.id AND i.processed_at IS NOT NULL))",
        )
        .fetch_one(&fleet.pool)
        .await?;
        if open == 0 && terminal_at.is_none() {
            terminal_at = Some(started.elapsed());
        }
        if open == 0 && unpublished == 0 {
            return Ok(terminal_at.unwrap_or_default());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(900),
            "after 15 minutes: {open} orders open, {unpublished} notifications unpublished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Accepted → paid for each paid order, and how long each outbox row waited between its
/// commit and SQS accepting it (whether the relay keeps up with the burst), in milliseconds.
async fn settled_latencies(fleet: &Fleet) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let paid_seconds: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (updated_at - created_at))::float8 FROM orders WHERE status = 'paid'",
    )
    .fetch_all(&fleet.pool)
    .await?;
    let outbox_lag_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (sent_at - created_at))::float8 * 1000 FROM outbox WHERE sent_at IS NOT NULL",
    )
    .fetch_all(&fleet.pool)
    .await?;
    Ok((paid_seconds.iter().map(|s| s * 1000.0).collect(), outbox_lag_ms))
}

/// What a counter counted between two readings, by label, leaving out those that did not grow.
fn counted_between(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut counted: BTreeMap<String, f64> = BTreeMap::new();
    for (label, count) in after {
        let delta = count - before.get(label).copied().unwrap_or(0.0);
        if delta > 0.0 {
            counted.insert(label.clone(), delta);
        }
    }
    counted
}

/// The requests made between two readings, by operation, leaving out those that did not grow.
fn requests_between(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut requests = counted_between(before, after);
    // The fleet's own reads of queue attributes at start are not per-order traffic.
    requests.remove("GetQueueAttributes");
    requests
}

/// An idle fleet: how often does a poller ask? Receives per minute per worker, over
/// `idle_seconds` (none when 0).
async fn idle_receives(fleet: &Fleet, idle_seconds: u64) -> Option<f64> {
    if idle_seconds == 0 {
        return None;
    }
    say(&format!("idle for {idle_seconds} s, counting receives"));
    let before = aws_requests(fleet).await;
    tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
    let after = aws_requests(fleet).await;
    let receives = after.get("ReceiveMessage").copied().unwrap_or(0.0)
        - before.get("ReceiveMessage").copied().unwrap_or(0.0);
    // Two stock workers and a notification worker. Each has two pollers (ConsumerConfig),
    // of which only the first polls while its queue is shallow: one long poll per worker.
    let workers = 3.0;
    Some(receives / workers / (idle_seconds as f64 / 60.0))
}

/// One run's figures, as printed.
struct Figures {
    n: usize,
    batching: bool,
    accepted: usize,
    /// Intake answers by status.
    statuses: BTreeMap<u16, usize>,
    by_status: BTreeMap<String, i64>,
    terminal_seconds: f64,
    total_seconds: f64,
    intake_ms: Vec<f64>,
    paid_ms: Vec<f64>,
    outbox_lag_ms: Vec<f64>,
    requests: BTreeMap<String, f64>,
    webhooks: BTreeMap<String, f64>,
    transactions: i64,
    spent: costs::Snapshot,
    stripe: StripeCounts,
    idle: Option<f64>,
    audit: Audit,
    ceiling: Ceiling,
    /// LocalStack's CPU seconds over the run.
    localstack_fleet: Option<f64>,
}

impl Figures {
    fn per_order(&self, x: f64) -> f64 {
        x / self.accepted.max(1) as f64
    }

    fn orders_per_s(&self) -> f64 {
        self.accepted as f64 / self.total_seconds
    }

    /// `label=count per order …`, each to `digits` decimals.
    fn each_per_order(&self, counts: &BTreeMap<String, f64>, digits: usize) -> String {
        counts
            .iter()
            .map(|(label, c)| format!("{label}={:.digits$}", self.per_order(*c)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn total_requests(&self) -> f64 {
        self.requests.values().sum()
    }

    fn print(&mut self) {
        println!();
        println!(
            "== orderfleet bench: {} orders, batching {} ==",
            self.n,
            if self.batching { "on" } else { "off" }
        );
        self.print_latencies();
        self.print_costs();
        self.print_localstack();
        self.print_summary();
    }

    /// The orders' outcome, the rate and the latencies.
    fn print_latencies(&mut self) {
        let (accepted, statuses) = (self.accepted, &self.statuses);
        let (terminal_seconds, total_seconds, orders_per_s) =
            (self.terminal_seconds, self.total_seconds, self.orders_per_s());
        println!("orders by status          {}", by_status_line(&self.by_status));
        println!(
            "end to end                {accepted} accepted orders terminal in {terminal_seconds:.1} s, every notification \
             published in {total_seconds:.1} s = {orders_per_s:.1} orders/s"
        );
        let intake_ms = &mut self.intake_ms;
        println!(
            "intake latency            p50 {:.1} ms, p99 {:.1} ms (p99/p50 {:.1}); answers {statuses:?}",
            percentile(intake_ms, 50.0),
            percentile(intake_ms, 99.0),
            percentile(intake_ms, 99.0) / percentile(intake_ms, 50.0).max(0.001)
        );
        println!(
            "accepted → paid           p50 {:.0} ms, p99 {:.0} ms ({} paid)",
            percentile(&mut self.paid_ms, 50.0),
            percentile(&mut self.paid_ms, 99.0),
            self.paid_ms.len()
        );
        println!(
            "outbox commit → sent      p50 {:.0} ms, p99 {:.0} ms ({} rows)",
            percentile(&mut self.outbox_lag_ms, 50.0),
            percentile(&mut self.outbox_lag_ms, 99.0),
            self.outbox_lag_ms.len()
        );
    }

    /// What each order cost: requests, transactions, round trips, CPU, Stripe connections.
    fn print_costs(&self) {
        let (total_requests, requests_per_order) =
            (self.total_requests(), self.per_order(self.total_requests()));
        let xacts_per_order = self.per_order(self.transactions as f64);
        let (accepted, spent, total) = (self.accepted, &self.spent, self.spent.total());
        println!(
            "SQS + SNS requests        {total_requests:.0} = {requests_per_order:.2} per order: {}",
            self.each_per_order(&self.requests, 3)
        );
        println!(
            "Stripe webhooks           {:.2} events per order, their work counted in every figure below: {}",
            self.per_order(self.webhooks.values().sum()),
            self.each_per_order(&self.webhooks, 2)
        );
        println!(
            "database transactions     {xacts_per_order:.1} per order (pg_stat_database): the fleet's {:.1}: {}; \
             the rest {:.1}: the bench's own reads and PostgreSQL's background work",
            self.per_order(total.transactions as f64),
            spent.each(accepted, |r| r.transactions as f64),
            self.per_order(self.transactions as f64 - total.transactions as f64),
        );
        println!(
            "PostgreSQL round trips    {:.1} per order, of which {:.1} pings: {}; {} connections opened",
            self.per_order(total.round_trips as f64),
            self.per_order(total.pings as f64),
            spent.each(accepted, |r| r.round_trips as f64),
            total.connections
        );
        println!(
            "fleet CPU                 {:.2} ms per order: {}",
            self.per_order(total.cpu * 1000.0),
            spent.each(accepted, |r| r.cpu * 1000.0)
        );
        println!(
            "PostgreSQL CPU            {:.2} ms per order (every postgres process here)",
            self.per_order(spent.postgres_cpu * 1000.0)
        );
        println!(
            "Stripe connections        {} opened for {} requests = {:.1} per 100",
            self.stripe.connections,
            self.stripe.requests,
            self.stripe.connections_per_100()
        );
        println!("guarantees                {}", self.audit.summary());
        if let Some(idle) = self.idle {
            println!(
                "idle receives             {idle:.1} per minute per worker (its one polling poller; the second parks while the queue is shallow)"
            );
        }
    }

    /// The run against LocalStack's ceiling, in rate and in LocalStack's CPU.
    fn print_localstack(&self) {
        let (ceiling, orders_per_s) = (self.ceiling.msgs_per_s, self.orders_per_s());
        println!("LocalStack ceiling        {ceiling:.0} messages/s (batched send → receive → delete)");
        println!(
            "fleet / ceiling           {:.3} (orders/s over messages/s; an order is 3 messages)",
            orders_per_s / ceiling
        );
        println!(
            "fleet through LocalStack  {:.0} SQS messages/s + {:.0} SNS publishes/s ({:.0} % of the ceiling in SQS messages alone)",
            orders_per_s * 3.0,
            orders_per_s * 2.0,
            orders_per_s * 3.0 / ceiling * 100.0
        );
        let (Some((ceiling_cpu, ceiling_wall)), Some(fleet_cpu)) =
            (self.ceiling.localstack, self.localstack_fleet)
        else {
            return;
        };
        let per_message = ceiling_cpu / self.n as f64;
        let per_order = self.per_order(fleet_cpu);
        let messages_per_order = per_order / per_message;
        println!(
            "LocalStack CPU            {:.2} ms per bare message in the ceiling ({:.0} % of a core), {:.2} ms per order in the fleet ({:.0} %)",
            per_message * 1000.0,
            ceiling_cpu / ceiling_wall * 100.0,
            per_order * 1000.0,
            fleet_cpu / self.total_seconds * 100.0
        );
        println!(
            "                          an order costs LocalStack the CPU of {messages_per_order:.1} bare messages: where LocalStack is the limit, the ratio stays near 1/{messages_per_order:.1} = {:.2}",
            1.0 / messages_per_order
        );
    }

    /// The one line a script reads.
    fn print_summary(&self) {
        let total = self.spent.total();
        println!(
            "bench: orders={} orders_per_s={:.1} requests_per_order={:.2} \
             pg_round_trips_per_order={:.1} pg_pings_per_order={:.1} \
             xacts_per_order={:.1} fleet_xacts_per_order={:.1} fleet_cpu_ms_per_order={:.2} pg_cpu_ms_per_order={:.2} \
             stripe_connections_per_100_requests={:.1} \
             ceiling_msgs_per_s={:.0} ratio={:.3}",
            self.accepted,
            self.orders_per_s(),
            self.per_order(self.total_requests()),
            self.per_order(total.round_trips as f64),
            self.per_order(total.pings as f64),
            self.per_order(self.transactions as f64),
            self.per_order(total.transactions as f64),
            self.per_order(total.cpu * 1000.0),
            self.per_order(self.spent.postgres_cpu * 1000.0),
            self.stripe.connections_per_100(),
            self.ceiling.msgs_per_s,
            self.orders_per_s() / self.ceiling.msgs_per_s
        );
    }
}

/// LocalStack's raw rate for `n` messages through one queue: `concurrency` senders with
/// `SendMessageBatch` of 10 and as many consumers with `ReceiveMessage` of 10 and `DeleteMessageBatch`,
/// running together, timed from the first send to the last delete.
async fn ceiling(sqs: &aws_sdk_sqs::Client, n: usize, concurrency: usize) -> anyhow::Result<f64> {
    let name = format!("bench-ceiling-{}", uuid::Uuid::new_v4().simple());
    let url = sqs.create_queue().queue_name(&name).send().await?.queue_url.context("a queue URL")?;
    let deleted = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let next_batch = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        tasks.spawn(send_batches(sqs.clone(), url.clone(), n, next_batch.clone()));
    }
    for _ in 0..concurrency.max(1) {
        tasks.spawn(receive_and_delete(sqs.clone(), url.clone(), n, deleted.clone()));
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    sqs.delete_queue().queue_url(&url).send().await?;
    Ok(rate)
}

/// One sender of the ceiling: takes the next batch of 10 of the `n` messages until none is left.
async fn send_batches(
    sqs: aws_sdk_sqs::Client,
    url: String,
    n: usize,
    next_batch: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let batches = n.div_ceil(10);
    loop {
        let batch = next_batch.fetch_add(1, Ordering::Relaxed);
        if batch >= batches {
            return Ok(());
        }
        let size = (n - batch * 10).min(10);
        let entries = (0..size)
            .map(|i| SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body("x").build())
            .collect::<Result<Vec<_>, _>>()?;
        sqs.send_message_batch().queue_url(&url).set_entries(Some(entries)).send().await?;
    }
}

/// One consumer of the ceiling: receives and deletes until `deleted` reaches `n`.
async fn receive_and_delete(
    sqs: aws_sdk_sqs::Client,
    url: String,
    n: usize,
    deleted: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    while deleted.load(Ordering::Relaxed) < n {
        let out = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            continue;
        }
        let entries = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        sqs.delete_message_batch().queue_url(&url).set_entries(Some(entries)).send().await?;
        deleted.fetch_add(messages.len(), Ordering::Relaxed);
    }
    Ok(())
}
