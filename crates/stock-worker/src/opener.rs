//! The opener: every quarter second, each stock worker opens the products whose opening has
//! come ([`product::open_due`]). Several workers look at once; the opening's compare-and-set
//! lets one in, so a product opens once, within a second of its `opens_at` while any stock
//! worker runs. A failed look is logged once per streak and tried again.

use std::time::Duration;

use orderfleet::domain::records::product;
use orderfleet_runtime::db::Pool;
use tokio_util::sync::CancellationToken;

/// How often the opener looks.
pub(crate) const EVERY: Duration = Duration::from_millis(250);

/// Looks every [`EVERY`] until the stop signal.
pub(crate) async fn run(pool: Pool, stop: CancellationToken) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    while tokio::select! { _ = every.tick() => true, () = stop.cancelled() => false } {
        match product::open_due(&pool).await {
            Ok(opened) => {
                failing = false;
                for (product, drawn) in opened {
                    tracing::info!(product = %product, drawn, "opened the product: its queue drawn and in line");
                }
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot look for products to open; trying again");
            }
            Err(_) => {}
        }
    }
}
