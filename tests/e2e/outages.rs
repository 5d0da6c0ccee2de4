//! The outage matrix (SPEC §8.10): each dependency — PostgreSQL, SQS, SNS, Stripe — taken
//! away in every shape an outage really takes ([`Shape`]: refused, reset, silent, frozen
//! mid-exchange, a failing TLS handshake, and for HTTP 5xx answers), for 25 s (longer than
//! three receives' backoff) while orders arrive. After each shape: every order the intake
//! accepted is paid, both DLQs are empty, nothing is captured or notified twice, and no
//! message was received more often than the outage allows: **an outage costs a message at
//! most one receive** (SPEC §8.10), so with `maxReceiveCount` 3 no good message can reach a
//! DLQ through outages alone. The workers do better than that bound: a message an outage
//! stops is held, not handed back, so it is received once — twice only when SQS itself is
//! away and loses its delete.
//!
//! One test per dependency and shape, each with a fleet of its own, so the suite runs them at
//! once, and one per dependency that takes it away twice on one fleet (frozen, then refused), so
//! a fleet is shown to come back whole from one outage into the next. Each outage prints a
//! `fault-matrix:` line (docs/failure-modes.md collects them), and
//! `every_shape_of_every_dependency_has_its_test` keeps the list whole.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use fleet_harness::proxy::{Proxy, Shape};
use orderfleet_tests::Fleet;
use orderfleet_tests::audit::Audit;
use serde_json::Value;

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(25);
/// Orders placed during each outage, spread over it.
const ORDERS_PER_OUTAGE: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dependency {
    Postgres,
    Sqs,
    Sns,
    Stripe,
}

impl Dependency {
    /// Every dependency; the match makes a new one a compile error here until it is listed.
    const ALL: [Dependency; 4] = {
        match Dependency::Postgres {
            Dependency::Postgres | Dependency::Sqs | Dependency::Sns | Dependency::Stripe => {}
        }
        [Dependency::Postgres, Dependency::Sqs, Dependency::Sns, Dependency::Stripe]
    };

    fn name(self) -> &'static str {
        match self {
            Dependency::Postgres => "postgres",
            Dependency::Sqs => "sqs",
            Dependency::Sns => "sns",
            Dependency::Stripe => "stripe",
        }
    }

    /// The most receives a message may take: one, as a held message is not handed out again;
    /// two when SQS itself is away, as a delete it lost lets the message come back once more.
    fn most_receives_allowed(self) -> u64 {
        if self == Dependency::Sqs { 2 } else { 1 }
    }

    /// Every shape but 5xx answers, which only an HTTP dependency gives.
    fn shapes(self) -> Vec<Shape> {
        Shape::ALL.into_iter().filter(|s| self != Dependency::Postgres || *s != Shape::ServerError).collect()
    }
}

fn socket_of(url: &str) -> SocketAddr {
    let authority = url.trim_start_matches("http://").split('/').next().unwrap_or_default();
    authority.replace("localhost", "127.0.0.1").parse().expect("http://HOST:PORT")
}

/// The fleet with `dependency` reached only through `proxy` by the processes that use it
/// (PostgreSQL: the two workers, so that messages keep coming to them while their database
/// is away; the intake and the relay reach it directly).
async fn fleet_behind(dependency: Dependency, name: &str) -> (Fleet, Proxy) {
    let case = format!("outage-matrix-{}-{name}", dependency.name());
    let mut fleet = Fleet::prepare(&case).await.unwrap();
    fleet.set_env("LOG_FORMAT", "json");
    let aws = orderfleet_tests::stack_var("AWS_ENDPOINT_URL");
    let db_url = fleet.db.url.clone();
    let db_authority = db_url.split('@').nth(1).and_then(|rest| rest.split('/').next()).unwrap().to_owned();
    let target = match dependency {
        Dependency::Postgres => socket_of(&format!("http://{db_authority}")),
        Dependency::Sqs | Dependency::Sns => socket_of(&aws),
        Dependency::Stripe => socket_of(&fleet.stripe_url),
    };
    let proxy = Proxy::start(target).await.unwrap();
    let proxied_db = db_url.replace(&db_authority, &proxy.addr.to_string());
    let through = proxy.url();
    // The SDK's service-specific endpoint variables take one service away and leave the other.
    type Settings<'a> = Vec<(&'a str, &'a str)>;
    let (relay, workers): (Settings, Settings) = match dependency {
        Dependency::Postgres => (vec![], vec![("DATABASE_URL", &proxied_db)]),
        Dependency::Sqs => {
            (vec![("AWS_ENDPOINT_URL_SQS", &through)], vec![("AWS_ENDPOINT_URL_SQS", &through)])
        }
        Dependency::Sns => (vec![], vec![("AWS_ENDPOINT_URL_SNS", &through)]),
        Dependency::Stripe => (vec![], vec![("STRIPE_API_BASE", &through)]),
    };
    fleet.spawn("order-intake", "order-intake", &[]).unwrap();
    fleet.spawn("outbox-relay", "outbox-relay", &relay).unwrap();
    fleet.spawn("stock-worker", "stock-worker", &workers).unwrap();
    fleet.spawn("notification-worker", "notification-worker", &workers).unwrap();
    (fleet, proxy)
}

