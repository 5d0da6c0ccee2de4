//! `stock-worker`: long-polls the stock-check queue until SIGTERM/SIGINT.

use std::process::ExitCode;

use orderfleet::aws::Aws;
use std::time::Duration;

use orderfleet::config::{ConfigError, DatabaseConfig, Env, HttpUrl, RuntimeConfig, Seconds, StripeConfig};
use orderfleet::consumer::{self, ConsumerConfig};
use orderfleet::db::{self, PoolSize};
use orderfleet::payments::{Payments, RetryPolicy};
use orderfleet::sweeper::{SweepPolicy, Sweeper};
use orderfleet::tasks::Tasks;

struct Config {
    database: DatabaseConfig,
    stripe: StripeConfig,
    runtime: RuntimeConfig,
    queue_url: HttpUrl,
    batching: bool,
    max_in_flight: u32,
    sweep_every: Seconds,
}

impl Config {
    fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            stripe: StripeConfig::from_env(env)?,
            runtime: RuntimeConfig::from_env(env)?,
            batching: orderfleet::config::batching(env)?,
            queue_url: env.required("STOCK_QUEUE_URL")?,
            max_in_flight: env.or_default("STOCK_WORKER_CONCURRENCY", 32)?,
            sweep_every: env.or_default("SWEEP_INTERVAL_SECONDS", Seconds(Duration::from_secs(60)))?,
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let loaded = async { Ok((Config::from_env(&Env::process())?, Aws::load().await?)) }.await;
    orderfleet::startup::main("stock-worker", loaded, |(c, _)| c.runtime.log_format, |(c, aws)| run(c, aws))
        .await
}

async fn run(config: Config, aws: Aws) -> anyhow::Result<()> {
    let cancel = orderfleet::shutdown::on_signal();
    let pool = db::connect_lazy(&config.database, PoolSize { max_connections: 8, ..PoolSize::default() })?;
    let payments = Payments::new(&config.stripe, RetryPolicy::background())?;
    let metrics = orderfleet::ops::start(config.runtime.metrics_listen_addr, cancel.clone()).await?;
    let consumer = ConsumerConfig {
        max_in_flight: config.max_in_flight.max(1) as usize,
        shutdown_grace: config.runtime.shutdown_grace,
        failure_log: Some(pool.clone()),
        batch_size: if config.batching { 10 } else { 1 },
        ..ConsumerConfig::new(config.queue_url.as_str())
    };
    tracing::info!(queue = consumer::short_name(&consumer.queue_url), "stock-worker running");
    // The sweeper rides along: every worker sweeps now and then (jittered); the status guards
    // make concurrent sweeps harmless. SWEEP_INTERVAL_SECONDS=0 turns it off.
    let mut tasks = Tasks::new(cancel.clone());
    if !config.sweep_every.0.is_zero() {
        let sweeper =
            Sweeper { pool: pool.clone(), payments: payments.clone(), policy: SweepPolicy::default() };
        tasks.spawn_loop("sweeper", sweeper.run(config.sweep_every.0, cancel.clone()));
    }
    if let Some(metrics) = metrics {
        tasks.adopt("metrics", metrics);
    }
    let fulfilment = orderfleet::fulfilment::Fulfilment { pool, payments };
    tasks.spawn("consumer", consumer::run(aws.sqs(), consumer, stock_worker::handler(fulfilment), cancel));
    tasks.run_until_stopped().await
}
