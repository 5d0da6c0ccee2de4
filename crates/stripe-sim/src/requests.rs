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
use crate::parameters;

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
    /// On unless the request turns them off.
    pub(crate) automatic_payment_methods: Option<AutomaticPaymentMethods>,
    /// Cards when automatic payment methods are off; empty with them.
    pub(crate) payment_method_types: Vec<String>,
    pub(crate) details: Details,
    /// `use_stripe_sdk`: the buyer's Stripe.js (or mobile SDK) handles a next action, so a
    /// 3-D Secure card's `next_action` is of type `use_stripe_sdk`.
    pub(crate) use_stripe_sdk: bool,
    /// Where a redirect-based next action sends the buyer back to.
    pub(crate) return_url: Option<String>,
    /// Whether the answer carries the charge whole (`expand[]=latest_charge`).
    pub(crate) expand: Expand,
}

impl CreateRequest {
    /// Parameters the endpoint takes that this simulator has no use for
    /// (`payment_method_options`, …) are ignored rather than refused: real clients send them.
    /// Those it does not take, and `payment_method_types`, are refused first.
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        parameters::create_known_only(params)?;
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
        let (automatic_payment_methods, payment_method_types) = payment_methods(params)?;
        let may_redirect =
            automatic_payment_methods.is_some_and(|a| a.allow_redirects == AllowRedirects::Always);
        // Since 2023-08-16 a confirm needs a return_url unless redirects are ruled out or the
        // payment is off session (changelog/2023-08-16/automatic-payment-methods).
        let off_session = off_session(params)?;
        let return_url = non_empty(params, "return_url");
        if confirm && may_redirect && !off_session && return_url.is_none() {
            return Err(StripeError::bad_request(REDIRECT_NEEDS_RETURN_URL));
        }
        Ok(Self {
            amount,
            currency,
            capture_method,
            confirmation_method,
            confirm,
            payment_method,
            automatic_payment_methods,
            payment_method_types,
            details: Details::parse(params)?,
            use_stripe_sdk: boolean(params, "use_stripe_sdk")?.unwrap_or(false),
            return_url,
            expand: Expand::from_params(params, ""),
        })
    }
}

/// `GET /v1/payment_intents`: Stripe's list, newest first and consistent (no search lag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListRequest {
    /// `created` as an exact time, or its bounds `created[gt|gte|lt|lte]`, as one inclusive range.
    pub(crate) created: std::ops::RangeInclusive<i64>,
    /// 1 to 100; 10 when not given.
    pub(crate) limit: usize,
    /// The page after this intent.
    pub(crate) starting_after: Option<String>,
    pub(crate) expand: Expand,
}

impl ListRequest {
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        parameters::known_only(params, parameters::LIST)?;
        if non_empty(params, "ending_before").is_some() {
            // Said plainly rather than answered with the first page: the fleet pages forwards.
            let message = "stripe-sim pages forwards only: use starting_after";
            return Err(StripeError::invalid_param("ending_before", message));
        }
        let limit = match integer(params, "limit")? {
            None => 10,
            Some(n) if n < 1 => {
                return Err(StripeError::invalid_param(
                    "limit",
                    "This value must be greater than or equal to 1.",
                ));
            }
            Some(n) if n > 100 => {
                return Err(StripeError::invalid_param(
                    "limit",
                    "This value must be less than or equal to 100.",
                ));
            }
            Some(n) => n as usize,
        };
        let bound = |name: &'static str| integer(params, name);
        let created = match integer(params, "created")? {
            Some(at) => at..=at,
            None => {
                let from = match (bound("created[gte]")?, bound("created[gt]")?) {
                    (Some(gte), gt) => gte.max(gt.map_or(i64::MIN, |gt| gt.saturating_add(1))),
                    (None, gt) => gt.map_or(i64::MIN, |gt| gt.saturating_add(1)),
                };
                let to = match (bound("created[lte]")?, bound("created[lt]")?) {
                    (Some(lte), lt) => lte.min(lt.map_or(i64::MAX, |lt| lt.saturating_sub(1))),
                    (None, lt) => lt.map_or(i64::MAX, |lt| lt.saturating_sub(1)),
                };
                from..=to
            }
        };
        Ok(Self {
            created,
            limit,
            starting_after: non_empty(params, "starting_after"),
            expand: Expand::from_params(params, "data."),
        })
    }
}

/// An integer parameter, if given (any sign).
fn integer(params: &Params, name: &'static str) -> Result<Option<i64>, StripeError> {
    match params.get(name).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(raw) => raw.parse().map(Some).map_err(|_| {
            StripeError::invalid_param(name, format!("Invalid integer: {raw}"))
                .with_code("parameter_invalid_integer")
        }),
    }
}

/// Stripe's answer to a confirm that could redirect the buyer with nowhere to send them back.
pub(crate) const REDIRECT_NEEDS_RETURN_URL: &str = "This PaymentIntent is configured to accept payment methods \
    enabled in your Dashboard. Because some of these payment methods might redirect your customer off of your \
    page, you must provide a `return_url`. If you don't want to accept redirect-based payment methods, set \
    `automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` to `never` \
    when creating Setup Intents and Payment Intents.";

