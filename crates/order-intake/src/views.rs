//! What a buyer is shown of an order: the `202` body ([`Accepted`]), and the `GET` body
//! ([`OrderView`]), which is the same fields and three more. Both are built from the one
//! [`Order`]; their doc comments are the OpenAPI schemas' descriptions.

use chrono::{DateTime, Utc};
use orderfleet::domain::order::{Order, OrderStatus};
use orderfleet::domain::{Currency, OrderId, Quantity, Sku};
use serde::Serialize;

/// The `202` body, and the first fields of an `Order`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    #[schema(value_type = uuid::Uuid)]
    /// The order's id.
    pub order_id: OrderId,
    /// Where it is in its life: always `authorized` in a `202` (units promised, payment held).
    pub status: OrderStatus,
    /// The price times the quantity, in minor units.
    pub amount: i64,
    #[schema(value_type = String)]
    /// The amount's currency.
    pub currency: Currency,
    #[schema(value_type = String)]
    /// The product.
    pub product_id: Sku,
    #[schema(value_type = i32)]
    /// How many units.
    pub quantity: Quantity,
    /// Its place in line for its product, from 1.
    pub position: i64,
}

impl Accepted {
    /// The fields of `order` as it is.
    pub fn of(order: &Order) -> Self {
        Self {
            order_id: order.id,
            status: order.status,
            amount: order.amount.minor,
            currency: order.amount.currency.clone(),
            product_id: order.product_id.clone(),
            quantity: order.quantity,
            position: order.position,
        }
    }
}

// What its buyer is shown of an `Order` (this doc comment is the schema's description).
/// `GET /v1/orders/{id}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Order, title = "Order")]
pub struct OrderView {
    #[serde(flatten)]
    /// The fields a `202` has.
    pub order: Accepted,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// When it last moved.
    pub updated_at: DateTime<Utc>,
    /// Why it failed, as a code; none while it has not.
    pub failure_reason: Option<String>,
}

impl From<Order> for OrderView {
    fn from(order: Order) -> Self {
        // A refused capture answers its code, whatever an older stock worker wrote there
        // before it learned to keep Stripe's words to the operators' column.
        let failure_reason = match order.status {
            OrderStatus::CaptureFailed => Some(OrderStatus::CaptureFailed.as_str().to_owned()),
            _ => order.failure_reason.clone(),
        };
        Self {
            order: Accepted::of(&order),
            created_at: order.created_at,
            updated_at: order.updated_at,
            failure_reason,
        }
    }
}
