//! Settling an order's hold with Stripe: the capture of a `stock_reserved` order and its record
//! (`paid`, or `capture_failed` / `authorization_canceled` with the units back), the cancel of
//! a hold that will not be captured, the end of an `authorized` order whose hold is past its
//! deadline, and `after_a_failed_capture`: what a capture that Stripe answered with a saved 5xx
//! did, and the move to the order's next attempt when it did nothing. Each Stripe
//! call runs outside any transaction; each record is ONE statement.

use std::time::Duration;

use super::{Fulfilment, Step};
use crate::domain::records::order::{self, Order, Transition};
use crate::domain::records::outbox::OrderNotification;
use crate::domain::words::status::OrderStatus;
use orderfleet_payments::{AttemptDid, Intent, IntentStatus, PaymentError, STRIPE};
use orderfleet_runtime::failure::Failure;
use orderfleet_words::OrderId;

/// What a capture step did.
pub(super) enum Captured {
    /// This step moved the order (to `paid` or `capture_failed`).
    Moved(OrderStatus),
    /// Another delivery had already moved it.
    Lost,
    /// Stripe did not answer.
    Blocked(String),
    /// The database refused the record of a refused capture for good: the order took the
    /// rule of [`crate::domain::steps::refusal`] (`Err`: it is for a person).
    Refused(Result<(), Failure>),
    /// Stripe held the intent for another request through every retry.
    Locked(String),
}

/// Why a capture did not end in a captured intent, once a saved 5xx was looked into
/// ([`Fulfilment::after_a_failed_capture`]).
enum AfterCapture {
    /// Stripe's answer, or what the attempt did.
    Stripe(PaymentError),
    /// The database refused or failed the start of the next attempt.
    Database(anyhow::Error),
}

impl Fulfilment {
    /// Captures outside any transaction, then records the result in one statement.
    pub(super) async fn capture(&self, order: &Order) -> anyhow::Result<Captured> {
        let Some(intent) = order.payment_intent_id.as_deref() else {
            // Cannot happen (an authorized order has its intent); a person must look.
            anyhow::bail!("order {} has no payment intent", order.id);
        };
        let captured = self.payments.capture(order.intent(intent)).await;
        let captured = match self.after_a_failed_capture(order, intent, captured).await {
            Ok(intent) => Ok(intent),
            Err(AfterCapture::Stripe(e)) => Err(e),
            Err(AfterCapture::Database(e)) => return Err(e),
        };
        match captured {
            Ok(_) => {
                let moved =
                    self.record_paid(order.id, OrderNotification::of(order, OrderStatus::Paid, None)).await?;
                orderfleet_runtime::failpoint::hit("after_paid");
                Ok(if moved { Captured::Moved(OrderStatus::Paid) } else { Captured::Lost })
            }
            Err(PaymentError::Unavailable(reason) | PaymentError::AttemptFailed(reason)) => {
                Ok(Captured::Blocked(reason))
            }
            Err(PaymentError::Locked(reason)) => Ok(Captured::Locked(reason)),
            Err(refused) => {
                // The provider will not capture (the authorization expired or was cancelled):
                // the order fails cleanly, its units go back, and the user hears of it. The
                // order row is locked before the product row, as in `reserve`.
                // Stripe's words are for operators (the log and `decline_detail`); the buyer,
                // in `GET` and in the notification, reads only the code.
                let detail = format!("capture refused: {refused}");
                tracing::warn!(detail, "the payment provider refused the capture");
                // A hold that is gone (it lapsed, or was cancelled in the Dashboard) is not a
                // failed capture: the order ends `authorization_canceled` (SPEC §5).
                let ended = match self.payments.retrieve(intent).await {
                    // Captured already (an earlier capture whose record was lost or refused, its
                    // key's saved answer expired since): the unit is sold, and never given back.
                    Ok(now) if now.status == IntentStatus::Succeeded => {
                        let paid = OrderNotification::of(order, OrderStatus::Paid, None);
                        let moved = self.record_paid(order.id, paid).await?;
                        return Ok(if moved { Captured::Moved(OrderStatus::Paid) } else { Captured::Lost });
                    }
                    Ok(now) if now.status == IntentStatus::Canceled => OrderStatus::AuthorizationCanceled,
                    Ok(_) => OrderStatus::CaptureFailed,
                    Err(PaymentError::Locked(reason)) => return Ok(Captured::Locked(reason)),
                    Err(e) if e.is_transient() => return Ok(Captured::Blocked(e.to_string())),
                    Err(_) => OrderStatus::CaptureFailed,
                };
                let recorded = orderfleet_runtime::db::bounded(
                    "failed to record the refused capture",
                    self.fail_capture(order, &detail, ended),
                )
                .await;
                match recorded {
                    Err(e) => match super::refusal_in(&e) {
                        Some(refusal) => Ok(Captured::Refused(self.refused(order, refusal).await)),
                        None => Err(e),
                    },
                    recorded => recorded,
                }
            }
        }
    }

