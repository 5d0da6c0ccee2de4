//! How a process runs. No module here imports one of [`crate::domain`]'s: the domain uses
//! these parts, never the other way round. (They are this fleet's parts all the same: the
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
//!   deep, and a per-process request budget (Stripe's).
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
