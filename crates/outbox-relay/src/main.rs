//! `outbox-relay`: relays outbox rows to SQS and retires old ones, until SIGTERM/SIGINT.

use std::process::ExitCode;

use orderfleet::aws::Aws;
use orderfleet::config::Env;
use outbox_relay::RelayConfig;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match RelayConfig::from_env(&Env::process()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("outbox-relay: {error}");
            return ExitCode::FAILURE;
        }
    };
    let aws = match Aws::load().await {
        Ok(aws) => aws,
        Err(error) => {
            eprintln!("outbox-relay: {error}");
            return ExitCode::FAILURE;
        }
    };
    orderfleet::telemetry::init(config.runtime.log_format);
    match run(config, aws).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "outbox-relay stopped with an error");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: RelayConfig, aws: Aws) -> anyhow::Result<()> {
    let cancel = orderfleet::shutdown::on_signal();
    let (pool, sender) = outbox_relay::build(&config, &aws).await?;
    let metrics = orderfleet::ops::spawn(config.runtime.metrics_listen_addr, cancel.clone());
    let retention =
        tokio::spawn(outbox_relay::retention::run(pool.clone(), config.retention, cancel.clone()));
    tracing::info!(batching = config.tuning.batching, "outbox-relay running");
    outbox_relay::run(pool, sender, config.tuning, cancel.clone()).await?;
    cancel.cancel();
    let _ = retention.await;
    if let Some(metrics) = metrics {
        metrics.await??;
    }
    tracing::info!("outbox-relay stopped");
    Ok(())
}
