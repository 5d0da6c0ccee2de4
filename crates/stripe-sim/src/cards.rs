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
    /// The card number it stands for (docs.stripe.com/testing): its brand, last four digits
    /// and fingerprint come from it.
    pub(crate) number: &'static str,
    pub(crate) brand: &'static str,
}

const GENERIC_DECLINE: Decline =
    Decline { code: "card_declined", decline_code: "generic_decline", message: "Your card was declined." };

const INSUFFICIENT_FUNDS: Decline = Decline {
    code: "card_declined",
    decline_code: "insufficient_funds",
    message: "Your card has insufficient funds.",
};

const TEST_CARDS: &[TestCard] = &[
    TestCard { id: "pm_card_visa", outcome: Outcome::Approved, number: "4242424242424242", brand: "visa" },
    TestCard {
        id: "pm_card_visa_debit",
        outcome: Outcome::Approved,
        number: "4000056655665556",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_mastercard",
        outcome: Outcome::Approved,
        number: "5555555555554444",
        brand: "mastercard",
    },
    TestCard { id: "pm_card_amex", outcome: Outcome::Approved, number: "378282246310005", brand: "amex" },
    TestCard {
        id: "pm_card_threeDSecure2Required",
        outcome: Outcome::RequiresAuthentication,
        number: "4000000000003220",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_authenticationRequired",
        outcome: Outcome::RequiresAuthentication,
        number: "4000002760003184",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_authenticationRequiredChargeDeclinedInsufficientFunds",
        outcome: Outcome::RequiresAuthenticationThenDeclined(INSUFFICIENT_FUNDS),
        number: "4000008260003178",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_createDispute",
        outcome: Outcome::ApprovedThenDisputed,
        number: "4000000000000259",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_chargeDeclined",
        outcome: Outcome::Declined(GENERIC_DECLINE),
        number: "4000000000000002",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_chargeDeclinedInsufficientFunds",
        outcome: Outcome::Declined(INSUFFICIENT_FUNDS),
        number: "4000000000009995",
        brand: "visa",
    },
    TestCard {
        id: "pm_card_chargeDeclinedExpiredCard",
        outcome: Outcome::Declined(Decline {
            code: "expired_card",
            decline_code: "expired_card",
            message: "Your card has expired.",
        }),
        number: "4000000000000069",
        brand: "visa",
    },
];

/// The test card with this id, if it is one, or the card a PaymentMethod minted here
/// ([`mint`]) behaves as.
pub(crate) fn lookup(id: &str) -> Option<&'static TestCard> {
    TEST_CARDS.iter().find(|card| card.id == id).or_else(|| minted().get(id).map(|m| m.like))
}

/// A PaymentMethod made with `POST /_sim/payment_methods`: a stand-in for a card a buyer types
/// into Stripe.js, behaving as a test card, with a fingerprint of its own choosing (Stripe
/// gives each card number one fingerprint per account, so two methods of one fingerprint are
/// one card).
struct Minted {
    like: &'static TestCard,
    fingerprint: String,
}

/// The minted PaymentMethods, by id, for the life of the process (or until a reset).
fn minted() -> std::sync::MutexGuard<'static, std::collections::HashMap<String, Minted>> {
    static MINTED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Minted>>> =
        std::sync::OnceLock::new();
    MINTED.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Mints a PaymentMethod that behaves as the test card `like`, with `fingerprint` (or its
/// card's own); `None` when `like` is no test card.
pub(crate) fn mint(like: &str, fingerprint: Option<String>) -> Option<String> {
    let like = TEST_CARDS.iter().find(|card| card.id == like)?;
    let id = crate::ids::new("pm");
    let fingerprint = fingerprint.unwrap_or_else(|| fingerprint_of(like.number));
    minted().insert(id.clone(), Minted { like, fingerprint });
    Some(id)
}

/// Forgets every minted PaymentMethod (`POST /_sim/reset`).
pub(crate) fn forget_minted() {
    minted().clear();
}

/// A card number's fingerprint: 16 characters, the same for every PaymentMethod of that
/// number, as Stripe's is within an account.
fn fingerprint_of(number: &str) -> String {
    use sha2::Digest;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let digest = sha2::Sha256::digest(format!("orderfleet-sim fingerprint {number}").as_bytes());
    digest.iter().take(16).map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char).collect()
}

/// `GET /v1/payment_methods/{id}` for a test card or a minted PaymentMethod: Stripe's
/// `payment_method` object, its `card` with `brand`, `last4` and `fingerprint`.
pub(crate) fn payment_method(id: &str) -> Option<serde_json::Value> {
    let (card, fingerprint) = match TEST_CARDS.iter().find(|card| card.id == id) {
        Some(card) => (card, fingerprint_of(card.number)),
        None => {
            let minted = minted();
            let m = minted.get(id)?;
            (m.like, m.fingerprint.clone())
        }
    };
    let last4 = &card.number[card.number.len() - 4..];
    Some(serde_json::json!({
        "id": id,
        "object": "payment_method",
        "type": "card",
        "created": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "livemode": false,
        "customer": null,
        "metadata": {},
        "allow_redisplay": "unspecified",
        "billing_details": {"address": {"city": null, "country": null, "line1": null, "line2": null, "postal_code": null, "state": null}, "email": null, "name": null, "phone": null},
        "card": {
            "brand": card.brand,
            "display_brand": card.brand,
            "last4": last4,
            "fingerprint": fingerprint,
            "exp_month": 12,
            "exp_year": 2034,
            "funding": "credit",
            "country": "US",
            "checks": {"address_line1_check": null, "address_postal_code_check": null, "cvc_check": "pass"},
            "networks": {"available": [card.brand], "preferred": null},
            "three_d_secure_usage": {"supported": true},
            "wallet": null,
            "generated_from": null,
        },
    }))
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
    fn a_card_number_has_one_fingerprint_and_a_minted_method_behaves_as_its_card() {
        let visa = payment_method("pm_card_visa").unwrap();
        assert_eq!(
            (visa["card"]["brand"].as_str(), visa["card"]["last4"].as_str()),
            (Some("visa"), Some("4242"))
        );
        assert_eq!(
            visa["card"]["fingerprint"],
            payment_method("pm_card_visa").unwrap()["card"]["fingerprint"]
        );
        assert_ne!(
            visa["card"]["fingerprint"],
            payment_method("pm_card_mastercard").unwrap()["card"]["fingerprint"]
        );
        let minted = mint("pm_card_chargeDeclined", Some("fp_shared_card_1".into())).unwrap();
        assert!(minted.starts_with("pm_"), "{minted}");
        assert_eq!(lookup(&minted).map(|c| c.outcome), Some(Outcome::Declined(GENERIC_DECLINE)));
        assert_eq!(payment_method(&minted).unwrap()["card"]["fingerprint"], "fp_shared_card_1");
        assert_eq!(mint("pm_card_nothing", None), None);
        assert_eq!(payment_method("pm_unknown"), None);
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
