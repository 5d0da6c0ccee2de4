//! `order-intake`: reads its configuration, serves the API until SIGTERM/SIGINT.

use std::process::ExitCode;

use order_intake::{AppState, IntakeConfig};
use orderfleet::config::Env;
use orderfleet::tasks::Tasks;

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
    // Supervised (orderfleet::tasks): the server and the metrics each run until the stop
    // signal; one that ends before it stops the other and the process exits 1, naming it.
    let mut tasks = Tasks::new(cancel.clone());
    if let Some(metrics) = metrics {
        tasks.adopt("metrics", metrics);
    }
    tasks.spawn("server", async move {
        tokio::select! {
            served = order_intake::run(listener, state, cancel) => served?,
            () = deadline => tracing::warn!(?grace, "requests still in flight after the grace period; stopping anyway"),
        }
        Ok(())
    });
    tasks.run_until_stopped().await
}
