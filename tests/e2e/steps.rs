//! The stock worker's step driven in process, without SQS: `StockCheck::handle_one` and
//! `Fulfilment::advance` against a database of the test's own and an in-process stripe-sim,
//! each order placed through the intake's own code (`Intake::place`).
//! What the step returns is the message's outcome as the consumer settles it (delete, come
//! back, pause, DLQ), so these tests pin each classification where it is made.

use std::time::Duration;

use order_intake::orders::{Intake, Placed};
use order_intake::request::{IdempotencyKey, OrderRequest};
use orderfleet::domain::OrderId;
use orderfleet::domain::fulfilment::Fulfilment;
use orderfleet::domain::outbox::{Envelope, EventType};
use orderfleet::domain::payments::{Payments, RetryPolicy};
use orderfleet::domain::tokens::UserId;
use orderfleet::runtime::config::{Env, StripeConfig};
use orderfleet::runtime::failure::{Kind, Source};
use orderfleet::runtime::trace::Trace;
use orderfleet_tests::TestDatabase;
use stock_worker::StockCheck;
use uuid::Uuid;

/// A database, stripe-sim in this process, and the step over both.
struct Step {
    db: TestDatabase,
    stripe_base: String,
    step: StockCheck,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn payments(api_base: &str) -> Payments {
    let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_steps"), ("STRIPE_API_BASE", api_base)]);
    let quick = RetryPolicy { attempts: 2, timeout: Duration::from_secs(2), ..RetryPolicy::default() };
    Payments::new(&StripeConfig::from_env(&env).unwrap(), quick).unwrap()
}

impl Step {
    async fn new() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stripe_base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(stripe_sim::serve(listener, async {
            let _ = stopped.await;
        }));
        let db = TestDatabase::migrated().await.unwrap();
        sqlx::query("INSERT INTO products (id, name, price_minor, currency, units_total, stock) VALUES ('sku-1', 'Sku', 1000, 'usd', 5, 5)")
            .execute(&db.pool)
            .await
            .unwrap();
        let fulfilment = Fulfilment { pool: db.pool.clone(), payments: payments(&stripe_base) };
        Self { db, stripe_base, step: StockCheck::new(fulfilment, 1), _stop: stop }
    }

    /// An order placed through the intake's own code (the door, the authorization at
    /// stripe-sim, the commit with its outbox rows), as a `202` leaves it: `stock_reserved`, its commit having taken the units.
    async fn authorized_order(&self, user: &str) -> Uuid {
        let intake = Intake {
            pool: &self.db.pool,
            payments: &self.step.fulfilment.payments,
            lease: Duration::from_secs(30),
            declines_per_hour: 0,
            traceparent: &Trace::random().traceparent(),
        };
        let request = OrderRequest::parse(
            br#"{"product_id": "sku-1", "quantity": 1, "payment_method": "pm_card_visa"}"#,
        )
        .unwrap();
        let key = IdempotencyKey::parse("key-1").unwrap();
        match intake.place(&UserId::parse(user).unwrap(), &key, &request).await.unwrap() {
            Placed::Accepted { body, replayed: false } => body.order_id.as_uuid(),
            other => panic!("the intake did not accept the order: {other:?}"),
        }
    }

