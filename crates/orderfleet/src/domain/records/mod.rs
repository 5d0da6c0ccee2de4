//! The rows and their moves, in PostgreSQL: the order and every move it can make
//! ([`order`], whose `moves.rs` lists SPEC §5's arrows), the outbox messages a move causes
//! ([`outbox`]), the product with its unit counters ([`product`]) and the operator's pause of
//! its sale ([`pause`]). Short compare-and-set statements; nothing here calls Stripe.

pub mod order;
pub mod outbox;
pub mod pause;
pub mod product;