/// `automatic_payment_methods[…]`: the intent takes the payment methods enabled in the Dashboard
/// that fit it, redirect-based ones too unless `allow_redirects` is `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AutomaticPaymentMethods {
    pub(crate) allow_redirects: AllowRedirects,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllowRedirects {
    Always,
    Never,
}

impl AllowRedirects {
    const ALL: [AllowRedirects; 2] = [AllowRedirects::Always, AllowRedirects::Never];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AllowRedirects::Always => "always",
            AllowRedirects::Never => "never",
        }
    }
}

/// `off_session`: `true`, `one_off` or `recurring` (the customer is not in the checkout flow),
/// or `false`.
fn off_session(params: &Params) -> Result<bool, StripeError> {
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
fn payment_methods(params: &Params) -> Result<(Option<AutomaticPaymentMethods>, Vec<String>), StripeError> {
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
        parameters::known_only(params, parameters::CAPTURE)?;
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
        parameters::known_only(params, parameters::CANCEL)?;
        let cancellation_reason =
            one_of(params, "cancellation_reason", &CancellationReason::ALL, CancellationReason::as_str)?;
        Ok(Self { cancellation_reason })
    }
}

/// `POST /v1/refunds` (docs.stripe.com/api/refunds/create).
#[derive(Debug, Clone)]
pub(crate) struct RefundRequest {
    pub(crate) target: RefundTarget,
    /// What to refund; all that is left when not given.
    pub(crate) amount: Option<i64>,
    pub(crate) reason: Option<RefundReason>,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// What a refund names: the PaymentIntent, or its charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RefundTarget {
    PaymentIntent(String),
    Charge(String),
    /// Both, which must be the intent and its own charge.
    Both {
        payment_intent: String,
        charge: String,
    },
}

impl RefundRequest {
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        parameters::known_only(params, parameters::REFUND)?;
        let target = match (non_empty(params, "payment_intent"), non_empty(params, "charge")) {
            (Some(payment_intent), None) => RefundTarget::PaymentIntent(payment_intent),
            (None, Some(charge)) => RefundTarget::Charge(charge),
            (Some(payment_intent), Some(charge)) => RefundTarget::Both { payment_intent, charge },
            (None, None) => {
                return Err(StripeError::bad_request(
                    "One of the following params should be provided for this request: payment_intent or charge.",
                )
                .with_code("parameter_missing"));
            }
        };
        Ok(Self {
            target,
            amount: positive_integer(params, "amount")?,
            reason: one_of(params, "reason", &RefundReason::ALL, RefundReason::as_str)?,
            metadata: metadata(params)?,
        })
    }
}

