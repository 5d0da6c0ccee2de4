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
