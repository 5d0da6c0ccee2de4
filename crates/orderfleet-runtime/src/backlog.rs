//! Whether a source (a queue, the outbox) holds more than one reader can take at a time.
//!
//! Extra readers cost calls: two pollers on a shallow queue each get half a batch, so every
//! message costs twice the receives, deletes and publishes. So a worker's first reader always
//! reads, and the others read only while reads come back full, parking as soon as one comes
//! back short (Spring Cloud AWS's automatic back-pressure mode works the same way).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Whether a source is deep, shared by the readers of one process.
#[derive(Debug, Default)]
pub struct Backlog {
    deep: AtomicBool,
    deepened: Notify,
}

impl Backlog {
    /// Records a read that asked for `asked` items and got `got`: full means deep.
    pub fn observe(&self, got: usize, asked: usize) {
        if got >= asked && asked > 0 {
            if !self.deep.swap(true, Ordering::AcqRel) {
                self.deepened.notify_waiters();
            }
        } else {
            self.deep.store(false, Ordering::Release);
        }
    }

    /// Whether the last read came back full.
    pub(crate) fn is_deep(&self) -> bool {
        self.deep.load(Ordering::Acquire)
    }

    /// Waits until the source is deep; false if `cancel` fired first.
    pub async fn wait_deep(&self, cancel: &CancellationToken) -> bool {
        loop {
            let deepened = self.deepened.notified();
            tokio::pin!(deepened);
            // Registered before the check, so a `notify_waiters` in between is not missed.
            deepened.as_mut().enable();
            if self.is_deep() {
                return true;
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = deepened => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_full_read_wakes_the_parked_readers_and_a_short_one_parks_them() {
        let backlog = Arc::new(Backlog::default());
        let cancel = CancellationToken::new();
        let parked = tokio::spawn({
            let (backlog, cancel) = (backlog.clone(), cancel.clone());
            async move { backlog.wait_deep(&cancel).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!parked.is_finished(), "a reader parks while nothing says the source is deep");
        backlog.observe(10, 10);
        assert!(parked.await.unwrap(), "a full read wakes it");
        backlog.observe(3, 10);
        assert!(!backlog.is_deep(), "a short read makes the source shallow again");
        backlog.observe(0, 0);
        assert!(!backlog.is_deep(), "asking for nothing proves nothing");
    }

    #[tokio::test]
    async fn the_stop_signal_releases_a_parked_reader() {
        let backlog = Backlog::default();
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!backlog.wait_deep(&cancel).await);
    }
}
