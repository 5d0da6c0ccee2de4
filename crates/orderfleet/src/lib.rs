#![warn(missing_docs)]
//! What every orderfleet binary shares, in two folders:
//!
//! - [`domain`]: what an order is and the rules it moves by — the order and its statuses,
//!   the product and its unit counters, the Stripe hold and the capture, the outbox messages
//!   the moves cause, the sweeper that finishes what stopped, the buyers' tokens.
//! - [`runtime`] (the `orderfleet-runtime` crate): how a process runs — its settings, PostgreSQL, AWS and its request counts,
//!   the SQS consumer loop, the one failure vocabulary, retries and backoff, logs and traces,
//!   supervision and the stop signal.
//!
//! The arrows go one way: the domain uses the runtime (a pool, a bounded statement, a retry
//! spacing, a crash point, the settings), and the runtime is a crate of its own that does not
//! depend on the domain, so the compiler keeps the rule. So
//! `runtime` is the queue worker a reader can study apart from the orders, and `domain` is
//! where this system's rules are. Those rules are written against the database and Stripe
//! directly, as short statements and calls, so each compare-and-set stays where a reader can
//! see it.

pub mod domain;
/// How a process runs: the `orderfleet-runtime` crate, under the path the fleet's code names it by.
pub use orderfleet_runtime as runtime;

pub(crate) use orderfleet_runtime::install_crypto_provider;
