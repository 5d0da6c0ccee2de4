//! The PaymentIntent as Stripe's API returns it: every field async-stripe's PaymentIntent
//! declares, those the simulator has no notion of as `null`, `latest_charge` as an id or,
//! expanded, whole; the charge and dispute JSON it owns; and the intent as a read sees it
//! while a `slow_confirm` create is still executing.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{PaymentIntent, Status};
use crate::charge::{Charge, Owner};
use crate::error::StripeError;
use crate::requests::{CancellationReason, Expand};

impl PaymentIntent {
    /// What the charge's JSON takes from this intent.
    fn owner(&self) -> Owner<'_> {
        Owner {
            payment_intent: &self.id,
            amount: self.amount,
            amount_captured: self.amount_received,
            currency: &self.currency,
        }
    }

    /// The latest charge as Stripe's API returns it, if there is one.
    pub(crate) fn charge_json(&self) -> Option<Value> {
        self.latest_charge.as_ref().map(|charge| charge.to_json(&self.owner()))
    }

    /// Whether the latest charge is disputed.
    pub(crate) fn disputed(&self) -> bool {
        self.latest_charge.as_ref().is_some_and(Charge::disputed)
    }

    /// The latest charge's dispute, as Stripe's API returns it, if there is one.
    pub(crate) fn dispute_json(&self) -> Option<Value> {
        self.latest_charge.as_ref()?.dispute_json(&self.owner())
    }

    /// While a `slow_confirm` create is executing: the intent as a read sees it then, made and
    /// its confirm not ended (no charge, no error, nothing capturable yet).
    fn mid_request(&self) -> Option<PaymentIntent> {
        self.confirming_until.filter(|until| std::time::Instant::now() < *until)?;
        Some(PaymentIntent {
            status: Status::RequiresPaymentMethod,
            amount_capturable: 0,
            latest_charge: None,
            last_payment_error: None,
            next_action: None,
            confirming_until: None,
            ..self.clone()
        })
    }

    /// The object as Stripe's API returns it, `latest_charge` as an id.
    pub(crate) fn to_json(&self) -> Value {
        self.to_json_expanded(Expand::default())
    }

    /// The object as Stripe's API returns it. Every field async-stripe's PaymentIntent
    /// declares is present; those this simulator has no notion of are `null`.
    pub(crate) fn to_json_expanded(&self, expand: Expand) -> Value {
        if let Some(seen) = self.mid_request() {
            return seen.to_json_expanded(expand);
        }
        let object = PaymentIntentObject {
            id: &self.id,
            object: "payment_intent",
            amount: self.amount,
            amount_capturable: self.amount_capturable,
            amount_details: None,
            amount_received: self.amount_received,
            application: None,
            application_fee_amount: None,
            automatic_payment_methods: self.automatic_payment_methods.map(|automatic| {
                serde_json::json!({ "enabled": true, "allow_redirects": automatic.allow_redirects.as_str() })
            }),
            canceled_at: self.canceled_at,
            cancellation_reason: self.cancellation_reason.map(CancellationReason::as_str),
            capture_method: self.capture_method.as_str(),
            client_secret: &self.client_secret,
            confirmation_method: self.confirmation_method.as_str(),
            created: self.created,
            currency: &self.currency,
            customer: None,
            description: self.details.description.as_deref(),
            excluded_payment_method_types: None,
            hooks: None,
            last_payment_error: self.last_payment_error.as_ref().map(StripeError::object_json),
            latest_charge: self.latest_charge.as_ref().map(|charge| match expand.latest_charge {
                true => charge.to_json(&self.owner()),
                false => Value::from(charge.id.as_str()),
            }),
            livemode: false,
            metadata: &self.details.metadata,
            next_action: self.next_action.clone(),
            on_behalf_of: None,
            payment_details: None,
            payment_method: self.payment_method.as_deref(),
            payment_method_configuration_details: None,
            payment_method_options: None,
            payment_method_types: &self.payment_method_types,
            presentment_details: None,
            processing: None,
            receipt_email: self.details.receipt_email.as_deref(),
            review: None,
            setup_future_usage: None,
            shipping: None,
            source: None,
            statement_descriptor: self.details.statement_descriptor.as_deref(),
            statement_descriptor_suffix: self.details.statement_descriptor_suffix.as_deref(),
            status: self.status.as_str(),
            transfer_data: None,
            transfer_group: self.details.transfer_group.as_deref(),
        };
        serde_json::to_value(object).unwrap_or(Value::Null)
    }
}

/// A field Stripe has and this simulator never sets: always `null`. Present rather than
/// omitted, because a strict client (async-stripe parses with miniserde) may require it.
type Null = Option<()>;

/// The wire shape of a PaymentIntent.
#[derive(Serialize)]
struct PaymentIntentObject<'a> {
    id: &'a str,
    object: &'static str,
    amount: i64,
    amount_capturable: i64,
    amount_details: Null,
    amount_received: i64,
    application: Null,
    application_fee_amount: Null,
    automatic_payment_methods: Option<Value>,
    canceled_at: Option<i64>,
    cancellation_reason: Option<&'static str>,
    capture_method: &'static str,
    client_secret: &'a str,
    confirmation_method: &'static str,
    created: i64,
    currency: &'a str,
    customer: Null,
    description: Option<&'a str>,
    excluded_payment_method_types: Null,
    hooks: Null,
    last_payment_error: Option<Value>,
    latest_charge: Option<Value>,
    livemode: bool,
    metadata: &'a BTreeMap<String, String>,
    next_action: Option<Value>,
    on_behalf_of: Null,
    payment_details: Null,
    payment_method: Option<&'a str>,
    payment_method_configuration_details: Null,
    payment_method_options: Null,
    payment_method_types: &'a [String],
    presentment_details: Null,
    processing: Null,
    receipt_email: Option<&'a str>,
    review: Null,
    setup_future_usage: Null,
    shipping: Null,
    source: Null,
    statement_descriptor: Option<&'a str>,
    statement_descriptor_suffix: Option<&'a str>,
    status: &'static str,
    transfer_data: Null,
    transfer_group: Option<&'a str>,
}
