//! Authorizing an order whose lease the caller holds: the Stripe call outside any
//! transaction, then its answer recorded ([`super::record`]).

use orderfleet_payments::{AuthorizeRequest, Intent, PaymentError, Payments};
use orderfleet_runtime::db::Pool;

use super::card::{self, Checked};
use super::record::{Recorded, record};
use crate::domain::records::order::Order;
use crate::domain::steps::leased::AuthorizationError;

/// Authorizes the order (whose lease the caller holds) and records the result: its card
/// checked against its cap first, if it has one ([`super::card`]).
pub async fn authorize(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
) -> Result<Recorded, AuthorizationError> {
    let order = match card::check(pool, payments, order).await? {
        Checked::Go(order) => order,
        Checked::Ended(recorded) => return Ok(recorded),
    };
    let result = call_stripe(payments, &order).await;
    record(pool, payments, &order, result).await
}

/// The authorization request of the order's attempt, under that attempt's key.
pub(super) async fn call_stripe(payments: &Payments, order: &Order) -> Result<Intent, PaymentError> {
    let result = payments
        .authorize(&AuthorizeRequest {
            order_id: order.id,
            attempt: order.payment_attempt,
            user_id: &order.user_id,
            amount: &order.amount,
            payment_method: &order.payment_method,
        })
        .await;
    orderfleet_runtime::failpoint::hit("after_authorize");
    result
}

/// How many orders ahead of `order` in its product's line still wait for their authorization:
/// each needs a create before it, so with the fleet's create rate they tell its buyer how long
/// to wait. ONE statement, on the 503 path only.
pub async fn waiting_ahead(pool: &Pool, order: &Order) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "ahead!" FROM orders WHERE product_id = $1 AND position < $2 AND status = 'pending_authorization'"#,
        &order.product_id as _,
        order.position,
    )
    .fetch_one(pool)
    .await
}
