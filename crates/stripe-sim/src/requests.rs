//! The parameters of each operation, parsed from the form into types at the edge, so the
//! state machine never sees a raw string.
//!
//! A request refused here never began executing, and, as Stripe documents for requests
//! that fail validation, no idempotent result is saved for it: the same key may be used again
//! with corrected parameters.
//!
//! This file holds each request and its parse, which checks how the parameters go together
//! (a confirm that could redirect needs a `return_url`); `fields` reads one form field as a
//! type, `checks` holds the rules Stripe's documentation sets on single values (the amount,
//! the currency, the payment method, `off_session`, automatic payment methods, metadata), and
//! `values` the typed values a request carries.

mod checks;
mod fields;
mod values;

use std::collections::BTreeMap;

pub(crate) use checks::REDIRECT_NEEDS_RETURN_URL;
use checks::{amount, at_least_the_minimum, currency, off_session, payment_method, payment_methods};
use fields::{boolean, integer, metadata, non_empty, one_of, positive_integer};
use values::AllowRedirects;
pub(crate) use values::{
    AutomaticPaymentMethods, CancellationReason, CaptureMethod, ConfirmationMethod, Details, Expand,
    RefundReason,
};

use crate::error::StripeError;
use crate::form::Params;
use crate::parameters;

/// `POST /v1/payment_intents`.
#[derive(Debug, Clone)]
pub(crate) struct CreateRequest {
    pub(crate) amount: i64,
    pub(crate) currency: String,
    pub(crate) capture_method: CaptureMethod,
    pub(crate) confirmation_method: ConfirmationMethod,
    pub(crate) confirm: bool,
    /// The PaymentMethod's id, as given (a test card's, or a minted one's).
    pub(crate) payment_method: Option<String>,
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
        at_least_the_minimum(amount, &currency)?;
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

/// `POST /v1/payment_intents/{id}/confirm` (docs.stripe.com/api/payment_intents/confirm): what
/// the buyer's page does with Stripe.js, for one: an intent waiting for a payment method (a
/// decline, a failed authentication) confirmed again with another card.
#[derive(Debug, Clone)]
pub(crate) struct ConfirmRequest {
    /// The PaymentMethod to confirm with; the intent's own when not given.
    pub(crate) payment_method: Option<String>,
    /// Where a redirect-based next action sends the buyer back to.
    pub(crate) return_url: Option<String>,
    /// Whether the answer carries the charge whole (`expand[]=latest_charge`).
    pub(crate) expand: Expand,
}

impl ConfirmRequest {
    pub(crate) fn parse(params: &Params) -> Result<Self, StripeError> {
        parameters::confirm_known_only(params)?;
        Ok(Self {
            payment_method: payment_method(params, false)?,
            return_url: non_empty(params, "return_url"),
            expand: Expand::from_params(params, ""),
        })
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

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    pub(super) fn create(body: &str) -> Result<CreateRequest, StripeError> {
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
        // What an older fleet sent: Stripe's answer on every API version since
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
    fn payment_method_types_are_refused_as_the_pinned_api_version_refuses_them() {
        // Removed as a writable parameter on 2026-09-30.endive: what an older fleet sent,
        // and what a create naming its card types still sends.
        for types in ["payment_method_types[]=card", "payment_method_types[0]=card"] {
            for extra in ["", "&automatic_payment_methods[enabled]=false"] {
                let body = format!("amount=1000&currency=usd&payment_method=pm_card_visa&{types}{extra}");
                let refused = create(&body).unwrap_err();
                assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{body}");
                assert_eq!(refused.code, Some("payment_method_types_no_longer_supported"), "{body}");
                assert_eq!(refused.param(), Some("payment_method_types"), "{body}");
            }
        }
    }

    #[test]
    fn a_parameter_the_create_does_not_take_is_refused_as_unknown() {
        let refused = create("amount=1000&currency=usd&card_types[0]=visa").unwrap_err();
        assert_eq!((refused.code, refused.param()), (Some("parameter_unknown"), Some("card_types")));
        assert_eq!(refused.message, "Received unknown parameter: card_types");
        assert!(
            create("amount=1000&currency=usd&allowed_payment_method_types[]=card&radar_options[session]=s")
                .is_ok()
        );
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
