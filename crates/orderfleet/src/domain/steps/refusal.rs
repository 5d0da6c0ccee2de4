//! The one rule for an order whose move the database refuses for good (SPEC §8.5): an
//! integrity or check violation, a data exception, a trigger's exception
//! ([`orderfleet_runtime::db::refused_for_good`]). Running the move again refuses it again, so the
//! order has failed, not the fleet. Every path that moves an order with a hold comes here on
//! such a refusal — the intake's first commit and a sweeper's resume
//! ([`crate::domain::steps::authorization::record`]), a 3-D Secure settle by webhook or sweeper
//! ([`crate::domain::steps::three_d_secure`]), the stock worker's reservation and rejection
//! ([`crate::domain::steps::fulfilment`]) — and [`end_refused`] does the same there:
//!
//! 1. the hold is cancelled and the cancel's answer read; one Stripe does not answer is owed to
//!    the reconciliation of strays (`intent_releases_owed`, found `order_refused`), which
//!    releases it whatever the order's status, since no one else will ever move the order;
//! 2. the order ends failed, with [`FailureReason::OrderRefused`] and the database's words in
//!    `decline_detail`, its units back to the line, where the database allows that move;
//! 3. where it does not, the order is left for operators ([`Ended::Stuck`], listed by the
//!    sweeper with the reason, counted in `orders_refused_by_database_total`), its hold
//!    released all the same.
//!
//! The caller then goes on with its other orders: a refusal is one order's, and never ends a
//! sweep, a reconciliation pass or a batch.
//!
//! One move is not taken this way: a capture's record (`stock_reserved` → `paid`). The money
//! is taken by then, so there is no hold to cancel, and ending the order failed would give back
//! a unit that is sold; its message goes to the DLQ with the reason, for a person.

use crate::domain::records::order::{Move, Order, Transition};
use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_payments::Payments;
use orderfleet_runtime::db::Pool;
use orderfleet_words::hold::Hold;

/// Where the refused move was made: the label of `orders_refused_by_database_total{path}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The intake's first commit, or a resume of a pending order (the intake's retry, the
    /// sweeper).
    Authorization,
    /// A 3-D Secure settle, by webhook or sweeper.
    Settle,
    /// The stock worker's (or the sweeper's) step on an authorized order.
    Fulfilment,
}

impl Path {
    fn as_str(self) -> &'static str {
        match self {
            Path::Authorization => "authorization",
            Path::Settle => "settle",
            Path::Fulfilment => "fulfilment",
        }
    }
}

/// What [`end_refused`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The order ended failed with [`FailureReason::OrderRefused`]; the database's words.
    Failed(String),
    /// Someone else moved the order first.
    MovedElsewhere,
    /// The database refuses to end the order too: it is for a person, with why, its hold
    /// released or owed as the reason says.
    Stuck(String),
}

/// The rule of this module for `order`, found in `from`, whose move the database refused with
/// `refusal`: its hold (`intent`, if it has one) cancelled or owed, then the order ended
/// failed if the database lets it, else left for a person.
pub async fn end_refused(
    pool: &Pool,
    payments: &Payments,
    (order, from, intent): (&Order, OrderStatus, Option<&str>),
    refusal: &sqlx::Error,
    path: Path,
) -> Ended {
    let words = format!("the database refused the order's move from {from}: {refusal}");
    metrics::counter!(crate::metrics::ORDERS_REFUSED_BY_DATABASE.name, "path" => path.as_str()).increment(1);
    tracing::error!(
        reason = words,
        path = path.as_str(),
        "the database refuses the order's move; its hold is released"
    );
    let released = match intent {
        Some(intent) => release(pool, payments, order, intent).await,
        None => Released::NothingHeld,
    };
    let Some((_, failed)) = Move::failing(from).map(Move::arrow) else {
        return Ended::Stuck(format!("{words} ({})", released.said()));
    };
    let ended = end(pool, order, from, intent, &words, released == Released::Cancelled).await;
    match ended {
        Ok(true) => Ended::Failed(words),
        Ok(false) => Ended::MovedElsewhere,
        Err(e) => {
            let reason = format!("{words}; and its end as {failed}: {e} ({})", released.said());
            tracing::error!(reason, "the database refuses to end the order too; it needs a person");
            Ended::Stuck(reason)
        }
    }
}

