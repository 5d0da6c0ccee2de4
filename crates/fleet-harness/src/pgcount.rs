//! Counts what a process asks of PostgreSQL: a proxy that forwards a plaintext connection
//! (`sslmode=disable`) and reads the client's side of the protocol as it passes.
//!
//! A **round trip** is one exchange the client waits on: a simple `Query`, or a run of
//! extended-protocol messages ended by `Sync` (a prepared statement's parse, bind and execute
//! go in one). A **ping** is a `Sync` sent alone: what sqlx sends to test a connection
//! (`Connection::ping`), on acquire (`test_before_acquire`) and on release. The protocol is
//! PostgreSQL's documented one (postgresql.org/docs/current/protocol-flow.html): after the
//! untyped startup message, every frontend message is a type byte and a length.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the connections through one counter asked so far.
#[derive(Debug, Default)]
pub struct Counts {
    /// Connections opened.
    pub connections: AtomicU64,
    /// Round trips, pings included.
    pub round_trips: AtomicU64,
    /// Of those, pings: a `Sync` sent alone.
    pub pings: AtomicU64,
    /// Statements run: an `Execute` of a prepared statement, or a simple `Query`. A statement
    /// prepared on a connection for the first time costs a round trip more, but is one statement;
    /// sqlx's lookup of the database's own types on a new connection (a `Query` beginning
    /// [`TYPE_LOOKUP`]) is not one.
    pub statements: AtomicU64,
    /// Transactions ended, read from the server's side: a `ReadyForQuery` that reports the
    /// connection idle (`I`) after at least one statement was prepared, completed or failed
    /// since the last one. A statement outside `BEGIN` is a transaction of its own, and so is
    /// a statement's preparation (`Parse`, `Describe`, `Sync`), as `pg_stat_database` counts
    /// them; a ping (`Sync` alone) is none.
    pub transactions: AtomicU64,
}

impl Counts {
    /// (connections, round trips, pings) now.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.connections.load(Ordering::Relaxed),
            self.round_trips.load(Ordering::Relaxed),
            self.pings.load(Ordering::Relaxed),
        )
    }

    /// Statements run so far.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Transactions ended so far.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }
}

/// How sqlx's type resolver begins the query with which it learns, once per connection, the
/// oids of the database's own types (sqlx-postgres, `connection/resolve.rs`).
pub const TYPE_LOOKUP: &[u8] = b"SELECT pg_type.oid";

/// A counting proxy in front of one PostgreSQL server.
pub struct PgCounter {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// What they asked.
    pub counts: Arc<Counts>,
    /// Milliseconds by which the server's answers are held before they are passed on (0: none):
    /// for a test that needs a statement's answer to come late, such as a `BEGIN`'s while the
    /// future waiting for it is dropped.
    pub answers_held_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PgCounter {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let answers_held_ms = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (counts, held) = (counts.clone(), answers_held_ms.clone());
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    tokio::spawn(forward(inbound, target, counts.clone(), held.clone()));
                }
            }
        });
        Ok(Self { addr, counts, answers_held_ms, task })
    }

    /// A counter in front of the server `database_url` names, and that URL pointed at it.
    pub async fn in_front_of(database_url: &str) -> anyhow::Result<(Self, String)> {
        let counter = Self::start(Self::server_of(database_url)?).await?;
        let url = counter.url_for(database_url)?;
        Ok((counter, url))
    }

    /// The TCP address of the server a `postgres://` URL names.
    pub fn server_of(url: &str) -> anyhow::Result<SocketAddr> {
        let url = url::Url::parse(url)?;
        let host = url.host_str().unwrap_or("127.0.0.1").replace("localhost", "127.0.0.1");
        Ok(format!("{host}:{}", url.port().unwrap_or(5432)).parse()?)
    }

    /// `url` (a `postgres://` URL) pointed at this proxy, without TLS so it can be read.
    pub fn url_for(&self, url: &str) -> anyhow::Result<String> {
        let mut url = url::Url::parse(url)?;
        url.set_host(Some(&self.addr.ip().to_string()))?;
        url.set_port(Some(self.addr.port())).map_err(|()| anyhow::anyhow!("no port in {url}"))?;
        let kept: Vec<(String, String)> =
            url.query_pairs().filter(|(k, _)| k != "sslmode").map(|(k, v)| (k.into(), v.into())).collect();
        url.query_pairs_mut().clear().extend_pairs(kept).append_pair("sslmode", "disable");
        Ok(url.to_string())
    }
}

