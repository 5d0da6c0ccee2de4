//! The operations endpoints every long-running binary serves: `GET /healthz` (liveness: the
//! process runs and answers) and `GET /metrics` (Prometheus text).

use std::net::SocketAddr;
use std::sync::OnceLock;

use anyhow::Context;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide metrics recorder, installed on first use.
pub(crate) fn metrics_handle() -> PrometheusHandle {
    RECORDER
        .get_or_init(|| {
            PrometheusBuilder::new().install_recorder().unwrap_or_else(|_| {
                // Another recorder is installed (a test harness): render an empty registry.
                PrometheusBuilder::new().build_recorder().handle()
            })
        })
        .clone()
}

/// Gives the process's recorder the help text of every metric in `lists`.
pub fn describe(lists: &[&[crate::metrics::Metric]]) {
    // The recorder must be installed first: a description given before it is lost.
    let _ = metrics_handle();
    for metric in lists.iter().flat_map(|list| list.iter()) {
        match metric.kind {
            crate::metrics::Kind::Counter => metrics::describe_counter!(metric.name, metric.help),
            crate::metrics::Kind::Gauge => metrics::describe_gauge!(metric.name, metric.help),
            crate::metrics::Kind::Histogram => metrics::describe_histogram!(metric.name, metric.help),
        }
    }
}

/// `/healthz` and `/metrics`, to merge into an app's router or to serve alone.
pub fn router() -> Router {
    let handle = metrics_handle();
    Router::new().route("/healthz", get(healthz)).route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                crate::pool::record_all();
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
            }
        }),
    )
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({ "status": "ok" }))
}

/// Binds `addr` now — so a taken or invalid `METRICS_LISTEN_ADDR` stops the binary at start,
/// not silently later — and serves [`router`] there until `cancel` fires. The recorder is
/// installed first, so no count made at start is lost. `None` when no address is configured.
pub async fn start(
    addr: Option<SocketAddr>,
    cancel: CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    let _ = metrics_handle();
    let Some(addr) = addr else { return Ok(None) };
    let listener = bind(addr, "METRICS_LISTEN_ADDR").await?;
    tracing::info!(%addr, "serving /healthz and /metrics");
    Ok(Some(tokio::spawn(async move {
        axum::serve(listener, router())
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await
            .context("the metrics server failed")
    })))
}

/// Binds a server's address now, so that a taken or invalid one stops the binary at start,
/// naming its variable, not later.
pub async fn bind(addr: SocketAddr, variable: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("failed to bind {variable} {addr}: {e}"))
}
