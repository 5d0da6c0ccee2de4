// The harness's binaries build statements at run time to look at the fleet from outside
// (clippy.toml), and read a scenario top to bottom.
#![allow(clippy::too_many_lines, clippy::disallowed_methods)]
//! `make demo`: a flash sale through the whole fleet, against the stack `make up` started.
//!
//! Starts stripe-sim (limited, as Stripe is, to 25 requests a second) and every binary (two
//! stock workers), with Stripe budgets that add up to that limit; seeds a product with limited
//! stock through `fleetctl`; lets one buyer in first with a card that is declined (their unit
//! goes back to the line), then fires a burst of orders from many users — some retried with
//! the same Idempotency-Key; waits until every order is terminal, prints what happened and
//! checks SPEC §8's guarantees against stripe-sim's ledger and stats, the database and the SNS
//! topic, then stops what it started (SIGTERM).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_harness::audit::Audit;
use fleet_harness::metrics::sum_by_label;
use fleet_harness::{Answer, Fleet, Stack, percentile};
use futures::StreamExt;

/// Stripe's default limit per endpoint, and the fleet's budgets adding up to it.
/// stripe-sim's limits: Stripe's in live mode, per named operation and per account, which are
/// also the fleet's defaults (`STRIPE_ENDPOINT_REQUESTS_PER_SECOND`,
/// `STRIPE_ACCOUNT_REQUESTS_PER_SECOND`): the intake and the stock workers share them.
const STRIPE_RATE_LIMIT: u32 = 25;
const STRIPE_ACCOUNT_LIMIT: u32 = 100;
/// How long a buyer has to complete 3-D Secure in the demo (the fleet's default is 600).
const ACTION_TIMEOUT_SECONDS: &str = "5";
/// Buyers whose card needs 3-D Secure, before the burst: a third authenticate, a third fail,
/// a third abandon.
const THREE_D_SECURE_BUYERS: usize = 6;

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
        "starting stripe-sim (limited to {STRIPE_RATE_LIMIT} requests/s on each operation, {STRIPE_ACCOUNT_LIMIT}/s in all), \
         order-intake, outbox-relay, 2 × stock-worker, notification-worker: one Stripe budget for the fleet"
    ));
    say(&format!("logs: {}/", log_dir.display()));
    let mut fleet = Fleet::prepare("demo", stack, log_dir).await?;
    fleet.stripe_rate_limits(STRIPE_ACCOUNT_LIMIT, STRIPE_RATE_LIMIT).await?;
    // A buyer has seconds to complete 3-D Secure here, and the sweeper (in the stock workers)
    // looks every two seconds for one whose deadline passed.
    fleet.set_env("PAYMENT_ACTION_TIMEOUT_SECONDS", ACTION_TIMEOUT_SECONDS);
    let worker = [("SWEEP_INTERVAL_SECONDS", "2")];
    fleet.spawn("order-intake", "order-intake", &[])?;
    fleet.spawn("outbox-relay", "outbox-relay", &[])?;
    fleet.spawn("stock-worker-0", "stock-worker", &worker)?;
    fleet.spawn("stock-worker-1", "stock-worker", &worker)?;
    fleet.spawn("notification-worker", "notification-worker", &[])?;
    fleet.wait_intake().await?;
    let outcome = match sale(&fleet, &options).await {
        Ok(sold) => opening(&fleet).await.map(|opened| sold && opened),
        Err(e) => Err(e),
    };
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
    seed(fleet, &sku, options.stock).await?;
    decline_a_first_buyer(fleet, &sku).await?;
    three_d_secure_buyers(fleet, &sku).await?;

    let users = options.orders;
    let started = Instant::now();
    say(&format!("firing {users} orders from {users} users, 64 at a time"));
    let burst = burst(fleet, &sku, users).await?;
    let intake_seconds = started.elapsed().as_secs_f64();
    say(&format!(
        "intake answered {} requests in {intake_seconds:.1} s: {:?} ({} idempotent replays; \
         answered first, then retried with the same key: {:?})",
        burst.answers.len(),
        burst.by_status(),
        burst.replays(),
        burst.retried
    ));

    say("waiting until every order is terminal");
    wait_until_terminal(fleet, &sku).await?;
    let settled_seconds = started.elapsed().as_secs_f64();

    let settled = Settled::read(fleet, &sku).await?;
    let sale = Sale {
        sku,
        buyers: users + 1 + THREE_D_SECURE_BUYERS,
        stock: options.stock,
        burst,
        settled,
        intake_seconds,
        settled_seconds,
    };
    sale.print();

    // SPEC §8, as the suite audits it, then what only a drop shows.
    let audit = Audit::of(fleet, &sale.sku, &sale.settled.notes).await?;
    let checks = audit.guarantees().into_iter().chain(sale.drop_checks());
    let mut all = true;
    for (guarantee, held) in checks {
        println!("{} {guarantee}", if held { "✓" } else { "✗" });
        all &= held;
    }
    Ok(all)
}