impl Drop for PgCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `application_name` of the fleet's Stripe budget's own connections
/// (`orderfleet_runtime::budget`): their ticks come with time, not with orders, so what an
/// order costs is counted without them.
const STRIPE_BUDGET: &[u8] = b"stripe-budget";

/// The client's startup message, whole: its length, then the rest.
async fn startup(read: &mut tokio::net::tcp::OwnedReadHalf) -> Option<Vec<u8>> {
    let mut message = vec![0u8; 4];
    read.read_exact(&mut message).await.ok()?;
    let length = u32::from_be_bytes(message[..4].try_into().ok()?) as usize;
    let mut rest = vec![0u8; length.saturating_sub(4)];
    read.read_exact(&mut rest).await.ok()?;
    message.extend(rest);
    Some(message)
}

async fn forward(inbound: TcpStream, target: SocketAddr, counts: Arc<Counts>, held: Arc<AtomicU64>) {
    let Ok(outbound) = TcpStream::connect(target).await else { return };
    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
    let (mut in_read, mut in_write) = inbound.into_split();
    let (mut out_read, mut out_write) = outbound.into_split();
    let Some(first) = startup(&mut in_read).await else { return };
    let counts = match first.windows(STRIPE_BUDGET.len()).any(|w| w == STRIPE_BUDGET) {
        true => Arc::new(Counts::default()),
        false => counts,
    };
    counts.connections.fetch_add(1, Ordering::Relaxed);
    if out_write.write_all(&first).await.is_err() {
        return;
    }
    let upstream = async {
        let mut frames = Frames::default();
        frames.feed(&first, &counts);
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = in_read.read(&mut buf).await {
            if n == 0 {
                break;
            }
            // Counted before it is sent on, so a count read after the answer includes it.
            frames.feed(&buf[..n], &counts);
            if out_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = out_write.shutdown().await;
    };
    let downstream = async {
        let mut replies = Replies::default();
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = out_read.read(&mut buf).await {
            if n == 0 {
                break;
            }
            replies.feed(&buf[..n], &counts);
            let hold = held.load(Ordering::Relaxed);
            if hold > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(hold)).await;
            }
            if in_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = in_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// The client's messages, read from the bytes as they come.
#[derive(Default)]
struct Frames {
    /// Past the untyped startup message.
    started: bool,
    /// The header read so far: the type byte (after startup) and the length.
    header: Vec<u8>,
    /// Bytes of the current message's body still to skip.
    remaining: usize,
    /// Whether a message other than `Sync` came since the last `Sync`.
    pending: bool,
    /// The start of a simple `Query`'s text, while it is read (to tell a type lookup).
    query: Option<Vec<u8>>,
}

impl Frames {
    fn feed(&mut self, mut bytes: &[u8], counts: &Counts) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let skip = self.remaining.min(bytes.len());
                self.read_query(&bytes[..skip], skip == self.remaining, counts);
                self.remaining -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let header_len = if self.started { 5 } else { 4 };
            let take = (header_len - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() < header_len {
                return;
            }
            let length_at = header_len - 4;
            let length = u32::from_be_bytes(self.header[length_at..].try_into().expect("4 bytes")) as usize;
            if self.started {
                self.message(self.header[0], counts);
            }
            self.started = true;
            self.remaining = length.saturating_sub(4);
            self.header.clear();
        }
    }

    /// Reads `body`, a piece of the current message, into a `Query`'s start; `last` when the
    /// message ends with it.
    fn read_query(&mut self, body: &[u8], last: bool, counts: &Counts) {
        let Some(start) = self.query.as_mut() else { return };
        let want = TYPE_LOOKUP.len().saturating_sub(start.len()).min(body.len());
        start.extend_from_slice(&body[..want]);
        if start.len() == TYPE_LOOKUP.len() || last {
            if start.as_slice() == TYPE_LOOKUP {
                counts.statements.fetch_sub(1, Ordering::Relaxed);
            }
            self.query = None;
        }
    }

    fn message(&mut self, kind: u8, counts: &Counts) {
        match kind {
            b'S' => {
                counts.round_trips.fetch_add(1, Ordering::Relaxed);
                if !self.pending {
                    counts.pings.fetch_add(1, Ordering::Relaxed);
                }
                self.pending = false;
            }
            b'Q' => {
                counts.round_trips.fetch_add(1, Ordering::Relaxed);
                counts.statements.fetch_add(1, Ordering::Relaxed);
                self.pending = false;
                self.query = Some(Vec::with_capacity(TYPE_LOOKUP.len()));
            }
            b'E' => {
                counts.statements.fetch_add(1, Ordering::Relaxed);
                self.pending = true;
            }
            _ => self.pending = true,
        }
    }
}

/// The server's messages, read from the bytes as they come (every one typed, from the first:
/// the client asks for no TLS).
#[derive(Default)]
struct Replies {
    /// The header read so far: the type byte and the length.
    header: Vec<u8>,
    /// The current message's type, and its body's bytes still to skip.
    kind: u8,
    remaining: usize,
    /// Whether a statement completed or failed since the last `ReadyForQuery`.
    worked: bool,
}

impl Replies {
    fn feed(&mut self, mut bytes: &[u8], counts: &Counts) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                if self.kind == b'Z' && bytes[0] == b'I' && std::mem::take(&mut self.worked) {
                    counts.transactions.fetch_add(1, Ordering::Relaxed);
                }
                if self.kind == b'Z' {
                    self.worked = false;
                }
                let skip = self.remaining.min(bytes.len());
                self.remaining -= skip;
                self.kind = if self.remaining > 0 { 0 } else { self.kind };
                bytes = &bytes[skip..];
                continue;
            }
            let take = (5 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() < 5 {
                return;
            }
            self.kind = self.header[0];
            // CommandComplete, ErrorResponse: a statement ended, in or out of a transaction;
            // ParseComplete: a statement prepared, which the server does in a transaction too.
            self.worked |= matches!(self.kind, b'C' | b'E' | b'1');
            let length = u32::from_be_bytes(self.header[1..].try_into().expect("4 bytes")) as usize;
            self.remaining = length.saturating_sub(4);
            self.header.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_statement_a_ping_a_simple_query_and_a_type_lookup_are_four_round_trips_one_a_ping_two_statements() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&12u32.to_be_bytes()); // startup: length, then 8 bytes
        stream.extend_from_slice(&[0, 3, 0, 0, b'u', 0, b'x', 0]);
        stream.extend(message(b'P', b"\0SELECT 1\0\0\0"));
        stream.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
        stream.extend(message(b'E', b"\0\0\0\0\0"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', b"BEGIN\0"));
        stream.extend(message(b'Q', b"SELECT pg_type.oid, typname FROM pg_type\0"));
        for chunk in [1, 2, 3, 7, stream.len()] {
            let (counts, mut frames) = (Counts::default(), Frames::default());
            for piece in stream.chunks(chunk) {
                frames.feed(piece, &counts);
            }
            assert_eq!(counts.read(), (0, 4, 1), "in chunks of {chunk}");
            assert_eq!(counts.statements(), 2, "in chunks of {chunk}");
        }
    }

    #[test]
    fn a_statement_a_block_a_failure_and_a_preparation_are_transactions_and_a_ping_is_none() {
        let mut stream = Vec::new();
        stream.extend(message(b'R', &[0, 0, 0, 0])); // AuthenticationOk
        stream.extend(message(b'Z', b"I")); // ready after startup: nothing ran
        stream.extend(message(b'1', b"")); // a statement alone: parsed, bound, a row, done
        stream.extend(message(b'2', b""));
        stream.extend(message(b'D', b"\0\x01\0\0\0\x01I"));
        stream.extend(message(b'C', b"SELECT 1\0"));
        stream.extend(message(b'Z', b"I"));
        stream.extend(message(b'Z', b"I")); // a ping
        stream.extend(message(b'C', b"BEGIN\0"));
        stream.extend(message(b'Z', b"T"));
        stream.extend(message(b'C', b"UPDATE 1\0"));
        stream.extend(message(b'Z', b"T"));
        stream.extend(message(b'C', b"COMMIT\0"));
        stream.extend(message(b'Z', b"I"));
        stream.extend(message(b'E', b"SERROR\0\0")); // a statement that failed: rolled back
        stream.extend(message(b'Z', b"I"));
        stream.extend(message(b'1', b"")); // a statement prepared: parsed, described
        stream.extend(message(b't', b"\0\0"));
        stream.extend(message(b'n', b""));
        stream.extend(message(b'Z', b"I"));
        for chunk in [1, 2, 3, 7, stream.len()] {
            let (counts, mut replies) = (Counts::default(), Replies::default());
            for piece in stream.chunks(chunk) {
                replies.feed(piece, &counts);
            }
            assert_eq!(counts.transactions(), 4, "in chunks of {chunk}");
        }
    }
}
