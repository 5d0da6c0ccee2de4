//! The reconciliation of stray PaymentIntents (issue 35, point 6): a safety net.
//!
//! A stray is a PaymentIntent made for an order that the order did not record: a second
//! holder's, made under another attempt's key while the first still worked, or one whose
//! answer was lost on the way. It can hold funds on the buyer's card that nothing will ever
//! capture. Three things release strays as they appear: a commit that finds its order moved
//! on cancels its own intent (`authorization::record`), the webhook of a stray's hold cancels
//! it (`webhook::apply`), and a resumed authorization finds the order's intent through Stripe's
//! list rather than making another. This pass catches what they miss (a cancel Stripe did not
//! answer, webhooks off, a way no one foresaw).
//!
//! Stripe's list is read by creation time, a window at a time, from where the last pass
//! stopped (`stripe_reconciliation.reconciled_until`) to [`SweepPolicy::strays_after`] ago, so
//! that every intent is read once, after the requests and webhooks of its order have had time
//! to settle it. An intent that is live (holding funds, or waiting for its buyer's 3-D Secure)
//! and names an order that has moved past `pending_authorization` to another intent, or to
//! none, is cancelled under a key of its own (`Payments::cancel_stray`) and counted in
//! `stray_intents_canceled_total{found="reconciliation"}`. An order still pending is left to
//! whoever holds its lease. One sweeper reads a window at a time (`claimed_until`); a window
//! whose cancels Stripe did not all answer is read again next time.
//!
//! [`SweepPolicy::strays_after`]: crate::domain::sweeper::SweepPolicy::strays_after

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use uuid::Uuid;

use crate::domain::OrderId;
use crate::domain::order::OrderStatus;
use crate::domain::payments::{Intent, IntentStatus, PaymentError, Payments};
use crate::runtime::db::Pool;

/// How long one sweeper holds the reconciliation: longer than a window's pages and cancels.
const CLAIM: Duration = Duration::from_secs(600);

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// Live intents read in the window.
    pub live: u64,
    /// Strays cancelled.
    pub released: u64,
    /// Whether Stripe failed or refused the pass (its window is read again next time).
    pub blocked: bool,
}

/// One pass over the intents created since the last, up to `settled_after` ago; `None` when
/// another sweeper holds the reconciliation, or nothing new has settled yet.
pub async fn reconcile(
    pool: &Pool,
    payments: &Payments,
    settled_after: Duration,
) -> anyhow::Result<Option<Reconciled>> {
    let Some((from, to)) = claim(pool, settled_after).await? else { return Ok(None) };
    let mut report = Reconciled::default();
    let outcome = release_strays(pool, payments, from, to, &mut report).await;
    // Advanced only past a window read and settled in full; released either way.
    let reached = match &outcome {
        Ok(()) => to,
        Err(_) => from,
    };
    sqlx::query!(
        "UPDATE stripe_reconciliation SET reconciled_until = $1, claimed_until = '-infinity'",
        reached
    )
    .execute(pool)
    .await
    .context("failed to record the reconciliation")?;
    match outcome {
        Ok(()) => Ok(Some(report)),
        Err(PaymentError::Unavailable(why) | PaymentError::AttemptFailed(why)) => {
            tracing::warn!(
                why,
                "Stripe did not answer the reconciliation of strays; it tries again next time"
            );
            Ok(Some(Reconciled { blocked: true, ..report }))
        }
        // The rest of the sweep goes on: a list Stripe refuses must not keep the sweeper from
        // the orders it can settle.
        Err(refused) => {
            let why = refused.to_string();
            tracing::error!(
                why,
                "Stripe refused the reconciliation of strays' list; it tries again next time"
            );
            Ok(Some(Reconciled { blocked: true, ..report }))
        }
    }
}

/// Claims the reconciliation for this sweeper: the window to read, from where the last pass
/// stopped to `settled_after` ago.
async fn claim(
    pool: &Pool,
    settled_after: Duration,
) -> anyhow::Result<Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>> {
    let window = sqlx::query!(
        r#"UPDATE stripe_reconciliation SET claimed_until = now() + $1 * interval '1 ms'
            WHERE claimed_until < now() AND reconciled_until < now() - $2 * interval '1 ms'
        RETURNING reconciled_until, now() - $2 * interval '1 ms' AS "to!""#,
        CLAIM.as_millis() as i64,
        settled_after.as_millis() as i64,
    )
    .fetch_optional(pool)
    .await
    .context("failed to claim the reconciliation of strays")?;
    Ok(window.map(|w| (w.reconciled_until, w.to)))
}

/// Reads the window's intents and cancels the live ones that are strays.
async fn release_strays(
    pool: &Pool,
    payments: &Payments,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
    report: &mut Reconciled,
) -> Result<(), PaymentError> {
    let live: Vec<(OrderId, Intent)> = payments
        .list_created(from, to)
        .await?
        .into_iter()
        .filter(|i| matches!(i.status, IntentStatus::RequiresCapture | IntentStatus::RequiresAction))
        .filter_map(|i| Some((OrderId::from_uuid(i.order_id.as_deref()?.parse::<Uuid>().ok()?), i)))
        .collect();
    report.live = live.len() as u64;
    let recorded = match recorded_intents(pool, &live).await {
        Ok(recorded) => recorded,
        Err(e) => return Err(PaymentError::Unavailable(format!("the database: {e:#}"))),
    };
    for (order, intent) in &live {
        // Another fleet's order (a shared Stripe account), or still pending: not ours to judge.
        let Some(Some(recorded)) = recorded.get(order) else { continue };
        if recorded.as_deref() == Some(intent.id.as_str()) {
            continue;
        }
        payments.cancel_stray(*order, &intent.id).await?;
        report.released += 1;
        metrics::counter!("stray_intents_canceled_total", "found" => "reconciliation").increment(1);
        tracing::warn!(order_id = %order, payment_intent = intent.id, "released a stray PaymentIntent");
    }
    Ok(())
}

/// For each order of `live` that exists here: `None` while it is still pending, else the
/// intent it recorded (if any).
async fn recorded_intents(
    pool: &Pool,
    live: &[(OrderId, Intent)],
) -> sqlx::Result<HashMap<OrderId, Option<Option<String>>>> {
    let ids: Vec<Uuid> = live.iter().map(|(order, _)| order.as_uuid()).collect();
    let rows = sqlx::query!(
        r#"SELECT id AS "id: OrderId", status AS "status: OrderStatus", payment_intent_id
             FROM orders WHERE id = ANY($1)"#,
        &ids,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let moved = row.status != OrderStatus::PendingAuthorization;
            (row.id, moved.then_some(row.payment_intent_id))
        })
        .collect())
}
