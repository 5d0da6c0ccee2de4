#![warn(missing_docs)]
//! `order-intake`: the HTTP API of SPEC §4.
//!
//! A tour: [`request`] parses what arrives (the idempotency key, the body) into types;
//! [`orders`] places an order — claim the key, authorize outside any transaction, then one
//! transaction for the status change and its outbox rows; [`error`] is every refusal with its
//! status and code. This module wires them to routes, with bearer-token auth, the 16 KiB body
//! limit, and `/healthz` and `/metrics`. The intake never calls SQS: an SQS outage cannot
//! block it.

// Proving the order handler's future `Send` goes through async-stripe's deeply nested types
// (an authorization resumed after a saved 5xx nests one more level): more than the default
// recursion limit.
#![recursion_limit = "256"]

pub mod connection;
pub mod error;
pub mod limits;
pub mod openapi;
pub mod orders;
pub mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use orderfleet::domain::order::{Order, OrderStatus};
use orderfleet::domain::payments::{Payments, RetryPolicy};
use orderfleet::domain::tokens::{TokenVerifier, UserId};
use orderfleet::domain::{Currency, OrderId, Quantity, Sku};
use orderfleet::runtime::config::{
    AuthConfig, ConfigError, DatabaseConfig, Env, RuntimeConfig, Seconds, StripeConfig,
};
use orderfleet::runtime::db::{self, PoolSize};
use orderfleet::runtime::service::{self, Service};
use orderfleet::runtime::tasks::Tasks;
use orderfleet::runtime::trace::{CallerTrace, TRACEPARENT, Trace};
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing::field::Empty;
use uuid::Uuid;

use crate::error::ApiError;
use crate::limits::{Limits, LimitsConfig};
use crate::orders::{Intake, Placed, database_error};
use crate::request::{IdempotencyKey, OrderRequest};

/// Everything the intake reads at start.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// `INTAKE_LISTEN_ADDR`: where the API listens.
    pub listen_addr: SocketAddr,
    /// `DATABASE_URL` and its pool.
    pub database: DatabaseConfig,
    /// The Stripe key, API base and request budget.
    pub stripe: StripeConfig,
    /// How bearer tokens are checked.
    pub auth: AuthConfig,
    /// How long a request may hold an order's key before a retry or the sweeper may take over.
    pub lease: Duration,
    /// The rate limits, slow-client timeouts and the card-testing gate.
    pub limits: LimitsConfig,
    /// Whose trace a request with a `traceparent` joins (`INTAKE_CALLER_TRACE`).
    pub caller_trace: CallerTrace,
}

/// The intake binary: the HTTP API, and the job that forgets quiet users' rate buckets.
impl Service for IntakeConfig {
    const NAME: &'static str = "order-intake";

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            listen_addr: env.or_default("INTAKE_LISTEN_ADDR", SocketAddr::from(([127, 0, 0, 1], 8080)))?,
            database: DatabaseConfig::from_env(env)?,
            stripe: StripeConfig::from_env(env)?,
            auth: AuthConfig::from_env(env)?,
            // Longer than the bounded authorization attempts take (3 × up to 4 s for a budget
            // slot and 5 s for the answer), so a live request never loses its key to a retry.
            lease: env.or_default("INTAKE_LEASE_SECONDS", Seconds(Duration::from_secs(30)))?.0,
            limits: LimitsConfig::from_env(env)?,
            caller_trace: env.or_default("INTAKE_CALLER_TRACE", CallerTrace::Link)?,
        })
    }

    async fn start(self, runtime: &RuntimeConfig, tasks: &mut Tasks) -> anyhow::Result<()> {
        let state = AppState::new(&self)?;
        let listener = service::bind(self.listen_addr, "INTAKE_LISTEN_ADDR").await?;
        tracing::info!(addr = %self.listen_addr, "order-intake listening");
        let stop = tasks.stop_signal();
        tasks.spawn_loop(
            "forget-quiet-users",
            forget_quiet_users_every_minute(state.limits.clone(), stop.clone()),
        );
        // A request still running at the end of the grace is cut off: its order keeps its
        // lease, and a retry or the sweeper takes over.
        tasks.spawn_server("server", runtime.shutdown_grace, run(listener, state, stop));
        Ok(())
    }
}

