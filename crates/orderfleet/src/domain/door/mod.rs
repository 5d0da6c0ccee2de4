//! The door: where an order is promised its units, before any payment call.
//!
//! One statement promises the order its units out of the product's units not yet promised
//! (`units_promised + q <= units_total`, so never more than there are), numbers its place in
//! line, and inserts the order; when the units are not there it writes nothing and the buyer
//! hears `sold_out` at once, without a PaymentIntent and so without a hold on their card. That
//! statement holds the product row's lock, the one lock every buyer of a drop queues on, for as
//! long as it and its commit take and no longer: no network call runs under it. A buyer the
//! door turns away never takes the lock at all: the row version they see already fails the
//! condition.
//!
//! [`admit`] is the one way in, and answers an [`Admission`]. A request for a product this
//! process has seen sold out first waits for a read of the product shared by the requests
//! waiting with it (`sold_out`, [`SoldOutReads`]), which answers `sold_out` without a statement
//! of its own; any other request, and one the read sends on, goes through the door, in at most
//! two passes. What each statement saw goes to the door's decision (`decision.rs`, pure and
//! table-tested), which says what the buyer is told or which statement comes next: the capped
//! door's transaction ([`capped`]), a look again ([`look_again`]) when the door closed for a
//! reason its snapshot could not see, or the door again. A card-testing refusal first looks
//! for a twin request's order under the same key, made while it waited for the buyer's lock,
//! and answers from it.
//!
//! Every statement here is static text with bind parameters. Every path is timed in
//! `intake_door_seconds`, by outcome.

mod decision;
mod sold_out;

use std::sync::Arc;
use std::time::{Duration, Instant};

use orderfleet_runtime::db::Pool;
use sqlx::{PgConnection, PgExecutor};

use crate::domain::records::order::{self, Order};
use crate::domain::words::status::OrderStatus;
use orderfleet_words::{Currency, OrderId, Quantity, Sku, UserId};

use decision::{Decided, Door, DoorSaw, LookAgain, Next, Pass, Told};
pub use sold_out::{SoldOutReads, Verdict};

/// What the door needs of a request.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The buyer.
    pub user: &'a UserId,
    /// The request's idempotency key.
    pub key: &'a str,
    /// The product.
    pub product_id: &'a Sku,
    /// How many units.
    pub quantity: Quantity,
    /// The Stripe PaymentMethod the buyer gave.
    pub payment_method: &'a str,
    /// The request's fingerprint: the same key with another body is refused.
    pub fingerprint: &'a [u8],
    /// How long this request may work on the order before another may take it over.
    pub lease: Duration,
    /// The request's W3C trace context, kept on the order.
    pub traceparent: &'a str,
}

/// What the door answered.
#[derive(Debug)]
pub enum Admission {
    /// A new order, holding its units and its place in line, and the request's lease.
    Admitted(Box<Order>),
    /// A new order in the product's pre-queue: no unit, no place, no PaymentIntent yet.
    Queued(Box<Order>),
    /// The key is used: an earlier request, or a twin a moment ago, made this order.
    KeyUsed(Box<Order>),
    /// Nothing was written.
    Refused(Refusal),
}

/// Why the door stayed closed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    /// Fewer units left than asked; with whether an order holding units may still give them
    /// back (not yet sold), which is when `Retry-After` goes with the answer.
    SoldOut {
        /// Whether units may come back.
        units_may_return: bool,
    },
    /// No such product.
    UnknownProduct,
    /// The buyer's orders of this product that have not failed, with this one, would hold
    /// more units than the product's cap per buyer.
    OverLimit,
    /// The buyer's cards were declined, or are being tried, as often as the card-testing limit
    /// allows: refused before any Stripe call, to try again after this.
    CardTesting(Duration),
    /// The product opens later, and its pre-queue (if any) is not open: in this long, the
    /// queue or the sale opens.
    NotOpen(Duration),
    /// The buyer has an order of this product in its queue already.
    AlreadyQueued,
    /// An operator paused the product's sale (`fleetctl product pause`): ask again after this.
    SalePaused(Duration),
}

/// How long a buyer told `sale_paused` is asked to wait: a pause has no end the door can know,
/// and a resume is seen by the next request, so a few seconds.
pub const PAUSED_RETRY: Duration = Duration::from_secs(5);

