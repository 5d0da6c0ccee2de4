//! The PaymentIntent: its state machine and its JSON.
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

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::cards::{self, Decline, Outcome, TestCard};
use crate::charge::{Charge, Owner};
use crate::error::StripeError;
use crate::ids;
use crate::requests::{
    AutomaticPaymentMethods, CancelRequest, CancellationReason, CaptureMethod, CaptureRequest,
    ConfirmationMethod, CreateRequest, Details, Expand, RefundRequest,
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
            payment_method: request.payment_method.map(|card| card.id.to_owned()),
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

    /// Charges the payment method: a hold for manual capture, a payment otherwise. A decline
    /// leaves the intent waiting for another payment method and answers 402; a card that needs
    /// 3-D Secure leaves it waiting for the buyer (`requires_action`), with no charge yet.
    pub(crate) fn confirm(&mut self, now: i64) -> Result<(), StripeError> {
        let card = self.payment_method.as_deref().and_then(cards::lookup);
        let Some(card) = card.filter(|_| self.status == Status::RequiresConfirmation) else {
            return Err(StripeError::unexpected_state(format!(
                "You cannot confirm this PaymentIntent because it has a status of {}.",
                self.status.as_str()
            ))
            .with_payment_intent(self.to_json()));
        };
        match card.outcome {
            Outcome::Approved | Outcome::ApprovedThenDisputed => {
                self.approve(card, now);
                Ok(())
            }
            Outcome::RequiresAuthentication | Outcome::RequiresAuthenticationThenDeclined(_) => {
                self.status = Status::RequiresAction;
                self.next_action = Some(self.next_action_for());
                Ok(())
            }
            Outcome::Declined(decline) => {
                let error = self.decline(card, decline, now);
                Err(error.with_payment_intent(self.to_json()))
            }
        }
    }

    /// The issuer declined `card`: a failed charge, and the intent waiting for another payment
    /// method, the decline as its `last_payment_error`; answers the decline.
    fn decline(&mut self, card: &TestCard, decline: Decline, now: i64) -> StripeError {
        let charge = Charge::new(card.id, false, None, now);
        let error = StripeError::card_declined(
            decline.code,
            decline.decline_code,
            decline.message,
            charge.id.clone(),
        );
        self.latest_charge = Some(charge);
        // Stripe detaches a declined payment method: the customer must supply another.
        self.status = Status::RequiresPaymentMethod;
        self.payment_method = None;
        self.next_action = None;
        self.last_payment_error = Some(error.clone());
        error
    }

    /// The issuer approved `card`: a hold (`requires_capture`) for manual capture, a payment
    /// otherwise.
    fn approve(&mut self, card: &TestCard, now: i64) {
        let hold = self.capture_method == CaptureMethod::Manual;
        let capture_before = hold.then_some(now + AUTHORIZATION_WINDOW_SECONDS);
        self.latest_charge = Some(Charge::new(card.id, true, capture_before, now));
        self.last_payment_error = None;
        self.next_action = None;
        if hold {
            self.status = Status::RequiresCapture;
            self.amount_capturable = self.amount;
        } else {
            self.settle(self.amount, now);
        }
    }

    /// The money moves: the intent has succeeded with `amount`, and a card that disputes once
    /// captured (`pm_card_createDispute`) has its charge disputed.
    fn settle(&mut self, amount: i64, now: i64) {
        self.status = Status::Succeeded;
        self.amount_received = amount;
        self.amount_capturable = 0;
        if let Some(charge) = &mut self.latest_charge {
            let card = cards::lookup(&charge.payment_method);
            if card.is_some_and(|card| card.outcome == Outcome::ApprovedThenDisputed) {
                charge.open_dispute(now);
            }
        }
    }

    /// The buyer's browser finished (or gave up on) the 3-D Secure challenge. Success goes on
    /// as an approval, or, for a card whose issuer then declines, as a decline; failure leaves
    /// the intent waiting for another payment method, with Stripe's
    /// `payment_intent_authentication_failure` as its `last_payment_error`
    /// (docs.stripe.com/error-codes#payment-intent-authentication-failure).
    pub(crate) fn authenticate(&mut self, outcome: Authentication, now: i64) -> Result<(), StripeError> {
        let card = self.payment_method.as_deref().and_then(cards::lookup);
        let Some(card) = card.filter(|_| self.status == Status::RequiresAction) else {
            return Err(StripeError::unexpected_state(format!(
                "Only a PaymentIntent with a status of requires_action can be authenticated; this one has \
                 a status of {}.",
                self.status.as_str()
            ))
            .with_payment_intent(self.to_json()));
        };
        match (outcome, card.outcome) {
            // Authenticated, and then the issuer declines (Stripe's 4000 0082 6000 3178): no
            // request is answered, so the decline is only the intent's `last_payment_error`.
            (Authentication::Succeeded, Outcome::RequiresAuthenticationThenDeclined(decline)) => {
                self.decline(card, decline, now);
            }
            (Authentication::Succeeded, _) => self.approve(card, now),
            (Authentication::Failed, _) => {
                self.status = Status::RequiresPaymentMethod;
                self.payment_method = None;
                self.next_action = None;
                self.last_payment_error = Some(StripeError::authentication_failure());
            }
        }
        Ok(())
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

    /// The `next_action` Stripe gives a card that needs 3-D Secure. With `use_stripe_sdk=true`
    /// (what the fleet sends), `use_stripe_sdk`, whose contents Stripe documents as "only
    /// intended to be used by Stripe.js" (docs.stripe.com/api/payment_intents/object
    /// #payment_intent_object-next_action-use_stripe_sdk): the 3DS2 fingerprint step, in the
    /// shape Stripe answers it. Without it, a `return_url` gets a `redirect_to_url`. With
    /// neither, Stripe's documentation says nothing; stripe-sim answers `use_stripe_sdk` of
    /// the older `three_d_secure_redirect` kind (a hosted page Stripe.js' `handleNextAction`
    /// opens), as Stripe has been seen to answer a server-side confirm.
    fn next_action_for(&self) -> Value {
        let source = ids::new("payatt");
        if self.use_stripe_sdk {
            return json!({
                "type": "use_stripe_sdk",
                "use_stripe_sdk": {
                    "type": "stripe_3ds2_fingerprint",
                    "merchant": "acct_stripe_sim",
                    "three_d_secure_2_source": source,
                    "directory_server_name": "visa",
                    "server_transaction_id": ids::uuid(),
                    "three_ds_method_url": "",
                    "three_ds_optimizations": "",
                    "directory_server_encryption": {
                        "directory_server_id": "A000000003",
                        "algorithm": "RSA",
                        "certificate": "",
                        "root_certificate_authorities": [],
                    },
                    "one_click_authn": null,
                },
            });
        }
        let url = format!(
            "https://hooks.stripe.com/3d_secure_2/hosted?merchant=acct_stripe_sim&payment_intent={}\
             &payment_intent_client_secret={}&source={source}",
            self.id, self.client_secret
        );
        match &self.return_url {
            Some(return_url) => json!({
                "type": "redirect_to_url",
                "redirect_to_url": { "url": url, "return_url": return_url },
            }),
            None => json!({
                "type": "use_stripe_sdk",
                "use_stripe_sdk": { "type": "three_d_secure_redirect", "stripe_js": url, "source": source },
            }),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::form::Params;

    /// A visa payment the fleet holds and captures later.
    const MANUAL_VISA: &str = "amount=1500&currency=usd&capture_method=manual&payment_method=pm_card_visa";
    /// A visa payment collected at once.
    const AUTOMATIC_VISA: &str = "amount=1500&currency=usd&payment_method=pm_card_visa";

    fn intent(body: &str) -> PaymentIntent {
        let request = CreateRequest::parse(&Params::parse(body.as_bytes())).unwrap();
        PaymentIntent::new(request, 1_700_000_000)
    }

    /// An intent made from `body` and confirmed with an approving card.
    fn confirmed(body: &str) -> PaymentIntent {
        let mut pi = intent(body);
        pi.confirm(1_700_000_000).unwrap();
        pi
    }

    #[test]
    fn a_manual_confirmation_holds_the_amount_and_an_automatic_one_collects_it() {
        for (body, status, capturable_and_received) in [
            (MANUAL_VISA, Status::RequiresCapture, (1500, 0)),
            (AUTOMATIC_VISA, Status::Succeeded, (0, 1500)),
        ] {
            let pi = confirmed(body);
            assert_eq!(pi.status, status, "{body}");
            assert_eq!((pi.amount_capturable, pi.amount_received), capturable_and_received, "{body}");
        }
    }

    #[test]
    fn a_decline_leaves_the_intent_waiting_for_a_payment_method() {
        let mut pi = intent("amount=1500&currency=usd&payment_method=pm_card_chargeDeclined");
        let error = pi.confirm(1_700_000_000).unwrap_err();
        assert_eq!(error.code, Some("card_declined"));
        assert_eq!(pi.status, Status::RequiresPaymentMethod);
        assert!(pi.last_payment_error.is_some());
        assert_eq!(error.payment_intent.unwrap()["status"], "requires_payment_method");
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
    fn a_3ds_card_waits_for_the_buyer_without_a_charge_and_success_places_the_hold() {
        let mut pi = intent(
            &format!("{MANUAL_VISA}&use_stripe_sdk=true")
                .replace("pm_card_visa", "pm_card_threeDSecure2Required"),
        );
        pi.confirm(1_700_000_000).unwrap();
        assert_eq!((pi.status, pi.amount_capturable), (Status::RequiresAction, 0));
        assert!(pi.latest_charge.is_none());
        assert_eq!(pi.to_json()["next_action"]["type"], "use_stripe_sdk");

        pi.authenticate(Authentication::Succeeded, 1_700_000_100).unwrap();
        assert_eq!((pi.status, pi.amount_capturable), (Status::RequiresCapture, 1500));
        assert!(pi.next_action.is_none());
        let charge = pi.latest_charge.as_ref().unwrap();
        assert_eq!(charge.capture_before, Some(1_700_000_100 + AUTHORIZATION_WINDOW_SECONDS));
        let again = pi.authenticate(Authentication::Failed, 1_700_000_200).unwrap_err();
        assert_eq!(again.code, Some("payment_intent_unexpected_state"));
    }

    #[test]
    fn a_failed_authentication_detaches_the_card_with_stripes_error() {
        let mut pi = intent(&MANUAL_VISA.replace("pm_card_visa", "pm_card_authenticationRequired"));
        pi.confirm(1_700_000_000).unwrap();
        pi.authenticate(Authentication::Failed, 1_700_000_100).unwrap();
        assert_eq!((pi.status, pi.payment_method.as_deref()), (Status::RequiresPaymentMethod, None));
        let error = pi.last_payment_error.as_ref().unwrap();
        assert_eq!(error.code, Some("payment_intent_authentication_failure"));
    }

    #[test]
    fn the_3178_card_once_authenticated_is_declined_for_insufficient_funds_and_waits_for_another_card() {
        // Arrange
        let card = "pm_card_authenticationRequiredChargeDeclinedInsufficientFunds";
        let mut pi = intent(&format!("{MANUAL_VISA}&use_stripe_sdk=true").replace("pm_card_visa", card));
        pi.confirm(1_700_000_000).unwrap();
        assert_eq!(pi.status, Status::RequiresAction);

        // Act
        pi.authenticate(Authentication::Succeeded, 1_700_000_100).unwrap();

        // Assert: no hold; a failed charge; the card detached; Stripe's card error kept.
        assert_eq!(
            (pi.status, pi.amount_capturable, pi.payment_method.as_deref()),
            (Status::RequiresPaymentMethod, 0, None)
        );
        assert!(pi.next_action.is_none());
        let error = pi.last_payment_error.as_ref().unwrap().object_json();
        assert_eq!(error["type"], "card_error");
        assert_eq!(
            (&error["code"], &error["decline_code"]),
            (&"card_declined".into(), &"insufficient_funds".into())
        );
        assert_eq!(error["message"], "Your card has insufficient funds.");
        assert_eq!(error["charge"], pi.latest_charge.as_ref().unwrap().id.as_str());
        assert_eq!(pi.charge_json().unwrap()["captured"], false);
    }

    #[test]
    fn the_3178_card_failing_authentication_is_an_authentication_failure_as_for_the_other_3ds_cards() {
        let card = "pm_card_authenticationRequiredChargeDeclinedInsufficientFunds";
        let mut pi = intent(&MANUAL_VISA.replace("pm_card_visa", card));
        pi.confirm(1_700_000_000).unwrap();

        pi.authenticate(Authentication::Failed, 1_700_000_100).unwrap();

        assert_eq!(pi.status, Status::RequiresPaymentMethod);
        assert_eq!(
            pi.last_payment_error.as_ref().unwrap().code,
            Some("payment_intent_authentication_failure")
        );
        assert!(pi.latest_charge.is_none());
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

    #[test]
    fn the_dispute_card_is_disputed_when_the_money_moves() {
        let mut held = confirmed(&MANUAL_VISA.replace("pm_card_visa", "pm_card_createDispute"));
        let collected = confirmed(&AUTOMATIC_VISA.replace("pm_card_visa", "pm_card_createDispute"));
        assert!(!held.disputed());
        held.capture(&CaptureRequest { amount_to_capture: None }, 1_700_000_001).unwrap();
        assert!(held.disputed() && collected.disputed());
        assert_eq!(held.dispute_json().unwrap()["status"], "needs_response");
    }

    #[test]
    fn a_payment_collected_at_once_has_no_deadline() {
        let pi = confirmed(AUTOMATIC_VISA);
        let card = &pi.to_json_expanded(Expand { latest_charge: true })["latest_charge"]["payment_method_details"]
            ["card"];
        assert!(card["capture_before"].is_null(), "{card}");
    }
}
