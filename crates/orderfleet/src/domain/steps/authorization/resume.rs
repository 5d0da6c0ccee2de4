//! Resuming an order that is not new — taken over after its intake died or gave up — and how
//! long that may take. Each path goes down: to [`super::authorize`], to [`super::record`], to
//! the lease ([`super::lease`]).

use std::time::Duration;

use orderfleet_payments::{PaymentError, Payments};
use orderfleet_runtime::db::Pool;
use orderfleet_words::OrderId;

use super::authorize::{authorize, call_stripe};
use super::card::{self, Checked};
use super::lease::{release, take_over};
use super::record::{Recorded, record};
use crate::domain::records::order::Order;
use crate::domain::steps::leased::{AuthorizationError, within};
use crate::domain::words::status::OrderStatus;

/// The Stripe calls on the longest path through [`resume`]: the read of the order's card, when
/// it is checked against a cap ([`super::card`]; plus, once, the cards of the product's orders
/// promised before the cap was set), the lookup (one page), the
/// authorization (after a lookup that found nothing, or under the next attempt's key), and,
/// for an intent whose commit finds the order moved on (a stray, [`record`]), its cancel, the
/// read after a failed cancel, the cancel under a fresh key and the read after it
/// (`Payments::cancel_stray`).
pub const CALLS_TO_RESUME: u32 = 7;

/// How long [`resume`] may take, its Stripe calls each at their longest: under the workers'
/// policy 7 × 195.6 s = 1,369.2 s (22 min 49.2 s); its database statements take milliseconds.
/// A lookup of more than one page (an order pending for days on a busy account) may need
/// longer, and is cut off at it ([`take_over_and_resume`]).
pub fn resume_deadline(payments: &Payments) -> Duration {
    payments.longest_call() * CALLS_TO_RESUME
}

/// The sweeper's [`resume`] of a pending order: takes its lease (for [`resume_deadline`] and the
/// margin, [`crate::domain::records::order::lease_for`]) and resumes it, all within that deadline, so the
/// work never outlives the lease; cut off at it, the order stays pending under the lease until
/// the lease lapses. `None`: someone else holds the lease, or the order moved on.
pub async fn take_over_and_resume(
    pool: &Pool,
    payments: &Payments,
    id: OrderId,
) -> Result<Option<Recorded>, AuthorizationError> {
    let deadline = resume_deadline(payments);
    let work = async {
        let lease = crate::domain::records::order::lease_for(deadline);
        let Some(order) = take_over(pool, id, lease).await? else { return Ok(None) };
        resume(pool, payments, &order).await.map(Some)
    };
    within(deadline, work).await
}

/// Sends the attempt's create again under its key, and records the answer. The key's saved
/// answer is the intent as it was then: what it is now (cancelled in the Dashboard since, say)
/// is read before anything is recorded on it.
async fn resend(pool: &Pool, payments: &Payments, order: &Order) -> Result<Recorded, AuthorizationError> {
    let sent = chrono::Utc::now();
    let again = match call_stripe(payments, order).await {
        Ok(intent) if payments.made_before(&intent, sent) => payments.retrieve(&intent.id).await,
        answer => answer,
    };
    record(pool, payments, order, again).await
}

/// How long an order's attempt key is surely kept at Stripe: Stripe prunes a key once it is
/// at least 24 hours old (docs.stripe.com/api/idempotent_requests), and an attempt's key is
/// first sent after its order was made; an hour less, for the clocks.
pub const KEY_KEPT: chrono::TimeDelta = chrono::TimeDelta::hours(23);

/// Whether `order`'s attempt key is surely still kept at Stripe at `now`.
fn key_kept(order: &Order, now: chrono::DateTime<chrono::Utc>) -> bool {
    now - order.created_at < KEY_KEPT
}

