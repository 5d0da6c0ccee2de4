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
pub mod aws;
pub mod config;
pub mod db;
pub mod product;
pub mod telemetry;
