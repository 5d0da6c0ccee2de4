//! Stripe's test payment methods: the fixed ids that, in test mode, stand for a card with a
//! known outcome (docs.stripe.com/testing). The fleet uses `pm_card_visa` (approved),
//! `pm_card_chargeDeclined` (declined), `pm_card_threeDSecure2Required` and
//! `pm_card_authenticationRequired` (the issuer asks for 3-D Secure on every payment),
//! `pm_card_authenticationRequiredChargeDeclinedInsufficientFunds` (3-D Secure, then declined
//! for insufficient funds once authenticated: Stripe's card 4000 0082 6000 3178), and
//! `pm_card_createDispute` (approved, then disputed once the money moves); a few siblings are
//! here so a demo can show other decline reasons.
//!
//! Anything else is a PaymentMethod this simulator has never seen, answered the way Stripe
//! answers an unknown id.

/// What the issuer says when the card is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Approved,
    Declined(Decline),
    /// The issuer asks the buyer to authenticate (3-D Secure) before it answers: the intent
    /// waits in `requires_action`, and then the card is approved.
    RequiresAuthentication,
    /// The same, and once the buyer has authenticated the issuer declines the payment.
    RequiresAuthenticationThenDeclined(Decline),
    /// Approved; once captured, the cardholder disputes the charge as fraudulent.
    ApprovedThenDisputed,
}

/// A decline as Stripe reports it: the error `code`, the issuer's `decline_code`, and the
/// message Stripe shows customers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decline {
    pub(crate) code: &'static str,
    pub(crate) decline_code: &'static str,
    pub(crate) message: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TestCard {
    pub(crate) id: &'static str,
    pub(crate) outcome: Outcome,
}

const GENERIC_DECLINE: Decline =
    Decline { code: "card_declined", decline_code: "generic_decline", message: "Your card was declined." };

const INSUFFICIENT_FUNDS: Decline = Decline {
    code: "card_declined",
    decline_code: "insufficient_funds",
    message: "Your card has insufficient funds.",
};

const TEST_CARDS: &[TestCard] = &[
    TestCard { id: "pm_card_visa", outcome: Outcome::Approved },
    TestCard { id: "pm_card_visa_debit", outcome: Outcome::Approved },
    TestCard { id: "pm_card_mastercard", outcome: Outcome::Approved },
    TestCard { id: "pm_card_amex", outcome: Outcome::Approved },
    TestCard { id: "pm_card_threeDSecure2Required", outcome: Outcome::RequiresAuthentication },
    TestCard { id: "pm_card_authenticationRequired", outcome: Outcome::RequiresAuthentication },
    TestCard {
        id: "pm_card_authenticationRequiredChargeDeclinedInsufficientFunds",
        outcome: Outcome::RequiresAuthenticationThenDeclined(INSUFFICIENT_FUNDS),
    },
    TestCard { id: "pm_card_createDispute", outcome: Outcome::ApprovedThenDisputed },
    TestCard { id: "pm_card_chargeDeclined", outcome: Outcome::Declined(GENERIC_DECLINE) },
    TestCard {
        id: "pm_card_chargeDeclinedInsufficientFunds",
        outcome: Outcome::Declined(INSUFFICIENT_FUNDS),
    },
    TestCard {
        id: "pm_card_chargeDeclinedExpiredCard",
        outcome: Outcome::Declined(Decline {
            code: "expired_card",
            decline_code: "expired_card",
            message: "Your card has expired.",
        }),
    },
];

/// The test card with this id, if it is one.
pub(crate) fn lookup(id: &str) -> Option<&'static TestCard> {
    TEST_CARDS.iter().find(|card| card.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleets_two_cards_approve_and_decline() {
        assert_eq!(lookup("pm_card_visa").map(|c| c.outcome), Some(Outcome::Approved));
        assert_eq!(
            lookup("pm_card_chargeDeclined").map(|c| c.outcome),
            Some(Outcome::Declined(GENERIC_DECLINE))
        );
        assert_eq!(lookup("pm_card_unknown"), None);
    }

    #[test]
    fn the_3ds_cards_ask_for_authentication_and_the_dispute_card_approves() {
        for id in ["pm_card_threeDSecure2Required", "pm_card_authenticationRequired"] {
            assert_eq!(lookup(id).map(|c| c.outcome), Some(Outcome::RequiresAuthentication), "{id}");
        }
        let dispute = lookup("pm_card_createDispute").map(|c| c.outcome);
        assert_eq!(dispute, Some(Outcome::ApprovedThenDisputed));
    }

    #[test]
    fn the_3178_card_asks_for_authentication_and_then_declines_for_insufficient_funds() {
        let card = lookup("pm_card_authenticationRequiredChargeDeclinedInsufficientFunds").map(|c| c.outcome);
        let Some(Outcome::RequiresAuthenticationThenDeclined(decline)) = card else { panic!("{card:?}") };
        assert_eq!((decline.code, decline.decline_code), ("card_declined", "insufficient_funds"));
    }
}
