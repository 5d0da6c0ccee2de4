//! The parameters of each operation, parsed from the form into types at the edge, so the
//! state machine never sees a raw string.
//!
//! A request refused here never began executing, and, as Stripe documents for requests
//! that fail validation, no idempotent result is saved for it: the same key may be used again
//! with corrected parameters.

use std::collections::BTreeMap;

use axum::http::StatusCode;

use crate::cards::{self, TestCard};
use crate::error::StripeError;
use crate::form::Params;

/// Stripe's ceiling: eight digits in the smallest currency unit.
const MAX_AMOUNT: i64 = 99_999_999;
const MAX_METADATA_KEYS: usize = 50;
const MAX_METADATA_KEY_CHARS: usize = 40;
const MAX_METADATA_VALUE_CHARS: usize = 500;

/// `POST /v1/payment_intents`.
#[derive(Debug, Clone)]
pub(crate) struct CreateRequest {
    pub(crate) amount: i64,
    pub(crate) currency: String,
    pub(crate) capture_method: CaptureMethod,
    pub(crate) confirmation_method: ConfirmationMethod,
    pub(crate) confirm: bool,
    pub(crate) payment_method: Option<&'static TestCard>,
    pub(crate) payment_method_types: Vec<String>,
    pub(crate) details: Details,
    /// Whether the answer carries the charge whole (`expand[]=latest_charge`).
    pub(crate) expand: Expand,
}

impl CreateRequest {
    /// Parameters this simulator has no use for (`payment_method_options`, …) are
    /// ignored rather than refused: real clients send them.
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        let amount = amount(params)?;
        let currency = currency(params)?;
        let capture_method = one_of(params, "capture_method", &CaptureMethod::ALL, CaptureMethod::as_str)?
            // Stripe's default for new integrations.
            .unwrap_or(CaptureMethod::AutomaticAsync);
        let confirmation_method =
            one_of(params, "confirmation_method", &ConfirmationMethod::ALL, ConfirmationMethod::as_str)?
                .unwrap_or(ConfirmationMethod::Automatic);
        let confirm = boolean(params, "confirm")?.unwrap_or(false);
        let payment_method = payment_method(params, confirm)?;
        let mut payment_method_types = params.array("payment_method_types");
        if payment_method_types.is_empty() {
            payment_method_types.push("card".to_owned());
        }
        Ok(Self {
            amount,
            currency,
            capture_method,
            confirmation_method,
            confirm,
            payment_method,
            payment_method_types,
            details: Details::parse(params)?,
            expand: Expand::from_params(params, ""),
        })
    }
}

/// What a PaymentIntent keeps for its owner and shows back, and the simulator never acts on:
/// the description, the metadata, the receipt and statement fields, the transfer group.
#[derive(Debug, Clone, Default)]
pub(crate) struct Details {
    pub(crate) description: Option<String>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) receipt_email: Option<String>,
    pub(crate) statement_descriptor: Option<String>,
    pub(crate) statement_descriptor_suffix: Option<String>,
    pub(crate) transfer_group: Option<String>,
}

impl Details {
    fn parse(params: &Params) -> Result<Self, StripeError> {
        Ok(Self {
            description: non_empty(params, "description"),
            metadata: metadata(params)?,
            receipt_email: non_empty(params, "receipt_email"),
            statement_descriptor: non_empty(params, "statement_descriptor"),
            statement_descriptor_suffix: non_empty(params, "statement_descriptor_suffix"),
            transfer_group: non_empty(params, "transfer_group"),
        })
    }
}

