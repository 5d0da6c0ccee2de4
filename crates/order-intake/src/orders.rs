//! Placing an order: the idempotency-key claim, the door, the authorization outside any
//! transaction, and the one transaction that marks the order `authorized` and writes its
//! outbox rows.
//!
//! **The door** comes before any payment call. One statement promises the order its units out
//! of the product's units not yet promised (`units_promised + q <= units_total`, so never more
//! than there are), numbers its place in line, and inserts the order; when the units are not
//! there it writes nothing and the buyer hears `sold_out` at once, without a PaymentIntent and
//! so without a hold on their card. That statement holds the product row's lock, the one lock
//! every buyer of a drop queues on, for as long as it and its commit take and no longer: no
//! network call runs under it. A buyer the door turns away never takes the lock at all: the
//! row version they see already fails the condition.
//!
//! The order row is the idempotency record. `(user_id, idempotency_key)` is unique, so the
//! first request inserts it and every other request with the same key finds it:
//! - a different body → `idempotency_key_reused`;
//! - an order past `pending_authorization` → the first answer again, rebuilt from the row
//!   (it depends only on columns that never change after that answer);
//! - a `pending_authorization` order whose lease another request holds → `idempotency_key_in_use`;
//! - one whose lease was released (the provider was unavailable) or has expired (the intake
//!   died) → this request takes the lease and authorizes again, with the same Stripe key.

use std::time::Duration;

use orderfleet::domain::authorization::{self, AuthorizationError, Recorded};
use orderfleet::domain::order::{ORDER_COLUMNS, Order, OrderStatus};
use orderfleet::domain::payments::Payments;
use orderfleet::domain::tokens::UserId;
use orderfleet::domain::{Currency, OrderId, Quantity, Sku};
use orderfleet::runtime::failure::Kind;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::ApiError;
use crate::request::{IdempotencyKey, OrderRequest};

/// The `202` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    #[schema(value_type = Uuid)]
    /// The new order's id.
    pub order_id: OrderId,
    /// Always `authorized` in a `202`: the units are the order's and the payment is held.
    pub status: OrderStatus,
    /// The price times the quantity, in minor units.
    pub amount: i64,
    #[schema(value_type = String)]
    /// The amount's currency.
    pub currency: Currency,
    #[schema(value_type = String)]
    /// The product.
    pub product_id: Sku,
    #[schema(value_type = i32)]
    /// How many units.
    pub quantity: Quantity,
    /// The order's place in line for its product, from 1.
    pub position: i64,
}

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
    /// A refusal the key keeps (a decline); `replayed` as for `Accepted`.
    Declined {
        /// The refusal (`402 payment_declined`).
        error: ApiError,
        /// Whether an earlier request with the key was refused so.
        replayed: bool,
    },
}

