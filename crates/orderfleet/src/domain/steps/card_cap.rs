//! One card's fair share (SPEC §8.13), counted: the card's lock for the product, then ONE
//! statement that counts the units its orders of the product hold or bought and stamps the card
//! on the order if it fits ([`fits`]). The first check, before an order's first PaymentIntent,
//! is the authorization's (`crate::domain::steps::authorization`'s card check); the second,
//! when a 3-D Secure intent's buyer confirmed it with another card, is the settle's
//! ([`recheck_after_action`], from [`crate::domain::steps::three_d_secure`]). No network call
//! is made inside the transaction.

use orderfleet_payments::{PaymentError, Payments};
use orderfleet_runtime::db::Pool;

use crate::domain::records::order::Order;
use crate::domain::words::status::{FailureReason, OrderStatus};

/// What the cap says of a 3-D Secure order whose intent now holds funds on another card.
#[derive(Debug)]
pub enum Rechecked {
    /// The intent's card is the one checked, or fits the cap too (and carries the order's
    /// units from now on), or the order has no cap.
    Fits,
    /// The intent's card would hold more than the cap: why, for operators.
    Over(String),
    /// Stripe will not show the intent's card (refused, or gone): why. The first check declines
    /// such an order; so does this one.
    Unreadable(String),
    /// The order is no longer waiting for its buyer (someone else settled it).
    MovedElsewhere,
}

/// Why [`recheck_after_action`] could not decide.
#[derive(Debug)]
pub enum RecheckError {
    /// Stripe did not answer the read of the card (unavailable, a 5xx, a lock): decide later.
    Stripe(PaymentError),
    /// The database's error, a refusal for good included (the caller's one rule).
    Database(sqlx::Error),
}

/// A 3-D Secure order held to a cap per card, whose intent now holds funds: the buyer's page
/// may have confirmed it with another card than the one checked before it was made (after a
/// failed authentication or a decline, Stripe detaches the card, and the intent's client
/// secret lets Stripe.js confirm it again with a new one:
/// docs.stripe.com/payments/paymentintents/lifecycle,
/// docs.stripe.com/api/payment_intents/confirm). That card is read and counted as the first
/// was, under its lock, before the order is authorized on it; if it fits, it carries the
/// order's units (fingerprint and payment method) from then on. The same card, or no cap:
/// nothing is read.
pub async fn recheck_after_action(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    intent: &orderfleet_payments::Intent,
) -> Result<Rechecked, RecheckError> {
    let Some(method) = intent.payment_method.as_deref() else { return Ok(Rechecked::Fits) };
    // Counted under a cap: held to one when promised its units, or stamped since, by a cap set
    // after it (the authorization's count of a product's earlier orders).
    let counted = order.card_cap.is_some() || order.card_fingerprint.is_some();
    if !counted || method == order.payment_method {
        return Ok(Rechecked::Fits);
    }
    let fingerprint = match payments.card_fingerprint(method).await {
        Ok(fingerprint) => fingerprint.unwrap_or_else(|| format!("payment_method:{method}")),
        Err(refused @ (PaymentError::Refused { .. } | PaymentError::Declined { .. })) => {
            return Ok(Rechecked::Unreadable(format!(
                "the card the buyer's page confirmed with ({method}) cannot be read at Stripe: {refused}"
            )));
        }
        Err(unanswered) => return Err(RecheckError::Stripe(unanswered)),
    };
    let fit = fits(pool, order, &fingerprint, Stamp::Swapped { payment_method: method })
        .await
        .map_err(RecheckError::Database)?;
    Ok(match fit {
        Fit::Fits => Rechecked::Fits,
        Fit::MovedElsewhere => Rechecked::MovedElsewhere,
        Fit::Over { held, cap } => Rechecked::Over(format!(
            "{}: the card the buyer's page confirmed with ({method}) already holds {held} of the product's \
             units, and may hold {cap}",
            FailureReason::CardLimitReached
        )),
    })
}

/// Whether the order fits under its card's cap.
pub(crate) enum Fit {
    /// It does, and carries the fingerprint now.
    Fits,
    /// It does not: the units the card's other orders of the product hold or bought, and the
    /// product's cap now.
    Over { held: i64, cap: i32 },
    /// It is no longer pending under its first check (someone else moved it).
    MovedElsewhere,
}

/// Which check [`fits`] makes.
#[derive(Clone, Copy)]
pub(crate) enum Stamp<'a> {
    /// The first, before any PaymentIntent: the order is `pending_authorization`, with no
    /// fingerprint yet (or this one, from a check whose answer was lost).
    First,
    /// The card a 3-D Secure intent was confirmed with instead: the order is `requires_action`,
    /// and this card, fitting, replaces the one first checked.
    Swapped { payment_method: &'a str },
}

/// The card's lock for this product, then ONE statement: the units the card's other orders of
/// the product hold or bought (every order that carries the fingerprint and has not failed),
/// and, if this order fits with them, the fingerprint written on it. A statement of its own
/// after the lock, so its snapshot sees every order committed before the lock was granted. The
/// cap is the product's now, read in that statement: one the operator lowered (or lifted) since
/// the order was promised its units counts as it stands.
pub(crate) async fn fits(
    pool: &Pool,
    order: &Order,
    fingerprint: &str,
    stamp: Stamp<'_>,
) -> sqlx::Result<Fit> {
    let (status, swapped_to) = match stamp {
        Stamp::First => (OrderStatus::PendingAuthorization, None),
        Stamp::Swapped { payment_method } => (OrderStatus::RequiresAction, Some(payment_method)),
    };
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('card/' || $1 || '/' || $2, 0))",
        fingerprint,
        &order.product_id as _,
    )
    .execute(&mut *tx)
    .await?;
    let seen = sqlx::query!(
        r#"WITH held AS (
             SELECT COALESCE(sum(quantity), 0)::int8 AS units FROM orders
              WHERE product_id = $2 AND card_fingerprint = $3 AND id <> $1
                AND (holds_units(status) OR sold(status))
         ), cap AS (
             SELECT max_per_card FROM products WHERE id = $2
         ), stamped AS (
             UPDATE orders SET card_fingerprint = $3, payment_method = COALESCE($5, payment_method),
                               updated_at = now()
              WHERE id = $1 AND status = $4
                AND ($5::text IS NOT NULL OR card_fingerprint IS NULL OR card_fingerprint = $3)
                AND (SELECT units FROM held) + quantity <= COALESCE((SELECT max_per_card FROM cap), quantity)
          RETURNING id
         )
         SELECT (SELECT units FROM held) AS "held!",
                COALESCE((SELECT max_per_card FROM cap), 0) AS "cap!",
                EXISTS (SELECT 1 FROM stamped) AS "stamped!",
                EXISTS (SELECT 1 FROM orders WHERE id = $1 AND status = $4
                                               AND ($5::text IS NOT NULL OR card_fingerprint IS NULL
                                                    OR card_fingerprint = $3))
                    AS "pending!""#,
        order.id as _,
        &order.product_id as _,
        fingerprint,
        status as _,
        swapped_to,
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(match (seen.stamped, seen.pending) {
        (true, _) => Fit::Fits,
        (false, true) => Fit::Over { held: seen.held, cap: seen.cap },
        (false, false) => Fit::MovedElsewhere,
    })
}
