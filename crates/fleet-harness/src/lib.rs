// Tests, the harness and the model: scenarios are read top to bottom, and statements are
// built at run time to look at the fleet from outside (clippy.toml, Cargo.toml's lints).
#![allow(clippy::too_many_lines, clippy::disallowed_methods)]
#![warn(missing_docs)]
//! Runs the whole orderfleet as real processes and drives it from outside, as a client, an
//! operator and an auditor would: the end-to-end tests, `make demo` and `make bench` share it.
//!
//! - [`fleet`] starts stripe-sim and the fleet's binaries against a [`Stack`], places orders
//!   through the HTTP API, reads stripe-sim's ledger and the database, and observes the SNS
//!   topic through a subscribed queue.
//! - [`audit`] checks SPEC §8's guarantees at the end of a run: the suite's and the demo's.
//! - [`metrics`] scrapes the processes' `/metrics` and adds up their counters.

pub mod audit;
pub mod fleet;
pub mod metrics;
pub mod pgcount;
pub mod proxy;

use std::path::PathBuf;

pub use fleet::{Answer, Fleet, Stack, create_at_stripe, free_port, hold_at_stripe};

/// How often [`eventually`] looks again.
pub const EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Waits for an effect: asks `check` every [`EVERY`] until it answers `Some`, and returns that;
/// after `within`, fails saying `what` was awaited. The one way the suite, the demo and the
/// bench wait for something to happen: never a fixed sleep, which is too short on a slow
/// machine and too long on a fast one.
pub async fn eventually<T, Fut>(
    what: &str,
    within: std::time::Duration,
    mut check: impl FnMut() -> Fut,
) -> anyhow::Result<T>
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(EVERY).await;
    }
}

/// The path of one of the workspace's binaries, built in the same profile as the caller.
pub fn binary(name: &str) -> PathBuf {
    let dir = match std::env::var_os("ORDERFLEET_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            // target/<profile>/deps/e2e-… (a test) or target/<profile>/orderfleet-demo (a bin).
            let exe = std::env::current_exe().expect("the running program's path");
            let dir = exe.parent().expect("a directory").to_path_buf();
            if dir.ends_with("deps") { dir.parent().expect("target/<profile>").to_path_buf() } else { dir }
        }
    };
    let path = dir.join(name);
    assert!(path.exists(), "{} is not built: run `make up` (it builds the workspace)", path.display());
    path
}

/// The database role each binary connects as: migration 0010 grants each only the table rights
/// its code uses. `fleetctl migrate` alone runs as the owner of the tables.
pub const SERVICE_ROLES: [(&str, &str); 5] = [
    ("order-intake", "orderfleet_intake"),
    ("outbox-relay", "orderfleet_relay"),
    ("stock-worker", "orderfleet_stock_worker"),
    ("notification-worker", "orderfleet_notification_worker"),
    ("fleetctl", "orderfleet_operator"),
];

/// The role `bin` connects as, if it connects to the database at all.
pub fn service_role(bin: &str) -> Option<&'static str> {
    SERVICE_ROLES.iter().find(|(b, _)| *b == bin).map(|(_, role)| *role)
}

/// What makes the service roles able to log in on a development or test cluster, each with
/// its own name as its password (throwaway credentials for a loopback-only cluster).
pub const DEV_ROLES_SQL: &str = include_str!("../../../scripts/dev-roles.sql");

/// The same PostgreSQL URL logging in as `role` with its development password (host,
/// database and query kept).
pub fn as_role(url: &str, role: &str) -> String {
    // sqlx takes a login from the query too, which would win over the one set here.
    let query = url.split_once('?').map_or("", |(_, q)| q);
    assert!(
        !query.split('&').any(|p| p.starts_with("user=") || p.starts_with("password=")),
        "DATABASE_URL names its login in the query; put it before the host"
    );
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else { return url.to_owned() };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!("{}{role}:{role}@{host}", &url[..scheme_end])
}

/// The fleet's own pool on `url` (`orderfleet_runtime::db::connect`), of up to `connections`: for the
/// fleet's code run from a test or the bench (a product upsert, the door).
pub async fn fleet_pool(url: &str, connections: u32) -> anyhow::Result<orderfleet_runtime::db::Pool> {
    let env = orderfleet_runtime::config::Env::from_pairs([("DATABASE_URL", url)]);
    let config = orderfleet_runtime::config::DatabaseConfig::from_env(&env)?;
    let size = orderfleet_runtime::db::PoolSize {
        max_connections: connections,
        min_connections: 0,
        application_name: "fleet-harness",
        ..Default::default()
    };
    orderfleet_runtime::db::connect(&config, size).await
}

/// The `p`-th percentile (0–100) of `values`, sorting them; 0 for none.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank]
}

/// The same PostgreSQL URL with another database name (credentials, host, query kept).
pub fn replace_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[authority_end..].find('/').map(|i| i + authority_end).unwrap_or(base.len());
    let mut out = format!("{}/{}", &base[..path_start], database);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{as_role, replace_database};

    #[test]
    fn replace_database_keeps_credentials_host_and_query() {
        assert_eq!(
            replace_database("postgres://u:p@127.0.0.1:5432/orderfleet?sslmode=disable", "t1"),
            "postgres://u:p@127.0.0.1:5432/t1?sslmode=disable"
        );
        assert_eq!(replace_database("postgres://u@h", "t1"), "postgres://u@h/t1");
    }

    #[test]
    fn as_role_replaces_the_login_and_keeps_host_database_and_query() {
        assert_eq!(
            as_role("postgres://u:p@127.0.0.1:5432/db?sslmode=disable", "r"),
            "postgres://r:r@127.0.0.1:5432/db?sslmode=disable"
        );
        assert_eq!(as_role("postgres://u@h:1/db", "r"), "postgres://r:r@h:1/db");
        assert_eq!(as_role("postgres://h/db", "r"), "postgres://r:r@h/db");
    }
}
