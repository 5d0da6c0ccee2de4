//! The worker's gate, which an outage closes and a passing probe opens, and the one sleep every
//! wait of a consumer takes: both cut short by the stop signal. The pollers, the batches'
//! holds and their settling all use them, so they sit below all three.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Handler;
use crate::backoff::Backoff;

/// Closed by an outage, opened by a passing probe: while closed, no poller receives.
#[derive(Debug, Default)]
pub(super) struct Gate {
    paused: AtomicBool,
}

impl Gate {
    /// Closes the gate; true if this call closed it (so one log line per outage).
    pub(super) fn pause(&self) -> bool {
        !self.paused.swap(true, Ordering::AcqRel)
    }

    pub(super) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Probes until the handler's dependencies answer, with backoff and a log line per 30 s.
    /// Returns false if the stop signal came first.
    pub(super) async fn wait_until_ready<H: Handler>(
        &self,
        handler: &H,
        queue: &str,
        cancel: &CancellationToken,
    ) -> bool {
        let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(15));
        let mut attempt = 0;
        let mut last_logged: Option<Instant> = None;
        while self.is_paused() {
            // A stopping worker receives nothing more: no probe (it may take seconds) to wait for.
            if cancel.is_cancelled() {
                return false;
            }
            match handler.ready().await {
                Ok(()) => {
                    if self.paused.swap(false, Ordering::AcqRel) {
                        tracing::info!(queue, probes = attempt + 1, "dependencies answer again; receiving");
                    }
                }
                Err(reason) => {
                    if last_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        tracing::warn!(queue, reason, "still waiting for a dependency; receiving nothing");
                        last_logged = Some(Instant::now());
                    }
                    if !sleep_or_stop(cancel, backoff.delay(attempt)).await {
                        return false;
                    }
                    attempt += 1;
                }
            }
        }
        true
    }
}

pub(super) use crate::tasks::sleep_or_stop;
