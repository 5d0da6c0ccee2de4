//! Products: what is for sale, at what price, and how many units are left.

use anyhow::Context;
use sqlx::PgPool;

/// A product id (SKU): 1–64 characters of letters, digits, `.`, `_`, `-`, starting with a
/// letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sku(String);

impl Sku {
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

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An ISO 4217 currency code, lower case as Stripe writes it (`usd`, `eur`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Currency(String);

impl Currency {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.len() != 3 || !raw.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(format!("a currency is a three-letter ISO 4217 code such as usd; got {raw:?}"));
        }
        Ok(Self(raw.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What `fleetctl product upsert` writes.
#[derive(Debug, Clone)]
pub struct ProductUpsert {
    pub id: Sku,
    pub name: String,
    /// The price in the currency's minor units (cents), > 0.
    pub price_minor: i64,
    pub currency: Currency,
    /// Units for sale, >= 0. An upsert sets the stock; it does not add to it.
    pub stock: i32,
}

/// Creates the product or replaces its name, price, currency and stock.
pub async fn upsert(pool: &PgPool, product: &ProductUpsert) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO products (id, name, price_minor, currency, stock)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (id) DO UPDATE
            SET name = EXCLUDED.name, price_minor = EXCLUDED.price_minor,
                currency = EXCLUDED.currency, stock = EXCLUDED.stock, updated_at = now()",
    )
    .bind(product.id.as_str())
    .bind(&product.name)
    .bind(product.price_minor)
    .bind(product.currency.as_str())
    .bind(product.stock)
    .execute(pool)
    .await
    .with_context(|| format!("failed to upsert product {}", product.id.as_str()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skus_are_checked() {
        assert!(Sku::parse("sku-1").is_ok());
        assert!(Sku::parse("").is_err());
        assert!(Sku::parse("-x").is_err());
        assert!(Sku::parse("a b").is_err());
        assert!(Sku::parse(&"a".repeat(65)).is_err());
    }

    #[test]
    fn currencies_are_lower_cased_iso_codes() {
        assert_eq!(Currency::parse("USD").unwrap().as_str(), "usd");
        assert!(Currency::parse("dollars").is_err());
    }
}
