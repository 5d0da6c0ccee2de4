//! The PaymentIntent: its state machine.
//!
//! The transitions follow Stripe's for card payments:
//!
//! ```text
//! create ─┬─ no payment method ──────────▶ requires_payment_method
//!         ├─ not confirmed ──────────────▶ requires_confirmation
//!         └─ confirm ─┬─ approved, manual ──▶ requires_capture ─ capture ─▶ succeeded
//!                     ├─ approved, automatic ─────────────────────────────▶ succeeded
//!                     ├─ declined (402) ──▶ requires_payment_method (last_payment_error set)
//!                     └─ 3-D Secure ──▶ requires_action ─ authenticate ─┬─ succeed ─▶ as approved
//!                                                                       │           (or as declined)
//!                                                                       └─ fail ─▶ requires_payment_method
//! cancel: from requires_payment_method | requires_confirmation | requires_action | processing
//!         | requires_capture ──▶ canceled
//! refund (POST /v1/refunds): a succeeded intent's charge, up to what was captured
//! ```
//!
//! A refused transition is a Stripe error carrying the intent as it is, so a client learns
//! the state from the refusal itself.
//!
//! A card that needs 3-D Secure (`pm_card_threeDSecure2Required`,
//! `pm_card_authenticationRequired`) leaves the intent in `requires_action` with no charge, and
//! a `next_action` for the buyer's browser (see [`PaymentIntent::next_action_for`]); the
//! `/_sim/payment_intents/{id}/authenticate` route stands in for the buyer.
//!
//! A manual-capture hold lasts [`AUTHORIZATION_WINDOW_SECONDS`] (7 days, as Stripe gives most
//! cards): its charge's `payment_method_details.card.capture_before` says until when, seen
//! with `expand[]=latest_charge`. Stripe then cancels the intent itself (reason `automatic`);
//! here that happens when a test asks ([`PaymentIntent::expire_authorization`]).
//!
//! This file holds the intent's fields and statuses, and the transitions a client asks for
//! once it is confirmed (capture, cancel, a hold's expiry, a refund); `outcome` holds what a
//! confirm and a 3-D Secure authentication do with each test card, and `json` the object as
//! Stripe's API returns it.

mod json;
mod outcome;

use serde_json::Value;

use crate::charge::{Charge, Owner};
use crate::error::StripeError;
use crate::ids;
use crate::requests::{
    AutomaticPaymentMethods, CancelRequest, CancellationReason, CaptureMethod, CaptureRequest,
    ConfirmRequest, ConfirmationMethod, CreateRequest, Details, RefundRequest,
};

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

/// How long a manual-capture card authorization holds: Stripe's window for most cards.
pub(crate) const AUTHORIZATION_WINDOW_SECONDS: i64 = 7 * 24 * 3600;

