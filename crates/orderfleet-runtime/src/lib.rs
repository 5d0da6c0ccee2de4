#![warn(missing_docs)]
//! How a process of the fleet runs. The domain (`orderfleet`) uses these parts, never the other
//! way round: this crate does not depend on it, so the rule is the compiler's, and stripe-sim
//! runs on these parts without the domain. (They are this fleet's parts all the same: the
//! settings include Stripe's and the intake's, the budget is for Stripe, and a trace span is
//! per order, named by its id as text.)
//!
//! - [`service`]: the one way a binary starts and stops; [`tasks`] supervises its tasks and
//!   [`shutdown`] turns SIGTERM and SIGINT into the stop signal.
//! - [`config`]: the SPEC §3 variables, read once into types; a bad one stops the binary with
//!   one line naming it.
//! - [`db`]: connecting to PostgreSQL, statement bounds, and the embedded migrations;
//!   [`pool`]: the connection pool, which closes a connection whose step did not finish.
//! - [`aws`]: the SQS, SNS and CloudWatch clients, every request counted and bounded.
//! - [`consumer`]: the loop every SQS worker runs around its handler: long polls, a bound on
//!   work in flight, batched acknowledgements, heartbeats, outages held instead of retried.
//! - [`failure`]: one vocabulary for every failure — transient, outage, permanent — decided
//!   where it happens.
//! - [`backoff`], [`backlog`] and [`budget`]: retry spacing with jitter, whether a source is
//!   deep, and the fleet's Stripe request budget.
//! - [`telemetry`], [`trace`] and [`ops`]: logs (text or JSON), one trace per order across
//!   processes, and `/healthz` and `/metrics`.
//! - [`stripe_http`]: the HTTP client Stripe's requests go through, its connections kept.
//! - [`failpoint`]: crash points for the fault-injection suite, off unless a test sets them.

pub mod aws;
pub mod backlog;
pub mod backoff;
pub mod budget;
pub mod config;
pub mod consumer;
pub mod db;
pub mod failpoint;
pub mod failure;
pub mod ops;
pub mod pool;
pub mod service;
pub mod shutdown;
pub mod stripe_http;
pub mod tasks;
pub mod telemetry;
pub mod trace;

/// rustls finds two crypto providers in this build (sqlx brings one, the AWS SDK another) and
/// then cannot pick a default, which makes async-stripe's connector panic at start. Choosing
/// aws-lc-rs once, before any TLS client is built, settles it.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
