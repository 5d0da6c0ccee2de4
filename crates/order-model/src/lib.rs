// Tests, the harness and the model: scenarios are read top to bottom, and statements are
// built at run time to look at the fleet from outside (clippy.toml, Cargo.toml's lints).
#![allow(clippy::too_many_lines, clippy::disallowed_methods)]
#![warn(missing_docs)]
//! # The order protocol, model-checked
//!
//! A model of the state SPEC §8's guarantees are about — the product's counters, the orders,
//! Stripe's intents and saved answers, the stock-check messages — and of every step that
//! changes it: buyers arriving in any order and retrying, the door, authorizations that
//! Stripe answers, declines, fails (a 500 it saves under the key, an answer lost after the
//! effect) or never hears; the relay, a standard queue's duplicates and redeliveries, the
//! DLQ after three receives and the operator's redrive; the stock worker's reservation in
//! line, capture and cancel; the sweeper at any moment; cuts and raises of the total; and
//! any process dying between two steps. Since issue 33 also: Stripe's list (consistent, where
//! its search lagged) to learn what an attempt did, `idempotency_error`, cards that need 3-D
//! Secure with their buyers authenticating at any moment and their deadlines passing, Stripe's
//! webhooks racing the sweeper to settle them, and holds cancelled outside the fleet. Since
//! issue 34: the commit of an authorization taking the order's units when nothing was cut, and
//! the stock worker capturing such an order from its message. Since issue 35 (point 8): holds
//! passing the deadline the fleet recorded for them, and the stock worker ending an `authorized`
//! order past it rather than reserving it. Since issue 43 (point 1): a create whose confirm is
//! still executing when a lookup lists its intent (the order left pending, not declined), and
//! the safety net that cancels a live intent of a failed order. Since issue 44: a taken-over
//! order whose key is surely kept sending its create again with no list first, and a create
//! Stripe is still executing, its key in use (`409 idempotency_key_in_use`) before it has made
//! anything.
//! [Stateright](https://docs.rs/stateright) visits every interleaving of those steps within a
//! scenario's bounds ([`scenarios`]) and checks each property ([`properties`]) in every state it
//! reaches.
//!
//! - [`state`]: the state.
//! - [`model`]: the transitions, each as atomic as the code makes it (one statement or
//!   transaction, one Stripe request); `README.md` maps each to the function that implements it.
//! - [`properties`]: the guarantees, named after their SPEC §8 clauses.
//! - [`scenarios`]: what is checked, and within what bounds.
//! - [`check`]: running the checker and telling a counterexample step by step.
//!
//! The stock worker's decision after a cut is not copied: the model calls the code's own
//! [`orderfleet::domain::fulfilment::fits_whatever_the_pending_do`]. [`model::Rules`] also keeps the
//! rules as they were before earlier defects were fixed (before issue 34's merged commit,
//! [`model::Rules::BEFORE_ISSUE_34`]; before issue 35's point 8,
//! [`model::Rules::BEFORE_ISSUE_35_POINT_8`]; before issue 43's point 1,
//! [`model::Rules::BEFORE_ISSUE_43`]; before issue 44, [`model::Rules::BEFORE_ISSUE_44`]), and
//! defects planted on purpose (a 3-D Secure settle that does not cancel first, a merged commit
//! blind to a cut, a key in use read as a failed attempt, a resume that sends a key Stripe may
//! have forgotten), and the tests show the checker finds each.

pub mod check;
pub mod model;
pub mod properties;
pub mod scenarios;
pub mod state;

pub use model::{OrderProtocol, Rules};
