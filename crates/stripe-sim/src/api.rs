//! The Stripe API routes: `POST /v1/payment_intents`, `GET /v1/payment_intents/{id}`,
//! `GET /v1/payment_intents` and `…/search`, `POST /v1/payment_intents/{id}/capture`,
//! `POST /v1/payment_intents/{id}/cancel`, `POST /v1/refunds`, `GET /v1/payment_methods/{id}`.
//!
//! Every request under `/v1/` first meets the rate limits ([`limit_rate`], when set): a
//! request beyond one is answered 429 before anything else looks at it, so it has no effect
//! and does not use up its idempotency key, and a client retries it with the same key, as
//! Stripe advises.
//!
//! Every state-changing request then goes through [`mutate`], which applies the rest of the
//! edge of Stripe's API in the order a request meets it: authentication, then an armed fault
//! (a fault models the network or Stripe's front failing, so it strikes before anything
//! runs), then the idempotency layer and the operation, under one lock. `drop_after_success`
//! lets the operation run, then throws the answer away; `error_500_after_success` lets it run,
//! then answers (and saves under the key) a 500; `slow_confirm` lets it run and keeps its
//! request executing a while, its key in use (a retry meanwhile is answered `409
//! idempotency_key_in_use`); `timeout` holds it, its key in use, without running it.

use std::io;
use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth;
use crate::error::StripeError;
use crate::faults::{Mode, Operation};
use crate::form::Params;
use crate::idempotency::{self, KeyedRequest, Scope};
use crate::ids;
use crate::ledger::{Ledger, Reply};
use crate::parameters;
use crate::rate::{self, Verdict};
use crate::requests::Expand;
use crate::requests::{
    CancelRequest, CaptureRequest, ConfirmRequest, CreateRequest, ListRequest, RefundRequest,
};
use crate::simulator::{Executed, Pace, SimState};

const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
const ORIGINAL_REQUEST: HeaderName = HeaderName::from_static("original-request");
const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/v1/payment_intents", post(create).get(list))
        .route("/v1/payment_intents/search", get(search))
        .route("/v1/payment_intents/{id}", get(retrieve))
        .route("/v1/payment_intents/{id}/capture", post(capture))
        .route("/v1/payment_intents/{id}/cancel", post(cancel))
        .route("/v1/payment_intents/{id}/confirm", post(confirm))
        .route("/v1/refunds", post(refund))
        .route("/v1/payment_methods/{id}", get(retrieve_payment_method))
}

/// This request's `Request-Id`, chosen by [`assign_request_id`] before the handler runs so
/// the idempotency layer can remember which request produced a saved answer.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(String);

/// Gives every request a `req_…` id and every response a `Request-Id` header, as Stripe does.
pub(crate) async fn assign_request_id(mut request: Request, next: Next) -> Response {
    let id = format!("req_{}", ids::random(14));
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

/// Counts every API request and answers those beyond a rate limit (the account's, or the
/// one of the named operation it is) with Stripe's 429. It runs before routing, so unknown
/// `/v1/` paths count too, against the account's limit (Stripe limits them as well); the
/// `/_sim` routes and `/healthz` are how a test looks at the simulator and are left alone.
/// The simulator has one account, so there is no need to authenticate first to know whose
/// limits apply.
pub(crate) async fn limit_rate(State(sim): State<SimState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if !path.starts_with("/v1/") {
        return next.run(request).await;
    }
    match sim.admit(rate::operation_of(request.method().as_str(), path)) {
        Verdict::Admitted => next.run(request).await,
        Verdict::Limited => {
            tracing::debug!(path = request.uri().path(), "rate limit exceeded; answering 429");
            retryable(error_response(&StripeError::rate_limited()))
        }
    }
}

/// Stripe's answer to a path or method it does not serve.
pub(crate) async fn unrecognized(method: Method, uri: Uri) -> Response {
    error_response(&StripeError::unrecognized_url(method.as_str(), uri.path()))
}

async fn create(request: Mutation) -> Response {
    let endpoint = "POST /v1/payment_intents".to_owned();
    mutate(request, Some(Operation::Create), endpoint, |params, ledger, now| {
        let request = CreateRequest::parse(params)?;
        Ok(ledger.create(request, now))
    })
    .await
}

/// What a read (a GET) needs: the caller authenticated and the query string parsed like a form
/// body (`expand[0]=…` included). Reads are never faulted and ignore idempotency keys, as
/// Stripe's GETs do.
struct Read(Params);

impl FromRequestParts<SimState> for Read {
    /// Stripe's error for a missing or wrong key.
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &SimState) -> Result<Self, Response> {
        auth::authenticate(&parts.headers).map_err(|error| error_response(&error))?;
        Ok(Self(Params::parse(parts.uri.query().unwrap_or_default().as_bytes())))
    }
}

