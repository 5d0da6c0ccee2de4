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
//! back full ([`Backlog`]), so a trickle is still sent by one lane in full batches.
//!
//! [`retention`] moves sent rows past their age to `outbox_archive` (or deletes them).

mod config;
pub mod gauges;
pub mod retention;
mod rows;
pub mod send;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use orderfleet::domain::OrderId;
use orderfleet::domain::outbox::{Destination, EventType};
use orderfleet::runtime::backlog::Backlog;
use orderfleet::runtime::backoff::Backoff;
use orderfleet::runtime::config::{ConfigError, DatabaseConfig, Env, QueueConfig, RuntimeConfig, Setting};
use orderfleet::runtime::db::Pool;
use orderfleet::runtime::failure::{Failure, Kind, Outcome, Source};
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use retention::{RetentionMode, RetentionPolicy};
pub use rows::{Claimed, claim};
pub use send::Sender;

use config::{RelayConfig, RelayTuning};
use rows::{next_due, record};

/// The relay loop. Returns when `cancel` fires; a round in progress finishes first (its sends
/// are short and their results must be recorded, or the rows would wait out their lease).
pub(crate) async fn run(
    pool: Pool,
    sender: Sender,
    tuning: RelayTuning,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let backlog = Arc::new(Backlog::default());
    // A lane that panics stops the others at the end of their rounds (not mid-round, which
    // would leave sent rows unrecorded until their lease ends), and then the relay.
    let lanes_cancel = cancel.child_token();
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..tuning.lanes.max(1) {
        let lane = Lane {
            id: lane,
            pool: pool.clone(),
            sender: sender.clone(),
            tuning,
            backlog: backlog.clone(),
            cancel: lanes_cancel.clone(),
            listener: None,
            claim_failures: 0,
            outages: 0,
        };
        lanes.spawn(lane.run());
    }
    let mut panicked = None;
    while let Some(done) = lanes.join_next().await {
        if let Err(e) = done {
            tracing::error!(error = %e, "a relay lane panicked; stopping the others");
            lanes_cancel.cancel();
            panicked.get_or_insert(e);
        }
    }
    match panicked {
        Some(e) => Err(e).context("a relay lane panicked"),
        None => Ok(()),
    }
}

/// One lane of the relay: a round at a time. Lane 0 always runs and wakes on new rows; the
/// others run only while the backlog is deep.
struct Lane {
    id: usize,
    pool: Pool,
    sender: Sender,
    tuning: RelayTuning,
    backlog: Arc<Backlog>,
    cancel: CancellationToken,
    /// Lane 0's `LISTEN outbox_inserted`, reconnected when it drops.
    listener: Option<PgListener>,
    /// Claims failed in a row (the database), and rounds that found SQS down in a row.
    claim_failures: u32,
    outages: u32,
}

impl Lane {
    /// Rounds until the stop signal: claim, send, record, pace. A round in progress finishes
    /// first (its sends are short and their results must be recorded, or the rows would wait
    /// out their lease).
    async fn run(mut self) {
        if self.id == 0 {
            self.listener = connect_listener(&self.pool).await;
        }
        while !self.cancel.is_cancelled() {
            if self.id > 0 && !self.backlog.wait_deep(&self.cancel).await {
                return;
            }
            let Some(claimed) = self.claim().await else { continue };
            if claimed.is_empty() {
                self.wait_for_rows().await;
                continue;
            }
            let short_round = (claimed.len() as i64) < self.tuning.claim_batch;
            let outcomes = self.send(claimed).await;
            let outage = outcomes.iter().all(|(_, o)| o.as_ref().is_err_and(|f| f.kind == Kind::Outage));
            if let Err(e) = record(&self.pool, &outcomes, &self.tuning).await {
                // The rows stay `processing` until their lease ends, then come due again: they
                // may be sent twice, which the consumers' inbox and status guards absorb.
                tracing::warn!(error = %e, lane = self.id, "failed to record send results; the rows come due again after their lease");
            }
            self.pace(outage, short_round).await;
        }
    }

