//! Property test of what the stock worker parses from outside, the SQS message body: no body
//! panics the step, and every refusal is a classified failure with a code. The database is
//! one nobody listens on: a body that is not a stock check never reaches it.

use std::time::Duration;

use orderfleet::domain::steps::fulfilment::Fulfilment;
use orderfleet_payments::StripeConfig;
use orderfleet_payments::{Payments, RetryPolicy};
use orderfleet_runtime::config::{DatabaseConfig, Env};
use orderfleet_runtime::failure::{Kind, Source};
use proptest::prelude::*;
use stock_worker::StockCheck;

fn step() -> StockCheck {
    let env = Env::from_pairs([
        ("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none"),
        ("STRIPE_SECRET_KEY", "sk_test_envelopes"),
        ("STRIPE_API_BASE", "http://127.0.0.1:9"),
    ]);
    let size = orderfleet_runtime::db::PoolSize {
        acquire_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let pool = orderfleet_runtime::db::connect_lazy(&DatabaseConfig::from_env(&env).unwrap(), size).unwrap();
    let payments =
        Payments::new(&StripeConfig::from_env(&env).unwrap(), RetryPolicy::default(), pool.clone()).unwrap();
    StockCheck::new(Fulfilment { pool, payments }, 1)
}

/// Bodies near an envelope: its keys, ids that are and are not UUIDs, event types of all kinds.
fn envelope_like() -> impl Strategy<Value = String> {
    let event =
        prop_oneof![Just("order.stock_check_requested".to_owned()), Just("order.paid".to_owned()), ".{0,20}"];
    let id = prop_oneof![Just("01a2051a-eb51-7143-9dbc-dd06817bf215".to_owned()), ".{0,40}"];
    let at = prop_oneof![Just("2026-11-22T10:00:00Z".to_owned()), ".{0,30}"];
    (id.clone(), event, id, at, prop::bool::ANY).prop_map(|(message_id, event_type, order_id, at, payload)| {
        let payload = if payload { "{}" } else { "null" };
        format!(
            r#"{{"message_id": {}, "event_type": {}, "order_id": {}, "occurred_at": {}, "payload": {payload}}}"#,
            serde_json::to_string(&message_id).unwrap(),
            serde_json::to_string(&event_type).unwrap(),
            serde_json::to_string(&order_id).unwrap(),
            serde_json::to_string(&at).unwrap(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_body_panics_the_step_and_every_refusal_has_its_kind_and_code(body in prop_oneof![".{0,300}", envelope_like()]) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // The pool is made inside the runtime: it starts a task of its own.
        let outcome = runtime.block_on(async { step().handle_one(&body).await });
        let failure = outcome.expect_err("no body here is a stock check the database could settle");
        prop_assert!(!failure.code.is_empty() && !failure.reason.is_empty());
        // Unreadable is for a person; only a readable stock check gets as far as the database.
        if failure.source == Source::Message {
            prop_assert_eq!(failure.kind, Kind::Permanent);
        } else {
            prop_assert_eq!((failure.source, failure.kind), (Source::Database, Kind::Outage));
        }
    }
}