async fn retrieve(State(sim): State<SimState>, Path(id): Path<String>, Read(params): Read) -> Response {
    if let Err(error) = parameters::known_only(&params, parameters::RETRIEVE) {
        return error_response(&error);
    }
    reply_response(sim.retrieve(&id, Expand::from_params(&params, "")))
}

/// `GET /v1/payment_methods/{id}`: a test card's PaymentMethod, or one minted with `POST
/// /_sim/payment_methods`, with its `card.fingerprint`; Stripe's `resource_missing` for any other
/// id.
async fn retrieve_payment_method(Path(id): Path<String>) -> Response {
    match crate::cards::payment_method(&id) {
        Some(method) => json_response(StatusCode::OK, method.to_string()),
        None => error_response(&StripeError::no_such(StatusCode::NOT_FOUND, "payment_method", &id, "id")),
    }
}

/// `GET /v1/payment_intents`: Stripe's list (`created[…]`, `limit`, `starting_after`), newest
/// first; the caller matches metadata itself. The one read a fault strikes (`list`): it is how
/// the fleet finds an order's intents, and its failing is what a test of that path needs.
async fn list(State(sim): State<SimState>, Read(params): Read) -> Response {
    if let Some(fault) = sim.take_fault(Operation::List) {
        return faulted_read(&sim, fault).await;
    }
    match ListRequest::parse(&params) {
        Ok(request) => reply_response(sim.list(&request)),
        Err(error) => error_response(&error),
    }
}

/// A read struck by a fault: a read has no key and changes nothing, so a mode that lets the
/// operation run answers as its plain failure (a 500, a dropped connection).
async fn faulted_read(sim: &SimState, fault: Mode) -> Response {
    match fault {
        Mode::Error500 | Mode::Error500AfterSuccess | Mode::Error500Unsaved => {
            retryable(error_response(&StripeError::internal()))
        }
        Mode::Error429 => retryable(error_response(&StripeError::injected_rate_limit())),
        Mode::LockTimeout => retryable(error_response(&StripeError::lock_timeout())),
        Mode::Error400 => error_response(&StripeError::injected_invalid_request()),
        Mode::Timeout | Mode::SlowConfirm => {
            sim.hang().await;
            dropped_connection()
        }
        Mode::DropAfterSuccess => dropped_connection(),
    }
}

/// `GET /v1/payment_intents/search?query=metadata['order_id']:'…'`: the one form of Stripe's
/// search query language the fleet uses (its sweeper finds an order's intent by metadata).
async fn search(State(sim): State<SimState>, Read(params): Read) -> Response {
    if let Err(error) = parameters::known_only(&params, parameters::SEARCH) {
        return error_response(&error);
    }
    let Some(query) = params.get("query") else {
        return error_response(&StripeError::missing_param("query"));
    };
    let expand = Expand::from_params(&params, "data.");
    match parse_metadata_query(query) {
        Some((key, value)) => reply_response(sim.search_metadata(&key, &value, expand)),
        None => error_response(&StripeError::invalid_param(
            "query",
            format!("The sandbox supports only queries of the form metadata['key']:'value'; got {query:?}"),
        )),
    }
}

/// `metadata['key']:'value'` (either quote) → (key, value).
fn parse_metadata_query(query: &str) -> Option<(String, String)> {
    let rest = query.trim().strip_prefix("metadata[")?;
    let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let rest = &rest[1..];
    let (key, rest) = rest.split_once(quote)?;
    let rest = rest.strip_prefix("]:")?;
    let value_quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let value = rest[1..].strip_suffix(value_quote)?;
    Some((key.to_owned(), value.to_owned()))
}

async fn capture(Path(id): Path<String>, request: Mutation) -> Response {
    let endpoint = format!("POST /v1/payment_intents/{id}/capture");
    mutate(request, Some(Operation::Capture), endpoint, |params, ledger, now| {
        let request = CaptureRequest::parse(params)?;
        Ok(ledger.capture(&id, &request, now))
    })
    .await
}

