//! The PaymentIntent: its state machine and its JSON.
//!
//! The transitions follow Stripe's for card payments that need no customer action:
//!
//! ```text
//! create ─┬─ no payment method ──────────▶ requires_payment_method
//!         ├─ not confirmed ──────────────▶ requires_confirmation
//!         └─ confirm ─┬─ approved, manual ──▶ requires_capture ─ capture ─▶ succeeded
//!                     ├─ approved, automatic ─────────────────────────────▶ succeeded
//!                     └─ declined (402) ──▶ requires_payment_method (last_payment_error set)
//! cancel: from requires_payment_method | requires_confirmation | requires_action | processing
//!         | requires_capture ──▶ canceled
//! ```
//!
//! A refused transition is a Stripe error carrying the intent as it is, so a client learns
//! the state from the refusal itself.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::cards::{self, Outcome};
use crate::error::StripeError;
use crate::ids;
use crate::requests::{CancelRequest, CaptureRequest, CreateRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresAction,
    Processing,
    RequiresCapture,
    Canceled,
    Succeeded,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::RequiresPaymentMethod => "requires_payment_method",
            Status::RequiresConfirmation => "requires_confirmation",
            Status::RequiresAction => "requires_action",
            Status::Processing => "processing",
            Status::RequiresCapture => "requires_capture",
            Status::Canceled => "canceled",
            Status::Succeeded => "succeeded",
        }
    }

    const CANCELABLE: [Status; 5] = [
        Status::RequiresPaymentMethod,
        Status::RequiresCapture,
        Status::RequiresConfirmation,
        Status::RequiresAction,
        Status::Processing,
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CaptureMethod {
    Automatic,
    AutomaticAsync,
    Manual,
}

impl CaptureMethod {
    pub(crate) const ALL: [CaptureMethod; 3] =
        [CaptureMethod::Automatic, CaptureMethod::AutomaticAsync, CaptureMethod::Manual];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CaptureMethod::Automatic => "automatic",
            CaptureMethod::AutomaticAsync => "automatic_async",
            CaptureMethod::Manual => "manual",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfirmationMethod {
    Automatic,
    Manual,
}

impl ConfirmationMethod {
    pub(crate) const ALL: [ConfirmationMethod; 2] =
        [ConfirmationMethod::Automatic, ConfirmationMethod::Manual];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConfirmationMethod::Automatic => "automatic",
            ConfirmationMethod::Manual => "manual",
        }
    }
}

/// The reasons a client may give when cancelling (Stripe sets others itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancellationReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
}

impl CancellationReason {
    pub(crate) const ALL: [CancellationReason; 4] = [
        CancellationReason::Duplicate,
        CancellationReason::Fraudulent,
        CancellationReason::RequestedByCustomer,
        CancellationReason::Abandoned,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CancellationReason::Duplicate => "duplicate",
            CancellationReason::Fraudulent => "fraudulent",
            CancellationReason::RequestedByCustomer => "requested_by_customer",
            CancellationReason::Abandoned => "abandoned",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct PaymentIntent {
    pub(crate) id: String,
    pub(crate) amount: i64,
    pub(crate) amount_capturable: i64,
    pub(crate) amount_received: i64,
    pub(crate) canceled_at: Option<i64>,
    pub(crate) cancellation_reason: Option<CancellationReason>,
    pub(crate) capture_method: CaptureMethod,
    pub(crate) client_secret: String,
    pub(crate) confirmation_method: ConfirmationMethod,
    pub(crate) created: i64,
    pub(crate) currency: String,
    pub(crate) description: Option<String>,
    pub(crate) last_payment_error: Option<StripeError>,
    pub(crate) latest_charge: Option<String>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) payment_method: Option<String>,
    pub(crate) payment_method_types: Vec<String>,
    pub(crate) receipt_email: Option<String>,
    pub(crate) statement_descriptor: Option<String>,
    pub(crate) statement_descriptor_suffix: Option<String>,
    pub(crate) status: Status,
    pub(crate) transfer_group: Option<String>,
}

impl PaymentIntent {
    /// A new, unconfirmed intent.
    pub(crate) fn new(request: CreateRequest, now: i64) -> Self {
        let id = ids::new("pi");
        let client_secret = format!("{id}_secret_{}", ids::random(25));
        let status = match request.payment_method {
            Some(_) => Status::RequiresConfirmation,
            None => Status::RequiresPaymentMethod,
        };
        Self {
            id,
            amount: request.amount,
            amount_capturable: 0,
            amount_received: 0,
            canceled_at: None,
            cancellation_reason: None,
            capture_method: request.capture_method,
            client_secret,
            confirmation_method: request.confirmation_method,
            created: now,
            currency: request.currency,
            description: request.description,
            last_payment_error: None,
            latest_charge: None,
            metadata: request.metadata,
            payment_method: request.payment_method.map(|card| card.id.to_owned()),
            payment_method_types: request.payment_method_types,
            receipt_email: request.receipt_email,
            statement_descriptor: request.statement_descriptor,
            statement_descriptor_suffix: request.statement_descriptor_suffix,
            status,
            transfer_group: request.transfer_group,
        }
    }

