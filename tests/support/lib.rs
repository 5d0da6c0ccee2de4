// Tests, the harness and the model: scenarios are read top to bottom, and statements are
// built at run time to look at the fleet from outside (clippy.toml, Cargo.toml's lints).
#![allow(clippy::too_many_lines, clippy::disallowed_methods)]
//! What every end-to-end test shares. Each test gets its own world: a fresh database with
//! the migrations applied, and fresh queues carrying the deployed stack's definitions, so
//! tests run in parallel and never see each other's rows or messages.
//!
//! The stack itself (PostgreSQL, LocalStack, the messaging stack) is `make up`'s job; its
//! settings arrive as environment variables from `.run/stack.env`.

use anyhow::Context;
use orderfleet_runtime::aws::Aws;
use orderfleet_runtime::config::{DatabaseConfig, Env};
use orderfleet_runtime::db::{self, PoolSize};
use secrecy::ExposeSecret;
use sqlx::{Connection, PgConnection};

pub use fleet_harness::audit;
pub mod drops;
pub mod queues;
pub mod server;
pub mod world;

pub use fleet_harness::{SERVICE_ROLES, as_role, binary, replace_database, service_role};
pub use queues::TestQueues;
pub use server::PostgresServer;
pub use world::TestFleet as Fleet;

/// A variable `make up` writes; a clear failure when the tests run without it.
pub fn stack_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with `make test` (or `scripts/with-env.sh cargo test` after `make up`)")
    })
}

/// The AWS SDK configuration pointed at LocalStack.
pub async fn aws() -> Aws {
    Aws::load().await.expect("AWS settings from .run/stack.env")
}

/// A database of the test's own, created empty and migrated; dropped with [`TestDatabase::drop`]
/// (leftovers from failed runs are dropped by `scripts/test.sh` before the next run).
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    pub pool: db::Pool,
    admin_url: String,
}

/// The prefix of every test database's name; `scripts/test.sh` drops leftovers by it.
pub const TEST_DATABASE_PREFIX: &str = "orderfleet_test_";

impl TestDatabase {
    /// An empty database with no tables.
    pub async fn empty() -> anyhow::Result<Self> {
        let admin = DatabaseConfig::from_env(&Env::process())?;
        Self::empty_on(admin.url.expose_secret().to_owned()).await
    }

    /// An empty database on the server `admin_url` reaches.
    pub async fn empty_on(admin_url: String) -> anyhow::Result<Self> {
        let name = format!("{TEST_DATABASE_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&admin_url).await.context("failed to reach PostgreSQL")?;
        // The name is ours (a fixed prefix and a UUID), never input.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await?;
        conn.close().await?;
        let url = replace_database(&admin_url, &name);
        let config = DatabaseConfig::from_env(&Env::from_pairs([("DATABASE_URL", url.as_str())]))?;
        let pool = db::connect(&config, PoolSize { max_connections: 20, ..PoolSize::default() }).await?;
        Ok(Self { name, url, pool, admin_url })
    }

    /// A database with every migration applied.
    pub async fn migrated() -> anyhow::Result<Self> {
        let database = Self::empty().await?;
        db::migrate(&database.pool).await?;
        Ok(database)
    }

    /// A migrated database on a server of the test's own, whose service roles can log in.
    pub async fn migrated_on(server: &PostgresServer) -> anyhow::Result<Self> {
        let mut conn = PgConnection::connect(&server.url("postgres")).await?;
        sqlx::raw_sql(fleet_harness::DEV_ROLES_SQL).execute(&mut conn).await?;
        conn.close().await?;
        let database = Self::empty_on(server.url("postgres")).await?;
        db::migrate(&database.pool).await?;
        Ok(database)
    }

    /// Drops the database, ending its sessions (the pool's among them).
    pub async fn drop(self) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect(&self.admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)))
            .execute(&mut conn)
            .await?;
        Ok(())
    }
}
