//! Proxies a test puts between the fleet and a dependency to take it away.
//!
//! [`Proxy`] is a TCP proxy that takes a dependency away in the [`Shape`]s outages really take
//! (SPEC §8.10): refused, reset, silent, frozen mid-exchange, failing its TLS handshake,
//! answering 5xx. [`FilterProxy`] takes one kind of HTTP request away and lets the rest through.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How a dependency is away. What each does to the connections open when it starts, and to
/// new ones while it lasts:
///
/// | shape | open connections | new connections | like |
/// |---|---|---|---|
/// | `Refused` | reset | refused (the port is closed) | the service down on a live host |
/// | `Reset` | reset | accepted, then reset | a firewall rejecting, a crashed balancer |
/// | `Blackhole` | silent | accepted, never answered | a host gone dark: packets dropped |
/// | `Frozen` | silent **for good**, even after the outage | forwarded | a NAT or firewall that forgot the flows: only new connections work |
/// | `TlsFails` | reset | the TLS handshake fails: PostgreSQL's `SSLRequest` is accepted (`S`), then a TLS alert; a plaintext HTTP request gets the alert's bytes | a bad certificate, a TLS-terminating balancer failing |
/// | `ServerError` | reset | every HTTP request answered `503` | a load balancer with no healthy target |
///
/// When the outage ends ([`Proxy::restore`]), the silent connections of a `Blackhole` are
/// reset (the host that comes back does not know them); a `Frozen` one stays silent, so only
/// a client with its own deadlines gets past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Connections refused.
    Refused,
    /// Connections accepted, then reset.
    Reset,
    /// Connections accepted, then silence.
    Blackhole,
    /// Connections open, nothing more forwarded either way.
    Frozen,
    /// The TLS handshake fails.
    TlsFails,
    /// HTTP answered `503`.
    ServerError,
}

impl Shape {
    /// Every shape, for a test that tries each.
    pub const ALL: [Shape; 6] =
        [Shape::Refused, Shape::Reset, Shape::Blackhole, Shape::Frozen, Shape::TlsFails, Shape::ServerError];

    /// Its name in test output.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Refused => "refused",
            Shape::Reset => "reset",
            Shape::Blackhole => "blackhole",
            Shape::Frozen => "frozen",
            Shape::TlsFails => "tls-fails",
            Shape::ServerError => "5xx",
        }
    }
}

