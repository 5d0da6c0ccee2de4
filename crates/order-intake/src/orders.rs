//! Placing an order: the door, the authorization outside any transaction, and the one
//! transaction that marks the order `authorized` and writes its outbox rows.
//!
//! **The door** ([`orderfleet::domain::door`]) comes before any payment call: it promises the
//! order its units and its place in line, or refuses with nothing written.
//!
//! The order row is the idempotency record. `(user_id, idempotency_key)` is unique, so the
//! first request inserts it and every other request with the same key finds it:
//! - a different body → `idempotency_key_reused`;
//! - an order past `pending_authorization` → the first answer again, rebuilt from the row
//!   (it depends only on columns that never change after that answer);
//! - a `pending_authorization` order whose lease another request holds → `idempotency_key_in_use`;
//! - one whose lease was released (the provider was unavailable) or has expired (the intake
//!   died) → this request takes the lease and authorizes again, with the same Stripe key.

use std::sync::Arc;
use std::time::Duration;

use orderfleet::domain::door::{self, Admission, Refusal, SoldOutReads};
use orderfleet::domain::records::order::Order;
use orderfleet::domain::steps::authorization::{self, Recorded};
use orderfleet::domain::steps::leased::AuthorizationError;
use orderfleet::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_payments::Payments;
use orderfleet_runtime::db::Pool;
use orderfleet_runtime::failure::Kind;
use orderfleet_words::OrderId;
use orderfleet_words::UserId;

use crate::error::ApiError;

/// The shortest `Retry-After` of a `503 payment_unavailable`.
const MIN_RETRY_AFTER: u64 = 2;
/// The longest: past this the sweeper has authorized the order anyway.
const MAX_RETRY_AFTER: u64 = 600;
use crate::request::{IdempotencyKey, OrderRequest};
use crate::views::{Accepted, PaymentAction};

/// How a request ended, before it becomes HTTP.
#[derive(Debug)]
pub enum Placed {
    /// `202`, the body; `replayed` when an earlier request with the key made it.
    Accepted {
        /// The `202` body.
        body: Accepted,
        /// Whether an earlier request with the key made the order.
        replayed: bool,
    },
    /// A refusal the key keeps (a decline, an order the database refused); `replayed` as for
    /// `Accepted`.
    Declined {
        /// The refusal (`402 payment_declined`, `500 order_refused`).
        error: ApiError,
        /// Whether an earlier request with the key was refused so.
        replayed: bool,
    },
}

/// The first answer, rebuilt from the order: `requires_action` with what the buyer's page
/// needed for an order whose card asked for 3-D Secure (whatever became of it since), accepted
/// for any other order that got past authorization, declined for a declined one. `None` while
/// it is still pending. It depends only on columns that never change after that answer.
fn answer(order: &Order, replayed: bool) -> Option<Placed> {
    if order.queued_for.is_some() {
        // Taken in the pre-queue: `202 queued`, whatever it became since.
        let body =
            Accepted { status: OrderStatus::Queued, position: None, payment: None, ..Accepted::of(order) };
        return Some(Placed::Accepted { body, replayed });
    }
    if let Some(payment) = PaymentAction::of(order) {
        let body =
            Accepted { status: OrderStatus::RequiresAction, payment: Some(payment), ..Accepted::of(order) };
        return Some(Placed::Accepted { body, replayed });
    }
    match order.status {
        OrderStatus::PendingAuthorization | OrderStatus::RequiresAction => None,
        // The fleet's fault, not the card's: refused by the database, or an attempt of its own
        // that never confirmed (cancelled). Told alike: the order is over, and holds nothing.
        OrderStatus::PaymentDeclined
            if matches!(
                order.failure_reason,
                Some(FailureReason::OrderRefused | FailureReason::AuthorizationIncomplete)
            ) =>
        {
            Some(Placed::Declined { error: ApiError::OrderRefused, replayed })
        }
        // Over its card's cap: no PaymentIntent was made; not a card decline.
        OrderStatus::PaymentDeclined if order.failure_reason == Some(FailureReason::CardLimitReached) => {
            Some(Placed::Declined { error: ApiError::PurchaseLimitReached, replayed })
        }
        OrderStatus::PaymentDeclined => Some(Placed::Declined { error: ApiError::PaymentDeclined, replayed }),
        _ => Some(Placed::Accepted {
            body: Accepted {
                // The answer the first request gave, whatever the order has become since.
                status: OrderStatus::Authorized,
                payment: None,
                ..Accepted::of(order)
            },
            replayed,
        }),
    }
}

/// Whether an order is being authorized for the first time, or again after an earlier request
/// stopped (died, or gave up on an unavailable provider).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    First,
    Resumed,
}

