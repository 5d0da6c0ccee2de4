//! `outbox-relay`: relays outbox rows to SQS and retires old ones, until SIGTERM/SIGINT.

use std::process::ExitCode;

use orderfleet::aws::Aws;
use orderfleet::config::Env;
use orderfleet::tasks::Tasks;
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
    let mut tasks = Tasks::new(cancel.clone());
    if let Some(metrics) = metrics {
        tasks.adopt("metrics", metrics);
    }
    tasks.spawn_loop(
        "retention",
        outbox_relay::retention::run(pool.clone(), config.retention, cancel.clone()),
    );
    let cloudwatch = aws.cloudwatch();
    tasks.spawn_loop(
        "gauges",
        outbox_relay::gauges::run(pool.clone(), cloudwatch, config.gauges, cancel.clone()),
    );
    tracing::info!(batching = config.tuning.batching, "outbox-relay running");
    tasks.spawn("relay", outbox_relay::run(pool, sender, config.tuning, cancel));
    tasks.run_until_stopped().await
}
