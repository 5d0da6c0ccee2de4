//! The words of the domain, as types: an order's id, its buyer, its product, how many units
//! and for how much. Each is checked once, where it enters from outside (a request, a token,
//! an operator's command: each type's `parse`), and then carried as it is to the database and
//! back: a function that takes a [`Sku`] never checks it again, and cannot be handed a user
//! id by mistake.
//!
//! Each is stored as its one column (`#[sqlx(transparent)]`) and written as its one value in
//! JSON (`#[serde(transparent)]`), so on the wire and in the tables each is a plain string or
//! number. Reading one back — from the database, or from a message the fleet
//! wrote — does not check it again: it was checked on its way in. So input from outside is
//! never deserialized into these types directly; it is read as it came (the intake's
//! `RawOrderRequest`) and then parsed.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An order's id: a UUIDv7, so ids sort by creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct OrderId(Uuid);

impl OrderId {
    /// A new id, for an order being admitted now.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps a UUID read elsewhere (a path, a message) as an order's id.
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }

    /// The UUID, for a column or a query that takes one.
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl Default for OrderId {
    fn default() -> Self {
        Self::new()
    }
}

impl std::str::FromStr for OrderId {
    type Err = uuid::Error;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(raw).map(Self)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The buyer: a verified token's `sub`, 1–255 bytes without control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct UserId(String);

impl UserId {
    /// The longest a user id may be, in bytes.
    pub(crate) const MAX_LEN: usize = 255;

    /// Checks a token's `sub`: 1 to 255 bytes, no control characters.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(format!("a user id is 1 to {} bytes long", Self::MAX_LEN));
        }
        if raw.chars().any(char::is_control) {
            return Err("a user id has no control characters".into());
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id as the token gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A product id (SKU): 1–64 characters of letters, digits, `.`, `_`, `-`, starting with a
/// letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct Sku(String);

impl Sku {
    /// Checks a product id as the API and `fleetctl product` take it.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let valid_chars = raw.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        let starts_ok = raw.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        if raw.len() > 64 || !valid_chars || !starts_ok {
            return Err(format!(
                "a product id is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit; got {raw:?}"
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Units of one product in one order: 1 to [`Quantity::MAX`] (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct Quantity(i32);

impl Quantity {
    /// The most units one order may ask for.
    pub const MAX: i32 = 10;

    /// `raw` as a quantity, if it is 1 to [`Quantity::MAX`].
    pub fn parse(raw: i64) -> Option<Self> {
        (1..=i64::from(Self::MAX)).contains(&raw).then_some(Self(raw as i32))
    }

    /// The number of units.
    pub fn get(self) -> i32 {
        self.0
    }
}

impl From<Quantity> for i32 {
    fn from(quantity: Quantity) -> Self {
        quantity.0
    }
}

impl From<Quantity> for i64 {
    fn from(quantity: Quantity) -> Self {
        i64::from(quantity.0)
    }
}

/// An ISO 4217 currency code, lower case as Stripe writes it (`usd`, `eur`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct Currency(String);

impl Currency {
    /// Checks a three-letter code and lower-cases it.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.len() != 3 || !raw.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(format!("a currency is a three-letter ISO 4217 code such as usd; got {raw:?}"));
        }
        Ok(Self(raw.to_ascii_lowercase()))
    }

    /// The code, lower case.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An amount of money: minor units (cents) of a currency. Stored as the two columns
/// `amount_minor` and `currency`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, sqlx::FromRow)]
pub struct Money {
    #[sqlx(rename = "amount_minor")]
    /// The amount in the currency's minor units (cents): never a float.
    pub minor: i64,
    /// Its currency.
    pub currency: Currency,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantity_is_one_to_ten() {
        assert_eq!(Quantity::parse(0), None);
        assert_eq!(Quantity::parse(1).map(Quantity::get), Some(1));
        assert_eq!(Quantity::parse(10).map(Quantity::get), Some(10));
        assert_eq!(Quantity::parse(11), None);
        assert_eq!(Quantity::parse(i64::from(i32::MAX) + 1), None);
    }

    #[test]
    fn each_is_its_one_value_in_json() {
        let id = OrderId::new();
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
        assert_eq!(serde_json::to_string(&Quantity::parse(3).unwrap()).unwrap(), "3");
        assert_eq!(serde_json::to_string(&Sku::parse("sku-1").unwrap()).unwrap(), "\"sku-1\"");
    }
}
