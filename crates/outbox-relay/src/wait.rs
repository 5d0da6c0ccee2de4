//! How a relay lane waits: out a delay that the stop signal cuts short ([`pause`]), or, on
//! lane 0 when nothing is due, for a new row's `NOTIFY outbox_inserted`, the next row's due
//! time or the fallback poll ([`wait_for_rows`]). The `LISTEN` holds a connection of its own,
//! outside the pool, reconnected when it drops; without one the lane polls.

use std::time::Duration;

use futures::FutureExt;
use orderfleet_runtime::db::Pool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

pub(crate) async fn pause(cancel: &CancellationToken, delay: Duration) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

pub(crate) async fn connect_listener(pool: &Pool) -> Option<PgListener> {
    let attempt = async {
        let mut listener = PgListener::connect_with(&pool.for_listener()).await?;
        listener.listen("outbox_inserted").await?;
        Ok::<_, sqlx::Error>(listener)
    };
    match attempt.await {
        Ok(listener) => Some(listener),
        Err(e) => {
            tracing::warn!(error = %e, "cannot LISTEN for new outbox rows; polling until it can");
            None
        }
    }
}

/// Sleeps until a notification, the fallback poll, or the stop signal.
pub(crate) async fn wait_for_rows(
    listener: &mut Option<PgListener>,
    pool: &Pool,
    wait: Duration,
    cancel: &CancellationToken,
) {
    if listener.is_none() {
        *listener = connect_listener(pool).await;
    }
    match listener {
        Some(l) => {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
                received = l.try_recv() => {
                    match received {
                        Ok(Some(_)) => {
                            // Every committed insert notifies, and during a burst the relay
                            // is busy sending, so thousands wait on the connection. One round
                            // claims all their rows: drop the rest of what is already here,
                            // or each would wake an empty claim (measured: ~4,000 of them,
                            // spinning at 1,500/s after a 2,000-order burst).
                            while let Some(Ok(Some(_))) = l.try_recv().now_or_never() {}
                        }
                        // The connection dropped; sqlx reconnects on the next call.
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "LISTEN connection failed; reconnecting");
                            *listener = None;
                        }
                    }
                }
            }
        }
        None => pause(cancel, wait).await,
    }
}