/// Seeds the product with `stock` units, through `fleetctl` as an operator would.
async fn seed(fleet: &Fleet, sku: &str, stock: i32) -> anyhow::Result<()> {
    let units = stock.to_string();
    fleet
        .fleetctl(
            &["product", "upsert", "--id", sku, "--name", "Limited drop", "--price", "4999"]
                .into_iter()
                .chain(["--currency", "usd", "--stock", &units])
                .collect::<Vec<_>>(),
            &[],
        )
        .await?;
    say(&format!("seeded {sku}: {stock} units at 49.99 usd (fleetctl product upsert)"));
    Ok(())
}

/// One buyer first, with a card that is declined: the unit the door promised them goes back
/// to the line before the burst arrives.
async fn decline_a_first_buyer(fleet: &Fleet, sku: &str) -> anyhow::Result<()> {
    let declined = fleet
        .post_order("buyer-declined", &format!("{sku}-declined"), sku, 1, "pm_card_chargeDeclined")
        .await?;
    say(&format!(
        "a first buyer's card is declined: {} {} (their unit goes back)",
        declined.status, declined.body["error"]["code"]
    ));
    Ok(())
}

/// Buyers whose card needs 3-D Secure: each is answered `202` `requires_action` with what its
/// page needs; then a third authenticate (stripe-sim stands in for Stripe.js in their
/// browser), a third fail it, and a third abandon. Stripe's webhooks settle the first two
/// kinds; the sweeper releases the last at their deadline. Their units that come back go to
/// the burst.
async fn three_d_secure_buyers(fleet: &Fleet, sku: &str) -> anyhow::Result<()> {
    let mut intents = Vec::new();
    for i in 0..THREE_D_SECURE_BUYERS {
        let (user, key) = (format!("buyer-3ds-{i}"), format!("{sku}-3ds-{i}"));
        let answer = fleet.post_order(&user, &key, sku, 1, "pm_card_threeDSecure2Required").await?;
        anyhow::ensure!(
            answer.body["status"] == "requires_action",
            "a 3-D Secure card was answered {answer:?}"
        );
        let order = answer.body["order_id"].as_str().context("no order id")?.to_owned();
        let intent: String = sqlx::query_scalar("SELECT payment_intent_id FROM orders WHERE id = $1::uuid")
            .bind(&order)
            .fetch_one(&fleet.pool)
            .await?;
        intents.push(intent);
    }
    say(&format!(
        "{THREE_D_SECURE_BUYERS} buyers' cards need 3-D Secure: 202 requires_action, with a client_secret for Stripe.js"
    ));
    for (i, intent) in intents.iter().enumerate() {
        match i % 3 {
            0 => fleet.authenticate(intent, true).await?,
            1 => fleet.authenticate(intent, false).await?,
            _ => {} // abandons
        }
    }
    say(&format!(
        "a third authenticate, a third fail, a third abandon (released at their {ACTION_TIMEOUT_SECONDS} s deadline)"
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1 AND status = 'requires_action'",
        )
        .bind(sku)
        .fetch_one(&fleet.pool)
        .await?;
        if waiting == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "3-D Secure orders still waiting after 60 s; see the logs"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The burst's answers, as the intake gave them.
struct Burst {
    /// Each request's final answer.
    answers: Vec<Answer>,
    /// Each `409 sold_out`'s latency.
    sold_out_latency: Vec<Duration>,
    /// The users told `sold_out`.
    sold_out_buyers: HashSet<String>,
    /// Answers a request got before its final one (a retry with the same key), by status.
    retried: BTreeMap<u16, usize>,
}

impl Burst {
    /// Final answers by status.
    fn by_status(&self) -> BTreeMap<u16, usize> {
        self.answers.iter().fold(BTreeMap::new(), |mut m, a| {
            *m.entry(a.status).or_default() += 1;
            m
        })
    }

    /// Answers that were idempotent replays.
    fn replays(&self) -> usize {
        self.answers.iter().filter(|a| a.replayed).count()
    }
}

/// The burst: one order per user, all at once; every 10th user retries the same request
/// (a client that timed out).
async fn burst(fleet: &Fleet, sku: &str, users: usize) -> anyhow::Result<Burst> {
    let run = sku.to_owned();
    let requests = (0..users).flat_map(move |i| {
        let copies = if i % 10 == 0 { 2 } else { 1 };
        let run = run.clone();
        // Keys are the client's, per order: this run's own, so a rerun is not a replay.
        (0..copies).map(move |_| (format!("buyer-{i}"), format!("{run}-order-{i}")))
    });
    let mut burst = Burst {
        answers: Vec::new(),
        sold_out_latency: Vec::new(),
        sold_out_buyers: HashSet::new(),
        retried: BTreeMap::new(),
    };
    let mut stream = futures::stream::iter(requests)
        .map(|(user, key)| async move {
            let answer = fleet.post_order(&user, &key, sku, 1, "pm_card_visa").retrying().await;
            answer.map(|(answer, earlier)| (user, answer, earlier))
        })
        .buffer_unordered(64);
    let mut last = Instant::now();
    while let Some(result) = stream.next().await {
        let (user, answer, earlier) = result?;
        for status in earlier {
            *burst.retried.entry(status).or_default() += 1;
        }
        if answer.status == 409 && answer.body["error"]["code"] == "sold_out" {
            burst.sold_out_latency.push(answer.took);
            burst.sold_out_buyers.insert(user);
        }
        burst.answers.push(answer);
        if last.elapsed() > Duration::from_secs(1) {
            say(&format!("  {} answers so far", burst.answers.len()));
            last = Instant::now();
        }
    }
    Ok(burst)
}

/// Waits until every order of the product is terminal with its hold released, telling the
/// orders by status each second.
async fn wait_until_terminal(fleet: &Fleet, sku: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT status::text, count(*) FROM orders WHERE product_id = $1 GROUP BY 1 ORDER BY 1",
        )
        .bind(sku)
        .fetch_all(&fleet.pool)
        .await?;
        let open: i64 = rows
            .iter()
            .filter(|(s, _)| {
                matches!(
                    s.as_str(),
                    "pending_authorization" | "requires_action" | "authorized" | "stock_reserved"
                )
            })
            .map(|(_, n)| n)
            .sum();
        let unreleased: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1
                AND status IN ('rejected_out_of_stock', 'capture_failed') AND authorization_released_at IS NULL",
        )
        .bind(sku)
        .fetch_one(&fleet.pool)
        .await?;
        say(&format!("  {}", rows.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join(" ")));
        if open == 0 && unreleased == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "orders still open after 300 s; see the logs");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The sale once every order is terminal: the database, stripe-sim's ledger and stats, the