    /// Charges the payment method: a hold for manual capture, a payment otherwise. A decline
    /// leaves the intent waiting for another payment method and answers 402.
    pub(crate) fn confirm(&mut self) -> Result<(), StripeError> {
        let card = self.payment_method.as_deref().and_then(cards::lookup);
        let Some(card) = card.filter(|_| self.status == Status::RequiresConfirmation) else {
            return Err(StripeError::unexpected_state(format!(
                "You cannot confirm this PaymentIntent because it has a status of {}.",
                self.status.as_str()
            ))
            .with_payment_intent(self.to_json()));
        };
        let charge = ids::new("ch");
        self.latest_charge = Some(charge.clone());
        match card.outcome {
            Outcome::Approved => {
                self.last_payment_error = None;
                if self.capture_method == CaptureMethod::Manual {
                    self.status = Status::RequiresCapture;
                    self.amount_capturable = self.amount;
                } else {
                    self.status = Status::Succeeded;
                    self.amount_received = self.amount;
                }
                Ok(())
            }
            Outcome::Declined(decline) => {
                let error =
                    StripeError::card_declined(decline.code, decline.decline_code, decline.message, charge);
                // Stripe detaches a declined payment method: the customer must supply another.
                self.status = Status::RequiresPaymentMethod;
                self.payment_method = None;
                self.last_payment_error = Some(error.clone());
                Err(error.with_payment_intent(self.to_json()))
            }
        }
    }

    pub(crate) fn capture(&mut self, request: &CaptureRequest) -> Result<(), StripeError> {
        if self.status != Status::RequiresCapture {
            return Err(StripeError::unexpected_state(format!(
                "This PaymentIntent could not be captured because it has a status of {}. Only a \
                 PaymentIntent with one of the following statuses may be captured: requires_capture.",
                self.status.as_str()
            ))
            .with_payment_intent(self.to_json()));
        }
        let amount = request.amount_to_capture.unwrap_or(self.amount_capturable);
        if amount > self.amount_capturable {
            return Err(StripeError::invalid_param(
                "amount_to_capture",
                format!(
                    "The amount to capture ({amount}) must be less than or equal to the amount \
                     capturable ({}).",
                    self.amount_capturable
                ),
            )
            .with_code("amount_too_large")
            .with_payment_intent(self.to_json()));
        }
        // Capturing less than the hold releases the rest, as Stripe does.
        self.status = Status::Succeeded;
        self.amount_received = amount;
        self.amount_capturable = 0;
        Ok(())
    }

    pub(crate) fn cancel(&mut self, request: &CancelRequest, now: i64) -> Result<(), StripeError> {
        if !Status::CANCELABLE.contains(&self.status) {
            let allowed: Vec<&str> = Status::CANCELABLE.iter().map(|s| s.as_str()).collect();
            return Err(StripeError::unexpected_state(format!(
                "You cannot cancel this PaymentIntent because it has a status of {}. Only a \
                 PaymentIntent with one of the following statuses may be canceled: {}.",
                self.status.as_str(),
                allowed.join(", ")
            ))
            .with_payment_intent(self.to_json()));
        }
        self.status = Status::Canceled;
        self.canceled_at = Some(now);
        self.cancellation_reason = request.cancellation_reason;
        self.amount_capturable = 0;
        Ok(())
    }

