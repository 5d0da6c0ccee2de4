//! Every metric the relay exports: its sends, and the outbox gauges it reads for the alarms.

use orderfleet_runtime::metrics::Metric;

/// Outbox rows sent.
pub const OUTBOX_SENT: Metric = Metric::counter("outbox_sent_total", &[], "outbox rows sent");
/// Outbox rows given up on (`dead`, with a code and reason: `fleetctl outbox dead`).
pub const OUTBOX_DEAD: Metric = Metric::counter(
    "outbox_dead_total",
    &[],
    "outbox rows given up on (`dead`, with a code and reason: `fleetctl outbox dead`)",
);
/// The relay's claims of due outbox rows.
pub const OUTBOX_CLAIMS: Metric = Metric::counter(
    "outbox_claims_total",
    &["result"],
    "the relay's claims of due outbox rows; result: `rows`, `empty`",
);
/// Sent rows past their retention age, moved to `outbox_archive` or deleted.
pub const OUTBOX_RETIRED: Metric = Metric::counter(
    "outbox_retired_total",
    &[],
    "sent rows past their retention age, moved to `outbox_archive` or deleted",
);
/// The relay's reading of the outbox every `OUTBOX_METRICS_INTERVAL_SECONDS`: its dead rows (CloudWatch `OutboxDeadRows`).
pub const OUTBOX_DEAD_ROWS: Metric = Metric::gauge(
    "outbox_dead_rows",
    &[],
    "the relay's reading of the outbox every `OUTBOX_METRICS_INTERVAL_SECONDS`: its dead rows (CloudWatch `OutboxDeadRows`)",
);
/// The age of the outbox's oldest row not yet sent (CloudWatch `OutboxOldestPendingAgeSeconds`).
pub const OUTBOX_OLDEST_PENDING_AGE: Metric = Metric::gauge(
    "outbox_oldest_pending_age_seconds",
    &[],
    "the age of the outbox's oldest row not yet sent (CloudWatch `OutboxOldestPendingAgeSeconds`)",
);
/// Pending orders nobody holds and nothing moved for a minute (CloudWatch `OrdersPendingAuthorizationStuck`).
pub const ORDERS_PENDING_AUTHORIZATION_STUCK: Metric = Metric::gauge(
    "orders_pending_authorization_stuck",
    &[],
    "pending orders nobody holds and nothing moved for a minute (CloudWatch `OrdersPendingAuthorizationStuck`)",
);
/// Orders disputed in the last day (CloudWatch `OrdersDisputedLastDay`).
pub const ORDERS_DISPUTED_LAST_DAY: Metric = Metric::gauge(
    "orders_disputed_last_day",
    &[],
    "orders disputed in the last day (CloudWatch `OrdersDisputedLastDay`)",
);
/// The Stripe operations a 429 cut the fleet's budget on in the last five minutes, from `stripe_budget_slowdowns` (CloudWatch `StripeRateLimitedOperations`).
pub const STRIPE_RATE_LIMITED_OPERATIONS: Metric = Metric::gauge(
    "stripe_rate_limited_operations",
    &[],
    "the Stripe operations a 429 cut the fleet's budget on in the last five minutes, from `stripe_budget_slowdowns` (CloudWatch `StripeRateLimitedOperations`)",
);

/// Every metric this crate exports.
pub const ALL: &[Metric] = &[
    OUTBOX_SENT,
    OUTBOX_DEAD,
    OUTBOX_CLAIMS,
    OUTBOX_RETIRED,
    OUTBOX_DEAD_ROWS,
    OUTBOX_OLDEST_PENDING_AGE,
    ORDERS_PENDING_AUTHORIZATION_STUCK,
    ORDERS_DISPUTED_LAST_DAY,
    STRIPE_RATE_LIMITED_OPERATIONS,
];

/// Each outbox gauge's name in CloudWatch (`CLOUDWATCH_NAMESPACE`, no dimensions), where the
/// templates' alarms and dashboard read it, and its unit there.
pub const CLOUDWATCH: &[(Metric, &str, Unit)] = &[
    (OUTBOX_DEAD_ROWS, "OutboxDeadRows", Unit::Count),
    (OUTBOX_OLDEST_PENDING_AGE, "OutboxOldestPendingAgeSeconds", Unit::Seconds),
    (ORDERS_PENDING_AUTHORIZATION_STUCK, "OrdersPendingAuthorizationStuck", Unit::Count),
    (ORDERS_DISPUTED_LAST_DAY, "OrdersDisputedLastDay", Unit::Count),
    (STRIPE_RATE_LIMITED_OPERATIONS, "StripeRateLimitedOperations", Unit::Count),
];

/// A CloudWatch unit of the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A number of things.
    Count,
    /// An age.
    Seconds,
}