/// Places an order; `None` when the intake answered `503 payment_unavailable` (Stripe away:
/// the buyer tries again later with the same key).
async fn place(fleet: &Fleet, user: &str, key: &str) -> Option<String> {
    let answered = || async { fleet.post_order(user, key, "sku-1", 1, "pm_card_visa").await.ok() };
    let answer =
        fleet_harness::eventually("the intake answering", Duration::from_secs(20), answered).await.unwrap();
    match answer.status {
        202 => Some(answer.body["order_id"].as_str().unwrap().to_owned()),
        503 => None,
        status => panic!("an order answered {status}: {:?}", answer.body),
    }
}

/// The most times any message was received, by the worker's log lines about messages
/// (`receive_count` on every settled message; JSON lines).
fn most_receives(log_dir: &Path, label: &str) -> u64 {
    let text = std::fs::read_to_string(log_dir.join(format!("{label}.log"))).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|line| line.get("receive_count").and_then(Value::as_u64))
        .max()
        .unwrap_or(0)
}

/// Messages in a queue, visible or in flight.
async fn dlq_depth(fleet: &Fleet, url: &str) -> u64 {
    let (visible, in_flight) = crate::faults::depth(fleet, url).await;
    visible + in_flight
}

/// Outages of `dependency` in each of `shapes`, one after another on one fleet of its own,
/// while orders arrive.
async fn outages_of(dependency: Dependency, shapes: &[Shape]) {
    // Arrange: the fleet behind the proxy, warmed up (pooled connections to be cut).
    let name = shapes.iter().map(|shape| shape.as_str()).collect::<Vec<_>>().join("-then-");
    let (fleet, proxy) = fleet_behind(dependency, &name).await;
    fleet.product("sku-1", 1000, (shapes.len() * (ORDERS_PER_OUTAGE + 1)) as i32).await.unwrap();
    let mut accepted = Vec::new();
    for (n, &shape) in shapes.iter().enumerate() {
        let case = format!("{} {}", dependency.name(), shape.as_str());
        let started = Instant::now();
        accepted.extend(place(&fleet, "warm", &format!("{}-warm", shape.as_str())).await);
        fleet.wait_settled(Duration::from_secs(120)).await.unwrap();
        // Each outage starts from quiet queues. Settled orders can still have messages in
        // flight (a notification being published, a delete on its way); an outage that cuts
        // one's delete sends it round again after its visibility timeout, and if that is when
        // the next outage begins, one message meets two outages (seen once: a third receive,
        // at the server-error shape, of a notification whose delete tls-fails cut).
        fleet.wait_drained(Duration::from_secs(120)).await.unwrap();

        // Act: take it away while orders arrive, then bring it back.
        proxy.take_away(shape);
        let outage_began = Instant::now();
        let mut unanswered = Vec::new();
        for i in 0..ORDERS_PER_OUTAGE {
            let due = outage_began + OUTAGE.mul_f64(i as f64 / ORDERS_PER_OUTAGE as f64);
            tokio::time::sleep_until(due.into()).await;
            let buyer = format!("buyer-{n}-{i}");
            match place(&fleet, &buyer, "key").await {
                Some(order) => accepted.push(order),
                None => unanswered.push(buyer),
            }
        }
        tokio::time::sleep_until((outage_began + OUTAGE).into()).await;
        proxy.restore();
        // The buyers who heard 503 try again with their key, as a client does (the sweeper
        // would finish their orders too, after its 90 s).
        for buyer in unanswered {
            let (answer, _) =
                fleet.post_order(&buyer, "key", "sku-1", 1, "pm_card_visa").retrying().await.unwrap();
            assert_eq!(answer.status, 202, "{buyer}'s retry after the outage: {:?}", answer.body);
            accepted.push(answer.body["order_id"].as_str().unwrap().to_owned());
        }
        let settled = fleet.wait_settled(Duration::from_secs(180)).await;

        // Assert, after each outage: nothing unsettled, nothing dead-lettered, no message
        // received more often than the outage allows.
        settled.unwrap_or_else(|e| panic!("{case}: {e:#}"));
        let dead = (
            dlq_depth(&fleet, &fleet.stock.dlq_url).await,
            dlq_depth(&fleet, &fleet.notification.dlq_url).await,
        );
        let receives = (
            most_receives(fleet.log_dir(), "stock-worker"),
            most_receives(fleet.log_dir(), "notification-worker"),
        );
        println!(
            "fault-matrix: {case}: most receives per message stock={} notification={}, dead letters stock={} notification={}, {:.0} s",
            receives.0,
            receives.1,
            dead.0,
            dead.1,
            started.elapsed().as_secs_f64()
        );
        assert_eq!(dead, (0, 0), "{case}: a good message was dead-lettered");
        let allowed = dependency.most_receives_allowed();
        assert!(
            receives.0 <= allowed && receives.1 <= allowed,
            "{case}: a message was received more than {allowed} times: {receives:?}"
        );
    }

    // Assert: every accepted order paid, once; every notification once.
    let notes = fleet.notifications(2 * accepted.len(), Duration::from_secs(120)).await.unwrap();
    let audit = Audit::of(&fleet, "sku-1", &notes).await.unwrap();
    println!("{}", audit.figures(&format!("outage-matrix-{}-{name}", dependency.name()), shapes.len()));
    audit.assert_guarantees();
    for order in &accepted {
        let status: String = sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1::uuid")
            .bind(order)
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
        assert_eq!(status, "paid", "{} {name}: accepted order {order}", dependency.name());
    }
    drop(proxy);
    fleet.stop().await.unwrap();
}

