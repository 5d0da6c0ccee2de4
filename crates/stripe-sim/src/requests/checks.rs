//! The rules Stripe's documentation sets on a create's single values, each refused with
//! Stripe's error: the amount (at most eight digits, and at least the currency's minimum
//! charge), the currency (three letters), the payment method (an unknown one is
//! `resource_missing`; a confirm needs one), `off_session`, and automatic payment methods (on
//! unless turned off, `enabled` required in the hash); and Stripe's message for a confirm that
//! could redirect with no `return_url`, which the create's parse refuses.

use axum::http::StatusCode;

use super::fields::{non_empty, positive_integer};
use super::values::{AllowRedirects, AutomaticPaymentMethods};
use crate::cards;
use crate::error::StripeError;
use crate::form::Params;

/// Stripe's ceiling: eight digits in the smallest currency unit.
const MAX_AMOUNT: i64 = 99_999_999;

/// Stripe's answer to a confirm that could redirect the buyer with nowhere to send them back.
pub(crate) const REDIRECT_NEEDS_RETURN_URL: &str = "This PaymentIntent is configured to accept payment methods \
    enabled in your Dashboard. Because some of these payment methods might redirect your customer off of your \
    page, you must provide a `return_url`. If you don't want to accept redirect-based payment methods, set \
    `automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` to `never` \
    when creating Setup Intents and Payment Intents.";

/// `off_session`: `true`, `one_off` or `recurring` (the customer is not in the checkout flow),
/// or `false`.
pub(super) fn off_session(params: &Params) -> Result<bool, StripeError> {
    match params.get("off_session").filter(|v| !v.is_empty()) {
        None | Some("false") => Ok(false),
        Some("true" | "one_off" | "recurring") => Ok(true),
        Some(_) => Err(StripeError::invalid_param(
            "off_session",
            "Invalid off_session: must be one of true, false, one_off or recurring",
        )),
    }
}

/// Which payment methods the intent takes. On the API version the fleet pins, automatic
/// payment methods are on unless the request turns them off (on since 2023-08-16; naming
/// `payment_method_types` instead is refused since 2026-09-30, before this runs): nothing is
/// filled in for the caller. Only a request that turns them off
/// (`automatic_payment_methods[enabled]=false`) gets the older default, cards.
pub(super) fn payment_methods(
    params: &Params,
) -> Result<(Option<AutomaticPaymentMethods>, Vec<String>), StripeError> {
    let automatic = params.hash("automatic_payment_methods");
    let enabled = match automatic.get("enabled").map(String::as_str) {
        // `enabled` is required whenever the hash is sent.
        None | Some("") if !automatic.is_empty() => {
            return Err(StripeError::missing_param("automatic_payment_methods[enabled]"));
        }
        None | Some("") => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(raw) => {
            let message = format!("Invalid boolean: {raw}");
            return Err(StripeError::invalid_param("automatic_payment_methods[enabled]", message));
        }
    };
    let allow_redirects = match automatic.get("allow_redirects").map(String::as_str) {
        None | Some("") => AllowRedirects::Always,
        Some(raw) => AllowRedirects::ALL.into_iter().find(|a| a.as_str() == raw).ok_or_else(|| {
            let message =
                "Invalid automatic_payment_methods[allow_redirects]: must be one of always or never";
            StripeError::invalid_param("automatic_payment_methods[allow_redirects]", message)
        })?,
    };
    Ok(match enabled {
        Some(false) => (None, vec!["card".to_owned()]),
        None | Some(true) => (Some(AutomaticPaymentMethods { allow_redirects }), Vec::new()),
    })
}

/// The amount: required, positive, and at most Stripe's ceiling.
pub(super) fn amount(params: &Params) -> Result<i64, StripeError> {
    let amount = positive_integer(params, "amount")?.ok_or_else(|| StripeError::missing_param("amount"))?;
    if amount > MAX_AMOUNT {
        return Err(StripeError::invalid_param(
            "amount",
            format!("Amount must be no more than {MAX_AMOUNT}."),
        )
        .with_code("amount_too_large"));
    }
    Ok(amount)
}

