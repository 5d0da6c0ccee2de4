//! Stripe's error object, `{"error": {"type": …, "code": …, "message": …, …}}`, with the
//! HTTP status Stripe pairs it with.
//!
//! One flat type rather than an enum of outcomes, because that is what Stripe's error is:
//! clients branch on `type` (and `code`), so those are data here, set by the constructors
//! below, one per situation the simulator answers. Optional fields are omitted when unset,
//! as Stripe does, and `doc_url` follows from `code`.

use std::borrow::Cow;

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

/// The `type` of a Stripe error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    Api,
    Card,
    Idempotency,
    InvalidRequest,
}

impl ErrorType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorType::Api => "api_error",
            ErrorType::Card => "card_error",
            ErrorType::Idempotency => "idempotency_error",
            ErrorType::InvalidRequest => "invalid_request_error",
        }
    }
}

/// An error answer in Stripe's shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{} {}: {message}", .status.as_u16(), .kind.as_str())]
pub(crate) struct StripeError {
    pub(crate) status: StatusCode,
    pub(crate) kind: ErrorType,
    pub(crate) code: Option<&'static str>,
    pub(crate) decline_code: Option<&'static str>,
    pub(crate) message: String,
    param: Option<Cow<'static, str>>,
    pub(crate) charge: Option<String>,
    /// The intent as it is after the failed request (Stripe attaches it to card errors and to
    /// state errors, so a client learns the state without another round trip).
    pub(crate) payment_intent: Option<Box<Value>>,
}

impl StripeError {
    fn new(status: StatusCode, kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            code: None,
            decline_code: None,
            message: message.into(),
            param: None,
            charge: None,
            payment_intent: None,
        }
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub(crate) fn with_param(mut self, param: impl Into<Cow<'static, str>>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// The parameter the error is about, if it is about one.
    #[cfg(test)]
    pub(crate) fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    pub(crate) fn with_payment_intent(mut self, payment_intent: Value) -> Self {
        self.payment_intent = Some(Box::new(payment_intent));
        self
    }

    /// A 400 about the request as a whole.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, message)
    }

