//! A promoted order (`order.promoted`): a queued order the opening, or a unit that came back,
//! promised its units. The worker authorizes it without its buyer, with the payment method it
//! was queued with, as the sweeper resumes a pending order: under the order's lease and its
//! attempt's Stripe key, so a second delivery, or the sweeper meanwhile, makes no second
//! authorization ([`authorization::take_over_and_resume`]). What it came to is the message's
//! outcome, classified as every step's is.

use orderfleet::domain::records::order;
use orderfleet::domain::steps::authorization;
use orderfleet::domain::steps::fulfilment::{Fulfilment, Step};
use orderfleet::domain::steps::leased::AuthorizationError;
use orderfleet_payments::STRIPE;
use orderfleet_runtime::failure::{Failure, Source};
use orderfleet_words::OrderId;

/// Authorizes the first promoted order in line still waiting, `id`'s or one ahead of it, once.
///
/// Each promoted order has one message, and each message authorizes one waiting order: the
/// first in its product's line with no live lease ([`order::first_promoted_waiting`]), not
/// necessarily its own. So the queue is authorized in line order, as the buyers' `line`
/// figures promise, though a standard queue delivers the messages in any order. None is left
/// behind: a message is used up only by authorizing a waiting order, or when every waiting one
/// is taken already, each by a worker that holds another message (or the sweeper), which then
/// finishes it or leaves its message to come back.
pub(crate) async fn authorize(fulfilment: &Fulfilment, id: OrderId) -> Step {
    let next = match order::first_promoted_waiting(&fulfilment.pool, id).await {
        Ok(next) => next.unwrap_or(id),
        Err(e) => return Step::Failed(orderfleet_runtime::db::failure(&anyhow::Error::new(e))),
    };
    match authorization::take_over_and_resume(&fulfilment.pool, &fulfilment.payments, next).await {
        // Recorded (authorized, declined, 3-D Secure asked, refused), or another holds its
        // lease or moved it on (the sweeper, a redelivery): nothing more for this message.
        Ok(_) => Step::Done,
        Err(AuthorizationError::ProviderUnavailable(why)) => {
            Step::Failed(Failure::outage(STRIPE, "unavailable", why))
        }
        Err(AuthorizationError::LookupRefused(why)) => {
            Step::Failed(Failure::permanent(STRIPE, "lookup_refused", why))
        }
        // Its hold released (or owed); the order is for a person, as the sweeper reports it.
        Err(AuthorizationError::OrderRefused(why)) => {
            Step::Failed(Failure::permanent(Source::Order, "order_refused", why))
        }
        Err(AuthorizationError::Database(e)) => {
            Step::Failed(orderfleet_runtime::db::failure(&anyhow::Error::new(e)))
        }
    }
}
