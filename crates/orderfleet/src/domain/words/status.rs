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
    /// Taken in its product's pre-queue (SPEC §1.8): no unit and no PaymentIntent yet; placed
    /// in line by the draw at the opening, then promised its units in line order.
    Queued,
    /// A queued order no unit was left for, and none could come back: it never held any.
    SoldOut,
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
    /// In a pre-queue, holding nothing yet (`queued`).
    Waiting,
    /// Ended without ever holding a unit (`sold_out`).
    NeverServed,
}

impl OrderStatus {
    /// Every status, in the order of the database's enum.
    pub const ALL: [OrderStatus; 12] = [
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
        OrderStatus::Queued,
        OrderStatus::SoldOut,
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
            OrderStatus::Queued => StatusSet::Waiting,
            OrderStatus::SoldOut => StatusSet::NeverServed,
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
            | OrderStatus::Refunded
            | OrderStatus::Queued
            | OrderStatus::SoldOut => false,
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
            OrderStatus::Queued => "queued",
            OrderStatus::SoldOut => "sold_out",
        }
    }
}

impl std::fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an order failed, as its buyer and the notifications read it (`failure_reason`): a code,
/// never the provider's words, which go to the operators' `decline_detail` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// Every unit went to orders ahead of it (`rejected_out_of_stock`).
    OutOfStock,
    /// The card was declined (`payment_declined`).
    PaymentDeclined,
    /// The database refused the order's commit for good; its hold was cancelled
    /// (`payment_declined`).
    OrderRefused,
    /// Its buyer failed 3-D Secure (`payment_declined`).
    AuthenticationFailed,
    /// Its buyer did not complete 3-D Secure by the deadline (`payment_declined`).
    AuthenticationTimedOut,
    /// Its PaymentIntent was cancelled outside the fleet while the buyer authenticated
    /// (`payment_declined`).
    PaymentCanceled,
    /// Stripe refused the capture (`capture_failed`).
    CaptureFailed,
    /// Its hold expired or was cancelled outside the fleet before capture
    /// (`authorization_canceled`).
    AuthorizationCanceled,
    /// The fleet's own attempt never confirmed its PaymentIntent (a 5xx on the way), which was
    /// then cancelled (`payment_declined`): not the buyer's card.
    AuthorizationIncomplete,
    /// A queued order for which no unit was left at or after the opening (`sold_out`).
    SoldOut,
    /// Its card would have held more units of the product than the product's `--max-per-card`
    /// (`payment_declined`): no PaymentIntent was made, and it is not a card decline.
    CardLimitReached,
    /// A code this version does not write: one a later version added, read from an order that
    /// version ended (after a rollback). It reads and shows as its code.
    #[serde(untagged)]
    Other(OtherReason),
}

/// A failure reason's code this version does not know, kept as read: interned, so that
/// [`FailureReason`] stays `Copy` and an order that carries it loads and shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OtherReason(&'static str);

impl OtherReason {
    /// The most distinct unknown codes one process keeps; past it, every other reads as
    /// `unrecognized_reason` (a later version adds a handful, not thousands).
    const MOST: usize = 64;

    fn intern(code: &str) -> Self {
        use std::collections::HashSet;
        use std::sync::{Mutex, OnceLock, PoisonError};
        static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = seen.get(code) {
            return OtherReason(known);
        }
        if seen.len() >= Self::MOST {
            return OtherReason("unrecognized_reason");
        }
        let code: &'static str = Box::leak(code.to_owned().into_boxed_str());
        seen.insert(code);
        OtherReason(code)
    }
}

impl Serialize for OtherReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for OtherReason {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(OtherReason::intern(&code))
    }
}

/// In the API's description, one of the codes this version writes: a code from another
/// version is the exception an operator's rollback makes.
impl utoipa::PartialSchema for FailureReason {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "Why an order failed, as its buyer and the notifications read it (`failure_reason`): a code,\n\
                 never the provider's words, which go to the operators' `decline_detail` column. An order\n\
                 another version ended may carry a code of that version's.",
            ))
            .enum_values(Some(FailureReason::ALL.map(FailureReason::as_str)))
            .into()
    }
}

