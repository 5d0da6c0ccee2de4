//! The Charge a confirmation makes, and what can happen to it after: refunds and a dispute.
//!
//! The charge's JSON is async-stripe's `Charge` (every field its strict parser requires), as
//! the API shows it with `expand[]=latest_charge` and as `charge.refunded` carries it:
//! `captured`, `amount_captured`, `amount_refunded`, `refunded` (true only once everything
//! captured is refunded), `disputed`, `payment_intent`, and the card's `capture_before`.
//!
//! On the API version the fleet pins (after 2025-03-31.basil), cancelling an uncaptured
//! PaymentIntent no longer refunds its charge: `amount_refunded` stays 0, `refunded` false,
//! and no `charge.refunded` is sent (docs.stripe.com/changelog/basil/2025-03-31/
//! remove-refund-from-partial-capture-and-payment-cancellation-flow). Only `POST /v1/refunds`
//! refunds here.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::error::StripeError;
use crate::ids;
use crate::requests::{RefundReason, RefundRequest};

/// A charge: approved (a hold, or a payment) or declined.
#[derive(Debug, Clone)]
pub(crate) struct Charge {
    pub(crate) id: String,
    created: i64,
    paid: bool,
    /// The test card charged (a declined one is detached from the intent afterwards).
    pub(crate) payment_method: String,
    /// For a manual-capture hold: when Stripe stops honouring it.
    pub(crate) capture_before: Option<i64>,
    amount_refunded: i64,
    dispute: Option<Dispute>,
}

/// A cardholder's dispute of a captured charge (`pm_card_createDispute`).
#[derive(Debug, Clone)]
struct Dispute {
    id: String,
    created: i64,
}

/// What a charge's JSON takes from the PaymentIntent it belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub(crate) payment_intent: &'a str,
    pub(crate) amount: i64,
    /// What was captured: the intent's `amount_received`.
    pub(crate) amount_captured: i64,
    pub(crate) currency: &'a str,
}

impl Charge {
    pub(crate) fn new(payment_method: &str, paid: bool, capture_before: Option<i64>, now: i64) -> Self {
        Self {
            id: ids::new("ch"),
            created: now,
            paid,
            payment_method: payment_method.to_owned(),
            capture_before,
            amount_refunded: 0,
            dispute: None,
        }
    }

    pub(crate) fn disputed(&self) -> bool {
        self.dispute.is_some()
    }

    /// The cardholder disputes the charge (as `pm_card_createDispute`'s issuer does once the
    /// money has moved).
    pub(crate) fn open_dispute(&mut self, now: i64) {
        self.dispute.get_or_insert_with(|| Dispute { id: ids::new("dp"), created: now });
    }

    /// Refunds `request.amount` (by default, all that is left of what was captured), as
    /// `POST /v1/refunds` does, and answers the Refund. Stripe refuses a disputed charge, one
    /// already refunded in full, and more than is left (docs.stripe.com/api/refunds/create;
    /// codes from docs.stripe.com/error-codes).
    pub(crate) fn refund(
        &mut self,
        owner: &Owner<'_>,
        request: &RefundRequest,
        now: i64,
    ) -> Result<Value, StripeError> {
        if self.disputed() {
            return Err(StripeError::bad_request(format!(
                "Charge {} has been charged back; cannot issue a refund.",
                self.id
            ))
            .with_code("charge_disputed"));
        }
        let left = owner.amount_captured - self.amount_refunded;
        if left <= 0 {
            return Err(StripeError::bad_request(format!("Charge {} has already been refunded.", self.id))
                .with_code("charge_already_refunded"));
        }
        let amount = request.amount.unwrap_or(left);
        if amount > left {
            return Err(StripeError::invalid_param(
                "amount",
                format!("Refund amount ({amount}) is greater than unrefunded amount on charge ({left})"),
            )
            .with_code("amount_too_large"));
        }
        self.amount_refunded += amount;
        Ok(refund_json(self, owner, amount, request, now))
    }

    /// The charge as Stripe's API returns it.
    pub(crate) fn to_json(&self, owner: &Owner<'_>) -> Value {
        json!({
            "id": self.id,
            "object": "charge",
            "amount": owner.amount,
            "amount_captured": owner.amount_captured,
            "amount_refunded": self.amount_refunded,
            "balance_transaction": null,
            "billing_details": { "address": null, "email": null, "name": null, "phone": null, "tax_id": null },
            "captured": owner.amount_captured > 0,
            "created": self.created,
            "currency": owner.currency,
            "disputed": self.disputed(),
            "failure_code": null,
            "failure_message": null,
            "livemode": false,
            "metadata": {},
            "paid": self.paid,
            "payment_intent": owner.payment_intent,
            "payment_method": self.payment_method,
            "payment_method_details": {
                "type": "card",
                "card": { "capture_before": self.capture_before, "exp_month": 12, "exp_year": 2034 },
            },
            "refunded": owner.amount_captured > 0 && self.amount_refunded >= owner.amount_captured,
            "status": if self.paid { "succeeded" } else { "failed" },
        })
    }

    /// The Dispute, as `charge.dispute.created` carries it (docs.stripe.com/api/disputes/object):
    /// every field async-stripe's `Dispute` requires. A new dispute needs the merchant's
    /// response, and the test card's reason is `fraudulent` (docs.stripe.com/testing#disputes).
    pub(crate) fn dispute_json(&self, owner: &Owner<'_>) -> Option<Value> {
        let dispute = self.dispute.as_ref()?;
        Some(json!({
            "id": dispute.id,
            "object": "dispute",
            "amount": owner.amount_captured,
            "balance_transactions": [],
            "charge": self.id,
            "created": dispute.created,
            "currency": owner.currency,
            "enhanced_eligibility_types": [],
            "evidence": { "enhanced_evidence": {} },
            "evidence_details": {
                "due_by": dispute.created + 7 * 24 * 3600,
                "enhanced_eligibility": {},
                "has_evidence": false,
                "past_due": false,
                "submission_count": 0,
            },
            "is_charge_refundable": false,
            "livemode": false,
            "metadata": {},
            "payment_intent": owner.payment_intent,
            "reason": "fraudulent",
            "status": "needs_response",
        }))
    }
}

/// The Refund object (docs.stripe.com/api/refunds/object). Card refunds succeed at once in
/// test mode.
fn refund_json(charge: &Charge, owner: &Owner<'_>, amount: i64, request: &RefundRequest, now: i64) -> Value {
    let metadata: &BTreeMap<String, String> = &request.metadata;
    json!({
        "id": ids::new("re"),
        "object": "refund",
        "amount": amount,
        "balance_transaction": null,
        "charge": charge.id,
        "created": now,
        "currency": owner.currency,
        "destination_details": null,
        "metadata": metadata,
        "payment_intent": owner.payment_intent,
        "reason": request.reason.map(RefundReason::as_str),
        "receipt_number": null,
        "source_transfer_reversal": null,
        "status": "succeeded",
        "transfer_reversal": null,
    })
}
