//! The `notification-worker` binary: its settings (SPEC §3) and what it runs until stopped.

use orderfleet_runtime::aws::Aws;
use orderfleet_runtime::config::{ConfigError, Env, RuntimeConfig, TopicConfig, WorkerConfig};
use orderfleet_runtime::consumer::{self, ConsumerConfig};
use orderfleet_runtime::db::{self, PoolSize};
use orderfleet_runtime::service::Service;
use orderfleet_runtime::tasks::Tasks;

/// The notification queue gets two messages per order: more in flight than the stock worker,
/// so it keeps up with a burst (more pollers only made the batches smaller).
const MAX_IN_FLIGHT: usize = 80;

/// The notification worker: a consumer of the notification queue that publishes to SNS.
pub struct NotificationWorker {
    /// `DATABASE_URL`, `NOTIFICATION_QUEUE_URL`, `ORDERFLEET_BATCHING`.
    pub worker: WorkerConfig,
    /// `NOTIFICATION_TOPIC_ARN`.
    pub topic: TopicConfig,
    /// The AWS clients.
    pub aws: Aws,
}

impl Service for NotificationWorker {
    const NAME: &'static str = "notification-worker";
    const METRICS: &'static [&'static [orderfleet_runtime::metrics::Metric]] = &[crate::metrics::ALL];

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        let worker = WorkerConfig::from_env(env, "NOTIFICATION_QUEUE_URL")?;
        Ok(Self { worker, topic: TopicConfig::from_env(env)?, aws: Aws::load().await? })
    }

    async fn start(self, runtime: &RuntimeConfig, tasks: &mut Tasks) -> anyhow::Result<()> {
        let Self { worker, topic, aws } = self;
        let pool = db::connect_lazy(
            &worker.database,
            PoolSize { max_connections: 4, application_name: "notification-worker", ..PoolSize::default() },
        )?;
        let consumer = ConsumerConfig::for_worker(&worker, runtime, MAX_IN_FLIGHT, pool.clone());
        tracing::info!(queue = consumer::short_name(&consumer.queue_url), "consuming");
        let handler = crate::handler(pool, aws.sns(), topic.notification_topic_arn, tasks.stop_signal());
        tasks.spawn("consumer", consumer::run(aws.sqs(), consumer, handler, tasks.stop_signal()));
        Ok(())
    }
}
