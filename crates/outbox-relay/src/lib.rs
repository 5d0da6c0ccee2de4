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
//! [`retention`] moves sent rows past their age to `outbox_archive` (or deletes them).

pub mod retention;
pub mod send;

use std::time::Duration;

use anyhow::Context;
use orderfleet::backoff::Backoff;
use orderfleet::config::{ConfigError, DatabaseConfig, Env, QueueConfig, RuntimeConfig, Setting};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use retention::{RetentionMode, RetentionPolicy};
pub use send::{SendOutcome, Sender};

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub database: DatabaseConfig,
    pub queues: QueueConfig,
    pub runtime: RuntimeConfig,
    pub retention: RetentionPolicy,
    pub tuning: RelayTuning,
}

/// The relay's knobs; defaults fit a flash sale on a small box.
#[derive(Debug, Clone, Copy)]
pub struct RelayTuning {
    /// Rows claimed per round.
    pub claim_batch: i64,
    /// How long a claim lasts before another relay may take the rows over.
    pub claim_lease: Duration,
    /// Sends per row before it is `dead` (entry-level transient failures only).
    pub max_attempts: i32,
    pub retry_backoff: Backoff,
    /// Between rounds during an outage.
    pub outage_backoff: Backoff,
    /// The fallback poll when no notification comes.
    pub poll_interval: Duration,
    /// Whether to use SendMessageBatch (10 per call) or one SendMessage per row, for the
    /// benchmark that shows what batching buys.
    pub batching: bool,
}

impl Default for RelayTuning {
    fn default() -> Self {
        Self {
            claim_batch: 100,
            claim_lease: Duration::from_secs(30),
            max_attempts: 8,
            retry_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            outage_backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            poll_interval: Duration::from_secs(5),
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
        let batching = orderfleet::config::batching(env)?;
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            queues: QueueConfig::from_env(env)?,
            runtime: RuntimeConfig::from_env(env)?,
            retention: RetentionPolicy {
                age: Duration::from_secs(hours * 3600),
                mode: mode.map(|m| m.0).unwrap_or(RetentionMode::Archive),
                batch: 500,
                every: Duration::from_secs(60),
            },
            tuning: RelayTuning { max_attempts: max_attempts as i32, batching, ..RelayTuning::default() },
        })
    }
}

/// A claimed outbox row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub id: Uuid,
    pub aggregate_id: String,
    pub event_type: String,
    pub destination: String,
    pub payload: serde_json::Value,
    pub retry_count: i32,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The end of this relay's claim. Results are recorded only while it is still this claim:
    /// a relay so slow that another took the row over must not overwrite the newer result.
    pub claimed_until: chrono::DateTime<chrono::Utc>,
}

/// Claims up to `limit` due rows for `lease`, in one statement (its own short transaction).
pub async fn claim(pool: &PgPool, limit: i64, lease: Duration) -> sqlx::Result<Vec<Claimed>> {
    sqlx::query_as::<_, Claimed>(
        "UPDATE outbox o
            SET status = 'processing', next_attempt_at = now() + $2 * interval '1 ms', updated_at = now()
          WHERE o.id IN (SELECT id FROM outbox
                          WHERE status IN ('pending', 'processing', 'failed') AND next_attempt_at <= now()
                          ORDER BY next_attempt_at
                          LIMIT $1
                          FOR UPDATE SKIP LOCKED)
      RETURNING o.id, o.aggregate_id, o.event_type, o.destination, o.payload, o.retry_count, o.created_at,
                o.next_attempt_at AS claimed_until",
    )
    .bind(limit)
    .bind(lease.as_millis() as i64)
    .fetch_all(pool)
    .await
}

