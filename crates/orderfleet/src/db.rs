//! The PostgreSQL pool and the embedded migrations.

use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::config::DatabaseConfig;
use crate::failure::{Failure, Kind, Source};

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
    warn_if_unverified(config);
    PgPoolOptions::new()
        .max_connections(size.max_connections)
        .min_connections(size.min_connections)
        .acquire_timeout(size.acquire_timeout)
        .connect_lazy(config.url.expose_secret())
        .context("failed to parse DATABASE_URL into connection options")
}

/// Connects now, failing when the database is unreachable (for one-shot commands).
pub async fn connect(config: &DatabaseConfig, size: PoolSize) -> anyhow::Result<PgPool> {
    warn_if_unverified(config);
    PgPoolOptions::new()
        .max_connections(size.max_connections)
        .acquire_timeout(size.acquire_timeout)
        .connect(config.url.expose_secret())
        .await
        .context("failed to connect to PostgreSQL (DATABASE_URL)")
}

fn warn_if_unverified(config: &DatabaseConfig) {
    if config.unverified_tls {
        tracing::warn!(
            "DATABASE_URL: the connection is encrypted but the server's certificate is not checked; use sslmode=verify-full"
        );
    }
}

/// Applies every migration not yet applied. Safe to repeat and to run from several processes
/// at once: sqlx takes an advisory lock for the duration.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("failed to apply migrations")
}

/// A database error as a [`Failure`], classified where it happens by its SQLSTATE:
/// - unreachable, shutting down or starting up (class 08, 57 but a cancelled statement), a
///   broken connection or an exhausted pool: an **outage** — wait until the database answers;
/// - an integrity constraint, a data exception, or an error raised on purpose by a trigger
///   (classes 23, 22, P0): **permanent** — this work fails the same way every time;
/// - anything else (a deadlock, a serialization failure, a cancelled statement), or an error
///   with no database error in its chain: **transient** — try the same work again soon.
pub fn failure(error: &anyhow::Error) -> Failure {
    let reason = format!("{error:#}");
    let Some(database) = error.chain().find_map(|cause| cause.downcast_ref::<sqlx::Error>()) else {
        return Failure::transient(Source::Database, "error", reason);
    };
    let (kind, code) = match database {
        sqlx::Error::Io(_) => (Kind::Outage, "io".to_owned()),
        sqlx::Error::PoolTimedOut => (Kind::Outage, "pool_timed_out".to_owned()),
        sqlx::Error::PoolClosed => (Kind::Outage, "pool_closed".to_owned()),
        sqlx::Error::Tls(_) => (Kind::Outage, "tls".to_owned()),
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default().into_owned();
            let kind = match &code[..code.len().min(2)] {
                "08" | "57" if code != "57014" => Kind::Outage,
                "23" | "22" | "P0" => Kind::Permanent,
                _ => Kind::Transient,
            };
            (kind, code)
        }
        _ => (Kind::Transient, "error".to_owned()),
    };
    Failure::new(kind, Source::Database, code, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_an_outage_and_an_error_without_a_database_cause_is_transient() {
        let io =
            anyhow::Error::new(sqlx::Error::Io(std::io::Error::other("reset"))).context("failed to load");
        assert_eq!((failure(&io).kind, failure(&io).code.as_str()), (Kind::Outage, "io"));
        assert_eq!(failure(&io).source, Source::Database);
        assert_eq!(failure(&anyhow::anyhow!("no database here")).kind, Kind::Transient);
        assert_eq!(failure(&anyhow::Error::new(sqlx::Error::PoolTimedOut)).kind, Kind::Outage);
    }
}
