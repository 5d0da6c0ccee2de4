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

pub mod gauges;
pub mod retention;
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
pub use send::Sender;

#[derive(Debug, Clone)]
pub(crate) struct RelayConfig {
    pub database: DatabaseConfig,
    pub queues: QueueConfig,
    pub retention: RetentionPolicy,
    pub tuning: RelayTuning,
    pub gauges: gauges::GaugeConfig,
}

/// The relay's knobs; defaults fit a flash sale on a small box.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RelayTuning {
    /// Rows claimed per round.
    pub claim_batch: i64,
    /// Rounds at once while claims come back full; one otherwise.
    pub lanes: usize,
    /// How long a claim lasts before another relay may take the rows over.
    pub claim_lease: Duration,
    /// Sends per row before it is `dead` (entry-level transient failures only).
    pub max_attempts: i32,
    pub retry_backoff: Backoff,
    /// Between rounds during an outage.
    pub outage_backoff: Backoff,
    /// The fallback poll when no notification comes.
    pub poll_interval: Duration,
    /// After a round that claimed fewer rows than `claim_batch`, how long to wait before the
    /// next claim, so that under a burst the next round's batches go out full rather than a
    /// few rows at a time (the first row after a quiet spell is never delayed).
    pub fill_delay: Duration,
    /// Whether to use SendMessageBatch (10 per call) or one SendMessage per row, for the
    /// benchmark that shows what batching buys.
    pub batching: bool,
}

impl Default for RelayTuning {
    fn default() -> Self {
        Self {
            claim_batch: 100,
            lanes: 3,
            claim_lease: Duration::from_secs(30),
            max_attempts: 8,
            retry_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            outage_backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            poll_interval: Duration::from_secs(5),
            fill_delay: Duration::from_millis(100),
            batching: true,
        }
    }
}

struct Mode(RetentionMode);

impl Setting for Mode {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        match raw {
            "archive" => Ok(Mode(RetentionMode::Archive)),
            "delete" => Ok(Mode(RetentionMode::Delete)),
            _ => Err(format!("expected \"archive\" or \"delete\", got {raw:?}")),
        }
    }
}

/// `OUTBOX_METRICS_INTERVAL_SECONDS`: 30 by default, 1 to 60. The alarms read one-minute
/// periods, the pending-age one treating a missing minute as breaching: a slower interval
/// would page with nothing wrong.
fn gauge_interval(env: &Env) -> Result<Duration, ConfigError> {
    let seconds: u64 = env.or_default("OUTBOX_METRICS_INTERVAL_SECONDS", 30)?;
    if !(1..=60).contains(&seconds) {
        return Err(ConfigError::Malformed {
            name: "OUTBOX_METRICS_INTERVAL_SECONDS",
            reason: format!("must be 1 to 60 (the alarms' period), got {seconds}"),
        });
    }
    Ok(Duration::from_secs(seconds))
}

impl RelayConfig {
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let hours: u64 = env.or_default("OUTBOX_RETENTION_HOURS", 168)?;
        let mode: Option<Mode> = env.optional("OUTBOX_RETENTION_MODE")?;
        let max_attempts: u32 =
            env.or_default("OUTBOX_MAX_ATTEMPTS", RelayTuning::default().max_attempts as u32)?;
        if max_attempts == 0 {
            return Err(ConfigError::Malformed {
                name: "OUTBOX_MAX_ATTEMPTS",
                reason: "must be at least 1".into(),
            });
        }
        let batching = orderfleet::runtime::config::batching(env)?;
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            queues: QueueConfig::from_env(env)?,
            gauges: gauges::GaugeConfig {
                namespace: env.optional("CLOUDWATCH_NAMESPACE")?,
                every: gauge_interval(env)?,
            },
            retention: RetentionPolicy {
                age: Duration::from_secs(hours * 3600),
                mode: mode.map(|m| m.0).unwrap_or(RetentionMode::Archive),
                batch: 500,
                every: Duration::from_secs(60),
            },
            tuning: RelayTuning {
                max_attempts: max_attempts as i32,
                batching,
                // One message per call gains nothing from waiting for more.
                fill_delay: if batching { RelayTuning::default().fill_delay } else { Duration::ZERO },
                ..RelayTuning::default()
            },
        })
    }
}

