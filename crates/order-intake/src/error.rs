//! Every answer the intake gives that is not a success: one enum, whose arms are outcomes,
//! each with its status and its `{"error": {"code", "message"}}` body (SPEC §4).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
/// Every refusal the intake answers, by outcome; [`ApiError::code`] and [`ApiError::status`]
/// give its `code` and HTTP status, and its message is the `#[error]` text.
pub enum ApiError {
    #[error("a valid bearer token is required")]
    /// `401 unauthorized`.
    Unauthorized,
    #[error("the Idempotency-Key header is required")]
    /// `400 idempotency_key_missing`.
    IdempotencyKeyMissing,
    #[error("the Idempotency-Key header must be 1 to 255 visible ASCII characters")]
    /// `400 idempotency_key_invalid`.
    IdempotencyKeyInvalid,
    #[error("this Idempotency-Key was used with a different request body")]
    /// `422 idempotency_key_reused`: nothing written.
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is still being processed; retry shortly")]
    /// `409 idempotency_key_in_use`, with `Retry-After`.
    IdempotencyKeyInUse,
    #[error("the body is not valid JSON: {0}")]
    /// `400 malformed_json`.
    MalformedJson(String),
    #[error("the body is too large (an order's may be 16 KiB, a webhook's 256 KiB)")]
    /// `413 body_too_large`.
    BodyTooLarge,
    #[error("{0}")]
    /// `422 unknown_field`.
    UnknownField(String),
    #[error("{0}")]
    /// `422 missing_field`.
    MissingField(String),
    #[error("{field}: {reason}")]
    /// `422 invalid_field`, naming the field.
    InvalidField {
        /// The field's name in the body.
        field: &'static str,
        /// What it must be.
        reason: String,
    },
    #[error("quantity must be a whole number from 1 to 10")]
    /// `422 invalid_quantity`.
    InvalidQuantity,
    #[error("no product with this id")]
    /// `422 unknown_product`.
    UnknownProduct,
    /// Fewer units left than asked: every unit is promised to buyers ahead or sold. Nothing
    /// was written. `units_may_return` while an order ahead is not yet paid (its units come
    /// back if it fails): the answer then carries `Retry-After`.
    #[error("sold out: fewer units are left than asked; every unit is promised to buyers ahead or sold")]
    SoldOut {
        /// Whether an order ahead may yet give its units back (`Retry-After` then).
        units_may_return: bool,
    },
    #[error("the request took too long to arrive or to answer; try again with the same Idempotency-Key")]
    /// `408 request_timeout`: a slow client.
    RequestTimeout,
    #[error("too many requests; try again after the time in Retry-After")]
    /// `429 rate_limited`, with `Retry-After`.
    RateLimited {
        /// The `Retry-After` to answer.
        retry_after_seconds: u64,
    },
    #[error("this order would take you or your card past the product's limit")]
    /// `409 purchase_limit_reached`: past the product's cap per buyer (nothing written) or per
    /// card (the order ends `card_limit_reached`, its units back); no PaymentIntent either way.
    PurchaseLimitReached,
    /// `409 not_open`: the product opens later and its queue (if any) is not open yet; nothing
    /// written. `Retry-After`: the seconds until the queue or the sale opens.
    #[error("this product is not on sale yet; try again after the time in Retry-After")]
    NotOpen(u64),
    /// `409 already_queued`: the buyer has an order of this product in its queue already,
    /// under another key; nothing written.
    #[error("you already have an order of this product in its queue")]
    AlreadyQueued,
    /// `409 sale_paused`: an operator paused the product's sale; nothing written.
    /// `Retry-After`: when to ask again.
    #[error("the sale of this product is paused; try again after the time in Retry-After")]
    SalePaused(u64),
    /// Never the issuer's reason: that would make the intake a card-testing oracle.
    #[error("the payment was declined; nothing was charged")]
    PaymentDeclined,
    /// `500 order_refused`: the database refuses the order's record for good (a constraint, a
    /// trigger); its hold is released and it holds no unit. Not the buyer's card.
    #[error("the order cannot be recorded; nothing was charged")]
    OrderRefused,
    #[error("the payment provider is unavailable; retry with the same Idempotency-Key")]
    /// `503 payment_unavailable`, with `Retry-After`: the order stays pending.
    PaymentUnavailable {
        /// The `Retry-After` to answer: the wait ahead of this order when the fleet's Stripe
        /// budget is what holds it up ([`crate::orders`]).
        retry_after_seconds: u64,
    },
    #[error("no such order")]
    /// `404 order_not_found`: no such order, or another user's.
    OrderNotFound,
    #[error("no such route; the API is described at /openapi.json")]
    /// `404 not_found`: no such route.
    NotFound,
    #[error("this route does not take this method; see the Allow header")]
    /// `405 method_not_allowed`, with `Allow`.
    MethodNotAllowed,
    #[error("the service is temporarily unavailable; retry with the same Idempotency-Key")]
    /// `503 service_unavailable`, with `Retry-After`: a dependency (the database) is away.
    Unavailable(#[source] anyhow::Error),
    #[error("the Stripe-Signature header is missing, malformed, stale, or matches no secret: {0}")]
    /// `400 invalid_signature`: a webhook not signed by Stripe now, or altered after signing.
    InvalidSignature(&'static str),
    #[error("the event cannot be applied now; Stripe will deliver it again: {0}")]
    /// `503 webhook_unavailable`, with `Retry-After`: nothing written.
    WebhookUnavailable(String),
    #[error("an unexpected error occurred")]
    /// `500 internal_error`: the cause is logged, never answered.
    Unexpected(#[from] anyhow::Error),
}

impl ApiError {
    /// The `code` of the error body.
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
            ApiError::NotOpen(_) => "not_open",
            ApiError::AlreadyQueued => "already_queued",
            ApiError::SalePaused(_) => "sale_paused",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::PaymentDeclined => "payment_declined",
            ApiError::OrderRefused => "order_refused",
            ApiError::PaymentUnavailable { .. } => "payment_unavailable",
            ApiError::OrderNotFound => "order_not_found",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Unavailable(_) => "service_unavailable",
            ApiError::InvalidSignature(_) => "invalid_signature",
            ApiError::WebhookUnavailable(_) => "webhook_unavailable",
            ApiError::Unexpected(_) => "internal_error",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::IdempotencyKeyMissing
            | ApiError::IdempotencyKeyInvalid
            | ApiError::MalformedJson(_)
            | ApiError::InvalidSignature(_) => StatusCode::BAD_REQUEST,
            ApiError::IdempotencyKeyReused
            | ApiError::UnknownField(_)
            | ApiError::MissingField(_)
            | ApiError::InvalidField { .. }
            | ApiError::InvalidQuantity
            | ApiError::UnknownProduct => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::IdempotencyKeyInUse
            | ApiError::SoldOut { .. }
            | ApiError::PurchaseLimitReached
            | ApiError::NotOpen(_)
            | ApiError::AlreadyQueued
            | ApiError::SalePaused(_) => StatusCode::CONFLICT,
            ApiError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::PaymentDeclined => StatusCode::PAYMENT_REQUIRED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::PaymentUnavailable { .. }
            | ApiError::Unavailable(_)
            | ApiError::WebhookUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::OrderNotFound | ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::OrderRefused | ApiError::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// One of each refusal, for the API's description ([`crate::openapi`]): its codes by status.
    /// [`ApiError::ordinal`]'s exhaustive match makes a new variant fail the test below until it
    /// is added here.
    pub(crate) fn one_of_each() -> Vec<ApiError> {
        vec![
            ApiError::Unauthorized,
            ApiError::IdempotencyKeyMissing,
            ApiError::IdempotencyKeyInvalid,
            ApiError::IdempotencyKeyReused,
            ApiError::IdempotencyKeyInUse,
            ApiError::MalformedJson(String::new()),
            ApiError::BodyTooLarge,
            ApiError::UnknownField(String::new()),
            ApiError::MissingField(String::new()),
            ApiError::InvalidField { field: "quantity", reason: String::new() },
            ApiError::InvalidQuantity,
            ApiError::UnknownProduct,
            ApiError::SoldOut { units_may_return: true },
            ApiError::RequestTimeout,
            ApiError::RateLimited { retry_after_seconds: 1 },
            ApiError::PurchaseLimitReached,
            ApiError::PaymentDeclined,
            ApiError::OrderRefused,
            ApiError::PaymentUnavailable { retry_after_seconds: 2 },
            ApiError::OrderNotFound,
            ApiError::NotFound,
            ApiError::MethodNotAllowed,
            ApiError::Unavailable(anyhow::anyhow!("")),
            ApiError::InvalidSignature(""),
            ApiError::WebhookUnavailable(String::new()),
            ApiError::Unexpected(anyhow::anyhow!("")),
            ApiError::NotOpen(1),
            ApiError::AlreadyQueued,
            ApiError::SalePaused(5),
        ]
    }

    #[cfg(test)]
    /// How many variants there are: one more than [`ApiError::ordinal`]'s last arm.
    const VARIANTS: usize = 29;

    /// The variant's place in [`ApiError::one_of_each`].
    #[cfg(test)]
    fn ordinal(&self) -> usize {
        match self {
            ApiError::Unauthorized => 0,
            ApiError::IdempotencyKeyMissing => 1,
            ApiError::IdempotencyKeyInvalid => 2,
            ApiError::IdempotencyKeyReused => 3,
            ApiError::IdempotencyKeyInUse => 4,
            ApiError::MalformedJson(_) => 5,
            ApiError::BodyTooLarge => 6,
            ApiError::UnknownField(_) => 7,
            ApiError::MissingField(_) => 8,
            ApiError::InvalidField { .. } => 9,
            ApiError::InvalidQuantity => 10,
            ApiError::UnknownProduct => 11,
            ApiError::SoldOut { .. } => 12,
            ApiError::RequestTimeout => 13,
            ApiError::RateLimited { .. } => 14,
            ApiError::PurchaseLimitReached => 15,
            ApiError::PaymentDeclined => 16,
            ApiError::OrderRefused => 17,
            ApiError::PaymentUnavailable { .. } => 18,
            ApiError::OrderNotFound => 19,
            ApiError::NotFound => 20,
            ApiError::MethodNotAllowed => 21,
            ApiError::Unavailable(_) => 22,
            ApiError::InvalidSignature(_) => 23,
            ApiError::WebhookUnavailable(_) => 24,
            ApiError::Unexpected(_) => 25,
            ApiError::NotOpen(_) => 26,
            ApiError::AlreadyQueued => 27,
            ApiError::SalePaused(_) => 28,
        }
    }

    /// The seconds in the answer's `Retry-After`, when it carries one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Unavailable(_) | ApiError::IdempotencyKeyInUse | ApiError::WebhookUnavailable(_) => {
                Some(2)
            }
            ApiError::RateLimited { retry_after_seconds }
            | ApiError::PaymentUnavailable { retry_after_seconds }
            | ApiError::NotOpen(retry_after_seconds)
            | ApiError::SalePaused(retry_after_seconds) => Some(*retry_after_seconds),
            // Units come back when an order ahead is declined or fails; a buyer asking again
            // every few seconds sees them soon enough, and ten thousand of them do not make
            // the door their busiest caller.
            ApiError::SoldOut { units_may_return: true } => Some(5),
            _ => None,
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
            ApiError::WebhookUnavailable(reason) => {
                tracing::warn!(reason, "webhook not applied; Stripe retries")
            }
            ApiError::InvalidSignature(why) => tracing::warn!(why, "webhook refused: its signature"),
            _ => tracing::debug!(code = self.code(), "request refused"),
        }
        let mut response = (self.status(), Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let ApiError::Unauthorized = self {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_of_each_holds_every_variant_once() {
        let ordinals: Vec<usize> = ApiError::one_of_each().iter().map(ApiError::ordinal).collect();
        assert_eq!(ordinals, (0..ApiError::VARIANTS).collect::<Vec<_>>());
    }
}
