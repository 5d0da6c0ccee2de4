//! The reconciliation of stray PaymentIntents: a safety net.
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
//! to settle it. An intent that is live (holding funds, waiting for its buyer's 3-D Secure, or
//! its confirm not ended) is cancelled under a key of its own (`Payments::cancel_stray`) when
//! it names an order that has moved past `pending_authorization` to another intent, or to none
//! (`stray_intents_canceled_total{found="reconciliation"}`), or when it is the own intent of an
//! order that has failed (`{found="failed_order"}`, and `failed_order_holds_released_total`):
//! nothing else would ever release that one. One Stripe refuses to cancel is logged and counted
//! (`stray_intents_cancel_refused_total`) and holds up no other. One whose cancel Stripe did
//! not answer (an outage, the budget spent) is written down as a release owed
//! (`intent_releases_owed`, `stray_intents_release_deferred_total`) and passed over, so the
//! window moves on; every pass tries the releases owed first. A cancel's key never stalls a
//! pass: one that holds a saved 5xx goes on under a fresh key (`Payments::cancel`). An order
//! still pending is left to whoever holds its lease, and the window is read again from its
//! intent's creation until the order has moved (for half an hour at most). One sweeper reads a
//! window at a time (`claimed_until`), at least a minute and at most a day of creation times at
//! a time, its progress recorded after each; a window whose list Stripe did not answer, or
//! that a stop cut short, is read again next time.
//!
//! [`SweepPolicy::strays_after`]: crate::domain::recovery::sweeper::SweepPolicy::strays_after

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::steps::releases::{owe, release};
use crate::domain::words::status::OrderStatus;
use crate::domain::words::status::StatusSet;
use orderfleet_payments::{Intent, PaymentError, Payments};
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;

/// How long one sweeper holds the reconciliation: longer than a window's pages and cancels.
const CLAIM: Duration = Duration::from_secs(600);

/// The most of Stripe's list read at once (every page of it), its progress recorded after
/// each, a stop heard between them: a deploy's first pass reads its day back in one.
const MOST_PER_PASS: chrono::TimeDelta = chrono::TimeDelta::days(1);

/// The least of Stripe's list a pass reads: however often the sweeper runs (every 2 s in
/// `make demo`), the reconciliation lists at most once a minute.
const LEAST_PER_PASS: Duration = Duration::from_secs(60);

/// How long an intent of an order still pending holds the window back (read again each pass,
/// so that it is judged once the order has moved). The sweeper settles a pending order within
/// minutes; one pending longer needs a person (`fleetctl order resolve`), and the window goes
/// on without it, so as not to read the same half hour again every pass.
const PENDING_HELD_FOR: chrono::TimeDelta = chrono::TimeDelta::minutes(30);

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// Live intents read in the window.
    pub live: u64,
    /// Strays cancelled.
    pub released: u64,
    /// Strays whose cancel Stripe refused (logged, counted, and left).
    pub refused: u64,
    /// Releases Stripe did not answer, owed for the next pass.
    pub deferred: u64,
    /// Whether Stripe failed or refused the pass, or a stop cut it short (its window is read
    /// again next time).
    pub blocked: bool,
}

