//! Two clocks on every connection: one for a request's headers, one for an idle keep-alive.
//!
//! hyper has one timer for both: its header-read timeout runs from the moment it starts
//! waiting for the next request, so a keep-alive connection idle longer than the timeout is
//! closed. Behind a load balancer that is wrong: an ALB keeps idle connections to its targets
//! for 60 s and AWS asks that the target's keep-alive be longer, or the balancer sends a
//! buyer's request on a connection the target has just closed and answers `502`. A short
//! header timeout, though, is what keeps slow clients (slowloris) from holding sockets.
//!
//! So hyper's timer is set to the idle timeout (`INTAKE_IDLE_TIMEOUT_SECONDS`, 75), and a
//! `HeadClock` watches for the header timeout (`INTAKE_HEADER_TIMEOUT_SECONDS`, 5): it
//! starts when a new connection opens and when the first byte of a next request arrives,
//! and stops when the request's headers are complete (hyper calls the service). A
//! connection whose headers do not complete in time is dropped, closing its socket.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Whether a request's headers are being waited for, and since which start.
#[derive(Debug)]
pub(crate) struct HeadClock {
    /// Headers are awaited (a new connection, or a next request's first byte came).
    open: AtomicBool,
    /// A request is being served: bytes read now are its body, not a next request's head.
    serving: AtomicBool,
    /// Bumped at every start, so the watch knows a head it timed is still the same one.
    starts: AtomicU64,
    started: Notify,
}

impl HeadClock {
    /// A new connection: its first request's headers are awaited from now.
    pub fn new() -> Arc<Self> {
        let clock = Self {
            open: AtomicBool::new(true),
            serving: AtomicBool::new(false),
            starts: AtomicU64::new(1),
            started: Notify::new(),
        };
        clock.started.notify_one();
        Arc::new(clock)
    }

    /// Bytes arrived: between requests, they begin the next one's headers.
    fn bytes_arrived(&self) {
        if !self.serving.load(Ordering::Acquire) && !self.open.swap(true, Ordering::AcqRel) {
            self.starts.fetch_add(1, Ordering::AcqRel);
            self.started.notify_one();
        }
    }

    /// The headers are complete: the request is being served.
    pub(crate) fn request_began(&self) {
        self.serving.store(true, Ordering::Release);
        self.open.store(false, Ordering::Release);
    }

    /// The answer is on its way; what arrives next is the next request.
    pub(crate) fn request_answered(&self) {
        self.serving.store(false, Ordering::Release);
    }

    /// Returns when some request's headers took longer than `timeout`.
    pub(crate) async fn headers_late(&self, timeout: Duration) {
        loop {
            self.started.notified().await;
            let start = self.starts.load(Ordering::Acquire);
            tokio::time::sleep(timeout).await;
            if self.open.load(Ordering::Acquire) && self.starts.load(Ordering::Acquire) == start {
                return;
            }
        }
    }
}

/// A connection's socket, telling its [`HeadClock`] when bytes arrive.
pub(crate) struct Watched<S> {
    inner: S,
    clock: Arc<HeadClock>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, clock: Arc<HeadClock>) -> Self {
        Self { inner, clock }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_arrived();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_must_send_its_headers_in_time() {
        let clock = HeadClock::new();
        let late = tokio::time::timeout(Duration::from_secs(6), clock.headers_late(Duration::from_secs(5)));
        assert!(late.await.is_ok(), "a connection that sent nothing was not timed out");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_keep_alive_connection_is_not_timed_but_a_half_sent_next_request_is() {
        let clock = HeadClock::new();
        clock.request_began();
        clock.bytes_arrived(); // the body: not a head
        clock.request_answered();
        let watch = clock.headers_late(Duration::from_secs(5));
        tokio::pin!(watch);
        // Idle for 65 s: no clock runs.
        assert!(tokio::time::timeout(Duration::from_secs(65), &mut watch).await.is_err());
        // The next request's first bytes, and nothing more: late 5 s later.
        clock.bytes_arrived();
        assert!(tokio::time::timeout(Duration::from_secs(6), &mut watch).await.is_ok());
    }
}