#[derive(Clone)]
/// What every request handler shares.
pub struct AppState {
    /// The intake's pool (16 connections).
    pub pool: PgPool,
    /// The Stripe client, with the intake's retries and budget.
    pub payments: Payments,
    /// Checks each request's bearer token.
    pub verifier: Arc<TokenVerifier>,
    /// How long a request may hold an order's key (`INTAKE_LEASE_SECONDS`).
    pub lease: Duration,
    /// The rate limits' state.
    pub limits: Arc<Limits>,
    /// Whose trace a request with a `traceparent` joins.
    pub caller_trace: CallerTrace,
}

impl AppState {
    /// Builds the shared state; the pool connects lazily, so a database down at start is an
    /// unready `/healthz`, not a crash.
    pub fn new(config: &IntakeConfig) -> anyhow::Result<Self> {
        let pool = db::connect_lazy(
            &config.database,
            PoolSize { max_connections: 16, min_connections: 4, ..PoolSize::default() },
        )?;
        let payments = Payments::new(&config.stripe, RetryPolicy::default())?;
        Ok(Self {
            pool,
            payments,
            verifier: Arc::new(TokenVerifier::new(&config.auth)),
            lease: config.lease,
            limits: Arc::new(Limits::new(config.limits)),
            caller_trace: config.caller_trace,
        })
    }
}

/// The HTTP application: `POST /v1/orders`, `GET /v1/orders/{order_id}`, `/openapi.json`, and
/// the error shape for anything else, under the limits and timeouts.
pub fn router(state: AppState) -> Router {
    let limits = state.limits.clone();
    let edge = Edge { verifier: state.verifier.clone(), limits: state.limits.clone() };
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
        .layer(axum::middleware::from_fn_with_state(limits, over_everyones_rate))
        .with_state(state);
    api.merge(orderfleet::runtime::ops::router())
        .route("/openapi.json", get(openapi::serve))
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // Outermost of all: the token, before anything about the request is looked at (its
        // path, its method, the rate), so a request without a valid one learns nothing and
        // spends nothing of the buyers' budget; then the user's own rate, so that one user's
        // flood spends their own budget, not everyone's.
        .layer(axum::middleware::from_fn_with_state(edge, token_first))
}

/// What [`token_first`] needs.
#[derive(Clone)]
struct Edge {
    verifier: Arc<TokenVerifier>,
    limits: Arc<Limits>,
}

/// Every `/v1` request needs a valid bearer token, checked before anything else, and its user
/// within their rate; the user rides in the request's extensions to the handler. Other paths
/// (`/healthz`, `/metrics`, `/openapi.json`, unknown ones) need none.
async fn token_first(
    State(edge): State<Edge>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    if path != "/v1" && !path.starts_with("/v1/") {
        return next.run(request).await;
    }
    let user = match authenticate(&edge.verifier, request.headers()) {
        Ok(user) => user,
        Err(refused) => {
            metrics::counter!("intake_unauthorized_total").increment(1);
            return refused.into_response();
        }
    };
    if let Err(refused) = edge.limits.check_user(&user) {
        metrics::counter!("intake_rate_limited_total", "limit" => "user").increment(1);
        return refused.into_response();
    }
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// Refuses a request when the intake as a whole is over its rate, before any work. Only
/// requests with a valid token reach it (see [`token_first`]).
async fn over_everyones_rate(
    State(limits): State<Arc<Limits>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match limits.check_global() {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            metrics::counter!("intake_rate_limited_total", "limit" => "global").increment(1);
            refused.into_response()
        }
    }
}

