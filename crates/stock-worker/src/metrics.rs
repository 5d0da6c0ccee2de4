//! Every metric the stock worker exports of its own (its steps' are the domain's: `orderfleet::metrics`).

use orderfleet_runtime::metrics::Metric;

/// The stock worker's orders whose turn, after a stock cut, waits on a pending order ahead.
pub const ORDERS_WAITING_FOR_THE_LINE: Metric = Metric::gauge(
    "orders_waiting_for_the_line",
    &[],
    "the stock worker's orders whose turn, after a stock cut, waits on a pending order ahead",
);

/// Every metric this crate exports.
pub const ALL: &[Metric] = &[ORDERS_WAITING_FOR_THE_LINE];
