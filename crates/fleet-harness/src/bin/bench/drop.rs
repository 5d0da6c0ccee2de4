//! `make bench BENCH_ARGS=--drop`: a drop through the door (SPEC §1.1, §8.7–9).
//!
//! 10,000 buyers (`--buyers`) for 100 units (`--units`), one unit each, `--concurrency` at a
//! time; stripe-sim limited as Stripe limits an account, `--stripe-limit` (25) requests a
//! second on each named operation and four times that on the account, and the fleet's Stripe
//! budget set to the same (`STRIPE_ENDPOINT_REQUESTS_PER_SECOND`,
//! `STRIPE_ACCOUNT_REQUESTS_PER_SECOND`), shared by the intake and two stock workers. A buyer
//! retries a `503` or an `idempotency_key_in_use` with the same key after the `Retry-After` it
//! was given, as a real client would; `sold_out` is final. With units to spare for the
//! Stripe rate (`--buyers 2000 --units 500`), the drop is bound by Stripe: the creates a
//! second while units sold is then the budget's figure.
//!
//! It prints the time until the door sold out (every unit promised) and until every unit was
//! paid, the sold-out answers' latency, Stripe requests and intake requests per unit sold,
//! the creates a second while units sold, holds on buyers who got nothing, stripe-sim's 429s
//! and busiest second on each operation, the statements the budget cost, and the intake's peak
//! memory; then it measures the hot-row statement alone — the door's one statement, from 1 and
//! from 32 connections against a product with units to spare — because that statement is what
//! every buyer of a drop queues on. Last, one line:
//! `bench-drop: buyers=N units=U sold_out_s=… sold_out_p99_ms=… stripe_requests_per_unit=… holds_on_losers=… rate_limited=… intake_peak_mib=…`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_harness::Fleet;
use fleet_harness::audit::Audit;
use futures::StreamExt;
use order_intake::limits::LimitsConfig;
use order_intake::request::OrderRequest;
use orderfleet::domain::door::{self, Admission};
use orderfleet_words::UserId;

use fleet_harness::percentile;

use super::{StripeCounts, by_status_line, costs, say};

pub struct DropOptions {
    pub buyers: usize,
    pub units: i32,
    pub concurrency: usize,
    pub stripe_limit: u32,
}

/// One buyer's final answer.
struct Bought {
    status: u16,
    code: String,
    /// Latency of each answer this buyer got, by status (a retried buyer gets several).
    answers: Vec<(u16, Duration)>,
}

pub async fn run(fleet: &mut Fleet, options: &DropOptions) -> anyhow::Result<()> {
    let meter = start_fleet(fleet, options).await?;
    let db_start: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT clock_timestamp()").fetch_one(&fleet.pool).await?;
    let before_costs = meter.read(fleet);
    let started = Instant::now();
    let fleet_ref = &*fleet;
    let bought: Vec<Bought> = futures::stream::iter(0..options.buyers)
        .map(|i| async move { buy(fleet_ref, i).await })
        .buffer_unordered(options.concurrency)
        .collect()
        .await;
    let door_seconds = started.elapsed().as_secs_f64();

    fleet.wait_settled(Duration::from_secs(600)).await?;
    let spent = meter.read(fleet).since(&before_costs);
    let (promised_at, paid_at, paid): (Option<f64>, Option<f64>, i64) = sqlx::query_as(
        "SELECT EXTRACT(EPOCH FROM (max(created_at) - $1))::float8,
                EXTRACT(EPOCH FROM (max(updated_at) FILTER (WHERE status = 'paid') - $1))::float8,
                COALESCE(sum(quantity) FILTER (WHERE status = 'paid'), 0)
           FROM orders",
    )
    .bind(db_start)
    .fetch_one(&fleet.pool)
    .await?;
    let intents = fleet.intents().await?;
    let mut figures = DropFigures {
        by_status: fleet.statuses().await?.into_iter().collect(),
        intents: intents.len(),
        budget: BudgetFigures::read(fleet, &intents).await?,
        holds_on_losers: fleet.holds_without_a_unit().await?,
        stripe: StripeCounts::read(fleet).await?,
        intake_peak_mib: fleet.pid("order-intake").and_then(peak_memory_mib),
        door_statement: door_statement_figures(&fleet.scrape_metrics().await),
        // The figures count only if the drop kept every guarantee.
        audit: Audit::without_notifications(fleet, "drop").await?,
        answers: Answers::of(&bought),
        door_seconds,
        promised_at: promised_at.unwrap_or(f64::NAN),
        paid_at: paid_at.unwrap_or(f64::NAN),
        paid,
        spent,
    };
    figures.print(options);
    anyhow::ensure!(paid == options.units as i64, "sold {paid} of {} units", options.units);
    anyhow::ensure!(figures.audit.holds(), "a guarantee broke in the drop: {}", figures.audit.summary());

    let hot_row = hot_row(&fleet.stack.database_url).await?;
    println!("hot row, alone            {hot_row}");
    println!();
    figures.print_summary(options);
    Ok(())
}

