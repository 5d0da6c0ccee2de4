//! `stripe-sim`: serves the simulator on `STRIPE_SIM_LISTEN_ADDR` (default
//! `127.0.0.1:12111`) until SIGTERM or SIGINT, limiting the API to `STRIPE_SIM_RATE_LIMIT`
//! requests a second if that is set (0 or unset: no limit).
//!
//! On a stop signal it stops accepting, lets in-flight requests finish (they take
//! microseconds; those held by a `timeout` fault are let go) and exits, or exits anyway once
//! `SHUTDOWN_GRACE_SECONDS` have passed.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use orderfleet::config::Env;
use stripe_sim::{Config, Simulator};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    orderfleet::startup::main("stripe-sim", Config::from_env(&Env::process()), |c| c.runtime.log_format, run)
        .await
}

async fn run(config: Config) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| format!("failed to listen on {}", config.listen_addr))?;
    let addr = listener.local_addr().context("failed to read the listening address")?;
    tracing::info!(%addr, rate_limit_per_second = config.rate_limit, "stripe-sim listening");

    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));
    // /healthz and /metrics on METRICS_LISTEN_ADDR, as every long-running binary (SPEC §2).
    let _metrics = orderfleet::ops::start(config.runtime.metrics_listen_addr, stop.clone()).await?;
    let simulator = Arc::new(Simulator::new().with_rate_limit(config.rate_limit));
    let server = stripe_sim::serve_with(simulator, listener, stop.clone().cancelled_owned());
    let grace = config.runtime.shutdown_grace;
    tokio::select! {
        served = server => served.context("the HTTP server failed")?,
        () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "connections still open after the shutdown grace; exiting anyway");
        }
    }
    Ok(())
}

async fn stop_on_signal(stop: CancellationToken) {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT received; stopping"),
        () = terminate => tracing::info!("SIGTERM received; stopping"),
    }
    stop.cancel();
}
