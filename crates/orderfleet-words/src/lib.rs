#![warn(missing_docs)]
//! The words an order is made of, which the domain (`orderfleet`) and the Stripe client
//! (`orderfleet-payments`) both speak: an order's id, its buyer, its product, how many units
//! and for how much ([`OrderId`], [`UserId`], [`Sku`], [`Quantity`], [`Currency`], [`Money`]);
//! a payment hold as the order records it ([`hold`]); and Stripe's least charge per currency
//! ([`minimum_charge`]), which a price and a PaymentIntent's amount are both held to.
//!
//! A crate of its own because the payments crate sits below the domain (the domain's steps
//! call Stripe; Stripe's client knows no step), and still takes an order's id and amount and
//! answers in the order's words: these types live below both, so neither imports the other for
//! them, and each has this one path.

mod ids;

pub mod hold;
pub mod minimum_charge;

pub use ids::{Currency, Money, OrderId, Quantity, Sku, UserId};
