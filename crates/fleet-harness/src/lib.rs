//! Runs the whole orderfleet as real processes and drives it from outside, as a client, an
//! operator and an auditor would: the end-to-end tests, `make demo` and `make bench` share it.
//!
//! - [`fleet`] starts stripe-sim and the fleet's binaries against a [`Stack`], places orders
//!   through the HTTP API, reads stripe-sim's ledger and the database, and observes the SNS
//!   topic through a subscribed queue.
//! - [`metrics`] scrapes the processes' `/metrics` and adds up their counters.

pub mod fleet;
pub mod metrics;
pub mod proxy;

use std::path::PathBuf;

pub use fleet::{Answer, Fleet, Stack, free_port};

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

/// The same PostgreSQL URL with another database name (credentials, host, query kept).
/// The `p`-th percentile (0–100) of `values`, sorting them; 0 for none.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank]
}

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
    use super::replace_database;

    #[test]
    fn replace_database_keeps_credentials_host_and_query() {
        assert_eq!(
            replace_database("postgres://u:p@127.0.0.1:5432/orderfleet?sslmode=disable", "t1"),
            "postgres://u:p@127.0.0.1:5432/t1?sslmode=disable"
        );
        assert_eq!(replace_database("postgres://u@h", "t1"), "postgres://u@h/t1");
    }
}
