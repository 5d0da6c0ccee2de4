//! The sweeper: finishes orders that stopped moving, without the client (SPEC §1.6).
//!
//! - **`pending_authorization`**, nobody working on it (its lease released or expired), older
//!   than a threshold: the intake died between authorizing and committing, or gave up on an
//!   unavailable provider and the client never retried. The sweeper takes the lease, asks
//!   Stripe what really happened — the order's PaymentIntent, found by `metadata[order_id]`,
//!   rather than an idempotency key Stripe may have pruned — and records it (`authorized`
//!   with its outbox rows, or `payment_declined`). If Stripe has no intent for the order, it
//!   authorizes with the order's own key, exactly as the intake would have.
//! - **`requires_action`** (3-D Secure), past its deadline, or not looked at for a while: the
//!   webhook that settles it never came (lost, or `STRIPE_WEBHOOK_SECRET` unset). The sweeper
//!   takes its lease and settles it from its intent read fresh ([`crate::domain::steps::three_d_secure`]):
//!   `authorized` if the buyer authenticated, released and `payment_declined` past the deadline.
//! - **`authorized`, `stock_reserved`**, or rejected with the hold not yet released, older than
//!   a threshold: their stock-check message is late, dead-lettered or lost. The sweeper runs
//!   [`Fulfilment::advance`], the worker's own step, which the status guards make safe to
//!   run beside the worker. An order it cannot settle is stamped `swept_at`, and each pass
//!   takes the orders never tried first, then those tried longest ago: a batch's worth of
//!   orders blocked for good (a Stripe incident) or stuck for a person cannot starve a newer
//!   order whose message is gone.
//!
//! The lease the sweeper takes on a pending or 3-D Secure order outlasts its work on it: the
//! work is cut off at a deadline counted from its Stripe calls, each at its longest under the
//! sweeper's retries and budget wait ([`authorization::resume_deadline`],
//! [`three_d_secure::settle_deadline`]), and the lease lasts that and a margin. A lease that ran out
//! under its holder would let a second sweeper, or the buyer's retry, work on the order beside
//! it.
//!
//! `fleetctl sweep` runs it once; `stock-worker` runs it every minute.

use std::time::Duration;

use anyhow::Context;
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::domain::steps::authorization;
use crate::domain::steps::fulfilment::{Fulfilment, Step};
use crate::domain::steps::leased::AuthorizationError;
use crate::domain::steps::three_d_secure::{self, Settled};
use orderfleet_payments::Payments;
use orderfleet_runtime::failure::Kind;

/// The least time between two of the sweeper's wakes for 3-D Secure deadlines
/// ([`Sweeper::run`]): an order is settled within about this of its deadline.
pub const DEADLINE_SLACK: Duration = Duration::from_secs(1);

/// How long after a try that did not settle it an order past its 3-D Secure deadline wakes the
/// sweeper again: Stripe away, or the order refused, is not asked about every second.
const LOOK_AGAIN: Duration = Duration::from_secs(10);

/// When an order counts as stopped, and how much one sweep takes on.
#[derive(Debug, Clone, Copy)]
pub struct SweepPolicy {
    /// A pending order this old, with no live lease, is swept: by then its buyer is unlikely
    /// to retry.
    pub pending_after: Duration,
    /// An order this long in a fulfilment status is advanced by the sweeper.
    pub fulfilment_after: Duration,
    /// Orders per kind per sweep.
    pub batch: i64,
    /// PaymentIntents made this long ago, whose orders' requests and webhooks have had time to
    /// settle them, are reconciled: a live one its order did not record is released
    /// ([`crate::domain::recovery::strays`]).
    pub strays_after: Duration,
}

