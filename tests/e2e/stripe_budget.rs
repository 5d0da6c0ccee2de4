//! The fleet's Stripe budget (SPEC §3, §8.9) end to end: three intakes and three stock workers
//! (each with its sweeper), with the defaults, against a stripe-sim that limits as Stripe
//! does, per account and on each named operation, while processes leave and join.

use std::sync::Arc;
use std::time::{Duration, Instant};

use orderfleet_tests::Fleet;
use orderfleet_tests::audit::Audit;
use serde_json::Value;
use tokio::sync::RwLock;

/// Stripe's limits in live mode, and the fleet's defaults.
const ACCOUNT: u64 = 100;
const ENDPOINT: u64 = 25;

/// The intakes buyers go through: one is killed, another joins.
type Door = Arc<RwLock<Vec<String>>>;

/// One buyer, as a well-behaved client: through the intakes in turn, waiting as `Retry-After`
/// says after a `503` or a key in flight, and a second after a connection that failed (its
/// intake was killed). Returns the final status and the requests sent.
async fn buyer(http: reqwest::Client, token: String, door: Door, i: usize) -> (u16, u32) {
    let body = serde_json::json!({ "product_id": "drop", "quantity": 1, "payment_method": "pm_card_visa" });
    let mut sent = 0u32;
    loop {
        let url = {
            let urls = door.read().await;
            urls[(i + sent as usize) % urls.len()].clone()
        };
        sent += 1;
        let answer = http
            .post(format!("{url}/v1/orders"))
            .bearer_auth(&token)
            .header("idempotency-key", "k")
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        let Ok(answer) = answer else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let status = answer.status().as_u16();
        let retry_after: Option<u64> =
            answer.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
        let code = answer.json::<Value>().await.unwrap_or(Value::Null)["error"]["code"].clone();
        // A 503, a key in flight, the intake shedding load (429) or a request it timed out
        // (408): the same request again, after the wait it was told.
        let again = matches!(status, 503 | 429 | 408) || (status == 409 && code == "idempotency_key_in_use");
        if !again || sent >= 200 {
            return (status, sent);
        }
        tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1).min(60))).await;
    }
}

/// Waits (30 s at most) until this machine's CPUs are mostly idle over half a second. The drop
/// measures how fully the fleet uses Stripe's limit, and the suite runs it alone, but right
/// after the suite's longest tests: their fleets exiting, LocalStack deleting their queues and
/// PostgreSQL vacuuming after them can take a core for seconds. Three full runs of the suite
/// measured 17, 19 and ≥ 20 creates in the median second; the test alone, 21 and 22.
async fn machine_quiet() {
    let cpu = || -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let times: Vec<u64> =
            stat.lines().next()?.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
        let idle = times.get(3)? + times.get(4)?;
        Some((times.iter().sum::<u64>() - idle, times.iter().sum()))
    };
    let started = Instant::now();
    loop {
        let before = cpu();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (Some((busy0, total0)), Some((busy1, total1))) = (before, cpu()) else { return };
        let busy = (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;
        if busy < 0.3 || started.elapsed() > Duration::from_secs(30) {
            println!(
                "stripe-budget: the machine {:.0} % busy after {:.1} s",
                busy * 100.0,
                started.elapsed().as_secs_f64()
            );
            return;
        }
    }
}

