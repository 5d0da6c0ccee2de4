//! The fleet's own Stripe client, async-stripe, against the simulator: its strict
//! (miniserde) parser must accept every PaymentIntent and every error the simulator answers,
//! or the fleet would misread a success as an unreadable answer.

mod support;

use std::collections::HashMap;

use stripe::{ApiErrorsType, IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::payment_intent::{
    CancelPaymentIntent, CapturePaymentIntent, CreatePaymentIntent,
    CreatePaymentIntentAutomaticPaymentMethods, CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects,
    RetrievePaymentIntent, SearchPaymentIntent,
};
use stripe_core::{PaymentIntentCaptureMethod, PaymentIntentStatus};
use support::{KEY, TestSim};

fn client(sim: &TestSim) -> stripe::Client {
    // async-stripe appends `v1/...` to the base.
    stripe::ClientBuilder::new(KEY).url(format!("{}/", sim.base)).build().expect("a Stripe client")
}

fn authorize(payment_method: &str) -> CreatePaymentIntent {
    let metadata = HashMap::from([("order_id".to_owned(), "order-42".to_owned())]);
    // As the fleet creates it (SPEC §1.1): without automatic_payment_methods[allow_redirects]=never,
    // Stripe and stripe-sim refuse the confirm for want of a return_url.
    CreatePaymentIntent::new(2500, stripe_types::Currency::USD)
        .capture_method(PaymentIntentCaptureMethod::Manual)
        .confirm(true)
        .payment_method(payment_method)
        .automatic_payment_methods(CreatePaymentIntentAutomaticPaymentMethods {
            allow_redirects: Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never),
            enabled: true,
        })
        .use_stripe_sdk(true)
        .metadata(metadata)
}

#[tokio::test]
async fn async_stripe_authorizes_captures_and_reads_the_intent() {
    let sim = TestSim::start().await;
    let client = client(&sim);

    let authorized = authorize("pm_card_visa")
        .customize()
        .request_strategy(RequestStrategy::Idempotent(IdempotencyKey::new("order-42-authorize").unwrap()))
        .send(&client)
        .await
        .expect("a parsed PaymentIntent");
    let captured = CapturePaymentIntent::new(authorized.id.clone()).send(&client).await.expect("captured");
    let retrieved = RetrievePaymentIntent::new(authorized.id.clone()).send(&client).await.expect("retrieved");

    assert_eq!(authorized.status, PaymentIntentStatus::RequiresCapture);
    assert_eq!(authorized.amount_capturable, 2500);
    assert_eq!(authorized.metadata.get("order_id").map(String::as_str), Some("order-42"));
    assert_eq!(captured.status, PaymentIntentStatus::Succeeded);
    assert_eq!(retrieved.amount_received, 2500);
}

/// The hold's deadline, as the fleet reads it: `latest_charge.payment_method_details.card
/// .capture_before` of an intent fetched with its charge expanded.
fn capture_before(intent: &stripe_core::PaymentIntent) -> Option<i64> {
    match intent.latest_charge.as_ref()? {
        stripe_types::Expandable::Object(charge) => {
            charge.payment_method_details.as_ref()?.card.as_ref()?.capture_before
        }
        stripe_types::Expandable::Id(_) => None,
    }
}

#[tokio::test]
async fn async_stripe_reads_the_holds_deadline_from_the_expanded_charge_on_create_retrieve_and_search() {
    let sim = TestSim::start().await;
    let client = client(&sim);

    let created = authorize("pm_card_visa").expand(["latest_charge".to_owned()]).send(&client).await.unwrap();
    let retrieved = RetrievePaymentIntent::new(created.id.clone())
        .expand(["latest_charge".to_owned()])
        .send(&client)
        .await
        .unwrap();
    let found = SearchPaymentIntent::new("metadata['order_id']:'order-42'")
        .expand(["data.latest_charge".to_owned()])
        .send(&client)
        .await
        .unwrap();
    let plain = RetrievePaymentIntent::new(created.id.clone()).send(&client).await.unwrap();

    let deadline = created.created + 7 * 24 * 3600;
    assert_eq!(capture_before(&created), Some(deadline));
    assert_eq!(capture_before(&retrieved), Some(deadline));
    assert_eq!(capture_before(&found.data[0]), Some(deadline));
    assert!(
        matches!(plain.latest_charge, Some(stripe_types::Expandable::Id(_))),
        "not expanded unless asked"
    );
}

#[tokio::test]
async fn async_stripe_reads_a_decline_with_its_payment_intent() {
    let sim = TestSim::start().await;
    let client = client(&sim);

    let declined = authorize("pm_card_chargeDeclined").send(&client).await;

    let Err(StripeError::Stripe(error, status)) = declined else {
        panic!("a Stripe error, got {declined:?}")
    };
    assert_eq!(status, 402);
    assert_eq!(error.type_, ApiErrorsType::CardError);
    assert_eq!(error.decline_code.as_deref(), Some("generic_decline"));
    let intent = error.payment_intent.expect("the declined intent");
    assert_eq!(intent.status, PaymentIntentStatus::RequiresPaymentMethod);
    assert!(intent.last_payment_error.is_some());
}