/// One `POST /v1/orders` through the door, the authorization and the commit.
pub struct Intake<'a> {
    /// The intake's pool.
    pub pool: &'a Pool,
    /// The Stripe client.
    pub payments: &'a Payments,
    /// How long a request may work on a pending order before another may take it over.
    pub lease: Duration,
    /// Declined cards in the last hour after which a user's new orders are refused before any
    /// Stripe call (card testing); 0: no such limit.
    pub declines_per_hour: u32,
    /// The request's trace context, stored on a new order ([`orderfleet_runtime::trace`]).
    pub traceparent: &'a str,
    /// The reads of a product this intake's requests share, for `sold_out`.
    pub sold_out_reads: &'a Arc<SoldOutReads>,
}

impl Intake<'_> {
    /// Places `request` for `user` under `key`, or answers what the key first answered: the door
    /// (the units promised or a refusal), then the Stripe hold, then the order and its outbox
    /// rows in one statement.
    pub async fn place(
        &self,
        user: &UserId,
        key: &IdempotencyKey,
        request: &OrderRequest,
    ) -> Result<Placed, ApiError> {
        let fingerprint = request.fingerprint();
        let entry = door::Entry {
            user,
            key: key.as_str(),
            product_id: &request.product_id,
            quantity: request.quantity,
            payment_method: &request.payment_method,
            fingerprint: &fingerprint,
            lease: self.lease,
            traceparent: self.traceparent,
        };
        let admission = door::admit(self.pool, self.sold_out_reads, entry, self.declines_per_hour)
            .await
            .map_err(database_error_of)?;
        match admission {
            Admission::Admitted(order) => self.authorize(*order, Attempt::First).await,
            // No unit and no PaymentIntent until the opening promises it its units.
            Admission::Queued(order) => Ok(Placed::Accepted { body: Accepted::of(&order), replayed: false }),
            Admission::KeyUsed(order) => self.resume(*order, &fingerprint).await,
            Admission::Refused(refusal) => Err(refused(refusal)),
        }
    }

    /// What a request with a key already used gets: an error for another body, the first
    /// answer again, or the pending order to finish if nobody else is working on it.
    async fn resume(&self, existing: Order, fingerprint: &[u8]) -> Result<Placed, ApiError> {
        // This request's lines belong to the order's trace, which its first request started.
        let span = tracing::Span::current();
        span.record("order_id", tracing::field::display(existing.id));
        if let Some(trace) = existing.traceparent.as_deref().and_then(orderfleet_runtime::trace::Trace::parse)
        {
            span.record("trace_id", trace.trace_id());
        }
        if existing.request_hash != fingerprint {
            return Err(ApiError::IdempotencyKeyReused);
        }
        if let Some(answer) = answer(&existing, true) {
            return Ok(answer);
        }
        let order = self.take_over(existing.id).await?.ok_or(ApiError::IdempotencyKeyInUse)?;
        self.authorize(order, Attempt::Resumed).await
    }

    /// Takes the lease of a pending order nobody is working on.
    async fn take_over(&self, id: OrderId) -> Result<Option<Order>, ApiError> {
        authorization::take_over(self.pool, id, self.lease).await.map_err(|e| {
            // An order the database refuses even its lease answers as any refused order does.
            if orderfleet_runtime::db::refused_for_good(&e) {
                ApiError::OrderRefused
            } else {
                database_error(e)
            }
        })
    }

    /// Authorizes outside any transaction, then records the result (see
    /// [`orderfleet::domain::steps::authorization`]), and answers from what the order has become. An order
    /// taken over from an earlier request is first looked up at Stripe, so that a retry a day
    /// later, after Stripe forgot the key, finds the first PaymentIntent instead of making a
    /// second; a new order cannot have one yet, and costs one Stripe request.
    async fn authorize(&self, order: Order, attempt: Attempt) -> Result<Placed, ApiError> {
        tracing::Span::current().record("order_id", tracing::field::display(order.id));
        let result = match attempt {
            Attempt::First => authorization::authorize(self.pool, self.payments, &order).await,
            Attempt::Resumed => authorization::resume(self.pool, self.payments, &order).await,
        };
        let now = match result {
            // This request moved the order: the answer follows from what it wrote.
            Ok(Recorded::Authorized) => Order { status: OrderStatus::Authorized, ..order },
            Ok(Recorded::Declined(_detail)) => Order {
                status: OrderStatus::PaymentDeclined,
                failure_reason: Some(FailureReason::PaymentDeclined),
                ..order
            },
            // Someone else moved it (a racing retry, the sweeper) and decided the answer.
            // The card needs 3-D Secure: the order as recorded, with what the buyer's page needs.
            Ok(Recorded::Refused(_words)) => Order {
                status: OrderStatus::PaymentDeclined,
                failure_reason: Some(FailureReason::OrderRefused),
                ..order
            },
            Ok(Recorded::Incomplete(_detail)) => Order {
                status: OrderStatus::PaymentDeclined,
                failure_reason: Some(FailureReason::AuthorizationIncomplete),
                ..order
            },
            Ok(Recorded::OverCardCap) => Order {
                status: OrderStatus::PaymentDeclined,
                failure_reason: Some(FailureReason::CardLimitReached),
                ..order
            },
            Ok(Recorded::MovedElsewhere | Recorded::RequiresAction) => self.reload(order.id).await?,
            Err(
                AuthorizationError::ProviderUnavailable(reason) | AuthorizationError::LookupRefused(reason),
            ) => {
                tracing::warn!(reason, "payment provider unavailable; the order stays pending");
                return Err(ApiError::PaymentUnavailable {
                    retry_after_seconds: self.wait_ahead(&order).await,
                });
            }
            // The database refuses the order and its end: its hold is released (or owed), and
            // the same key answers the same until a person mends the row or the rule.
            Err(AuthorizationError::OrderRefused(reason)) => {
                tracing::error!(reason, "the database refuses the order; it needs a person");
                give_back_when_able(self.pool.clone(), order);
                return Err(ApiError::OrderRefused);
            }
            // Refused outside the rule's move (a decline's record, say): the same answer.
            Err(AuthorizationError::Database(e)) if orderfleet_runtime::db::refused_for_good(&e) => {
                tracing::error!(error = %e, "the database refuses the order; it needs a person");
                give_back_when_able(self.pool.clone(), order);
                return Err(ApiError::OrderRefused);
            }
            Err(AuthorizationError::Database(e)) => {
                give_back_when_able(self.pool.clone(), order);
                return Err(database_error(e));
            }
        };
        answer(&now, false).ok_or_else(|| {
            ApiError::Unexpected(anyhow::anyhow!("order {} still pending after authorization", order.id))
        })
    }

    /// The `Retry-After` of an order the fleet could not authorize now: the orders ahead of it
    /// that still wait for theirs, and itself, at the fleet's create rate, less the time a
    /// request may queue here for its turn (so the buyer is back in the queue before the turn
    /// comes, not after it); 2 s at the least, and when the line cannot be read.
    async fn wait_ahead(&self, order: &Order) -> u64 {
        let ahead = authorization::waiting_ahead(self.pool, order).await.unwrap_or(0);
        let seconds = (ahead + 1) as f64 / self.payments.create_rate().max(0.1);
        let queued = self.payments.budget_wait().as_secs();
        (seconds.ceil() as u64).saturating_sub(queued).clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER)
    }

    async fn reload(&self, id: OrderId) -> Result<Order, ApiError> {
        orderfleet::domain::records::order::load(self.pool, id)
            .await
            .map_err(database_error)?
            .ok_or_else(|| ApiError::Unexpected(anyhow::anyhow!("order {id} is gone")))
    }
}