/// The first answer, rebuilt from the order: accepted for any order that got past
/// authorization, declined for a declined one. `None` while it is still pending. It depends
/// only on columns that never change after that answer.
fn answer(order: &Order, replayed: bool) -> Option<Placed> {
    match order.status {
        OrderStatus::PendingAuthorization => None,
        OrderStatus::PaymentDeclined => Some(Placed::Declined { error: ApiError::PaymentDeclined, replayed }),
        _ => Some(Placed::Accepted {
            body: Accepted {
                order_id: order.id,
                status: OrderStatus::Authorized,
                amount: order.amount.minor,
                currency: order.amount.currency.clone(),
                product_id: order.product_id.clone(),
                quantity: order.quantity,
                position: order.position,
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

/// What the door did, and, when it stayed closed, why, as far as its one statement could see.
#[derive(Debug)]
pub enum Door {
    /// The order holds its units and its place in line.
    Admitted(Box<Order>),
    /// The key is used: an earlier request, or a twin a moment ago, created its order.
    KeyTaken,
    /// Fewer units left than asked, in a snapshot that also saw the key unused; with whether
    /// an order holding units may still give them back (not yet paid).
    SoldOut {
        /// Whether `Retry-After` goes with the answer.
        units_may_return: bool,
    },
    /// No such product.
    UnknownProduct,
    /// The product has a cap per buyer (this one): it has a door of its own ([`admit_capped`]).
    Capped(i32),
    /// Closed for a reason the statement could not see in its snapshot: another request took
    /// the units while this one waited for the product row, or the card gate closed it.
    Closed,
    /// The buyer's orders of this product that have not failed, with this one, would hold
    /// more units than the product's cap per buyer.
    OverLimit,
    /// The buyer's cards were declined, or are being tried, as often as the card-testing limit
    /// allows (`card_gate`); refused before any Stripe call, to try again after this.
    CardTesting(std::time::Duration),
}

/// One `POST /v1/orders` through the door, the authorization and the commit.
pub struct Intake<'a> {
    /// The intake's pool.
    pub pool: &'a PgPool,
    /// The Stripe client.
    pub payments: &'a Payments,
    /// How long a request may work on a pending order before another may take it over.
    pub lease: Duration,
    /// Declined cards in the last hour after which a user's new orders are refused before any
    /// Stripe call (card testing); 0: no such limit.
    pub declines_per_hour: u32,
    /// The request's trace context, stored on a new order ([`orderfleet::runtime::trace`]).
    pub traceparent: &'a str,
}

impl Intake<'_> {
    /// Places `request` for `user` under `key`, or answers what the key first answered: the door
    /// (the units promised or `sold_out`), then the Stripe hold, then the order and its outbox
    /// rows in one statement.
    pub async fn place(
        &self,
        user: &UserId,
        key: &IdempotencyKey,
        request: &OrderRequest,
    ) -> Result<Placed, ApiError> {
        let fingerprint = request.fingerprint();
        let entry = Entry {
            user,
            key,
            request,
            fingerprint: &fingerprint,
            lease: self.lease,
            traceparent: self.traceparent,
        };
        // The door's one statement also looks the key up, and says why it stayed closed.
        let door = admit(self.pool, entry, self.declines_per_hour).await?;
        self.after_the_door(entry, door, true).await
    }

    /// What the door's answer leads to. `first` is false after a capped product's own door.
    async fn after_the_door(&self, entry: Entry<'_>, door: Door, first: bool) -> Result<Placed, ApiError> {
        let (user, key, fingerprint) = (entry.user, entry.key, entry.fingerprint);
        match door {
            Door::Admitted(order) => self.authorize(*order, Attempt::First).await,
            Door::CardTesting(wait) => {
                // A twin request with this key may have got in a moment ago (its pending order
                // is what the gate counted): this request answers from that order.
                if let Some(existing) = self.existing(user, key).await? {
                    return self.resume(existing, fingerprint).await;
                }
                metrics::counter!("intake_rate_limited_total", "limit" => "declines").increment(1);
                Err(crate::limits::rate_limited(wait))
            }
            // The key is used: by an earlier request, or by a twin a moment ago.
            Door::KeyTaken => {
                let existing = self.existing(user, key).await?.ok_or_else(|| {
                    ApiError::Unexpected(anyhow::anyhow!("an idempotency key conflicted with no order"))
                })?;
                self.resume(existing, fingerprint).await
            }
            // Seen closed in the statement's snapshot, which also saw the key unused: no twin
            // with this key can hold these units (its promise would be in the snapshot too).
            Door::SoldOut { units_may_return } => Err(ApiError::SoldOut { units_may_return }),
            Door::UnknownProduct => Err(ApiError::UnknownProduct),
            Door::Capped(cap) if first => {
                let door = admit_capped(self.pool, entry, cap, self.declines_per_hour).await?;
                Box::pin(self.after_the_door(entry, door, false)).await
            }
            door @ (Door::Closed | Door::OverLimit | Door::Capped(_)) => {
                // The snapshot saw the units, but the latest version of the product row did
                // not: another request took them while this one waited for the row. That one
                // may be a twin with this key, whose order this request must answer from (in
                // use, or its answer), never sold_out.
                if let Some(existing) = self.existing(user, key).await? {
                    return self.resume(existing, fingerprint).await;
                }
                match door {
                    Door::OverLimit => Err(ApiError::PurchaseLimitReached),
                    _ => match self.turned_away(&entry.request.product_id, entry.request.quantity).await? {
                        TurnedAway::Capped(cap) if first => {
                            let door = admit_capped(self.pool, entry, cap, self.declines_per_hour).await?;
                            Box::pin(self.after_the_door(entry, door, false)).await
                        }
                        TurnedAway::Capped(_) => Err(ApiError::SoldOut { units_may_return: true }),
                        TurnedAway::Refused(refusal) => Err(refusal),
                    },
                }
            }
        }
    }

    /// What a request with a key already used gets: an error for another body, the first
    /// answer again, or the pending order to finish if nobody else is working on it.
    async fn resume(&self, existing: Order, fingerprint: &[u8]) -> Result<Placed, ApiError> {
        // This request's lines belong to the order's trace, which its first request started.
        let span = tracing::Span::current();
        span.record("order_id", tracing::field::display(existing.id));
        if let Some(trace) =
            existing.traceparent.as_deref().and_then(orderfleet::runtime::trace::Trace::parse)
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

    /// Why the door stayed closed: no such product; sold out — with `Retry-After` while
    /// orders ahead hold units that may still come back (not yet paid), without it once every
    /// promised unit is sold; or the product has a cap per buyer and the units asked for, and
    /// goes through its own door ([`admit_capped`]).
    async fn turned_away(&self, product_id: &Sku, quantity: Quantity) -> Result<TurnedAway, ApiError> {
        let (known, units_may_return, cap): (bool, bool, Option<i32>) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM products WHERE id = $1),
                    EXISTS (SELECT 1 FROM orders WHERE product_id = $1
                               AND status IN ('pending_authorization', 'authorized', 'stock_reserved')),
                    (SELECT max_per_buyer FROM products WHERE id = $1 AND units_promised + $2 <= units_total)",
        )
        .bind(product_id)
        .bind(quantity)
        .fetch_one(self.pool)
        .await
        .map_err(database_error)?;
        Ok(match (known, cap) {
            (false, _) => TurnedAway::Refused(ApiError::UnknownProduct),
            (true, Some(cap)) => TurnedAway::Capped(cap),
            (true, None) => TurnedAway::Refused(ApiError::SoldOut { units_may_return }),
        })
    }

    async fn existing(&self, user: &UserId, key: &IdempotencyKey) -> Result<Option<Order>, ApiError> {
        sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE user_id = $1 AND idempotency_key = $2"
        )))
        .bind(user.as_str())
        .bind(key.as_str())
        .fetch_optional(self.pool)
        .await
        .map_err(database_error)
    }

    /// Takes the lease of a pending order nobody is working on.
    async fn take_over(&self, id: OrderId) -> Result<Option<Order>, ApiError> {
        authorization::take_over(self.pool, id, self.lease).await.map_err(database_error)
    }

    /// Authorizes outside any transaction, then records the result (see
    /// [`orderfleet::domain::authorization`]), and answers from what the order has become. An order
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
                failure_reason: Some(authorization::DECLINED.to_owned()),
                ..order
            },
            // Someone else moved it (a racing retry, the sweeper) and decided the answer.
            Ok(Recorded::MovedElsewhere) => self.reload(order.id).await?,
            Err(
                AuthorizationError::ProviderUnavailable(reason) | AuthorizationError::LookupRefused(reason),
            ) => {
                tracing::warn!(reason, "payment provider unavailable; the order stays pending");
                return Err(ApiError::PaymentUnavailable);
            }
            Err(AuthorizationError::Database(e)) => {
                // Give the key back if the database lets us, so a retry need not wait out the
                // lease; if it does not, the lease expires and a retry or the sweeper takes over.
                let _ = authorization::release(self.pool, order.id).await;
                return Err(database_error(e));
            }
        };
        answer(&now, false).ok_or_else(|| {
            ApiError::Unexpected(anyhow::anyhow!("order {} still pending after authorization", order.id))
        })
    }

    async fn reload(&self, id: OrderId) -> Result<Order, ApiError> {
        orderfleet::domain::order::load(self.pool, id)
            .await
            .map_err(database_error)?
            .ok_or_else(|| ApiError::Unexpected(anyhow::anyhow!("order {id} is gone")))
    }
}