/// What one pass through a door came to.
#[derive(Debug)]
enum Passed {
    /// The order is let in.
    Admitted(Box<Order>),
    /// The door admitted nobody: what its statement saw.
    Closed(DoorSaw),
    /// Told before the door's statement (the capped door's own checks).
    Told(Told),
}

/// Lets `request` in or says why not: `sold_out` from a read this process shares among the
/// requests waiting for one (`sold_out`), or else the door, in at most two passes (see the
/// module's table); `declines_per_hour` is the card-testing limit (0: none).
pub async fn admit(
    pool: &Pool,
    reads: &Arc<SoldOutReads>,
    entry: Entry<'_>,
    declines_per_hour: u32,
) -> anyhow::Result<Admission> {
    let started = Instant::now();
    let admission = match reads.ask(pool, &entry).await {
        Verdict::SoldOut { units_may_return } => {
            metrics::histogram!(crate::metrics::INTAKE_DOOR_SECONDS.name, "outcome" => "sold_out_read")
                .record(started.elapsed().as_secs_f64());
            reads.answered_sold_out(entry.product_id);
            return Ok(Admission::Refused(Refusal::SoldOut { units_may_return }));
        }
        Verdict::NotOpen(wait) => {
            metrics::histogram!(crate::metrics::INTAKE_DOOR_SECONDS.name, "outcome" => "not_open_read")
                .record(started.elapsed().as_secs_f64());
            return Ok(Admission::Refused(Refusal::NotOpen(wait)));
        }
        Verdict::SalePaused => {
            metrics::histogram!(crate::metrics::INTAKE_DOOR_SECONDS.name, "outcome" => "sale_paused_read")
                .record(started.elapsed().as_secs_f64());
            return Ok(Admission::Refused(Refusal::SalePaused(PAUSED_RETRY)));
        }
        Verdict::Door => {
            let admission = admit_untimed(pool, entry, declines_per_hour).await;
            if let Ok(Admission::Refused(
                Refusal::SoldOut { .. } | Refusal::NotOpen(_) | Refusal::SalePaused(_),
            )) = admission
            {
                reads.door_closed(entry.product_id);
            }
            if let Ok(Admission::Refused(Refusal::SoldOut { .. })) = admission {
                reads.answered_sold_out(entry.product_id);
            }
            admission
        }
    };
    let outcome = match &admission {
        Ok(Admission::Admitted(_)) => "admitted",
        Ok(Admission::Queued(_)) => "queued",
        Ok(Admission::KeyUsed(_)) => "key_used",
        Ok(Admission::Refused(_)) => "closed",
        Err(_) => "error",
    };
    metrics::histogram!(crate::metrics::INTAKE_DOOR_SECONDS.name, "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
    admission
}

/// The walk of the module's table: each statement's sight goes to [`decision`], which says
/// what the buyer is told or which statement comes next.
async fn admit_untimed(pool: &Pool, entry: Entry<'_>, gate: u32) -> anyhow::Result<Admission> {
    let quantity = i32::from(entry.quantity);
    let mut pass = Pass::First;
    let mut door = Door::Uncapped;
    loop {
        let passed = match door {
            Door::Uncapped => statement(pool, entry, Rule::Uncapped { gate }).await?,
            Door::Capped(cap) => capped(pool, entry, cap, gate).await?,
        };
        let decided = match passed {
            Passed::Admitted(order) if order.status == OrderStatus::Queued => {
                return Ok(Admission::Queued(order));
            }
            Passed::Admitted(order) => return Ok(Admission::Admitted(order)),
            Passed::Told(told) => Decided::Tell(told),
            Passed::Closed(saw) => match decision::after_door(saw, quantity, pass) {
                Next::Decided(decided) => decided,
                Next::LookAgain => {
                    decision::after_look(&look_again(pool, entry, gate).await?, quantity, gate, pass)
                }
            },
        };
        match decided {
            Decided::Tell(told) => return answer(pool, entry, told).await,
            Decided::Through(second) => (pass, door) = (Pass::Second(second), second),
        }
    }
}

/// The admission of what the buyer is told: for a used key, with the order it made. A
/// card-testing refusal looks the key up first, in a statement of its own: the twin request
/// with this key whose pending order the gate counted may have committed while this one waited
/// for the buyer's lock, after the snapshot that looked for it; this request answers from its
/// order.
async fn answer(pool: &Pool, entry: Entry<'_>, told: Told) -> anyhow::Result<Admission> {
    Ok(match told {
        Told::Refused(refusal @ Refusal::CardTesting(_)) => {
            match order::find_by_key(pool, entry.user, entry.key).await? {
                Some(twin_s) => Admission::KeyUsed(Box::new(twin_s)),
                None => Admission::Refused(refusal),
            }
        }
        Told::Refused(refusal) => Admission::Refused(refusal),
        Told::KeyUsed => {
            let order = order::find_by_key(pool, entry.user, entry.key)
                .await?
                .ok_or_else(|| anyhow::anyhow!("an idempotency key conflicted with no order"))?;
            Admission::KeyUsed(Box::new(order))
        }
    })
}

/// Which products a door statement serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Only products without a cap per buyer; with a card-testing limit (`gate` > 0), only
    /// while the buyer's count of card attempts (`card_attempts`, which takes the buyer's lock
    /// until the statement commits) is under it.
    Uncapped { gate: u32 },
    /// Any product: inside [`capped`], which checked the cap and the gate.
    Checked,
}