    /// Claims a round's rows; `None` after a failed claim (the database), once its backoff
    /// has passed.
    async fn claim(&mut self) -> Option<Vec<Claimed>> {
        match claim(&self.pool, self.tuning.claim_batch, self.tuning.claim_lease).await {
            Ok(rows) => {
                self.claim_failures = 0;
                // A full claim wakes the other lanes at once, unless this lane is probing an
                // outage: one lane is enough to find out when SQS answers again.
                if self.outages == 0 || rows.is_empty() {
                    self.backlog.observe(rows.len(), self.tuning.claim_batch as usize);
                }
                let result = if rows.is_empty() { "empty" } else { "rows" };
                metrics::counter!("outbox_claims_total", "result" => result).increment(1);
                Some(rows)
            }
            Err(e) => {
                self.claim_failures += 1;
                self.backlog.observe(0, 1);
                let (failures, lane) = (self.claim_failures, self.id);
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(error = %e, failures, lane, "cannot claim outbox rows; the database may be down");
                }
                let delay = Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).delay(failures);
                pause(&self.cancel, delay).await;
                None
            }
        }
    }

    /// Sends the rows. The round must end well inside the claim, or another relay may take
    /// the rows over while this one still sends them; a round cut short is an outage, charged
    /// to no row.
    async fn send(&self, claimed: Vec<Claimed>) -> Vec<(Claimed, Outcome)> {
        let limit = self.tuning.claim_lease / 2;
        match tokio::time::timeout(limit, self.sender.send(claimed.clone())).await {
            Ok(outcomes) => outcomes,
            Err(_) => {
                let reason = format!("the send round took longer than {limit:?}");
                let failure = Failure::outage(Source::Sqs, "timeout", reason).retry_in(send::OUTAGE_RETRY);
                claimed.into_iter().map(|row| (row, Err(failure.clone()))).collect()
            }
        }
    }

    /// After a round: back off while SQS is down; otherwise, after a short round, give the
    /// outbox a moment to fill so the next round's batches go out full.
    async fn pace(&mut self, outage: bool, short_round: bool) {
        let lane = self.id;
        if outage {
            self.backlog.observe(0, 1);
            self.outages += 1;
            let (outages, delay) = (self.outages, self.tuning.outage_backoff.delay(self.outages - 1));
            if outages == 1 || outages.is_multiple_of(20) {
                tracing::warn!(outages, lane, ?delay, "SQS is unreachable; holding every row, charging none");
            }
            return pause(&self.cancel, delay).await;
        }
        if self.outages > 0 {
            tracing::info!(outages = self.outages, lane, "SQS answers again; draining");
        }
        self.outages = 0;
        if short_round && !self.tuning.fill_delay.is_zero() {
            pause(&self.cancel, self.tuning.fill_delay).await;
        }
    }

    /// Nothing was due: lane 0 sleeps until a notification, the next row's due time or the
    /// fallback poll; another lane goes back to waiting for a deep backlog.
    async fn wait_for_rows(&mut self) {
        if self.id > 0 {
            return;
        }
        let wait = match next_due(&self.pool).await {
            Ok(Some(due)) => {
                (due - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO).min(self.tuning.poll_interval)
            }
            _ => self.tuning.poll_interval,
        };
        wait_for_rows(&mut self.listener, &self.pool, wait, &self.cancel).await;
    }
}

async fn pause(cancel: &CancellationToken, delay: Duration) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

async fn connect_listener(pool: &Pool) -> Option<PgListener> {
    let attempt = async {
        let mut listener = PgListener::connect_with(&pool.for_listener()).await?;
        listener.listen("outbox_inserted").await?;
        Ok::<_, sqlx::Error>(listener)
    };
    match attempt.await {
        Ok(listener) => Some(listener),
        Err(e) => {
            tracing::warn!(error = %e, "cannot LISTEN for new outbox rows; polling until it can");
            None
        }
    }
}

/// Sleeps until a notification, the fallback poll, or the stop signal.
async fn wait_for_rows(
    listener: &mut Option<PgListener>,
    pool: &Pool,
    wait: Duration,
    cancel: &CancellationToken,
) {
    if listener.is_none() {
        *listener = connect_listener(pool).await;
    }
    match listener {
        Some(l) => {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
                received = l.try_recv() => {
                    match received {
                        Ok(Some(_)) => {
                            // Every committed insert notifies, and during a burst the relay
                            // is busy sending, so thousands wait on the connection. One round
                            // claims all their rows: drop the rest of what is already here,
                            // or each would wake an empty claim (measured: ~4,000 of them,
                            // spinning at 1,500/s after a 2,000-order burst).
                            while let Some(Ok(Some(_))) = l.try_recv().now_or_never() {}
                        }
                        // The connection dropped; sqlx reconnects on the next call.
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "LISTEN connection failed; reconnecting");
                            *listener = None;
                        }
                    }
                }
            }
        }
        None => pause(cancel, wait).await,
    }
}

/// The relay binary: the relay's lanes, the retention job and the backlog gauges.
pub struct OutboxRelay {
    config: RelayConfig,
    aws: orderfleet::runtime::aws::Aws,
}

impl orderfleet::runtime::service::Service for OutboxRelay {
    const NAME: &'static str = "outbox-relay";

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self { config: RelayConfig::from_env(env)?, aws: orderfleet::runtime::aws::Aws::load().await? })
    }

    async fn start(
        self,
        _: &RuntimeConfig,
        tasks: &mut orderfleet::runtime::tasks::Tasks,
    ) -> anyhow::Result<()> {
        let Self { config, aws } = self;
        let pool = orderfleet::runtime::db::connect_lazy(
            &config.database,
            // A connection per lane, one each for the retention job and the gauges, two spare.
            // (Lane 0's LISTEN holds a connection of its own, outside the pool.)
            orderfleet::runtime::db::PoolSize {
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
        tasks.spawn("relay", run(pool, sender, config.tuning, stop));
        Ok(())
    }
}