/// What the buyer's browser did with a 3-D Secure challenge (`/_sim/…/authenticate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Authentication {
    Succeeded,
    Failed,
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
    pub(crate) last_payment_error: Option<StripeError>,
    pub(crate) latest_charge: Option<Charge>,
    /// What the buyer must do next (`requires_action` only).
    pub(crate) next_action: Option<Value>,
    pub(crate) payment_method: Option<String>,
    pub(crate) automatic_payment_methods: Option<AutomaticPaymentMethods>,
    /// The methods it takes: those the request named, or, with automatic payment methods, the
    /// ones this test-mode account has enabled (cards).
    pub(crate) payment_method_types: Vec<String>,
    pub(crate) status: Status,
    pub(crate) details: Details,
    use_stripe_sdk: bool,
    return_url: Option<String>,
    /// Until when it reads as a create still executing (the `slow_confirm` fault).
    pub(crate) confirming_until: Option<std::time::Instant>,
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
            last_payment_error: None,
            latest_charge: None,
            next_action: None,
            payment_method: request.payment_method,
            automatic_payment_methods: request.automatic_payment_methods,
            payment_method_types: match request.automatic_payment_methods {
                Some(_) => vec!["card".to_owned()],
                None => request.payment_method_types,
            },
            status,
            details: request.details,
            use_stripe_sdk: request.use_stripe_sdk,
            return_url: request.return_url,
            confirming_until: None,
        }
    }

    pub(crate) fn capture(&mut self, request: &CaptureRequest, now: i64) -> Result<(), StripeError> {
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
        self.settle(amount, now);
        Ok(())
    }

    /// `POST /v1/payment_intents/{id}/confirm`: an intent waiting for a payment method (after a
    /// decline or a failed authentication, Stripe detaches the card) or for its confirm is
    /// confirmed, with the payment method given or its own; any other status is refused, as
    /// Stripe refuses it (`payment_intent_unexpected_state`).
    pub(crate) fn confirm_again(&mut self, request: ConfirmRequest, now: i64) -> Result<(), StripeError> {
        if !matches!(self.status, Status::RequiresPaymentMethod | Status::RequiresConfirmation) {
            return Err(StripeError::unexpected_state(format!(
                "You cannot confirm this PaymentIntent because it has a status of {}.",
                self.status.as_str()
            ))
            .with_payment_intent(self.to_json()));
        }
        if let Some(payment_method) = request.payment_method {
            self.payment_method = Some(payment_method);
        }
        if self.payment_method.is_none() {
            return Err(StripeError::invalid_param(
                "payment_method",
                "You cannot confirm this PaymentIntent because it's missing a payment method. Update the \
                 PaymentIntent with a payment method and then confirm it again.",
            )
            .with_code("payment_intent_unexpected_state"));
        }
        if request.return_url.is_some() {
            self.return_url = request.return_url;
        }
        self.status = Status::RequiresConfirmation;
        self.confirm(now)
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
        // Read as cancelled from now on, a slow create's confirm (`slow_confirm`) or not.
        self.confirming_until = None;
        self.canceled_at = Some(now);
        self.cancellation_reason = request.cancellation_reason;
        self.amount_capturable = 0;
        self.next_action = None;
        Ok(())
    }

    /// What Stripe does to a hold nobody captured within its window: it cancels the intent
    /// (reason `automatic`) and the funds go back to the card; a capture is refused from then
    /// on. Only a hold (`requires_capture`) can expire.
    pub(crate) fn expire_authorization(&mut self, now: i64) -> Result<(), StripeError> {
        if self.status != Status::RequiresCapture {
            return Err(StripeError::unexpected_state(format!(
                "Only an authorization (status requires_capture) can expire; this PaymentIntent has a status of {}.",
                self.status.as_str()
            ))
            .with_payment_intent(self.to_json()));
        }
        self.status = Status::Canceled;
        // Read as cancelled from now on, a slow create's confirm (`slow_confirm`) or not.
        self.confirming_until = None;
        self.canceled_at = Some(now);
        self.cancellation_reason = Some(CancellationReason::Automatic);
        self.amount_capturable = 0;
        if let Some(charge) = &mut self.latest_charge {
            charge.capture_before = Some(now);
        }
        Ok(())
    }

    /// `POST /v1/refunds` for this intent's charge. Only a succeeded intent has money to give
    /// back: a hold is released by cancelling it, not refunded (docs.stripe.com/refunds).
    pub(crate) fn refund(&mut self, request: &RefundRequest, now: i64) -> Result<Value, StripeError> {
        // Made from the fields rather than by `owner()`, so the charge can be borrowed
        // mutably beside it.
        let owner = Owner {
            payment_intent: &self.id,
            amount: self.amount,
            amount_captured: self.amount_received,
            currency: &self.currency,
        };
        match self.latest_charge.as_mut().filter(|_| self.status == Status::Succeeded) {
            Some(charge) => charge.refund(&owner, request, now),
            None => Err(StripeError::bad_request(format!(
                "This PaymentIntent ({}) does not have a successful charge to refund (its status is {}). \
                 An uncaptured PaymentIntent is released by cancelling it.",
                self.id,
                self.status.as_str()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::form::Params;
    use crate::requests::{ConfirmRequest, Expand};

    /// A visa payment the fleet holds and captures later.
    pub(super) const MANUAL_VISA: &str =
        "amount=1500&currency=usd&capture_method=manual&payment_method=pm_card_visa";

    pub(super) fn intent(body: &str) -> PaymentIntent {
        let request = CreateRequest::parse(&Params::parse(body.as_bytes())).unwrap();
        PaymentIntent::new(request, 1_700_000_000)
    }

    /// An intent made from `body` and confirmed with an approving card.
    pub(super) fn confirmed(body: &str) -> PaymentIntent {
        let mut pi = intent(body);
        pi.confirm(1_700_000_000).unwrap();
        pi
    }

    #[test]
    fn a_declined_intent_confirmed_again_with_another_card_holds_on_it() {
        // Arrange: a decline detaches the card, and the intent waits for another.
        let mut pi =
            intent("amount=1500&currency=usd&capture_method=manual&payment_method=pm_card_chargeDeclined");
        assert!(pi.confirm(1_700_000_000).is_err());
        assert_eq!((pi.status, pi.payment_method.as_deref()), (Status::RequiresPaymentMethod, None));
        let again = |method: Option<&str>| {
            let body = method.map(|m| format!("payment_method={m}")).unwrap_or_default();
            ConfirmRequest::parse(&Params::parse(body.as_bytes())).unwrap()
        };

        // Act, assert: no card at all is refused; another card holds; a hold is not confirmed again.
        let none = pi.confirm_again(again(None), 1_700_000_001).unwrap_err();
        assert_eq!(none.code, Some("payment_intent_unexpected_state"));
        pi.confirm_again(again(Some("pm_card_mastercard")), 1_700_000_002).unwrap();
        assert_eq!(
            (pi.status, pi.payment_method.as_deref()),
            (Status::RequiresCapture, Some("pm_card_mastercard"))
        );
        let twice = pi.confirm_again(again(Some("pm_card_visa")), 1_700_000_003).unwrap_err();
        assert_eq!(twice.code, Some("payment_intent_unexpected_state"));
        assert_eq!(pi.payment_method.as_deref(), Some("pm_card_mastercard"));
    }

    #[test]
    fn a_partial_capture_releases_the_rest() {
        let mut pi = confirmed(MANUAL_VISA);
        pi.capture(&CaptureRequest { amount_to_capture: Some(1000) }, 1_700_000_001).unwrap();
        assert_eq!((pi.amount_capturable, pi.amount_received), (0, 1000));
    }

    #[test]
    fn a_canceled_intent_cannot_be_captured_or_canceled_again() {
        let mut pi = confirmed(MANUAL_VISA);
        pi.cancel(&CancelRequest { cancellation_reason: None }, 1_700_000_001).unwrap();
        let capture = pi.capture(&CaptureRequest { amount_to_capture: None }, 1_700_000_003).unwrap_err();
        assert_eq!(capture.code, Some("payment_intent_unexpected_state"));
        assert!(capture.message.contains("a status of canceled"), "{}", capture.message);
        let cancel = pi.cancel(&CancelRequest { cancellation_reason: None }, 1_700_000_002).unwrap_err();
        assert_eq!(cancel.code, Some("payment_intent_unexpected_state"));
        assert_eq!(pi.canceled_at, Some(1_700_000_001));
    }

    #[test]
    fn a_hold_carries_its_deadline_and_after_it_cannot_be_captured() {
        let mut pi = confirmed(MANUAL_VISA);
        let expanded = pi.to_json_expanded(Expand { latest_charge: true });
        assert_eq!(
            expanded["latest_charge"]["payment_method_details"]["card"]["capture_before"],
            1_700_000_000 + AUTHORIZATION_WINDOW_SECONDS
        );
        assert!(pi.to_json()["latest_charge"].is_string());

        pi.expire_authorization(1_700_600_000).unwrap();
        assert_eq!(
            (pi.status, pi.cancellation_reason),
            (Status::Canceled, Some(CancellationReason::Automatic))
        );
        let capture = pi.capture(&CaptureRequest { amount_to_capture: None }, 1_700_000_003).unwrap_err();
        assert_eq!(capture.code, Some("payment_intent_unexpected_state"));
        assert!(pi.expire_authorization(1_700_600_001).is_err(), "only a hold expires");
    }

    #[test]
    fn only_a_succeeded_intent_is_refunded_and_never_beyond_what_was_captured() {
        let refund = |amount: Option<i64>| RefundRequest {
            target: crate::requests::RefundTarget::PaymentIntent("pi".into()),
            amount,
            reason: None,
            metadata: BTreeMap::new(),
        };
        let mut pi = confirmed(MANUAL_VISA);
        assert!(pi.refund(&refund(None), 1_700_000_001).is_err(), "a hold is cancelled, not refunded");
        pi.capture(&CaptureRequest { amount_to_capture: Some(1000) }, 1_700_000_002).unwrap();

        let too_much = pi.refund(&refund(Some(1001)), 1_700_000_003).unwrap_err();
        let part = pi.refund(&refund(Some(400)), 1_700_000_004).unwrap();
        let rest = pi.refund(&refund(None), 1_700_000_005).unwrap();
        let again = pi.refund(&refund(None), 1_700_000_006).unwrap_err();

        assert_eq!(too_much.code, Some("amount_too_large"));
        assert_eq!((part["amount"].as_i64(), rest["amount"].as_i64()), (Some(400), Some(600)));
        assert_eq!(again.code, Some("charge_already_refunded"));
        let charge = pi.charge_json().unwrap();
        assert_eq!(
            (charge["amount_refunded"].as_i64(), charge["refunded"].as_bool()),
            (Some(1000), Some(true))
        );
    }
}
