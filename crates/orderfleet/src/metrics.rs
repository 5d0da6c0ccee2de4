//! Every metric the domain exports: the door's, the payment steps', and recovery's.

use orderfleet_runtime::metrics::Metric;

/// The door's statement, the one every buyer of a drop queues on.
pub const INTAKE_DOOR_SECONDS: Metric = Metric::histogram(
    "intake_door_seconds",
    &["outcome"],
    "the door's statement, the one every buyer of a drop queues on; outcome: `admitted`, `closed`, `key_used` (a retried key, which never waits on the product row), `error`, `sold_out_read`, `not_open_read` and `sale_paused_read` (told `sold_out`, `not_open` or `sale_paused` from a read the intake's waiting requests shared, with no statement of its own), `queued` (a pre-queue entry)",
);
/// The reads of a sold-out product the intake made.
pub const INTAKE_SOLD_OUT_READS: Metric =
    Metric::counter("intake_sold_out_reads_total", &[], "the reads of a sold-out product the intake made");
/// How many requests each read of a sold-out product answered.
pub const INTAKE_SOLD_OUT_READ_REQUESTS: Metric = Metric::histogram(
    "intake_sold_out_read_requests",
    &[],
    "how many requests each read of a sold-out product answered",
);
/// Fetches of the identity provider's key set (`AUTH_JWKS_URL`).
pub const INTAKE_JWKS_FETCHES: Metric = Metric::counter(
    "intake_jwks_fetches_total",
    &["outcome"],
    "fetches of the identity provider's key set (`AUTH_JWKS_URL`); outcome: `fetched`, `failed`",
);
/// Disputes Stripe reported (`charge.dispute.created`.
pub const STRIPE_DISPUTES: Metric = Metric::counter(
    "stripe_disputes_total",
    &[],
    "disputes Stripe reported (`charge.dispute.created`; the alarm `orders-disputed`)",
);
/// PaymentIntents released that their order did not record.
pub const STRAY_INTENTS_CANCELED: Metric = Metric::counter(
    "stray_intents_canceled_total",
    &["found"],
    "PaymentIntents released that their order did not record; found: `at_commit` (by a commit that found its order moved on), `reconciliation` (by the sweeper's pass), `failed_order` (a live intent of a failed order), `owed` (a release tried again)",
);
/// Stray PaymentIntents Stripe refused to cancel: cancel them in the Dashboard.
pub const STRAY_INTENTS_CANCEL_REFUSED: Metric = Metric::counter(
    "stray_intents_cancel_refused_total",
    &[],
    "stray PaymentIntents Stripe refused to cancel: cancel them in the Dashboard",
);
/// Releases Stripe did not answer, owed to the next pass in the table `intent_releases_owed`.
pub const STRAY_INTENTS_RELEASE_DEFERRED: Metric = Metric::counter(
    "stray_intents_release_deferred_total",
    &[],
    "releases Stripe did not answer, owed to the next pass in the table `intent_releases_owed`",
);
/// The safety net: a live intent of a failed order cancelled, above zero means a way the fleet does not foresee.
pub const FAILED_ORDER_HOLDS_RELEASED: Metric = Metric::counter(
    "failed_order_holds_released_total",
    &["found"],
    "the safety net: a live intent of a failed order cancelled, above zero means a way the fleet does not foresee; found: `webhook`, `reconciliation`",
);
/// Lookups that found the order's intent before its confirm ended: the order stays pending.
pub const AUTHORIZATION_INTENTS_UNSETTLED: Metric = Metric::counter(
    "authorization_intents_unsettled_total",
    &[],
    "lookups that found the order's intent before its confirm ended: the order stays pending",
);
/// Lookups of a pending order's intents that Stripe refused for good, once per pass per such order ("A pending order stuck for a person" in docs/operations.md).
pub const AUTHORIZATION_LOOKUPS_REFUSED: Metric = Metric::counter(
    "authorization_lookups_refused_total",
    &[],
    "lookups of a pending order's intents that Stripe refused for good, once per pass per such order (\"A pending order stuck for a person\" in docs/operations.md)",
);
/// Orders whose move the database refused for good, their holds released, `failure_reason` `order_refused`.
pub const ORDERS_REFUSED_BY_DATABASE: Metric = Metric::counter(
    "orders_refused_by_database_total",
    &["path"],
    "orders whose move the database refused for good, their holds released, `failure_reason` `order_refused`; path: `authorization`, `settle`, `fulfilment`",
);

/// Every metric this crate exports.
pub const ALL: &[Metric] = &[
    INTAKE_DOOR_SECONDS,
    INTAKE_SOLD_OUT_READS,
    INTAKE_SOLD_OUT_READ_REQUESTS,
    INTAKE_JWKS_FETCHES,
    STRIPE_DISPUTES,
    STRAY_INTENTS_CANCELED,
    STRAY_INTENTS_CANCEL_REFUSED,
    STRAY_INTENTS_RELEASE_DEFERRED,
    FAILED_ORDER_HOLDS_RELEASED,
    AUTHORIZATION_INTENTS_UNSETTLED,
    AUTHORIZATION_LOOKUPS_REFUSED,
    ORDERS_REFUSED_BY_DATABASE,
];