/// Authorizes an order that is not new — taken over after its intake died or gave up — whose
/// lease the caller holds.
///
/// While no 5xx is known for its attempt and its key is surely still kept at Stripe (the order
/// is younger than [`KEY_KEPT`]), the create is sent again under the attempt's key: Stripe
/// answers what the key's first request did (the intent of an answer lost on the way, a
/// decline), `409 idempotency_key_in_use` while that request still runs, or runs it now. One
/// request, where a list first would cost a page or more of Stripe's list per retry: in a drop
/// bound by Stripe's rate, every buyer told to come back is such a retry. An answer that is a
/// replay (its intent made before this send) is the intent as it was then, so the intent is
/// read again before it is recorded.
///
/// Otherwise Stripe is asked first for a PaymentIntent made for it (by
/// `metadata[order_id]`, among the intents its list API shows created since the order was
/// made), and what it has is recorded; only if it has none is the order authorized. The key
/// alone is not enough then: Stripe forgets it after 24 hours, and an order still pending by
/// then would get a second PaymentIntent, a second hold on the card that nothing cancels.
///
/// When the list finds nothing, which key:
/// - While no 5xx is known for the attempt, its own key again, which is always safe: Stripe
///   answers what it saved for it (the intent of an answer lost on the way, a decline, a 5xx)
///   or, if the request never reached it, runs it now.
/// - Once the key has answered a 5xx or an `idempotency_error`, nothing more is sent under it:
///   Stripe saved that answer and replays it. A 500's result is indeterminate
///   (docs.stripe.com/error-low-level): the request may have made an intent. The key ran at
///   most once, before that answer came back, so the answer is dated when it comes back
///   (`payment_attempt_at`, `release_after_a_5xx`), and the order moves to its next attempt,
///   with a new key, only if a list begun after that date finds nothing. Stripe's list does not
///   lag its writes, so a buyer's retry a moment later is authorized.
///
/// Moving on as soon as the re-sent key answers 500, trusting a lookup made before that send,
/// would leave a second hold when that create took effect: `crates/order-model` keeps that rule
/// (`ResumeRule::ListBeforeTheResend`) and finds the second hold.
///
/// An order held to a cap per card whose card was never checked has had no PaymentIntent
/// (the check comes before its first): it is checked first ([`super::card`]).
pub async fn resume(pool: &Pool, payments: &Payments, order: &Order) -> Result<Recorded, AuthorizationError> {
    match card::check(pool, payments, order).await? {
        Checked::Go(order) => resume_checked(pool, payments, &order).await,
        Checked::Ended(recorded) => Ok(recorded),
    }
}

/// [`resume`], once the order's card is within its cap.
async fn resume_checked(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
) -> Result<Recorded, AuthorizationError> {
    if !order.payment_attempt_failed && key_kept(order, chrono::Utc::now()) {
        return resend(pool, payments, order).await;
    }
    let listed = std::time::Instant::now();
    // A key that answered a 5xx ran, if at all, before the 5xx came back (`payment_attempt_at`).
    let until = order.payment_attempt_failed.then_some(order.payment_attempt_at);
    match payments.find_by_order(order.id, order.created_at, until).await {
        Ok(Some(intent)) => {
            tracing::info!(payment_intent = intent.id, status = ?intent.status, "found the order's PaymentIntent at Stripe");
            record(pool, payments, order, Ok(intent)).await
        }
        Ok(None) if order.payment_attempt_failed => {
            // Moves on only if the 5xx was dated before this list began.
            let next = crate::domain::records::order::next_payment_attempt(
                pool,
                order.id,
                OrderStatus::PendingAuthorization,
                order.payment_attempt,
                listed.elapsed(),
            )
            .await?;
            match next {
                None => Ok(Recorded::MovedElsewhere),
                Some(next) if next != order.payment_attempt => {
                    tracing::info!(
                        attempt = next,
                        "Stripe holds nothing for the order's last attempt; a new attempt, with a new key"
                    );
                    let next =
                        Order { payment_attempt: next, payment_attempt_failed: false, ..order.clone() };
                    authorize(pool, payments, &next).await
                }
                Some(_) => {
                    release(pool, order).await?;
                    Err(AuthorizationError::ProviderUnavailable(
                        "the attempt's key answered a 5xx after this lookup began; look again".to_owned(),
                    ))
                }
            }
        }
        Ok(None) => {
            let again = call_stripe(payments, order).await;
            record(pool, payments, order, again).await
        }
        Err(
            PaymentError::Unavailable(reason)
            | PaymentError::AttemptFailed(reason)
            | PaymentError::Locked(reason),
        ) => {
            release(pool, order).await?;
            Err(AuthorizationError::ProviderUnavailable(reason))
        }
        Err(refused) => {
            release(pool, order).await?;
            metrics::counter!(crate::metrics::AUTHORIZATION_LOOKUPS_REFUSED.name).increment(1);
            Err(AuthorizationError::LookupRefused(refused.to_string()))
        }
    }
}
