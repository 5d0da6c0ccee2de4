//! A TCP proxy a test can cut and restore: put it between the fleet and LocalStack (an SQS
//! outage) or PostgreSQL (a database outage). Cut, it drops every open connection and every
//! new one at once, as a dead host behind a firewall that rejects would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    // Bumped on every cut, so open connections notice and close.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let task = tokio::spawn({
            let cut = cut.clone();
            let generation = generation.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::Acquire) {
                        drop(inbound);
                        continue;
                    }
                    let mut changed = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                        let mut inbound = inbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = changed.changed() => {}
                        }
                    });
                }
            }
        });
        Ok(Self { addr, cut, generation, task })
    }

    /// Drops every connection, and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::Release);
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/1.1 proxy in front of LocalStack that can take one kind of request away: while a
/// marker is set, a request whose headers or body contain it either loses its connection
/// before it is forwarded (as when a load balancer or a throttled endpoint gives up on it) or
/// is never answered, its connection held open (a black hole); every other request goes
/// through. So a test can take SNS's Publish away while `GetTopicAttributes` still answers, or
/// make SQS's `DeleteMessageBatch` hang.
///
/// It handles one request per connection and tells both sides so (`Connection: close`), which
/// keeps it to reading one request and copying one answer: the AWS SDK's requests carry a
/// `Content-Length`.
pub struct FilterProxy {
    pub addr: SocketAddr,
    dropping: Arc<std::sync::Mutex<Option<(String, Fate)>>>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FilterProxy {
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let dropping: Arc<std::sync::Mutex<Option<(String, Fate)>>> = Arc::default();
        let dropped: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let task = tokio::spawn({
            let (dropping, dropped) = (dropping.clone(), dropped.clone());
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let (dropping, dropped) = (dropping.clone(), dropped.clone());
                    tokio::spawn(async move {
                        let _ = forward_one(inbound, target, &dropping, &dropped).await;
                    });
                }
            }
        });
        Ok(Self { addr, dropping, dropped, task })
    }

    /// Drops every request that contains `marker` until [`FilterProxy::forward_all`].
    pub fn drop_requests_containing(&self, marker: &str) {
        *self.dropping.lock().expect("not poisoned") = Some((marker.to_owned(), Fate::Dropped));
    }

    /// Never answers a request that contains `marker`, holding its connection open, until
    /// [`FilterProxy::forward_all`] (the ones already held stay held).
    pub fn hang_requests_containing(&self, marker: &str) {
        *self.dropping.lock().expect("not poisoned") = Some((marker.to_owned(), Fate::Hung));
    }

    pub fn forward_all(&self) {
        *self.dropping.lock().expect("not poisoned") = None;
    }

    /// Requests dropped or hung so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FilterProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What happens to a request that matches the marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Dropped,
    Hung,
}

async fn forward_one(
    mut inbound: TcpStream,
    target: SocketAddr,
    dropping: &std::sync::Mutex<Option<(String, Fate)>>,
    dropped: &std::sync::atomic::AtomicU64,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (head, mut body) = read_head(&mut inbound).await?;
    let length = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    while body.len() < length {
        let mut chunk = vec![0; length - body.len()];
        let n = inbound.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the client closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    let rule = dropping.lock().expect("not poisoned").clone();
    if let Some((marker, fate)) = rule {
        let contains = |bytes: &[u8]| bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        if contains(head.as_bytes()) || contains(&body) {
            dropped.fetch_add(1, Ordering::AcqRel);
            if fate == Fate::Hung {
                // Held open, never answered, until the proxy is dropped.
                std::future::pending::<()>().await;
            }
            return Ok(()); // the connection drops here, unanswered
        }
    }
    let mut outbound = TcpStream::connect(target).await?;
    outbound.write_all(&with_connection_close(&head)).await?;
    outbound.write_all(&body).await?;
    let (answer_head, answer_rest) = read_head(&mut outbound).await?;
    inbound.write_all(&with_connection_close(&answer_head)).await?;
    inbound.write_all(&answer_rest).await?;
    tokio::io::copy(&mut outbound, &mut inbound).await?;
    inbound.shutdown().await?;
    Ok(())
}

/// The header block (up to and including the blank line) and whatever came after it.
async fn read_head(stream: &mut TcpStream) -> anyhow::Result<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut buffer = Vec::new();
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buffer).into_owned(), rest));
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed before the end of the headers");
        buffer.extend_from_slice(&chunk[..n]);
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn with_connection_close(head: &str) -> Vec<u8> {
    let mut lines: Vec<&str> =
        head.trim_end().lines().filter(|l| !l.to_ascii_lowercase().starts_with("connection:")).collect();
    lines.push("Connection: close");
    format!("{}\r\n\r\n", lines.join("\r\n")).into_bytes()
}
