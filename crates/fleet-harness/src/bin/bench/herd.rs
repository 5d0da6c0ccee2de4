//! `make bench BENCH_ARGS=--herd`: a herd at the door (SPEC §8.7): 100,000 buyers
//! (`--buyers`) for 100 units (`--units`), `--concurrency` (256) at a time, through
//! `--intakes` (1) intakes in turn, the whole fleet and this load on one machine.
//!
//! Units come back while the herd asks: one buyer in 20 of the first `units × 4` pays with a
//! card that declines (its unit back at once), and one in 20 with a card needing 3-D Secure
//! that its buyer never completes (its unit back when `PAYMENT_ACTION_TIMEOUT_SECONDS`, 2
//! here, has passed and the sweeper settles it). Every buyer asks once; `sold_out` is final,
//! a `503` or a key in flight is asked again after its `Retry-After`.
//!
//! First the same units are sold without the herd (`units` buyers, the calm), then with it:
//! the time until every unit was promised and paid, each way, says whether the herd slowed
//! the buyers who get units. It prints the answers a second, the `sold_out` latency (p50,
//! p99, max), the statements PostgreSQL ran for the sold-out answers (the intakes' shared
//! reads and the door's sold-out statements, from their metrics) and the intakes' round trips
//! (counted on the wire), the intakes' CPU per answer, and every §8 check (the audit). Last,
//! one line: `bench-herd: buyers=N units=U intakes=I answers_per_s=… sold_out_p50_ms=…
//! sold_out_p99_ms=… sold_out_max_ms=… pg_statements_per_sold_out=… intake_cpu_us_per_answer=…
//! sell_s=… calm_sell_s=… audit=ok`.

use std::time::{Duration, Instant};

use fleet_harness::audit::Audit;
use fleet_harness::{Fleet, percentile};
use futures::StreamExt;
use serde_json::Value;

use super::{costs, say};

pub struct HerdOptions {
    pub buyers: usize,
    pub units: i32,
    pub concurrency: usize,
    pub intakes: usize,
}

/// One buyer's answers: (status, error code, latency).
pub(super) type Asked = Vec<(u16, String, Duration)>;

