//! The routes: `POST /v1/orders` and `GET /v1/orders/{order_id}`, each a short handler that
//! parses, calls the domain and answers; `/healthz`, `/metrics` and `/openapi.json`; the API's
//! error shape for anything else. [`router`] puts them behind the edge ([`crate::edge`]).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orderfleet_runtime::trace::{TRACEPARENT, Trace};
use orderfleet_words::OrderId;
use orderfleet_words::UserId;
use tracing::Instrument;
use tracing::field::Empty;
use uuid::Uuid;

use crate::error::ApiError;
use crate::orders::{Intake, Placed, database_error};
use crate::request::{IdempotencyKey, OrderRequest};
use crate::views::OrderView;
use crate::{AppState, edge, limits, openapi, webhook};
use orderfleet::domain::words::status::OrderStatus;

/// The HTTP application: `POST /v1/orders`, `GET /v1/orders/{order_id}`, `/openapi.json`, and
/// the error shape for anything else, under the limits and timeouts.
pub fn router(state: AppState) -> Router {
    let limits = state.limits.clone();
    let edge = edge::Edge { verifier: state.verifier.clone(), limits: state.limits.clone() };
    // Outermost first: the rate over everyone, then the bound on requests in flight (one over
    // it is shed at once, answered like a rate limit), then the whole-request timeout and the
    // body's, then the routes.
    let shed = tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(|error: tower::BoxError| async move {
            match error.is::<tower::timeout::error::Elapsed>() {
                true => ApiError::RequestTimeout,
                false => limits::rate_limited(Duration::from_secs(1)),
            }
        }))
        .layer(tower::load_shed::LoadShedLayer::new())
        // Global: Router::layer wraps each route on its own, and a plain ConcurrencyLimitLayer
        // would give every route a bound of its own.
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(limits.config.max_in_flight))
        .layer(tower::timeout::TimeoutLayer::new(limits.config.request_timeout));
    let api = Router::new()
        .route("/v1/orders", post(create_order))
        .route("/v1/orders/{order_id}", get(get_order))
        // The body is read by hand under our own limit, to answer 413 in the API's error shape.
        .layer(DefaultBodyLimit::disable())
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(limits.config.body_timeout))
        .layer(shed)
        .layer(axum::middleware::from_fn_with_state(limits, edge::over_everyones_rate))
        .with_state(state.clone());
    // Stripe's webhooks: no bearer token (Stripe signs them), and not under the buyers' rate
    // limits, load shedding or 16 KiB body, so that Stripe's deliveries and retries are never
    // refused for the buyers' sake; the connection's own timeouts still hold.
    let webhooks = Router::new()
        .route("/webhooks/stripe", post(webhook::receive))
        .layer(DefaultBodyLimit::disable())
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(state.limits.config.body_timeout))
        .with_state(state);
    api.merge(webhooks)
        .merge(orderfleet_runtime::ops::router())
        .route("/openapi.json", get(openapi::serve))
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // Outermost of all: the token, before anything about the request is looked at (its
        // path, its method, the rate), so a request without a valid one learns nothing and
        // spends nothing of the buyers' budget; then the user's own rate, so that one user's
        // flood spends their own budget, not everyone's.
        .layer(axum::middleware::from_fn_with_state(edge, edge::token_first))
}

/// `POST /v1/orders`, in a span of its own that starts the order's trace ([`orderfleet_runtime::trace`]):
/// every line it logs carries the `trace_id`, and the `order_id` once the order is known.
async fn create_order(
    State(state): State<AppState>,
    Extension(user): Extension<UserId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    // Error-level, so that it stays on whatever `RUST_LOG` keeps (see `trace::order_span`).
    let span =
        tracing::error_span!("order_request", trace_id = Empty, order_id = Empty, caller_trace_id = Empty);
    let caller = headers.get(TRACEPARENT).and_then(|v| v.to_str().ok());
    let trace = Trace::start_at_edge(caller, state.caller_trace, &span).traceparent();
    let result = place_order(&state, &user, &headers, body, &trace).instrument(span.clone()).await;
    if let Ok(Placed::Accepted { body, .. }) = &result {
        span.record("order_id", tracing::field::display(body.order_id));
    }
    // In the span: an error's answer logs its cause.
    let _in_span = span.enter();
    let response = match result {
        Ok(Placed::Accepted { body, replayed }) => {
            with_replay((StatusCode::ACCEPTED, Json(body)).into_response(), replayed)
        }
        Ok(Placed::Declined { error, replayed }) => with_replay(error.into_response(), replayed),
        Err(error) => error.into_response(),
    };
    let status = response.status().as_u16();
    tracing::info!(status, "order request answered");
    metrics::counter!(crate::metrics::INTAKE_ORDERS.name, "status" => status.to_string()).increment(1);
    metrics::histogram!(crate::metrics::INTAKE_ORDER_SECONDS.name).record(started.elapsed().as_secs_f64());
    response
}