    /// A 400 about one request parameter.
    pub(crate) fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, message).with_param(param)
    }

    /// A parameter the endpoint does not take on the pinned API version (Stripe's words,
    /// docs.stripe.com/error-codes#parameter-unknown). `name` is the parameter as sent, its
    /// top-level name for a nested one (`foo` for `foo[bar]`).
    pub(crate) fn unknown_param(name: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequest,
            format!("Received unknown parameter: {name}"),
        )
        .with_code("parameter_unknown")
        .with_param(name.to_owned())
    }

    /// `payment_method_types` on the pinned API version, 2026-09-30.endive, which removed it as
    /// a writable parameter (docs.stripe.com/changelog/endive/2026-09-30/removes-the-payment-
    /// method-types-parameter-from-payment-intents-and-setup-intents). The changelog gives the
    /// status and the code; the message is the simulator's, saying what to use instead.
    pub(crate) fn payment_method_types_no_longer_supported() -> Self {
        Self::invalid_param(
            "payment_method_types",
            "payment_method_types is no longer supported as a parameter on this API version \
             (2026-09-30.endive). Use dynamic payment methods (automatic_payment_methods), and \
             allowed_payment_method_types or excluded_payment_method_types to narrow them.",
        )
        .with_code("payment_method_types_no_longer_supported")
    }

    pub(crate) fn missing_param(param: &'static str) -> Self {
        Self::invalid_param(param, format!("Missing required param: {param}.")).with_code("parameter_missing")
    }

    /// An object that does not exist: 404 when its id is in the URL, 400 when a parameter
    /// names it (`param` says which).
    pub(crate) fn no_such(status: StatusCode, object: &str, id: &str, param: &'static str) -> Self {
        Self::new(status, ErrorType::InvalidRequest, format!("No such {object}: '{id}'"))
            .with_code("resource_missing")
            .with_param(param)
    }

    /// A 400 for an operation the intent's status does not allow.
    pub(crate) fn unexpected_state(message: String) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, message)
            .with_code("payment_intent_unexpected_state")
    }

    /// A 402 decline, as the card network answered it.
    pub(crate) fn card_declined(
        code: &'static str,
        decline_code: &'static str,
        message: &'static str,
        charge: String,
    ) -> Self {
        let mut error = Self::new(StatusCode::PAYMENT_REQUIRED, ErrorType::Card, message).with_code(code);
        error.decline_code = Some(decline_code);
        error.charge = Some(charge);
        error
    }

    /// What a failed 3-D Secure challenge leaves as the intent's `last_payment_error`
    /// (docs.stripe.com/error-codes#payment-intent-authentication-failure).
    pub(crate) fn authentication_failure() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequest,
            "The provided PaymentMethod has failed authentication. You can provide payment_method_data or a \
             new PaymentMethod to attempt to fulfill this PaymentIntent again.",
        )
        .with_code("payment_intent_authentication_failure")
    }

    pub(crate) fn idempotency(message: String) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorType::Idempotency, message)
    }

    /// The 409 for a request whose key's first request is still executing
    /// (docs.stripe.com/error-codes#idempotency-key-in-use). Stripe answers it as an
    /// `invalid_request_error` (its `idempotency_error` is for a key reused on another request),
    /// in these words.
    pub(crate) fn idempotency_key_in_use(key: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            ErrorType::InvalidRequest,
            format!(
                "There is currently another in-progress request using this Idempotent Key (that probably \
                 means you submitted twice, and the other request is still going through): {key}. Please try \
                 again later."
            ),
        )
        .with_code("idempotency_key_in_use")
    }

    pub(crate) fn authentication(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorType::InvalidRequest, message)
    }

    /// The 500 Stripe answers when it fails internally.
    pub(crate) fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::Api,
            "An unknown error occurred on our servers (stripe-sim injected fault). \
             Retry the request with the same Idempotency-Key.",
        )
    }

    /// The 429 Stripe answers when a client sends too many requests, in Stripe's words: what
    /// the rate limit answers.
    pub(crate) fn rate_limited() -> Self {
        Self::too_many_requests(
            "Too many requests hit the API too quickly. \
             We recommend an exponential backoff of your requests.",
        )
    }

    /// What an `error_429` fault answers: the same error, saying it was injected, so nobody
    /// reading a log hunts for a rate limit that is not set.
    pub(crate) fn injected_rate_limit() -> Self {
        Self::too_many_requests(
            "Request rate limit exceeded (stripe-sim injected fault). \
             Retry after a short delay, with the same Idempotency-Key.",
        )
    }

    /// What an `error_400` fault answers: Stripe's 400 `invalid_request_error` for a request
    /// it refuses as invalid, saying it was injected (see [`crate::faults`]).
    pub(crate) fn injected_invalid_request() -> Self {
        Self::bad_request(
            "Invalid request (stripe-sim injected fault): Stripe refused this request's parameters. \
             Retrying the same request cannot succeed.",
        )
        .with_code("parameter_unknown")
    }

    /// Stripe's 429 for a request that waited in vain for the object it changes, held by
    /// another request or by Stripe's own processing: an `invalid_request_error` with code
    /// `lock_timeout`, in Stripe's words (docs.stripe.com/rate-limits#object-lock-timeouts,
    /// docs.stripe.com/error-codes#lock-timeout). Not a rate limit: it is about one object.
    pub(crate) fn lock_timeout() -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::InvalidRequest,
            "This object cannot be accessed right now because another API request or Stripe process is \
             currently accessing it. If you see this error intermittently, retry the request. If you see this \
             error frequently and are making multiple concurrent requests to a single object, make your \
             requests serially or at a lower rate.",
        )
        .with_code("lock_timeout")
    }

    /// Stripe's 429: an `invalid_request_error` with code `rate_limit`, which Stripe's client
    /// libraries (any 429, in fact) turn into their rate-limit error.
    fn too_many_requests(message: &'static str) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, ErrorType::InvalidRequest, message).with_code("rate_limit")
    }

    pub(crate) fn unrecognized_url(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorType::InvalidRequest,
            format!(
                "Unrecognized request URL ({method}: {path}). stripe-sim serves POST /v1/payment_intents, \
                 GET /v1/payment_intents/{{id}}, POST /v1/payment_intents/{{id}}/capture, \
                 POST /v1/payment_intents/{{id}}/cancel and POST /v1/refunds."
            ),
        )
    }

    /// The inner object, as it also appears in a PaymentIntent's `last_payment_error`.
    pub(crate) fn object_json(&self) -> Value {
        let mut object = Map::new();
        if let Some(charge) = &self.charge {
            object.insert("charge".into(), json!(charge));
        }
        if let Some(code) = self.code {
            object.insert("code".into(), json!(code));
            object.insert(
                "doc_url".into(),
                json!(format!("https://stripe.com/docs/error-codes/{}", code.replace('_', "-"))),
            );
        }
        if let Some(decline_code) = self.decline_code {
            object.insert("decline_code".into(), json!(decline_code));
        }
        object.insert("message".into(), json!(self.message));
        if let Some(param) = &self.param {
            object.insert("param".into(), json!(param));
        }
        if let Some(payment_intent) = &self.payment_intent {
            object.insert("payment_intent".into(), Value::clone(payment_intent));
        }
        object.insert("type".into(), json!(self.kind.as_str()));
        Value::Object(object)
    }

    /// The whole response body.
    pub(crate) fn body_json(&self) -> Value {
        json!({ "error": self.object_json() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coded_error_links_its_documentation_and_omits_unset_fields() {
        let body = StripeError::missing_param("amount").body_json();
        assert_eq!(
            body,
            json!({"error": {
                "code": "parameter_missing",
                "doc_url": "https://stripe.com/docs/error-codes/parameter-missing",
                "message": "Missing required param: amount.",
                "param": "amount",
                "type": "invalid_request_error",
            }})
        );
    }

    #[test]
    fn a_decline_carries_the_charge_and_the_issuer_reason() {
        let error = StripeError::card_declined(
            "card_declined",
            "generic_decline",
            "Your card was declined.",
            "ch_1".into(),
        );
        let object = error.object_json();
        assert_eq!(error.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(object["type"], "card_error");
        assert_eq!(object["decline_code"], "generic_decline");
        assert_eq!(object["charge"], "ch_1");
    }
}
