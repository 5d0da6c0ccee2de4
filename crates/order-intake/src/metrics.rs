//! Every metric the intake exports of its own (the door's are the domain's: `orderfleet::metrics`).

use orderfleet_runtime::metrics::Metric;

/// The intake's answers to `POST /orders`, by HTTP status.
pub const INTAKE_ORDERS: Metric = Metric::counter(
    "intake_orders_total",
    &["status"],
    "the intake's answers to `POST /orders`, by HTTP status",
);
/// How long the intake took to answer `POST /orders`.
pub const INTAKE_ORDER_SECONDS: Metric =
    Metric::histogram("intake_order_seconds", &[], "how long the intake took to answer `POST /orders`");
/// Requests refused `401 unauthorized` (no token, or one the intake does not accept).
pub const INTAKE_UNAUTHORIZED: Metric = Metric::counter(
    "intake_unauthorized_total",
    &[],
    "requests refused `401 unauthorized` (no token, or one the intake does not accept)",
);
/// Requests refused `429`.
pub const INTAKE_RATE_LIMITED: Metric = Metric::counter(
    "intake_rate_limited_total",
    &["limit"],
    "requests refused `429`; limit: `user` (a buyer's rate), `global` (the intake's), `declines` (a card's declines)",
);
/// Signed Stripe events, by type and what each did (`unavailable`: answered 503, and Stripe sends it again).
pub const WEBHOOK_EVENTS: Metric = Metric::counter(
    "webhook_events_total",
    &["type", "effect"],
    "signed Stripe events, by type and what each did (`unavailable`: answered 503, and Stripe sends it again)",
);

/// Every metric this crate exports.
pub const ALL: &[Metric] =
    &[INTAKE_ORDERS, INTAKE_ORDER_SECONDS, INTAKE_UNAUTHORIZED, INTAKE_RATE_LIMITED, WEBHOOK_EVENTS];
