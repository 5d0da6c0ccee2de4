//! The simulator's own routes, for tests and demos (not part of Stripe's API, so no API key):
//!
//! - `GET /_sim/payment_intents` → `{"data": [PaymentIntent + capture_count + cancel_count]}`,
//!   oldest first: what a test asserts "captured once" or "hold released" against.
//! - `POST /_sim/faults` with `{"operation", "mode", "count"}` arms a fault (see
//!   [`crate::faults`]); `GET` shows the armed ones, `DELETE` disarms all.
//! - `POST /_sim/rate_limit` with `{"per_second": N, "per_endpoint": M}` limits the API
//!   (every `/v1/…` request) to N requests in any one second, and each named operation
//!   (`POST /v1/payment_intents`, `GET /v1/payment_intents/{id}`, …) to M, answering the rest
//!   with Stripe's 429 `rate_limit` (see [`crate::rate`]); 0 clears a limit, and a field left
//!   out leaves its limit as it is. It answers, as `GET` does, the setting: `{"per_second": N,
//!   "per_endpoint": M}`. `STRIPE_SIM_RATE_LIMIT` and `STRIPE_SIM_ENDPOINT_RATE_LIMIT` set them
//!   at start.
//! - `GET /_sim/stats` → `{"requests", "rate_limited", "max_requests_in_one_second",
//!   "max_requests_in_one_second_by_endpoint": {"POST /v1/payment_intents": n, …}}`: the API
//!   requests seen, those a limit refused (not injected `error_429` faults), and the most
//!   received in any one second, overall and on each operation called.
//! - `GET /_sim/connections` → `{"connections"}`: the TCP connections accepted, so a test or
//!   the bench can see whether a client keeps its connections (not in SPEC §6, which fixes
//!   the stats' shape; kept apart so that shape stays as written).
//! - `POST /_sim/payment_intents/{id}/expire` (also `…/expire_authorization`) lets a hold's window (7 days)
//!   pass now: Stripe cancels the intent (reason `automatic`), so a later capture is refused.
//!   It answers the intent, or Stripe's error for an unknown one or one that is not a hold.
//! - `POST /_sim/payment_intents/{id}/authenticate` with `{"outcome": "succeed"|"fail"}`
//!   stands in for the buyer's browser finishing a 3-D Secure challenge: a `requires_action`
//!   intent goes on as an approved one (`requires_capture` with its charge, for manual
//!   capture), or back to `requires_payment_method` with `payment_intent_authentication_failure`.
//!   Any other status is Stripe's `payment_intent_unexpected_state` (400).
//! - `POST /_sim/webhooks` with `{"duplicate": bool, "min_delay_ms": M, "max_delay_ms": N}` sets
//!   how events are delivered from then on (each twice, each copy held a random M..=N ms); `GET` lists every
//!   delivery attempt, `{"data": [{"event_id", "type", "status"}]}`, and the mode (see
//!   [`crate::webhooks`]).
//! - `POST /_sim/payment_methods` with `{"like": "pm_card_visa", "fingerprint": "..."}` makes a
//!   new `pm_…` that behaves as the named test card with that fingerprint (`GET
//!   /v1/payment_methods/{id}` shows it): a stand-in for a card a buyer types into Stripe.js.
//! - `POST /_sim/reset` forgets every intent, idempotency key, fault and webhook attempt and
//!   zeroes the stats, for a test that wants a clean account. It keeps the rate limits, which are
//!   how the simulator was set up rather than the account's history; set 0 to clear them (and the
//!   webhook endpoint and delivery mode, likewise).
//! - `GET /healthz` answers 200 while the server runs, for start-up scripts.
//!
//! None of these is rate limited or counted in the stats: they are how a test looks at the
//! simulator, and looking must not change what it sees.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{error_response, json_response, reply_response};
use crate::error::StripeError;
use crate::faults::{Mode, Operation};
use crate::intent::Authentication;
use crate::simulator::SimState;
use crate::webhooks::DeliveryMode;

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/_sim/payment_intents", get(payment_intents))
        .route("/_sim/payment_methods", post(mint_payment_method))
        .route("/_sim/payment_intents/{id}/expire_authorization", post(expire_authorization))
        // SPEC §6's name for the same.
        .route("/_sim/payment_intents/{id}/expire", post(expire_authorization))
        .route("/_sim/payment_intents/{id}/authenticate", post(authenticate))
        .route("/_sim/webhooks", get(webhooks).post(set_webhooks))
        .route("/_sim/faults", get(faults).post(arm_fault).delete(clear_faults))
        .route("/_sim/rate_limit", get(rate_limit).post(set_rate_limit))
        .route("/_sim/search_lag", get(search_lag).post(set_search_lag))
        .route("/_sim/stats", get(stats))
        .route("/_sim/connections", get(connections))
        .route("/_sim/reset", post(reset))
        .route("/_sim/idempotency_keys/expire", post(expire_idempotency_keys))
        .route("/healthz", get(health))
}