/// The reasons a client may give for a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    const ALL: [RefundReason; 3] =
        [RefundReason::Duplicate, RefundReason::Fraudulent, RefundReason::RequestedByCustomer];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefundReason::Duplicate => "duplicate",
            RefundReason::Fraudulent => "fraudulent",
            RefundReason::RequestedByCustomer => "requested_by_customer",
        }
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
             &automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never\
             &use_stripe_sdk=true&metadata[order_id]=o-1&metadata[user_id]=u-1&expand[0]=latest_charge",
        )
        .unwrap();
        assert_eq!(request.amount, 2500);
        assert_eq!(request.currency, "usd");
        assert_eq!(request.capture_method, CaptureMethod::Manual);
        assert!(request.confirm);
        assert_eq!(request.details.metadata.get("order_id").map(String::as_str), Some("o-1"));
        let never = AutomaticPaymentMethods { allow_redirects: AllowRedirects::Never };
        assert_eq!((request.automatic_payment_methods, request.payment_method_types.len()), (Some(never), 0));
    }

    #[test]
    fn a_confirm_that_could_redirect_without_a_return_url_is_refused_as_stripe_refuses_it() {
        // What the fleet sent before issue 33: Stripe's answer on every API version since
        // 2023-08-16, where automatic payment methods are on unless payment_method_types is named.
        let before =
            "amount=2500&currency=usd&capture_method=manual&confirm=true&payment_method=pm_card_visa";
        let refused = create(before).unwrap_err();
        assert_eq!((refused.status, refused.param(), refused.code), (StatusCode::BAD_REQUEST, None, None));
        assert_eq!(refused.message, REDIRECT_NEEDS_RETURN_URL);
        // Redirects allowed explicitly: the same.
        assert!(create(&format!("{before}&automatic_payment_methods[enabled]=true")).is_err());
        // Allowed with a place to send the buyer back, with redirects ruled out, off session,
        // or without confirming.
        assert!(create(&format!("{before}&return_url=https://shop.example/back")).is_ok());
        let never =
            "automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never";
        assert!(create(&format!("{before}&{never}")).is_ok());
        // The hash without `enabled`, which Stripe requires in it.
        let missing =
            create(&format!("{before}&automatic_payment_methods[allow_redirects]=never")).unwrap_err();
        assert_eq!(missing.param(), Some("automatic_payment_methods[enabled]"));
        assert!(create(&format!("{before}&off_session=true")).is_ok());
        assert!(create(&format!("{before}&off_session=recurring")).is_ok());
        assert_eq!(create(&format!("{before}&off_session=yes")).unwrap_err().param(), Some("off_session"));
        assert!(create("amount=2500&currency=usd&payment_method=pm_card_visa").is_ok());
    }

    #[test]
    fn payment_method_types_are_never_filled_in_unless_automatic_payment_methods_are_turned_off() {
        let automatic = create("amount=10&currency=usd").unwrap();
        let always = AutomaticPaymentMethods { allow_redirects: AllowRedirects::Always };
        assert_eq!(
            (automatic.automatic_payment_methods, automatic.payment_method_types.len()),
            (Some(always), 0)
        );
        let off = create("amount=10&currency=usd&automatic_payment_methods[enabled]=false").unwrap();
        assert_eq!(
            (off.automatic_payment_methods, off.payment_method_types),
            (None, vec!["card".to_owned()])
        );
        let bad = create("amount=10&currency=usd&automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=sometimes")
            .unwrap_err();
        assert_eq!(bad.param(), Some("automatic_payment_methods[allow_redirects]"));
    }

    #[test]
    fn payment_method_types_are_refused_as_the_pinned_api_version_refuses_them() {
        // Removed as a writable parameter on 2026-09-30.endive: what the fleet sent before
        // issue 33, and what a create naming its card types still sends.
        for types in ["payment_method_types[]=card", "payment_method_types[0]=card"] {
            for extra in ["", "&automatic_payment_methods[enabled]=false"] {
                let body = format!("amount=10&currency=usd&payment_method=pm_card_visa&{types}{extra}");
                let refused = create(&body).unwrap_err();
                assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{body}");
                assert_eq!(refused.code, Some("payment_method_types_no_longer_supported"), "{body}");
                assert_eq!(refused.param(), Some("payment_method_types"), "{body}");
            }
        }
    }

    #[test]
    fn a_parameter_the_create_does_not_take_is_refused_as_unknown() {
        let refused = create("amount=10&currency=usd&card_types[0]=visa").unwrap_err();
        assert_eq!((refused.code, refused.param()), (Some("parameter_unknown"), Some("card_types")));
        assert_eq!(refused.message, "Received unknown parameter: card_types");
        assert!(
            create("amount=10&currency=usd&allowed_payment_method_types[]=card&radar_options[session]=s")
                .is_ok()
        );
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
    fn an_unknown_payment_method_is_a_missing_resource() {
        let error = create("amount=10&currency=usd&payment_method=pm_nope").unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert_eq!((error.code, error.param()), (Some("resource_missing"), Some("payment_method")));
    }

    #[test]
    fn use_stripe_sdk_and_return_url_are_kept_for_the_next_action() {
        let fleet = create("amount=100&currency=usd&use_stripe_sdk=true").unwrap();
        let redirect = create("amount=100&currency=usd&return_url=https://shop.example/back").unwrap();
        assert!(fleet.use_stripe_sdk && fleet.return_url.is_none());
        assert!(!redirect.use_stripe_sdk);
        assert_eq!(redirect.return_url.as_deref(), Some("https://shop.example/back"));
        assert!(create("amount=100&currency=usd&use_stripe_sdk=yes").is_err());
    }

    #[test]
    fn a_refund_names_an_intent_or_a_charge_and_may_give_an_amount_and_a_reason() {
        let refund = |body: &str| RefundRequest::parse(&Params::parse(body.as_bytes()));
        let by_intent = refund("payment_intent=pi_1&amount=500&reason=duplicate&metadata[k]=v").unwrap();
        assert_eq!(by_intent.target, RefundTarget::PaymentIntent("pi_1".into()));
        assert_eq!((by_intent.amount, by_intent.reason), (Some(500), Some(RefundReason::Duplicate)));
        assert_eq!(by_intent.metadata.get("k").map(String::as_str), Some("v"));
        assert_eq!(refund("charge=ch_1").unwrap().target, RefundTarget::Charge("ch_1".into()));
        assert_eq!(refund("charge=ch_1").unwrap().amount, None);
        for refused in ["", "amount=5", "payment_intent=pi_1&amount=0", "payment_intent=pi_1&reason=because"]
        {
            assert!(refund(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn an_unknown_cancellation_reason_is_refused() {
        let error = CancelRequest::parse(&Params::parse(b"cancellation_reason=bored")).unwrap_err();
        assert_eq!(error.param(), Some("cancellation_reason"));
        let ok = CancelRequest::parse(&Params::parse(b"cancellation_reason=abandoned")).unwrap();
        assert_eq!(ok.cancellation_reason, Some(CancellationReason::Abandoned));
    }
}
