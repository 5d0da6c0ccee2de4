//! What every orderfleet binary shares.
//!
//! A short tour:
//! - [`config`] reads the SPEC §3 variables once, into types; a bad one stops the binary
//!   with one line naming it.
//! - [`telemetry`] sets up `tracing` (text, or JSON with `LOG_FORMAT=json`).
//! - [`db`] builds the bounded PostgreSQL pool and carries the embedded migrations.
//! - [`aws`] builds the SQS and SNS clients from `aws-config`, so `AWS_ENDPOINT_URL` reaches
//!   LocalStack in development and the real endpoints in production.

pub mod auth;
pub mod authorization;
pub mod aws;
pub mod backlog;
pub mod backoff;
pub mod budget;
pub mod config;
pub mod consumer;
pub mod db;
pub mod failpoint;
pub mod failure;
pub mod fulfilment;
pub mod ops;
pub mod order;
pub mod outbox;
pub mod payments;
pub mod product;
pub mod service;
pub mod shutdown;
pub mod sweeper;
pub mod tasks;
pub mod telemetry;
pub mod trace;

/// rustls finds two crypto providers in this build (sqlx brings one, the AWS SDK another) and
/// then cannot pick a default, which makes async-stripe's connector panic at start. Choosing
/// aws-lc-rs once, before any TLS client is built, settles it.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