/// At least Stripe's minimum charge for the currency (docs.stripe.com/currencies, "Minimum and
/// maximum charge amounts"; the table is the fleet's own, [`orderfleet_words::minimum_charge`]),
/// or Stripe's `400` `amount_too_small` on `amount` (docs.stripe.com/error-codes#amount-too-small),
/// in Stripe's words ("Amount must be at least €0.50 eur"). A currency Stripe lists no minimum
/// for is let through.
pub(super) fn at_least_the_minimum(amount: i64, currency: &str) -> Result<(), StripeError> {
    let Some(minimum) = orderfleet_words::minimum_charge::minimum_charge(currency) else { return Ok(()) };
    if amount >= minimum.minor {
        return Ok(());
    }
    let symbol = match minimum.currency {
        "usd" | "aud" | "cad" | "hkd" | "mxn" | "nzd" | "sgd" => "$",
        "eur" => "€",
        "gbp" => "£",
        "jpy" => "¥",
        "inr" => "₹",
        _ => "",
    };
    let at_least = format!("{symbol}{} {}", minimum.major(), minimum.currency);
    Err(StripeError::invalid_param("amount", format!("Amount must be at least {at_least}"))
        .with_code("amount_too_small"))
}

/// The currency: required, three letters, lower-cased as Stripe answers it.
pub(super) fn currency(params: &Params) -> Result<String, StripeError> {
    let currency = params
        .get("currency")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| StripeError::missing_param("currency"))?;
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(StripeError::invalid_param(
            "currency",
            format!("Invalid currency: {currency}. Expected a three-letter ISO currency code."),
        ));
    }
    Ok(currency.to_ascii_lowercase())
}

/// The PaymentMethod named, if any, by its id as given (a test card's, or one minted here that
/// behaves as one): an unknown one is a missing resource, and confirming needs one.
pub(super) fn payment_method(params: &Params, confirm: bool) -> Result<Option<String>, StripeError> {
    let payment_method = match non_empty(params, "payment_method") {
        None => None,
        Some(id) if cards::lookup(&id).is_some() => Some(id),
        Some(id) => {
            return Err(StripeError::no_such(
                StatusCode::BAD_REQUEST,
                "PaymentMethod",
                &id,
                "payment_method",
            ));
        }
    };
    if confirm && payment_method.is_none() {
        return Err(StripeError::invalid_param(
            "payment_method",
            "You cannot confirm this PaymentIntent because it's missing a payment method. Update the \
             PaymentIntent with a payment method and then confirm it again.",
        )
        .with_code("payment_intent_unexpected_state"));
    }
    Ok(payment_method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::tests::create;

    #[test]
    fn payment_method_types_are_never_filled_in_unless_automatic_payment_methods_are_turned_off() {
        let automatic = create("amount=1000&currency=usd").unwrap();
        let always = AutomaticPaymentMethods { allow_redirects: AllowRedirects::Always };
        assert_eq!(
            (automatic.automatic_payment_methods, automatic.payment_method_types.len()),
            (Some(always), 0)
        );
        let off = create("amount=1000&currency=usd&automatic_payment_methods[enabled]=false").unwrap();
        assert_eq!(
            (off.automatic_payment_methods, off.payment_method_types),
            (None, vec!["card".to_owned()])
        );
        let bad = create("amount=1000&currency=usd&automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=sometimes")
            .unwrap_err();
        assert_eq!(bad.param(), Some("automatic_payment_methods[allow_redirects]"));
    }

    #[test]
    fn missing_and_malformed_amounts_name_the_parameter() {
        let missing = create("currency=usd").unwrap_err();
        assert_eq!((missing.param(), missing.code), (Some("amount"), Some("parameter_missing")));
        let zero = create("amount=0&currency=usd").unwrap_err();
        assert_eq!(zero.param(), Some("amount"));
        let text = create("amount=ten&currency=usd").unwrap_err();
        assert_eq!((text.param(), text.code), (Some("amount"), Some("parameter_invalid_integer")));
        let currency = create("amount=10").unwrap_err();
        assert_eq!(currency.param(), Some("currency"));
    }

    #[test]
    fn an_amount_below_the_currency_s_minimum_charge_is_too_small() {
        let cent = create("amount=1&currency=usd").unwrap_err();
        assert_eq!(
            (cent.status, cent.code, cent.param()),
            (StatusCode::BAD_REQUEST, Some("amount_too_small"), Some("amount"))
        );
        assert_eq!(cent.message, "Amount must be at least $0.50 usd");
        let yen = create("amount=49&currency=jpy").unwrap_err();
        assert_eq!(yen.message, "Amount must be at least ¥50 jpy");
        assert!(create("amount=50&currency=usd").is_ok());
        assert!(create("amount=30&currency=gbp").is_ok());
        // A currency Stripe lists no minimum for is Stripe's to judge.
        assert!(create("amount=1&currency=isk").is_ok());
    }

    #[test]
    fn an_unknown_payment_method_is_a_missing_resource() {
        let error = create("amount=1000&currency=usd&payment_method=pm_nope").unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert_eq!((error.code, error.param()), (Some("resource_missing"), Some("payment_method")));
    }
}
