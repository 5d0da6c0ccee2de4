//! What confirming a PaymentIntent does with each test card, and what the buyer's 3-D Secure
//! authentication does after it: the issuer approves (a hold, or a payment), declines (a
//! failed charge, the card detached), or asks for 3-D Secure (`requires_action` and the
//! `next_action` for the buyer's browser). The cards and their outcomes are `cards`'s; this
//! is the intent's side of them.

use serde_json::{Value, json};

use super::{AUTHORIZATION_WINDOW_SECONDS, Authentication, PaymentIntent, Status};
use crate::cards::{self, Decline, Outcome, TestCard};
use crate::charge::Charge;
use crate::error::StripeError;
use crate::ids;
use crate::requests::CaptureMethod;

impl PaymentIntent {
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
        let charge = Charge::new(self.payment_method.as_deref().unwrap_or(card.id), false, None, now);
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
        let payment_method = self.payment_method.as_deref().unwrap_or(card.id);
        self.latest_charge = Some(Charge::new(payment_method, true, capture_before, now));
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
    pub(super) fn settle(&mut self, amount: i64, now: i64) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::tests::{MANUAL_VISA, confirmed, intent};
    use crate::requests::{CaptureRequest, Expand};

    /// A visa payment collected at once.
    const AUTOMATIC_VISA: &str = "amount=1500&currency=usd&payment_method=pm_card_visa";

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
