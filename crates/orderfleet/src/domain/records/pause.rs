//! The operator's stop of one product's sale, at once, with the fleet running (SPEC §1.8;
//! `fleetctl product pause|resume`). A pause sets the product's `paused_at` under the product
//! row's lock, so every door statement after it commits sees it
//! (the door reads the row it promises from, and the shared reads of a herd begin after each
//! request arrives): once the command returns, no intake promises a unit or takes a queue
//! entry (`409 sale_paused`), the queue is not served, and an opening that falls due waits.
//! Orders that hold units go on. Each takes the product row's lock first and reads the row as it
//! is, so pauses and resumes run one at a time and `product_pauses` keeps one running pause at
//! most. The resume clears it; its trigger (`products_resumed`) serves
//! the queue with the units that came back meanwhile, and the openers are woken, so an opening
//! that fell due opens now. Each pause is recorded with its times (`product_pauses`).

use anyhow::Context;
use chrono::{DateTime, Utc};
use orderfleet_runtime::db::Pool;
use orderfleet_words::Sku;

use super::product::OPENINGS_CHANNEL;

/// What a pause or a resume found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switched {
    /// Paused now.
    Paused(DateTime<Utc>),
    /// Paused already, since then: nothing changed.
    AlreadyPaused(DateTime<Utc>),
    /// Resumed now, after a pause that began then.
    Resumed(DateTime<Utc>),
    /// Not paused: nothing changed.
    NotPaused,
}

/// Pauses the product's sale; `None`: no such product. ONE short transaction: the product row
/// locked first and read as it is (a concurrent pause or resume committed before, or waits), then
/// `paused_at` set and the pause recorded, at the moment it is made.
pub async fn pause(pool: &Pool, id: &Sku) -> anyhow::Result<Option<Switched>> {
    let mut tx = orderfleet_runtime::db::begin(pool).await.context("failed to begin the pause")?;
    let Some(was) = locked(&mut tx, id).await? else { return Ok(None) };
    if let Some(since) = was {
        return Ok(Some(Switched::AlreadyPaused(since)));
    }
    let at = sqlx::query_scalar!(
        r#"WITH paused AS (
               UPDATE products SET paused_at = clock_timestamp(), updated_at = now()
                WHERE id = $1 RETURNING id, paused_at
           )
           INSERT INTO product_pauses (product_id, paused_at)
           SELECT id, paused_at FROM paused RETURNING paused_at"#,
        id.as_str()
    )
    .fetch_one(&mut *tx)
    .await
    .with_context(|| format!("failed to pause product {}", id.as_str()))?;
    tx.commit().await.context("failed to commit the pause")?;
    Ok(Some(Switched::Paused(at)))
}

/// Resumes the product's sale; `None`: no such product. ONE short transaction, the product row
/// locked first: `paused_at` cleared (the trigger `products_resumed` serves the queue), the
/// running pause ended, and the openers woken, so an opening that fell due meanwhile happens
/// now.
pub async fn resume(pool: &Pool, id: &Sku) -> anyhow::Result<Option<Switched>> {
    let mut tx = orderfleet_runtime::db::begin(pool).await.context("failed to begin the resume")?;
    let Some(was) = locked(&mut tx, id).await? else { return Ok(None) };
    let Some(since) = was else { return Ok(Some(Switched::NotPaused)) };
    sqlx::query!("UPDATE products SET paused_at = NULL, updated_at = now() WHERE id = $1", id.as_str())
        .execute(&mut *tx)
        .await
        .with_context(|| format!("failed to resume product {}", id.as_str()))?;
    sqlx::query!(
        "UPDATE product_pauses SET resumed_at = clock_timestamp() WHERE product_id = $1 AND resumed_at IS NULL",
        id.as_str()
    )
    .execute(&mut *tx)
    .await
    .context("failed to record the resume")?;
    sqlx::query!("SELECT pg_notify($1, $2)", OPENINGS_CHANNEL, id.as_str())
        .execute(&mut *tx)
        .await
        .context("failed to tell the openers")?;
    tx.commit().await.context("failed to commit the resume")?;
    Ok(Some(Switched::Resumed(since)))
}

/// The product row, locked: `None` when there is no such product, else when its running pause
/// began (`None`: not paused).
async fn locked(tx: &mut sqlx::PgConnection, id: &Sku) -> anyhow::Result<Option<Option<DateTime<Utc>>>> {
    let row = sqlx::query_scalar!("SELECT paused_at FROM products WHERE id = $1 FOR UPDATE", id.as_str())
        .fetch_optional(tx)
        .await
        .with_context(|| format!("failed to lock product {}", id.as_str()))?;
    Ok(row)
}
