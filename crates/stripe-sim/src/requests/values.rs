//! The typed values a request carries in place of raw strings: the enumerations Stripe
//! defines for a parameter (capture and confirmation methods, cancellation and refund
//! reasons, `allow_redirects`), automatic payment methods, the details an intent keeps and
//! shows back, and `expand`.

use std::collections::BTreeMap;

use super::fields::metadata;
use super::fields::non_empty;
use crate::error::StripeError;
use crate::form::Params;

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
    pub(super) const ALL: [AllowRedirects; 2] = [AllowRedirects::Always, AllowRedirects::Never];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AllowRedirects::Always => "always",
            AllowRedirects::Never => "never",
        }
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
    pub(super) fn parse(params: &Params) -> Result<Self, StripeError> {
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

/// The reasons a client may give for a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    pub(super) const ALL: [RefundReason; 3] =
        [RefundReason::Duplicate, RefundReason::Fraudulent, RefundReason::RequestedByCustomer];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefundReason::Duplicate => "duplicate",
            RefundReason::Fraudulent => "fraudulent",
            RefundReason::RequestedByCustomer => "requested_by_customer",
        }
    }
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
