#![warn(missing_docs)]
//! `outbox-relay`: delivers outbox rows to SQS, at least once.
//!
//! The loop: claim due rows in one short statement (`FOR UPDATE SKIP LOCKED`, so several
//! relays share the work), send them with `SendMessageBatch` — 10 per call, grouped by
//! destination, calls in parallel — outside any transaction, then read every entry's result:
//! - sent → `sent`;
//! - an entry SQS refuses for good (too large, invalid) or a queue that does not exist or
//!   denies us → `dead` at once, with code and reason, for a person to look at;
//! - an entry that failed for a passing reason → `failed`, retried with backoff until its
//!   budget is spent, then `dead`;
//! - a call that fails as a whole for a passing reason (connection refused, timeout, 5xx,
//!   throttling) is an outage, not a bad message: the rows go back to `pending` with nothing
//!   charged to their budgets, and the relay as a whole backs off.
//!
//! It wakes on `NOTIFY outbox_inserted` from the inserting transaction (delivered at commit),
//! with a slow poll as the fallback, so an idle system relays a new order within milliseconds
//! without polling hot. A claim is a lease: rows of a relay that died come due again.
//!
//! Under a burst one round at a time cannot keep up (a round waits on SQS), so a relay runs
//! up to `RelayTuning::lanes` rounds at once; the extra lanes claim only while claims come
//! back full ([`Backlog`](orderfleet_runtime::backlog::Backlog)), so a trickle is still sent
//! by one lane in full batches.
//!
//! The modules, in the order a row meets them:
//! - `lanes`: the lanes and their rounds — claim, send, record, pace;
//! - `wait`: how a lane waits — a pause cut short by the stop signal, and lane 0's `LISTEN`
//!   with the poll as its fallback;
//! - `rows`: the outbox rows as the relay sees them — [`claim`], and each row's result
//!   recorded (`sent`, retried after its backoff, or `dead`);
//! - [`send`]: `SendMessageBatch` by destination, and every failure classified where it
//!   happens;
//! - [`retention`]: sent rows past their age moved to `outbox_archive` (or deleted);
//! - [`gauges`]: the outbox's state, which only PostgreSQL knows, as the metrics its alarms
//!   read;
//! - [`metrics`]: every metric the relay exports, and the gauges' names in CloudWatch;
//! - `config`: the relay's settings, read from the environment once, at start.

mod config;
pub mod gauges;
mod lanes;
pub mod metrics;
pub mod retention;
mod rows;
pub mod send;
mod wait;

use anyhow::Context;
use orderfleet_runtime::config::{ConfigError, Env, RuntimeConfig};

pub use rows::{Claimed, claim};
pub use send::Sender;

use config::RelayConfig;

/// The relay binary: the relay's lanes, the retention job and the backlog gauges.
pub struct OutboxRelay {
    config: RelayConfig,
    aws: orderfleet_runtime::aws::Aws,
}

impl orderfleet_runtime::service::Service for OutboxRelay {
    const NAME: &'static str = "outbox-relay";
    const METRICS: &'static [&'static [orderfleet_runtime::metrics::Metric]] = &[crate::metrics::ALL];

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self { config: RelayConfig::from_env(env)?, aws: orderfleet_runtime::aws::Aws::load().await? })
    }

    async fn start(
        self,
        _: &RuntimeConfig,
        tasks: &mut orderfleet_runtime::tasks::Tasks,
    ) -> anyhow::Result<()> {
        let Self { config, aws } = self;
        let pool = orderfleet_runtime::db::connect_lazy(
            &config.database,
            // A connection per lane, one each for the retention job and the gauges, two spare.
            // (Lane 0's LISTEN holds a connection of its own, outside the pool.)
            orderfleet_runtime::db::PoolSize {
                max_connections: config.tuning.lanes.max(1) as u32 + 4,
                application_name: "outbox-relay",
                ..Default::default()
            },
        )
        .context("failed to build the database pool")?;
        let sender = Sender::new(aws.sqs(), &config.queues, config.tuning.batching);
        let stop = tasks.stop_signal();
        tasks.spawn_loop("retention", retention::run(pool.clone(), config.retention, stop.clone()));
        tasks.spawn_loop("gauges", gauges::run(pool.clone(), aws.cloudwatch(), config.gauges, stop.clone()));
        tracing::info!(batching = config.tuning.batching, lanes = config.tuning.lanes, "relaying");
        tasks.spawn("relay", lanes::run(pool, sender, config.tuning, stop));
        Ok(())
    }
}