/// `POST /v1/payment_intents/{id}/confirm`: the buyer's page, with Stripe.js. No fault strikes
/// it: faults are armed for the fleet's own operations (SPEC §6), and this is the buyer's.
async fn confirm(Path(id): Path<String>, request: Mutation) -> Response {
    let endpoint = format!("POST /v1/payment_intents/{id}/confirm");
    mutate(request, None, endpoint, |params, ledger, now| {
        let request = ConfirmRequest::parse(params)?;
        Ok(ledger.confirm(&id, request, now))
    })
    .await
}

async fn cancel(Path(id): Path<String>, request: Mutation) -> Response {
    let endpoint = format!("POST /v1/payment_intents/{id}/cancel");
    mutate(request, Some(Operation::Cancel), endpoint, |params, ledger, now| {
        let request = CancelRequest::parse(params)?;
        Ok(ledger.cancel(&id, &request, now))
    })
    .await
}

/// `POST /v1/refunds`: an idempotent write like the others (its key replays the Refund). No
/// fault strikes it: faults are armed for the fleet's own operations (SPEC §6), and a refund
/// is what a test does in Stripe's place, as an operator would in the Dashboard.
async fn refund(request: Mutation) -> Response {
    let endpoint = "POST /v1/refunds".to_owned();
    mutate(request, None, endpoint, |params, ledger, now| {
        let request = RefundRequest::parse(params)?;
        Ok(ledger.refund(&request, now))
    })
    .await
}

/// What [`mutate`] needs of a state-changing request: the extractors every such route took,
/// gathered in one, so that each handler adds only its path and its operation.
struct Mutation {
    sim: SimState,
    request_id: RequestId,
    headers: HeaderMap,
    body: Bytes,
}

impl FromRequest<SimState> for Mutation {
    /// What `Extension` and `Bytes` refuse with, as each would answer as a handler's argument.
    type Rejection = Response;

    async fn from_request(request: Request, sim: &SimState) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Extension(request_id) = Extension::<RequestId>::from_request_parts(&mut parts, sim)
            .await
            .map_err(IntoResponse::into_response)?;
        let headers = parts.headers.clone();
        let body = Bytes::from_request(Request::from_parts(parts, body), sim)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self { sim: Arc::clone(sim), request_id, headers, body })
    }
}

/// One state-changing Stripe request, from authentication to the answer (see the module
/// docs for the order).
async fn mutate(
    request: Mutation,
    operation: Option<Operation>,
    endpoint: String,
    run: impl FnOnce(&Params, &mut Ledger, i64) -> Result<Reply, StripeError>,
) -> Response {
    let Mutation { sim, request_id, headers, body } = request;
    let (account, key) = match caller(&headers) {
        Ok(caller) => caller,
        Err(error) => return error_response(&error),
    };
    let params = Params::parse(&body);
    let scope = key.map(|key| Scope {
        account,
        key,
        request: KeyedRequest { endpoint, fingerprint: params.fingerprint() },
    });
    let fault = operation.and_then(|operation| sim.take_fault(operation));
    if let Some(answer) = struck_before_running(&sim, fault, scope.as_ref()).await {
        return answer;
    }

    let (scope, request_id) = (scope.as_ref(), request_id.0.as_str());
    let executed = match fault {
        // Stripe saves the answer of a request that began executing, a 500 included, under
        // its key, and replays it to every retry with that key for 24 hours.
        Some(Mode::Error500) => {
            sim.execute(scope, request_id, Pace::AtOnce, |_, _| Ok(Reply::error(&StripeError::internal())))
        }
        // The operation runs, and what is answered and saved is a 500; a request refused
        // before it ran (bad parameters) is answered as it would be.
        Some(Mode::Error500AfterSuccess) => sim.execute(scope, request_id, Pace::AtOnce, |ledger, now| {
            run(&params, ledger, now).map(|_ran| Reply::error(&StripeError::internal()))
        }),
        Some(Mode::SlowConfirm) => {
            let pace = Pace::Slow { mid_confirm: operation == Some(Operation::Create) };
            sim.execute(scope, request_id, pace, |ledger, now| run(&params, ledger, now))
        }
        _ => sim.execute(scope, request_id, Pace::AtOnce, |ledger, now| run(&params, ledger, now)),
    };
    match (fault, &executed) {
        (Some(Mode::DropAfterSuccess), _) => dropped_connection(),
        // A slow request's answer never comes, nor, while the fault lasts, a replay of it; a
        // refusal (its key in use, bad parameters) comes at once.
        (Some(Mode::SlowConfirm), Executed::Ran(_) | Executed::Replayed(_)) => {
            sim.hang().await;
            dropped_connection()
        }
        _ => executed_response(executed, scope.map(|scope| scope.key.as_str())),
    }
}

