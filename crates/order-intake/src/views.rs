//! What a buyer is shown of an order: the `202` body ([`Accepted`]), and the `GET` body
//! ([`OrderView`]), which is the same fields and three more. Both are built from the one
//! [`Order`]; their doc comments are the OpenAPI schemas' descriptions.

use chrono::{DateTime, Utc};
use orderfleet::domain::records::order::Order;
use orderfleet::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_words::{Currency, OrderId, Quantity, Sku};
use serde::Serialize;

/// The `202` body, and the first fields of an `Order`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    #[schema(value_type = uuid::Uuid)]
    /// The order's id.
    pub order_id: OrderId,
    /// Where it is in its life: in a `202`, `authorized` (units promised, payment held),
    /// `requires_action` (units promised; the buyer completes 3-D Secure with `payment`), or
    /// `queued` (taken in the product's pre-queue: no unit and no payment yet).
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
    /// Its place in line for its product, from 1; null for a queued order until the opening's
    /// draw places it.
    pub position: Option<i64>,
    /// For an order taken in a pre-queue: when the sale opens (its queue is drawn then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<DateTime<Utc>>,
    /// Only while `requires_action`: what the buyer's page completes 3-D Secure with, through
    /// Stripe.js's `handleNextAction({clientSecret})`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment: Option<PaymentAction>,
}

/// What a buyer's page needs to complete a card's 3-D Secure (SPEC §4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PaymentAction {
    /// The PaymentIntent's client secret, for Stripe.js (`handleNextAction`).
    pub client_secret: String,
    #[schema(value_type = Object)]
    /// Stripe's `next_action` (`{"type": "use_stripe_sdk", …}`).
    pub next_action: serde_json::Value,
    /// Until when the buyer may authenticate; then the order is released.
    pub action_expires_at: DateTime<Utc>,
}

impl PaymentAction {
    /// What the order's page needed when the order went `requires_action`; `None` for an order
    /// that never did.
    pub fn of(order: &Order) -> Option<Self> {
        Some(Self {
            client_secret: order.client_secret.clone()?,
            next_action: order.next_action.clone()?,
            action_expires_at: order.action_expires_at?,
        })
    }
}

impl Accepted {
    /// The fields of `order` as it is (`payment` while it is `requires_action`).
    pub fn of(order: &Order) -> Self {
        let payment = match order.status {
            OrderStatus::RequiresAction => PaymentAction::of(order),
            _ => None,
        };
        Self {
            order_id: order.id,
            status: order.status,
            amount: order.amount.minor,
            currency: order.amount.currency.clone(),
            product_id: order.product_id.clone(),
            quantity: order.quantity,
            position: order.position,
            opens_at: order.queued_for,
            payment,
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
    /// Why it failed; none while it has not.
    pub failure_reason: Option<FailureReason>,
    /// Only while it is `queued` or waits for its authorization: its place in line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<LineView>,
}

/// Where a waiting order is in its product's line (SPEC §4).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = Line, title = "Line")]
pub struct LineView {
    /// When the product opens (opened), for a product with an opening.
    pub opens_at: Option<DateTime<Utc>>,
    /// Its place; null until the opening's draw.
    pub position: Option<i64>,
    /// The queued orders ahead of it still waiting for a unit.
    pub queued_ahead: i64,
    /// The orders ahead of it waiting for their authorization.
    pub authorizations_ahead: i64,
    /// How long its own authorization is expected to wait at the fleet's present rate of
    /// authorizations; null when unknown (a queued order's, before it is promised its units).
    pub estimated_wait_seconds: Option<f64>,
}

impl OrderView {
    /// What the buyer is shown of `order`, with its place in line while it waits.
    pub fn new(order: Order, line: Option<LineView>) -> Self {
        let failure_reason = order.failure_reason;
        Self {
            order: Accepted::of(&order),
            created_at: order.created_at,
            updated_at: order.updated_at,
            failure_reason,
            line,
        }
    }
}

impl From<Order> for OrderView {
    fn from(order: Order) -> Self {
        Self::new(order, None)
    }
}
