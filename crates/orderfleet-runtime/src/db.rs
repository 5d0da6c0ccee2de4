//! The PostgreSQL pool and the embedded migrations.
//!
//! **How the fleet's SQL is written.** Every statement is a query macro (`sqlx::query!`,
//! `query_as!`, `query_scalar!`, and `domain::order`'s `query_order!` for a statement that
//! answers an order), so its text is static and checked when the code builds: its syntax, its
//! columns and their types and nullability, and its parameters, against the migrated schema.
//! The build reads what the schema says from the checked-in `.sqlx/` (`SQLX_OFFLINE`, set in
//! `.cargo/config.toml`), so it needs no database; `make test` describes every statement again
//! against the migrated database and fails when `.sqlx/` differs (`scripts/sqlx-data.sh
//! check`; `write` renews it). No statement of the fleet's is text put together at run time.
//! The rules a statement follows:
//! - a set of order statuses is one of SPEC §5's, a function of migration `status_sets`
//!   (`holds_units(status)`, …); one status a compare-and-set expects is written in the
//!   statement (`status = 'authorized'`), never passed: PostgreSQL refuses a misspelt one
//!   when the macro prepares the statement, and a status that varies is bound typed
//!   (`$2::order_status`, `from as _`);
//! - a statement of more than five arguments is a file beside its module (`transition.sql`),
//!   its arguments named once in its `args` row;
//! - a typed parameter (`OrderId`, `Sku`, an enum) is bound `as _`, and a typed column is
//!   named with its Rust type (`id AS "id: OrderId"`);
//! - a number of milliseconds multiplies `interval '1 ms'` as `$n::int8`.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;
use sqlx::postgres::PgConnectOptions;

use crate::config::DatabaseConfig;
use crate::failure::{Failure, Kind, Source};
use crate::pool::Limits;
pub use crate::pool::{Pool, Tx};

/// The schema, embedded at build time from `migrations/` at the repository root.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// How big a pool a process gets, and what it is called. Bounded so that a burst cannot open
/// more connections than PostgreSQL allows (100 by default), which every process of the fleet
/// shares: the intake takes 16, a stock worker 8, the relay and the notification worker 4 each.
#[derive(Debug, Clone, Copy)]
pub struct PoolSize {
    /// The most connections the pool opens.
    pub max_connections: u32,
    /// Kept open, so a burst after a quiet spell does not wait for new connections.
    pub min_connections: u32,
    /// How long a statement may wait for a connection.
    pub acquire_timeout: Duration,
    /// The process's name in `pg_stat_activity` (`application_name`), unless `DATABASE_URL`
    /// names one.
    pub application_name: &'static str,
}

impl Default for PoolSize {
    fn default() -> Self {
        Self {
            max_connections: 10,
            min_connections: 2,
            acquire_timeout: Duration::from_secs(5),
            application_name: "orderfleet",
        }
    }
}

impl PoolSize {
    fn limits(self) -> Limits {
        Limits {
            max_connections: self.max_connections,
            min_connections: self.min_connections,
            acquire_timeout: self.acquire_timeout,
        }
    }
}

/// Connects lazily: the pool opens connections on first use, so a binary starts (and serves
/// `/healthz`) while the database is still coming up, and recovers by itself after an outage.
pub fn connect_lazy(config: &DatabaseConfig, size: PoolSize) -> anyhow::Result<Pool> {
    warn_if_unverified(config);
    Ok(Pool::lazy(session_options(config, size)?, size.limits()))
}

/// A pool on a port nobody listens on, for unit tests (the domain's too) that build a client
/// and never ask the database anything.
pub fn unreachable_pool() -> Pool {
    let env = crate::config::Env::from_pairs([("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none")]);
    let config = DatabaseConfig::from_env(&env).expect("a well-formed URL");
    connect_lazy(&config, PoolSize { min_connections: 0, ..PoolSize::default() }).expect("a lazy pool")
}

/// Connects now, failing when the database is unreachable (for one-shot commands).
pub async fn connect(config: &DatabaseConfig, size: PoolSize) -> anyhow::Result<Pool> {
    warn_if_unverified(config);
    Pool::connected(session_options(config, size)?, size.limits())
        .await
        .context("failed to connect to PostgreSQL (DATABASE_URL)")
}

