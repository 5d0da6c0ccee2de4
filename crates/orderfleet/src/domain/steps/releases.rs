//! The release of a PaymentIntent that no order will keep: cancelled now under a key of its
//! own, or, when Stripe does not answer, written down as owed (`intent_releases_owed`), which
//! the reconciliation of strays ([`crate::domain::recovery::strays`]) tries again every pass.
//! Below the steps that find such intents (a commit that lost its order, a webhook of a failed
//! order's hold, the rule for a refused move) and the reconciliation alike.

use anyhow::Context;

use orderfleet_payments::{PaymentError, Payments};
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;

/// Writes down (or, if it was owed already, counts another try of) a release Stripe did not
/// answer, so that the window moves on and the next pass tries it again.
pub async fn owe(
    pool: &Pool,
    order: OrderId,
    payment_intent: &str,
    found: &str,
    why: &PaymentError,
) -> anyhow::Result<()> {
    metrics::counter!(crate::metrics::STRAY_INTENTS_RELEASE_DEFERRED.name).increment(1);
    let why = why.to_string();
    tracing::warn!(order_id = %order, payment_intent, why, "a PaymentIntent to release could not be cancelled now; the next pass tries again");
    sqlx::query!(
        "INSERT INTO intent_releases_owed (payment_intent_id, order_id, found, last_error)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (payment_intent_id) DO UPDATE
            SET tries = intent_releases_owed.tries + 1, last_tried_at = now(), last_error = EXCLUDED.last_error,
                found = CASE WHEN EXCLUDED.found = 'order_refused' THEN EXCLUDED.found
                             ELSE intent_releases_owed.found END",
        payment_intent,
        order as _,
        found,
        why,
    )
    .execute(pool)
    .await
    .context("failed to record a release owed")?;
    Ok(())
}

/// Cancels the stray `payment_intent` of `order` under a key of its own
/// (`Payments::cancel_stray`), counted in `stray_intents_canceled_total{found}`. Stripe
/// refusing it (a key without the right, an intent in a state that cannot be cancelled) is
/// logged for a person and counted in `stray_intents_cancel_refused_total`; the error goes back
/// to the caller either way.
pub async fn release(
    payments: &Payments,
    order: OrderId,
    payment_intent: &str,
    found: &'static str,
) -> Result<(), PaymentError> {
    match payments.cancel_stray(order, payment_intent).await {
        Ok(_) => {
            metrics::counter!(crate::metrics::STRAY_INTENTS_CANCELED.name, "found" => found).increment(1);
            tracing::warn!(order_id = %order, payment_intent, found, "released a stray PaymentIntent");
            Ok(())
        }
        Err(
            e @ (PaymentError::Unavailable(_) | PaymentError::AttemptFailed(_) | PaymentError::Locked(_)),
        ) => Err(e),
        Err(refused) => {
            metrics::counter!(crate::metrics::STRAY_INTENTS_CANCEL_REFUSED.name).increment(1);
            let why = refused.to_string();
            tracing::error!(order_id = %order, payment_intent, why, "Stripe refused to cancel a stray PaymentIntent; cancel it in the Dashboard");
            Err(refused)
        }
    }
}
