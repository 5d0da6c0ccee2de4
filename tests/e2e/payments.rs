//! The Stripe client against stripe-sim in this process: what it costs Stripe's front door.

use std::sync::Arc;
use std::time::Duration;

use orderfleet_payments::StripeConfig;
use orderfleet_payments::{AuthorizeRequest, Payments, RetryPolicy};
use orderfleet_runtime::config::Env;
use orderfleet_words::hold::OrderIntent;
use orderfleet_words::{Currency, Money, OrderId, UserId};

/// Every Stripe request on a new connection is a TLS handshake on real Stripe: tens to ~150 ms
/// of latency and a millisecond of CPU each. async-stripe's own client keeps no idle
/// connection (`pool_max_idle_per_host(0)`); the fleet's keeps them.
#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_stripe_requests_open_at_most_five_connections() {
    // Arrange
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let sim = Arc::new(stripe_sim::Simulator::new());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(stripe_sim::serve_with(sim.clone(), listener, async {
        let _ = stopped.await;
    }));
    let env =
        Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_connections"), ("STRIPE_API_BASE", base.as_str())]);
    let once = RetryPolicy { attempts: 1, timeout: Duration::from_secs(5), ..RetryPolicy::default() };
    let db = orderfleet_tests::TestDatabase::migrated().await.unwrap();
    let payments = Payments::new(&StripeConfig::from_env(&env).unwrap(), once, db.pool.clone()).unwrap();

    // Act: one after another, as a worker's requests come.
    for i in 0..100 {
        let _ = payments.retrieve(&format!("pi_missing_{i}")).await;
    }

    // Assert
    assert_eq!(sim.stats().requests, 100);
    assert!(sim.connections() <= 5, "{} connections for 100 requests", sim.connections());
    let _ = stop.send(());
    db.drop().await.unwrap();
}

/// Stripe answers `429 lock_timeout` when another request, or its own processing, holds the
/// object (docs.stripe.com/rate-limits#object-lock-timeouts): that request is retried, and the
/// fleet is not slowed for it, as it is for a `rate_limit`.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_timeout_is_retried_and_slows_no_budget() {
    // Arrange: a hold made; its next two captures meet a held intent.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let sim = Arc::new(stripe_sim::Simulator::new());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(stripe_sim::serve_with(sim.clone(), listener, async {
        let _ = stopped.await;
    }));
    let env =
        Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_lock_timeout"), ("STRIPE_API_BASE", base.as_str())]);
    let db = orderfleet_tests::TestDatabase::migrated().await.unwrap();
    let payments =
        Payments::new(&StripeConfig::from_env(&env).unwrap(), RetryPolicy::default(), db.pool.clone())
            .unwrap();
    let order_id = OrderId::new();
    let amount = Money { minor: 1000, currency: Currency::parse("usd").unwrap() };
    let user = UserId::parse("lee").unwrap();
    let request = AuthorizeRequest {
        order_id,
        attempt: 1,
        user_id: &user,
        amount: &amount,
        payment_method: "pm_card_visa",
    };
    let hold = payments.authorize(&request).await.unwrap();
    let armed = reqwest::Client::new()
        .post(format!("{base}/_sim/faults"))
        .json(&serde_json::json!({"operation": "capture", "mode": "lock_timeout", "count": 2}))
        .send()
        .await
        .unwrap();
    assert!(armed.status().is_success(), "{}", armed.text().await.unwrap());

    // Act
    let captured = payments.capture(OrderIntent { order_id, attempt: 1, id: &hold.id }).await;

    // Assert: the same capture went again until it took (one create, three captures), and the
    // budget ticked after it without a cut: no slowdown recorded for any operation (before
    // the fix, the two 429s halved the capture's limit for the whole fleet).
    assert!(captured.is_ok(), "{captured:?}");
    assert_eq!(sim.stats().requests, 4);
    let after: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT clock_timestamp()").fetch_one(&db.pool).await.unwrap();
    fleet_harness::eventually("the budget ticked after the capture", Duration::from_secs(10), || async {
        let ticked: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM stripe_budget_members WHERE updated_at > $1)")
                .bind(after)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        ticked.then_some(())
    })
    .await
    .unwrap();
    let cuts: Vec<(String, f64)> = sqlx::query_as("SELECT endpoint, factor FROM stripe_budget_slowdowns")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(cuts, [], "a lock_timeout slowed the fleet");
    let _ = stop.send(());
    db.drop().await.unwrap();
}
