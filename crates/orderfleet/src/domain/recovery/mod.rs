//! What finishes the orders that stopped moving, without their buyer: the sweeper
//! ([`sweeper`]), the reconciliation of stray PaymentIntents ([`strays`]), and an operator's
//! resolution of a pending order from what Stripe's Dashboard shows ([`resolution`]). It runs
//! the steps below it; nothing below it calls it.

pub mod resolution;
pub mod strays;
pub mod sweeper;