fn with_replay(mut response: Response, replayed: bool) -> Response {
    if replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

async fn place_order(
    state: &AppState,
    user: &UserId,
    headers: &HeaderMap,
    body: Body,
    traceparent: &str,
) -> Result<Placed, ApiError> {
    let key = IdempotencyKey::from_headers(headers)?;
    let body = edge::read_body(headers, body).await?;
    let request = OrderRequest::parse(&body)?;
    // The placement runs as a task of its own, which a buyer who hangs up cannot cut off:
    // hyper drops a request's future when its client goes, and with it would go whichever
    // database step or Stripe call was in flight. The steps would stay safe (a connection cut
    // off mid-step is closed, and its transaction rolls back: `orderfleet_runtime::pool`), but the order
    // would wait for its lease to lapse, and the buyer's retry with the same key for it. Run
    // to its end, the placement leaves the order answered for that retry, and its connections
    // in the pool. The task has the request's own bounds: at most `INTAKE_MAX_IN_FLIGHT` run
    // at once (a flood of hang-ups is shed, not left running), each within the request
    // timeout (past it the placement is dropped: its connection is closed, its order waits
    // for its lease), and a stop waits for them.
    let Ok(permit) = state.placements.clone().try_acquire_owned() else {
        return Err(crate::limits::rate_limited(Duration::from_secs(1)));
    };
    let tracker = state.placing.clone();
    let (state, user, traceparent) = (state.clone(), user.clone(), traceparent.to_owned());
    let placing = async move {
        let _permit = permit;
        let intake = Intake {
            pool: &state.pool,
            payments: &state.payments,
            lease: state.lease,
            declines_per_hour: state.limits.config.declines_per_hour,
            traceparent: &traceparent,
            sold_out_reads: &state.sold_out_reads,
        };
        let deadline = state.limits.config.request_timeout;
        tokio::time::timeout(deadline, intake.place(&user, &key, &request)).await.unwrap_or_else(|_| {
            Err(ApiError::Unavailable(anyhow::anyhow!("the placement did not finish within {deadline:?}")))
        })
    };
    match tracker.spawn(placing.in_current_span()).await {
        Ok(placed) => placed,
        Err(e) if e.is_panic() => Err(ApiError::Unexpected(anyhow::anyhow!("the placement panicked: {e}"))),
        Err(e) => Err(ApiError::Unavailable(anyhow::anyhow!("the placement was stopped: {e}"))),
    }
}

async fn get_order(
    State(state): State<AppState>,
    Extension(user): Extension<UserId>,
    headers: HeaderMap,
    // A path that is not UTF-8 names no order: the same answer as an unknown id, never a
    // plain-text 400 of the framework's.
    order_id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<OrderView>, ApiError> {
    let order_id = order_id.map(|Path(id)| id).unwrap_or_default();
    let span = tracing::error_span!(
        "order_lookup",
        trace_id = Empty,
        order_id = %order_id,
        caller_trace_id = Empty
    );
    Trace::start_at_edge(headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()), state.caller_trace, &span);
    let found = look_up_order(&state, &user, &order_id).instrument(span.clone()).await;
    // In the span: an error's answer logs its cause.
    let _in_span = span.enter();
    found
}

async fn look_up_order(state: &AppState, user: &UserId, order_id: &str) -> Result<Json<OrderView>, ApiError> {
    // An id that is not a UUID names no order; the answer is the same as for someone else's.
    let order_id = Uuid::parse_str(order_id).map_err(|_| ApiError::OrderNotFound)?;
    let order = orderfleet::domain::records::order::load(&state.pool, OrderId::from_uuid(order_id))
        .await
        .map_err(database_error)?;
    // Someone else's order is answered as no order at all.
    let theirs = order.filter(|order| &order.user_id == user).ok_or(ApiError::OrderNotFound)?;
    let waiting = matches!(
        theirs.status,
        OrderStatus::Queued | OrderStatus::PendingAuthorization | OrderStatus::RequiresAction
    );
    let line = match waiting {
        true => Some(line_of(state, &theirs).await?),
        false => None,
    };
    // A queued order's place, once drawn, is the line's (`queue_places`), not yet its own.
    let theirs = match &line {
        Some(line) => orderfleet::domain::records::order::Order { position: line.position, ..theirs },
        None => theirs,
    };
    Ok(Json(OrderView::new(theirs, line)))
}

/// A waiting order's place in its product's line, in ONE statement; its expected wait from
/// the fleet's create rate, for an order promised its units.
async fn line_of(
    state: &AppState,
    order: &orderfleet::domain::records::order::Order,
) -> Result<crate::views::LineView, ApiError> {
    let line = orderfleet::domain::records::order::line(&state.pool, order).await.map_err(database_error)?;
    let estimated_wait_seconds = (order.status != OrderStatus::Queued)
        .then(|| ((line.authorizations_ahead + 1) as f64 / state.payments.create_rate().max(0.1)).ceil());
    Ok(crate::views::LineView {
        opens_at: line.opens_at,
        position: line.position,
        queued_ahead: line.queued_ahead,
        authorizations_ahead: line.authorizations_ahead,
        estimated_wait_seconds,
    })
}