/// What every connection of the fleet's is opened with. The settings travel in the startup
/// message, so they cost no round trip, once per connection:
/// - `statement_timeout` ([`STATEMENT_TIMEOUT`]): a statement the server is still running past it
///   is cancelled (SQLSTATE 57014, an outage), so a slow statement on a live server ends as
///   the server's error before the client's own deadline ([`STEP_DEADLINE`]), which is left for
///   a server that does not answer at all;
/// - `idle_in_transaction_session_timeout` ([`IDLE_IN_TRANSACTION`]): the server ends a
///   transaction whose client went quiet inside it. A connection frozen between two of its
///   statements would otherwise keep its row locks — a product's row, which every reservation
///   and the door wait on — until the kernel gives up on the connection, hours later;
/// - `application_name`: which process a backend serves, in `pg_stat_activity`.
///
/// (PgBouncer in transaction mode refuses startup options it does not know unless it is told to
/// ignore them: `ignore_startup_parameters = options`, and then these settings must be set on
/// the database's role instead: `ALTER ROLE … SET statement_timeout = '5s'`.)
fn session_options(config: &DatabaseConfig, size: PoolSize) -> anyhow::Result<PgConnectOptions> {
    let options = PgConnectOptions::from_str(config.url.expose_secret())
        .context("failed to parse DATABASE_URL into connection options")?;
    let options = match options.get_application_name() {
        Some(_) => options,
        None => options.application_name(size.application_name),
    };
    Ok(options.options([
        ("statement_timeout", format!("{}ms", STATEMENT_TIMEOUT.as_millis())),
        ("idle_in_transaction_session_timeout", format!("{}ms", IDLE_IN_TRANSACTION.as_millis())),
    ]))
}

/// How long the server runs one of the fleet's statements before it cancels it. They take
/// milliseconds; one that takes seconds waits on a lock held by a client that went quiet.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a worker's database step (a statement, or one short transaction) may take before
/// it counts as unanswered. The steps hold no lock across a network call and take
/// milliseconds; one that takes this long is on a connection that froze mid-exchange, or on a
/// server that stopped answering, and waiting longer only holds the message.
pub(crate) const STEP_DEADLINE: Duration = Duration::from_secs(10);

/// A database step that got no answer within its deadline ([`bounded`]).
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer within {0:?}")]
pub struct Unanswered(pub Duration);

/// Runs one database step within `STEP_DEADLINE`; past it the step is dropped (its connection
/// is closed, so a transaction it had open rolls back) and the error is [`Unanswered`], an
/// outage to [`failure`].
pub async fn bounded<T>(
    what: &'static str,
    step: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(STEP_DEADLINE, step).await {
        Ok(result) => result,
        Err(_) => Err(anyhow::Error::new(Unanswered(STEP_DEADLINE)).context(what)),
    }
}

/// Begins a transaction ([`Pool::begin`]), for a caller whose errors are `anyhow`.
pub async fn begin(pool: &Pool) -> anyhow::Result<Tx> {
    pool.begin().await.context("failed to begin a transaction")
}

/// How long a transaction may sit idle, waiting for its client, before the server ends it and
/// frees its locks: above [`STEP_DEADLINE`], so only a client that has given up meets it.
pub(crate) const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(15);

/// Whether the database answers and takes writes, within the step deadline (a worker's probe
/// while it is paused): `SELECT 1` answers on a standby or a read-only session too, where
/// every write of the fleet's fails ([`Pool::writable`]).
pub async fn probe(pool: &Pool) -> Result<(), String> {
    let writable = async { pool.writable().await.map_err(anyhow::Error::from) };
    match bounded("failed to probe the database", writable).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            Err("PostgreSQL: the session is read-only (a standby, or read-only by a setting)".into())
        }
        Err(e) => Err(format!("PostgreSQL: {e:#}")),
    }
}

fn warn_if_unverified(config: &DatabaseConfig) {
    if config.unverified_tls {
        tracing::warn!(
            "DATABASE_URL: the connection is encrypted but the server's certificate is not checked; use sslmode=verify-full"
        );
    }
}

/// Applies every migration not yet applied. Safe to repeat and to run from several processes
/// at once: sqlx takes an advisory lock for the duration. It runs on a connection of its own
/// without the fleet's statement timeout: waiting for another process's migrations, or an
/// index built over a large table, takes longer than any statement of the fleet's.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    use sqlx::{Connection, Executor};
    let mut conn = pool.dedicated().await.context("failed to connect to PostgreSQL to migrate")?;
    conn.execute("SET statement_timeout = 0").await.context("failed to lift the statement timeout")?;
    MIGRATOR.run(&mut conn).await.context("failed to apply migrations")?;
    conn.close().await.context("failed to close the migration's connection")
}