pub async fn run(fleet: &mut Fleet, options: &HerdOptions) -> anyhow::Result<()> {
    let (meter, intakes) = start_fleet(fleet, options).await?;
    // A few orders first, so that neither run pays for the fleet's first connections and
    // Stripe budget shares.
    sell(fleet, &intakes, "warm", 20, 20).await?;
    let calm_started = Instant::now();
    let calm_asked = ask(fleet, &intakes, "calm", options.units as usize, 0, 64).await;
    let calm_door = calm_started.elapsed().as_secs_f64();
    fleet.wait_settled(Duration::from_secs(600)).await?;
    let calm = sold_times(fleet, "calm").await?;
    say(&format!(
        "without a herd: {} units promised in {:.2} s, paid in {:.2} s",
        options.units, calm.0, calm.1
    ));

    let before = meter.read(fleet);
    let reads_before = sold_out_statements(fleet).await;
    let started = Instant::now();
    let asked = ask(fleet, &intakes, "drop", options.buyers, options.units, options.concurrency).await;
    let herd_seconds = started.elapsed().as_secs_f64();
    let spent = meter.read(fleet).since(&before);
    let reads = sold_out_statements(fleet).await - reads_before;
    let (promised_at, paid_at) = sold_times(fleet, "drop").await?;
    fleet.wait_settled(Duration::from_secs(600)).await?;
    let audit = Audit::without_notifications(fleet, "drop").await?;

    let answers: usize = asked.iter().map(Vec::len).sum();
    let (mut calm_202_ms, mut herd_202_ms) = (accepted_ms(&calm_asked), accepted_ms(&asked));
    let mut sold_out_ms: Vec<f64> = asked
        .iter()
        .flatten()
        .filter(|(_, code, _)| code == "sold_out")
        .map(|(_, _, took)| took.as_secs_f64() * 1000.0)
        .collect();
    let sold_out = sold_out_ms.len();
    let intake_cpu: f64 = spent
        .processes
        .iter()
        .filter(|(label, _)| label.starts_with("order-intake"))
        .map(|(_, r)| r.cpu)
        .sum();
    let intake_round_trips: u64 = spent
        .processes
        .iter()
        .filter(|(label, _)| label.starts_with("order-intake"))
        .map(|(_, r)| r.round_trips)
        .sum();
    let answers_per_s = answers as f64 / herd_seconds;
    let (p50, p99, max) = (
        percentile(&mut sold_out_ms, 50.0),
        percentile(&mut sold_out_ms, 99.0),
        percentile(&mut sold_out_ms, 100.0),
    );
    let statements_per_sold_out = reads / sold_out.max(1) as f64;
    let cpu_us_per_answer = intake_cpu * 1e6 / answers.max(1) as f64;
    let paid: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(quantity), 0) FROM orders WHERE product_id = 'drop' AND status = 'paid'",
    )
    .fetch_one(&fleet.pool)
    .await?;

    println!();
    println!(
        "== orderfleet herd: {} buyers for {} units, {} intake(s) ==",
        options.buyers, options.units, options.intakes
    );
    println!(
        "answers                   {answers} in {herd_seconds:.1} s = {answers_per_s:.0}/s; {sold_out} sold_out, {paid} units paid"
    );
    println!("sold_out latency          p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms");
    println!(
        "PostgreSQL, sold-out      {reads:.0} statements for {sold_out} sold_out answers = {statements_per_sold_out:.4} each \
         (the intakes' shared reads and the door's sold-out statements), {:.0} a second per intake",
        reads / herd_seconds / options.intakes as f64
    );
    println!(
        "PostgreSQL, intakes       {intake_round_trips} round trips in all = {:.4} per answer (accepted orders and the Stripe budget's ticks included)",
        intake_round_trips as f64 / answers.max(1) as f64
    );
    println!(
        "intake CPU                {cpu_us_per_answer:.0} µs per answer ({:.0} answers a second per intake core): {}",
        1e6 / cpu_us_per_answer,
        spent.each(answers, |r| r.cpu * 1e6)
    );
    println!(
        "PostgreSQL CPU            {:.1} µs per answer (every postgres process of this machine, the herd's accepted orders included)",
        spent.postgres_cpu * 1e6 / answers.max(1) as f64
    );
    println!(
        "units sold                promised in {promised_at:.2} s and paid in {paid_at:.2} s with the herd (units back from \
         declines and abandoned 3-D Secure sold again within it); {:.2} s and {:.2} s without (good cards only; the door \
         answered them in {calm_door:.2} s)",
        calm.0, calm.1
    );
    println!(
        "202 latency               with the herd p50 {:.1} ms, p99 {:.1} ms ({} accepted); without p50 {:.1} ms, p99 {:.1} ms",
        percentile(&mut herd_202_ms, 50.0),
        percentile(&mut herd_202_ms, 99.0),
        herd_202_ms.len(),
        percentile(&mut calm_202_ms, 50.0),
        percentile(&mut calm_202_ms, 99.0)
    );
    println!("guarantees                {}", audit.summary());
    println!();
    println!(
        "bench-herd: buyers={} units={} intakes={} answers_per_s={answers_per_s:.0} sold_out_p50_ms={p50:.1} \
         sold_out_p99_ms={p99:.1} sold_out_max_ms={max:.1} pg_statements_per_sold_out={statements_per_sold_out:.4} \
         intake_cpu_us_per_answer={cpu_us_per_answer:.0} sell_s={paid_at:.2} calm_sell_s={:.2} audit={}",
        options.buyers,
        options.units,
        options.intakes,
        calm.1,
        if audit.holds() { "ok" } else { "broken" }
    );
    anyhow::ensure!(audit.holds(), "a guarantee broke in the herd: {}", audit.summary());
    Ok(())
}

/// The fleet: `intakes` intakes, the relay, two stock workers (their sweepers every second,
/// so an abandoned 3-D Secure gives its unit back soon after its 2 s), the notification
/// worker; stripe-sim and the fleet's budget at Stripe's live limits. The intakes' base URLs.
async fn start_fleet(
    fleet: &mut Fleet,
    options: &HerdOptions,
) -> anyhow::Result<(costs::Meter, Vec<String>)> {
    let common = [
        ("RUST_LOG", "warn"),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
        ("PAYMENT_ACTION_TIMEOUT_SECONDS", "2"),
        ("SWEEP_INTERVAL_SECONDS", "1"),
        ("INTAKE_MAX_IN_FLIGHT", "4096"),
    ];
    fleet.stripe_rate_limits(100, 25).await?;
    let mut meter = costs::Meter::new(&fleet.stack.database_url).await?;
    let mut intakes = vec![fleet.intake_url.clone()];
    meter.spawn(fleet, "order-intake", "order-intake", &common).await?;
    for i in 1..options.intakes {
        let addr = format!("127.0.0.1:{}", fleet_harness::free_port());
        let env: Vec<(&str, &str)> =
            common.iter().copied().chain([("INTAKE_LISTEN_ADDR", addr.as_str())]).collect();
        meter.spawn(fleet, &format!("order-intake-{i}"), "order-intake", &env).await?;
        intakes.push(format!("http://{addr}"));
    }
    meter.spawn(fleet, "outbox-relay", "outbox-relay", &common).await?;
    meter.spawn(fleet, "stock-worker-0", "stock-worker", &common).await?;
    meter.spawn(fleet, "stock-worker-1", "stock-worker", &common).await?;
    meter.spawn(fleet, "notification-worker", "notification-worker", &common).await?;
    fleet.wait_intake().await?;
    for url in &intakes {
        fleet_harness::eventually("the intake answers", Duration::from_secs(30), || async {
            let answer = fleet.http.get(format!("{url}/healthz")).send().await.ok()?;
            answer.status().is_success().then_some(())
        })
        .await?;
    }
    fleet.product("warm", 1000, 20).await?;
    fleet.product("calm", 1000, options.units).await?;
    fleet.product("drop", 1000, options.units).await?;
    say(&format!(
        "a herd: {} buyers for {} units, {} at a time, through {} intake(s); stripe-sim at 100/s, 25/s on each operation",
        options.buyers, options.units, options.concurrency, options.intakes
    ));
    Ok((meter, intakes))
}

