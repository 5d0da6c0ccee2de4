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
//! any process dying between two steps; Stripe's list (consistent, unlike its search) to learn
//! what an attempt did, and `idempotency_error`; cards that need 3-D Secure, their buyers
//! authenticating at any moment and their deadlines passing, and Stripe's webhooks racing the
//! sweeper to settle them; holds cancelled outside the fleet, and holds passing the deadline the
//! fleet recorded for them, an `authorized` order past it ended by the stock worker rather than
//! reserved; the commit of an authorization taking the order's units when nothing was cut, and
//! the stock worker capturing such an order from its message; a create Stripe is still
//! executing, its key in use (`409 idempotency_key_in_use`) before it has made anything and its
//! intent listed before its confirm ends (the order left pending, not declined); the safety net
//! that cancels a live intent of a failed order; a taken-over order whose key is surely kept
//! sending its create again with no list first; intakes answering a herd `sold_out` from
//! shared reads, and their fast path straight to the door; and a 3-D Secure settle whose move
//! the database refuses for good.
//! [Stateright](https://docs.rs/stateright) visits every interleaving of those steps within a
//! scenario's bounds ([`scenarios`]) and checks each property ([`properties`]) in every state it
//! reaches.
//!
//! - [`state`]: the state.
//! - [`model`]: the transitions, each as atomic as the code makes it (one statement or
//!   transaction, one Stripe request), in a file for each module of the fleet they mirror;
//!   `README.md` maps each to the function that implements it.
//! - [`properties`]: the guarantees, named after their SPEC §8 clauses.
//! - [`scenarios`]: what is checked, and within what bounds.
//! - [`check`]: running the checker and telling a counterexample step by step.
//!
//! The stock worker's decision after a cut is not copied: the model calls the code's own
//! [`orderfleet::domain::steps::fulfilment::fits_whatever_the_pending_do`]. Beside the code's rules
//! ([`model::Rules::NOW`]), [`model::Rules`] keeps the rules the code followed before some of its
//! fixes, and defects planted on purpose (a 3-D Secure settle that does not cancel first, a
//! merged commit blind to a cut, a key in use read as a failed attempt, a resume that sends a
//! key Stripe may have forgotten, a `sold_out` cache, a fast path that lets later arrivals
//! pass, a settle's refusal answered as an error); the tests show the checker finds each.

pub mod check;
pub mod model;
pub mod opening;
pub mod properties;
pub mod scenarios;
pub mod state;

pub use model::{OrderProtocol, Rules};