/// The amount: required, positive, and at most Stripe's ceiling.
fn amount(params: &Params) -> Result<i64, StripeError> {
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

/// The currency: required, three letters, lower-cased as Stripe answers it.
fn currency(params: &Params) -> Result<String, StripeError> {
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

/// The test card named, if any: an unknown one is a missing resource, and confirming needs one.
fn payment_method(params: &Params, confirm: bool) -> Result<Option<&'static TestCard>, StripeError> {
    let payment_method = match non_empty(params, "payment_method") {
        None => None,
        Some(id) => Some(cards::lookup(&id).ok_or_else(|| {
            StripeError::no_such(StatusCode::BAD_REQUEST, "PaymentMethod", &id, "payment_method")
        })?),
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

/// `POST /v1/payment_intents/{id}/capture`.
#[derive(Debug, Clone)]
pub(crate) struct CaptureRequest {
    pub(crate) amount_to_capture: Option<i64>,
}

impl CaptureRequest {
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        Ok(Self { amount_to_capture: positive_integer(params, "amount_to_capture")? })
    }
}

/// `POST /v1/payment_intents/{id}/cancel`.
#[derive(Debug, Clone)]
pub(crate) struct CancelRequest {
    pub(crate) cancellation_reason: Option<CancellationReason>,
}

impl CancelRequest {
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        let cancellation_reason =
            one_of(params, "cancellation_reason", &CancellationReason::ALL, CancellationReason::as_str)?;
        Ok(Self { cancellation_reason })
    }
}

fn non_empty(params: &Params, name: &str) -> Option<String> {
    params.get(name).filter(|v| !v.is_empty()).map(str::to_owned)
}

fn positive_integer(params: &Params, name: &'static str) -> Result<Option<i64>, StripeError> {
    let Some(raw) = params.get(name).filter(|v| !v.is_empty()) else { return Ok(None) };
    let value: i64 = raw.parse().map_err(|_| {
        StripeError::invalid_param(name, format!("Invalid integer: {raw}"))
            .with_code("parameter_invalid_integer")
    })?;
    if value < 1 {
        return Err(StripeError::invalid_param(name, "This value must be greater than or equal to 1.")
            .with_code("amount_too_small"));
    }
    Ok(Some(value))
}

fn boolean(params: &Params, name: &'static str) -> Result<Option<bool>, StripeError> {
    match params.get(name) {
        None | Some("") => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(raw) => Err(StripeError::invalid_param(name, format!("Invalid boolean: {raw}"))),
    }
}

fn one_of<T: Copy>(
    params: &Params,
    name: &'static str,
    all: &[T],
    as_str: fn(T) -> &'static str,
) -> Result<Option<T>, StripeError> {
    let Some(raw) = params.get(name).filter(|v| !v.is_empty()) else { return Ok(None) };
    match all.iter().copied().find(|&value| as_str(value) == raw) {
        Some(value) => Ok(Some(value)),
        None => {
            let allowed: Vec<&str> = all.iter().map(|&value| as_str(value)).collect();
            Err(StripeError::invalid_param(
                name,
                format!("Invalid {name}: must be one of {}", allowed.join(", ")),
            ))
        }
    }
}

/// `metadata[key]=value` pairs within Stripe's limits. An empty value unsets a key in Stripe,
/// which on a new object means leaving it out.
fn metadata(params: &Params) -> Result<BTreeMap<String, String>, StripeError> {
    let mut metadata = params.hash("metadata");
    metadata.retain(|_, value| !value.is_empty());
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(StripeError::invalid_param(
            "metadata",
            format!("You can specify up to {MAX_METADATA_KEYS} keys in metadata."),
        ));
    }
    for (key, value) in &metadata {
        if key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(StripeError::invalid_param(
                "metadata",
                format!("Metadata keys can have up to {MAX_METADATA_KEY_CHARS} characters: {key:?}"),
            ));
        }
        if value.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(StripeError::invalid_param(
                "metadata",
                format!("Metadata values can have up to {MAX_METADATA_VALUE_CHARS} characters (key {key:?})"),
            ));
        }
    }
    Ok(metadata)
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

/// The reasons a client may give when cancelling ([`CancellationReason::ALL`]), and the one
/// Stripe gives when it cancels a hold that outlived its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancellationReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
    Automatic,
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
            CancellationReason::Automatic => "automatic",
        }
    }
}

/// Which related objects an answer carries whole rather than as ids (Stripe's `expand`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Expand {
    pub(crate) latest_charge: bool,
}

impl Expand {
    /// From the `expand[]` parameters; `prefix` is `"data."` for a list or a search result.
    pub(crate) fn from_params(params: &Params, prefix: &str) -> Self {
        let wanted = format!("{prefix}latest_charge");
        Self { latest_charge: params.array("expand").contains(&wanted) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(body: &str) -> Result<CreateRequest, StripeError> {
        CreateRequest::parse(&Params::parse(body.as_bytes()))
    }

    #[test]
    fn what_the_fleet_sends_parses() {
        let request = create(
            "amount=2500&currency=USD&capture_method=manual&confirm=true&payment_method=pm_card_visa\
             &metadata[order_id]=o-1&metadata[user_id]=u-1&expand[0]=latest_charge",
        )
        .unwrap();
        assert_eq!(request.amount, 2500);
        assert_eq!(request.currency, "usd");
        assert_eq!(request.capture_method, CaptureMethod::Manual);
        assert!(request.confirm);
        assert_eq!(request.details.metadata.get("order_id").map(String::as_str), Some("o-1"));
        assert_eq!(request.payment_method_types, ["card"]);
    }

    #[test]
    fn missing_and_malformed_amounts_name_the_parameter() {
        let missing = create("currency=usd").unwrap_err();
        assert_eq!((missing.param, missing.code), (Some("amount"), Some("parameter_missing")));
        let zero = create("amount=0&currency=usd").unwrap_err();
        assert_eq!(zero.param, Some("amount"));
        let text = create("amount=ten&currency=usd").unwrap_err();
        assert_eq!((text.param, text.code), (Some("amount"), Some("parameter_invalid_integer")));
        let currency = create("amount=10").unwrap_err();
        assert_eq!(currency.param, Some("currency"));
    }

    #[test]
    fn an_unknown_payment_method_is_a_missing_resource() {
        let error = create("amount=10&currency=usd&payment_method=pm_nope").unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert_eq!((error.code, error.param), (Some("resource_missing"), Some("payment_method")));
    }

    #[test]
    fn an_unknown_cancellation_reason_is_refused() {
        let error = CancelRequest::parse(&Params::parse(b"cancellation_reason=bored")).unwrap_err();
        assert_eq!(error.param, Some("cancellation_reason"));
        let ok = CancelRequest::parse(&Params::parse(b"cancellation_reason=abandoned")).unwrap();
        assert_eq!(ok.cancellation_reason, Some(CancellationReason::Abandoned));
    }
}