    /// The object as Stripe's API returns it. Every field async-stripe's PaymentIntent
    /// declares is present; those this simulator has no notion of are `null`.
    pub(crate) fn to_json(&self) -> Value {
        let object = PaymentIntentObject {
            id: &self.id,
            object: "payment_intent",
            amount: self.amount,
            amount_capturable: self.amount_capturable,
            amount_details: None,
            amount_received: self.amount_received,
            application: None,
            application_fee_amount: None,
            automatic_payment_methods: None,
            canceled_at: self.canceled_at,
            cancellation_reason: self.cancellation_reason.map(CancellationReason::as_str),
            capture_method: self.capture_method.as_str(),
            client_secret: &self.client_secret,
            confirmation_method: self.confirmation_method.as_str(),
            created: self.created,
            currency: &self.currency,
            customer: None,
            description: self.description.as_deref(),
            excluded_payment_method_types: None,
            hooks: None,
            last_payment_error: self.last_payment_error.as_ref().map(StripeError::object_json),
            latest_charge: self.latest_charge.as_deref(),
            livemode: false,
            metadata: &self.metadata,
            next_action: None,
            on_behalf_of: None,
            payment_details: None,
            payment_method: self.payment_method.as_deref(),
            payment_method_configuration_details: None,
            payment_method_options: None,
            payment_method_types: &self.payment_method_types,
            presentment_details: None,
            processing: None,
            receipt_email: self.receipt_email.as_deref(),
            review: None,
            setup_future_usage: None,
            shipping: None,
            source: None,
            statement_descriptor: self.statement_descriptor.as_deref(),
            statement_descriptor_suffix: self.statement_descriptor_suffix.as_deref(),
            status: self.status.as_str(),
            transfer_data: None,
            transfer_group: self.transfer_group.as_deref(),
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
    automatic_payment_methods: Null,
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
    latest_charge: Option<&'a str>,
    livemode: bool,
    metadata: &'a BTreeMap<String, String>,
    next_action: Null,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::form::Params;

    fn intent(body: &str) -> PaymentIntent {
        let request = CreateRequest::parse(&Params::parse(body.as_bytes())).unwrap();
        PaymentIntent::new(request, 1_700_000_000)
    }

    #[test]
    fn a_manual_visa_confirmation_holds_the_amount() {
        let mut pi = intent("amount=1500&currency=usd&capture_method=manual&payment_method=pm_card_visa");
        pi.confirm().unwrap();
        assert_eq!(pi.status, Status::RequiresCapture);
        assert_eq!((pi.amount_capturable, pi.amount_received), (1500, 0));
    }

    #[test]
    fn an_automatic_confirmation_collects_the_amount() {
        let mut pi = intent("amount=1500&currency=usd&payment_method=pm_card_visa");
        pi.confirm().unwrap();
        assert_eq!(pi.status, Status::Succeeded);
        assert_eq!((pi.amount_capturable, pi.amount_received), (0, 1500));
    }

    #[test]
    fn a_decline_leaves_the_intent_waiting_for_a_payment_method() {
        let mut pi = intent("amount=1500&currency=usd&payment_method=pm_card_chargeDeclined");
        let error = pi.confirm().unwrap_err();
        assert_eq!(error.code, Some("card_declined"));
        assert_eq!(pi.status, Status::RequiresPaymentMethod);
        assert!(pi.last_payment_error.is_some());
        assert_eq!(error.payment_intent.unwrap()["status"], "requires_payment_method");
    }

    #[test]
    fn a_partial_capture_releases_the_rest() {
        let mut pi = intent("amount=1500&currency=usd&capture_method=manual&payment_method=pm_card_visa");
        pi.confirm().unwrap();
        pi.capture(&CaptureRequest { amount_to_capture: Some(1000) }).unwrap();
        assert_eq!((pi.amount_capturable, pi.amount_received), (0, 1000));
    }

    #[test]
    fn a_canceled_intent_cannot_be_captured_or_canceled_again() {
        let mut pi = intent("amount=1500&currency=usd&capture_method=manual&payment_method=pm_card_visa");
        pi.confirm().unwrap();
        pi.cancel(&CancelRequest { cancellation_reason: None }, 1_700_000_001).unwrap();
        let capture = pi.capture(&CaptureRequest { amount_to_capture: None }).unwrap_err();
        assert_eq!(capture.code, Some("payment_intent_unexpected_state"));
        assert!(capture.message.contains("a status of canceled"), "{}", capture.message);
        let cancel = pi.cancel(&CancelRequest { cancellation_reason: None }, 1_700_000_002).unwrap_err();
        assert_eq!(cancel.code, Some("payment_intent_unexpected_state"));
        assert_eq!(pi.canceled_at, Some(1_700_000_001));
    }
}
