//! The parameters each endpoint takes on the API version the fleet pins (2026-09-30.endive,
//! async-stripe 1.0's), and Stripe's refusal of any other: `400 invalid_request_error`, code
//! `parameter_unknown`, "Received unknown parameter: X" (docs.stripe.com/error-codes
//! #parameter-unknown; Stripe has refused unrecognized parameters since 2011-06-21,
//! docs.stripe.com/changelog/2011-06-21/exceptions-unrecognized-api-parameters).
//!
//! A nested parameter counts by its top name: `metadata[order_id]`, `expand[0]`, `expand[]`,
//! `created[gte]` are `metadata`, `expand`, `created`. Each list is the endpoint's parameters
//! in Stripe's API reference for that version (as async-stripe generates its request builders
//! from Stripe's OpenAPI description), all of them, not only those the simulator acts on: a
//! client may send any of them, and the simulator ignores those it has no use for.
//!
//! `payment_method_types` on a create is not unknown but removed, and refused with its own
//! code, `payment_method_types_no_longer_supported` (docs.stripe.com/changelog/endive/
//! 2026-09-30/removes-the-payment-method-types-parameter-from-payment-intents-and-setup-intents).
//!
//! A request refused here never began executing, so nothing is saved under its key.

use crate::error::StripeError;
use crate::form::Params;

/// `POST /v1/payment_intents`.
pub(crate) const CREATE: &[&str] = &[
    "allowed_payment_method_types",
    "amount",
    "amount_details",
    "application_fee_amount",
    "automatic_payment_methods",
    "capture_method",
    "confirm",
    "confirmation_method",
    "confirmation_token",
    "currency",
    "customer",
    "customer_account",
    "description",
    "error_on_requires_action",
    "excluded_payment_method_types",
    "expand",
    "hooks",
    "mandate",
    "mandate_data",
    "metadata",
    "off_session",
    "on_behalf_of",
    "payment_details",
    "payment_method",
    "payment_method_configuration",
    "payment_method_data",
    "payment_method_options",
    "radar_options",
    "receipt_email",
    "return_url",
    "setup_future_usage",
    "shipping",
    "statement_descriptor",
    "statement_descriptor_suffix",
    "transfer_data",
    "transfer_group",
    "use_stripe_sdk",
];

/// `GET /v1/payment_intents/{id}`.
pub(crate) const RETRIEVE: &[&str] = &["client_secret", "expand"];

/// `GET /v1/payment_intents`.
pub(crate) const LIST: &[&str] =
    &["created", "customer", "customer_account", "ending_before", "expand", "limit", "starting_after"];

/// `GET /v1/payment_intents/search`.
pub(crate) const SEARCH: &[&str] = &["expand", "limit", "page", "query"];

/// `POST /v1/payment_intents/{id}/confirm` (docs.stripe.com/api/payment_intents/confirm), as
/// async-stripe 1.0's `ConfirmPaymentIntent` lists them, and `client_secret`, which Stripe.js
/// sends with a publishable key; those this simulator has no use for are ignored.
pub(crate) const CONFIRM: &[&str] = &[
    "allowed_payment_method_types",
    "amount_details",
    "amount_to_confirm",
    "capture_method",
    "client_secret",
    "confirmation_token",
    "error_on_requires_action",
    "excluded_payment_method_types",
    "expand",
    "hooks",
    "mandate",
    "mandate_data",
    "off_session",
    "payment_details",
    "payment_method",
    "payment_method_data",
    "payment_method_options",
    "radar_options",
    "receipt_email",
    "return_url",
    "setup_future_usage",
    "shipping",
    "use_stripe_sdk",
];

/// `POST /v1/payment_intents/{id}/capture`.
pub(crate) const CAPTURE: &[&str] = &[
    "amount_details",
    "amount_to_capture",
    "application_fee_amount",
    "expand",
    "final_capture",
    "hooks",
    "metadata",
    "payment_details",
    "statement_descriptor",
    "statement_descriptor_suffix",
    "transfer_data",
];