impl Default for SweepPolicy {
    fn default() -> Self {
        Self {
            pending_after: Duration::from_secs(90),
            fulfilment_after: Duration::from_secs(300),
            batch: 200,
            strays_after: Duration::from_secs(600),
        }
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Pending orders whose authorization is now recorded (authorized or declined).
    pub authorizations_resolved: u64,
    /// Pending orders left pending because Stripe is unavailable.
    pub authorizations_unavailable: u64,
    /// Orders awaiting 3-D Secure that this sweep authorized or released.
    pub actions_settled: u64,
    /// Orders awaiting 3-D Secure whose buyer still has time, or that Stripe could not settle now.
    pub actions_waiting: u64,
    /// Orders advanced to a settled state.
    pub fulfilments_settled: u64,
    /// Orders that could not advance for now (a dependency is down).
    pub fulfilments_blocked: u64,
    /// Orders that cannot advance at all, with why: for a person.
    pub stuck: Vec<(OrderId, String)>,
    /// Stray PaymentIntents released ([`crate::domain::recovery::strays`]).
    pub strays_released: u64,
}

/// Finishes orders that stopped moving.
pub struct Sweeper {
    /// The database.
    pub pool: Pool,
    /// Stripe.
    pub payments: Payments,
    /// What counts as stopped.
    pub policy: SweepPolicy,
}

impl Sweeper {
    /// One sweep: every stopped order it finds, resolved or reported.
    pub async fn sweep_once(&self) -> anyhow::Result<SweepReport> {
        self.sweep_until(&CancellationToken::new()).await
    }

    /// One sweep, which ends early, after the order in hand, once `stop` fires: in a Stripe
    /// outage an order can take a minute, and a sweep a hundred of them. The orders not
    /// reached wait for the next sweep, here or in another worker.
    pub async fn sweep_until(&self, stop: &CancellationToken) -> anyhow::Result<SweepReport> {
        let mut report = SweepReport::default();
        self.sweep_pending(&mut report, stop).await?;
        self.sweep_actions(&mut report, stop).await?;
        self.sweep_fulfilment(&mut report, stop).await?;
        if !stop.is_cancelled()
            && let Some(reconciled) = crate::domain::recovery::strays::reconcile(
                &self.pool,
                &self.payments,
                self.policy.strays_after,
                stop,
            )
            .await?
        {
            report.strays_released = reconciled.released;
        }
        Ok(report)
    }