fn ok(body: &Value) -> Response {
    json_response(StatusCode::OK, body.to_string())
}

async fn payment_intents(State(sim): State<SimState>) -> Response {
    ok(&sim.listing())
}

async fn expire_authorization(State(sim): State<SimState>, Path(id): Path<String>) -> Response {
    reply_response(sim.expire_authorization(&id))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthenticateRequest {
    outcome: String,
}

async fn authenticate(State(sim): State<SimState>, Path(id): Path<String>, body: Bytes) -> Response {
    match authentication(&body) {
        Some(outcome) => reply_response(sim.authenticate(&id, outcome)),
        None => error_response(&StripeError::invalid_param(
            "outcome",
            "Invalid authentication: expected {\"outcome\": \"succeed\"} or {\"outcome\": \"fail\"}",
        )),
    }
}

/// `{"outcome": "succeed"|"fail"}`, or nothing that makes sense.
fn authentication(body: &[u8]) -> Option<Authentication> {
    let request = serde_json::from_slice::<AuthenticateRequest>(body).ok()?;
    match request.outcome.as_str() {
        "succeed" => Some(Authentication::Succeeded),
        "fail" => Some(Authentication::Failed),
        _ => None,
    }
}

async fn webhooks(State(sim): State<SimState>) -> Response {
    ok(&json!({ "data": sim.webhook_attempts(), "mode": sim.webhooks().mode() }))
}

/// `{"duplicate": bool, "min_delay_ms": M, "max_delay_ms": N}` (any may be left out: false, 0).
async fn set_webhooks(State(sim): State<SimState>, body: Bytes) -> Response {
    match serde_json::from_slice::<DeliveryMode>(&body) {
        Ok(mode) => {
            sim.set_delivery_mode(mode);
            tracing::info!(
                duplicate = mode.duplicate,
                max_delay_ms = mode.max_delay_ms,
                "webhook delivery set"
            );
            ok(&json!({ "mode": mode }))
        }
        Err(e) => error_response(&StripeError::bad_request(format!(
            "Invalid webhook delivery: expected {{\"duplicate\": true|false, \"max_delay_ms\": N}}: {e}"
        ))),
    }
}

async fn faults(State(sim): State<SimState>) -> Response {
    ok(&sim.faults())
}

async fn clear_faults(State(sim): State<SimState>) -> Response {
    ok(&sim.clear_faults())
}

async fn reset(State(sim): State<SimState>) -> Response {
    sim.reset();
    crate::cards::forget_minted();
    tracing::info!(
        "simulator reset: intents, idempotency keys, faults and stats forgotten; rate limits kept"
    );
    ok(&json!({ "reset": true }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MintRequest {
    like: String,
    fingerprint: Option<String>,
}

/// `POST /_sim/payment_methods` `{"like": "pm_card_visa", "fingerprint": "..."}`: a new `pm_…`
/// that behaves as the named test card, with that fingerprint (the test card's own when left
/// out): a stand-in for a card a buyer types into Stripe.js. Answers the PaymentMethod.
async fn mint_payment_method(body: Bytes) -> Response {
    let request: MintRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error_response(&StripeError::bad_request(format!("invalid body: {e}"))),
    };
    let minted = crate::cards::mint(&request.like, request.fingerprint)
        .and_then(|id| crate::cards::payment_method(&id));
    match minted {
        Some(method) => ok(&method),
        None => {
            error_response(&StripeError::no_such(StatusCode::BAD_REQUEST, "test card", &request.like, "like"))
        }
    }
}

/// Stripe prunes idempotency keys after 24 hours; this does it now, for a test of what a
/// retry finds a day later.
async fn expire_idempotency_keys(State(sim): State<SimState>) -> Response {
    let expired = sim.expire_idempotency_keys();
    tracing::info!(expired, "idempotency keys expired");
    ok(&json!({ "expired": expired }))
}

async fn health() -> Response {
    ok(&json!({ "status": "ok" }))
}

#[derive(Debug, Deserialize)]
struct FaultRequest {
    operation: String,
    /// Optional only when `count` is 0, which disarms whatever the mode.
    mode: Option<String>,
    /// How many matching requests to fault; 1 when left out.
    count: Option<u32>,
}

async fn arm_fault(State(sim): State<SimState>, body: Bytes) -> Response {
    let parsed = serde_json::from_slice::<FaultRequest>(&body)
        .map_err(|e| StripeError::bad_request(format!("Invalid fault: {e}")))
        .and_then(|request| {
            let operation = Operation::parse(&request.operation)
                .map_err(|m| StripeError::invalid_param("operation", m))?;
            let count = request.count.unwrap_or(1);
            let mode = match (request.mode.as_deref(), count) {
                (Some(raw), _) => Mode::parse(raw).map_err(|m| StripeError::invalid_param("mode", m))?,
                // Disarming needs no mode; any will do.
                (None, 0) => Mode::Error500,
                (None, _) => return Err(StripeError::invalid_param("mode", "Missing required field: mode.")),
            };
            Ok((operation, mode, count))
        });
    match parsed {
        Ok((operation, mode, count)) => {
            tracing::info!(operation = operation.as_str(), mode = mode.as_str(), count, "fault armed");
            ok(&sim.arm_fault(operation, mode, count))
        }
        Err(error) => error_response(&error),
    }
}

/// `{"per_second": N, "per_endpoint": M}`: either may be left out (that limit stays as it
/// is), not both.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitRequest {
    /// API requests admitted in any one second; 0 for no limit.
    per_second: Option<u32>,
    /// API requests admitted in any one second on each named operation; 0 for no limit.
    per_endpoint: Option<u32>,
}

fn rate_limit_json(sim: &SimState) -> Value {
    json!({ "per_second": sim.rate_limit(), "per_endpoint": sim.endpoint_rate_limit() })
}

async fn rate_limit(State(sim): State<SimState>) -> Response {
    ok(&rate_limit_json(&sim))
}

async fn set_rate_limit(State(sim): State<SimState>, body: Bytes) -> Response {
    let setting = serde_json::from_slice::<RateLimitRequest>(&body).map_err(|e| e.to_string());
    match setting {
        Ok(RateLimitRequest { per_second: None, per_endpoint: None }) => {
            rate_limit_refused("neither per_second nor per_endpoint given".to_owned())
        }
        Ok(RateLimitRequest { per_second, per_endpoint }) => {
            per_second.inspect(|&n| sim.set_rate_limit(n));
            per_endpoint.inspect(|&m| sim.set_endpoint_rate_limit(m));
            tracing::info!(?per_second, ?per_endpoint, "rate limits set (0: none; not given: unchanged)");
            ok(&rate_limit_json(&sim))
        }
        Err(reason) => rate_limit_refused(reason),
    }
}

fn rate_limit_refused(reason: String) -> Response {
    error_response(&StripeError::invalid_param(
        "per_second",
        format!(
            "Invalid rate limit: expected {{\"per_second\": N, \"per_endpoint\": M}}, either left out to keep \
             it, N and M whole numbers (0 clears a limit): {reason}"
        ),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchLagRequest {
    seconds: u32,
}

async fn search_lag(State(sim): State<SimState>) -> Response {
    ok(&json!({ "seconds": sim.search_lag() }))
}

/// `{"seconds": N}`: a new intent shows in search only N seconds after it is made (0: at once).
async fn set_search_lag(State(sim): State<SimState>, body: Bytes) -> Response {
    match serde_json::from_slice::<SearchLagRequest>(&body) {
        Ok(SearchLagRequest { seconds }) => {
            sim.set_search_lag(seconds);
            tracing::info!(seconds, "search lag set");
            ok(&json!({ "seconds": seconds }))
        }
        Err(e) => error_response(&StripeError::invalid_param(
            "seconds",
            format!("Invalid search lag: expected {{\"seconds\": N}}, N a whole number: {e}"),
        )),
    }
}

async fn stats(State(sim): State<SimState>) -> Response {
    ok(&json!(sim.stats()))
}

async fn connections(State(sim): State<SimState>) -> Response {
    ok(&json!({ "connections": sim.connections() }))
}
