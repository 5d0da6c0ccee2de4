//! Every answer the intake gives that is not a success: one enum, whose arms are outcomes,
//! each with its status and its `{"error": {"code", "message"}}` body (SPEC §4).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("the Idempotency-Key header is required")]
    IdempotencyKeyMissing,
    #[error("the Idempotency-Key header must be 1 to 255 visible ASCII characters")]
    IdempotencyKeyInvalid,
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is still being processed; retry shortly")]
    IdempotencyKeyInUse,
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the body is larger than 16 KiB")]
    BodyTooLarge,
    #[error("{0}")]
    UnknownField(String),
    #[error("{0}")]
    MissingField(String),
    #[error("{field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("quantity must be a whole number from 1 to 10")]
    InvalidQuantity,
    #[error("no product with this id")]
    UnknownProduct,
    /// Fewer units left than asked: every unit is promised to buyers ahead or sold. Nothing
    /// was written. `units_may_return` while an order ahead is not yet paid (its units come
    /// back if it fails): the answer then carries `Retry-After`.
    #[error("sold out: fewer units are left than asked; every unit is promised to buyers ahead or sold")]
    SoldOut { units_may_return: bool },
    #[error("the request took too long to arrive or to answer; try again with the same Idempotency-Key")]
    RequestTimeout,
    #[error("too many requests; try again after the time in Retry-After")]
    RateLimited { retry_after_seconds: u64 },
    #[error("this order would take you past the product's limit per customer")]
    PurchaseLimitReached,
    /// Never the issuer's reason: that would make the intake a card-testing oracle.
    #[error("the payment was declined; nothing was charged")]
    PaymentDeclined,
    #[error("the payment provider is unavailable; retry with the same Idempotency-Key")]
    PaymentUnavailable,
    #[error("no such order")]
    OrderNotFound,
    #[error("the service is temporarily unavailable; retry with the same Idempotency-Key")]
    Unavailable(#[source] anyhow::Error),
    #[error("an unexpected error occurred")]
    Unexpected(#[from] anyhow::Error),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::IdempotencyKeyMissing => "idempotency_key_missing",
            ApiError::IdempotencyKeyInvalid => "idempotency_key_invalid",
            ApiError::IdempotencyKeyReused => "idempotency_key_reused",
            ApiError::IdempotencyKeyInUse => "idempotency_key_in_use",
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::BodyTooLarge => "body_too_large",
            ApiError::UnknownField(_) => "unknown_field",
            ApiError::MissingField(_) => "missing_field",
            ApiError::InvalidField { .. } => "invalid_field",
            ApiError::InvalidQuantity => "invalid_quantity",
            ApiError::UnknownProduct => "unknown_product",
            ApiError::SoldOut { .. } => "sold_out",
            ApiError::PurchaseLimitReached => "purchase_limit_reached",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::PaymentDeclined => "payment_declined",
            ApiError::PaymentUnavailable => "payment_unavailable",
            ApiError::OrderNotFound => "order_not_found",
            ApiError::Unavailable(_) => "service_unavailable",
            ApiError::Unexpected(_) => "internal_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::IdempotencyKeyMissing
            | ApiError::IdempotencyKeyInvalid
            | ApiError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            ApiError::IdempotencyKeyReused
            | ApiError::UnknownField(_)
            | ApiError::MissingField(_)
            | ApiError::InvalidField { .. }
            | ApiError::InvalidQuantity
            | ApiError::UnknownProduct => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::IdempotencyKeyInUse | ApiError::SoldOut { .. } | ApiError::PurchaseLimitReached => {
                StatusCode::CONFLICT
            }
            ApiError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::PaymentDeclined => StatusCode::PAYMENT_REQUIRED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::PaymentUnavailable | ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::OrderNotFound => StatusCode::NOT_FOUND,
            ApiError::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body, also what a replay of a declined order answers.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "code": self.code(), "message": self.to_string() } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Unexpected(e) | ApiError::Unavailable(e) => {
                tracing::error!(error = format!("{e:#}"), code = self.code(), "request failed")
            }
            _ => tracing::debug!(code = self.code(), "request refused"),
        }
        let mut response = (self.status(), Json(self.body())).into_response();
        let headers = response.headers_mut();
        match self {
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::PaymentUnavailable | ApiError::Unavailable(_) | ApiError::IdempotencyKeyInUse => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            }
            ApiError::RateLimited { retry_after_seconds } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds));
            }
            // Units come back when an order ahead is declined or fails; a buyer asking again
            // every few seconds sees them soon enough, and ten thousand of them do not make
            // the door their busiest caller.
            ApiError::SoldOut { units_may_return: true } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            _ => {}
        }
        response
    }
}