/// Starts the fleet with its Stripe budgets adding up to stripe-sim's limit, on a product of
/// `units`; the meter counts what each process spends.
async fn start_fleet(fleet: &mut Fleet, options: &DropOptions) -> anyhow::Result<costs::Meter> {
    let (endpoint, account) = (options.stripe_limit.to_string(), (options.stripe_limit * 4).to_string());
    let common = [
        ("SWEEP_INTERVAL_SECONDS", "60"),
        ("RUST_LOG", "warn"),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
        ("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", endpoint.as_str()),
        ("STRIPE_ACCOUNT_REQUESTS_PER_SECOND", account.as_str()),
    ];
    let (intake_env, worker_env) = (common, common);
    fleet.stripe_rate_limits(options.stripe_limit * 4, options.stripe_limit).await?;
    let mut meter = costs::Meter::new(&fleet.stack.database_url).await?;
    meter.spawn(fleet, "order-intake", "order-intake", &intake_env).await?;
    meter.spawn(fleet, "outbox-relay", "outbox-relay", &common).await?;
    meter.spawn(fleet, "stock-worker-0", "stock-worker", &worker_env).await?;
    meter.spawn(fleet, "stock-worker-1", "stock-worker", &worker_env).await?;
    meter.spawn(fleet, "notification-worker", "notification-worker", &common).await?;
    fleet.product("drop", 1000, options.units).await?;
    fleet.wait_intake().await?;
    say(&format!(
        "a drop: {} buyers for {} units, {} at a time; stripe-sim limited to {}/s on each operation and {account}/s in all, \
         the fleet's Stripe budget the same, shared by the intake and 2 stock workers",
        options.buyers, options.units, options.concurrency, options.stripe_limit
    ));
    Ok(meter)
}

/// What the buyers were answered, in all.
struct Answers {
    /// Final answers by status and code (`409 sold_out`).
    final_codes: BTreeMap<String, usize>,
    /// Latency of each `409 sold_out`, in milliseconds.
    sold_out_ms: Vec<f64>,
    /// Latency of every answer, retried ones included.
    all_ms: Vec<f64>,
    /// Answers before a buyer's final one.
    retries: usize,
}

impl Answers {
    fn of(bought: &[Bought]) -> Self {
        let mut answers =
            Answers { final_codes: BTreeMap::new(), sold_out_ms: Vec::new(), all_ms: Vec::new(), retries: 0 };
        for b in bought {
            *answers
                .final_codes
                .entry(if b.code.is_empty() {
                    b.status.to_string()
                } else {
                    format!("{} {}", b.status, b.code)
                })
                .or_default() += 1;
            answers.retries += b.answers.len() - 1;
            for (status, took) in &b.answers {
                answers.all_ms.push(took.as_secs_f64() * 1000.0);
                if *status == 409 && b.code == "sold_out" {
                    answers.sold_out_ms.push(took.as_secs_f64() * 1000.0);
                }
            }
        }
        answers
    }
}

