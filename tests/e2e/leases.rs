//! The lease on an order (`intake_lease_until`): whoever works on an order holds it, and may
//! give back only its own. A holder whose lease lapsed, and was taken by
//! another, must not clear the other's: a third would then take the order while the second
//! still works on it.

use std::time::Duration;

use fleet_harness::eventually;
use orderfleet::domain::records::order::Order;
use orderfleet::domain::steps::authorization;
use orderfleet::domain::steps::three_d_secure;
use orderfleet_payments::StripeConfig;
use orderfleet_payments::{PaymentError, Payments, RetryPolicy};
use orderfleet_runtime::config::Env;
use orderfleet_runtime::db::Pool;
use orderfleet_tests::TestDatabase;
use orderfleet_words::OrderId;

/// A lease that lapses at once, and one that lasts the test.
const MOMENT: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(600);

/// An order as the door leaves it, its lease already given back, in `status`.
async fn order_in(pool: &Pool, key: &str, status: &str) -> OrderId {
    let id = uuid::Uuid::now_v7();
    sqlx::query(
        "WITH promised AS (
             UPDATE products SET units_promised = units_promised + 1, last_position = last_position + 1
              WHERE id = 'sku-1' RETURNING last_position
         )
         INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity, amount_minor,
                             currency, payment_method, position, status, payment_intent_id, action_expires_at)
         SELECT $1, 'ola', $2, '\\x00', 'sku-1', 1, 1000, 'usd', 'pm_card_visa', last_position,
                $3::order_status, 'pi_' || $2, now() + interval '10 minutes'
           FROM promised",
    )
    .bind(id)
    .bind(key)
    .bind(status)
    .execute(pool)
    .await
    .unwrap();
    OrderId::from_uuid(id)
}

/// A holder takes the order's lease for a moment (`take`), and once it has lapsed, another
/// takes it for long; both as each took it.
async fn taken_twice<F, Fut>(take: F) -> (Order, Order)
where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = Option<Order>>,
{
    let first = take(MOMENT).await.expect("the first holder takes the lease");
    let second =
        eventually("the second holder takes the lapsed lease", Duration::from_secs(10), || take(LONG))
            .await
            .unwrap();
    (first, second)
}

/// A Stripe client that is never called: recording a saved 5xx asks Stripe nothing.
fn payments(pool: &orderfleet_runtime::db::Pool) -> Payments {
    let env =
        Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_leases"), ("STRIPE_API_BASE", "http://127.0.0.1:9")]);
    Payments::new(&StripeConfig::from_env(&env).unwrap(), RetryPolicy::default(), pool.clone()).unwrap()
}

/// A holder whose lease lapsed and was taken over by another.
#[tokio::test(flavor = "multi_thread")]
async fn a_lapsed_holder_gives_back_nothing_of_the_new_holder_s() {
    // Arrange: three orders, each taken for a moment by a first holder and, once that lapsed,
    // by a second: a pending one (the intake's request, then a retry or the sweeper), another
    // whose first holder's Stripe key answers a 5xx, and one awaiting 3-D Secure (the webhook,
    // then the sweeper).
    let db = TestDatabase::migrated().await.unwrap();
    let pool = &db.pool;
    sqlx::query("INSERT INTO products (id, name, price_minor, currency, units_total, stock) VALUES ('sku-1', 'Sku', 1000, 'usd', 5, 5)")
        .execute(pool)
        .await
        .unwrap();
    let pending = order_in(pool, "pending", "pending_authorization").await;
    let failed = order_in(pool, "failed", "pending_authorization").await;
    let waiting = order_in(pool, "waiting", "requires_action").await;
    let take_pending =
        |id| move |lease| async move { authorization::take_over(pool, id, lease).await.unwrap() };
    let (first_pending, _) = taken_twice(take_pending(pending)).await;
    let (first_failed, _) = taken_twice(take_pending(failed)).await;
    let (first_waiting, _) =
        taken_twice(|lease| async move { three_d_secure::take(pool, waiting, lease).await.unwrap() }).await;

    // Act: each first holder, late, gives back what it believes is its lease.
    authorization::release(pool, &first_pending).await.unwrap();
    let saved_500 = Err(PaymentError::AttemptFailed("HTTP 500 api_error".into()));
    let recorded = authorization::record(pool, &payments(pool), &first_failed, saved_500).await;
    assert!(recorded.is_err(), "a saved 5xx records no answer: {recorded:?}");
    three_d_secure::release(pool, &first_waiting).await.unwrap();

    // Assert: each second holder still holds its lease: nobody else can take the order.
    let mut given_away = Vec::new();
    if authorization::take_over(pool, pending, LONG).await.unwrap().is_some() {
        given_away.push("a pending order's, by the first holder's release");
    }
    if authorization::take_over(pool, failed, LONG).await.unwrap().is_some() {
        given_away.push("a pending order's, by the first holder's record of a saved 5xx");
    }
    if three_d_secure::take(pool, waiting, LONG).await.unwrap().is_some() {
        given_away.push("a 3-D Secure order's, by the first settler's release");
    }
    assert!(given_away.is_empty(), "the second holder's lease was given away: {given_away:?}");
    db.drop().await.unwrap();
}
