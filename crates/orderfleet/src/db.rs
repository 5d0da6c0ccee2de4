//! The PostgreSQL pool and the embedded migrations.

use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::config::DatabaseConfig;

/// The schema, embedded at build time from `migrations/` at the repository root.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// How big a pool a process gets. Bounded so that a burst cannot open more connections than
/// PostgreSQL allows (100 by default), which every process of the fleet shares: the intake
/// takes 16, a stock worker 8, the relay and the notification worker 4 each.
#[derive(Debug, Clone, Copy)]
pub struct PoolSize {
    pub max_connections: u32,
    /// Kept open, so a burst after a quiet spell does not wait for new connections.
    pub min_connections: u32,
    pub acquire_timeout: Duration,
}

impl Default for PoolSize {
    fn default() -> Self {
        Self { max_connections: 10, min_connections: 2, acquire_timeout: Duration::from_secs(5) }
    }
}

/// Connects lazily: the pool opens connections on first use, so a binary starts (and serves
/// `/healthz`) while the database is still coming up, and recovers by itself after an outage.
pub fn connect_lazy(config: &DatabaseConfig, size: PoolSize) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(size.max_connections)
        .min_connections(size.min_connections)
        .acquire_timeout(size.acquire_timeout)
        .connect_lazy(config.url.expose_secret())
        .context("failed to parse DATABASE_URL into connection options")
}

/// Connects now, failing when the database is unreachable (for one-shot commands).
pub async fn connect(config: &DatabaseConfig, size: PoolSize) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(size.max_connections)
        .acquire_timeout(size.acquire_timeout)
        .connect(config.url.expose_secret())
        .await
        .context("failed to connect to PostgreSQL (DATABASE_URL)")
}

/// Applies every migration not yet applied. Safe to repeat and to run from several processes
/// at once: sqlx takes an advisory lock for the duration.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("failed to apply migrations")
}

/// What kind of failure a database error is, decided where it happens (by SQLSTATE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The database cannot be reached, or is shutting down or starting: wait until it answers.
    Outage,
    /// A deadlock, a serialization failure, a cancelled statement, or no database error at
    /// all: try the same work again soon.
    Transient,
    /// An integrity constraint, a data exception or an error raised on purpose by a trigger:
    /// this work fails the same way every time.
    Permanent,
}

/// Classifies the first database error in `error`'s chain; an error with none is transient.
pub fn failure_kind(error: &anyhow::Error) -> FailureKind {
    let Some(database) = error.chain().find_map(|cause| cause.downcast_ref::<sqlx::Error>()) else {
        return FailureKind::Transient;
    };
    match database {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => {
            FailureKind::Outage
        }
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default();
            match &code[..code.len().min(2)] {
                // Connection exceptions; the server shutting down or not yet accepting (but a
                // statement cancelled by a timeout, 57014, is transient).
                "08" | "57" if code != "57014" => FailureKind::Outage,
                // Integrity constraint violations, data exceptions, a trigger's RAISE.
                "23" | "22" | "P0" => FailureKind::Permanent,
                _ => FailureKind::Transient,
            }
        }
        _ => FailureKind::Transient,
    }
}
