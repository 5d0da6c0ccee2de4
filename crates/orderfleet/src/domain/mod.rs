//! What an order is and the rules it moves by.
//!
//! - The words as types ([`OrderId`], [`UserId`], [`Sku`], [`Quantity`], [`Currency`],
//!   [`Money`]), checked once where they enter (`ids.rs`).
//! - [`status`] and [`hold`]: the words every module below shares: an order's statuses and
//!   failure reasons, and a payment hold as the order sees it.
//! - [`order`]: the one [`order::Order`] and [`order::Transition`]: a move and
//!   the outbox messages it causes, in one statement. Every move of an order is a
//!   compare-and-set on its status, whether through a `Transition` or in the statements of
//!   its own that the door, the decline and the reservation need.
//! - [`door`]: where an order is promised its units and its place in line, before any payment
//!   call, or refused (sold out, over the cap, card testing) with nothing written.
//! - [`product`]: what is for sale, at what price, and its unit counters (`fleetctl product`).
//! - [`authorization`]: the Stripe hold of a pending order, and resuming one after a crash or
//!   an outage without a second hold. (Not to be confused with [`tokens`]: who the buyer is.)
//! - [`fulfilment`]: reserve in line, capture or cancel; resumed from the order's status.
//! - [`leased`]: work on an order under its lease, within its deadline, and why it stopped.
//! - [`refusal`]: the one rule for an order whose move the database refuses for good: its hold
//!   released, the order ended failed or left for a person, the other orders untouched.
//! - [`sweeper`]: finishes orders that stopped moving, without their buyer.
//! - [`resolution`]: an operator settles a pending order the sweeper cannot, from what
//!   Stripe's Dashboard shows (`fleetctl order resolve`).
//! - [`payments`]: Stripe's PaymentIntents through async-stripe — the keys per attempt, the
//!   retries, what a saved 5xx means — within the process's Stripe request budget
//!   ([`crate::runtime::budget`]).
//! - [`outbox`]: the messages an order's moves cause, and the envelope they travel in.
//! - [`tokens`]: bearer tokens (HS256 JWTs) that the intake verifies and `fleetctl` issues.

mod ids;

pub use ids::{Currency, Money, OrderId, Quantity, Sku, UserId};

pub mod action;
pub mod authorization;
pub mod door;
pub mod fulfilment;
pub mod hold;
pub mod leased;
pub mod order;
pub mod outbox;
pub mod payments;
pub mod product;
pub mod refusal;
pub mod resolution;
pub mod status;
pub mod strays;
pub mod sweeper;
pub mod tokens;
pub mod webhook;
