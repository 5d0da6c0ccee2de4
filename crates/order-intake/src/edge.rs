//! The edge: what every request passes before a handler sees it. The bearer token first,
//! before anything about the request is looked at; then the user's rate, then everyone's; and
//! the body, read under the 16 KiB limit and its timeout.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use orderfleet::domain::tokens::TokenVerifier;
use orderfleet_words::UserId;

use crate::error::ApiError;
use crate::limits::Limits;
use crate::request::OrderRequest;

/// What [`token_first`] needs.
#[derive(Clone)]
pub(crate) struct Edge {
    pub(crate) verifier: Arc<TokenVerifier>,
    pub(crate) limits: Arc<Limits>,
}

/// Every `/v1` request needs a valid bearer token, checked before anything else, and its user
/// within their rate; the user rides in the request's extensions to the handler. Other paths
/// (`/healthz`, `/metrics`, `/openapi.json`, unknown ones) need none.
pub(crate) async fn token_first(
    State(edge): State<Edge>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    if path != "/v1" && !path.starts_with("/v1/") {
        return next.run(request).await;
    }
    let user = match authenticate(&edge.verifier, request.headers()).await {
        Ok(user) => user,
        Err(refused) => {
            metrics::counter!(crate::metrics::INTAKE_UNAUTHORIZED.name).increment(1);
            return refused.into_response();
        }
    };
    if let Err(refused) = edge.limits.check_user(&user) {
        metrics::counter!(crate::metrics::INTAKE_RATE_LIMITED.name, "limit" => "user").increment(1);
        return refused.into_response();
    }
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// Refuses a request when the intake as a whole is over its rate, before any work. Only
/// requests with a valid token reach it (see [`token_first`]).
pub(crate) async fn over_everyones_rate(
    State(limits): State<Arc<Limits>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match limits.check_global() {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            metrics::counter!(crate::metrics::INTAKE_RATE_LIMITED.name, "limit" => "global").increment(1);
            refused.into_response()
        }
    }
}

async fn authenticate(verifier: &TokenVerifier, headers: &HeaderMap) -> Result<UserId, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token)
        .ok_or(ApiError::Unauthorized)?;
    verifier.verify(token.trim()).await.map_err(|_| ApiError::Unauthorized)
}

/// Reads the body under the 16 KiB limit. The body is JSON whatever the Content-Type says
/// (clients such as `curl -d` label it form-encoded); parsing decides.
pub(crate) async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > OrderRequest::MAX_BODY_BYTES) {
        return Err(ApiError::BodyTooLarge);
    }
    axum::body::to_bytes(body, OrderRequest::MAX_BODY_BYTES).await.map_err(|e| {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let (mut too_large, mut too_slow) = (false, false);
        while let Some(c) = cause {
            too_large |= c.is::<http_body_util::LengthLimitError>();
            too_slow |= c.is::<tower_http::timeout::TimeoutError>();
            cause = c.source();
        }
        if too_large {
            ApiError::BodyTooLarge
        } else if too_slow {
            ApiError::RequestTimeout
        } else {
            ApiError::MalformedJson(format!("the body could not be read: {e}"))
        }
    })
}