/// Writes what happened to each claimed row, in one statement per kind of result.
pub async fn record(
    pool: &PgPool,
    outcomes: &[(Claimed, SendOutcome)],
    tuning: &RelayTuning,
) -> sqlx::Result<()> {
    let (sent, sent_claims): (Vec<Uuid>, Vec<chrono::DateTime<chrono::Utc>>) = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, SendOutcome::Sent))
        .map(|(row, _)| (row.id, row.claimed_until))
        .unzip();
    if !sent.is_empty() {
        sqlx::query(
            "UPDATE outbox o SET status = 'sent', sent_at = now(), updated_at = now(),
                                 last_error_code = NULL, last_error_reason = NULL
               FROM UNNEST($1::uuid[], $2::timestamptz[]) AS c(id, claimed_until)
              WHERE o.id = c.id AND o.status = 'processing' AND o.next_attempt_at = c.claimed_until",
        )
        .bind(&sent)
        .bind(&sent_claims)
        .execute(pool)
        .await?;
        metrics::counter!("outbox_sent_total").increment(sent.len() as u64);
    }

    let mut ids = Vec::new();
    let mut statuses = Vec::new();
    let mut retries = Vec::new();
    let mut codes = Vec::new();
    let mut reasons = Vec::new();
    let mut delays_ms = Vec::new();
    let mut claims = Vec::new();
    for (row, outcome) in outcomes {
        let (status, retry_count, code, reason, delay) = match outcome {
            SendOutcome::Sent => continue,
            SendOutcome::Permanent { code, reason } => {
                ("dead", row.retry_count + 1, code, reason, Duration::ZERO)
            }
            SendOutcome::Transient { code, reason } => {
                let attempts = row.retry_count + 1;
                if attempts >= tuning.max_attempts {
                    ("dead", attempts, code, reason, Duration::ZERO)
                } else {
                    ("failed", attempts, code, reason, tuning.retry_backoff.delay(row.retry_count as u32))
                }
            }
            // Not the row's fault: no charge to its budget.
            SendOutcome::Outage { code, reason, retry_in } => {
                ("pending", row.retry_count, code, reason, *retry_in)
            }
        };
        if status == "dead" {
            tracing::error!(outbox_id = %row.id, event_type = row.event_type, code, reason, "outbox row is dead; see `fleetctl outbox dead`");
            metrics::counter!("outbox_dead_total").increment(1);
        }
        ids.push(row.id);
        statuses.push(status);
        retries.push(retry_count);
        codes.push(code.clone());
        reasons.push(reason.clone());
        delays_ms.push(delay.as_millis() as i64);
        claims.push(row.claimed_until);
    }
    if !ids.is_empty() {
        sqlx::query(
            "UPDATE outbox o
                SET status = u.status::outbox_status, retry_count = u.retry_count,
                    last_error_code = u.code, last_error_reason = u.reason,
                    next_attempt_at = now() + u.delay_ms * interval '1 ms', updated_at = now()
               FROM UNNEST($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[])
                 AS u(id, status, retry_count, code, reason, delay_ms, claimed_until)
              WHERE o.id = u.id AND o.status = 'processing' AND o.next_attempt_at = u.claimed_until",
        )
        .bind(&ids)
        .bind(&statuses)
        .bind(&retries)
        .bind(&codes)
        .bind(&reasons)
        .bind(&delays_ms)
        .bind(&claims)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// When the next row comes due, if any is waiting.
async fn next_due(pool: &PgPool) -> sqlx::Result<Option<chrono::DateTime<chrono::Utc>>> {
    sqlx::query_scalar(
        "SELECT min(next_attempt_at) FROM outbox WHERE status IN ('pending', 'processing', 'failed')",
    )
    .fetch_one(pool)
    .await
}

/// The relay loop. Returns when `cancel` fires; a round in progress finishes first (its sends
/// are short and their results must be recorded, or the rows would wait out their lease).
pub async fn run(
    pool: PgPool,
    sender: Sender,
    tuning: RelayTuning,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let mut listener = connect_listener(&pool).await;
    let mut failures: u32 = 0;
    let mut outages: u32 = 0;
    while !cancel.is_cancelled() {
        let claimed = match claim(&pool, tuning.claim_batch, tuning.claim_lease).await {
            Ok(rows) => {
                failures = 0;
                rows
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(error = %e, failures, "cannot claim outbox rows; the database may be down");
                }
                pause(
                    &cancel,
                    Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).delay(failures),
                )
                .await;
                continue;
            }
        };

        if claimed.is_empty() {
            let wait = match next_due(&pool).await {
                Ok(Some(due)) => {
                    (due - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO).min(tuning.poll_interval)
                }
                _ => tuning.poll_interval,
            };
            wait_for_rows(&mut listener, &pool, wait, &cancel).await;
            continue;
        }

        // The round must end well inside the claim, or another relay may take the rows over
        // while this one still sends them; a round cut short is an outage, charged to no row.
        let outcomes = match tokio::time::timeout(tuning.claim_lease / 2, sender.send(claimed.clone())).await
        {
            Ok(outcomes) => outcomes,
            Err(_) => claimed
                .into_iter()
                .map(|row| {
                    let outcome = SendOutcome::Outage {
                        code: "timeout".into(),
                        reason: format!("the send round took longer than {:?}", tuning.claim_lease / 2),
                        retry_in: Duration::from_secs(1),
                    };
                    (row, outcome)
                })
                .collect(),
        };
        let outage = outcomes.iter().all(|(_, o)| matches!(o, SendOutcome::Outage { .. }));
        let recorded = record(&pool, &outcomes, &tuning).await;
        if let Err(e) = recorded {
            // The rows stay `processing` until their lease ends, then come due again: they
            // may be sent twice, which the consumers' inbox and status guards absorb.
            tracing::warn!(error = %e, "failed to record send results; the rows come due again after their lease");
        }
        if outage {
            outages += 1;
            let delay = tuning.outage_backoff.delay(outages - 1);
            if outages == 1 || outages.is_multiple_of(20) {
                tracing::warn!(outages, ?delay, "SQS is unreachable; holding every row, charging none");
            }
            pause(&cancel, delay).await;
        } else {
            if outages > 0 {
                tracing::info!(outages, "SQS answers again; draining");
            }
            outages = 0;
        }
    }
    Ok(())
}

async fn pause(cancel: &CancellationToken, delay: Duration) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

async fn connect_listener(pool: &PgPool) -> Option<PgListener> {
    let attempt = async {
        let mut listener = PgListener::connect_with(pool).await?;
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
    pool: &PgPool,
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
                            // Several inserts may have notified; one round claims them all.
                            while l.next_buffered().is_some() {}
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

/// Builds the relay from configuration.
pub async fn build(config: &RelayConfig, aws: &orderfleet::aws::Aws) -> anyhow::Result<(PgPool, Sender)> {
    let pool = orderfleet::db::connect_lazy(
        &config.database,
        orderfleet::db::PoolSize { max_connections: 4, ..Default::default() },
    )
    .context("failed to build the database pool")?;
    let sender = Sender::new(aws.sqs(), &config.queues, config.tuning.batching);
    Ok((pool, sender))
}