/// The door: ONE statement promises the units, takes the next place in line and creates the
/// order under the key, priced from the product, holding the intake's lease. If the product
/// has fewer units unpromised than asked (or does not exist), or a cap per buyer (it goes
/// through `admit_capped`), it writes nothing. With a card-testing limit
/// (`declines_per_hour` > 0) the statement runs inside the buyer's `card_gate`. Public so the
/// benchmark can measure the hot-row statement on its own.
pub async fn admit(pool: &PgPool, entry: Entry<'_>, declines_per_hour: u32) -> Result<Door, ApiError> {
    let started = std::time::Instant::now();
    let admitted = match declines_per_hour {
        0 => door(pool, entry, Cap::OnlyUncapped).await,
        limit => admit_gated(pool, entry, limit).await,
    };
    let outcome = match &admitted {
        Ok(Door::Admitted(_)) => "admitted",
        // A retried key: it never waited on the product row.
        Ok(Door::KeyTaken) => "key_used",
        Ok(_) => "closed",
        Err(_) => "error",
    };
    metrics::histogram!("intake_door_seconds", "outcome" => outcome).record(started.elapsed().as_secs_f64());
    admitted
}

/// The door behind the buyer's card gate: its one statement, with the buyer's count of card
/// attempts (migration `card_gate`: the buyer's lock, then a fresh count) in its condition —
/// one round trip, exact however many requests a buyer sends at once and to however many
/// intakes. When the door stays closed, one more statement says why: the gate (refused before
/// any Stripe call), or the units; if the gate closed it and has opened since (an order of
/// the buyer's was authorized in between) and the units are there, the door is tried again.
async fn admit_gated(pool: &PgPool, entry: Entry<'_>, declines_per_hour: u32) -> Result<Door, ApiError> {
    for _ in 0..3 {
        let admitted = door(pool, entry, Cap::Gated(declines_per_hour)).await?;
        if !matches!(admitted, Door::Closed) {
            return Ok(admitted);
        }
        match card_gate(pool, entry, declines_per_hour).await? {
            (Some(wait), _) => return Ok(Door::CardTesting(wait)),
            (None, true) => continue,
            (None, false) => return Ok(Door::Closed),
        }
    }
    // The gate closed the door three times and opened between: the buyer's other orders are
    // being decided right now. Units are left, so never sold_out: come back in a moment.
    Ok(Door::CardTesting(Duration::from_secs(2)))
}