/// Whether the database refused the statement for good: an integrity constraint (23), a data
/// exception (22), or an error raised on purpose by a trigger or a function (P0). Running it
/// again refuses it again; what it was for has failed, not the database.
pub fn refused_for_good(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if is_refusal(&e.code().unwrap_or_default()))
}

fn is_refusal(code: &str) -> bool {
    matches!(&code[..code.len().min(2)], "23" | "22" | "P0")
}

/// A database error as a [`Failure`], classified where it happens.
///
/// What a cut connection looks like depends on where in the exchange it comes and on TLS: a
/// reset is `Io`, but a cut during the TLS request is a `Protocol` error ("unexpected response
/// from SSLRequest"), a cut inside TLS a `Tls` one, a server gone quiet [`Unanswered`] or a
/// pool timeout. So the kinds are decided by what the error is *not*:
/// - an answer from the server with a SQLSTATE is classified by its class: unreachable,
///   refusing connections, out of resources, shutting down, or cancelling a statement at its
///   `statement_timeout` (08, 28, 3D, 53, 57) is an **outage**: a statement that ran that long
///   waited on a lock held by a client gone quiet, or on a server too busy; so is a read-only
///   session (`25006`: a standby, or a writer a failover demoted), whose connection the pool
///   closes ([`crate::pool::unfit_session`]). A system error (58) or an internal one
///   (XX) closes its connection too, but stays **transient**: it may be one row's (a corrupt
///   index entry), and the loop still sees an outage in it when the probe fails after it or
///   three messages meet it at once, while a lone poison message reaches the DLQ; an integrity
///   constraint, a data exception, or an error raised on purpose by a trigger (23, 22, P0) is
///   **permanent**; anything else (a deadlock, a serialization failure) is **transient**;
/// - an error about the rows we asked for (a row missing, a value that does not decode) is
///   **transient**: a bug or a race, retried a bounded number of times;
/// - every other error, and any error raised while getting or opening a connection whatever
///   its variant (connecting, TLS, the pool's ping, the pool's timeout), is about the
///   connection, not the work: an **outage**;
/// - an error with no database error in its chain is **transient**.
pub fn failure(error: &anyhow::Error) -> Failure {
    let reason = format!("{error:#}");
    if error.chain().any(|cause| cause.is::<Unanswered>()) {
        return Failure::outage(Source::Database, "unanswered", reason);
    }
    let Some(database) = error.chain().find_map(|cause| cause.downcast_ref::<sqlx::Error>()) else {
        return Failure::transient(Source::Database, "error", reason);
    };
    let (kind, code) = match database {
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default().into_owned();
            let kind = match &code[..code.len().min(2)] {
                // A read-only session: the database's state, whatever the message.
                _ if code == crate::pool::READ_ONLY => Kind::Outage,
                "08" | "28" | "3D" | "53" | "57" => Kind::Outage,
                _ if is_refusal(&code) => Kind::Permanent,
                _ => Kind::Transient,
            };
            (kind, code)
        }
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::Encode(_)
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::InvalidArgument(_) => (Kind::Transient, "rows".to_owned()),
        sqlx::Error::Io(_) => (Kind::Outage, "io".to_owned()),
        sqlx::Error::Tls(_) => (Kind::Outage, "tls".to_owned()),
        sqlx::Error::Protocol(_) => (Kind::Outage, "protocol".to_owned()),
        sqlx::Error::PoolTimedOut => (Kind::Outage, "pool_timed_out".to_owned()),
        sqlx::Error::PoolClosed => (Kind::Outage, "pool_closed".to_owned()),
        _ => (Kind::Outage, "connection".to_owned()),
    };
    Failure::new(kind, Source::Database, code, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each migration's checksum as sqlx records it (SHA-384 of the file) when it is applied:
    /// `fleetctl migrate` refuses to run against a database where a migration it applied has
    /// changed since ("previously applied but has been modified"), so a migration, once
    /// committed, is never edited, not even a comment. A new migration adds its line here.
    const APPLIED: &str = include_str!("migrations.sha384");

    #[test]
    fn no_migration_changed_after_it_was_written() {
        let recorded: std::collections::HashMap<&str, &str> =
            APPLIED.lines().filter_map(|line| line.split_once(' ')).collect();
        let mut wrong = Vec::new();
        for migration in MIGRATOR.iter() {
            let version = migration.version.to_string();
            let checksum: String = migration.checksum.iter().map(|b| format!("{b:02x}")).collect();
            match recorded.get(version.as_str()) {
                Some(was) if *was == checksum => {}
                Some(_) => wrong.push(format!("{version} ({}) was edited", migration.description)),
                None => wrong.push(format!("{version}: add `{version} {checksum}` to migrations.sha384")),
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn a_broken_connection_is_an_outage_and_an_error_without_a_database_cause_is_transient() {
        let io =
            anyhow::Error::new(sqlx::Error::Io(std::io::Error::other("reset"))).context("failed to load");
        assert_eq!((failure(&io).kind, failure(&io).code.as_str()), (Kind::Outage, "io"));
        assert_eq!(failure(&io).source, Source::Database);
        assert_eq!(failure(&anyhow::anyhow!("no database here")).kind, Kind::Transient);
        assert_eq!(failure(&anyhow::Error::new(sqlx::Error::PoolTimedOut)).kind, Kind::Outage);
    }

    #[test]
    fn a_connection_cut_during_the_tls_request_or_a_step_left_unanswered_is_an_outage() {
        // What the stock worker saw when a proxy cut PostgreSQL, which speaks TLS: not `Io`.
        let cut = sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        let cut = anyhow::Error::new(cut).context("failed to load the order");
        assert_eq!((failure(&cut).kind, failure(&cut).code.as_str()), (Kind::Outage, "protocol"));
        let tls = anyhow::Error::new(sqlx::Error::Tls(
            "peer closed connection without sending TLS close_notify".into(),
        ));
        assert_eq!(failure(&tls).kind, Kind::Outage);
        let frozen = anyhow::Error::new(Unanswered(STEP_DEADLINE)).context("failed to reserve stock");
        assert_eq!((failure(&frozen).kind, failure(&frozen).code.as_str()), (Kind::Outage, "unanswered"));
        // A row that is not there is the work's, not the connection's.
        assert_eq!(failure(&anyhow::Error::new(sqlx::Error::RowNotFound)).kind, Kind::Transient);
    }

    /// A statement the server cancelled at `statement_timeout` waited on a lock held by a
    /// client gone quiet, or on a server too busy: the database's state, not the message's. As
    /// an outage the message is held, with no receive spent (SPEC §8.10); as a transient
    /// failure it went back to SQS with one spent on every try.
    #[test]
    fn a_statement_the_server_cancelled_at_its_timeout_is_an_outage() {
        let cancelled = server_error("57014");
        assert_eq!((failure(&cancelled).kind, failure(&cancelled).code.as_str()), (Kind::Outage, "57014"));
    }

    /// A read-only session is the database's state, not the message's: as a transient failure
    /// a lone message would reach the DLQ in about 35 s. A session that met a
    /// system or internal error is closed, but the error may be one row's.
    #[test]
    fn a_read_only_session_is_an_outage_and_every_unfit_session_is_closed() {
        assert_eq!(failure(&server_error("25006")).kind, Kind::Outage);
        // One row's, maybe (a corrupt index entry): transient, so a lone poison message still
        // reaches the DLQ; the loop sees an outage when many fail at once.
        for code in ["58030", "XX000"] {
            assert_eq!(failure(&server_error(code)).kind, Kind::Transient, "{code}");
        }
        for code in ["25006", "58030", "XX000"] {
            assert!(crate::pool::unfit_session(code), "{code}");
        }
        assert_eq!(failure(&server_error("40001")).kind, Kind::Transient);
        assert_eq!(failure(&server_error("23505")).kind, Kind::Permanent);
        assert!(!crate::pool::unfit_session("25P02"));
    }

    /// An error the server answered with SQLSTATE `code`.
    fn server_error(code: &'static str) -> anyhow::Error {
        #[derive(Debug)]
        struct Coded(&'static str);
        impl std::fmt::Display for Coded {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an error with SQLSTATE {}", self.0)
            }
        }
        impl std::error::Error for Coded {}
        impl sqlx::error::DatabaseError for Coded {
            fn message(&self) -> &str {
                "an error the server answered"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some(self.0.into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> sqlx::error::ErrorKind {
                sqlx::error::ErrorKind::Other
            }
        }
        anyhow::Error::new(sqlx::Error::Database(Box::new(Coded(code))))
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_that_never_answers_is_cut_at_its_deadline() {
        let never = bounded("failed to wait", std::future::pending::<anyhow::Result<()>>());
        let error = never.await.unwrap_err();
        assert_eq!(failure(&error).kind, Kind::Outage);
        assert!(format!("{error:#}").starts_with("failed to wait: the database did not answer"), "{error:#}");
    }
}
