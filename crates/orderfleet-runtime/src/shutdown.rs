//! One cancellation source per process: SIGTERM (ECS, systemd, a deploy) or SIGINT (Ctrl-C)
//! cancels the token that every loop `select!`s on.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT.
pub(crate) fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let signal = wait_for_signal().await;
        tracing::info!(signal, "stopping: no new work is taken; in-flight work finishes");
        trigger.cancel();
    });
    token
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