impl Rule {
    /// The door statement's `any_product` (capped or not) and `gate` (the card gate's limit).
    fn parameters(self) -> (bool, u32) {
        match self {
            Rule::Uncapped { gate } => (false, gate),
            Rule::Checked => (true, 0),
        }
    }
}

/// The door's ONE statement, under `rule`. Besides promising the units, it looks the key up and, when it admits
/// nobody, says why from the same snapshot: the key is used, no such product, too few units
/// left (and whether any may come back), or a cap per buyer. So a sold-out answer and an
/// accepted order's promise each cost this one statement.
///
/// All of a statement's parts read one snapshot, taken as it starts; only the `UPDATE` of the
/// product row re-reads the row's latest version after waiting for another request's lock on
/// it. So when the snapshot already shows the units gone and the key unused, the answer is
/// `sold_out` for certain: a twin request with this key that took them would be in the
/// snapshot too. When the snapshot shows the units there but the `UPDATE` found them gone,
/// the decision looks again ([`look_again`]).
async fn statement<'e>(
    executor: impl PgExecutor<'e>,
    entry: Entry<'_>,
    rule: Rule,
) -> anyhow::Result<Passed> {
    let (any_product, gate) = rule.parameters();
    let row = sqlx::query_file!(
        "src/domain/door/door.sql",
        OrderId::new() as _,
        entry.user as _,
        entry.key,
        entry.fingerprint,
        entry.product_id as _,
        entry.quantity as _,
        entry.payment_method,
        entry.lease.as_millis() as i64,
        entry.traceparent,
        any_product,
        i64::from(gate),
    )
    .fetch_one(executor)
    .await;
    let row = match row {
        Ok(row) => row,
        // The statement failed as a whole, so the promise it made is undone with it: a twin
        // with this key inserted its order after this statement's snapshot.
        Err(e) if is_twin_s_key(&e) => return Ok(Passed::Told(Told::KeyUsed)),
        // The buyer has an order in this product's queue already, under another key.
        Err(e) if is_already_queued(&e) => return Ok(Passed::Told(Told::Refused(Refusal::AlreadyQueued))),
        Err(e) => return Err(anyhow::Error::new(e).context("the door's statement failed")),
    };
    let (key_used, units_left, max_per_buyer) = (row.key_used, row.units_left, row.max_per_buyer);
    let saw = DoorSaw {
        key_used,
        units_left,
        max_per_buyer,
        units_may_return: row.units_may_return,
        opens_in: row.opens_in,
        queueing: row.queueing.unwrap_or(false),
        paused: row.paused.unwrap_or(false),
    };
    Ok(match (move || Some(order::order_from!(row, ?)))() {
        Some(order) => Passed::Admitted(Box::new(order)),
        None => Passed::Closed(saw),
    })
}

/// Whether the door's queue entry met the buyer's order already in the product's queue.
fn is_already_queued(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.constraint() == Some("orders_one_queued_per_buyer"))
}