/// The card-testing limit, in ONE statement: the buyer's count of card attempts (the
/// `card_attempts` function: the buyer's lock, for the rest of the transaction, then a fresh
/// count of their declines of the last hour and their orders still waiting for an
/// authorization). At `declines_per_hour` or more, the order is refused before any Stripe
/// call: `Some` of how long until a new one may pass (when the oldest counted decline is an
/// hour old, or, while orders are still being authorized, a moment). Also whether an uncapped
/// product still has the units asked for. A check before the act in separate statements, as
/// it was, let 20 cards sent at once all reach Stripe (issue 19). Exact in READ COMMITTED
/// (every transaction here): the function's count takes a snapshot after the lock; under
/// REPEATABLE READ a transaction's one snapshot would predate it.
async fn card_gate<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    entry: Entry<'_>,
    declines_per_hour: u32,
) -> Result<(Option<Duration>, bool), ApiError> {
    let limit = i64::from(declines_per_hour);
    let (attempts, declines, ages_out_in, units_left): (i64, i64, Option<f64>, bool) = sqlx::query_as(
        "WITH recent AS (
             SELECT updated_at FROM orders
              WHERE user_id = $1 AND status = 'payment_declined' AND updated_at > now() - interval '1 hour'
         )
         SELECT card_attempts($1),
                (SELECT count(*) FROM recent),
                extract(epoch FROM (SELECT updated_at FROM recent ORDER BY updated_at DESC OFFSET $2 - 1 LIMIT 1)
                                   + interval '1 hour' - now())::float8,
                EXISTS (SELECT 1 FROM products
                         WHERE id = $3 AND units_promised + $4 <= units_total AND max_per_buyer IS NULL)",
    )
    .bind(entry.user.as_str())
    .bind(limit)
    .bind(&entry.request.product_id)
    .bind(entry.request.quantity)
    .fetch_one(executor)
    .await
    .map_err(database_error)?;
    if attempts < limit {
        return Ok((None, units_left));
    }
    let wait = match ages_out_in {
        Some(seconds) if declines >= limit => Duration::from_secs_f64(seconds.max(1.0)),
        // Orders being authorized now end in a second or two, one way or the other.
        _ => Duration::from_secs(2),
    };
    Ok((Some(wait), units_left))
}