/// topic, and the fleet's AWS requests.
struct Settled {
    statuses: BTreeMap<String, i64>,
    intents: Vec<serde_json::Value>,
    captures: i64,
    cancels: i64,
    /// PaymentIntents still holding funds.
    holds: usize,
    stock_left: i32,
    /// Each notification the topic delivered: its event type and order.
    notes: Vec<(String, String)>,
    stripe_stats: serde_json::Value,
    holds_on_losers: usize,
    aws: BTreeMap<String, f64>,
    /// The 3-D Secure buyers' orders: authenticated (paid), failed, abandoned.
    three_d_secure: (i64, i64, i64),
}

impl Settled {
    async fn read(fleet: &Fleet, sku: &str) -> anyhow::Result<Self> {
        let statuses: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
            "SELECT status::text, count(*) FROM orders WHERE product_id = $1 GROUP BY 1",
        )
        .bind(sku)
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
            .bind(sku)
            .fetch_one(&fleet.pool)
            .await?;
        say("reading the notifications the topic delivered to a subscribed queue");
        let notes = fleet.notifications((accepted * 2) as usize, Duration::from_secs(60)).await?;
        Ok(Self {
            statuses,
            intents,
            captures,
            cancels,
            holds,
            stock_left,
            notes,
            stripe_stats: fleet.stripe_stats().await?,
            holds_on_losers: fleet.holds_without_a_unit().await?,
            aws: sum_by_label(&fleet.scrape_metrics().await, "aws_requests_total", "operation"),
            three_d_secure: sqlx::query_as(
                "SELECT count(*) FILTER (WHERE status = 'paid'),
                        count(*) FILTER (WHERE failure_reason = $2),
                        count(*) FILTER (WHERE failure_reason = $3)
                   FROM orders WHERE product_id = $1 AND client_secret IS NOT NULL",
            )
            .bind(sku)
            .bind(orderfleet::domain::words::status::FailureReason::AuthenticationFailed)
            .bind(orderfleet::domain::words::status::FailureReason::AuthenticationTimedOut)
            .fetch_one(&fleet.pool)
            .await?,
        })
    }

    fn count(&self, status: &str) -> i64 {
        self.statuses.get(status).copied().unwrap_or(0)
    }

    fn orders(&self) -> i64 {
        self.statuses.values().sum()
    }

    fn rate_limited(&self) -> u64 {
        self.stripe_stats["rate_limited"].as_u64().unwrap_or(u64::MAX)
    }
}