/// Whether the door's insert met the order a twin request with its key made meanwhile.
fn is_twin_s_key(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.constraint() == Some("orders_one_per_idempotency_key"))
}

/// Why a door closed that its snapshot saw open, in ONE statement: whether a twin with this
/// key has made its order since, the buyer's card gate (with a limit: `card_attempts` takes the
/// buyer's lock, then counts afresh), and the product as it is now (a pause that committed
/// while the door's statement waited for the product row among them).
async fn look_again<'e>(
    executor: impl PgExecutor<'e>,
    entry: Entry<'_>,
    gate: u32,
) -> anyhow::Result<LookAgain> {
    let why = sqlx::query_as!(
        LookAgain,
        r#"WITH recent AS (
             SELECT updated_at FROM orders
              WHERE user_id = $1 AND counts_as_decline(status, failure_reason)
                AND updated_at > now() - interval '1 hour'
         )
         SELECT EXISTS (SELECT 1 FROM orders WHERE user_id = $1 AND idempotency_key = $2) AS "twin!",
                CASE WHEN $4::int8 > 0 THEN card_attempts($1) END AS attempts,
                (SELECT count(*) FROM recent) AS "declines!",
                extract(epoch FROM (SELECT updated_at FROM recent ORDER BY updated_at DESC
                                     OFFSET greatest($4, 1) - 1 LIMIT 1)
                                   + interval '1 hour' - now())::float8 AS ages_out_in,
                CASE WHEN p.queue_waiting THEN 0 ELSE p.units_total - p.units_promised END AS units_left, p.max_per_buyer AS "max_per_buyer?",
                EXISTS (SELECT 1 FROM orders WHERE product_id = $3 AND holds_units(status))
                    AS "units_may_return!",
                COALESCE(p.paused_at IS NOT NULL, false) AS "paused!"
           FROM (SELECT) AS one
           LEFT JOIN products p ON p.id = $3"#,
        entry.user as _,
        entry.key,
        entry.product_id as _,
        i64::from(gate),
    )
    .fetch_one(executor)
    .await?;
    Ok(why)
}

/// The door of a product with a cap per buyer: ONE short transaction that takes a lock of the
/// buyer's own for this product (so a bot's hundred requests at once pass one at a time),
/// counts the units the buyer's orders that have not failed hold, and runs the door's
/// statement only if this order fits under the cap. The card gate's lock comes first, as in
/// every door: locks are always taken in one order. Nothing is written for a refused order.
async fn capped(pool: &Pool, entry: Entry<'_>, cap: i32, gate: u32) -> anyhow::Result<Passed> {
    // Ended by the server if this client goes quiet inside it: its locks never outlive it.
    let mut tx = orderfleet_runtime::db::begin(pool).await?;
    let passed = capped_in(&mut tx, entry, cap, gate).await?;
    // Nothing is written unless the order was let in.
    if let Passed::Admitted(_) = passed {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(passed)
}

/// [`capped`]'s statements, inside its transaction.
async fn capped_in(tx: &mut PgConnection, entry: Entry<'_>, cap: i32, gate: u32) -> anyhow::Result<Passed> {
    if gate > 0
        && let Some(told) = decision::before_the_units(&look_again(&mut *tx, entry, gate).await?, gate)
    {
        return Ok(Passed::Told(told));
    }
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
        entry.user as _,
        entry.product_id as _,
    )
    .execute(&mut *tx)
    .await?;
    // The units the buyer's orders of this product hold, and whether a twin with this key has
    // made its order (of any product): a statement of its own after the buyer's lock, so its
    // snapshot sees every order committed before the lock was granted.
    let held = sqlx::query!(
        r#"SELECT (SELECT COALESCE(sum(quantity), 0)::int8 FROM orders
                    WHERE user_id = $1 AND product_id = $2 AND (holds_units(status) OR sold(status))) AS "units!",
                  EXISTS (SELECT 1 FROM orders WHERE user_id = $1 AND idempotency_key = $3) AS "twin!""#,
        entry.user as _,
        entry.product_id as _,
        entry.key,
    )
    .fetch_one(&mut *tx)
    .await?;
    if let Some(told) = decision::capped(held.twin, held.units, i32::from(entry.quantity), cap) {
        return Ok(Passed::Told(told));
    }
    statement(&mut *tx, entry, Rule::Checked).await
}
