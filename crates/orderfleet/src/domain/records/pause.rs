//! The operator's stop of one product's sale, at once, with the fleet running (SPEC §1.8;
//! `fleetctl product pause|resume`). A pause is ONE statement: it sets the product's
//! `paused_at` under the product row's lock, so every door statement after it commits sees it
//! (the door reads the row it promises from, and the shared reads of a herd begin after each
//! request arrives): once the command returns, no intake promises a unit or takes a queue
//! entry (`409 sale_paused`), the queue is not served, and an opening that falls due waits.
//! Orders that hold units go on. The resume clears it; its trigger (`products_resumed`) serves
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

/// Pauses the product's sale; `None`: no such product.
pub async fn pause(pool: &Pool, id: &Sku) -> anyhow::Result<Option<Switched>> {
    let row = sqlx::query!(
        r#"WITH paused AS (
               UPDATE products SET paused_at = now(), updated_at = now()
                WHERE id = $1 AND paused_at IS NULL
            RETURNING id, paused_at
           ), recorded AS (
               INSERT INTO product_pauses (product_id, paused_at)
               SELECT id, paused_at FROM paused
           )
           SELECT (SELECT paused_at FROM paused) AS now_paused, p.paused_at AS was_paused
             FROM products p WHERE p.id = $1"#,
        id.as_str()
    )
    .fetch_optional(pool)
    .await
    .with_context(|| format!("failed to pause product {}", id.as_str()))?;
    Ok(row.map(|row| match (row.now_paused, row.was_paused) {
        (Some(at), _) => Switched::Paused(at),
        (None, Some(since)) => Switched::AlreadyPaused(since),
        // Paused and resumed by someone else between the update and the read: as it was.
        (None, None) => Switched::NotPaused,
    }))
}

/// Resumes the product's sale: the queue served and the openers woken in the same
/// transaction; `None`: no such product.
pub async fn resume(pool: &Pool, id: &Sku) -> anyhow::Result<Option<Switched>> {
    let mut tx = orderfleet_runtime::db::begin(pool).await.context("failed to begin the resume")?;
    let row = sqlx::query!(
        r#"WITH resumed AS (
               UPDATE products SET paused_at = NULL, updated_at = now()
                WHERE id = $1 AND paused_at IS NOT NULL
            RETURNING id
           ), recorded AS (
               UPDATE product_pauses SET resumed_at = now()
                WHERE product_id = $1 AND resumed_at IS NULL AND EXISTS (SELECT 1 FROM resumed)
            RETURNING paused_at
           )
           SELECT EXISTS (SELECT 1 FROM resumed) AS "resumed!",
                  COALESCE((SELECT paused_at FROM recorded), p.paused_at) AS since
             FROM products p WHERE p.id = $1"#,
        id.as_str()
    )
    .fetch_optional(&mut *tx)
    .await
    .with_context(|| format!("failed to resume product {}", id.as_str()))?;
    let Some(row) = row else { return Ok(None) };
    if row.resumed {
        sqlx::query!("SELECT pg_notify($1, $2)", OPENINGS_CHANNEL, id.as_str())
            .execute(&mut *tx)
            .await
            .context("failed to tell the openers")?;
    }
    tx.commit().await.context("failed to commit the resume")?;
    Ok(Some(match (row.resumed, row.since) {
        (true, Some(since)) => Switched::Resumed(since),
        (true, None) => Switched::Resumed(Utc::now()),
        (false, _) => Switched::NotPaused,
    }))
}
