//! The steps an order takes with Stripe, each a short statement before or after a call, never
//! a call inside a transaction: the authorization of a pending order ([`authorization`]), the
//! buyer's 3-D Secure ([`three_d_secure`]), reserving and capturing ([`fulfilment`]), Stripe's
//! webhooks ([`webhook`]), the one rule for a move the database refuses ([`refusal`]), and
//! the release of a hold no order keeps ([`releases`]), and one card's count under its cap
//! ([`card_cap`]), which the authorization and the 3-D Secure settle both make.
//! [`leased`] is the lease and deadline the authorization and the 3-D Secure settle share.

pub mod authorization;
pub mod card_cap;
pub mod fulfilment;
pub mod leased;
pub mod refusal;
pub mod releases;
pub mod three_d_secure;
pub mod webhook;
