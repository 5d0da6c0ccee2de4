//! `order-intake`: reads its configuration, serves the API until SIGTERM/SIGINT.

use std::process::ExitCode;

use order_intake::{AppState, IntakeConfig};
use orderfleet::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    orderfleet::startup::main(
        "order-intake",
        IntakeConfig::from_env(&Env::process()),
        |c| c.runtime.log_format,
        run,
    )
    .await
}

async fn run(config: IntakeConfig) -> anyhow::Result<()> {
    let cancel = orderfleet::shutdown::on_signal();
    let state = AppState::new(&config)?;
    let listener = tokio::net::TcpListener::bind(config.listen_addr)
        .await
        .map_err(|e| anyhow::anyhow!("failed to bind INTAKE_LISTEN_ADDR {}: {e}", config.listen_addr))?;
    tracing::info!(addr = %config.listen_addr, "order-intake listening");
    let metrics = orderfleet::ops::start(config.runtime.metrics_listen_addr, cancel.clone()).await?;
    // In-flight requests may finish within the grace period after the stop signal; one still
    // running then is cut off — its order keeps its lease, and a retry or the sweeper takes over.
    let grace = config.runtime.shutdown_grace;
    let deadline = {
        let cancel = cancel.clone();
        async move {
            cancel.cancelled().await;
            tokio::time::sleep(grace).await;
        }
    };
    tokio::select! {
        served = order_intake::run(listener, state, cancel.clone()) => served?,
        () = deadline => tracing::warn!(?grace, "requests still in flight after the grace period; stopping anyway"),
    }
    // Serving ends only at the stop signal; anything else must not look like a clean stop.
    anyhow::ensure!(cancel.is_cancelled(), "the server task ended before the stop signal");
    cancel.cancel();
    if let Some(metrics) = metrics {
        metrics.await??;
    }
    Ok(())
}