    /// After a capture: ONE statement (bounded) moves the order `stock_reserved` → `paid` with
    /// its `order.paid` message; whether this call made the move.
    pub(super) async fn record_paid(
        &self,
        order_id: OrderId,
        paid: OrderNotification,
    ) -> anyhow::Result<bool> {
        orderfleet_runtime::failpoint::hit("after_capture");
        let record = Transition::captured(order_id, paid).apply(&self.pool);
        orderfleet_runtime::db::bounded("failed to record the capture", async {
            record.await.map_err(anyhow::Error::from)
        })
        .await
    }

    /// A capture Stripe refused: ONE statement moves the order to `ended` — `capture_failed`,
    /// or `authorization_canceled` when its hold is gone (no cancel then) — with its
    /// `order.rejected` message, keeps Stripe's `detail` where only operators look, and gives
    /// its units back to the stock and the door.
    async fn fail_capture(
        &self,
        order: &Order,
        detail: &str,
        ended: OrderStatus,
    ) -> anyhow::Result<Captured> {
        let transition = match ended {
            OrderStatus::AuthorizationCanceled => {
                Transition::hold_lost(order, OrderStatus::StockReserved, detail)
                    .expect("a reserved order's hold can be lost")
            }
            _ => Transition::capture_failed(order, detail),
        };
        Ok(match transition.apply(&self.pool).await? {
            true => Captured::Moved(ended),
            false => Captured::Lost,
        })
    }

    /// After Stripe answered a capture with a 5xx, which it saved under the attempt's key:
    /// what the attempt did
    /// ([`orderfleet_payments::Payments::what_the_attempt_did`]). Captured: done. Still
    /// holding funds: the attempt did nothing, so the order moves to its next attempt, whose
    /// new keys the step uses when it runs again (the failure stays, and the message is held
    /// until Stripe answers). Gone elsewhere: the capture's refusal. Other results pass
    /// through. (A cancel goes on under a fresh key inside `Payments::cancel`.)
    async fn after_a_failed_capture(
        &self,
        order: &Order,
        intent: &str,
        result: Result<Intent, PaymentError>,
    ) -> Result<Intent, AfterCapture> {
        let reason = match result {
            Err(PaymentError::AttemptFailed(reason)) => reason,
            other => return other.map_err(AfterCapture::Stripe),
        };
        let now = match self.payments.what_the_attempt_did(intent, IntentStatus::Succeeded).await {
            Ok(AttemptDid::Done(now)) => return Ok(now),
            Ok(AttemptDid::Elsewhere(now)) => {
                let message = format!("{reason}; the intent is now {:?}", now.status);
                return Err(AfterCapture::Stripe(PaymentError::Refused {
                    code: "payment_intent_unexpected_state".into(),
                    message,
                    status: 400,
                }));
            }
            Ok(AttemptDid::Nothing(now)) => now,
            // The intent held by another request: that one intent's, never an outage.
            Err(PaymentError::Locked(why)) => {
                return Err(AfterCapture::Stripe(PaymentError::Locked(format!("{reason}; then {why}"))));
            }
            Err(e) => {
                return Err(AfterCapture::Stripe(PaymentError::Unavailable(format!("{reason}; then {e}"))));
            }
        };
        debug_assert_eq!(now.status, IntentStatus::RequiresCapture);
        let next = orderfleet_runtime::db::bounded("failed to start the next payment attempt", async {
            order::next_payment_attempt(
                &self.pool,
                order.id,
                order.status,
                order.payment_attempt,
                Duration::ZERO,
            )
            .await
            .map_err(anyhow::Error::from)
        })
        .await
        .map_err(AfterCapture::Database)?;
        tracing::warn!(
            attempt = next,
            reason,
            "Stripe saved a failure under this attempt's key and did nothing; the next attempt has new keys"
        );
        let nothing_done = format!("{reason}; nothing done, the next attempt has new keys");
        Err(AfterCapture::Stripe(PaymentError::AttemptFailed(nothing_done)))
    }

