//! What the outbox's alarms need: its state, which only PostgreSQL knows, as metrics.
//!
//! Every interval (`OUTBOX_METRICS_INTERVAL_SECONDS`, 30) the relay reads five gauges in one
//! short statement — rows `dead` (a person must look: `fleetctl outbox dead`), the age of the
//! oldest row not yet sent (the relay or SQS is behind or down), and the orders stuck in
//! `pending_authorization` (no live lease, unmoved for `STUCK_AFTER`: an intake died
//! mid-authorization, or Stripe failed and the buyer never came back; the sweeper should
//! resolve them within minutes; or in `requires_action` past their 3-D Secure deadline), and
//! the orders disputed in the last day (a cardholder asked their bank for the money back: a
//! person must answer in Stripe's Dashboard within days), and the Stripe operations a 429
//! from Stripe cut the fleet's budget on in the last five minutes (the account's limit is
//! lower than the fleet's settings say, or another system shares it) — and serves them on
//! `/metrics` ([`crate::metrics`]). When `CLOUDWATCH_NAMESPACE` is set, it also puts them to
//! CloudWatch, under the names [`crate::metrics::CLOUDWATCH`] gives, with no dimensions, in
//! one PutMetricData call, where the templates' alarms and dashboard read them.
//! PutMetricData rather than an embedded-metric-format log line: it needs no agent on EC2
//! and no log driver support on ECS, and the same code runs against LocalStack.
//!
//! Every relay replica publishes the same values; the alarms take the maximum. A failed read
//! or put is logged (once per failure streak) and tried again next interval: the gauges must
//! never stop the relay.

use std::time::Duration;

use aws_sdk_cloudwatch::types::{MetricDatum, StandardUnit};
use orderfleet_runtime::db::Pool;
use orderfleet_runtime::metrics::Metric;
use tokio_util::sync::CancellationToken;

/// Where and how often the gauges go.
#[derive(Debug, Clone)]
pub(crate) struct GaugeConfig {
    /// The CloudWatch namespace; `None`: served on `/metrics` only.
    pub namespace: Option<String>,
    pub every: Duration,
}

/// How long an order may sit in `pending_authorization` with no live lease (the query asks
/// that its lease, 65 s for a request, has lapsed) before it counts as stuck: a minute, so a
/// buyer's prompt retry never counts. Its
/// age is from its creation: a sweep or a retry that takes its lease and gives it back
/// refreshes `updated_at`, and must not hide an order stuck for good.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(60);

/// The outbox's state at one moment, and the orders stuck before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OutboxGauges {
    pub dead_rows: i64,
    /// Seconds since the oldest row still to be sent was written; 0 when none is waiting.
    pub oldest_pending_age_seconds: f64,
    /// Orders in `pending_authorization`, older than [`STUCK_AFTER`], that nobody holds, and
    /// orders in `requires_action` [`STUCK_AFTER`] past their deadline (the sweeper settles
    /// those within a minute of it).
    pub stuck_pending_orders: i64,
    /// Orders whose payment a cardholder disputed in the last day (`charge.dispute.created`).
    pub disputed_last_day: i64,
    /// Stripe operations whose fleet-wide limit a 429 cut in the last five minutes
    /// (`stripe_budget_slowdowns`).
    pub stripe_rate_limited_operations: i64,
}

/// Reads the gauges in one statement: the dead rows through their partial index, the oldest
/// unsent row through the claim's (`outbox_due`), which holds only unfinished rows: a few
/// normally, the whole backlog during an SQS outage, read once an interval; the stuck orders
/// through the sweeper's index of unfinished orders by age.
pub(crate) async fn read(pool: &Pool) -> sqlx::Result<OutboxGauges> {
    let gauges = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM outbox WHERE status = 'dead') AS "dead_rows!",
                COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float8
                            FROM outbox WHERE status IN ('pending', 'processing', 'failed')), 0) AS "oldest!",
                (SELECT count(*) FROM orders
                  WHERE ((status = 'pending_authorization'
                          AND GREATEST(created_at, promoted_at) < now() - $1 * interval '1 ms')
                         OR (status = 'requires_action' AND action_expires_at < now() - $1 * interval '1 ms'))
                    AND (intake_lease_until IS NULL OR intake_lease_until < now())) AS "stuck!",
                (SELECT count(*) FROM orders WHERE disputed_at > now() - interval '1 day') AS "disputed!",
                (SELECT count(*) FROM stripe_budget_slowdowns
                  WHERE cut_at > now() - interval '5 minutes') AS "rate_limited!""#,
        STUCK_AFTER.as_millis() as i64,
    )
    .fetch_one(pool)
    .await?;
    let (dead_rows, oldest_pending_age_seconds, stuck_pending_orders) =
        (gauges.dead_rows, gauges.oldest, gauges.stuck);
    Ok(OutboxGauges {
        dead_rows,
        oldest_pending_age_seconds: oldest_pending_age_seconds.max(0.0),
        stuck_pending_orders,
        disputed_last_day: gauges.disputed,
        stripe_rate_limited_operations: gauges.rate_limited,
    })
}

impl OutboxGauges {
    /// Each gauge with its metric.
    fn readings(&self) -> [(Metric, f64); 5] {
        use crate::metrics::*;
        [
            (OUTBOX_DEAD_ROWS, self.dead_rows as f64),
            (OUTBOX_OLDEST_PENDING_AGE, self.oldest_pending_age_seconds),
            (ORDERS_PENDING_AUTHORIZATION_STUCK, self.stuck_pending_orders as f64),
            (ORDERS_DISPUTED_LAST_DAY, self.disputed_last_day as f64),
            (STRIPE_RATE_LIMITED_OPERATIONS, self.stripe_rate_limited_operations as f64),
        ]
    }
}

/// Reads and publishes the gauges every interval until the stop signal.
pub(crate) async fn run(
    pool: Pool,
    cloudwatch: aws_sdk_cloudwatch::Client,
    config: GaugeConfig,
    cancel: CancellationToken,
) {
    let mut every = tokio::time::interval(config.every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    while tokio::select! { _ = every.tick() => true, () = cancel.cancelled() => false } {
        orderfleet_runtime::failpoint::panic_at("gauges_panics");
        match publish(&pool, &cloudwatch, config.namespace.as_deref()).await {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = format!("{e:#}"), "cannot publish the outbox gauges; trying again");
            }
            Err(_) => {}
        }
    }
}

async fn publish(
    pool: &Pool,
    cloudwatch: &aws_sdk_cloudwatch::Client,
    namespace: Option<&str>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let gauges = read(pool).await.context("failed to read the outbox gauges")?;
    let readings = gauges.readings();
    for (metric, value) in readings {
        metrics::gauge!(metric.name).set(value);
    }
    let Some(namespace) = namespace else { return Ok(()) };
    let mut put = cloudwatch.put_metric_data().namespace(namespace);
    for (metric, name, unit) in crate::metrics::CLOUDWATCH {
        let Some((_, value)) = readings.iter().find(|(m, _)| m.name == metric.name) else { continue };
        let unit = match unit {
            crate::metrics::Unit::Count => StandardUnit::Count,
            crate::metrics::Unit::Seconds => StandardUnit::Seconds,
        };
        put = put.metric_data(MetricDatum::builder().metric_name(*name).value(*value).unit(unit).build());
    }
    put.send().await.map_err(|e| {
        anyhow::anyhow!("PutMetricData failed: {}", aws_sdk_cloudwatch::error::DisplayErrorContext(&e))
    })?;
    Ok(())
}