/// What the fleet's Stripe budget did in the drop.
struct BudgetFigures {
    /// PaymentIntents made a second, from the first to the last (Stripe's `created`, whole
    /// seconds).
    creates_per_second: f64,
    /// PaymentIntents made in the median whole second, the first and last seconds (part
    /// seconds) left out.
    median_second: u64,
    /// stripe-sim's busiest second on each operation.
    busiest_by_endpoint: String,
    /// The budget's ticks in every process; each is five round trips (`BEGIN`, the lock, the
    /// read, the write, `COMMIT`).
    ticks: f64,
}

impl BudgetFigures {
    async fn read(fleet: &Fleet, intents: &[serde_json::Value]) -> anyhow::Result<Self> {
        let created: Vec<i64> = intents.iter().filter_map(|i| i["created"].as_i64()).collect();
        let span = created.iter().max().zip(created.iter().min()).map_or(0, |(last, first)| last - first);
        let creates_per_second = created.len().saturating_sub(1) as f64 / span.max(1) as f64;
        let mut by_second = std::collections::BTreeMap::<i64, u64>::new();
        for at in &created {
            *by_second.entry(*at).or_default() += 1;
        }
        let first = by_second.keys().next().copied().unwrap_or(0);
        let mut seconds: Vec<u64> =
            (first + 1..first + span).map(|at| by_second.get(&at).copied().unwrap_or(0)).collect();
        seconds.sort_unstable();
        let median_second = seconds.get(seconds.len() / 2).copied().unwrap_or(0);
        let stats = fleet.stripe_stats().await?;
        let busiest_by_endpoint = stats["max_requests_in_one_second_by_endpoint"].to_string();
        let ticks = fleet_harness::metrics::sum_by_label(
            &fleet.scrape_metrics().await,
            "stripe_budget_ticks_total",
            "outcome",
        )
        .values()
        .sum();
        Ok(Self { creates_per_second, median_second, busiest_by_endpoint, ticks })
    }
}

/// One drop's figures, as printed.
struct DropFigures {
    budget: BudgetFigures,
    by_status: BTreeMap<String, i64>,
    /// PaymentIntents stripe-sim made.
    intents: usize,
    holds_on_losers: usize,
    stripe: StripeCounts,
    intake_peak_mib: Option<f64>,
    door_statement: String,
    audit: Audit,
    answers: Answers,
    /// Until the last buyer was answered.
    door_seconds: f64,
    /// After the first buyer, until every unit was promised, and until every unit was paid.
    promised_at: f64,
    paid_at: f64,
    /// Units paid.
    paid: i64,
    spent: costs::Snapshot,
}

impl DropFigures {
    fn per_unit(&self) -> f64 {
        self.stripe.requests as f64 / self.paid.max(1) as f64
    }

    fn per_buyer(&self, options: &DropOptions, x: f64) -> f64 {
        x / options.buyers.max(1) as f64
    }

    fn print(&mut self, options: &DropOptions) {
        println!();
        println!("== orderfleet bench: a drop of {} buyers for {} units ==", options.buyers, options.units);
        println!("orders by status          {}", by_status_line(&self.by_status));
        println!(
            "final answers             {:?} ({} retried answers before them)",
            self.answers.final_codes, self.answers.retries
        );
        println!(
            "sold out                  every unit promised {:.2} s after the first buyer; every unit paid after {:.1} s; \
             the last buyer answered after {:.1} s",
            self.promised_at, self.paid_at, self.door_seconds
        );
        let answers = &mut self.answers;
        println!(
            "sold-out answers          {} answers, p50 {:.1} ms, p99 {:.1} ms (every answer: p50 {:.1} ms, p99 {:.1} ms)",
            answers.sold_out_ms.len(),
            percentile(&mut answers.sold_out_ms, 50.0),
            percentile(&mut answers.sold_out_ms, 99.0),
            percentile(&mut answers.all_ms, 50.0),
            percentile(&mut answers.all_ms, 99.0)
        );
        self.print_costs(options);
        println!("guarantees                {}", self.audit.summary());
    }

