//! The outbox rows as the relay sees them: claimed a batch at a time under a lease, and each
//! recorded as sent, to be retried after its backoff, or dead with its code and reason.

use std::time::Duration;

use orderfleet::domain::records::outbox::{Destination, EventType};
use orderfleet_runtime::db::Pool;
use orderfleet_runtime::failure::{Failure, Kind, Outcome};
use orderfleet_words::OrderId;
use uuid::Uuid;

use crate::config::RelayTuning;
use crate::send;

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
    sqlx::query_file!(
        "src/failed.sql",
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
        metrics::counter!(crate::metrics::OUTBOX_SENT.name).increment(sent.len() as u64);
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
        orderfleet_runtime::trace::follow(&span, self.traceparent.as_deref());
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
            Kind::Outage => ("pending", row.retry_count, failure.retry_in().unwrap_or(send::OUTAGE_RETRY)),
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
            metrics::counter!(crate::metrics::OUTBOX_DEAD.name).increment(1);
        }
        Self { status, retry_count, delay, failure }
    }
}

/// When the next row comes due, if any is waiting.
pub(crate) async fn next_due(pool: &Pool) -> sqlx::Result<Option<chrono::DateTime<chrono::Utc>>> {
    sqlx::query_scalar!(
        "SELECT min(next_attempt_at) FROM outbox WHERE status IN ('pending', 'processing', 'failed')",
    )
    .fetch_one(pool)
    .await
}
