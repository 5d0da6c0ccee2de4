//! `fleetctl outbox …`: the rows the relay gave up on, for a person to look at and retry.

use anyhow::Context;
use chrono::{DateTime, Utc};
use orderfleet::domain::records::outbox::{Destination, EventType};
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;
use uuid::Uuid;

/// A dead outbox row, as `fleetctl outbox dead` lists it.
#[derive(Debug)]
pub struct DeadRow {
    pub id: Uuid,
    pub event_type: EventType,
    pub destination: Destination,
    /// The order it is about.
    pub aggregate_id: OrderId,
    pub retry_count: i32,
    pub last_error_code: Option<String>,
    pub last_error_reason: Option<String>,
    pub updated_at: DateTime<Utc>,
}

pub async fn dead(pool: &Pool) -> anyhow::Result<Vec<DeadRow>> {
    sqlx::query_as!(
        DeadRow,
        r#"SELECT id, event_type AS "event_type: EventType", destination AS "destination: Destination",
                  aggregate_id AS "aggregate_id: OrderId", retry_count, last_error_code, last_error_reason, updated_at
             FROM outbox WHERE status = 'dead' ORDER BY updated_at"#,
    )
    .fetch_all(pool)
    .await
    .context("failed to list dead outbox rows")
}

/// Puts dead rows back to `pending` with a fresh retry budget (their last error stays, for the
/// record) and wakes the relay. `None` retries every dead row.
pub async fn retry(pool: &Pool, id: Option<Uuid>) -> anyhow::Result<u64> {
    let mut tx = pool.begin().await?;
    let retried = sqlx::query!(
        "UPDATE outbox SET status = 'pending', retry_count = 0, next_attempt_at = now(), updated_at = now()
          WHERE status = 'dead' AND ($1::uuid IS NULL OR id = $1)",
        id,
    )
    .execute(&mut *tx)
    .await
    .context("failed to re-queue dead rows")?
    .rows_affected();
    sqlx::query!("SELECT pg_notify('outbox_inserted', '') AS woken").fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(retried)
}
