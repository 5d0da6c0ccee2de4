//! Every metric the notification worker exports of its own.

use orderfleet_runtime::metrics::Metric;

/// Whole `PublishBatch` calls that failed, which the notification worker keeps trying while the outage lasts.
pub const NOTIFICATION_PUBLISH_FAILURES: Metric = Metric::counter(
    "notification_publish_failures_total",
    &["kind"],
    "whole `PublishBatch` calls that failed, which the notification worker keeps trying while the outage lasts; kind: `malformed`, `refused`, `no_answer`",
);

/// Every metric this crate exports.
pub const ALL: &[Metric] = &[NOTIFICATION_PUBLISH_FAILURES];
