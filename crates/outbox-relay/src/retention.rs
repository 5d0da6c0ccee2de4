//! The retention job: sent rows are kept for a while (to answer "was it sent?"), then moved to
//! `outbox_archive` or deleted, in small batches so the job never holds long locks.

use std::time::Duration;

use orderfleet_runtime::db::Pool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetentionMode {
    Archive,
    Delete,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct RetentionPolicy {
    /// Sent rows older than this go.
    pub age: Duration,
    pub mode: RetentionMode,
    /// Rows per statement.
    pub batch: i64,
    /// How often the job runs.
    pub every: Duration,
}

/// One batch; returns how many rows it moved (or deleted).
pub(crate) async fn sweep_batch(pool: &Pool, policy: &RetentionPolicy) -> sqlx::Result<u64> {
    let age_ms = policy.age.as_millis() as i64;
    let done = match policy.mode {
        RetentionMode::Archive => {
            sqlx::query!(
                "WITH old AS (
                     DELETE FROM outbox WHERE id IN (
                         SELECT id FROM outbox
                          WHERE status = 'sent' AND sent_at < now() - $1::int8 * interval '1 ms'
                          ORDER BY sent_at LIMIT $2 FOR UPDATE SKIP LOCKED)
                     RETURNING *)
                 INSERT INTO outbox_archive (id, aggregate_type, aggregate_id, event_type, destination, payload,
                                             status, retry_count, last_error_code, last_error_reason, created_at, sent_at,
                                             traceparent)
                 SELECT id, aggregate_type, aggregate_id, event_type, destination, payload,
                        status, retry_count, last_error_code, last_error_reason, created_at, sent_at,
                        traceparent FROM old
                 ON CONFLICT (id) DO NOTHING",
                age_ms,
                policy.batch,
            )
            .execute(pool)
            .await?
        }
        RetentionMode::Delete => {
            sqlx::query!(
                "DELETE FROM outbox WHERE id IN (
                     SELECT id FROM outbox
                      WHERE status = 'sent' AND sent_at < now() - $1::int8 * interval '1 ms'
                      ORDER BY sent_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
                age_ms,
                policy.batch,
            )
            .execute(pool)
            .await?
        }
    };
    Ok(done.rows_affected())
}

/// The consumers' records outlive any redelivery they guard against: an inbox id matters
/// while a copy of its message can still arrive — the 14 days a DLQ keeps a message, then a
/// redrive — and a recorded failure explains a dead letter for as long as that stays too. A
/// Stripe event's id is kept as long (Stripe retries an event for three days).
pub(crate) const CONSUMER_RECORDS_KEPT: Duration = Duration::from_secs(15 * 24 * 3600);

/// Deletes consumer records older than `CONSUMER_RECORDS_KEPT`, a batch of each kind in one
/// statement: inbox ids processed that long ago, inbox claims taken that long ago and never
/// processed (a worker stopped or crashed before publishing; any copy of the message has left
/// even its DLQ since), and recorded failures.
pub async fn sweep_consumer_records(pool: &Pool, batch: i64) -> sqlx::Result<u64> {
    let age_ms = CONSUMER_RECORDS_KEPT.as_millis() as i64;
    let deleted = sqlx::query_scalar!(
        r#"WITH processed AS (
             -- Processed long ago.
             DELETE FROM inbox WHERE (consumer, message_id) IN (
                 SELECT consumer, message_id FROM inbox
                  WHERE processed_at < now() - $1::int8 * interval '1 ms' LIMIT $2)
             RETURNING 1
         ), abandoned AS (
             -- Claimed long ago and never processed.
             DELETE FROM inbox WHERE (consumer, message_id) IN (
                 SELECT consumer, message_id FROM inbox
                  WHERE processed_at IS NULL AND claimed_until < now() - $1::int8 * interval '1 ms' LIMIT $2)
             RETURNING 1
         ), failures AS (
             -- Failures recorded long ago.
             DELETE FROM message_failures WHERE (queue, message_key) IN (
                 SELECT queue, message_key FROM message_failures
                  WHERE updated_at < now() - $1::int8 * interval '1 ms' LIMIT $2)
             RETURNING 1
         ), webhooks AS (
             -- Stripe's events applied long ago: Stripe retries one for three days at most.
             DELETE FROM webhook_events WHERE id IN (
                 SELECT id FROM webhook_events
                  WHERE received_at < now() - $1::int8 * interval '1 ms' LIMIT $2)
             RETURNING 1
         )
         SELECT (SELECT count(*) FROM processed) + (SELECT count(*) FROM abandoned)
                + (SELECT count(*) FROM failures) + (SELECT count(*) FROM webhooks) AS "deleted!""#,
        age_ms,
        batch,
    )
    .fetch_one(pool)
    .await?;
    Ok(deleted as u64)
}

/// Runs every `policy.every` until `cancel` fires, batch after batch until none is full.
pub(crate) async fn run(pool: Pool, policy: RetentionPolicy, cancel: CancellationToken) {
    loop {
        orderfleet_runtime::failpoint::panic_at("retention_panics");
        loop {
            match sweep_batch(&pool, &policy).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(rows = n, mode = ?policy.mode, "outbox retention");
                        metrics::counter!(crate::metrics::OUTBOX_RETIRED.name).increment(n);
                    }
                    if (n as i64) < policy.batch || cancel.is_cancelled() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox retention failed; trying again later");
                    break;
                }
            }
        }
        while let Ok(n) = sweep_consumer_records(&pool, policy.batch).await {
            if (n as i64) < policy.batch || cancel.is_cancelled() {
                break;
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(policy.every) => {}
        }
    }
}