/// Serves until `cancel` fires; in-flight requests finish first.
///
/// Each connection is served by hyper under two clocks ([`connection`]): a client that connects
/// and sends nothing, or half a request, is cut off at the header timeout
/// (`INTAKE_HEADER_TIMEOUT_SECONDS`), instead of holding its socket for ever (`axum::serve`
/// sets no such timer); a keep-alive connection between requests stays open for the idle
/// timeout (`INTAKE_IDLE_TIMEOUT_SECONDS`), longer than a load balancer's.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's one timer runs from when it starts waiting for a request: the idle timeout.
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(state.limits.config.idle_timeout);
    let header_timeout = state.limits.config.header_timeout;
    let app = router(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = cancel.cancelled() => break,
        };
        let clock = connection::HeadClock::new();
        let service = {
            let (app, clock) = (hyper_util::service::TowerToHyperService::new(app.clone()), clock.clone());
            hyper::service::service_fn(move |request| {
                clock.request_began();
                let (answer, clock) = (hyper::service::Service::call(&app, request), clock.clone());
                async move {
                    let answer = answer.await;
                    clock.request_answered();
                    answer
                }
            })
        };
        let io = hyper_util::rt::TokioIo::new(connection::Watched::new(stream, clock.clone()));
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                },
                // Dropping the connection closes its socket.
                () = clock.headers_late(header_timeout) => tracing::debug!("request headers too slow; connection closed"),
            }
        });
    }
    // No new connections; idle ones close, requests in flight finish.
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The per-user buckets of quiet users are dropped every minute, so memory follows the users
/// of the last minute, not every user ever seen.
async fn forget_quiet_users_every_minute(limits: Arc<Limits>, stop: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    while tokio::select! { _ = every.tick() => true, () = stop.cancelled() => false } {
        limits.forget_quiet_users();
    }
}

fn authenticate(verifier: &TokenVerifier, headers: &HeaderMap) -> Result<UserId, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token)
        .ok_or(ApiError::Unauthorized)?;
    verifier.verify(token.trim()).map_err(|_| ApiError::Unauthorized)
}

/// Reads the body under the 16 KiB limit. The body is JSON whatever the Content-Type says
/// (clients such as `curl -d` label it form-encoded); parsing decides.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
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

/// `POST /v1/orders`, in a span of its own that starts the order's trace ([`orderfleet::runtime::trace`]):
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
    metrics::counter!("intake_orders_total", "status" => status.to_string()).increment(1);
    metrics::histogram!("intake_order_seconds").record(started.elapsed().as_secs_f64());
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
    let body = read_body(headers, body).await?;
    let request = OrderRequest::parse(&body)?;
    let intake = Intake {
        pool: &state.pool,
        payments: &state.payments,
        lease: state.lease,
        declines_per_hour: state.limits.config.declines_per_hour,
        traceparent,
    };
    intake.place(user, &key, &request).await
}

// What its buyer is shown of an `Order` (this doc comment is the schema's description).
/// `GET /v1/orders/{id}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Order, title = "Order")]
pub struct OrderView {
    #[schema(value_type = Uuid)]
    /// The order's id.
    pub order_id: OrderId,
    /// Where it is in its life.
    pub status: OrderStatus,
    /// The price times the quantity, in minor units.
    pub amount: i64,
    #[schema(value_type = String)]
    /// The amount's currency.
    pub currency: Currency,
    #[schema(value_type = String)]
    /// The product.
    pub product_id: Sku,
    #[schema(value_type = i32)]
    /// How many units.
    pub quantity: Quantity,
    /// Its place in line for its product, from 1.
    pub position: i64,
    /// When it was placed.
    pub created_at: DateTime<Utc>,
    /// When it last moved.
    pub updated_at: DateTime<Utc>,
    /// Why it failed, as a code; none while it has not.
    pub failure_reason: Option<String>,
}

impl From<Order> for OrderView {
    fn from(order: Order) -> Self {
        Self {
            order_id: order.id,
            status: order.status,
            amount: order.amount.minor,
            currency: order.amount.currency,
            product_id: order.product_id,
            quantity: order.quantity,
            position: order.position,
            created_at: order.created_at,
            updated_at: order.updated_at,
            // A refused capture answers its code, whatever an older stock worker wrote there
            // before it learned to keep Stripe's words to the operators' column.
            failure_reason: match order.status {
                OrderStatus::CaptureFailed => Some(OrderStatus::CaptureFailed.as_str().to_owned()),
                _ => order.failure_reason,
            },
        }
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
    let order = orderfleet::domain::order::load(&state.pool, OrderId::from_uuid(order_id))
        .await
        .map_err(database_error)?;
    // Someone else's order is answered as no order at all.
    let theirs = order.filter(|order| &order.user_id == user);
    theirs.map(|order| Json(OrderView::from(order))).ok_or(ApiError::OrderNotFound)
}