impl utoipa::ToSchema for FailureReason {}

impl FailureReason {
    /// Every reason this version writes.
    pub const ALL: [FailureReason; 11] = [
        FailureReason::OutOfStock,
        FailureReason::PaymentDeclined,
        FailureReason::OrderRefused,
        FailureReason::AuthenticationFailed,
        FailureReason::AuthenticationTimedOut,
        FailureReason::PaymentCanceled,
        FailureReason::CaptureFailed,
        FailureReason::AuthorizationCanceled,
        FailureReason::AuthorizationIncomplete,
        FailureReason::SoldOut,
        FailureReason::CardLimitReached,
    ];

    /// Its code in the database, the API and the notifications.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureReason::OutOfStock => "out_of_stock",
            FailureReason::PaymentDeclined => "payment_declined",
            FailureReason::OrderRefused => "order_refused",
            FailureReason::AuthenticationFailed => "authentication_failed",
            FailureReason::AuthenticationTimedOut => "authentication_timed_out",
            FailureReason::PaymentCanceled => "payment_canceled",
            FailureReason::CaptureFailed => "capture_failed",
            FailureReason::AuthorizationCanceled => "authorization_canceled",
            FailureReason::AuthorizationIncomplete => "authorization_incomplete",
            FailureReason::SoldOut => "sold_out",
            FailureReason::CardLimitReached => "card_limit_reached",
            FailureReason::Other(OtherReason(code)) => code,
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code the fleet does not write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown failure reason {0:?}")]
pub struct UnknownReason(String);

impl std::str::FromStr for FailureReason {
    type Err = UnknownReason;

    /// One of the codes this version writes ([`FailureReason::ALL`]); any other is refused
    /// (an operator's or a client's typo). What the database holds is read with
    /// [`FailureReason::read`].
    fn from_str(code: &str) -> Result<Self, Self::Err> {
        FailureReason::ALL
            .into_iter()
            .find(|r| r.as_str() == code)
            .ok_or_else(|| UnknownReason(code.to_owned()))
    }
}

impl FailureReason {
    /// The reason a stored code names: one this version writes, or [`FailureReason::Other`]
    /// for one another version wrote. Never an error: an order must load whatever version
    /// ended it.
    pub fn read(code: &str) -> Self {
        code.parse().unwrap_or_else(|_| FailureReason::Other(OtherReason::intern(code)))
    }
}

// The column is text (a code a later version may add to), read and written as its code.
impl sqlx::Type<sqlx::Postgres> for FailureReason {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for FailureReason {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
    }
}

impl sqlx::Decode<'_, sqlx::Postgres> for FailureReason {
    fn decode(value: sqlx::postgres::PgValueRef<'_>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(FailureReason::read(<&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_code_and_serializes_as_it() {
        for reason in FailureReason::ALL {
            assert_eq!(reason.as_str().parse::<FailureReason>(), Ok(reason));
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
        assert!("payed".parse::<FailureReason>().is_err());
    }

    #[test]
    fn a_reason_another_version_wrote_reads_and_shows_as_its_code() {
        let later = FailureReason::read("card_limit_reached_in_a_later_version");
        assert!(matches!(later, FailureReason::Other(_)), "{later:?}");
        assert_eq!(later.as_str(), "card_limit_reached_in_a_later_version");
        assert_eq!(serde_json::to_value(later).unwrap(), "card_limit_reached_in_a_later_version");
        assert_eq!(FailureReason::read("later_reason_again"), FailureReason::read("later_reason_again"));
        let back: FailureReason = serde_json::from_value(serde_json::json!("another_later_one")).unwrap();
        assert_eq!(back.as_str(), "another_later_one");
        assert_eq!(FailureReason::read("out_of_stock"), FailureReason::OutOfStock);
    }
}
