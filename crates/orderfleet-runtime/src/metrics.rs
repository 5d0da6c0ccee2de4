//! Every metric this crate exports (below), and a metric as each crate declares it: its name, kind, labels and help text, written once in the
//! crate's `src/metrics.rs`, which lists every metric the crate exports. Code records one by
//! its declaration (`metrics::counter!(STRIPE_REQUESTS.name, …)`), a binary's [`Service`]
//! names the lists it exports, and [`crate::ops::describe`] gives `/metrics` their help text.
//! `docs/operations.md`'s table of metrics is written from these files
//! (`scripts/check-metrics.py --write`), and `make test` checks that it is.
//!
//! [`Service`]: crate::service::Service

/// How a metric's value moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only ever goes up (`_total`).
    Counter,
    /// Set to a reading.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

/// One metric a crate exports.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name on `/metrics`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// The labels it is recorded with, in the order the help text explains them.
    pub labels: &'static [&'static str],
    /// What it counts, for an operator: `# HELP` on `/metrics` and the docs' table.
    pub help: &'static str,
}

impl Metric {
    /// A counter.
    pub const fn counter(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Self {
        Self { name, kind: Kind::Counter, labels, help }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Self {
        Self { name, kind: Kind::Gauge, labels, help }
    }

    /// A histogram.
    pub const fn histogram(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Self {
        Self { name, kind: Kind::Histogram, labels, help }
    }
}

/// AWS requests, by service and operation (`Publish`, `SendMessageBatch`, …).
pub const AWS_REQUESTS: Metric =
    Metric::counter("aws_requests_total", &["service", "operation"], "AWS requests");
/// AWS request attempts that failed.
pub const AWS_REQUEST_FAILURES: Metric = Metric::counter(
    "aws_request_failures_total",
    &["service", "operation"],
    "AWS request attempts that failed (each retry counts); the callers log an outage once per interval",
);
/// Messages received by a worker's long polls.
pub const SQS_MESSAGES_RECEIVED: Metric =
    Metric::counter("sqs_messages_received_total", &["queue"], "messages a worker's long polls received");
/// Received bodies that did not match their `MD5OfBody`.
pub const SQS_MESSAGES_DAMAGED: Metric = Metric::counter(
    "sqs_messages_damaged_total",
    &["queue"],
    "received bodies that did not match their `MD5OfBody`, handed back unhandled",
);
/// Visibility extensions a worker's heartbeat sent for its long jobs.
pub const SQS_VISIBILITY_EXTENSIONS: Metric = Metric::counter(
    "sqs_visibility_extensions_total",
    &[],
    "visibility extensions the heartbeat sent, keeping a long job's message invisible",
);
/// Messages the workers handled, by outcome.
pub const MESSAGES_HANDLED: Metric = Metric::counter(
    "messages_handled_total",
    &["queue", "outcome"],
    "messages the workers handled; outcome: `done`, or the failure's kind (`transient`, `outage`, `permanent`)",
);
/// Messages held through an outage instead of handed back.
pub const MESSAGES_HELD: Metric = Metric::counter(
    "messages_held_total",
    &["queue"],
    "messages a worker holds through an outage instead of handing them back",
);
/// Each pool's connections.
pub const DB_POOL_CONNECTIONS: Metric =
    Metric::gauge("db_pool_connections", &["pool"], "each PostgreSQL pool's connections");
/// Each pool's idle connections.
pub const DB_POOL_IDLE_CONNECTIONS: Metric =
    Metric::gauge("db_pool_idle_connections", &["pool"], "each PostgreSQL pool's idle connections");
/// Checkouts of a connection, by how they went.
pub const DB_POOL_CHECKOUTS: Metric = Metric::counter(
    "db_pool_checkouts_total",
    &["pool", "outcome"],
    "checkouts of a connection; outcome: `direct`, `waited`, `timed_out` (a step that got no connection in time)",
);
/// Time spent waiting for a connection.
pub const DB_POOL_CHECKOUT_WAIT: Metric = Metric::gauge(
    "db_pool_checkout_wait_seconds_total",
    &["pool"],
    "time spent waiting for a connection (bb8's running total, read as `/metrics` is read)",
);
/// Connections opened.
pub const DB_POOL_CONNECTIONS_OPENED: Metric =
    Metric::counter("db_pool_connections_opened_total", &["pool"], "connections opened");
/// Connections closed, by why.
pub const DB_POOL_CONNECTIONS_CLOSED: Metric = Metric::counter(
    "db_pool_connections_closed_total",
    &["pool", "why"],
    "connections closed; why: `broken`, `invalid`, `max_lifetime`, `idle_timeout`",
);

/// Every metric this crate exports.
pub const ALL: &[Metric] = &[
    AWS_REQUESTS,
    AWS_REQUEST_FAILURES,
    SQS_MESSAGES_RECEIVED,
    SQS_MESSAGES_DAMAGED,
    SQS_VISIBILITY_EXTENSIONS,
    MESSAGES_HANDLED,
    MESSAGES_HELD,
    DB_POOL_CONNECTIONS,
    DB_POOL_IDLE_CONNECTIONS,
    DB_POOL_CHECKOUTS,
    DB_POOL_CHECKOUT_WAIT,
    DB_POOL_CONNECTIONS_OPENED,
    DB_POOL_CONNECTIONS_CLOSED,
];