/// One pass over the intents created since the last, up to `settled_after` ago, a day of
/// creation times at a time, each day's progress recorded as it is settled; `None` when
/// another sweeper holds the reconciliation, or nothing new has settled yet. It ends early at
/// `stop`, what is left to be read next time.
pub async fn reconcile(
    pool: &Pool,
    payments: &Payments,
    settled_after: Duration,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Reconciled>> {
    let Some((mut from, to)) = claim(pool, settled_after).await? else { return Ok(None) };
    let mut report = Reconciled::default();
    release_owed(pool, payments, stop, &mut report).await?;
    let outcome = loop {
        let end = to.min(from + MOST_PER_PASS);
        let reached = match release_strays(pool, payments, (from, end), stop, &mut report).await {
            Ok(reached) => reached,
            Err(e) => break Err(e),
        };
        record_progress(pool, reached, reached < to && reached == end).await?;
        // Held back (an order still pending, or a stop), or done.
        if reached < end || reached >= to || stop.is_cancelled() {
            break Ok(reached);
        }
        from = reached;
    };
    // The rest of the sweep goes on whatever happened here: a list Stripe refuses must not
    // keep the sweeper from the orders it can settle.
    match outcome {
        Ok(reached) => Ok(Some(Reconciled { blocked: reached < to, ..report })),
        Err(failure) => {
            record_progress(pool, from, false).await?;
            let why = failure.to_string();
            match failure {
                PaymentError::Unavailable(_) | PaymentError::AttemptFailed(_) | PaymentError::Locked(_) => {
                    tracing::warn!(
                        why,
                        "Stripe did not answer the reconciliation of strays; it tries again next time"
                    )
                }
                _ => tracing::error!(
                    why,
                    "Stripe refused the reconciliation of strays' list; it tries again next time"
                ),
            }
            Ok(Some(Reconciled { blocked: true, ..report }))
        }
    }
}

/// Records how far the reconciliation has settled; the claim is kept while `more` is to be
/// read in this pass, else given up.
async fn record_progress(pool: &Pool, reached: DateTime<Utc>, more: bool) -> anyhow::Result<()> {
    sqlx::query!(
        "UPDATE stripe_reconciliation
            SET reconciled_until = $1, claimed_until = CASE WHEN $2 THEN claimed_until ELSE '-infinity' END",
        reached,
        more,
    )
    .execute(pool)
    .await
    .context("failed to record the reconciliation")?;
    Ok(())
}

/// Claims the reconciliation for this sweeper: the window to read, from where the last pass
/// stopped to `settled_after` ago.
async fn claim(
    pool: &Pool,
    settled_after: Duration,
) -> anyhow::Result<Option<(DateTime<Utc>, DateTime<Utc>)>> {
    let window = sqlx::query!(
        r#"UPDATE stripe_reconciliation SET claimed_until = now() + $1 * interval '1 ms'
            WHERE claimed_until < now() AND reconciled_until < now() - $2 * interval '1 ms' - $3 * interval '1 ms'
        RETURNING reconciled_until, now() - $2 * interval '1 ms' AS "to!""#,
        CLAIM.as_millis() as i64,
        settled_after.as_millis() as i64,
        LEAST_PER_PASS.as_millis() as i64,
    )
    .fetch_optional(pool)
    .await
    .context("failed to claim the reconciliation of strays")?;
    Ok(window.map(|w| (w.reconciled_until, w.to)))
}

/// Reads the window's intents and cancels the live ones that are strays, or the own intents
/// of failed orders; how far the window is settled: its end, or the oldest intent of an order
/// still pending, or its start after a stop. A cancel Stripe did not answer is owed, not
/// waited for.
async fn release_strays(
    pool: &Pool,
    payments: &Payments,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    stop: &CancellationToken,
    report: &mut Reconciled,
) -> Result<DateTime<Utc>, PaymentError> {
    let live: Vec<(OrderId, Intent)> = payments
        .list_created(from, to)
        .await?
        .into_iter()
        .filter(|i| i.status.is_live())
        .filter_map(|i| Some((OrderId::from_uuid(i.order_id.as_deref()?.parse::<Uuid>().ok()?), i)))
        .collect();
    report.live = live.len() as u64;
    let database = |e: anyhow::Error| PaymentError::Unavailable(format!("the database: {e:#}"));
    let recorded = recorded_intents(pool, &live).await.map_err(|e| database(e.into()))?;
    let mut reached = to;
    for (order, intent) in &live {
        let found = match recorded.get(order) {
            // Another fleet's order (a shared Stripe account): not ours to judge.
            None => continue,
            // Still pending: judged once it has moved, so the window is read again from here.
            Some((OrderStatus::PendingAuthorization, _)) => {
                if let Some(created) = intent.created.filter(|c| *c > Utc::now() - PENDING_HELD_FOR) {
                    reached = reached.min(created).max(from);
                }
                continue;
            }
            // The order's own: released only once the order has failed.
            Some((status, own)) if own.as_deref() == Some(intent.id.as_str()) => {
                if status.set() != StatusSet::Failed {
                    continue;
                }
                FAILED_ORDER
            }
            Some(_) => "reconciliation",
        };
        if stop.is_cancelled() {
            return Ok(from);
        }
        // A refusal is that intent's (logged and counted by `release`): it holds up no other.
        release_or_owe(pool, payments, (*order, &intent.id), (found, found), report)
            .await
            .map_err(database)?;
    }
    Ok(reached)
}

/// What became of one release in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Cancelled (or found cancelled).
    Released,
    /// Refused by Stripe for good: logged for a person by [`release`].
    Refused,
    /// Not answered: owed to the next pass.
    Owed,
}

