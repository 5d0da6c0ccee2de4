//! The order's lease while it is authorized: taken, given back, and given back with the
//! attempt's 5xx dated.

use std::time::Duration;

use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;

use crate::domain::records::order::Order;
use crate::domain::words::status::OrderStatus;

/// Takes the lease of a `pending_authorization` order nobody works on (no lease, or an
/// expired one), for `lease`.
pub async fn take_over(pool: &Pool, id: OrderId, lease: Duration) -> sqlx::Result<Option<Order>> {
    crate::domain::records::order::take_lease(pool, id, OrderStatus::PendingAuthorization, lease, true).await
}

/// Gives the lease `order` was taken with back, if it is still this holder's, so a retry with
/// the same key (or the sweeper) may finish the order.
pub async fn release(pool: &Pool, order: &Order) -> sqlx::Result<()> {
    crate::domain::records::order::release_lease(pool, order, OrderStatus::PendingAuthorization).await
}

/// Gives the lease back if it is still this holder's ([`release`]), and marks the attempt as
/// one whose key answered a 5xx, dated now, whoever holds the lease: whatever the key made, it
/// made before this 5xx came back, so a list begun after this sees it ([`super::resume`]).
pub(super) async fn release_after_a_5xx(pool: &Pool, order: &Order) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE orders SET intake_lease_until = CASE WHEN intake_lease_until = $3 THEN NULL
                                                     ELSE intake_lease_until END,
                           payment_attempt_failed = payment_attempt_failed OR payment_attempt = $2,
                           payment_attempt_at = CASE WHEN payment_attempt = $2 THEN now()
                                                     ELSE payment_attempt_at END
          WHERE id = $1 AND status = 'pending_authorization'",
        order.id as _,
        order.payment_attempt,
        order.intake_lease_until,
    )
    .execute(pool)
    .await?;
    Ok(())
}