/// Why the door stayed closed for good, or that a capped product's own door is to be tried.
enum TurnedAway {
    Refused(ApiError),
    Capped(i32),
}

/// What the door needs of a request.
#[derive(Clone, Copy)]
pub struct Entry<'a> {
    /// The buyer.
    pub user: &'a UserId,
    /// The request's key.
    pub key: &'a IdempotencyKey,
    /// What it asks for.
    pub request: &'a OrderRequest,
    /// [`OrderRequest::fingerprint`]: the same key with another body is refused.
    pub fingerprint: &'a [u8],
    /// How long this request may work on the order before another may take it over.
    pub lease: Duration,
    /// The request's W3C trace context, kept on the order.
    pub traceparent: &'a str,
}

/// Whether the door statement serves only products without a cap per buyer (the one
/// statement of the common case), or any (inside [`admit_capped`], the cap already checked).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cap {
    OnlyUncapped,
    Checked,
    /// Only uncapped products, and only while the buyer's count of card attempts (the
    /// `card_attempts` function, which takes the buyer's lock) is under this.
    Gated(u32),
}

/// The door's statement (see [`admit`]). Besides promising the units, it looks the key up and,
/// when it admits nobody, says why from the same snapshot: the key is used, no such product,
/// too few units left (and whether any may come back), or a cap per buyer. So a sold-out answer
/// and an accepted order's promise each cost this one statement, and a request with a used key
/// this one and the load of the order it finds.
///
/// All of a statement's parts read one snapshot, taken as it starts; only the `UPDATE` of the
/// product row re-reads the row's latest version after waiting for another request's lock on
/// it. So when the snapshot already shows the units gone and the key unused, the answer is
/// `sold_out` for certain: a twin request with this key that took them would be in the
/// snapshot too. When the snapshot shows the units there but the `UPDATE` found them gone,
/// the answer is [`Door::Closed`], and the caller looks again.
async fn door<'e>(executor: impl sqlx::PgExecutor<'e>, entry: Entry<'_>, cap: Cap) -> Result<Door, ApiError> {
    let condition = match cap {
        Cap::OnlyUncapped => "AND max_per_buyer IS NULL".to_owned(),
        Cap::Checked => String::new(),
        Cap::Gated(limit) => format!("AND max_per_buyer IS NULL AND card_attempts($2) < {limit}"),
    };
    let sql = format!(
        "WITH used AS (
             SELECT EXISTS (SELECT 1 FROM orders WHERE user_id = $2 AND idempotency_key = $3) AS used
         ), seen AS (
             SELECT units_total - units_promised AS units_left, max_per_buyer FROM products WHERE id = $5
         ), promised AS (
             UPDATE products SET units_promised = units_promised + $6, last_position = last_position + 1
              WHERE id = $5 AND units_promised + $6 <= units_total {condition}
                AND NOT (SELECT used FROM used)
          RETURNING id, price_minor, currency, last_position
         ), admitted AS (
             INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity,
                                 amount_minor, currency, payment_method, intake_lease_until, position, traceparent)
             SELECT $1, $2, $3, $4, p.id, $6, p.price_minor * $6, p.currency, $7,
                    now() + $8 * interval '1 ms', p.last_position, $9
               FROM promised p
             RETURNING {ORDER_COLUMNS}
         )
         SELECT admitted.*, (SELECT used FROM used) AS key_used, seen.units_left, seen.max_per_buyer,
                CASE WHEN admitted.id IS NULL AND seen.units_left < $6 THEN
                    EXISTS (SELECT 1 FROM orders WHERE product_id = $5
                               AND status IN ('pending_authorization', 'authorized', 'stock_reserved'))
                END AS units_may_return
           FROM (SELECT) AS one
           LEFT JOIN seen ON true
           LEFT JOIN admitted ON true"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(Uuid::now_v7())
        .bind(entry.user.as_str())
        .bind(entry.key.as_str())
        .bind(entry.fingerprint)
        .bind(&entry.request.product_id)
        .bind(entry.request.quantity)
        .bind(&entry.request.payment_method)
        .bind(entry.lease.as_millis() as i64)
        .bind(entry.traceparent)
        .fetch_one(executor)
        .await;
    let row = match row {
        Ok(row) => row,
        // The statement failed as a whole, so the promise it made is undone with it: a twin
        // with this key inserted its order after this statement's snapshot.
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("orders_one_per_idempotency_key") => {
            return Ok(Door::KeyTaken);
        }
        Err(e) => return Err(database_error(e)),
    };
    read_door(&row, entry.request.quantity, cap).map_err(database_error)
}

