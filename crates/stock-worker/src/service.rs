//! The `stock-worker` binary: its settings (SPEC §3) and what it runs until stopped.

use std::time::Duration;

use orderfleet::domain::recovery::sweeper::{SweepPolicy, Sweeper};
use orderfleet::domain::steps::fulfilment::Fulfilment;
use orderfleet_payments::StripeConfig;
use orderfleet_payments::{Payments, RetryPolicy};
use orderfleet_runtime::aws::Aws;
use orderfleet_runtime::config::{ConfigError, Env, RuntimeConfig, Seconds, WorkerConfig};
use orderfleet_runtime::consumer::{self, ConsumerConfig};
use orderfleet_runtime::db::{self, PoolSize};
use orderfleet_runtime::service::Service;
use orderfleet_runtime::tasks::Tasks;

/// What the stock worker reads at start.
#[derive(Debug, Clone)]
pub struct Config {
    /// `DATABASE_URL`, `STOCK_QUEUE_URL`, `ORDERFLEET_BATCHING`.
    pub worker: WorkerConfig,
    /// The Stripe key, API base and request budget.
    pub stripe: StripeConfig,
    /// `STOCK_WORKER_CONCURRENCY`: messages handled at once.
    pub max_in_flight: u32,
    /// `SWEEP_INTERVAL_SECONDS`; zero turns the sweeper off.
    pub sweep_every: Seconds,
}

impl Config {
    /// Reads the stock worker's variables; a bad one names itself.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            worker: WorkerConfig::from_env(env, "STOCK_QUEUE_URL")?,
            stripe: StripeConfig::from_env(env)?,
            max_in_flight: env.or_default("STOCK_WORKER_CONCURRENCY", 32)?,
            sweep_every: env.or_default("SWEEP_INTERVAL_SECONDS", Seconds(Duration::from_secs(60)))?,
        })
    }
}

/// The stock worker: a consumer of the stock-check queue, and the sweeper riding along.
pub struct StockWorker {
    /// What it read at start.
    pub config: Config,
    /// The AWS clients.
    pub aws: Aws,
}

impl Service for StockWorker {
    const NAME: &'static str = "stock-worker";
    const METRICS: &'static [&'static [orderfleet_runtime::metrics::Metric]] =
        &[crate::metrics::ALL, orderfleet::metrics::ALL, orderfleet_payments::metrics::ALL];

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self { config: Config::from_env(env)?, aws: Aws::load().await? })
    }

    async fn start(self, runtime: &RuntimeConfig, tasks: &mut Tasks) -> anyhow::Result<()> {
        let Self { config, aws } = self;
        let pool = db::connect_lazy(
            &config.worker.database,
            PoolSize { max_connections: 8, application_name: "stock-worker", ..PoolSize::default() },
        )?;
        let payments = Payments::new(&config.stripe, RetryPolicy::background(), pool.clone())?;
        let consumer =
            ConsumerConfig::for_worker(&config.worker, runtime, config.max_in_flight as usize, pool.clone());
        tracing::info!(queue = consumer::short_name(&consumer.queue_url), "consuming");
        // Every worker sweeps now and then (jittered); the status guards make concurrent
        // sweeps harmless. SWEEP_INTERVAL_SECONDS=0 turns it off.
        if !config.sweep_every.0.is_zero() {
            let sweeper =
                Sweeper { pool: pool.clone(), payments: payments.clone(), policy: SweepPolicy::default() };
            tasks.spawn_loop("sweeper", sweeper.run(config.sweep_every.0, tasks.stop_signal()));
        }
        tasks.spawn_loop("opener", crate::opener::run(pool.clone(), tasks.stop_signal()));
        let sweeping = !config.sweep_every.0.is_zero();
        let handler = crate::handler(Fulfilment { pool, payments }, config.max_in_flight as usize, sweeping);
        tasks.spawn_loop("line", handler.line.clone().run(tasks.stop_signal()));
        tasks.spawn("consumer", consumer::run(aws.sqs(), consumer, handler, tasks.stop_signal()));
        Ok(())
    }
}
