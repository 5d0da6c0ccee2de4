//! The fleet's PostgreSQL connection pool: sqlx's connections, held by bb8, given back without a
//! round trip.
//!
//! sqlx's own pool pings every connection it takes back, with no deadline, and cannot be told
//! not to: for the fleet's statements, that makes two round trips in three a ping
//! (docs/decisions/0001-the-fleets-own-postgresql-pool.md). It also keeps a connection
//! whose `BEGIN` was cut off by a dropped future, still inside that transaction, so the next
//! user's statements run in it (sqlx #4393; `tests/e2e/pool.rs` shows it). This pool follows
//! the rules pgx's pgxpool keeps instead:
//! - a connection given back after a step that finished is kept, with no ping;
//! - one whose step did not finish — its future dropped (a client gone, a deadline), or an
//!   error that was not the server's answer, or a transaction neither committed nor rolled
//!   back — is closed, never reused: nobody knows what state it is in. The server rolls back
//!   whatever it had open when the connection closes;
//! - one that sat idle for a second or more is pinged, within a deadline, before it is handed
//!   out: idle is when a NAT or a firewall forgets a flow, or a restarted server leaves it dead;
//! - each connection lives at most [`MAX_LIFETIME`] and sits idle at most [`IDLE_TIMEOUT`].
//!
//! A step is [`Pool`] used as an executor (one statement: `query!(…).fetch_one(&pool)`), or a
//! transaction from [`Pool::begin`], which ends in [`Tx::commit`] or [`Tx::rollback`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::postgres::{
    PgConnectOptions, PgDatabaseError, PgQueryResult, PgRow, PgSeverity, PgStatement, PgTypeInfo,
};
use sqlx::{Connection, Either, Execute, Executor, PgConnection, Postgres, SqlStr};

/// How long a connection may sit idle and still be handed out without a ping.
pub const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(1);

/// How long that ping may take; a connection that misses it is closed and another one tried.
const PING_DEADLINE: Duration = Duration::from_secs(2);

/// How long a connection lives: a server's memory per backend grows with what it has cached,
/// and a failover's new primary gets the fleet's connections within this long.
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// How long a connection may sit idle before it is closed (bb8's reaper, every 30 s, closes
/// any such one and opens new ones up to the pool's minimum).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How long opening a connection may take: bb8 bounds none, and a host that drops packets
/// would hold each attempt for the kernel's SYN timeout, about two minutes.
const CONNECT_DEADLINE: Duration = Duration::from_secs(5);

/// Opens a connection within [`CONNECT_DEADLINE`].
async fn open(options: &PgConnectOptions) -> sqlx::Result<PgConnection> {
    match tokio::time::timeout(CONNECT_DEADLINE, PgConnection::connect_with(options)).await {
        Ok(opened) => opened,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection to PostgreSQL within {CONNECT_DEADLINE:?}"),
        ))),
    }
}

/// Every pool of this process that is still in use, by name, for `/metrics` ([`record_all`]).
type Observed = Vec<(String, std::sync::Weak<bb8::Pool<Connector>>)>;

fn observed() -> std::sync::MutexGuard<'static, Observed> {
    static POOLS: std::sync::Mutex<Observed> = std::sync::Mutex::new(Vec::new());
    POOLS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sets the figures of every pool still in use on `/metrics`, as it is scraped, and forgets
/// the pools dropped.
pub(crate) fn record_all() {
    let mut pools = observed();
    pools.retain(|(_, pool)| pool.strong_count() > 0);
    for (name, pool) in pools.iter() {
        if let Some(pool) = pool.upgrade() {
            record(name, &pool);
        }
    }
}

/// The pool. Cloning it is cheap: the clones share one set of connections.
#[derive(Clone)]
pub struct Pool {
    /// bb8's pool, shared by the clones; [`observed`] holds it weakly.
    inner: Arc<bb8::Pool<Connector>>,
    /// The options a connection is opened with, for a connection of its own ([`Pool::dedicated`]).
    options: Arc<PgConnectOptions>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.state();
        f.debug_struct("Pool")
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .finish()
    }
}

/// What bb8 asks of a connection: how to open one, whether one idle is still alive, and whether
/// one given back may be kept.
struct Connector {
    options: Arc<PgConnectOptions>,
}

