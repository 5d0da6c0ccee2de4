#![warn(missing_docs)]
//! How a process of the fleet runs: the kit the domain (`orderfleet`), the payments crate and
//! the payment simulator are built on, never the other way round. This crate depends on none of
//! them, so the rule is the compiler's, and the simulator runs on this kit without the domain.
//! (It is this fleet's kit all the same: the settings include the intake's, and a trace span is
//! per order, named by its id as text.) Stripe is not in it: its client, request budget,
//! transport and settings are the `orderfleet-payments` crate.
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
//! - [`backoff`] and [`backlog`]: retry spacing with jitter, and whether a source is deep.
//! - [`telemetry`], [`trace`] and [`ops`]: logs (text or JSON), one trace per order across
//!   processes, and `/healthz` and `/metrics`.
//! - [`metrics`]: every metric this crate exports, and how each crate declares its own.
//! - [`failpoint`]: crash points for the fault-injection suite, off unless a test sets them.

pub mod aws;
pub mod backlog;
pub mod backoff;
pub mod config;
pub mod consumer;
pub mod db;
pub mod failpoint;
pub mod failure;
pub mod metrics;
pub mod ops;
pub mod pool;
pub mod service;
pub mod shutdown;
pub mod tasks;
pub mod telemetry;
pub mod trace;

/// rustls finds two crypto providers in this build (sqlx brings one, the AWS SDK another) and
/// then cannot pick a default, which makes a connector that asks for the default (the payments
/// crate's) panic at start. Choosing aws-lc-rs once, before any TLS client is built, settles it.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
