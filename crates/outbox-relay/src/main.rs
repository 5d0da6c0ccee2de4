//! `outbox-relay`: relays outbox rows to SQS and retires old ones, until SIGTERM/SIGINT.

use std::process::ExitCode;

use orderfleet::aws::Aws;
use orderfleet::config::Env;
use outbox_relay::RelayConfig;

#[tokio::main]
async fn main() -> ExitCode {
    let loaded = async { Ok((RelayConfig::from_env(&Env::process())?, Aws::load().await?)) }.await;
    orderfleet::startup::main("outbox-relay", loaded, |(c, _)| c.runtime.log_format, |(c, aws)| run(c, aws))
        .await
}

async fn run(config: RelayConfig, aws: Aws) -> anyhow::Result<()> {
    let cancel = orderfleet::shutdown::on_signal();
    let (pool, sender) = outbox_relay::build(&config, &aws).await?;
    let metrics = orderfleet::ops::start(config.runtime.metrics_listen_addr, cancel.clone()).await?;
    let retention =
        tokio::spawn(outbox_relay::retention::run(pool.clone(), config.retention, cancel.clone()));
    let gauges = tokio::spawn(outbox_relay::gauges::run(
        pool.clone(),
        aws.cloudwatch(),
        config.gauges,
        cancel.clone(),
    ));
    tracing::info!(batching = config.tuning.batching, "outbox-relay running");
    outbox_relay::run(pool, sender, config.tuning, cancel.clone()).await?;
    cancel.cancel();
    let _ = retention.await;
    let _ = gauges.await;
    if let Some(metrics) = metrics {
        metrics.await??;
    }
    Ok(())
}
