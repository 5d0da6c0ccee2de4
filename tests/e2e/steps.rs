//! The stock worker's step driven in process, without SQS: `StockCheck::handle_one` and
//! `Fulfilment::advance` against a database of the test's own and an in-process stripe-sim,
//! each order placed through the intake's own code (`Intake::place`).
//! What the step returns is the message's outcome as the consumer settles it (delete, come
//! back, pause, DLQ), so these tests pin each classification where it is made.

use std::time::Duration;

use order_intake::orders::{Intake, Placed};
use order_intake::request::{IdempotencyKey, OrderRequest};
use orderfleet::domain::records::outbox::{Envelope, EventType};
use orderfleet::domain::steps::fulfilment::Fulfilment;
use orderfleet_payments::StripeConfig;
use orderfleet_payments::{Payments, RetryPolicy};
use orderfleet_runtime::config::Env;
use orderfleet_runtime::failure::{Kind, Source};
use orderfleet_runtime::trace::Trace;
use orderfleet_tests::TestDatabase;
use orderfleet_words::OrderId;
use orderfleet_words::UserId;
use stock_worker::StockCheck;
use uuid::Uuid;

/// A database, stripe-sim in this process, and the step over both.
struct Step {
    db: TestDatabase,
    stripe_base: String,
    step: StockCheck,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn payments(pool: &orderfleet_runtime::db::Pool, api_base: &str) -> Payments {
    let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_steps"), ("STRIPE_API_BASE", api_base)]);
    let quick = RetryPolicy { attempts: 2, timeout: Duration::from_secs(2), ..RetryPolicy::default() };
    Payments::new(&StripeConfig::from_env(&env).unwrap(), quick, pool.clone()).unwrap()
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
        let fulfilment = Fulfilment { pool: db.pool.clone(), payments: payments(&db.pool, &stripe_base) };
        Self { db, stripe_base, step: StockCheck::new(fulfilment, 1), _stop: stop }
    }

    /// An order placed through the intake's own code (the door, the authorization at
    /// stripe-sim, the commit with its outbox rows), as a `202` leaves it: `stock_reserved`, its commit having taken the units.
    async fn authorized_order(&self, user: &str) -> Uuid {
        match self.place(user, "key-1").await.unwrap() {
            Placed::Accepted { body, replayed: false } => body.order_id.as_uuid(),
            other => panic!("the intake did not accept the order: {other:?}"),
        }
    }