/// Who is calling: the API key, and the `Idempotency-Key` if the request has one.
fn caller(headers: &HeaderMap) -> Result<(String, Option<String>), StripeError> {
    Ok((auth::authenticate(headers)?, idempotency_key(headers)?))
}

/// The answer of a fault that strikes before the operation runs (or the hang of one that
/// answers nothing); `None` lets the request go on to the idempotency layer. A 500 from the
/// idempotency layer (`error_500` with a key) is saved under the key, so it goes on; a
/// request without a key just gets it, as does one a 500 from in front of that layer strikes
/// (`error_500_unsaved`): nothing is saved.
async fn struck_before_running(
    sim: &SimState,
    fault: Option<Mode>,
    scope: Option<&Scope>,
) -> Option<Response> {
    let answer = match fault? {
        Mode::Error500 if scope.is_none() => retryable(error_response(&StripeError::internal())),
        Mode::Error500Unsaved => retryable(error_response(&StripeError::internal())),
        Mode::Error429 => retryable(error_response(&StripeError::injected_rate_limit())),
        // The object's lock was not had, so nothing ran and nothing is saved under the key.
        Mode::LockTimeout => retryable(error_response(&StripeError::lock_timeout())),
        // Refused before it runs, as a request that fails validation is: nothing saved.
        Mode::Error400 => error_response(&StripeError::injected_invalid_request()),
        Mode::Timeout => {
            // Executing, with no answer yet: its key is in use while the simulator holds it,
            // and released, with nothing saved, when the hang or its client ends it.
            let _in_use = scope.and_then(|scope| sim.hold_key(scope));
            sim.hang().await;
            dropped_connection()
        }
        Mode::Error500 | Mode::DropAfterSuccess | Mode::Error500AfterSuccess | Mode::SlowConfirm => {
            return None;
        }
    };
    Some(answer)
}

/// The answer to a request that reached the ledger: a replay says so and names the request
/// that first got it, and a request with a key gets its key back, as Stripe's answers do.
fn executed_response(executed: Executed, key: Option<&str>) -> Response {
    let mut response = match executed {
        Executed::Ran(reply) => reply_response(reply),
        Executed::Replayed(saved) => {
            let mut response = reply_response(saved.reply);
            let headers = response.headers_mut();
            headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            if let Ok(original) = HeaderValue::from_str(&saved.request_id) {
                headers.insert(ORIGINAL_REQUEST, original);
            }
            response
        }
        Executed::Refused(error) => error_response(&error),
    };
    if let Some(value) = key.and_then(|key| HeaderValue::from_str(key).ok()) {
        response.headers_mut().insert(IDEMPOTENCY_KEY, value);
    }
    response
}

/// The `Idempotency-Key` header, if the request has a usable one. An empty header counts as
/// none.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, StripeError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let key = value
        .to_str()
        .map_err(|_| StripeError::bad_request("Idempotency keys must be printable ASCII."))?
        .trim();
    if key.len() > idempotency::MAX_KEY_LEN {
        return Err(StripeError::bad_request(format!(
            "Keys for idempotent requests can only be {} characters long.",
            idempotency::MAX_KEY_LEN
        )));
    }
    Ok((!key.is_empty()).then(|| key.to_owned()))
}

pub(crate) fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

pub(crate) fn reply_response(reply: Reply) -> Response {
    json_response(reply.status, reply.body)
}

pub(crate) fn error_response(error: &StripeError) -> Response {
    reply_response(Reply::error(error))
}

/// Stripe marks answers worth retrying (async-stripe's retry strategy reads this header).
fn retryable(mut response: Response) -> Response {
    response.headers_mut().insert(STRIPE_SHOULD_RETRY, HeaderValue::from_static("true"));
    response
}

/// A response whose body fails before its first byte: hyper then closes the connection with
/// the status line still unwritten, so the client sees the connection drop, not an answer.
fn dropped_connection() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, _>(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "stripe-sim: injected connection drop",
        ))
    });
    Response::new(Body::from_stream(failing))
}

#[cfg(test)]
mod search_tests {
    use super::parse_metadata_query;

    #[test]
    fn metadata_queries_parse_with_either_quote() {
        assert_eq!(
            parse_metadata_query("metadata['order_id']:'abc'"),
            Some(("order_id".into(), "abc".into()))
        );
        assert_eq!(
            parse_metadata_query("metadata[\"order_id\"]:\"abc\""),
            Some(("order_id".into(), "abc".into()))
        );
        assert_eq!(parse_metadata_query("amount>100"), None);
    }
}
