//! `notification-worker`: long-polls the notification queue until SIGTERM/SIGINT.

use std::process::ExitCode;

use orderfleet::aws::Aws;
use orderfleet::config::{ConfigError, DatabaseConfig, Env, HttpUrl, RuntimeConfig, TopicConfig};
use orderfleet::consumer::{self, ConsumerConfig};
use orderfleet::db::{self, PoolSize};
use orderfleet::tasks::Tasks;

struct Config {
    database: DatabaseConfig,
    topic: TopicConfig,
    runtime: RuntimeConfig,
    queue_url: HttpUrl,
    batching: bool,
}

impl Config {
    fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            topic: TopicConfig::from_env(env)?,
            runtime: RuntimeConfig::from_env(env)?,
            batching: orderfleet::config::batching(env)?,
            queue_url: env.required("NOTIFICATION_QUEUE_URL")?,
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let loaded = async { Ok((Config::from_env(&Env::process())?, Aws::load().await?)) }.await;
    orderfleet::startup::main(
        "notification-worker",
        loaded,
        |(c, _)| c.runtime.log_format,
        |(c, aws)| run(c, aws),
    )
    .await
}

async fn run(config: Config, aws: Aws) -> anyhow::Result<()> {
    let cancel = orderfleet::shutdown::on_signal();
    let pool = db::connect_lazy(&config.database, PoolSize { max_connections: 4, ..PoolSize::default() })?;
    let metrics = orderfleet::ops::start(config.runtime.metrics_listen_addr, cancel.clone()).await?;
    // The notification queue gets two messages per order: more in flight than the stock
    // worker, so it keeps up with a burst (more pollers only made the batches smaller).
    let consumer = ConsumerConfig {
        max_in_flight: 80,
        shutdown_grace: config.runtime.shutdown_grace,
        failure_log: Some(pool.clone()),
        batch_size: if config.batching { 10 } else { 1 },
        ..ConsumerConfig::new(config.queue_url.as_str())
    };
    tracing::info!(queue = consumer::short_name(&consumer.queue_url), "notification-worker running");
    let handler =
        notification_worker::handler(pool, aws.sns(), config.topic.notification_topic_arn, cancel.clone());
    let mut tasks = Tasks::new(cancel.clone());
    if let Some(metrics) = metrics {
        tasks.adopt("metrics", metrics);
    }
    tasks.spawn("consumer", consumer::run(aws.sqs(), consumer, handler, cancel));
    tasks.run_until_stopped().await
}