/// Orders whose PaymentIntent is recorded, counted every 250 ms: when each count was reached.
async fn authorized_over_time(pool: sqlx::PgPool, units: i64, until: Duration) -> Vec<(Duration, i64)> {
    let started = Instant::now();
    let mut seen = Vec::new();
    while started.elapsed() < until {
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM orders WHERE payment_intent_id IS NOT NULL")
                .fetch_one(&pool)
                .await
                .unwrap_or(0);
        seen.push((started.elapsed(), count));
        if count >= units {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen
}

/// While units were being sold: from the tenth of `units` authorized to the last
/// authorization before the count first stood still for 3 s (or reached `units`), as (from,
/// to, authorized in between). What comes after such a stall is the orders a killed intake
/// held: they wait out the lease of the request it died in (65 s), as an order always does
/// when its intake dies mid-request, and no Stripe budget is asked for meanwhile.
fn selling(seen: &[(Duration, i64)], units: i64) -> (Duration, Duration, i64) {
    let from = seen.iter().position(|(_, count)| *count >= units / 10).expect("a tenth authorized");
    let mut last = from;
    for (i, (at, count)) in seen.iter().enumerate().skip(from + 1) {
        if *count > seen[last].1 {
            last = i;
        }
        if *count >= units || *at - seen[last].0 >= Duration::from_secs(3) {
            break;
        }
    }
    (seen[from].0, seen[last].0, seen[last].1 - seen[from].1)
}

/// It uses them, too, while one intake is killed and another joins.
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_keeps_to_stripe_s_limits_while_intakes_leave_and_join() {
    // Arrange: stripe-sim limits as Stripe's live mode does; three intakes, three stock
    // workers, the relay and the notification worker, all with the defaults.
    const BUYERS: usize = 2_000;
    const UNITS: i64 = 500;
    let mut fleet = Fleet::prepare("stripe-budget-fleet").await.unwrap();
    fleet.stripe_rate_limits(ACCOUNT as u32, ENDPOINT as u32).await.unwrap();
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    let second = fleet.spawn_intake("order-intake-2", &[]).unwrap();
    let third = fleet.spawn_intake("order-intake-3", &[]).unwrap();
    for i in 0..3 {
        fleet.spawn(&format!("stock-worker-{i}"), "stock-worker", &[]).unwrap();
    }
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.wait_intake().await.unwrap();
    for url in [&second, &third] {
        healthy(&fleet, url).await;
    }
    machine_quiet().await;
    fleet.product("drop", 1000, UNITS as i32).await.unwrap();
    let door: Door = Arc::new(RwLock::new(vec![fleet.intake_url.clone(), second, third]));

    // Act: every buyer at once; at 30 % of the units sold the first intake is SIGKILLed, and at
    // 50 % a fourth joins.
    let started = Instant::now();
    let buyers: Vec<_> = (0..BUYERS)
        .map(|i| tokio::spawn(buyer(fleet.http.clone(), fleet.token(&format!("buyer-{i}")), door.clone(), i)))
        .collect();
    let sampler = tokio::spawn(authorized_over_time(fleet.pool.clone(), UNITS, Duration::from_secs(240)));
    wait_for_authorized(&fleet, UNITS * 3 / 10).await;
    door.write().await.retain(|url| *url != fleet.intake_url);
    fleet.kill("order-intake").await.unwrap();
    wait_for_authorized(&fleet, UNITS / 2).await;
    let fourth = fleet.spawn_intake("order-intake-4", &[]).unwrap();
    healthy(&fleet, &fourth).await;
    door.write().await.push(fourth);
    let answers = futures::future::join_all(buyers).await;
    let seen = sampler.await.unwrap();
    fleet.wait_settled(Duration::from_secs(180)).await.unwrap();

    // Assert: no 429, no window over a limit, and the creates at 72 % of Stripe's 25 a second
    // in the median second while units were being sold ([`selling`]), over most of them. The
    // suite runs eight tests at once on two cores, and this fleet of eight processes shares
    // them: a run has measured 19 a second here, where `make bench BENCH_ARGS=--drop`, alone on
    // the machine, measures the rate itself (BENCHMARKS.md).
    let stats = fleet.stripe_stats().await.unwrap();
    assert_eq!(stats["rate_limited"], 0, "{stats}");
    assert!(stats["max_requests_in_one_second"].as_u64().unwrap() <= ACCOUNT, "{stats}");
    let by_endpoint = stats["max_requests_in_one_second_by_endpoint"].as_object().unwrap();
    assert!(by_endpoint.values().all(|n| n.as_u64().unwrap() <= ENDPOINT), "{stats}");
    let accepted = answers.iter().filter(|a| a.as_ref().is_ok_and(|(status, _)| *status == 202)).count();
    assert_eq!(accepted as i64, UNITS, "{:?}", started.elapsed());
    let (from, to, sold) = selling(&seen, UNITS);
    let rate = sold as f64 / (to - from).as_secs_f64();
    assert!(sold >= UNITS * 6 / 10, "units sold stood still early: {seen:?}");
    // Second by second while units sold: the typical second, which a dip while shares settle
    // (a process joining, one killed) does not hide.
    let mut seconds: Vec<i64> = seen
        .iter()
        .filter(|(at, _)| *at >= from && *at <= to)
        .collect::<Vec<_>>()
        .windows(5)
        .step_by(4)
        .map(|w| w[4].1 - w[0].1)
        .collect();
    seconds.sort_unstable();
    let median = seconds.get(seconds.len() / 2).copied().unwrap_or(0);
    let requests: u32 = answers.iter().filter_map(|a| a.as_ref().ok()).map(|(_, sent)| sent).sum();
    let per_second: Vec<i64> = seen.iter().step_by(4).map(|(_, count)| *count).collect();
    println!(
        "stripe-budget: creates {rate:.1}/s on average, {median}/s in the median second, for {sold} of {UNITS} units, from a tenth sold on; {} held by the killed intake's leases; {requests} intake requests from {BUYERS} buyers; stripe-sim {stats}; authorized, second by second: {per_second:?}",
        UNITS - seen[seen.iter().position(|(at, _)| *at == to).unwrap()].1
    );
    assert!(
        median >= 18,
        "creates ran at {median}/s in the median second ({rate:.1}/s on average): {seen:?}"
    );
    // The intake that joined got its part of the budget and authorized orders with it.
    let joined = fleet.metrics_url("order-intake-4").unwrap().to_owned();
    let text = fleet.http.get(joined).send().await.unwrap().text().await.unwrap();
    let by_operation = fleet_harness::metrics::sum_by_label(&[text], "stripe_requests_total", "operation");
    assert!(by_operation.get("authorize").copied().unwrap_or(0.0) > 0.0, "{by_operation:?}");
    let notes = fleet.notifications((UNITS * 2) as usize, Duration::from_secs(120)).await.unwrap();
    Audit::of(&fleet, "drop", &notes).await.unwrap().assert_guarantees();
    fleet.stop().await.unwrap();
}

async fn wait_for_authorized(fleet: &Fleet, n: i64) {
    fleet_harness::eventually("orders authorized", Duration::from_secs(120), || async {
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM orders WHERE payment_intent_id IS NOT NULL")
                .fetch_one(&fleet.pool)
                .await
                .ok()?;
        (count >= n).then_some(())
    })
    .await
    .unwrap();
}

async fn healthy(fleet: &Fleet, url: &str) {
    fleet_harness::eventually("the intake answers", Duration::from_secs(30), || async {
        let answer = fleet.http.get(format!("{url}/healthz")).send().await.ok()?;
        answer.status().is_success().then_some(())
    })
    .await
    .unwrap();
}

/// stripe-sim's `rate_limited` and `requests`, every 500 ms until `done` is set.
async fn stripe_counts_over_time(
    http: reqwest::Client,
    stripe_url: String,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<(Duration, u64, u64)> {
    let started = Instant::now();
    let mut seen = Vec::new();
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        if let Ok(answer) = http.get(format!("{stripe_url}/_sim/stats")).send().await
            && let Ok(stats) = answer.json::<Value>().await
        {
            let count = |k: &str| stats[k].as_u64().unwrap_or(0);
            seen.push((started.elapsed(), count("rate_limited"), count("requests")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    seen
}

/// Stripe lowers it; nothing is declined.
#[tokio::test(flavor = "multi_thread")]
async fn a_limit_lowered_mid_drop_slows_the_whole_fleet_within_seconds() {
    // Arrange: two intakes and two stock workers with the defaults, stripe-sim at Stripe's
    // live limits.
    const BUYERS: usize = 600;
    const UNITS: i64 = 150;
    let mut fleet = Fleet::prepare("stripe-budget-lowered").await.unwrap();
    fleet.stripe_rate_limits(ACCOUNT as u32, ENDPOINT as u32).await.unwrap();
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    let second = fleet.spawn_intake("order-intake-2", &[]).unwrap();
    for i in 0..2 {
        fleet.spawn(&format!("stock-worker-{i}"), "stock-worker", &[]).unwrap();
    }
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.wait_intake().await.unwrap();
    healthy(&fleet, &second).await;
    fleet.product("drop", 1000, UNITS as i32).await.unwrap();
    let door: Door = Arc::new(RwLock::new(vec![fleet.intake_url.clone(), second]));

    // Act: at a fifth of the units sold, Stripe lowers the account's limit on each operation
    // from 25 a second to 8.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let counts =
        tokio::spawn(stripe_counts_over_time(fleet.http.clone(), fleet.stripe_url.clone(), done.clone()));
    let started = Instant::now();
    let buyers: Vec<_> = (0..BUYERS)
        .map(|i| tokio::spawn(buyer(fleet.http.clone(), fleet.token(&format!("buyer-{i}")), door.clone(), i)))
        .collect();
    wait_for_authorized(&fleet, UNITS / 5).await;
    fleet.stripe_rate_limits(ACCOUNT as u32, 8).await.unwrap();
    let lowered = started.elapsed();
    let answers = futures::future::join_all(buyers).await;
    let statuses = fleet.wait_settled(Duration::from_secs(180)).await.unwrap();
    done.store(true, std::sync::atomic::Ordering::Release);
    let counts = counts.await.unwrap();

    // Assert: the 429s come in the seconds after the cut and then all but stop, however long
    // the drop goes on; every buyer who got a unit paid, and nobody was declined.
    let at =
        |t: Duration| counts.iter().rev().find(|(when, ..)| *when <= t).map_or((0, 0), |(_, l, r)| (*l, *r));
    let settled_from = lowered + Duration::from_secs(5);
    let (limited_then, requests_then) = at(settled_from);
    let (limited, requests) = at(Duration::MAX);
    println!(
        "stripe-budget-lowered: {limited} 429s in all, {limited_then} by 5 s after the cut; {requests} requests; {statuses:?}; {:?}",
        started.elapsed()
    );
    assert!(limited > 0, "the cut was never felt: {counts:?}");
    let late = (limited - limited_then) as f64 / (requests - requests_then).max(1) as f64;
    assert!(
        late <= 0.05,
        "{:.1} % of the requests after the fleet had 5 s to follow were 429s: {counts:?}",
        late * 100.0
    );
    let accepted = answers.iter().filter(|a| a.as_ref().is_ok_and(|(status, _)| *status == 202)).count();
    assert_eq!(accepted as i64, UNITS);
    assert_eq!(statuses.get("paid"), Some(&UNITS), "{statuses:?}");
    assert_eq!(statuses.get("payment_declined"), None, "{statuses:?}");
    let notes = fleet.notifications((UNITS * 2) as usize, Duration::from_secs(120)).await.unwrap();
    Audit::of(&fleet, "drop", &notes).await.unwrap().assert_guarantees();
    fleet.stop().await.unwrap();
}

/// One buyer bound to one intake, as a client: the same request again after a `503`, a key in
/// flight, a `429` or a `408`, after the `Retry-After` it was told (a second after a failed
/// connection). Returns the final status, and when it came, from `started`.
async fn bound_buyer(http: reqwest::Client, token: String, url: String, started: Instant) -> (u16, Duration) {
    let body = serde_json::json!({ "product_id": "drop", "quantity": 1, "payment_method": "pm_card_visa" });
    loop {
        let answer = http
            .post(format!("{url}/v1/orders"))
            .bearer_auth(&token)
            .header("idempotency-key", "k")
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        let Ok(answer) = answer else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let status = answer.status().as_u16();
        let retry_after: Option<u64> =
            answer.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
        let code = answer.json::<Value>().await.unwrap_or(Value::Null)["error"]["code"].clone();
        let again = matches!(status, 503 | 429 | 408) || (status == 409 && code == "idempotency_key_in_use");
        if !again || started.elapsed() > Duration::from_secs(180) {
            return (status, started.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1).min(60))).await;
    }
}

/// No buyer waits a minute for an answer.
#[tokio::test(flavor = "multi_thread")]
async fn six_intakes_at_a_limit_of_four_each_sell_within_a_minute() {
    // Arrange: six intakes and two stock workers, the fleet's limit on each operation 4 a
    // second and stripe-sim's too (as STRIPE_SIM_ENDPOINT_RATE_LIMIT=4 sets it), so more
    // intakes want creates than there are units of it: they must take turns. Fifteen buyers
    // are bound to each intake, a unit for each.
    const INTAKES: usize = 6;
    const BUYERS_EACH: usize = 15;
    const UNITS: i64 = (INTAKES * BUYERS_EACH) as i64;
    let mut fleet = Fleet::prepare("stripe-budget-six").await.unwrap();
    fleet.stripe_rate_limits(ACCOUNT as u32, 4).await.unwrap();
    fleet.set_env("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", "4");
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    let mut intakes = vec![fleet.intake_url.clone()];
    for i in 2..=INTAKES {
        intakes.push(fleet.spawn_intake(&format!("order-intake-{i}"), &[]).unwrap());
    }
    for i in 0..2 {
        fleet.spawn(&format!("stock-worker-{i}"), "stock-worker", &[]).unwrap();
    }
    fleet.spawn("outbox-relay", "outbox-relay", &[]).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &[]).unwrap();
    fleet.wait_intake().await.unwrap();
    for url in &intakes[1..] {
        healthy(&fleet, url).await;
    }
    fleet.product("drop", 1000, UNITS as i32).await.unwrap();

    // Act: every buyer at once, each through its own intake only.
    let started = Instant::now();
    let buyers: Vec<_> = (0..INTAKES * BUYERS_EACH)
        .map(|i| {
            let url = intakes[i % INTAKES].clone();
            tokio::spawn(bound_buyer(fleet.http.clone(), fleet.token(&format!("buyer-{i}")), url, started))
        })
        .collect();
    let answers: Vec<(u16, Duration)> =
        futures::future::join_all(buyers).await.into_iter().map(Result::unwrap).collect();
    let statuses = fleet.wait_settled(Duration::from_secs(180)).await.unwrap();

    // Assert: within the limit, every buyer of every intake sold to, and none waiting a minute
    // for its answer. (When each intake first sells follows its buyers' places in the line:
    // a buyer told to come back later by `Retry-After` asks for no turn meanwhile.)
    let stats = fleet.stripe_stats().await.unwrap();
    let by_intake: Vec<(usize, Duration, Duration)> = (0..INTAKES)
        .map(|n| {
            let mine: Vec<&(u16, Duration)> = answers.iter().skip(n).step_by(INTAKES).collect();
            let sold = mine.iter().filter(|(status, _)| *status == 202).count();
            let first = mine.iter().filter(|(status, _)| *status == 202).map(|(_, at)| *at).min();
            (sold, first.unwrap_or(Duration::MAX), mine.iter().map(|(_, at)| *at).max().unwrap())
        })
        .collect();
    println!(
        "stripe-budget-six: by intake (sold, first sale, last answer) {by_intake:?}; {statuses:?}; stripe-sim {stats}"
    );
    assert_eq!(stats["rate_limited"], 0, "{stats}");
    let by_endpoint = stats["max_requests_in_one_second_by_endpoint"].as_object().unwrap();
    assert!(by_endpoint.values().all(|n| n.as_u64().unwrap() <= 4), "{stats}");
    for (n, (sold, _, last)) in by_intake.iter().enumerate() {
        assert_eq!(*sold, BUYERS_EACH, "intake {n}: {by_intake:?}");
        assert!(*last <= Duration::from_secs(60), "intake {n}'s last buyer waited {last:?}: {by_intake:?}");
    }
    assert_eq!(statuses.get("paid"), Some(&UNITS), "{statuses:?}");
    let notes = fleet.notifications((UNITS * 2) as usize, Duration::from_secs(120)).await.unwrap();
    Audit::of(&fleet, "drop", &notes).await.unwrap().assert_guarantees();
    fleet.stop().await.unwrap();
}