/// One demo run: what the burst was answered and how it settled.
struct Sale {
    sku: String,
    /// The burst's users and the first, declined, buyer.
    buyers: usize,
    stock: i32,
    burst: Burst,
    settled: Settled,
    intake_seconds: f64,
    settled_seconds: f64,
}

impl Sale {
    fn print(&self) {
        let (burst, settled) = (&self.burst, &self.settled);
        let (paid, declines) = (settled.count("paid"), settled.count("payment_declined"));
        println!();
        println!("== orderfleet demo: {} buyers, {} units of {} ==", self.buyers, self.stock, self.sku);
        println!(
            "orders by status      {}",
            settled.statuses.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join("  ")
        );
        println!(
            "intake                {} requests, {} replays, final answers {:?}, retried after {:?}",
            burst.answers.len(),
            burst.replays(),
            burst.by_status(),
            burst.retried
        );
        println!(
            "authorizations        {} PaymentIntents at stripe-sim for {paid} units sold and {declines} declined (a card, or 3-D Secure)",
            settled.intents.len()
        );
        let (authenticated, failed, abandoned) = settled.three_d_secure;
        println!(
            "3-D Secure            {} buyers: {authenticated} authenticated and paid, {failed} failed, \
             {abandoned} abandoned (released at the deadline); their units went back to the line",
            authenticated + failed + abandoned
        );
        println!("captures              {}", settled.captures);
        println!("cancels               {}", settled.cancels);
        println!("holds left            {}", settled.holds);
        println!("holds on buyers who got nothing  {}", settled.holds_on_losers);
        let mut sold_out_ms: Vec<f64> =
            burst.sold_out_latency.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        println!(
            "sold out              {} answers to {} buyers, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            burst.sold_out_latency.len(),
            burst.sold_out_buyers.len(),
            percentile(&mut sold_out_ms, 50.0),
            percentile(&mut sold_out_ms, 99.0),
            percentile(&mut sold_out_ms, 100.0)
        );
        self.print_services(paid);
    }

