//! The server loop: accepts connections and serves each under hyper with the two clocks of
//! [`crate::connection`], until the stop signal; then in-flight requests finish.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::connection;
use crate::routes::router;

/// Serves until `cancel` fires; in-flight requests finish first.
///
/// Each connection is served by hyper under two clocks ([`connection`]): a client that connects
/// and sends nothing, or half a request, is cut off at the header timeout
/// (`INTAKE_HEADER_TIMEOUT_SECONDS`), instead of holding its socket for ever (`axum::serve`
/// sets no such timer); a keep-alive connection between requests stays open for the idle
/// timeout (`INTAKE_IDLE_TIMEOUT_SECONDS`), longer than a load balancer's.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's one timer runs from when it starts waiting for a request: the idle timeout.
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(state.limits.config.idle_timeout);
    let header_timeout = state.limits.config.header_timeout;
    let placing = state.placing.clone();
    tokio::spawn(record_answers(state.clone(), cancel.clone()));
    let app = router(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = cancel.cancelled() => break,
        };
        let clock = connection::HeadClock::new();
        let service = {
            let (app, clock) = (hyper_util::service::TowerToHyperService::new(app.clone()), clock.clone());
            hyper::service::service_fn(move |request| {
                clock.request_began();
                let (answer, clock) = (hyper::service::Service::call(&app, request), clock.clone());
                async move {
                    let answer = answer.await;
                    clock.request_answered();
                    answer
                }
            })
        };
        let io = hyper_util::rt::TokioIo::new(connection::Watched::new(stream, clock.clone()));
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                },
                // Dropping the connection closes its socket.
                () = clock.headers_late(header_timeout) => tracing::debug!("request headers too slow; connection closed"),
            }
        });
    }
    // No new connections; idle ones close, requests in flight finish.
    drop(listener);
    graceful.shutdown().await;
    // And the placements whose buyers hung up, which no connection waits for.
    placing.close();
    placing.wait().await;
    Ok(())
}

/// Once a second until the stop, the `sold_out` answers this intake gave, added to the
/// database's count for `fleetctl drop status` (nothing while it gives none).
async fn record_answers(state: AppState, cancel: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => state.sold_out_reads.record_answers(&state.pool).await,
            () = cancel.cancelled() => break,
        }
    }
    state.sold_out_reads.record_answers(&state.pool).await;
}
