//! A payment hold in the order's words: the words an order and the Stripe client both use,
//! below both, so neither imports the other for them.

use chrono::{DateTime, Utc};

use crate::OrderId;

/// An authorization hold, as a move of its order records it.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'a> {
    /// Its PaymentIntent's id.
    pub intent_id: &'a str,
    /// Until when Stripe honours it, when Stripe said.
    pub capture_before: Option<DateTime<Utc>>,
}

/// What a buyer's page needs to complete 3-D Secure, as a move to `requires_action` records
/// it, and the deadline the buyer has.
#[derive(Debug, Clone, Copy)]
pub struct BuyerAction<'a> {
    /// The PaymentIntent's client secret.
    pub client_secret: &'a str,
    /// Stripe's `next_action`, as Stripe gave it.
    pub next_action: &'a serde_json::Value,
    /// The buyer's deadline (`action_expires_at`).
    pub until: DateTime<Utc>,
}

/// An order's PaymentIntent, to capture or cancel under the order's current Stripe attempt's
/// key.
#[derive(Debug, Clone, Copy)]
pub struct OrderIntent<'a> {
    /// The order.
    pub order_id: OrderId,
    /// Its Stripe attempt, from 1.
    pub attempt: i32,
    /// The PaymentIntent.
    pub id: &'a str,
}