    async fn sweep_pending(&self, report: &mut SweepReport, stop: &CancellationToken) -> anyhow::Result<()> {
        let orders = sqlx::query!(
            r#"SELECT id AS "id: OrderId", traceparent FROM orders
              WHERE status = 'pending_authorization' AND updated_at < now() - $1 * interval '1 ms'
                AND (intake_lease_until IS NULL OR intake_lease_until < now())
              ORDER BY updated_at LIMIT $2"#,
            self.policy.pending_after.as_millis() as i64,
            self.policy.batch,
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to find pending orders")?;
        for order in orders.into_iter().take_while(|_| !stop.is_cancelled()) {
            let (id, traceparent) = (order.id, order.traceparent);
            let span = orderfleet_runtime::trace::order_span(id, traceparent.as_deref());
            let result = authorization::take_over_and_resume(&self.pool, &self.payments, id)
                .instrument(span.clone())
                .await;
            match result {
                Ok(None) => continue, // someone else took it meanwhile
                Ok(Some(_)) => report.authorizations_resolved += 1,
                Err(AuthorizationError::ProviderUnavailable(_)) => report.authorizations_unavailable += 1,
                Err(AuthorizationError::LookupRefused(reason)) => {
                    let reason = format!(
                        "cannot look the order up at Stripe: {reason} (its units are kept; find its \
                         PaymentIntent in Stripe's Dashboard, then fleetctl order resolve)"
                    );
                    span.in_scope(|| tracing::error!(reason, "order cannot advance; it needs a person"));
                    report.stuck.push((id, reason))
                }
                // One order the database refuses (a constraint, a trigger) is that order's, for
                // a person; it holds up no other. Its hold was released, or its release is owed,
                // as the reason says (`crate::domain::steps::refusal`).
                Err(AuthorizationError::OrderRefused(reason)) => {
                    let reason = format!("{reason} (fix the row or the rule, and the next sweep ends it)");
                    span.in_scope(|| tracing::error!(reason, "order cannot advance; it needs a person"));
                    report.stuck.push((id, reason))
                }
                // Refused outside a move (its lease, say): its hold released all the same.
                Err(AuthorizationError::Database(e)) if orderfleet_runtime::db::refused_for_good(&e) => {
                    let reason = self.untouchable(id, &e).await;
                    span.in_scope(|| tracing::error!(reason, "order cannot advance; it needs a person"));
                    report.stuck.push((id, reason))
                }
                Err(AuthorizationError::Database(e)) => {
                    return Err(e).context("failed to resume a pending order");
                }
            }
        }
        Ok(())
    }

    /// Orders in `requires_action` past their deadline, or not looked at for `pending_after`
    /// (the buyer may have authenticated, and the webhook may never come): each settled from its
    /// intent, or stamped `swept_at` and looked at again a pass later.
    async fn sweep_actions(&self, report: &mut SweepReport, stop: &CancellationToken) -> anyhow::Result<()> {
        let orders = sqlx::query!(
            r#"SELECT id AS "id: OrderId", traceparent FROM orders
              WHERE status = 'requires_action'
                AND ((action_expires_at < now()
                      AND COALESCE(swept_at, '-infinity') < now() - $3 * interval '1 ms')
                     OR COALESCE(swept_at, updated_at) < now() - $1 * interval '1 ms')
                AND (intake_lease_until IS NULL OR intake_lease_until < now())
              ORDER BY swept_at NULLS FIRST, action_expires_at LIMIT $2"#,
            self.policy.pending_after.as_millis() as i64,
            self.policy.batch,
            LOOK_AGAIN.as_millis() as i64,
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to find orders awaiting 3-D Secure")?;
        for order in orders.into_iter().take_while(|_| !stop.is_cancelled()) {
            let (id, traceparent) = (order.id, order.traceparent);
            let span = orderfleet_runtime::trace::order_span(id, traceparent.as_deref());
            let settled = three_d_secure::take_and_settle(&self.pool, &self.payments, id, None)
                .instrument(span.clone())
                .await;
            match settled {
                Ok(None) => continue, // a webhook is settling it
                Ok(Some(Settled::Waiting)) | Err(AuthorizationError::ProviderUnavailable(_)) => {
                    report.actions_waiting += 1;
                    self.stamp(id).await?;
                }
                Ok(Some(_)) => report.actions_settled += 1,
                // One order's refusal (Stripe's, or the database's for good: its hold released
                // or owed, `crate::domain::steps::refusal`) is that order's, for a person; the pass goes
                // on with the others, and looks at it again a pass later.
                Err(AuthorizationError::LookupRefused(reason) | AuthorizationError::OrderRefused(reason)) => {
                    span.in_scope(|| tracing::error!(reason, "order cannot advance; it needs a person"));
                    report.stuck.push((id, reason));
                    self.stamp(id).await?;
                }
                Err(AuthorizationError::Database(e)) if orderfleet_runtime::db::refused_for_good(&e) => {
                    let reason = self.untouchable(id, &e).await;
                    span.in_scope(|| tracing::error!(reason, "order cannot advance; it needs a person"));
                    report.stuck.push((id, reason));
                    self.stamp(id).await?;
                }
                Err(AuthorizationError::Database(e)) => return Err(e).context("failed to settle 3-D Secure"),
            }
        }
        Ok(())
    }

    async fn sweep_fulfilment(
        &self,
        report: &mut SweepReport,
        stop: &CancellationToken,
    ) -> anyhow::Result<()> {
        // A declined card ($3) never held funds: nothing to release.
        let orders = sqlx::query!(
            r#"SELECT id AS "id: OrderId", traceparent FROM orders
              WHERE updated_at < now() - $1 * interval '1 ms'
                AND ((holds_units(status) AND NOT awaiting_authorization(status))
                     OR (failed(status) AND status <> 'payment_declined' AND authorization_released_at IS NULL))
              ORDER BY swept_at NULLS FIRST, updated_at LIMIT $2"#,
            self.policy.fulfilment_after.as_millis() as i64,
            self.policy.batch,
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to find orders to advance")?
        .into_iter()
        .map(|order| (order.id, order.traceparent));
        let fulfilment = Fulfilment { pool: self.pool.clone(), payments: self.payments.clone() };
        for (id, traceparent) in orders.take_while(|_| !stop.is_cancelled()) {
            let span = orderfleet_runtime::trace::order_span(id, traceparent.as_deref());
            match fulfilment.advance(id).instrument(span.clone()).await {
                Step::Done => {
                    report.fulfilments_settled += 1;
                    continue;
                }
                Step::Failed(failure) if failure.kind == Kind::Permanent => {
                    let reason = &failure.reason;
                    span.in_scope(|| tracing::error!(reason, "order cannot advance; it needs a person"));
                    report.stuck.push((id, failure.reason))
                }
                Step::Failed(_) | Step::WaitsForTheLine(_) => report.fulfilments_blocked += 1,
            }
            // Tried and not settled: to the back of the next pass.
            self.stamp(id).await?;
        }
        Ok(())
    }

    /// An order the database refuses even its lease: its hold released by the rule of
    /// [`crate::domain::steps::refusal`]; why, for the stuck list.
    async fn untouchable(&self, id: OrderId, refusal: &sqlx::Error) -> String {
        match crate::domain::records::order::load(&self.pool, id).await {
            Ok(Some(order)) => {
                crate::domain::steps::refusal::release_untouchable(
                    &self.pool,
                    &self.payments,
                    &order,
                    refusal,
                )
                .await
            }
            Ok(None) => format!("the database refuses to touch order {id}: {refusal}"),
            Err(e) => format!("the database refuses to touch the order: {refusal}; and to read it: {e}"),
        }
    }

    /// Stamps an order tried and not settled (`swept_at`), so the next pass takes the others
    /// first. A stamp the database refuses for good (a trigger on the very row) is that order's:
    /// logged, and the pass goes on; the database unreachable ends the pass.
    async fn stamp(&self, id: OrderId) -> anyhow::Result<()> {
        let stamped = sqlx::query!("UPDATE orders SET swept_at = now() WHERE id = $1", id as _)
            .execute(&self.pool)
            .await;
        match stamped {
            Ok(_) => Ok(()),
            Err(e) if orderfleet_runtime::db::refused_for_good(&e) => {
                tracing::warn!(order_id = %id, error = %e, "the database refuses to stamp a swept order");
                Ok(())
            }
            Err(e) => Err(e).context("failed to stamp a swept order"),
        }
    }

    /// Sweeps every `every` (jittered, so replicas spread out) until `cancel` fires. Between
    /// sweeps it also wakes at the next 3-D Secure deadline ([`Sweeper::next_deadline`]) and
    /// settles the orders past theirs, so an abandoned authentication gives its units back
    /// within about [`DEADLINE_SLACK`] of its deadline, whatever `every` is (SPEC §1.1: "for at
    /// most `PAYMENT_ACTION_TIMEOUT_SECONDS`").
    pub async fn run(self, every: Duration, cancel: CancellationToken) {
        loop {
            let jitter = orderfleet_runtime::backoff::Backoff::new(every, every).delay(0);
            let next_sweep = tokio::time::Instant::now() + jitter;
            loop {
                // An order made after this read has its deadline at least the action timeout
                // from now: reading again that often sees it before its deadline.
                let read_again =
                    tokio::time::Instant::now() + self.payments.action_timeout().max(DEADLINE_SLACK);
                let wake = match self.next_deadline().await {
                    Some(deadline) => next_sweep.min(deadline).min(read_again),
                    None => next_sweep.min(read_again),
                };
                let nap = wake.saturating_duration_since(tokio::time::Instant::now());
                if !orderfleet_runtime::tasks::sleep_or_stop(&cancel, nap).await {
                    return;
                }
                if tokio::time::Instant::now() >= next_sweep {
                    break;
                }
                let mut report = SweepReport::default();
                if let Err(e) = self.sweep_actions(&mut report, &cancel).await {
                    tracing::warn!(error = format!("{e:#}"), "settling 3-D Secure past its deadline failed");
                }
                if report != SweepReport::default() {
                    tracing::info!(?report, "3-D Secure deadlines");
                }
            }
            orderfleet_runtime::failpoint::panic_at("sweeper_panics");
            match self.sweep_until(&cancel).await {
                // Each stuck order was logged in its own span, with its trace.
                Ok(report) if report != SweepReport::default() => tracing::info!(?report, "sweep"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = format!("{e:#}"), "sweep failed; trying again next time"),
            }
        }
    }

    /// When the next 3-D Secure order nobody is settling passes its deadline, as this process's
    /// clock reads it: ONE statement (an index scan of the orders awaiting authorization), read
    /// again after every wake. `None` when there is none, or the database does not answer (the
    /// next sweep tries again). One already past, whose settle did not end it (Stripe away, a
    /// refusal), is looked at again [`LOOK_AGAIN`] after it was tried.
    async fn next_deadline(&self) -> Option<tokio::time::Instant> {
        let next = sqlx::query_scalar!(
            r#"SELECT min(GREATEST(action_expires_at, COALESCE(swept_at, '-infinity') + $1 * interval '1 ms'))
                 FROM orders
                WHERE status = 'requires_action' AND action_expires_at IS NOT NULL
                  AND (intake_lease_until IS NULL OR intake_lease_until < now())"#,
            LOOK_AGAIN.as_millis() as i64,
        )
        .fetch_one(&self.pool)
        .await;
        let next = match next {
            Ok(next) => next?,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the next 3-D Secure deadline");
                return None;
            }
        };
        let from_now = (next - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
        Some(tokio::time::Instant::now() + from_now.max(DEADLINE_SLACK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::records::order::lease_for;
    use orderfleet_payments::RetryPolicy;
    use orderfleet_payments::StripeConfig;
    use orderfleet_runtime::config::Env;

    #[tokio::test]
    async fn the_sweeper_s_lease_outlasts_its_longest_work_on_an_order() {
        // Arrange: the sweeper's Stripe client, and one call at its longest under its policy,
        // worked out here from the policy's parts: every attempt waits its whole budget wait
        // and its whole timeout, every pause its backoff's ceiling.
        let retry = RetryPolicy::background();
        let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_sweeper")]);
        let payments = Payments::new(
            &StripeConfig::from_env(&env).unwrap(),
            retry,
            orderfleet_runtime::db::unreachable_pool(),
        )
        .unwrap();
        let pauses: Duration = (0..retry.attempts - 1).map(|n| retry.backoff.ceiling(n)).sum();
        let call = (retry.budget_wait + retry.timeout) * retry.attempts + pauses;

        // Act
        let resume = lease_for(authorization::resume_deadline(&payments));
        let settle = lease_for(three_d_secure::settle_deadline(&payments));

        // Assert: resuming a pending order makes seven calls at most (the read of its card under
        // a cap per card, the lookup, the authorization, and a stray's cancel, the read after it
        // failed, the cancel under a fresh key and the read after that); settling 3-D Secure
        // eight (the read, the read of another card the buyer confirmed with, the order's
        // cancel with the same three after it, and a refused end's cancel and read).
        assert!(resume >= call * 7, "a lease of {resume:?} for work of up to {:?}", call * 7);
        assert!(settle >= call * 8, "a lease of {settle:?} for work of up to {:?}", call * 8);
        assert_eq!((resume, settle), (Duration::from_millis(1_374_200), Duration::from_millis(1_569_800)));
    }
}