/// What the door's row says (see [`door`]).
fn read_door(row: &sqlx::postgres::PgRow, quantity: Quantity, cap: Cap) -> sqlx::Result<Door> {
    use sqlx::{FromRow, Row};
    if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
        return Ok(Door::Admitted(Box::new(Order::from_row(row)?)));
    }
    let units_left: Option<i32> = row.try_get("units_left")?;
    let max_per_buyer: Option<i32> = row.try_get("max_per_buyer")?;
    Ok(match (row.try_get::<bool, _>("key_used")?, units_left) {
        (true, _) => Door::KeyTaken,
        (false, None) => Door::UnknownProduct,
        (false, Some(left)) if left < i32::from(quantity) => Door::SoldOut {
            units_may_return: row.try_get::<Option<bool>, _>("units_may_return")?.unwrap_or(true),
        },
        (false, Some(_)) => match (max_per_buyer, cap) {
            (Some(max), Cap::OnlyUncapped | Cap::Gated(_)) => Door::Capped(max),
            _ => Door::Closed,
        },
    })
}

/// The door of a product with a cap per buyer: ONE short transaction that takes a lock of the
/// buyer's own for this product (so a bot's hundred requests at once pass one at a time), counts
/// the units the buyer's orders that have not failed hold, and runs the door's statement only if
/// this order fits under the cap. Each statement of the transaction sees every order committed
/// before it began, so the count includes the buyer's previous request, whichever replica
/// took it. Nothing is written for a refused order.
async fn admit_capped(
    pool: &PgPool,
    entry: Entry<'_>,
    cap: i32,
    declines_per_hour: u32,
) -> Result<Door, ApiError> {
    let (user, product) = (entry.user.as_str(), entry.request.product_id.as_str());
    // Ended by the server if this client goes quiet inside it: its locks never outlive it.
    let mut tx = orderfleet::runtime::db::begin(pool).await.map_err(database_error_of)?;
    // The card gate's lock first, as in every door: locks are always taken in one order.
    if declines_per_hour > 0
        && let (Some(wait), _) = card_gate(&mut *tx, entry, declines_per_hour).await?
    {
        return Ok(Door::CardTesting(wait));
    }
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
        .bind(user)
        .bind(product)
        .execute(&mut *tx)
        .await
        .map_err(database_error)?;
    let held: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(quantity), 0) FROM orders
          WHERE user_id = $1 AND product_id = $2
            AND status NOT IN ('payment_declined', 'rejected_out_of_stock', 'capture_failed')",
    )
    .bind(user)
    .bind(product)
    .fetch_one(&mut *tx)
    .await
    .map_err(database_error)?;
    if held + i64::from(entry.request.quantity) > i64::from(cap) {
        // Dropping the transaction rolls it back: nothing was written.
        return Ok(Door::OverLimit);
    }
    let admitted = door(&mut *tx, entry, Cap::Checked).await?;
    if let Door::Admitted(_) = admitted {
        tx.commit().await.map_err(database_error)?;
    }
    // Otherwise the transaction is dropped, and rolled back: nothing was written.
    Ok(admitted)
}

/// A database error, classified where it happens ([`orderfleet::runtime::db::failure`]): the database
/// unreachable, shutting down or restarting (a statement cut off mid-flight), or a passing
/// failure such as a deadlock, is a 503 — nothing was committed, retry with the same key; only
/// a permanent one (a constraint, a data error) is a 500.
pub(crate) fn database_error(error: sqlx::Error) -> ApiError {
    database_error_of(anyhow::Error::new(error))
}

/// [`database_error`] of an error already in a chain.
fn database_error_of(error: anyhow::Error) -> ApiError {
    match orderfleet::runtime::db::failure(&error).kind {
        Kind::Outage | Kind::Transient => ApiError::Unavailable(
            error.context("the database is unavailable or the statement could not finish"),
        ),
        Kind::Permanent => ApiError::Unexpected(error.context("a database statement failed")),
    }
}
