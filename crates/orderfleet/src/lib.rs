#![warn(missing_docs)]
//! What every orderfleet binary shares: the domain (what an order is and the rules it moves
//! by) and the runtime (how a process reads its settings, talks to PostgreSQL, AWS and Stripe,
//! runs its loops and stops). The runtime calls into the domain's types; the domain's rules
//! are written against the database and Stripe directly, as short statements and calls, so
//! that each compare-and-set stays where a reader can see it.
//!
//! **The domain**
//! - [`domain`]: the words as types — [`domain::OrderId`], [`domain::UserId`], [`domain::Sku`],
//!   [`domain::Quantity`], [`domain::Money`] — checked once where they enter.
//! - [`order`]: the one [`order::Order`], its statuses, and [`order::Transition`]: a move and
//!   the outbox messages it causes, in one statement. Every move of an order is a
//!   compare-and-set on its status, whether through a `Transition` or in the statements of
//!   its own that the door, the decline and the reservation need.
//! - [`product`]: what is for sale, at what price, and its unit counters (`fleetctl product`).
//! - [`authorization`]: the Stripe hold of a pending order, and resuming one after a crash or
//!   an outage without a second hold. (Not to be confused with [`tokens`]: who the buyer is.)
//! - [`fulfilment`]: reserve in line, capture or cancel; resumed from the order's status.
//! - [`sweeper`]: finishes orders that stopped moving, without their buyer.
//! - [`payments`]: Stripe's PaymentIntents through async-stripe — the keys per attempt, the
//!   retries, what a saved 5xx means; [`budget`] is the process's Stripe request budget.
//! - [`outbox`]: the messages an order's moves cause, and the envelope they travel in.
//! - [`failure`]: one vocabulary for every failure — transient, outage, permanent — decided
//!   where it happens.
//!
//! **The runtime**
//! - [`service`]: the one way a binary starts and stops; [`tasks`] supervises its tasks and
//!   [`shutdown`] turns SIGTERM and SIGINT into the stop signal.
//! - [`config`]: the SPEC §3 variables, read once into types; a bad one stops the binary with
//!   one line naming it.
//! - [`db`]: the bounded PostgreSQL pool, statement bounds, and the embedded migrations.
//! - [`aws`]: the SQS, SNS and CloudWatch clients, every request counted and bounded.
//! - [`consumer`]: the loop every SQS worker runs around its handler: long polls, a bound on
//!   work in flight, batched acknowledgements, heartbeats, outages held instead of retried.
//! - [`backoff`] and [`backlog`]: retry spacing with jitter, and whether a source is deep.
//! - [`tokens`]: bearer tokens (HS256 JWTs) that the intake verifies and `fleetctl` issues.
//! - [`telemetry`], [`trace`] and [`ops`]: logs (text or JSON), one trace per order across
//!   processes, and `/healthz` and `/metrics`.
//! - [`failpoint`]: crash points for the fault-injection suite, off unless a test sets them.

pub mod authorization;
pub mod aws;
pub mod backlog;
pub mod backoff;
pub mod budget;
pub mod config;
pub mod consumer;
pub mod db;
pub mod domain;
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
pub mod tokens;
pub mod trace;

/// rustls finds two crypto providers in this build (sqlx brings one, the AWS SDK another) and
/// then cannot pick a default, which makes async-stripe's connector panic at start. Choosing
/// aws-lc-rs once, before any TLS client is built, settles it.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
