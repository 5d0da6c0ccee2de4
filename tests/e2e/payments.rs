//! The Stripe client against stripe-sim in this process: what it costs Stripe's front door.

use std::sync::Arc;
use std::time::Duration;

use orderfleet::domain::payments::{Payments, RetryPolicy};
use orderfleet::runtime::config::{Env, StripeConfig};

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
