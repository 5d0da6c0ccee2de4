//! An operator's resolution of a `pending_authorization` order the sweeper cannot settle
//! (`fleetctl order resolve`).
//!
//! The sweeper settles a pending order from what Stripe's list shows of its intents. When
//! Stripe refuses that list for good ([`AuthorizationError::LookupRefused`]), it cannot know
//! whether the order has a hold, so it never authorizes again: the order keeps its units (SPEC
//! §8.8) and is reported stuck on every pass. A person then looks the order up in Stripe's
//! Dashboard (by its `order_id` metadata) and tells the fleet what is there:
//!
//! - [`Evidence::Intent`]: this PaymentIntent. It is read from Stripe by its id (a retrieve,
//!   which works when the list does not), checked to be this order's (its `metadata[order_id]`,
//!   amount, currency and manual capture), and recorded as the sweeper would have recorded
//!   it ([`authorization::record`]): `authorized`, `requires_action` or `payment_declined`.
//! - [`Evidence::NoIntent`]: there is none. The order is declined and its units go back, as a
//!   decline gives them.
//!
//! Either way the order's lease is taken first ([`authorization::take_over`]), so the
//! resolution never runs beside a buyer's retry or the sweeper; anything refused before the
//! record gives the lease back and changes nothing.

use crate::domain::records::order::{self, Order};
use crate::domain::steps::authorization::{self, Recorded};
use crate::domain::steps::leased::AuthorizationError;
use crate::domain::words::status::OrderStatus;
use orderfleet_payments::{Intent, PaymentError, Payments};
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;

/// What the operator found in Stripe's Dashboard for the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// The order's PaymentIntent.
    Intent(PaymentIntentId),
    /// No PaymentIntent carries the order's id.
    NoIntent,
}

/// A PaymentIntent's id as Stripe's Dashboard shows it: `pi_` and letters and digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentIntentId(String);

