//! The simulator's own routes, for tests and demos (not part of Stripe's API, so no API key):
//!
//! - `GET /_sim/payment_intents` → `{"data": [PaymentIntent + capture_count + cancel_count]}`,
//!   oldest first: what a test asserts "captured once" or "hold released" against.
//! - `POST /_sim/faults` with `{"operation", "mode", "count"}` arms a fault (see
//!   [`crate::faults`]); `GET` shows the armed ones, `DELETE` disarms all.
//! - `POST /_sim/reset` forgets everything, for a test that wants a clean account.
//! - `GET /healthz` answers 200 while the server runs, for start-up scripts.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{error_response, json_response};
use crate::error::StripeError;
use crate::faults::{Mode, Operation};
use crate::simulator::SimState;

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/_sim/payment_intents", get(payment_intents))
        .route("/_sim/faults", get(faults).post(arm_fault).delete(clear_faults))
        .route("/_sim/reset", post(reset))
        .route("/healthz", get(health))
}

fn ok(body: &Value) -> Response {
    json_response(StatusCode::OK, body.to_string())
}

async fn payment_intents(State(sim): State<SimState>) -> Response {
    ok(&sim.listing())
}

async fn faults(State(sim): State<SimState>) -> Response {
    ok(&sim.faults())
}

async fn clear_faults(State(sim): State<SimState>) -> Response {
    ok(&sim.clear_faults())
}

async fn reset(State(sim): State<SimState>) -> Response {
    sim.reset();
    tracing::info!("simulator reset: intents, idempotency keys and faults forgotten");
    ok(&json!({ "reset": true }))
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