/// `buyers` buy `product` with good cards, `concurrency` at a time: the seconds until every
/// unit was promised and until every one was paid.
async fn sell(
    fleet: &Fleet,
    intakes: &[String],
    product: &str,
    buyers: usize,
    concurrency: usize,
) -> anyhow::Result<(f64, f64)> {
    ask(fleet, intakes, product, buyers, 0, concurrency).await;
    fleet.wait_settled(Duration::from_secs(600)).await?;
    sold_times(fleet, product).await
}

/// The latency of every `202`, in milliseconds.
fn accepted_ms(asked: &[Asked]) -> Vec<f64> {
    asked
        .iter()
        .flatten()
        .filter(|(status, _, _)| *status == 202)
        .map(|(_, _, took)| took.as_secs_f64() * 1000.0)
        .collect()
}

/// From the first order of `product` to its last promise, and to its last payment, in seconds.
async fn sold_times(fleet: &Fleet, product: &str) -> anyhow::Result<(f64, f64)> {
    let (promised, paid): (Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT EXTRACT(EPOCH FROM (max(created_at) - min(created_at)))::float8,
                EXTRACT(EPOCH FROM (max(updated_at) FILTER (WHERE status = 'paid') - min(created_at)))::float8
           FROM orders WHERE product_id = $1",
    )
    .bind(product)
    .fetch_one(&fleet.pool)
    .await?;
    Ok((promised.unwrap_or(f64::NAN), paid.unwrap_or(f64::NAN)))
}

/// `buyers` each ask once for a unit of `product`, `concurrency` at a time, through the
/// intakes in turn; among the first `returning × 4`, one in 20 pays with a card that declines
/// and one in 20 with a 3-D Secure card its buyer abandons.
async fn ask(
    fleet: &Fleet,
    intakes: &[String],
    product: &str,
    buyers: usize,
    returning: i32,
    concurrency: usize,
) -> Vec<Asked> {
    let returning = usize::try_from(returning).unwrap_or(0) * 4;
    futures::stream::iter(0..buyers)
        .map(|i| {
            let method = match i % 20 {
                7 if i < returning => "pm_card_chargeDeclined",
                13 if i < returning => "pm_card_threeDSecure2Required",
                _ => "pm_card_visa",
            };
            let url = &intakes[i % intakes.len()];
            buy(fleet, url, product, i, method, product)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// One buyer, `{who}-buyer-{i}`: asks, and again after a `503` or while its key is in flight.
pub(super) async fn buy(fleet: &Fleet, url: &str, product: &str, i: usize, method: &str, who: &str) -> Asked {
    let body = serde_json::json!({ "product_id": product, "quantity": 1, "payment_method": method });
    let token = fleet.token(&format!("{who}-buyer-{i}"));
    let mut asked = Vec::new();
    loop {
        let sent = Instant::now();
        let answer = fleet
            .http
            .post(format!("{url}/v1/orders"))
            .bearer_auth(&token)
            .header("idempotency-key", "k")
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        let Ok(answer) = answer else {
            asked.push((0, "unanswered".to_owned(), sent.elapsed()));
            return asked;
        };
        let status = answer.status().as_u16();
        let retry_after =
            answer.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let body = answer.json::<Value>().await.unwrap_or(Value::Null);
        let code = body["error"]["code"].as_str().unwrap_or_default().to_owned();
        let again = matches!(status, 503 | 429) || code == "idempotency_key_in_use";
        asked.push((status, code, sent.elapsed()));
        if !again || asked.len() >= 60 {
            return asked;
        }
        tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1).min(30))).await;
    }
}

/// The statements PostgreSQL ran for sold-out answers so far, from every intake's metrics:
/// the shared reads (`intake_sold_out_reads_total`) and the door statements that answered
/// closed (`intake_door_seconds_count{outcome="closed"}`: in a herd, `sold_out`).
pub(super) async fn sold_out_statements(fleet: &Fleet) -> f64 {
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