/// Releases `intent` of `order` ([`release`], counted under `found`), counting the outcome in
/// `report`; one Stripe did not answer is owed ([`owe`], recorded as `owed_as`, the label it
/// was first found under). A failed order's own intent released counts in
/// `failed_order_holds_released_total` too.
async fn release_or_owe(
    pool: &Pool,
    payments: &Payments,
    (order, intent): (OrderId, &str),
    (found, owed_as): (&'static str, &str),
    report: &mut Reconciled,
) -> anyhow::Result<Outcome> {
    match release(payments, order, intent, found).await {
        Ok(()) => {
            report.released += 1;
            if owed_as == FAILED_ORDER {
                metrics::counter!(crate::metrics::FAILED_ORDER_HOLDS_RELEASED.name, "found" => "reconciliation")
                    .increment(1);
            }
            Ok(Outcome::Released)
        }
        Err(e) if e.is_transient() => {
            owe(pool, order, intent, owed_as, &e).await?;
            report.deferred += 1;
            Ok(Outcome::Owed)
        }
        Err(_) => {
            report.refused += 1;
            Ok(Outcome::Refused)
        }
    }
}

/// How a failed order's own live intent is labelled where it is released.
const FAILED_ORDER: &str = "failed_order";

/// The releases owed since earlier passes, tried again before the window is read, the longest
/// untried first, each judged by its order as it is now ([`owed_now`]): a row goes once Stripe
/// cancels the intent (or finds it cancelled), or refuses for good (logged for a person by
/// `release`), or once the intent has become its order's live own hold; one Stripe still does
/// not answer, or whose order is still pending, waits for the next pass.
async fn release_owed(
    pool: &Pool,
    payments: &Payments,
    stop: &CancellationToken,
    report: &mut Reconciled,
) -> anyhow::Result<()> {
    let owed = sqlx::query!(
        r#"SELECT r.payment_intent_id, r.order_id AS "order_id: OrderId", r.found,
                  o.status AS "status?: OrderStatus", o.payment_intent_id AS "recorded?"
             FROM intent_releases_owed r LEFT JOIN orders o ON o.id = r.order_id
            ORDER BY r.last_tried_at LIMIT $1"#,
        OWED_PER_PASS,
    )
    .fetch_all(pool)
    .await
    .context("failed to read the releases owed")?;
    for row in owed {
        if stop.is_cancelled() {
            break;
        }
        let intent = row.payment_intent_id.as_str();
        let settled = match owed_now(row.status, row.recorded.as_deref(), intent, &row.found) {
            Owed::Wait => continue,
            Owed::Drop => None,
            Owed::Cancel => {
                let target = (row.order_id, intent);
                match release_or_owe(pool, payments, target, ("owed", &row.found), report).await? {
                    Outcome::Owed => continue,
                    outcome => Some(outcome),
                }
            }
        };
        tracing::debug!(payment_intent = intent, ?settled, "a release owed is settled");
        sqlx::query!("DELETE FROM intent_releases_owed WHERE payment_intent_id = $1", intent)
            .execute(pool)
            .await
            .context("failed to record a release owed as done")?;
    }
    Ok(())
}

/// What a release owed comes to now, by its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// Cancel the intent: its order has failed, moved on to another intent or none, or is gone.
    Cancel,
    /// Nothing to release: the intent has become its order's own, and the order holds it (an
    /// order the database refused, then allowed once an operator mended the rule).
    Drop,
    /// Its order is still pending: whoever holds its lease decides first.
    Wait,
}