/// `POST /v1/payment_intents/{id}/cancel`.
pub(crate) const CANCEL: &[&str] = &["cancellation_reason", "expand"];

/// `POST /v1/refunds`.
pub(crate) const REFUND: &[&str] = &[
    "amount",
    "charge",
    "currency",
    "customer",
    "expand",
    "instructions_email",
    "metadata",
    "origin",
    "payment_intent",
    "reason",
    "refund_application_fee",
    "reverse_transfer",
];

/// Refuses the first parameter of `params` that `accepted` does not name, as Stripe does.
pub(crate) fn known_only(params: &Params, accepted: &[&str]) -> Result<(), StripeError> {
    match params.top_names().find(|name| !accepted.contains(name)) {
        Some(unknown) => Err(StripeError::unknown_param(unknown)),
        None => Ok(()),
    }
}

/// A create's parameters: `payment_method_types` refused as removed, then any other the
/// endpoint does not know.
pub(crate) fn create_known_only(params: &Params) -> Result<(), StripeError> {
    no_payment_method_types(params)?;
    known_only(params, CREATE)
}

/// [`known_only`] for a confirm: `payment_method_types` refused as for a create.
pub(crate) fn confirm_known_only(params: &Params) -> Result<(), StripeError> {
    no_payment_method_types(params)?;
    known_only(params, CONFIRM)
}

/// `payment_method_types`, removed as a writable parameter on the pinned version.
fn no_payment_method_types(params: &Params) -> Result<(), StripeError> {
    if params.top_names().any(|name| name == "payment_method_types") {
        return Err(StripeError::payment_method_types_no_longer_supported());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    fn params(form: &str) -> Params {
        Params::parse(form.as_bytes())
    }

    #[test]
    fn nested_parameters_count_by_their_top_name() {
        let fleet = "amount=1&metadata[order_id]=o&expand[0]=latest_charge&expand[]=x\
                     &automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never";
        assert_eq!(known_only(&params(fleet), CREATE), Ok(()));
        assert_eq!(known_only(&params("created[gte]=1&created[lte]=2&limit=100"), LIST), Ok(()));
    }

    #[test]
    fn an_unknown_parameter_is_refused_by_its_top_name_in_stripes_words() {
        let error = known_only(&params("amount=1&shoe_size[left]=9"), CREATE).unwrap_err();
        assert_eq!(
            (error.status, error.code, error.param()),
            (StatusCode::BAD_REQUEST, Some("parameter_unknown"), Some("shoe_size"))
        );
        assert_eq!(error.message, "Received unknown parameter: shoe_size");
        assert_eq!(error.object_json()["type"], "invalid_request_error");
    }

    #[test]
    fn each_endpoint_takes_its_own_parameters() {
        assert!(known_only(&params("amount_to_capture=5"), CAPTURE).is_ok());
        assert!(known_only(&params("amount_to_capture=5"), CANCEL).is_err());
        assert!(known_only(&params("cancellation_reason=duplicate"), CANCEL).is_ok());
        assert!(known_only(&params("query=x&page=p"), SEARCH).is_ok());
        assert!(known_only(&params("page=p"), LIST).is_err());
        assert!(known_only(&params("client_secret=s&expand[]=latest_charge"), RETRIEVE).is_ok());
        assert!(known_only(&params("payment_intent=pi_1&reverse_transfer=true"), REFUND).is_ok());
    }

    #[test]
    fn payment_method_types_on_a_create_is_refused_as_removed_in_any_shape() {
        for form in
            ["payment_method_types[]=card", "payment_method_types[0]=card", "payment_method_types=card"]
        {
            let error = create_known_only(&params(&format!("amount=1&currency=usd&{form}"))).unwrap_err();
            assert_eq!(error.code, Some("payment_method_types_no_longer_supported"), "{form}");
            assert_eq!(
                (error.status, error.param()),
                (StatusCode::BAD_REQUEST, Some("payment_method_types"))
            );
        }
        assert!(create_known_only(&params("amount=1&allowed_payment_method_types[]=card")).is_ok());
    }
}
