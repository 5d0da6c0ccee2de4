//! The edge of the API: what a request must look like, parsed into types once so the rest of
//! the intake never checks again (SPEC §4).

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use orderfleet_words::{Quantity, Sku};

use crate::error::ApiError;

/// The client's `Idempotency-Key`: 1–255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub(crate) const HEADER: &'static str = "idempotency-key";

    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let value = headers.get(Self::HEADER).ok_or(ApiError::IdempotencyKeyMissing)?;
        let raw = value.to_str().map_err(|_| ApiError::IdempotencyKeyInvalid)?;
        Self::parse(raw)
    }

    /// A key of 1 to 255 visible ASCII characters, or `idempotency_key_invalid`.
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let visible = raw.bytes().all(|b| b.is_ascii_graphic());
        if raw.is_empty() || raw.len() > 255 || !visible {
            return Err(ApiError::IdempotencyKeyInvalid);
        }
        Ok(Self(raw.to_owned()))
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The body of `POST /v1/orders`, as sent.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OrderRequest, title = "OrderRequest")]
pub(crate) struct RawOrderRequest {
    /// The product's id.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", example = "sku-1")]
    product_id: String,
    /// Units to buy; the amount is the product's price times this.
    #[schema(minimum = 1, maximum = 10, example = 2)]
    quantity: i64,
    /// A Stripe PaymentMethod id.
    #[schema(pattern = "^pm_[A-Za-z0-9_]+$", max_length = 255, example = "pm_card_visa")]
    payment_method: String,
}

/// A valid order request. The amount is not here: the server computes it from the price.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderRequest {
    /// The product, checked.
    pub product_id: Sku,
    /// How many units, checked (1 to 10).
    pub quantity: Quantity,
    /// The Stripe PaymentMethod the buyer gave (`pm_…`).
    pub payment_method: String,
}

impl OrderRequest {
    pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024;
    /// The quantities a request may ask for.
    pub const QUANTITY: std::ops::RangeInclusive<i64> = 1..=Quantity::MAX as i64;

    /// Reads a body: JSON, no unknown field, every field present and valid, or the refusal that
    /// names what is wrong.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let raw: RawOrderRequest = serde_json::from_slice(body).map_err(json_error)?;
        let quantity = Quantity::parse(raw.quantity).ok_or(ApiError::InvalidQuantity)?;
        let product_id = Sku::parse(&raw.product_id).map_err(|_| ApiError::InvalidField {
            field: "product_id",
            reason: "must be 1 to 64 letters, digits, '.', '_' or '-'".into(),
        })?;
        let method_ok = raw.payment_method.len() <= 255
            && raw.payment_method.starts_with("pm_")
            && raw.payment_method.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !method_ok {
            return Err(ApiError::InvalidField {
                field: "payment_method",
                reason: "must be a payment method id such as pm_card_visa".into(),
            });
        }
        Ok(Self { product_id, quantity, payment_method: raw.payment_method })
    }

    /// What "the same body" means for the idempotency key: the parsed request, so spacing and
    /// key order do not matter but every value does.
    pub fn fingerprint(&self) -> Vec<u8> {
        let canonical = serde_json::to_vec(self).expect("the request serializes");
        Sha256::digest(canonical).to_vec()
    }
}

/// Turns serde's error into the answer that names what is wrong.
fn json_error(error: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match error.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::MalformedJson(error.to_string()),
        Category::Data => {
            let message = error.to_string();
            if message.starts_with("unknown field") {
                ApiError::UnknownField(message)
            } else if message.starts_with("missing field") {
                ApiError::MissingField(message)
            } else if message.contains("expected struct") {
                // Valid JSON, but not an object (an array, a string, null).
                ApiError::MalformedJson(message)
            } else {
                ApiError::InvalidField { field: "body", reason: message }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(result: Result<OrderRequest, ApiError>) -> &'static str {
        result.unwrap_err().code()
    }

    #[test]
    fn a_valid_request_parses() {
        let body = br#"{"product_id": "sku-1", "quantity": 2, "payment_method": "pm_card_visa"}"#;
        let request = OrderRequest::parse(body).unwrap();
        assert_eq!(request.quantity.get(), 2);
    }

    #[test]
    fn each_bad_body_has_its_code() {
        assert_eq!(code(OrderRequest::parse(b"{not json")), "malformed_json");
        assert_eq!(code(OrderRequest::parse(b"[]")), "malformed_json");
        assert_eq!(
            code(OrderRequest::parse(
                br#"{"product_id":"sku-1","quantity":1,"payment_method":"pm_card_visa","amount":1}"#
            )),
            "unknown_field"
        );
        assert_eq!(code(OrderRequest::parse(br#"{"product_id":"sku-1","quantity":1}"#)), "missing_field");
        assert_eq!(
            code(OrderRequest::parse(
                br#"{"product_id":"sku-1","quantity":0,"payment_method":"pm_card_visa"}"#
            )),
            "invalid_quantity"
        );
        assert_eq!(
            code(OrderRequest::parse(
                br#"{"product_id":"sku-1","quantity":11,"payment_method":"pm_card_visa"}"#
            )),
            "invalid_quantity"
        );
        assert_eq!(
            code(OrderRequest::parse(
                br#"{"product_id":"sku-1","quantity":"2","payment_method":"pm_card_visa"}"#
            )),
            "invalid_field"
        );
    }

    #[test]
    fn the_fingerprint_ignores_spacing_but_not_values() {
        let a =
            OrderRequest::parse(br#"{"product_id":"sku-1","quantity":1,"payment_method":"pm_card_visa"}"#)
                .unwrap();
        let b = OrderRequest::parse(
            br#"{ "quantity": 1, "payment_method": "pm_card_visa", "product_id": "sku-1" }"#,
        )
        .unwrap();
        let c =
            OrderRequest::parse(br#"{"product_id":"sku-1","quantity":2,"payment_method":"pm_card_visa"}"#)
                .unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn idempotency_keys_are_visible_ascii_up_to_255() {
        assert!(IdempotencyKey::parse("abc-123_XYZ:~").is_ok());
        assert_eq!(IdempotencyKey::parse("").unwrap_err().code(), "idempotency_key_invalid");
        assert_eq!(IdempotencyKey::parse("has space").unwrap_err().code(), "idempotency_key_invalid");
        assert_eq!(IdempotencyKey::parse(&"k".repeat(256)).unwrap_err().code(), "idempotency_key_invalid");
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
    }
}