#[tokio::test]
async fn async_stripe_reads_state_errors_and_cancellations() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    let authorized = authorize("pm_card_visa").send(&client).await.unwrap();

    let canceled = CancelPaymentIntent::new(authorized.id.clone()).send(&client).await.expect("canceled");
    let capture = CapturePaymentIntent::new(authorized.id.clone()).send(&client).await;

    assert_eq!(canceled.status, PaymentIntentStatus::Canceled);
    assert!(canceled.canceled_at.is_some());
    let Err(StripeError::Stripe(error, 400)) = capture else { panic!("a 400, got {capture:?}") };
    assert_eq!(error.code.map(|c| c.as_str().to_owned()).as_deref(), Some("payment_intent_unexpected_state"));
    assert_eq!(error.payment_intent.map(|pi| pi.status), Some(PaymentIntentStatus::Canceled));
}

#[tokio::test]
async fn async_stripe_reads_injected_errors_as_stripe_errors() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    sim.arm("create", "error_500", 1).await;
    sim.arm("capture", "error_429", 1).await;

    let created = authorize("pm_card_visa").send(&client).await;
    let authorized = authorize("pm_card_visa").send(&client).await.unwrap();
    let captured = CapturePaymentIntent::new(authorized.id.clone()).send(&client).await;

    assert!(
        matches!(created, Err(StripeError::Stripe(ref e, 500)) if e.type_ == ApiErrorsType::ApiError),
        "{created:?}"
    );
    assert!(matches!(captured, Err(StripeError::Stripe(_, 429))), "{captured:?}");
}

#[tokio::test]
async fn async_stripe_sees_a_dropped_connection_as_a_client_error_and_its_retry_replays() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    let authorized = authorize("pm_card_visa").send(&client).await.unwrap();
    sim.arm("capture", "drop_after_success", 1).await;
    let capture = || {
        CapturePaymentIntent::new(authorized.id.clone())
            .customize()
            .request_strategy(RequestStrategy::Idempotent(IdempotencyKey::new("order-42-capture").unwrap()))
            .send(&client)
    };

    let dropped = capture().await;
    let retried = capture().await;

    assert!(matches!(dropped, Err(StripeError::ClientError(_))), "{dropped:?}");
    assert_eq!(retried.expect("the replayed capture").status, PaymentIntentStatus::Succeeded);
    assert_eq!(sim.intent(authorized.id.as_str()).await["capture_count"], 1);
}

#[tokio::test]
async fn async_stripe_reads_the_rate_limits_429_as_a_stripe_rate_limit_error() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    sim.set_rate_limit(1).await;

    let admitted = authorize("pm_card_visa").send(&client).await;
    let limited = authorize("pm_card_visa").send(&client).await;

    assert!(admitted.is_ok(), "{admitted:?}");
    let Err(StripeError::Stripe(error, 429)) = limited else { panic!("a parsed 429, got {limited:?}") };
    assert_eq!(error.type_, ApiErrorsType::InvalidRequestError);
    assert_eq!(error.code.map(|c| c.as_str().to_owned()).as_deref(), Some("rate_limit"));
    assert!(error.message.is_some_and(|m| m.starts_with("Too many requests")));
}

#[tokio::test]
async fn async_stripe_reads_a_key_in_use_as_a_409_idempotency_key_in_use() {
    // Arrange: a create that goes on executing after its client gave up.
    let sim = TestSim::start_with(
        stripe_sim::Simulator::new().with_slow_requests(std::time::Duration::from_secs(5)),
    )
    .await;
    let client = client(&sim);
    sim.arm("create", "slow_confirm", 1).await;
    let create = |timeout: Option<std::time::Duration>| {
        let mut request = authorize("pm_card_visa").customize().request_strategy(
            RequestStrategy::Idempotent(IdempotencyKey::new("order-42-authorize").unwrap()),
        );
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        request.send(&client)
    };

    // Act
    let timed_out = create(Some(std::time::Duration::from_millis(300))).await;
    let retried = create(None).await;

    // Assert
    assert!(matches!(timed_out, Err(StripeError::Timeout)), "{timed_out:?}");
    let Err(StripeError::Stripe(error, 409)) = retried else { panic!("a parsed 409, got {retried:?}") };
    assert_eq!(error.type_, ApiErrorsType::InvalidRequestError);
    assert_eq!(error.code, Some(stripe::ApiErrorsCode::IdempotencyKeyInUse));
}