/// A test per dependency and shape: `name: Dependency, Shape;`.
macro_rules! outage_tests {
    ($($name:ident: $dependency:ident, $shape:ident;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                outages_of(Dependency::$dependency, &[Shape::$shape]).await;
            }
        )*

        /// The tests above cover every shape of every dependency ([`Dependency::shapes`]).
        #[test]
        fn every_shape_of_every_dependency_has_its_test() {
            let tested = [$((Dependency::$dependency, Shape::$shape)),*];
            for dependency in Dependency::ALL {
                for shape in dependency.shapes() {
                    assert!(tested.contains(&(dependency, shape)), "no test of {} {}", dependency.name(), shape.as_str());
                }
            }
        }
    };
}

outage_tests! {
    postgres_refused_costs_no_message_more_than_one_receive: Postgres, Refused;
    postgres_reset_costs_no_message_more_than_one_receive: Postgres, Reset;
    postgres_blackhole_costs_no_message_more_than_one_receive: Postgres, Blackhole;
    postgres_frozen_costs_no_message_more_than_one_receive: Postgres, Frozen;
    postgres_tls_fails_costs_no_message_more_than_one_receive: Postgres, TlsFails;
    sqs_refused_costs_no_message_more_than_one_receive: Sqs, Refused;
    sqs_reset_costs_no_message_more_than_one_receive: Sqs, Reset;
    sqs_blackhole_costs_no_message_more_than_one_receive: Sqs, Blackhole;
    sqs_frozen_costs_no_message_more_than_one_receive: Sqs, Frozen;
    sqs_tls_fails_costs_no_message_more_than_one_receive: Sqs, TlsFails;
    sqs_5xx_costs_no_message_more_than_one_receive: Sqs, ServerError;
    sns_refused_costs_no_message_more_than_one_receive: Sns, Refused;
    sns_reset_costs_no_message_more_than_one_receive: Sns, Reset;
    sns_blackhole_costs_no_message_more_than_one_receive: Sns, Blackhole;
    sns_frozen_costs_no_message_more_than_one_receive: Sns, Frozen;
    sns_tls_fails_costs_no_message_more_than_one_receive: Sns, TlsFails;
    sns_5xx_costs_no_message_more_than_one_receive: Sns, ServerError;
    stripe_refused_costs_no_message_more_than_one_receive: Stripe, Refused;
    stripe_reset_costs_no_message_more_than_one_receive: Stripe, Reset;
    stripe_blackhole_costs_no_message_more_than_one_receive: Stripe, Blackhole;
    stripe_frozen_costs_no_message_more_than_one_receive: Stripe, Frozen;
    stripe_tls_fails_costs_no_message_more_than_one_receive: Stripe, TlsFails;
    stripe_5xx_costs_no_message_more_than_one_receive: Stripe, ServerError;
}

/// A second outage on the fleet that lived through a first: the processes come back from a
/// frozen connection (pooled connections left hanging) and then from a refused one, with the
/// same guarantees after each.
macro_rules! second_outage_tests {
    ($($name:ident: $dependency:ident;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                outages_of(Dependency::$dependency, &[Shape::Frozen, Shape::Refused]).await;
            }
        )*
    };
}

second_outage_tests! {
    postgres_away_twice_costs_no_message_more_than_one_receive: Postgres;
    sqs_away_twice_costs_no_message_more_than_one_receive: Sqs;
    sns_away_twice_costs_no_message_more_than_one_receive: Sns;
    stripe_away_twice_costs_no_message_more_than_one_receive: Stripe;
}
