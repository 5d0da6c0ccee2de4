//! One card's fair share (SPEC §8.13): before the first PaymentIntent of an order held to a
//! cap per card (`card_cap`), its payment method's card is read at Stripe
//! (`GET /v1/payment_methods/{id}`, within the fleet's budget on that operation), and the order
//! goes on only if that card's orders of the product, its own included, hold no more units than
//! the cap. Stripe gives one card number one `card.fingerprint` in an account, whichever buyer
//! or payment method carries it (docs.stripe.com/api/payment_methods/object, `card.fingerprint`),
//! so many accounts with one card count as one.
//!
//! The check is ONE short transaction ([`crate::domain::steps::card_cap`]), with no network
//! call in it: the card's lock for this product (so two orders of one card, at two intakes, pass
//! one at a time), then one statement that counts the card's units and writes the fingerprint on
//! the order if it fits. An order
//! over the cap ends `payment_declined` with `card_limit_reached`, its units back for the next in
//! line ([`super::record`]'s `fail`), and no PaymentIntent is ever made for it. An order with no
//! cap costs nothing here: no read, no statement. A cap set once orders were promised counts
//! them too: their cards are read once, by the first check after it ([`count_earlier_orders`]).

use std::borrow::Cow;

use orderfleet_payments::{PaymentError, Payments};
use orderfleet_runtime::db::Pool;

use super::lease;
use super::record::{Recorded, fail, record};
use crate::domain::records::order::Order;
use crate::domain::steps::card_cap::{Fit, Stamp, fits};
use crate::domain::steps::leased::AuthorizationError;
use crate::domain::steps::refusal::{self, Ended};
use crate::domain::words::status::{FailureReason, OrderStatus};

/// What the card check came to.
#[derive(Debug)]
pub(crate) enum Checked<'a> {
    /// Go on to the PaymentIntent: the order, with its card's fingerprint when it has a cap
    /// (borrowed as given when there was nothing to check: no copy on an uncapped order; boxed,
    /// so the answer that ends the order is not the size of one).
    Go(Box<Cow<'a, Order>>),
    /// The order is decided without a PaymentIntent: over the cap, its payment method refused
    /// by Stripe, or moved on by someone else.
    Ended(Recorded),
}

/// Checks `order`'s card against its cap, if it has one and has not passed already.
pub(crate) async fn check<'a>(
    pool: &Pool,
    payments: &Payments,
    order: &'a Order,
) -> Result<Checked<'a>, AuthorizationError> {
    if order.card_cap.is_none() || order.card_fingerprint.is_some() {
        return Ok(Checked::Go(Box::new(Cow::Borrowed(order))));
    }
    let fingerprint = match payments.card_fingerprint(&order.payment_method).await {
        // A payment method with no card fingerprint is counted as a card of its own.
        Ok(fingerprint) => fingerprint.unwrap_or_else(|| format!("payment_method:{}", order.payment_method)),
        // Classified as the authorization's own answers are: unreachable, the order stays
        // pending (its lease given back); refused (no such payment method), it is declined.
        Err(e) => return record(pool, payments, order, Err(e)).await.map(Checked::Ended),
    };
    if let Err(unanswered) = count_earlier_orders(pool, payments, order).await {
        lease::release(pool, order).await?;
        return Err(unanswered);
    }
    let fit = match fits(pool, order, &fingerprint, Stamp::First).await {
        Ok(fit) => fit,
        Err(e) => return refused(pool, payments, order, e).await,
    };
    match fit {
        Fit::Fits => Ok(Checked::Go(Box::new(Cow::Owned(Order {
            card_fingerprint: Some(fingerprint),
            ..order.clone()
        })))),
        Fit::MovedElsewhere => Ok(Checked::Ended(Recorded::MovedElsewhere)),
        Fit::Over { held, cap } => {
            let detail = format!(
                "{}: the card already holds {held} of the product's units, and may hold {cap}",
                FailureReason::CardLimitReached
            );
            match fail(pool, order.id, FailureReason::CardLimitReached, &detail, None).await {
                Ok(moved) => {
                    Ok(Checked::Ended(if moved { Recorded::OverCardCap } else { Recorded::MovedElsewhere }))
                }
                Err(e) => refused(pool, payments, order, e).await,
            }
        }
    }
}

/// The one rule for a move the database refuses for good (SPEC §8.5): no hold exists yet, so
/// the order only ends failed (`order_refused`), or is left for a person with why. Any other
/// database error is the fleet's: the order keeps its lease until it lapses.
async fn refused(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    e: sqlx::Error,
) -> Result<Checked<'static>, AuthorizationError> {
    if !orderfleet_runtime::db::refused_for_good(&e) {
        return Err(e.into());
    }
    let target = (order, OrderStatus::PendingAuthorization, None);
    match refusal::end_refused(pool, payments, target, &e, refusal::Path::Authorization).await {
        Ended::Failed(words) => Ok(Checked::Ended(Recorded::Refused(words))),
        Ended::MovedElsewhere => Ok(Checked::Ended(Recorded::MovedElsewhere)),
        Ended::Stuck(reason) => Err(AuthorizationError::OrderRefused(reason)),
    }
}

/// The product's orders that hold or bought units and were promised them before its cap was set
/// (`card_cap` NULL), whose cards were never read: the cap counts them too (SPEC §8.13: "every
/// order that holds or has bought units"), so each one's card is read now, once, and its
/// fingerprint written on it. With the cap set before the sale, there are none: one indexed
/// lookup that finds nothing. Stripe unreachable: the order waits, as for its own card.
async fn count_earlier_orders(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
) -> Result<(), AuthorizationError> {
    let uncounted = sqlx::query!(
        r#"SELECT id AS "id: orderfleet_words::OrderId", payment_method FROM orders
            WHERE product_id = $1 AND card_cap IS NULL AND card_fingerprint IS NULL
              AND (holds_units(status) OR sold(status))"#,
        &order.product_id as _,
    )
    .fetch_all(pool)
    .await?;
    for earlier in uncounted {
        let fingerprint = match payments.card_fingerprint(&earlier.payment_method).await {
            Ok(fingerprint) => fingerprint,
            // Its payment method is gone at Stripe: a card of its own, as below.
            Err(PaymentError::Refused { .. } | PaymentError::Declined { .. }) => None,
            Err(
                PaymentError::Unavailable(reason)
                | PaymentError::AttemptFailed(reason)
                | PaymentError::Locked(reason),
            ) => return Err(AuthorizationError::ProviderUnavailable(reason)),
        };
        let fingerprint = fingerprint.unwrap_or_else(|| format!("payment_method:{}", earlier.payment_method));
        let stamped = sqlx::query!(
            "UPDATE orders SET card_fingerprint = $2 WHERE id = $1 AND card_fingerprint IS NULL",
            earlier.id as _,
            fingerprint,
        )
        .execute(pool)
        .await;
        match stamped {
            // One buyer's order the database will not touch is theirs to sort out; it is not
            // counted, and the others go on.
            Err(e) if orderfleet_runtime::db::refused_for_good(&e) => {
                tracing::warn!(order_id = %earlier.id, error = %e, "the database refused an earlier order's card fingerprint");
            }
            stamped => {
                stamped?;
            }
        }
    }
    Ok(())
}
