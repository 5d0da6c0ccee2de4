//! A promoted order (`order.promoted`): a queued order the opening, or a unit that came back,
//! promised its units. The worker authorizes it without its buyer, with the payment method it
//! was queued with, as the sweeper resumes a pending order: under the order's lease and its
//! attempt's Stripe key, so a second delivery, or the sweeper meanwhile, makes no second
//! authorization ([`authorization::take_over_and_resume`]). What it came to is the message's
//! outcome, classified as every step's is.

use orderfleet::domain::steps::authorization;
use orderfleet::domain::steps::fulfilment::{Fulfilment, Step};
use orderfleet::domain::steps::leased::AuthorizationError;
use orderfleet_payments::STRIPE;
use orderfleet_runtime::failure::{Failure, Source};
use orderfleet_words::OrderId;

/// Authorizes the promoted order `id`, once.
pub(crate) async fn authorize(fulfilment: &Fulfilment, id: OrderId) -> Step {
    match authorization::take_over_and_resume(&fulfilment.pool, &fulfilment.payments, id).await {
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
