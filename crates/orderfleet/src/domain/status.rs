//! An order's statuses (SPEC §5), and the sets of them the contract names.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema)]
#[sqlx(type_name = "order_status", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
/// Where an order is in its life; it only moves forward.
pub enum OrderStatus {
    /// Its units promised at the door; its authorization not yet recorded.
    PendingAuthorization,
    /// Its card needs 3-D Secure: the buyer authenticates (Stripe.js), until its deadline
    /// (`action_expires_at`); its units and place in line wait for them.
    RequiresAction,
    /// Its card holds the amount; waiting for the stock worker.
    Authorized,
    /// Its stock reserved; waiting for the capture.
    StockReserved,
    /// Captured: done.
    Paid,
    /// No unit left for it in line (a cut total); its hold released.
    RejectedOutOfStock,
    /// The card was declined; its units went back at once.
    PaymentDeclined,
    /// Stripe refused the capture (the hold expired, say); its units went back.
    CaptureFailed,
    /// Its hold expired or was cancelled outside the fleet before capture; its units (and
    /// stock, if reserved) went back.
    AuthorizationCanceled,
    /// Paid, then refunded in full outside the fleet; the unit stays sold.
    Refunded,
}

/// The sets of statuses that SPEC §5 names. In SQL each is a function of the migration
/// `status_sets` (`holds_units(status)`, …), the only place a statement spells statuses out;
/// [`OrderStatus::set`] is the code's, and a test holds the two equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusSet {
    /// Promised and not yet sold or failed: the units may still come back (`holds_units`).
    HoldsUnits,
    /// Captured: the units are the buyer's (`sold`).
    Sold,
    /// Ended without a sale: the units went back to the next buyer in line (`failed`).
    Failed,
}

impl OrderStatus {
    /// Every status, in the order of the database's enum.
    pub const ALL: [OrderStatus; 10] = [
        OrderStatus::PendingAuthorization,
        OrderStatus::RequiresAction,
        OrderStatus::Authorized,
        OrderStatus::StockReserved,
        OrderStatus::Paid,
        OrderStatus::RejectedOutOfStock,
        OrderStatus::PaymentDeclined,
        OrderStatus::CaptureFailed,
        OrderStatus::AuthorizationCanceled,
        OrderStatus::Refunded,
    ];

    /// Which of SPEC §5's sets it is in. A match without a wildcard: a new status does not
    /// compile until it is put in a set.
    pub const fn set(self) -> StatusSet {
        match self {
            OrderStatus::PendingAuthorization
            | OrderStatus::RequiresAction
            | OrderStatus::Authorized
            | OrderStatus::StockReserved => StatusSet::HoldsUnits,
            OrderStatus::Paid | OrderStatus::Refunded => StatusSet::Sold,
            OrderStatus::RejectedOutOfStock
            | OrderStatus::PaymentDeclined
            | OrderStatus::CaptureFailed
            | OrderStatus::AuthorizationCanceled => StatusSet::Failed,
        }
    }

    /// Holding units with no authorization recorded yet (the Stripe call, or the buyer's 3-D
    /// Secure): "pending" for line order (SPEC §1.3, §5), `awaiting_authorization(status)` in SQL.
    pub const fn awaits_authorization(self) -> bool {
        match self {
            OrderStatus::PendingAuthorization | OrderStatus::RequiresAction => true,
            OrderStatus::Authorized
            | OrderStatus::StockReserved
            | OrderStatus::Paid
            | OrderStatus::RejectedOutOfStock
            | OrderStatus::PaymentDeclined
            | OrderStatus::CaptureFailed
            | OrderStatus::AuthorizationCanceled
            | OrderStatus::Refunded => false,
        }
    }

    /// Its name in the database, the API and the notifications.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::PendingAuthorization => "pending_authorization",
            OrderStatus::RequiresAction => "requires_action",
            OrderStatus::Authorized => "authorized",
            OrderStatus::StockReserved => "stock_reserved",
            OrderStatus::Paid => "paid",
            OrderStatus::RejectedOutOfStock => "rejected_out_of_stock",
            OrderStatus::PaymentDeclined => "payment_declined",
            OrderStatus::CaptureFailed => "capture_failed",
            OrderStatus::AuthorizationCanceled => "authorization_canceled",
            OrderStatus::Refunded => "refunded",
        }
    }
}

impl std::fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