    /// What the drop cost Stripe, the intake and PostgreSQL.
    fn print_costs(&self, options: &DropOptions) {
        let stripe = &self.stripe;
        println!(
            "Stripe                    {} requests for {} units sold = {:.2} per unit; {} PaymentIntents",
            stripe.requests,
            self.paid,
            self.per_unit(),
            self.intents
        );
        let intake_requests = self.answers.all_ms.len();
        println!(
            "the buyers                {intake_requests} intake requests for {} units sold = {:.2} per unit",
            self.paid,
            intake_requests as f64 / self.paid.max(1) as f64
        );
        let budget = &self.budget;
        println!(
            "Stripe budget             {:.1} creates/s from the first to the last, {} in the median second (the fleet's \
             limit {}/s on each operation, paced at {:.1}/s); busiest second by operation {}; {} ticks = {} statements, {:.2} per unit sold",
            budget.creates_per_second,
            budget.median_second,
            options.stripe_limit,
            f64::from(options.stripe_limit) / orderfleet_payments::budget::WINDOW.as_secs_f64(),
            budget.busiest_by_endpoint,
            budget.ticks,
            budget.ticks * 5.0,
            budget.ticks * 5.0 / self.paid.max(1) as f64
        );
        println!("holds on buyers who got nothing  {}", self.holds_on_losers);
        println!(
            "stripe-sim                {} answered 429; busiest second {} requests (limit {}/s); \
             {} connections opened = {:.1} per 100 requests",
            stripe.rate_limited,
            stripe.busiest_second,
            options.stripe_limit,
            stripe.connections,
            stripe.connections_per_100()
        );
        println!(
            "intake peak memory        {}",
            self.intake_peak_mib.map(|m| format!("{m:.1} MiB (VmHWM)")).unwrap_or_else(|| "unknown".into())
        );
        println!("door statement (intake)   {}", self.door_statement);
        let total = self.spent.total();
        println!(
            "PostgreSQL per buyer      {:.1} round trips, {:.1} of them pings: {}; CPU {:.2} ms \
             (fleet {:.2} ms)",
            self.per_buyer(options, total.round_trips as f64),
            self.per_buyer(options, total.pings as f64),
            self.spent.each(options.buyers, |r| r.round_trips as f64),
            self.per_buyer(options, self.spent.postgres_cpu * 1000.0),
            self.per_buyer(options, total.cpu * 1000.0),
        );
    }

    /// The one line a script reads.
    fn print_summary(&mut self, options: &DropOptions) {
        println!(
            "bench-drop: buyers={} units={} sold_out_s={:.2} sold_out_p99_ms={:.1} stripe_requests_per_unit={:.2} \
             holds_on_losers={} rate_limited={} intake_peak_mib={:.1} \
             pg_round_trips_per_buyer={:.1} stripe_connections_per_100_requests={:.1}",
            options.buyers,
            options.units,
            self.promised_at,
            percentile(&mut self.answers.sold_out_ms, 99.0),
            self.per_unit(),
            self.holds_on_losers,
            self.stripe.rate_limited,
            self.intake_peak_mib.unwrap_or(f64::NAN),
            self.per_buyer(options, self.spent.total().round_trips as f64),
            self.stripe.connections_per_100()
        );
    }
}

/// One buyer: asks once, and again with the same key after a 503 or while the key is in use.
async fn buy(fleet: &Fleet, i: usize) -> Bought {
    let mut answers = Vec::new();
    loop {
        let sent = Instant::now();
        let answer = fleet.post_order(&format!("buyer-{i}"), "drop-key", "drop", 1, "pm_card_visa").await;
        let took = sent.elapsed();
        let Ok(answer) = answer else {
            answers.push((0, took));
            return Bought { status: 0, code: "unanswered".into(), answers };
        };
        answers.push((answer.status, took));
        let code = answer.body["error"]["code"].as_str().unwrap_or_default().to_owned();
        let again = answer.status == 503 || code == "idempotency_key_in_use";
        if !again || answers.len() >= 60 {
            return Bought { status: answer.status, code, answers };
        }
        let wait = answer.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok()).unwrap_or(1).min(120);
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
}