/// A TCP proxy that can take its target away in any [`Shape`].
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The shape now (`None`: forwarding), and how many times it changed.
    state: watch::Sender<(Option<Shape>, u64)>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`. The port is one of
    /// [`crate::free_port`]'s, below the kernel's ephemeral range: a `Refused` outage closes it
    /// and opens it again, and a port of that range may meanwhile become the local end of some
    /// process's outgoing connection (kept alive for a minute and more: stripe-sim's webhook
    /// deliveries made it happen), and the proxy could not listen on it again.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", crate::free_port())).await?;
        let addr = listener.local_addr()?;
        let (state, _) = watch::channel((None, 0));
        let task = tokio::spawn(accept_loop(listener, target, state.clone()));
        Ok(Self { addr, state, task })
    }

    /// Takes the target away in `shape` until [`Proxy::restore`].
    pub fn take_away(&self, shape: Shape) {
        self.state.send_modify(|(now, changes)| {
            *now = Some(shape);
            *changes += 1;
        });
    }

    /// Drops every connection and every new one at once ([`Shape::Reset`]).
    pub fn cut(&self) {
        self.take_away(Shape::Reset);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.state.send_modify(|(now, changes)| {
            *now = None;
            *changes += 1;
        });
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // The connections' tasks end with the state's sender.
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, state: watch::Sender<(Option<Shape>, u64)>) {
    let addr = listener.local_addr().expect("bound");
    let mut listener = Some(listener);
    let mut changes = state.subscribe();
    loop {
        let shape = changes.borrow_and_update().0;
        // Refused: the port closed, so the kernel refuses; open again when it ends.
        if shape == Some(Shape::Refused) {
            listener = None;
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(open) = listener.as_ref() else {
            listener = rebind(addr).await;
            continue;
        };
        tokio::select! {
            accepted = open.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                let _ = inbound.set_nodelay(true);
                tokio::spawn(serve(inbound, target, shape, state.subscribe()));
            }
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// The port again, after a `Refused` outage (another socket may hold it for a moment).
async fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..100 {
        if let Ok(listener) = TcpListener::bind(addr).await {
            return Some(listener);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the proxy could not listen on {addr} again");
}

/// One connection, accepted while the outage (if any) had `shape`.
async fn serve(
    inbound: TcpStream,
    target: SocketAddr,
    shape: Option<Shape>,
    mut changes: watch::Receiver<(Option<Shape>, u64)>,
) {
    match shape {
        None | Some(Shape::Frozen) => {}
        Some(Shape::Refused | Shape::Reset) => return reset(inbound),
        Some(Shape::Blackhole) => {
            // Never read, never answered; reset when the host comes back.
            let _ = changes.wait_for(|(now, _)| *now != Some(Shape::Blackhole)).await;
            return reset(inbound);
        }
        Some(Shape::TlsFails) => return fail_tls(inbound).await,
        Some(Shape::ServerError) => return answer_503s(inbound).await,
    }
    let Ok(outbound) = TcpStream::connect(target).await else { return reset(inbound) };
    let _ = outbound.set_nodelay(true);
    forward(inbound, outbound, changes).await;
}

/// Forwards both ways until either side closes or an outage takes the connection.
async fn forward(
    inbound: TcpStream,
    outbound: TcpStream,
    mut changes: watch::Receiver<(Option<Shape>, u64)>,
) {
    changes.mark_unchanged();
    let (mut in_read, mut in_write) = inbound.into_split();
    let (mut out_read, mut out_write) = outbound.into_split();
    let shape = {
        let upstream = async {
            let _ = tokio::io::copy(&mut in_read, &mut out_write).await;
            let _ = out_write.shutdown().await;
        };
        let downstream = async {
            let _ = tokio::io::copy(&mut out_read, &mut in_write).await;
            let _ = in_write.shutdown().await;
        };
        tokio::pin!(upstream, downstream);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                () = &mut upstream, if !up_done => up_done = true,
                () = &mut downstream, if !down_done => down_done = true,
                changed = changes.changed() => match changed {
                    Err(_) => return,
                    Ok(()) => if let Some(shape) = changes.borrow_and_update().0 { break shape },
                },
            }
            if up_done && down_done {
                return;
            }
        }
    };
    // The copies stop here, with whatever they held: bytes in flight are lost.
    let (inbound, outbound) = (
        in_read.reunite(in_write).expect("halves of one stream"),
        out_read.reunite(out_write).expect("halves of one stream"),
    );
    match shape {
        Shape::Frozen => {
            // Silent for good: held until the proxy goes.
            let _ = changes.wait_for(|_| false).await;
            drop((inbound, outbound));
        }
        Shape::Blackhole => {
            let _ = changes.wait_for(|(now, _)| *now != Some(Shape::Blackhole)).await;
            reset(inbound);
            reset(outbound);
        }
        _ => {
            reset(inbound);
            reset(outbound);
        }
    }
}

/// Closes with a reset (RST), not an orderly close: the peer's next read or write fails.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// A TLS handshake that fails: PostgreSQL's `SSLRequest` is accepted with `S` and then the
/// "handshake" is a fatal `handshake_failure` alert; anything else gets the alert's bytes.
async fn fail_tls(mut inbound: TcpStream) {
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    const ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];
    let mut first = [0u8; 8];
    if inbound.read_exact(&mut first).await.is_err() {
        return;
    }
    if first == SSL_REQUEST {
        let _ = inbound.write_all(b"S").await;
        // The client's ClientHello, read and refused.
        let mut hello = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(1), inbound.read(&mut hello)).await;
    }
    let _ = inbound.write_all(&ALERT).await;
    let _ = inbound.shutdown().await;
}

/// Answers every HTTP request on the connection `503 Service Unavailable`.
async fn answer_503s(mut inbound: TcpStream) {
    let body = r#"{"error":{"type":"api_error","message":"no healthy upstream"}}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let Ok((head, mut body_read)) = read_head(&mut inbound).await else { return };
    let length = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    while body_read.len() < length {
        let mut chunk = vec![0; length - body_read.len()];
        match inbound.read(&mut chunk).await {
            Ok(n) if n > 0 => body_read.extend_from_slice(&chunk[..n]),
            _ => return,
        }
    }
    let _ = inbound.write_all(answer.as_bytes()).await;
    let _ = inbound.shutdown().await;
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
    /// Where clients connect.
    pub addr: SocketAddr,
    dropping: Arc<std::sync::Mutex<Option<(String, Fate)>>>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FilterProxy {
    /// Listens on a free loopback port and forwards to `target`.
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

    /// Forwards a request that contains `marker` (its effect happens) and never delivers the
    /// answer, holding the connection until the client gives up: a lost answer. Until
    /// [`FilterProxy::forward_all`].
    pub fn withhold_answers_containing(&self, marker: &str) {
        *self.dropping.lock().expect("not poisoned") = Some((marker.to_owned(), Fate::AnswerWithheld));
    }

    /// Forwards every request again.
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
    AnswerWithheld,
}

async fn forward_one(
    mut inbound: TcpStream,
    target: SocketAddr,
    dropping: &std::sync::Mutex<Option<(String, Fate)>>,
    dropped: &std::sync::atomic::AtomicU64,
) -> anyhow::Result<()> {
    let (head, mut body) = read_head(&mut inbound).await?;
    let length = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    while body.len() < length {
        let mut chunk = vec![0; length - body.len()];
        let n = inbound.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the client closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    let rule = dropping.lock().expect("not poisoned").clone();
    let mut withheld = false;
    if let Some((marker, fate)) = rule {
        let contains = |bytes: &[u8]| bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        withheld = fate == Fate::AnswerWithheld && (contains(head.as_bytes()) || contains(&body));
        if fate != Fate::AnswerWithheld && (contains(head.as_bytes()) || contains(&body)) {
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
    if withheld {
        dropped.fetch_add(1, Ordering::AcqRel);
        // The effect happened; its answer never arrives. Held until the client gives up.
        let mut byte = [0u8; 1];
        let _ = inbound.read(&mut byte).await;
        return Ok(());
    }
    inbound.write_all(&with_connection_close(&answer_head)).await?;
    inbound.write_all(&answer_rest).await?;
    tokio::io::copy(&mut outbound, &mut inbound).await?;
    inbound.shutdown().await?;
    Ok(())
}

/// The header block (up to and including the blank line) and whatever came after it.
async fn read_head(stream: &mut TcpStream) -> anyhow::Result<(String, Vec<u8>)> {
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
