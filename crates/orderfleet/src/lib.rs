#![warn(missing_docs)]
//! What every orderfleet binary shares: [`domain`], what an order is and the rules it moves by
//! — the order and its statuses, the product and its unit counters, the steps an order takes
//! with Stripe, the outbox messages the moves cause, the sweeper that finishes what stopped, the
//! buyers' tokens.
//!
//! It stands on three crates, each named by its own path wherever it is used:
//!
//! - `orderfleet-words`: the checked values an order is made of (`OrderId`, `Money`, …) and a
//!   payment hold in the order's words, below this crate and the payments crate alike.
//! - `orderfleet-payments`: Stripe — the PaymentIntents client, the fleet's request budget,
//!   the transport and the settings.
//! - `orderfleet-runtime`: how a process runs — its settings, PostgreSQL, AWS and its request
//!   counts, the SQS consumer loop, the one failure vocabulary, retries and backoff, logs and
//!   traces, supervision and the stop signal.
//!
//! The arrows go one way: the domain uses the payments crate and the runtime (a pool, a bounded
//! statement, a retry spacing, a crash point, the settings), and neither depends on the domain,
//! so the compiler keeps the rule. So the runtime is the queue worker a reader can study apart
//! from the orders, the payments crate is Stripe apart from the orders' steps, and `domain` is
//! where this system's rules are. Those rules are written against the database and Stripe
//! directly, as short statements and calls, so each compare-and-set stays where a reader can
//! see it. [`metrics`] lists every metric the domain exports.

pub mod domain;
pub mod metrics;