/// A claimed outbox row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    /// The row's id: the envelope's `message_id`.
    pub id: Uuid,
    /// The order the row is about.
    pub aggregate_id: OrderId,
    /// What happened.
    pub event_type: EventType,
    /// Where it goes.
    pub destination: Destination,
    /// The event's data, as written.
    pub payload: serde_json::Value,
    /// Failed sends so far.
    pub retry_count: i32,
    /// When the row was written, with its order's change.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The order's W3C trace context, sent as the `traceparent` message attribute.
    pub traceparent: Option<String>,
    /// The end of this relay's claim. Results are recorded only while it is still this claim:
    /// a relay so slow that another took the row over must not overwrite the newer result.
    pub claimed_until: chrono::DateTime<chrono::Utc>,
}

/// Claims up to `limit` due rows for `lease`, in one statement (its own short transaction).
pub async fn claim(pool: &Pool, limit: i64, lease: Duration) -> sqlx::Result<Vec<Claimed>> {
    sqlx::query_as!(
        Claimed,
        r#"UPDATE outbox o
            SET status = 'processing', next_attempt_at = now() + $2 * interval '1 ms', updated_at = now()
          WHERE o.id IN (SELECT id FROM outbox
                          WHERE status IN ('pending', 'processing', 'failed') AND next_attempt_at <= now()
                          ORDER BY next_attempt_at
                          LIMIT $1
                          FOR UPDATE SKIP LOCKED)
      RETURNING o.id, o.aggregate_id AS "aggregate_id: OrderId", o.event_type AS "event_type: EventType",
                o.destination AS "destination: Destination", o.payload, o.retry_count, o.created_at,
                o.traceparent, o.next_attempt_at AS claimed_until"#,
        limit,
        lease.as_millis() as i64,
    )
    .fetch_all(pool)
    .await
}