/// The door statement's time as the intake measured it (`intake_door_seconds`), by outcome.
fn door_statement_figures(metrics: &[String]) -> String {
    let mut figures = Vec::new();
    for outcome in ["admitted", "closed"] {
        let value = |suffix: &str, quantile: Option<&str>| -> Option<f64> {
            metrics.iter().flat_map(|t| t.lines()).find_map(|line| {
                let (name, rest) = line.split_once('{')?;
                if name != format!("intake_door_seconds{suffix}")
                    || !rest.contains(&format!("outcome=\"{outcome}\""))
                {
                    return None;
                }
                if let Some(q) = quantile
                    && !rest.contains(&format!("quantile=\"{q}\""))
                {
                    return None;
                }
                line.rsplit(' ').next()?.parse().ok()
            })
        };
        if let (Some(count), Some(sum)) = (value("_count", None), value("_sum", None)) {
            figures.push(format!(
                "{outcome}: {count:.0}, mean {:.2} ms, p50 {:.2} ms, p99 {:.2} ms",
                sum / count.max(1.0) * 1000.0,
                value("", Some("0.5")).unwrap_or(f64::NAN) * 1000.0,
                value("", Some("0.99")).unwrap_or(f64::NAN) * 1000.0
            ));
        }
    }
    figures.join("; ")
}

/// The door's statement on its own, against a product with units to spare: from one connection
/// (its own time, commit included) and from 32 at once (how many promises a second one product
/// row takes when every buyer queues on it).
async fn hot_row(database_url: &str) -> anyhow::Result<String> {
    let pool = &fleet_harness::fleet_pool(database_url, 32).await?;
    orderfleet::domain::records::product::upsert(
        pool,
        &orderfleet::domain::records::product::ProductUpsert {
            id: orderfleet_words::Sku::parse("hot-row").map_err(anyhow::Error::msg)?,
            name: "hot row".into(),
            price_minor: 1000,
            currency: orderfleet_words::Currency::parse("usd").map_err(anyhow::Error::msg)?,
            units_total: orderfleet::domain::records::product::MAX_UNITS,
            max_per_buyer: None,
            opens_at: None,
            queue_opens_at: None,
            max_per_card: None,
        },
    )
    .await?;
    let request =
        OrderRequest::parse(br#"{"product_id": "hot-row", "quantity": 1, "payment_method": "pm_card_visa"}"#)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let fingerprint = request.fingerprint();
    let mut lines = Vec::new();
    for (connections, promises) in [(1usize, 500usize), (32, 3000)] {
        let started = Instant::now();
        let mut took: Vec<f64> = futures::stream::iter(0..promises)
            .map(|i| promise(pool, &request, &fingerprint, format!("hot-{connections}-{i}")))
            .buffer_unordered(connections)
            .collect::<Vec<anyhow::Result<f64>>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<_>>()
            .context("the hot-row measurement")?;
        let seconds = started.elapsed().as_secs_f64();
        lines.push(format!(
            "{connections} connection(s): {:.0} promises/s, p50 {:.2} ms, p99 {:.2} ms",
            promises as f64 / seconds,
            percentile(&mut took, 50.0),
            percentile(&mut took, 99.0)
        ));
    }
    Ok(lines.join("; "))
}

/// One promise through the door for a buyer of their own, behind the card gate as the intake
/// runs by default: its milliseconds.
async fn promise(
    pool: &orderfleet_runtime::db::Pool,
    request: &OrderRequest,
    fingerprint: &[u8],
    user: String,
) -> anyhow::Result<f64> {
    let user = UserId::parse(&user).map_err(anyhow::Error::msg)?;
    let sent = Instant::now();
    let traceparent = orderfleet_runtime::trace::Trace::random().traceparent();
    let entry = door::Entry {
        user: &user,
        key: "k",
        product_id: &request.product_id,
        quantity: request.quantity,
        payment_method: &request.payment_method,
        fingerprint,
        lease: Duration::from_secs(30),
        traceparent: &traceparent,
    };
    let reads = std::sync::Arc::default();
    let admission = door::admit(pool, &reads, entry, LimitsConfig::DEFAULT.declines_per_hour).await;
    anyhow::ensure!(matches!(admission, Ok(Admission::Admitted(_))), "the door refused: {admission:?}");
    Ok(sent.elapsed().as_secs_f64() * 1000.0)
}

/// The process's peak resident set (VmHWM), from /proc.
fn peak_memory_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
