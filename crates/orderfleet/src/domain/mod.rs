//! What an order is and the rules it moves by, in layers. Each folder is one, and two crates
//! below the domain hold the rest: the order's words (`orderfleet-words`, with [`words`]) and
//! Stripe's client (`orderfleet-payments`, the layer payments). A module imports only from the
//! layers listed under it here, never from one above (`scripts/check-shape.py` holds the code to
//! this list, and prints it):
//!
//! | layer | what it holds | imports from |
//! |---|---|---|
//! | [`words`], and the `orderfleet-words` crate | the checked values an order is made of (`orderfleet_words::{OrderId, UserId, Sku, Quantity, Currency, Money}`), a payment hold as the order sees it (`orderfleet_words::hold`) and Stripe's least charge; here, its statuses and failure reasons | nothing |
//! | [`tokens`] | the buyers' bearer tokens: the intake verifies them (HS256, or a JWKS), `fleetctl` issues them | words |
//! | [`records`] | the rows and their moves: the order and SPEC §5's arrows (`records/order/moves.rs`), the outbox, the product and its unit counters | words |
//! | payments: the `orderfleet-payments` crate | Stripe's PaymentIntents through async-stripe, within the fleet's Stripe budget; its settings, its budget and its transport | words |
//! | [`door`] | where an order is promised its units and its place in line, before any payment call, or refused with nothing written | words, records |
//! | [`steps`] | the steps an order takes with Stripe: the authorization, 3-D Secure, fulfilment, webhooks, and the rule for a refused move | words, records, payments |
//! | [`recovery`] | what finishes orders that stopped: the sweeper, the reconciliation of strays, an operator's resolution | words, records, payments, steps |
//!
//! So the records and the door never call Stripe (they never name `orderfleet_payments`), and a
//! step never runs the sweeper. Inside `steps`, fulfilment never imports the authorization: an
//! authorized order is all it needs.

pub mod words;

pub mod door;
pub mod records;
pub mod recovery;
pub mod steps;
pub mod tokens;