    /// What the sale asked of stripe-sim, the stock, the topic and AWS, and how long it took.
    fn print_services(&self, paid: i64) {
        let settled = &self.settled;
        println!(
            "stripe-sim            {} requests, {} rate-limited (429), busiest second {} (limit {STRIPE_ACCOUNT_LIMIT}/s), \
             by operation {} (limit {STRIPE_RATE_LIMIT}/s each)",
            settled.stripe_stats["requests"],
            settled.rate_limited(),
            settled.stripe_stats["max_requests_in_one_second"].as_u64().unwrap_or(0),
            settled.stripe_stats["max_requests_in_one_second_by_endpoint"]
        );
        println!("stock left            {} (sold {paid} of {})", settled.stock_left, self.stock);
        let mut by_event: BTreeMap<String, usize> = BTreeMap::new();
        let mut seen = HashSet::new();
        let mut repeated = 0;
        for (event, order) in &settled.notes {
            *by_event.entry(event.clone()).or_default() += 1;
            if !seen.insert((event, order)) {
                repeated += 1;
            }
        }
        println!("notifications         {by_event:?} ({repeated} repeated)");
        let aws_total: f64 = settled.aws.values().sum();
        println!(
            "AWS requests          {aws_total:.0} in all, {:.2} per order: {}",
            aws_total / settled.orders().max(1) as f64,
            settled.aws.iter().map(|(op, n)| format!("{op}={n:.0}")).collect::<Vec<_>>().join(" ")
        );
        println!(
            "time                  intake {:.1} s, all terminal after {:.1} s",
            self.intake_seconds, self.settled_seconds
        );
        println!("build                 {BUILD}");
        println!();
    }