    /// The order's status and `failure_reason`, as written.
    async fn ended(&self, id: Uuid) -> (String, String) {
        sqlx::query_as("SELECT status::text, failure_reason FROM orders WHERE id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn status(&self, id: Uuid) -> String {
        sqlx::query_scalar("SELECT status::text FROM orders WHERE id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn captures(&self) -> u64 {
        self.ledger().await.iter().map(|i| i["capture_count"].as_u64().unwrap()).sum()
    }

    /// Every intent at stripe-sim, with its request counts (`GET /_sim/payment_intents`).
    async fn ledger(&self) -> Vec<serde_json::Value> {
        let ledger: serde_json::Value = reqwest::get(format!("{}/_sim/payment_intents", self.stripe_base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ledger["data"].as_array().unwrap().clone()
    }

    /// The PaymentIntent the order recorded.
    async fn own_intent(&self, id: Uuid) -> String {
        let order = orderfleet::domain::records::order::load(&self.db.pool, OrderId::from_uuid(id))
            .await
            .unwrap()
            .unwrap();
        order.payment_intent_id.unwrap()
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

/// A duplicate delivery is ok, with no second capture.
#[tokio::test(flavor = "multi_thread")]
async fn a_stock_check_pays_its_order_once_however_often_it_comes() {
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

/// The order waits, reserved, for the next try.
#[tokio::test(flavor = "multi_thread")]
async fn with_stripe_unreachable_advancing_is_an_outage_of_stripe() {
    // Arrange: the order is authorized; the step's Stripe is a port nobody listens on.
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;
    let unreachable = Fulfilment {
        pool: step.db.pool.clone(),
        payments: payments(&step.db.pool, &format!("http://127.0.0.1:{}", fleet_harness::free_port())),
    };

    // Act
    let cut = unreachable.advance(OrderId::from_uuid(order)).await.outcome().unwrap_err();
    let status_meanwhile = step.status(order).await;
    let resumed = step.step.fulfilment.advance(OrderId::from_uuid(order)).await.outcome();

    // Assert: an outage (the worker pauses and probes), the units kept, then paid once.
    assert_eq!((cut.kind, cut.source), (Kind::Outage, orderfleet_payments::STRIPE), "{cut}");
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
    let config = orderfleet_runtime::config::DatabaseConfig::from_env(&Env::from_pairs([(
        "DATABASE_URL",
        url.as_str(),
    )]))
    .unwrap();
    let size =
        orderfleet_runtime::db::PoolSize { acquire_timeout: Duration::from_secs(1), ..Default::default() };
    let unreachable = Fulfilment {
        pool: orderfleet_runtime::db::connect_lazy(&config, size).unwrap(),
        payments: payments(&step.db.pool, &step.stripe_base),
    };

    // Act
    let cut = unreachable.advance(OrderId::from_uuid(order)).await.outcome().unwrap_err();

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

/// Its commit finds the order on another intent.
#[tokio::test(flavor = "multi_thread")]
async fn a_hold_whose_order_moved_on_to_another_intent_is_cancelled() {
    // Arrange: an order accepted on its PaymentIntent; a second holder of its authorization
    // (its lease lapsed under it) made another for it, and records it with the order as it
    // last read it, pending.
    use orderfleet::domain::steps::authorization::{self, Recorded};
    use orderfleet_payments::IntentStatus;
    let step = Step::new().await;
    let id = step.authorized_order("ola").await;
    let payments = &step.step.fulfilment.payments;
    let mut stale = orderfleet::domain::records::order::load(&step.db.pool, OrderId::from_uuid(id))
        .await
        .unwrap()
        .unwrap();
    let own = stale.payment_intent_id.clone().unwrap();
    stale.status = orderfleet::domain::words::status::OrderStatus::PendingAuthorization;
    let other = payments.retrieve(&hold_made_elsewhere(&step.stripe_base, id).await).await.unwrap();

    // Act
    let recorded = authorization::record(&step.db.pool, payments, &stale, Ok(other.clone())).await.unwrap();

    // Assert: nothing recorded, and the hold that is not the order's released; the order's kept.
    assert!(matches!(recorded, Recorded::MovedElsewhere), "{recorded:?}");
    assert_eq!(payments.retrieve(&other.id).await.unwrap().status, IntentStatus::Canceled);
    assert_eq!(payments.retrieve(&own).await.unwrap().status, IntentStatus::RequiresCapture);
}

/// Arms a fault at the step's stripe-sim (`POST /_sim/faults`).
async fn arm(stripe_base: &str, operation: &str, mode: &str, count: u32) {
    let armed = reqwest::Client::new()
        .post(format!("{stripe_base}/_sim/faults"))
        .json(&serde_json::json!({ "operation": operation, "mode": mode, "count": count }))
        .send()
        .await
        .unwrap();
    assert!(armed.status().is_success(), "{}", armed.text().await.unwrap());
}

impl Step {
    /// The intake's own code: one unit of `sku-1` for `user` under `key`, paid with `pm_card_visa`.
    async fn place(&self, user: &str, key: &str) -> Result<Placed, order_intake::error::ApiError> {
        self.place_with(user, key, "pm_card_visa").await
    }

    /// [`Step::place`], paid with `method`.
    async fn place_with(
        &self,
        user: &str,
        key: &str,
        method: &str,
    ) -> Result<Placed, order_intake::error::ApiError> {
        let intake = Intake {
            pool: &self.db.pool,
            payments: &self.step.fulfilment.payments,
            lease: Duration::from_secs(30),
            declines_per_hour: 0,
            traceparent: &Trace::random().traceparent(),
            sold_out_reads: &std::sync::Arc::default(),
        };
        let body = serde_json::json!({"product_id": "sku-1", "quantity": 1, "payment_method": method});
        let request = OrderRequest::parse(body.to_string().as_bytes()).unwrap();
        intake.place(&UserId::parse(user).unwrap(), &IdempotencyKey::parse(key).unwrap(), &request).await
    }

    /// Every intent at stripe-sim: (id, status, `metadata[order_id]`).
    async fn intents(&self) -> Vec<(String, String, String)> {
        let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
        self.ledger()
            .await
            .iter()
            .map(|i| (text(&i["id"]), text(&i["status"]), text(&i["metadata"]["order_id"])))
            .collect()
    }

    async fn order_id_of(&self, user: &str) -> Uuid {
        sqlx::query_scalar("SELECT id FROM orders WHERE user_id = $1")
            .bind(user)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }
}

/// Once the intent holds, the order is authorized.
#[tokio::test(flavor = "multi_thread")]
async fn an_intent_found_mid_confirm_leaves_its_order_pending_not_declined() {
    // Arrange: Stripe is slow: the create runs, but for a few seconds its intent reads
    // `requires_payment_method` with no error (its confirm not ended), and neither of the
    // intake's tries is answered.
    let step = Step::new().await;
    arm(&step.stripe_base, "create", "slow_confirm", 2).await;
    let first = step.place("ola", "key-1").await;
    assert!(first.is_err(), "the tries were not answered: {first:?}");
    let order = step.order_id_of("ola").await;

    // Act: the buyer retries at once; the lookup finds the intent mid-confirm.
    let retried = step.place("ola", "key-1").await;
    let meanwhile = step.status(order).await;

    // Assert: not declined (before the fix: `402`, `payment_declined`, and the hold that the
    // confirm then placed was left on the card of a buyer told no).
    assert!(retried.is_err(), "the order is not settled yet: {retried:?}");
    assert_eq!(meanwhile, "pending_authorization");

    // And once the intent holds funds, a retry records it: one intent, the order's, accepted.
    let settled = fleet_harness::eventually(
        "the order to be authorized on its one intent",
        Duration::from_secs(60),
        || async { matches!(step.place("ola", "key-1").await, Ok(Placed::Accepted { .. })).then_some(()) },
    )
    .await;
    settled.unwrap();
    let intents = step.intents().await;
    assert_eq!(intents.len(), 1, "{intents:?}");
    assert_eq!(intents[0].1, "requires_capture");
    step.db.drop().await.unwrap();
}

/// The fleet's own fault, told as such.
#[tokio::test(flavor = "multi_thread")]
async fn a_never_confirmed_intent_is_the_fleet_s_fault_not_the_card_s() {
    // Arrange: ola's create answers a 500 (the intake gives up, the order pending), and an
    // intent made for her order that never ran its confirm (`requires_confirmation`), as a
    // lookup finds it eleven minutes on (`UNSETTLED_FOR`): nothing will move it now.
    use orderfleet::domain::steps::authorization::{self, Recorded};
    let step = Step::new().await;
    arm(&step.stripe_base, "create", "error_500", 1).await;
    assert!(step.place("ola", "key-1").await.is_err(), "the create answered a 500");
    let id = step.order_id_of("ola").await;
    let order = orderfleet::domain::records::order::load(&step.db.pool, OrderId::from_uuid(id))
        .await
        .unwrap()
        .unwrap();
    let order_id = id.to_string();
    let form = [
        ("amount", "1000"),
        ("currency", "usd"),
        ("capture_method", "manual"),
        ("payment_method", "pm_card_visa"),
        ("metadata[order_id]", order_id.as_str()),
    ];
    let made: serde_json::Value =
        fleet_harness::create_at_stripe(&reqwest::Client::new(), &step.stripe_base, None, &form)
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(made["status"], "requires_confirmation", "{made}");
    let payments = &step.step.fulfilment.payments;
    let mut found = payments.retrieve(made["id"].as_str().unwrap()).await.unwrap();
    found.created = Some(chrono::Utc::now() - authorization::UNSETTLED_FOR - chrono::TimeDelta::minutes(1));

    // Act
    let recorded = authorization::record(&step.db.pool, payments, &order, Ok(found)).await;

    // Assert: the intent cancelled and the order ended with a reason of its own, which the card
    // gate does not count, and a retry of the key is told the fleet's fault, `500
    // order_refused` (before the fix: `402 payment_declined`, as if the card had declined).
    assert!(matches!(recorded, Ok(Recorded::Incomplete(_))), "{recorded:?}");
    assert_eq!(step.ended(id).await, ("payment_declined".to_owned(), "authorization_incomplete".to_owned()));
    assert!(!counted_as_a_decline(&step, id).await, "the card gate counted the fleet's fault");
    assert_eq!(
        step.intents().await,
        vec![(made["id"].as_str().unwrap().to_owned(), "canceled".to_owned(), id.to_string())]
    );
    use order_intake::error::ApiError;
    let again = step.place("ola", "key-1").await;
    assert!(
        matches!(again, Ok(Placed::Declined { error: ApiError::OrderRefused, replayed: true })),
        "{again:?}"
    );
    step.db.drop().await.unwrap();
}

/// A 5xx that is no replay of the key's saved answer: nothing ran.
#[tokio::test(flavor = "multi_thread")]
async fn an_unsaved_5xx_is_tried_again_under_the_same_key() {
    // Arrange: a 500 from in front of Stripe's idempotency layer: nothing ran, nothing saved.
    let step = Step::new().await;
    arm(&step.stripe_base, "create", "error_500_unsaved", 1).await;

    // Act
    let placed = step.place("ola", "key-1").await;

    // Assert: the same key again ran the create (before the fix: the 500 was taken as the key's
    // saved answer, the attempt closed, and a new key would follow while an earlier try might
    // still be executing).
    assert!(matches!(placed, Ok(Placed::Accepted { replayed: false, .. })), "{placed:?}");
    let intents = step.intents().await;
    assert_eq!(intents.len(), 1, "{intents:?}");
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stray_cancel_whose_key_holds_a_saved_500_goes_on_under_a_fresh_key() {
    // Arrange: an order on its intent, and a stray for it; the cancel's key answers 500 once,
    // which Stripe saves and replays to the key for 24 hours.
    let step = Step::new().await;
    let id = step.authorized_order("ola").await;
    let payments = &step.step.fulfilment.payments;
    let stray = hold_made_elsewhere(&step.stripe_base, id).await;
    arm(&step.stripe_base, "cancel", "error_500", 1).await;

    // Act
    let released = payments.cancel_stray(OrderId::from_uuid(id), &stray).await;

    // Assert: released now (before the fix: the saved 500, again at every later try).
    assert!(released.is_ok(), "{released:?}");
    assert_eq!(payments.retrieve(&stray).await.unwrap().status, orderfleet_payments::IntentStatus::Canceled);
    step.db.drop().await.unwrap();
}

/// A stray whose cancel Stripe does not answer is passed over, not waited for.
#[tokio::test(flavor = "multi_thread")]
async fn the_reconciliation_releases_an_unanswered_stray_on_the_next_pass() {
    // Arrange: two orders on their intents. A's order has failed while its own intent holds
    // funds (the safety net's case); B has a stray. Stripe answers no cancel for now.
    use orderfleet::domain::recovery::strays;
    let step = Step::new().await;
    let a = step.authorized_order("ann").await;
    let b = step.authorized_order("bob").await;
    sqlx::query("UPDATE orders SET status = 'payment_declined' WHERE id = $1")
        .bind(a)
        .execute(&step.db.pool)
        .await
        .unwrap();
    let stray = hold_made_elsewhere(&step.stripe_base, b).await;
    let payments = payments(&step.db.pool, &step.stripe_base);
    let stop = tokio_util::sync::CancellationToken::new();
    arm(&step.stripe_base, "cancel", "timeout", 100).await;
    // A pass reads up to now, on Stripe's clock as its `Date` shows it, and Stripe dates an
    // intent (`created`) and answers `Date` in whole seconds: an intent made in the pass's own
    // second may fall after its window, for the next pass to read. Here time is the subject:
    // the pass comes a second and more after the intents, so its window holds them.
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    // Act: a pass while Stripe does not answer the cancels, then one after it does.
    let first = strays::reconcile(&step.db.pool, &payments, Duration::ZERO, &stop).await.unwrap().unwrap();
    let owed: i64 = sqlx::query_scalar("SELECT count(*) FROM intent_releases_owed")
        .fetch_one(&step.db.pool)
        .await
        .unwrap();
    arm(&step.stripe_base, "cancel", "timeout", 0).await;
    sqlx::query(
        "UPDATE stripe_reconciliation SET reconciled_until = reconciled_until - interval '5 minutes'",
    )
    .execute(&step.db.pool)
    .await
    .unwrap();
    let second = strays::reconcile(&step.db.pool, &payments, Duration::ZERO, &stop).await.unwrap().unwrap();

    // Assert: the first pass moved on (before the fix: blocked, its window read again and again),
    // owing both releases; the second released both, the failed order's intent among them.
    assert!(!first.blocked, "{first:?}");
    // (A pass that outlasts a window reads the next, which opens a margin early: the same
    // intents may be tried, and deferred, twice in it.)
    assert!(first.deferred >= 2 && owed == 2, "{first:?}, {owed} owed");
    assert!(second.released >= 2, "{second:?}");
    for intent in [step.own_intent(a).await, stray] {
        assert_eq!(
            payments.retrieve(&intent).await.unwrap().status,
            orderfleet_payments::IntentStatus::Canceled,
            "{intent}"
        );
    }
    let owed: i64 = sqlx::query_scalar("SELECT count(*) FROM intent_releases_owed")
        .fetch_one(&step.db.pool)
        .await
        .unwrap();
    assert_eq!(owed, 0);
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_about_the_live_intent_of_a_failed_order_cancels_it() {
    // Arrange: an order whose own intent holds funds, though the order has failed.
    use orderfleet::domain::steps::webhook;
    let step = Step::new().await;
    let id = step.authorized_order("ola").await;
    sqlx::query("UPDATE orders SET status = 'payment_declined' WHERE id = $1")
        .bind(id)
        .execute(&step.db.pool)
        .await
        .unwrap();
    let own = step.own_intent(id).await;
    let event = webhook::Event::parse(
        serde_json::json!({
            "id": "evt_failed_order_hold",
            "type": "payment_intent.amount_capturable_updated",
            "data": { "object": { "id": own, "object": "payment_intent", "metadata": { "order_id": id.to_string() } } }
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    // Another process's client: the hold was not made by it.
    let payments = payments(&step.db.pool, &step.stripe_base);

    // Act
    let applied = webhook::apply(&step.db.pool, &payments, &event).await;

    // Assert: the hold released (before the fix: no change, the hold left on the card).
    assert!(applied.is_ok(), "{applied:?}");
    assert_eq!(payments.retrieve(&own).await.unwrap().status, orderfleet_payments::IntentStatus::Canceled);
    step.db.drop().await.unwrap();
}

/// A trigger that refuses, for good, every change of `user`'s orders for which `refused` (SQL
/// over `NEW`) holds: an operator's rule, a constraint, a corrupt row.
async fn refuse_for(step: &Step, user: &str, refused: &str) {
    let function = format!(
        "CREATE FUNCTION refuse_{user}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.user_id = '{user}' AND {refused} THEN
             RAISE EXCEPTION 'orders of {user} are refused here';
           END IF;
           RETURN NEW;
         END $$"
    );
    // The test's own text, not a user's: nothing to inject.
    sqlx::query(sqlx::AssertSqlSafe(function)).execute(&step.db.pool).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER refuse_{user} BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION refuse_{user}()"
    )))
    .execute(&step.db.pool)
    .await
    .unwrap();
}

/// It ends failed, with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn an_order_whose_commit_is_refused_for_good_leaves_no_hold() {
    // Arrange: the database refuses one buyer's order the move that records its authorization.
    let step = Step::new().await;
    refuse_for(&step, "ann", "NEW.status IN ('authorized', 'stock_reserved')").await;

    // Act
    let ann = step.place("ann", "key-ann").await;
    let bob = step.place("bob", "key-bob").await;

    // Assert: Ann's hold released and her order failed with the database's reason, told as the
    // fleet's fault (`500 order_refused`), not her card's, and so again to a retry of her key;
    // Bob, behind her, is served.
    use order_intake::error::ApiError;
    assert!(
        matches!(ann, Ok(Placed::Declined { error: ApiError::OrderRefused, replayed: false })),
        "{ann:?}"
    );
    assert!(matches!(bob, Ok(Placed::Accepted { .. })), "{bob:?}");
    let again = step.place("ann", "key-ann").await;
    assert!(
        matches!(again, Ok(Placed::Declined { error: ApiError::OrderRefused, replayed: true })),
        "{again:?}"
    );
    let order = step.order_id_of("ann").await;
    let (status, reason, detail): (String, String, String) =
        sqlx::query_as("SELECT status::text, failure_reason, decline_detail FROM orders WHERE id = $1")
            .bind(order)
            .fetch_one(&step.db.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("payment_declined", "order_refused"));
    assert!(detail.contains("orders of ann are refused here"), "{detail}");
    let intents = step.intents().await;
    let own: Vec<_> = intents.iter().filter(|(_, _, o)| *o == order.to_string()).collect();
    assert_eq!(own.len(), 1, "{intents:?}");
    assert_eq!(own[0].1, "canceled", "{intents:?}");
    assert!(!counted_as_a_decline(&step, order).await, "the card gate counted the fleet's fault");
    step.db.drop().await.unwrap();
}

/// Whether the card gate counts `order` as a declined card (`counts_as_decline`).
async fn counted_as_a_decline(step: &Step, order: Uuid) -> bool {
    sqlx::query_scalar("SELECT counts_as_decline(status, failure_reason) FROM orders WHERE id = $1")
        .bind(order)
        .fetch_one(&step.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_card_gate_counts_declined_cards_and_failed_authentications_alone() {
    // Arrange: one order, its status and reason set to each a payment can end with.
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;
    let cases = [
        ("payment_declined", Some("payment_declined"), true),
        ("payment_declined", Some("authentication_failed"), true),
        ("payment_declined", Some("order_refused"), false),
        ("payment_declined", Some("authorization_incomplete"), false),
        ("payment_declined", Some("authentication_timed_out"), false),
        ("payment_declined", Some("payment_canceled"), false),
        ("payment_declined", Some("card_limit_reached"), false),
        ("capture_failed", Some("capture_failed"), false),
    ];
    for (status, reason, counted) in cases {
        // Act
        sqlx::query("UPDATE orders SET status = $2::order_status, failure_reason = $3 WHERE id = $1")
            .bind(order)
            .bind(status)
            .bind(reason)
            .execute(&step.db.pool)
            .await
            .unwrap();

        // Assert
        assert_eq!(counted_as_a_decline(&step, order).await, counted, "{status} {reason:?}");
    }
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_with_a_failure_reason_from_another_version_loads_and_shows_it() {
    // Arrange: an order a later version ended with a reason this one does not know (read
    // after a rollback).
    let step = Step::new().await;
    let order = step.authorized_order("ola").await;
    sqlx::query(
        "UPDATE orders SET status = 'payment_declined', failure_reason = 'a_later_reason' WHERE id = $1",
    )
    .bind(order)
    .execute(&step.db.pool)
    .await
    .unwrap();

    // Act
    let loaded = orderfleet::domain::records::order::load(&step.db.pool, OrderId::from_uuid(order)).await;

    // Assert: it loads (before the fix: a decode error, and every read of the order a 500),
    // and shows its reason as stored.
    let loaded = loaded.expect("the order loads").expect("the order is there");
    assert_eq!(loaded.failure_reason.map(|r| r.as_str()), Some("a_later_reason"));
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_owed_on_a_refused_pending_order_is_made_by_the_next_pass() {
    // Arrange: the database refuses every change of Ann's order, and Stripe answers none of
    // the cancels of its hold: the release is owed, and the order stays pending.
    use orderfleet::domain::recovery::strays;
    let step = Step::new().await;
    refuse_for(&step, "ann", "true").await;
    arm(&step.stripe_base, "cancel", "error_500", 20).await;
    let ann = step.place("ann", "key-ann").await;
    assert!(matches!(ann, Err(order_intake::error::ApiError::OrderRefused)), "{ann:?}");
    let order = step.order_id_of("ann").await;
    assert_eq!(step.status(order).await, "pending_authorization");
    let intents = step.intents().await;
    assert_eq!((intents.len(), intents[0].1.as_str()), (1, "requires_capture"), "{intents:?}");
    arm(&step.stripe_base, "cancel", "error_500", 0).await;
    let payments = payments(&step.db.pool, &step.stripe_base);
    let stop = tokio_util::sync::CancellationToken::new();

    // Act: the reconciliation's next pass.
    strays::reconcile(&step.db.pool, &payments, Duration::ZERO, &stop).await.unwrap().unwrap();

    // Assert: released though the order is pending (before the fix: left waiting for a move
    // the database will never allow, the hold live), and no longer owed.
    let intents = step.intents().await;
    assert_eq!(intents[0].1, "canceled", "{intents:?}");
    let owed: i64 = sqlx::query_scalar("SELECT count(*) FROM intent_releases_owed")
        .fetch_one(&step.db.pool)
        .await
        .unwrap();
    assert_eq!(owed, 0);
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_end_of_a_refused_capture_releases_the_order_not_the_dlq() {
    // Arrange: Ann's hold lapses before its capture, and the database refuses her order the
    // move that records it (`authorization_canceled`).
    let step = Step::new().await;
    let order = step.authorized_order("ann").await;
    let own = step.own_intent(order).await;
    let expired = reqwest::Client::new()
        .post(format!("{}/_sim/payment_intents/{own}/expire", step.stripe_base))
        .send()
        .await
        .unwrap();
    assert!(expired.status().is_success());
    refuse_for(&step, "ann", "NEW.status = 'authorization_canceled'").await;

    // Act
    let outcome = step.step.handle_one(&stock_check(order, EventType::StockCheckRequested)).await;

    // Assert: the order ends failed with the database's reason, its unit back to the stock
    // and the line, and the message is done (before the fix: a permanent failure for the DLQ,
    // the order left `stock_reserved` on a hold that is gone).
    assert_eq!(outcome, Ok(()));
    assert_eq!(step.ended(order).await, ("capture_failed".to_owned(), "order_refused".to_owned()));
    let (stock, promised): (i32, i32) =
        sqlx::query_as("SELECT stock, units_promised FROM products").fetch_one(&step.db.pool).await.unwrap();
    assert_eq!((stock, promised), (5, 0));
    step.db.drop().await.unwrap();
}

/// An `authorized` order (its units promised, not yet taken from stock), as a 3-D Secure
/// settle leaves it: Ann's order placed, then its reservation undone.
async fn authorized_not_reserved(step: &Step, user: &str) -> Uuid {
    let order = step.authorized_order(user).await;
    sqlx::query("UPDATE orders SET status = 'authorized' WHERE id = $1")
        .bind(order)
        .execute(&step.db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE products SET stock = stock + 1").execute(&step.db.pool).await.unwrap();
    order
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_reservation_releases_the_hold_and_ends_the_order_not_the_dlq() {
    // Arrange: the database refuses Ann's authorized order the move that reserves its stock.
    let step = Step::new().await;
    let order = authorized_not_reserved(&step, "ann").await;
    let own = step.own_intent(order).await;
    refuse_for(&step, "ann", "NEW.status = 'stock_reserved'").await;

    // Act
    let outcome = step.step.handle_one(&stock_check(order, EventType::StockCheckRequested)).await;

    // Assert: its hold cancelled, the order ended failed with the database's reason, its unit
    // back for the line, and the message done: the worker goes on.
    assert_eq!(outcome, Ok(()));
    assert_eq!(step.ended(order).await, ("authorization_canceled".to_owned(), "order_refused".to_owned()));
    let payments = &step.step.fulfilment.payments;
    assert_eq!(payments.retrieve(&own).await.unwrap().status, orderfleet_payments::IntentStatus::Canceled);
    let (stock, promised): (i32, i32) =
        sqlx::query_as("SELECT stock, units_promised FROM products").fetch_one(&step.db.pool).await.unwrap();
    assert_eq!((stock, promised), (5, 0));
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_rejection_goes_to_the_dlq_with_its_hold_released() {
    // Arrange: Ann's authorized order finds no stock left, and the database refuses her order
    // every end: the rejection and the end of the refusal rule.
    let step = Step::new().await;
    let order = authorized_not_reserved(&step, "ann").await;
    let own = step.own_intent(order).await;
    sqlx::query("UPDATE products SET stock = 0").execute(&step.db.pool).await.unwrap();
    refuse_for(&step, "ann", "NEW.status IN ('rejected_out_of_stock', 'authorization_canceled')").await;

    // Act
    let outcome = step.step.handle_one(&stock_check(order, EventType::StockCheckRequested)).await;

    // Assert: for a person (the DLQ), with the database's reason, the order left where it was,
    // and its hold released all the same (no buyer told no keeps a hold on the card).
    let failure = outcome.unwrap_err();
    assert_eq!((failure.kind, failure.code.as_str()), (Kind::Permanent, "order_refused"), "{failure}");
    assert!(failure.to_string().contains("orders of ann are refused here"), "{failure}");
    assert_eq!(step.status(order).await, "authorized");
    let payments = &step.step.fulfilment.payments;
    assert_eq!(payments.retrieve(&own).await.unwrap().status, orderfleet_payments::IntentStatus::Canceled);
    step.db.drop().await.unwrap();
}

/// Bob's 3-D Secure order, its authentication failed, and his page confirming the intent again
/// with `method` (Stripe.js, with the intent's client secret); then the order settled. The
/// product lets one card hold one unit, and Ann's order, paid with `pm_card_visa`, holds one.
async fn confirmed_again_with(
    method: &str,
) -> (Step, Uuid, String, orderfleet::domain::steps::three_d_secure::Settled) {
    use orderfleet::domain::steps::three_d_secure;
    let step = Step::new().await;
    sqlx::query("UPDATE products SET max_per_card = 1").execute(&step.db.pool).await.unwrap();
    assert!(matches!(step.place("ann", "key-ann").await, Ok(Placed::Accepted { .. })));
    let bob = step.place_with("bob", "key-bob", "pm_card_threeDSecure2Required").await;
    assert!(matches!(&bob, Ok(Placed::Accepted { body, .. }) if body.payment.is_some()), "{bob:?}");
    let order = step.order_id_of("bob").await;
    let intent = step.own_intent(order).await;
    let http = reqwest::Client::new();
    let failed = http
        .post(format!("{}/_sim/payment_intents/{intent}/authenticate", step.stripe_base))
        .json(&serde_json::json!({"outcome": "fail"}))
        .send()
        .await
        .unwrap();
    assert!(failed.status().is_success());
    let confirmed: serde_json::Value = http
        .post(format!("{}/v1/payment_intents/{intent}/confirm", step.stripe_base))
        .bearer_auth("sk_test_steps")
        .form(&[("payment_method", method)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(confirmed["status"], "requires_capture", "{confirmed}");
    let payments = &step.step.fulfilment.payments;
    let settled = three_d_secure::take_and_settle(&step.db.pool, payments, OrderId::from_uuid(order), None)
        .await
        .unwrap()
        .unwrap();
    (step, order, intent, settled)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_3ds_intent_confirmed_with_a_card_over_its_cap_is_released() {
    // Arrange, act: Bob's page confirms with Ann's card, which holds the one unit it may.
    use orderfleet::domain::steps::three_d_secure::Settled;
    use orderfleet::domain::words::status::FailureReason;
    let (step, order, intent, settled) = confirmed_again_with("pm_card_visa").await;

    // Assert: the hold released and the order ended over the cap, not a card decline, its
    // unit back (before the fix: authorized, and one card held two units of a cap of one).
    assert_eq!(settled, Settled::Declined(FailureReason::CardLimitReached));
    let payments = &step.step.fulfilment.payments;
    assert_eq!(payments.retrieve(&intent).await.unwrap().status, orderfleet_payments::IntentStatus::Canceled);
    assert_eq!(step.ended(order).await, ("payment_declined".to_owned(), "card_limit_reached".to_owned()));
    assert!(!counted_as_a_decline(&step, order).await);
    let promised: i32 =
        sqlx::query_scalar("SELECT units_promised FROM products").fetch_one(&step.db.pool).await.unwrap();
    assert_eq!(promised, 1, "Ann's unit alone");
    step.db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_3ds_intent_confirmed_with_another_card_within_its_cap_carries_that_card() {
    // Arrange, act: Bob's page confirms with a card of his own.
    use orderfleet::domain::steps::three_d_secure::Settled;
    let (step, order, _, settled) = confirmed_again_with("pm_card_mastercard").await;

    // Assert: authorized, the order counted on the card that holds its funds from now on.
    assert_eq!(settled, Settled::Authorized);
    let (method, fingerprint): (String, String) =
        sqlx::query_as("SELECT payment_method, card_fingerprint FROM orders WHERE id = $1")
            .bind(order)
            .fetch_one(&step.db.pool)
            .await
            .unwrap();
    let payments = &step.step.fulfilment.payments;
    let mastercard = payments.card_fingerprint("pm_card_mastercard").await.unwrap().unwrap();
    assert_eq!((method.as_str(), fingerprint), ("pm_card_mastercard", mastercard));
    step.db.drop().await.unwrap();
}

/// It keeps no hold.
#[tokio::test(flavor = "multi_thread")]
async fn an_order_the_database_refuses_to_end_too_is_left_for_a_person() {
    // Arrange: the database refuses every change of one buyer's order.
    let step = Step::new().await;
    refuse_for(&step, "ann", "true").await;

    // Act
    let ann = step.place("ann", "key-ann").await;

    // Assert: an error for the buyer, the order still pending (the sweeper lists it as stuck,
    // with the database's reason), and its hold released all the same.
    assert!(ann.is_err(), "{ann:?}");
    let order = step.order_id_of("ann").await;
    assert_eq!(step.status(order).await, "pending_authorization");
    let intents = step.intents().await;
    assert_eq!(intents.len(), 1, "{intents:?}");
    assert_eq!(intents[0].1, "canceled", "{intents:?}");
    step.db.drop().await.unwrap();
}

/// The order has since recorded the intent.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_owed_of_an_intent_its_order_now_holds_cancels_nothing() {
    // Arrange: an order whose commit the database once refused owed its intent's release
    // (Stripe did not answer the cancel); an operator mended the rule, and the order was then
    // authorized on that very intent.
    use orderfleet::domain::recovery::strays;
    let step = Step::new().await;
    let id = step.authorized_order("ola").await;
    let own = step.own_intent(id).await;
    sqlx::query(
        "INSERT INTO intent_releases_owed (payment_intent_id, order_id, found, last_error)
         VALUES ($1, $2, 'order_refused', 'timed out')",
    )
    .bind(&own)
    .bind(id)
    .execute(&step.db.pool)
    .await
    .unwrap();
    let payments = payments(&step.db.pool, &step.stripe_base);
    let stop = tokio_util::sync::CancellationToken::new();

    // Act
    strays::reconcile(&step.db.pool, &payments, Duration::ZERO, &stop).await.unwrap().unwrap();

    // Assert: the order's hold is kept (before the fix: cancelled, and the order, accepted,
    // could never be captured), and the release is no longer owed.
    assert_eq!(
        payments.retrieve(&own).await.unwrap().status,
        orderfleet_payments::IntentStatus::RequiresCapture
    );
    let owed: i64 = sqlx::query_scalar("SELECT count(*) FROM intent_releases_owed")
        .fetch_one(&step.db.pool)
        .await
        .unwrap();
    assert_eq!(owed, 0);
    step.db.drop().await.unwrap();
}