    /// An `authorized` order whose hold is past the deadline Stripe gave for it
    /// (`authorization_expires_at`): Stripe cancels such a hold by itself, so the order could
    /// never be captured. ONE statement ends it `authorization_canceled`, as the webhook of the
    /// cancelled hold would, with its `order.rejected` message and its promised units back to
    /// the door, before it takes a unit an order behind it could have had. Its hold is then
    /// released under the order's key ([`Fulfilment::release_authorization`]). Whether this
    /// call made the move.
    pub(super) async fn lapse(&self, order: &Order) -> anyhow::Result<bool> {
        let lapsed = "the hold passed the deadline Stripe gave for it before the order's units were reserved";
        let moved = Transition::lapsed(order, lapsed).apply(&self.pool).await?;
        if moved {
            tracing::warn!(
                "the order's hold is past its deadline; it takes no units, which go back to the line"
            );
        }
        Ok(moved)
    }

    /// Cancels the authorization of an order that will not be captured, once.
    pub(super) async fn release_authorization(&self, order: &Order) -> anyhow::Result<Step> {
        if order.authorization_released_at.is_some() {
            return Ok(Step::Done);
        }
        let mark_released = || {
            orderfleet_runtime::db::bounded("failed to record the released authorization", async {
                order::mark_authorization_released(&self.pool, order.id).await.map_err(anyhow::Error::from)
            })
        };
        let Some(intent) = order.payment_intent_id.as_deref() else {
            mark_released().await?;
            return Ok(Step::Done);
        };
        let cancelled = match self.payments.cancel(order.intent(intent)).await {
            // A saved 5xx that `Payments::cancel` did not get past (it sends the cancel again
            // under a fresh key while the intent can still be cancelled): the intent says what
            // became of it; one captured meanwhile is the cancel's refusal, for a person.
            Err(PaymentError::AttemptFailed(reason)) => {
                match self.payments.what_the_attempt_did(intent, IntentStatus::Canceled).await {
                    Ok(AttemptDid::Done(now)) => Ok(now),
                    Ok(AttemptDid::Elsewhere(now)) => Err(PaymentError::Refused {
                        code: "payment_intent_unexpected_state".into(),
                        message: format!("{reason}; the intent is now {:?}", now.status),
                        status: 400,
                    }),
                    Ok(AttemptDid::Nothing(_)) => Err(PaymentError::AttemptFailed(reason)),
                    Err(PaymentError::Locked(why)) => {
                        Err(PaymentError::Locked(format!("{reason}; then {why}")))
                    }
                    Err(e) => Err(PaymentError::Unavailable(format!("{reason}; then {e}"))),
                }
            }
            other => other,
        };
        match cancelled {
            Ok(_) => {
                mark_released().await?;
                Ok(Step::Done)
            }
            Err(PaymentError::Unavailable(reason) | PaymentError::AttemptFailed(reason)) => {
                Ok(Step::Failed(Failure::outage(STRIPE, "unavailable", reason)))
            }
            Err(PaymentError::Locked(reason)) => Ok(Step::Failed(PaymentError::locked_failure(reason))),
            Err(refused) => {
                let reason = format!("cannot cancel the authorization of order {}: {refused}", order.id);
                Ok(Step::Failed(Failure::permanent(STRIPE, "cancel_refused", reason)))
            }
        }
    }
}