    /// What only a drop shows, beyond the guarantees the suite audits.
    fn drop_checks(&self) -> [(&'static str, bool); 6] {
        let settled = &self.settled;
        let (paid, declines, orders) =
            (settled.count("paid"), settled.count("payment_declined"), settled.orders());
        let buyers_without_unit = self.buyers as i64 - paid - declines;
        [
            ("every PaymentIntent of a paid order captured, once", settled.captures == paid),
            ("no PaymentIntent still holding funds at the end", settled.holds == 0),
            (
                "a PaymentIntent only for a unit: PaymentIntents = units sold + declined cards",
                settled.intents.len() as i64 == paid + declines,
            ),
            (
                "no hold on a buyer who got nothing (the only cancels: 3-D Secure failed or abandoned)",
                settled.holds_on_losers == 0
                    && settled.cancels == settled.three_d_secure.1 + settled.three_d_secure.2,
            ),
            (
                "every buyer without a unit heard sold_out at once, with nothing written",
                self.burst.sold_out_buyers.len() as i64 == buyers_without_unit && orders == paid + declines,
            ),
            ("within Stripe's limits: stripe-sim answered no 429", settled.rate_limited() == 0),
        ]
    }
}

/// A drop that opens at a set time (SPEC §1.8): its pre-queue open now, its sale a minute
/// ahead; a few hundred buyers queue (one in ten with a card that declines, one in twenty with
/// a 3-D Secure card its buyer abandons, so units come back to the queue); the operator moves
/// the opening to two seconds ahead; the fleet draws the queue and serves it down the line.
async fn opening(fleet: &Fleet) -> anyhow::Result<bool> {
    const BUYERS: usize = 300;
    const UNITS: i32 = 20;
    let sku = format!("opening-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"));
    let at = |seconds: i64| (chrono::Utc::now() + chrono::TimeDelta::seconds(seconds)).to_rfc3339();
    let upsert = |opening: Vec<String>| {
        let mut args: Vec<String> =
            ["product", "upsert", "--id", &sku, "--name", "Friday drop", "--price", "4999"]
                .into_iter()
                .chain(["--currency", "usd", "--stock", &UNITS.to_string()])
                .map(str::to_owned)
                .collect();
        args.extend(opening);
        async move { fleet.fleetctl(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await }
    };
    println!();
    upsert(vec!["--opens-at".into(), at(60), "--queue-opens-at".into(), at(-1)]).await?;
    say(&format!("the opening: {sku}, {UNITS} units, its pre-queue open now and its sale in a minute"));

    let method = |i: usize| match i % 20 {
        3 | 13 => "pm_card_chargeDeclined",
        7 => "pm_card_threeDSecure2Required",
        _ => "pm_card_visa",
    };
    let answers: Vec<(usize, anyhow::Result<Answer>)> = futures::stream::iter(0..BUYERS)
        .map(|i| {
            let (user, sku) = (format!("{sku}-buyer-{i:03}"), sku.as_str());
            async move { (i, fleet.post_order(&user, "k", sku, 1, method(i)).await) }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut by_answer = BTreeMap::<String, usize>::new();
    let mut orders = BTreeMap::<String, usize>::new();
    for (i, answer) in &answers {
        let answer = answer.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        *by_answer
            .entry(format!("{} {}", answer.status, answer.body["status"].as_str().unwrap_or("?")))
            .or_default() += 1;
        if let Some(id) = answer.body["order_id"].as_str() {
            orders.insert(id.to_owned(), *i);
        }
    }
    say(&format!(
        "{BUYERS} buyers queued before the opening: {by_answer:?}; no unit promised, no PaymentIntent"
    ));
    let again = fleet.post_order(&format!("{sku}-buyer-000"), "k2", &sku, 1, "pm_card_visa").await?;
    say(&format!("buyer-000 again, under another key: {} {}", again.status, again.body["error"]["code"]));

    upsert(vec!["--opens-at".into(), at(2)]).await?;
    say("the operator moves the opening to 2 s from now (fleetctl product upsert --opens-at)");
    let deadline = Instant::now() + Duration::from_secs(30);
    let seed: Vec<u8> = loop {
        let seed: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT draw_seed FROM products WHERE id = $1 AND opened_at IS NOT NULL")
                .bind(&sku)
                .fetch_optional(&fleet.pool)
                .await?
                .flatten();
        if let Some(seed) = seed {
            break seed;
        }
        anyhow::ensure!(Instant::now() < deadline, "{sku} did not open within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let late = fleet.post_order(&format!("{sku}-late"), "k", &sku, 1, "pm_card_visa").await?;
    let seed: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    say(&format!("opened: the queue drawn at random, seed {seed} (kept on the product for the audit)"));
    say(&format!(
        "a buyer who comes after the opening: {} {} (the queue is ahead of them)",
        late.status, late.body["error"]["code"]
    ));
    let first: Vec<(i64, uuid::Uuid, String)> = sqlx::query_as(
        "SELECT position, id, status::text FROM orders WHERE product_id = $1 ORDER BY position LIMIT 8",
    )
    .bind(&sku)
    .fetch_all(&fleet.pool)
    .await?;
    for (position, id, status) in &first {
        say(&format!(
            "  #{position:<3} buyer-{:03}  {status}",
            orders.get(&id.to_string()).copied().unwrap_or(0)
        ));
    }
    let (id, i) = orders.iter().last().expect("a queued order");
    let view: serde_json::Value = fleet.get_order(&format!("{sku}-buyer-{i:03}"), id).await?.json().await?;
    say(&format!("buyer-{i:03} looks at their order: {} {}", view["status"], view["line"]));

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1 AND (status = 'queued' OR holds_units(status))",
        )
        .bind(&sku)
        .fetch_one(&fleet.pool)
        .await?;
        if waiting == 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "{waiting} orders of {sku} still waiting after 120 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let statuses: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status::text, count(*) FROM orders WHERE product_id = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(&sku)
    .fetch_all(&fleet.pool)
    .await?;
    say(&format!(
        "the queue served down the line: {} (units given back by declines and abandoned 3-D Secure went to the next in line)",
        statuses.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join(" ")
    ));
    let audit = Audit::without_notifications(fleet, &sku).await?;
    let checks = [
        (
            "every buyer queued, one order each",
            by_answer.get("202 queued") == Some(&BUYERS) && again.status == 409,
        ),
        ("a buyer after the opening is behind the queue: sold_out", late.status == 409),
        (
            "every unit sold, every other queued order sold_out",
            statuses.iter().all(|(s, _)| matches!(s.as_str(), "paid" | "payment_declined" | "sold_out"))
                && statuses.iter().any(|(s, n)| s == "paid" && *n == i64::from(UNITS)),
        ),
    ];
    let mut all = true;
    for (guarantee, held) in audit.guarantees().into_iter().chain(checks) {
        println!("{} {guarantee}", if held { "✓" } else { "✗" });
        all &= held;
    }
    Ok(all)
}

fn say(message: &str) {
    println!("demo: {message}");
}