impl PaymentIntentId {
    /// Checks an id typed by a person. A client secret (`pi_…_secret_…`) or another object's
    /// id (`ch_…`, `py_…`) is refused rather than looked up.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let rest = raw.strip_prefix("pi_").unwrap_or_default();
        if rest.is_empty() || rest.len() > 250 || !rest.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(
                "a PaymentIntent id is pi_ and letters and digits, as Stripe's Dashboard shows it".into()
            );
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The `decline_detail` of an order an operator declined for having no PaymentIntent.
pub const NO_INTENT_DETAIL: &str =
    "operator: no PaymentIntent for the order in Stripe's Dashboard (fleetctl order resolve --none)";

/// Why an order was not resolved. Nothing was changed, unless the arm says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum ResolutionError {
    /// No order has this id.
    #[error("no order {0}")]
    UnknownOrder(OrderId),
    /// The order is past `pending_authorization`: nothing to resolve.
    #[error("order {id} is {status}, not pending_authorization: nothing to resolve")]
    NotPending {
        /// The order.
        id: OrderId,
        /// Where it is.
        status: OrderStatus,
    },
    /// A request or the sweeper works on the order now.
    #[error("order {id} is being worked on (its lease runs until {until}); look again after that")]
    Leased {
        /// The order.
        id: OrderId,
        /// The lease's end.
        until: chrono::DateTime<chrono::Utc>,
    },
    /// The PaymentIntent named is not this order's.
    #[error("{0}")]
    NotTheOrders(String),
    /// Stripe did not give the PaymentIntent (unknown id, or Stripe unavailable).
    #[error("cannot read the PaymentIntent from Stripe: {0}")]
    Stripe(PaymentError),
    /// Recording failed: Stripe did not answer a call the record makes, or the database failed.
    #[error(transparent)]
    Authorization(#[from] AuthorizationError),
    /// The database failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// Resolves the pending order `id` from what the operator found: takes its lease, records
/// the evidence, all within the sweeper's deadline for a pending order
/// ([`authorization::resume_deadline`]), under a lease that outlasts it.
pub async fn resolve(
    pool: &Pool,
    payments: &Payments,
    id: OrderId,
    evidence: &Evidence,
) -> Result<Recorded, ResolutionError> {
    let deadline = authorization::resume_deadline(payments);
    let Some(order) = authorization::take_over(pool, id, order::lease_for(deadline)).await? else {
        return Err(why_not_taken(pool, id).await?);
    };
    let recorded =
        authorization::within(deadline, async { Ok(record(pool, payments, &order, evidence).await) }).await?;
    if recorded.is_err()
        && let Err(e) = authorization::release(pool, &order).await
    {
        // Refused before anything was recorded: the order is as it was, and its lease lapses.
        tracing::warn!(error = %e, "cannot give the order's lease back; it lapses");
    }
    recorded
}

/// Records the evidence on the order, whose lease the caller holds.
async fn record(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    evidence: &Evidence,
) -> Result<Recorded, ResolutionError> {
    match evidence {
        Evidence::NoIntent => {
            tracing::warn!(order_id = %order.id, "an operator found no PaymentIntent; the order is declined");
            let moved = authorization::decline(pool, order.id, NO_INTENT_DETAIL, None).await?;
            Ok(if moved { Recorded::Declined(NO_INTENT_DETAIL.to_owned()) } else { Recorded::MovedElsewhere })
        }
        Evidence::Intent(payment_intent) => {
            let intent = payments.retrieve(payment_intent.as_str()).await.map_err(ResolutionError::Stripe)?;
            the_orders(order, &intent)?;
            tracing::warn!(order_id = %order.id, payment_intent = intent.id, status = ?intent.status,
                "an operator named the order's PaymentIntent; recording it");
            Ok(authorization::record(pool, payments, order, Ok(intent)).await?)
        }
    }
}

/// Whether `intent` is the one the fleet would have made for `order`: its `metadata[order_id]`,
/// its amount and currency, and manual capture.
fn the_orders(order: &Order, intent: &Intent) -> Result<(), ResolutionError> {
    let made_for = intent.order_id.as_deref().unwrap_or("no order");
    if made_for != order.id.to_string() {
        return Err(ResolutionError::NotTheOrders(format!(
            "PaymentIntent {} was made for order {made_for}, not {}",
            intent.id, order.id
        )));
    }
    let (amount, currency) = (order.amount.minor, order.amount.currency.as_str());
    if intent.amount != amount || intent.currency != currency || !intent.manual_capture {
        return Err(ResolutionError::NotTheOrders(format!(
            "PaymentIntent {} is {} {} (manual capture: {}), and order {} is {amount} {currency} with manual capture",
            intent.id, intent.amount, intent.currency, intent.manual_capture, order.id
        )));
    }
    Ok(())
}

/// Why the order's lease could not be taken: it is unknown, past pending, or leased.
async fn why_not_taken(pool: &Pool, id: OrderId) -> Result<ResolutionError, sqlx::Error> {
    let Some(order) = order::load(pool, id).await? else { return Ok(ResolutionError::UnknownOrder(id)) };
    Ok(match (order.status, order.intake_lease_until) {
        (OrderStatus::PendingAuthorization, Some(until)) => ResolutionError::Leased { id, until },
        (status, _) => ResolutionError::NotPending { id, status },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payment_intent_id_is_pi_and_letters_and_digits() {
        assert_eq!(
            PaymentIntentId::parse("pi_3MtwBwLkdIwHu7ix28a3tqPa").unwrap().as_str(),
            "pi_3MtwBwLkdIwHu7ix28a3tqPa"
        );
        for refused in ["", "pi_", "ch_3MtwBw", "pi_3Mtw_secret_YrKJ", "pi_3Mtw Bw", "PI_3MtwBw", "pi_é"] {
            assert!(PaymentIntentId::parse(refused).is_err(), "{refused:?}");
        }
        assert!(PaymentIntentId::parse(&format!("pi_{}", "a".repeat(251))).is_err());
    }
}