    async fn status(&self, id: Uuid) -> String {
        sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn captures(&self) -> u64 {
        let ledger: serde_json::Value = reqwest::get(format!("{}/_sim/payment_intents", self.stripe_base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ledger["data"].as_array().unwrap().iter().map(|i| i["capture_count"].as_u64().unwrap()).sum()
    }
}

fn stock_check(order_id: Uuid, event_type: EventType) -> String {
    serde_json::to_string(&Envelope {
        message_id: Uuid::now_v7(),
        event_type,
        order_id: OrderId::from_uuid(order_id),
        occurred_at: chrono::Utc::now(),
        payload: serde_json::json!({}),
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stock_check_pays_its_order_and_a_duplicate_delivery_is_ok_without_a_second_capture() {
    // Arrange
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;
    let body = stock_check(order, EventType::StockCheckRequested);

    // Act
    let first = step.step.handle_one(&body).await;
    let duplicate = step.step.handle_one(&body).await;

    // Assert
    assert_eq!((first, duplicate), (Ok(()), Ok(())));
    assert_eq!(step.status(order).await, "paid");
    assert_eq!(step.captures().await, 1);
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_stock_step_cannot_use_is_a_permanent_failure_of_the_message() {
    // Arrange
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;

    // Act
    let unreadable = step.step.handle_one("not json").await.unwrap_err();
    let misrouted = step.step.handle_one(&stock_check(order, EventType::OrderPaid)).await.unwrap_err();
    let unknown =
        step.step.handle_one(&stock_check(Uuid::now_v7(), EventType::StockCheckRequested)).await.unwrap_err();

    // Assert: each is for a person (the DLQ), says where it failed, and touched nothing.
    for (failure, code) in
        [(&unreadable, "not_an_envelope"), (&misrouted, "unknown_event_type"), (&unknown, "unknown_order")]
    {
        assert_eq!(
            (failure.kind, failure.source, failure.code.as_str()),
            (Kind::Permanent, Source::Message, code)
        );
    }
    // As the intake left it: its commit took the units (nothing was cut).
    assert_eq!(step.status(order).await, "stock_reserved");
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_stripe_unreachable_advancing_is_an_outage_and_the_order_waits_reserved_for_the_next_try() {
    // Arrange: the order is authorized; the step's Stripe is a port nobody listens on.
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;
    let unreachable = Fulfilment {
        pool: step.db.pool.clone(),
        payments: payments(&format!("http://127.0.0.1:{}", fleet_harness::free_port())),
    };

    // Act
    let cut = unreachable.advance(OrderId::from_uuid(order)).await.unwrap_err();
    let status_meanwhile = step.status(order).await;
    let resumed = step.step.fulfilment.advance(OrderId::from_uuid(order)).await;

    // Assert: an outage (the worker pauses and probes), the units kept, then paid once.
    assert_eq!((cut.kind, cut.source), (Kind::Outage, Source::Stripe), "{cut}");
    assert_eq!(status_meanwhile, "stock_reserved");
    assert_eq!(resumed, Ok(()));
    assert_eq!(step.status(order).await, "paid");
    assert_eq!(step.captures().await, 1);
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_database_unreachable_advancing_is_an_outage_of_the_database() {
    // Arrange: a pool that points at a port nobody listens on.
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;
    let url = format!("postgres://nobody@127.0.0.1:{}/none", fleet_harness::free_port());
    let config = orderfleet::runtime::config::DatabaseConfig::from_env(&Env::from_pairs([(
        "DATABASE_URL",
        url.as_str(),
    )]))
    .unwrap();
    let size =
        orderfleet::runtime::db::PoolSize { acquire_timeout: Duration::from_secs(1), ..Default::default() };
    let unreachable = Fulfilment {
        pool: orderfleet::runtime::db::connect_lazy(&config, size).unwrap(),
        payments: payments(&step.stripe_base),
    };

    // Act
    let cut = unreachable.advance(OrderId::from_uuid(order)).await.unwrap_err();

    // Assert
    assert_eq!((cut.kind, cut.source), (Kind::Outage, Source::Database), "{cut}");
    assert_eq!(step.status(order).await, "stock_reserved");
    step.db.drop().await.unwrap();
}

/// A PaymentIntent holding funds, made at stripe-sim for `order` outside the fleet's keys: the
/// intent a second holder of the order's authorization (or a stray) would have made.
async fn hold_made_elsewhere(stripe_base: &str, order: Uuid) -> String {
    let made = fleet_harness::hold_at_stripe(&reqwest::Client::new(), stripe_base, order).await.unwrap();
    assert_eq!(made["status"], "requires_capture", "{made}");
    made["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hold_whose_commit_finds_the_order_moved_on_to_another_intent_is_cancelled() {
    // Arrange: an order accepted on its PaymentIntent; a second holder of its authorization
    // (its lease lapsed under it) made another for it, and records it with the order as it
    // last read it, pending (issue 35, point 6).
    use orderfleet::domain::authorization::{self, Recorded};
    use orderfleet::domain::payments::IntentStatus;
    let step = Step::new().await;
    let id = step.authorized_order("ola").await;
    let payments = &step.step.fulfilment.payments;
    let mut stale =
        orderfleet::domain::order::load(&step.db.pool, OrderId::from_uuid(id)).await.unwrap().unwrap();
    let own = stale.payment_intent_id.clone().unwrap();
    stale.status = orderfleet::domain::order::OrderStatus::PendingAuthorization;
    let other = payments.retrieve(&hold_made_elsewhere(&step.stripe_base, id).await).await.unwrap();

    // Act
    let recorded = authorization::record(&step.db.pool, payments, &stale, Ok(other.clone())).await.unwrap();

    // Assert: nothing recorded, and the hold that is not the order's released; the order's kept.
    assert!(matches!(recorded, Recorded::MovedElsewhere), "{recorded:?}");
    assert_eq!(payments.retrieve(&other.id).await.unwrap().status, IntentStatus::Canceled);
    assert_eq!(payments.retrieve(&own).await.unwrap().status, IntentStatus::RequiresCapture);
}