#[tokio::test]
async fn async_stripe_reads_the_list_within_a_created_window_page_by_page() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    let first = authorize("pm_card_visa").send(&client).await.expect("an intent");
    let second = authorize("pm_card_visa").send(&client).await.expect("an intent");
    let window = stripe_types::RangeBoundsTs {
        gte: Some(first.created - 60),
        lte: Some(first.created + 60),
        ..Default::default()
    };

    let page = stripe_core::payment_intent::ListPaymentIntent::new()
        .created(stripe_types::RangeQueryTs::Bounds(window))
        .limit(1)
        .send(&client)
        .await
        .expect("a parsed list");

    assert_eq!(page.data.iter().map(|pi| pi.id.as_str()).collect::<Vec<_>>(), [second.id.as_str()]);
    assert!(page.has_more);
    assert_eq!(page.data[0].metadata.get("order_id").map(String::as_str), Some("order-42"));
}

#[tokio::test]
async fn async_stripe_reads_a_3ds_intents_next_action_and_client_secret() {
    let sim = TestSim::start().await;
    let client = client(&sim);

    let created =
        authorize("pm_card_threeDSecure2Required").send(&client).await.expect("a parsed PaymentIntent");

    assert_eq!(created.status, PaymentIntentStatus::RequiresAction);
    let secret = created.client_secret.as_deref().expect("a client_secret");
    assert!(secret.starts_with(&format!("{}_secret_", created.id)), "{secret}");
    let next_action = created.next_action.as_ref().expect("a next_action");
    assert_eq!(next_action.type_, "use_stripe_sdk");
    assert!(next_action.use_stripe_sdk.is_some());
    assert!(created.latest_charge.is_none());
}

#[tokio::test]
async fn async_stripe_reads_a_failed_authentication() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    let created = authorize("pm_card_authenticationRequired").send(&client).await.unwrap();
    sim.authenticate(created.id.as_str(), "fail").await;

    let retrieved = RetrievePaymentIntent::new(created.id.clone()).send(&client).await.expect("retrieved");

    assert_eq!(retrieved.status, PaymentIntentStatus::RequiresPaymentMethod);
    let error = retrieved.last_payment_error.expect("a last_payment_error");
    assert_eq!(
        error.code.map(|c| c.as_str().to_owned()).as_deref(),
        Some("payment_intent_authentication_failure")
    );
}

#[tokio::test]
async fn async_stripe_reads_a_decline_after_authentication_with_its_failed_charge() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    let created = authorize("pm_card_authenticationRequiredChargeDeclinedInsufficientFunds")
        .send(&client)
        .await
        .unwrap();
    sim.authenticate(created.id.as_str(), "succeed").await;

    let retrieved = RetrievePaymentIntent::new(created.id.clone()).send(&client).await.expect("retrieved");
    let charge = charge_of(&client, &created.id).await;

    assert_eq!(retrieved.status, PaymentIntentStatus::RequiresPaymentMethod);
    let error = retrieved.last_payment_error.expect("a last_payment_error");
    assert_eq!(error.type_, ApiErrorsType::CardError);
    assert_eq!(error.decline_code.as_deref(), Some("insufficient_funds"));
    assert!(!charge.captured && !charge.paid);
}

/// The expanded charge, as async-stripe parses it.
async fn charge_of(client: &stripe::Client, id: &stripe_core::PaymentIntentId) -> stripe_core::Charge {
    let retrieved = RetrievePaymentIntent::new(id.clone())
        .expand(["latest_charge".to_owned()])
        .send(client)
        .await
        .expect("a parsed PaymentIntent with its charge");
    match retrieved.latest_charge {
        Some(stripe_types::Expandable::Object(charge)) => *charge,
        other => panic!("an expanded charge, got {other:?}"),
    }
}

#[tokio::test]
async fn async_stripe_reads_the_charges_refunds_and_dispute() {
    let sim = TestSim::start().await;
    let client = client(&sim);
    let refunded = authorize("pm_card_visa").send(&client).await.unwrap();
    CapturePaymentIntent::new(refunded.id.clone()).send(&client).await.unwrap();
    let disputed = authorize("pm_card_createDispute").send(&client).await.unwrap();
    CapturePaymentIntent::new(disputed.id.clone()).send(&client).await.unwrap();
    let held = authorize("pm_card_visa").send(&client).await.unwrap();

    sim.refund(&format!("payment_intent={}&amount=700", refunded.id), None).await;
    let refunded = charge_of(&client, &refunded.id).await;
    let disputed = charge_of(&client, &disputed.id).await;
    let held = charge_of(&client, &held.id).await;

    assert_eq!((refunded.amount_refunded, refunded.refunded, refunded.captured), (700, false, true));
    assert_eq!(refunded.amount_captured, 2500);
    assert!(disputed.disputed);
    assert_eq!((held.captured, held.amount_captured, held.disputed), (false, 0, false));
}
