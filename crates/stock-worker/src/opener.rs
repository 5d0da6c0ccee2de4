//! The opener: each stock worker opens the products whose opening has come
//! ([`product::open_due`]), at their `opens_at`. It sleeps until the next opening the schedule
//! shows (a minute at most, and as long while nothing is scheduled, so an idle fleet spends one
//! statement a minute on it), and `fleetctl product upsert` wakes it at once with a `NOTIFY`
//! on [`product::OPENINGS_CHANNEL`], so a schedule set a moment ahead is kept too. Several
//! workers look at once; the opening's compare-and-set lets one in, so a product opens once,
//! within a second of its `opens_at` while any stock worker runs. Each look also ends what is
//! left of a queue no unit can reach any more, 500 orders a transaction, looking again at once
//! while some are left (`promote_queued` wakes the openers when it leaves some). A failed look
//! is logged once per streak and tried again in a second.

use std::time::Duration;

use orderfleet::domain::records::product;
use orderfleet_runtime::db::Pool;
use tokio_util::sync::CancellationToken;

/// The longest the opener sleeps: a lost `NOTIFY` (its connection down) costs at most this.
pub(crate) const IDLE: Duration = Duration::from_secs(60);

/// Opens products at their time until the stop signal.
pub(crate) async fn run(pool: Pool, stop: CancellationToken) {
    let mut listener: Option<product::OpeningsListener> = None;
    let mut failing = false;
    while !stop.is_cancelled() {
        if listener.is_none() {
            listener = product::OpeningsListener::connect(&pool).await;
        }
        let wait = match product::open_due(&pool).await {
            Ok(looked) => {
                failing = false;
                for (product, drawn) in looked.opened {
                    tracing::info!(product = %product, drawn, "opened the product: its queue drawn and in line");
                }
                looked.next_in.map_or(IDLE, |next| next.min(IDLE))
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot look for products to open; trying again");
                }
                failing = true;
                Duration::from_secs(1)
            }
        };
        let woken = async {
            match listener.as_mut() {
                Some(l) => l.woken().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
            woken = woken => if !woken { listener = None },
        }
    }
}
