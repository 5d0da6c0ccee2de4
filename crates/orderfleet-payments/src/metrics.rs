//! Every metric this crate exports: Stripe's requests, and the fleet's budget of them.

use orderfleet_runtime::metrics::Metric;

/// Stripe requests.
pub const STRIPE_REQUESTS: Metric = Metric::counter(
    "stripe_requests_total",
    &["operation", "outcome"],
    "Stripe requests, each attempt; outcome: `ok`, `lock_timeout`, `transient`, `permanent`, or `attempt_failed` (the caller tries again under its key)",
);
/// 429 `lock_timeout`s: one intent held at Stripe, retried, slowing nothing.
pub const STRIPE_LOCK_TIMEOUTS: Metric = Metric::counter(
    "stripe_lock_timeouts_total",
    &["operation"],
    "429 `lock_timeout`s: one intent held at Stripe, retried, slowing nothing",
);
/// Cancels sent again under a fresh key after a saved failure.
pub const STRIPE_CANCELS_RESENT: Metric = Metric::counter(
    "stripe_cancels_resent_total",
    &[],
    "cancels sent again under a fresh key after a saved failure",
);
/// How long each Stripe request waited for its turn of the fleet's budget.
pub const STRIPE_BUDGET_WAIT: Metric = Metric::histogram(
    "stripe_budget_wait_seconds",
    &["endpoint"],
    "how long each Stripe request waited for its turn of the fleet's budget",
);
/// Stripe requests given up for want of a turn of the fleet's budget.
pub const STRIPE_BUDGET_REFUSALS: Metric = Metric::counter(
    "stripe_budget_refusals_total",
    &["endpoint"],
    "Stripe requests given up for want of a turn of the fleet's budget",
);
/// 429 `rate_limit`s from Stripe, which the alarm `stripe-rate-limited` watches.
pub const STRIPE_RATE_LIMITED: Metric = Metric::counter(
    "stripe_rate_limited_total",
    &["endpoint"],
    "429 `rate_limit`s from Stripe, which the alarm `stripe-rate-limited` watches",
);
/// The budget's ticks: its renewals of this process's row in `stripe_budget_members`.
pub const STRIPE_BUDGET_TICKS: Metric = Metric::counter(
    "stripe_budget_ticks_total",
    &["outcome"],
    "the budget's ticks: its renewals of this process's row in `stripe_budget_members`; outcome: `ok`, `failed`",
);
/// This process's share of each endpoint's requests a second.
pub const STRIPE_BUDGET_SHARE: Metric = Metric::gauge(
    "stripe_budget_share",
    &["endpoint"],
    "this process's share of each endpoint's requests a second",
);
/// Each endpoint's fleet-wide limit, as a 429 cut it.
pub const STRIPE_BUDGET_LIMIT: Metric =
    Metric::gauge("stripe_budget_limit", &["endpoint"], "each endpoint's fleet-wide limit, as a 429 cut it");

/// Every metric this crate exports.
pub const ALL: &[Metric] = &[
    STRIPE_REQUESTS,
    STRIPE_LOCK_TIMEOUTS,
    STRIPE_CANCELS_RESENT,
    STRIPE_BUDGET_WAIT,
    STRIPE_BUDGET_REFUSALS,
    STRIPE_RATE_LIMITED,
    STRIPE_BUDGET_TICKS,
    STRIPE_BUDGET_SHARE,
    STRIPE_BUDGET_LIMIT,
];