/// A release owed `found` so was written because the database refused the order's move for
/// good ([`crate::domain::steps::refusal`]): no one will ever move the order, so whether it is pending
/// changes nothing.
const REFUSED: &str = "order_refused";

fn owed_now(status: Option<OrderStatus>, recorded: Option<&str>, intent: &str, found: &str) -> Owed {
    match status {
        None => Owed::Cancel,
        Some(status) if status.set() == StatusSet::Failed => Owed::Cancel,
        Some(_) if found == REFUSED && status.is_some_and(OrderStatus::awaits_authorization) => Owed::Cancel,
        Some(_) if recorded == Some(intent) => Owed::Drop,
        Some(OrderStatus::PendingAuthorization) => Owed::Wait,
        Some(_) => Owed::Cancel,
    }
}

/// The most releases owed one pass tries: each is a cancel or two, and the window waits.
const OWED_PER_PASS: i64 = 100;

/// For each order of `live` that exists here: its status and the intent it recorded (if any).
async fn recorded_intents(
    pool: &Pool,
    live: &[(OrderId, Intent)],
) -> sqlx::Result<HashMap<OrderId, (OrderStatus, Option<String>)>> {
    let ids: Vec<Uuid> = live.iter().map(|(order, _)| order.as_uuid()).collect();
    let rows = sqlx::query!(
        r#"SELECT id AS "id: OrderId", status AS "status: OrderStatus", payment_intent_id
             FROM orders WHERE id = ANY($1)"#,
        &ids,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|row| (row.id, (row.status, row.payment_intent_id))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_owed_is_never_made_of_the_live_own_hold_of_an_order_that_has_not_failed() {
        let pi = "pi_1";
        assert_eq!(owed_now(Some(OrderStatus::Authorized), Some(pi), pi, "reconciliation"), Owed::Drop);
        assert_eq!(owed_now(Some(OrderStatus::StockReserved), Some(pi), pi, "reconciliation"), Owed::Drop);
        assert_eq!(
            owed_now(Some(OrderStatus::PaymentDeclined), Some(pi), pi, "reconciliation"),
            Owed::Cancel
        );
        assert_eq!(owed_now(Some(OrderStatus::Authorized), Some("pi_2"), pi, "reconciliation"), Owed::Cancel);
        assert_eq!(owed_now(Some(OrderStatus::PendingAuthorization), None, pi, "reconciliation"), Owed::Wait);
        assert_eq!(owed_now(None, None, pi, "reconciliation"), Owed::Cancel);
    }

    #[test]
    fn a_release_owed_on_an_order_the_database_refused_is_made_though_it_is_pending() {
        let pi = "pi_1";
        let pending = Some(OrderStatus::PendingAuthorization);
        assert_eq!(owed_now(pending, None, pi, REFUSED), Owed::Cancel);
        assert_eq!(owed_now(Some(OrderStatus::RequiresAction), Some(pi), pi, REFUSED), Owed::Cancel);
        assert_eq!(
            owed_now(pending, None, pi, "reconciliation"),
            Owed::Wait,
            "a stray of a live lease waits"
        );
        assert_eq!(
            owed_now(Some(OrderStatus::Authorized), Some(pi), pi, REFUSED),
            Owed::Drop,
            "mended since"
        );
    }
}