/// Writes what happened to each claimed row, in one statement per kind of result.
pub(crate) async fn record(
    pool: &Pool,
    outcomes: &[(Claimed, Outcome)],
    tuning: &RelayTuning,
) -> sqlx::Result<()> {
    record_sent(pool, outcomes).await?;
    let failed: Vec<(&Claimed, Retry)> = outcomes
        .iter()
        .filter_map(|(row, outcome)| {
            outcome.as_ref().err().map(|failure| (row, Retry::of(row, failure, tuning)))
        })
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = failed.iter().map(|(row, _)| row.id).collect();
    let statuses: Vec<&str> = failed.iter().map(|(_, r)| r.status).collect();
    let retries: Vec<i32> = failed.iter().map(|(_, r)| r.retry_count).collect();
    let codes: Vec<&str> = failed.iter().map(|(_, r)| r.failure.code.as_str()).collect();
    let reasons: Vec<&str> = failed.iter().map(|(_, r)| r.failure.reason.as_str()).collect();
    let delays_ms: Vec<i64> = failed.iter().map(|(_, r)| r.delay.as_millis() as i64).collect();
    let claims: Vec<chrono::DateTime<chrono::Utc>> =
        failed.iter().map(|(row, _)| row.claimed_until).collect();
    sqlx::query!(
        "UPDATE outbox o
            SET status = u.status::outbox_status, retry_count = u.retry_count,
                last_error_code = u.code, last_error_reason = u.reason,
                next_attempt_at = now() + u.delay_ms * interval '1 ms', updated_at = now()
           FROM UNNEST($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[])
             AS u(id, status, retry_count, code, reason, delay_ms, claimed_until)
          WHERE o.id = u.id AND o.status = 'processing' AND o.next_attempt_at = u.claimed_until",
        &ids,
        &statuses as _,
        &retries,
        &codes as _,
        &reasons as _,
        &delays_ms,
        &claims,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Marks the rows SQS took `sent`, in one statement.
async fn record_sent(pool: &Pool, outcomes: &[(Claimed, Outcome)]) -> sqlx::Result<()> {
    let (sent, sent_claims): (Vec<Uuid>, Vec<chrono::DateTime<chrono::Utc>>) =
        outcomes.iter().filter(|(_, o)| o.is_ok()).map(|(row, _)| (row.id, row.claimed_until)).unzip();
    if !sent.is_empty() {
        sqlx::query!(
            "UPDATE outbox o SET status = 'sent', sent_at = now(), updated_at = now(),
                                 last_error_code = NULL, last_error_reason = NULL
               FROM UNNEST($1::uuid[], $2::timestamptz[]) AS c(id, claimed_until)
              WHERE o.id = c.id AND o.status = 'processing' AND o.next_attempt_at = c.claimed_until",
            &sent,
            &sent_claims,
        )
        .execute(pool)
        .await?;
        metrics::counter!("outbox_sent_total").increment(sent.len() as u64);
        for (row, _) in outcomes.iter().filter(|(_, o)| o.is_ok()) {
            let (event_type, destination) = (row.event_type.as_str(), row.destination.as_str());
            row.span().in_scope(|| tracing::info!(event_type, destination, "outbox row sent"));
        }
    }
    Ok(())
}

impl Claimed {
    /// The span of this row's lines: its order's `trace_id` and `order_id`, and its own id.
    pub fn span(&self) -> tracing::Span {
        // Error-level, so that it stays on whatever `RUST_LOG` keeps (see `trace::order_span`).
        let span = tracing::error_span!(
            "outbox_row",
            trace_id = tracing::field::Empty,
            order_id = %self.aggregate_id,
            outbox_id = %self.id
        );
        orderfleet::runtime::trace::follow(&span, self.traceparent.as_deref());
        span
    }
}

/// What a failed send does to its row.
struct Retry<'a> {
    status: &'static str,
    retry_count: i32,
    delay: Duration,
    failure: &'a Failure,
}

impl<'a> Retry<'a> {
    /// Permanent → `dead`; transient → `failed`, charged to the row's budget (`dead` once it is
    /// spent); an outage → `pending` again, charged to nothing: not the row's fault.
    fn of(row: &Claimed, failure: &'a Failure, tuning: &RelayTuning) -> Self {
        let attempts = row.retry_count + 1;
        let (status, retry_count, delay) = match failure.kind {
            Kind::Permanent => ("dead", attempts, Duration::ZERO),
            Kind::Transient if attempts >= tuning.max_attempts => ("dead", attempts, Duration::ZERO),
            Kind::Transient => ("failed", attempts, tuning.retry_backoff.delay(row.retry_count as u32)),
            Kind::Outage => ("pending", row.retry_count, failure.retry_in.unwrap_or(send::OUTAGE_RETRY)),
        };
        if status == "dead" {
            let (code, reason) = (&failure.code, &failure.reason);
            row.span().in_scope(|| {
                tracing::error!(
                    event_type = row.event_type.as_str(),
                    code,
                    reason,
                    "outbox row is dead; see `fleetctl outbox dead`"
                )
            });
            metrics::counter!("outbox_dead_total").increment(1);
        }
        Self { status, retry_count, delay, failure }
    }
}

/// When the next row comes due, if any is waiting.
async fn next_due(pool: &Pool) -> sqlx::Result<Option<chrono::DateTime<chrono::Utc>>> {
    sqlx::query_scalar!(
        "SELECT min(next_attempt_at) FROM outbox WHERE status IN ('pending', 'processing', 'failed')",
    )
    .fetch_one(pool)
    .await
}

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