/// A connection as the pool keeps it.
pub struct Link {
    raw: PgConnection,
    /// Set from the moment a step takes the connection until the step has finished; a link
    /// given back with it set is closed.
    unfinished: bool,
    /// When the link was last given back (or opened).
    idle_since: Instant,
}

impl Link {
    /// A connection just opened: finished, and idle from now.
    fn opened(raw: PgConnection) -> Self {
        Self { raw, unfinished: false, idle_since: Instant::now() }
    }
}

impl bb8::ManageConnection for Connector {
    type Connection = Link;
    type Error = sqlx::Error;

    async fn connect(&self) -> Result<Link, sqlx::Error> {
        open(&self.options).await.map(Link::opened)
    }

    async fn is_valid(&self, link: &mut Link) -> Result<(), sqlx::Error> {
        if link.idle_since.elapsed() < PING_WHEN_IDLE_FOR {
            return Ok(());
        }
        // A checkout dropped during the ping gives the link back with this still set.
        link.unfinished = true;
        match tokio::time::timeout(PING_DEADLINE, link.raw.ping()).await {
            Ok(Ok(())) => {
                link.unfinished = false;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(sqlx::Error::Io(std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// Called by bb8 on every link given back, with no I/O: keep it unless its step did not
    /// finish. (bb8 also drops one past [`MAX_LIFETIME`].)
    fn has_broken(&self, link: &mut Link) -> bool {
        link.idle_since = Instant::now();
        link.unfinished
    }
}

/// How big a pool is and how long a step may wait for a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most connections open at once.
    pub max_connections: u32,
    /// Kept open, idle or not.
    pub min_connections: u32,
    /// How long a step waits for a connection before it fails with `PoolTimedOut`.
    pub acquire_timeout: Duration,
}

impl Pool {
    /// A pool that starts opening `min_connections` in the background and returns at once, so
    /// a process starts while the database is still coming up; it opens more as steps need
    /// them.
    pub fn lazy(options: PgConnectOptions, limits: Limits) -> Self {
        let options = Arc::new(options);
        let inner = bb8::Pool::builder()
            .max_size(limits.max_connections.max(1))
            .min_idle(Some(limits.min_connections.min(limits.max_connections)))
            .connection_timeout(limits.acquire_timeout)
            .max_lifetime(Some(MAX_LIFETIME))
            .idle_timeout(Some(IDLE_TIMEOUT))
            .test_on_check_out(true)
            // The connection given back last is handed out first: a steady trickle of steps
            // keeps reusing a few warm ones (no ping: they were idle under a second), and the
            // rest age out at the idle limit. (bb8's default, the oldest first, would make
            // every checkout in a quiet spell a ping.) pgxpool keeps its idle ones as a stack too.
            .queue_strategy(bb8::QueueStrategy::Lifo)
            .error_sink(Box::new(LogConnectErrors))
            .build_unchecked(Connector { options: options.clone() });
        let pool = Self { inner: Arc::new(inner), options };
        observed().push((pool.name(), Arc::downgrade(&pool.inner)));
        pool
    }

    /// Its name on `/metrics`: its connections' `application_name`.
    fn name(&self) -> String {
        self.options.get_application_name().unwrap_or("orderfleet").to_owned()
    }

    /// A pool of its own on the same database, its connections named `application_name`, for
    /// steps that must not queue behind this pool's (the payments crate's budget ticks, which
    /// keep a lease). It opens `limits.min_connections` in the background at once, and keeps them.
    pub fn sibling(&self, application_name: &str, limits: Limits) -> Self {
        let options = (*self.options).clone().application_name(application_name);
        Self::lazy(options, limits)
    }

    /// A pool with one connection open now: fails at once, with the server's reason, when the
    /// database cannot be reached.
    pub async fn connected(options: PgConnectOptions, limits: Limits) -> sqlx::Result<Self> {
        let pool = Self::lazy(options, limits);
        let first = Link::opened(open(&pool.options).await?);
        // The pool has room for it: it has opened none yet, or fewer than its maximum.
        let _ = pool.inner.add(first);
        Ok(pool)
    }

    /// A connection for a step of the caller's own, marked unfinished until [`Conn::finished`].
    async fn checkout(&self) -> sqlx::Result<Conn> {
        let mut conn = self.inner.get_owned().await.map_err(|e| match e {
            bb8::RunError::User(e) => e,
            bb8::RunError::TimedOut => sqlx::Error::PoolTimedOut,
        })?;
        conn.unfinished = true;
        Ok(Conn(conn))
    }

    /// Begins a transaction: one round trip. The connection's settings (statement and
    /// idle-in-transaction timeouts) were set when it was opened, so the transaction needs none
    /// of its own.
    pub async fn begin(&self) -> sqlx::Result<Tx> {
        let mut conn = self.checkout().await?;
        conn.raw.execute("BEGIN").await?;
        Ok(Tx { conn })
    }

    /// Whether a session of the pool's takes writes (`transaction_read_only` off: not a standby,
    /// nor read-only by a setting). A read-only one is closed, not kept: a session stays
    /// read-only for its life, and the next one opened may reach a writable primary.
    pub async fn writable(&self) -> sqlx::Result<bool> {
        let mut conn = self.checkout().await?;
        let read_only =
            sqlx::query_scalar!(r#"SELECT current_setting('transaction_read_only') AS "read_only!""#)
                .fetch_one(&mut conn.raw)
                .await?;
        let writable = read_only == "off";
        if writable {
            conn.finished();
        }
        Ok(writable)
    }

    /// A connection outside the pool, with the options the pool's connections have: for a
    /// `LISTEN`, or for migrations (which may take longer than a statement's timeout: the caller
    /// lifts it).
    pub async fn dedicated(&self) -> sqlx::Result<PgConnection> {
        open(&self.options).await
    }

    /// A sqlx pool of one connection, opened with the same options: sqlx's `PgListener` (the
    /// relay's `LISTEN`) takes its connection from one, and holds it for as long as it listens.
    pub fn for_listener(&self) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(CONNECT_DEADLINE)
            .connect_lazy_with((*self.options).clone())
    }
}

/// Sets a pool's figures on `/metrics` from bb8's: connections open and idle, the checkouts
/// that went straight through, waited or timed out, the time spent waiting, and the
/// connections opened and closed (by why).
fn record(pool: &str, inner: &bb8::Pool<Connector>) {
    let state = inner.state();
    let stats = &state.statistics;
    let pool = pool.to_owned();
    metrics::gauge!(crate::metrics::DB_POOL_CONNECTIONS.name, "pool" => pool.clone())
        .set(f64::from(state.connections));
    metrics::gauge!(crate::metrics::DB_POOL_IDLE_CONNECTIONS.name, "pool" => pool.clone())
        .set(f64::from(state.idle_connections));
    for (outcome, n) in
        [("direct", stats.get_direct), ("waited", stats.get_waited), ("timed_out", stats.get_timed_out)]
    {
        metrics::counter!(crate::metrics::DB_POOL_CHECKOUTS.name, "pool" => pool.clone(), "outcome" => outcome)
            .absolute(n);
    }
    metrics::gauge!(crate::metrics::DB_POOL_CHECKOUT_WAIT.name, "pool" => pool.clone())
        .set(stats.get_wait_time.as_secs_f64());
    metrics::counter!(crate::metrics::DB_POOL_CONNECTIONS_OPENED.name, "pool" => pool.clone())
        .absolute(stats.connections_created);
    let closed = [
        ("broken", stats.connections_closed_broken),
        ("invalid", stats.connections_closed_invalid),
        ("max_lifetime", stats.connections_closed_max_lifetime),
        ("idle_timeout", stats.connections_closed_idle_timeout),
    ];
    for (why, n) in closed {
        metrics::counter!(crate::metrics::DB_POOL_CONNECTIONS_CLOSED.name, "pool" => pool.clone(), "why" => why)
            .absolute(n);
    }
}

/// Whether an error with SQLSTATE `code` says the session cannot do the fleet's work, so a new
/// one should be opened: `25006` (`read_only_sql_transaction`: a standby, a writer a failover
/// demoted, a role or database set read-only, each of which a session keeps for its life),
/// class `58` (a system error: the server's disk or files) and class `XX` (an internal error).
/// A new session after a failover reaches the new primary.
pub fn unfit_session(code: &str) -> bool {
    code == READ_ONLY || code.starts_with("58") || code.starts_with("XX")
}

/// SQLSTATE `read_only_sql_transaction`.
pub const READ_ONLY: &str = "25006";

/// bb8 opens connections in the background (the pool's minimum, a replacement for one closed)
/// and reports their failures here; a step waiting for a connection then fails with
/// `PoolTimedOut` after its acquire timeout. The reason is logged so an operator sees it.
#[derive(Debug, Clone, Copy)]
struct LogConnectErrors;

impl bb8::ErrorSink<sqlx::Error> for LogConnectErrors {
    fn sink(&self, error: sqlx::Error) {
        tracing::warn!(error = %error, "a connection to PostgreSQL failed to open, or to answer its check");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<sqlx::Error>> {
        Box::new(*self)
    }
}

/// A connection taken for one step.
struct Conn(bb8::PooledConnection<'static, Connector>);

impl Conn {
    /// The step finished: the connection is idle, outside any transaction, and may be kept.
    fn finished(&mut self) {
        self.0.unfinished = false;
    }

    /// A single statement's outcome: finished if the server answered it, whether with rows or
    /// with an error the session survives (outside a transaction, a statement's `ERROR` leaves
    /// the session as it was). A `FATAL` or `PANIC` one ends the session (a restart's
    /// `terminating connection due to administrator command`), one that says the session
    /// cannot do the work ([`unfit_session`]) makes it useless, and any other error (the
    /// connection, the protocol) leaves it unknown: the connection is closed.
    fn settle<T>(&mut self, outcome: &sqlx::Result<T>) {
        let survived = match outcome {
            Ok(_) => true,
            Err(sqlx::Error::Database(e)) => e.try_downcast_ref::<PgDatabaseError>().is_some_and(|e| {
                !matches!(e.severity(), PgSeverity::Fatal | PgSeverity::Panic) && !unfit_session(e.code())
            }),
            Err(_) => false,
        };
        if survived {
            self.finished();
        }
    }
}

impl std::ops::Deref for Conn {
    type Target = Link;
    fn deref(&self) -> &Link {
        &self.0
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Link {
        &mut self.0
    }
}

/// A transaction on a connection of the pool's. Its statements run on `&mut *tx`, as on a
/// `PgConnection`. Dropped without [`Tx::commit`] or [`Tx::rollback`] (an error returned early,
/// a future dropped), its connection is closed and the server rolls the transaction back.
pub struct Tx {
    conn: Conn,
}

impl Tx {
    /// Commits. The connection goes back to the pool only if the commit was answered.
    pub async fn commit(mut self) -> sqlx::Result<()> {
        self.conn.raw.execute("COMMIT").await?;
        self.conn.finished();
        Ok(())
    }

    /// Rolls back, keeping the connection: for a transaction that found nothing to do.
    pub async fn rollback(mut self) -> sqlx::Result<()> {
        self.conn.raw.execute("ROLLBACK").await?;
        self.conn.finished();
        Ok(())
    }
}

impl std::ops::Deref for Tx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn.raw
    }
}

impl std::ops::DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn.raw
    }
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tx")
    }
}

/// One statement on a connection of the pool's, given back when it has been answered. The
/// rows are read in full before they are handed on, so the connection is back in the pool
/// before the caller sees the first: the fleet's statements answer a handful of rows.
impl<'p> Executor<'p> for &'_ Pool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, sqlx::Result<Either<PgQueryResult, PgRow>>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.clone();
        stream::once(async move {
            let mut conn = pool.checkout().await?;
            let answered: sqlx::Result<Vec<_>> = conn.raw.fetch_many(query).try_collect().await;
            conn.settle(&answered);
            answered
        })
        .map_ok(|steps| stream::iter(steps.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, sqlx::Result<Option<PgRow>>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut conn = pool.checkout().await?;
            let answered = conn.raw.fetch_optional(query).await;
            conn.settle(&answered);
            answered
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, sqlx::Result<PgStatement>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut conn = pool.checkout().await?;
            let answered = conn.raw.prepare_with(sql, parameters).await;
            conn.settle(&answered);
            answered
        })
    }

    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, sqlx::Result<sqlx::Describe<Postgres>>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut conn = pool.checkout().await?;
            let answered = conn.raw.describe(sql).await;
            conn.settle(&answered);
            answered
        })
    }
}