/// The rule for an order the database refuses even its lease (a trigger on every change of
/// its row): no move can be tried, so only its recorded hold is released, as [`end_refused`]
/// would (a cancel Stripe does not answer is owed to the reconciliation of strays, which makes
/// it whatever the order's status). Why it is left for a person, for the sweeper's stuck list.
pub async fn release_untouchable(
    pool: &Pool,
    payments: &Payments,
    order: &Order,
    refusal: &sqlx::Error,
) -> String {
    let Some(intent) = order.payment_intent_id.as_deref() else {
        return format!("the database refuses to touch the order: {refusal} (it holds no PaymentIntent)");
    };
    let released = release(pool, payments, order, intent).await;
    format!(
        "the database refuses to touch the order: {refusal} ({}; fix the row or the rule)",
        released.said()
    )
}

/// What became of the order's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// Stripe shows the intent cancelled.
    Cancelled,
    /// Stripe did not answer: the release is owed to the reconciliation of strays.
    Owed,
    /// Stripe refused the cancel (a captured intent, say): for a person, in the Dashboard.
    Refused,
    /// Neither cancelled nor owed: the database refused the record of the release too.
    Lost,
    /// The order has no PaymentIntent.
    NothingHeld,
}

impl Released {
    fn said(self) -> &'static str {
        match self {
            Released::Cancelled => "its hold is released",
            Released::Owed => "its hold's release is owed: the reconciliation of strays cancels it",
            Released::Refused => "Stripe refused to cancel its hold: cancel it in Stripe's Dashboard",
            Released::Lost => {
                "its hold could not be cancelled nor its release recorded: cancel it in Stripe's Dashboard"
            }
            Released::NothingHeld => "it holds no PaymentIntent",
        }
    }
}

/// Cancels the order's `intent` under the order's key and reads the answer; one Stripe did not
/// answer is written down as owed.
async fn release(pool: &Pool, payments: &Payments, order: &Order, intent: &str) -> Released {
    let cancelled = payments.cancel(order.intent(intent)).await;
    // Whatever its end, the hold is not one this process keeps as its order's.
    payments.not_held_here(intent);
    match cancelled {
        Ok(_) => Released::Cancelled,
        Err(why) if why.is_transient() => {
            match crate::domain::steps::releases::owe(
                pool,
                order.id,
                intent,
                FailureReason::OrderRefused.as_str(),
                &why,
            )
            .await
            {
                Ok(()) => Released::Owed,
                Err(e) => {
                    tracing::error!(
                        payment_intent = intent,
                        error = format!("{e:#}"),
                        "neither released nor owed"
                    );
                    Released::Lost
                }
            }
        }
        Err(refused) => {
            tracing::error!(payment_intent = intent, error = %refused, "Stripe refused to cancel the hold of a refused order");
            Released::Refused
        }
    }
}

/// ONE statement: the order, still in `from`, ends `failed` with [`FailureReason::OrderRefused`],
/// the database's `words` for operators, its units back to the line, and, for a buyer who was
/// told to wait (an accepted order, a 3-D Secure one), `order.rejected`.
async fn end(
    pool: &Pool,
    order: &Order,
    from: OrderStatus,
    intent: Option<&str>,
    words: &str,
    hold_released: bool,
) -> sqlx::Result<bool> {
    let Some(mut ending) = Transition::refused(order, from, words) else { return Ok(false) };
    if let Some(intent_id) = intent {
        ending = ending.with_hold(Hold { intent_id, capture_before: None });
    }
    if hold_released {
        ending = ending.with_hold_released();
    }
    ending.apply(pool).await
}