/// Gives the order's key back as soon as the database lets us, so a retry need not wait out
/// the lease (the request timeout and 5 s): tried at once, then every second, in the
/// background, until it is given back or the lease has run out. A database failing under the
/// record (a restart, a failover) fails the release too at first. A late release takes
/// nothing from a later holder: it clears only this request's own lease (`release_lease`).
fn give_back_when_able(pool: Pool, order: Order) {
    tokio::spawn(async move {
        loop {
            if authorization::release(&pool, &order).await.is_ok() {
                return;
            }
            if order.intake_lease_until.is_none_or(|until| until <= chrono::Utc::now()) {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

/// The answer to a request the door refused.
fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::SoldOut { units_may_return } => ApiError::SoldOut { units_may_return },
        Refusal::UnknownProduct => ApiError::UnknownProduct,
        Refusal::OverLimit => ApiError::PurchaseLimitReached,
        Refusal::NotOpen(wait) => ApiError::NotOpen(wait.as_secs_f64().ceil() as u64),
        Refusal::AlreadyQueued => ApiError::AlreadyQueued,
        Refusal::SalePaused(wait) => ApiError::SalePaused(wait.as_secs()),
        Refusal::CardTesting(wait) => {
            metrics::counter!(crate::metrics::INTAKE_RATE_LIMITED.name, "limit" => "declines").increment(1);
            crate::limits::rate_limited(wait)
        }
    }
}

/// A database error, classified where it happens ([`orderfleet_runtime::db::failure`]): the database
/// unreachable, shutting down or restarting (a statement cut off mid-flight), or a passing
/// failure such as a deadlock, is a 503 — nothing was committed, retry with the same key; only
/// a permanent one (a constraint, a data error) is a 500.
pub(crate) fn database_error(error: sqlx::Error) -> ApiError {
    database_error_of(anyhow::Error::new(error))
}

/// [`database_error`] of an error already in a chain.
pub(crate) fn database_error_of(error: anyhow::Error) -> ApiError {
    match orderfleet_runtime::db::failure(&error).kind {
        Kind::Outage | Kind::Transient => ApiError::Unavailable(
            error.context("the database is unavailable or the statement could not finish"),
        ),
        Kind::Permanent => ApiError::Unexpected(error.context("a database statement failed")),
    }
}
