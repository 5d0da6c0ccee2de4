//! The door's answer to a herd: `sold_out` from a read of the product that the requests
//! waiting in this process share, so that a drop's buyers who get nothing cost PostgreSQL one
//! statement a batch, not one each.
//!
//! §8.7 allows `sold_out` only when every unit is promised to buyers ahead or sold, at some
//! moment between the request and its answer. So a request is answered only from a read that
//! began after it arrived. A request joins its product's batch; one task per product (the
//! leader, [`SoldOutReads::lead`]) takes the batch whole, runs ONE statement for it
//! ([`read_batch`]), and answers each of its requests; the requests that arrive meanwhile form
//! the next batch. A process has at most one read of a product in flight, so its reads a
//! second are bounded by the statement's round trip, and the requests a read answers grow
//! with the herd. Nothing is shared between processes but PostgreSQL: each intake batches its
//! own requests.
//!
//! A cache of the units left, kept for a time, would not do: a unit that came back (a
//! decline, an abandoned 3-D Secure, a lapsed hold, a raise) would go to a later buyer while an
//! earlier one heard `sold_out`. The order model plants that cache (`SoldOutRule::LastRead`)
//! and finds the buyer it wrongs.
//!
//! The statement looks up each request's key too, so a retry whose key made an order (of any
//! product) goes on to the door, which answers it from that order (or refuses a key reused
//! with another body): it is never told `sold_out`. A request with units left for it, or for
//! a product there is no such row of, goes on to the door as well, and so does every request
//! of a batch whose read failed. Going to the door is never wrong, only dearer: so a process
//! sends a product's requests straight to the door until the door answers one `sold_out`,
//! and again whenever a read or the door has seen units left, until the door says sold out
//! once more. Only a sold-out product's requests wait for a read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::Entry;
use crate::domain::{Quantity, Sku, UserId};
use crate::runtime::db::Pool;

/// The most requests one read answers; more waiting are the next batch's.
const MOST_A_BATCH: usize = 4_096;

/// The most products a process keeps batches for; a request for one more goes to the door.
const MOST_PRODUCTS: usize = 10_000;

/// The least time from one read of a product to the next in a process: under a herd, a read
/// waits this long after the one before began, and answers every request that arrived
/// meanwhile, so a process reads a product at most 200 times a second whatever the herd's
/// size. A request waits for it only while reads follow each other that closely; one alone
/// is read for at once. (Measured: without it, an intake answering 15,000 sold-out requests a
/// second read about 600 times a second, 0.04 statements per answer.)
const READ_SPACING: Duration = Duration::from_millis(5);

/// What a read says to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Too few units left for it, and its key unused: `sold_out`, with whether an order
    /// holding units may still give them back.
    SoldOut {
        /// Whether units may come back (`Retry-After` goes with the answer).
        units_may_return: bool,
    },
    /// The door decides: units are left, the key made an order, no such product, or the read
    /// failed.
    Door,
}

/// This process's reads of its products for the requests that may be sold out.
#[derive(Debug, Default)]
pub struct SoldOutReads {
    products: Mutex<HashMap<Sku, Batch>>,
}

/// A product's requests waiting for a read, and what this process last knew of it.
#[derive(Debug)]
struct Batch {
    waiting: Vec<Waiter>,
    /// A leader is reading (or about to read) for this product.
    leading: bool,
    /// The last read, or the door, saw units left (or nothing has been seen yet): send
    /// requests to the door.
    units_left: bool,
    /// When the last read began ([`READ_SPACING`]).
    last_began: Option<Instant>,
    /// When the last read ended, and what it saw: read only by the defect the end-to-end suite
    /// plants (`sold_out_cache`).
    last_read: Option<(Instant, Option<i32>, bool)>,
}

impl Default for Batch {
    /// A product this process has not seen answered: its requests go to the door until the
    /// door says it is sold out.
    fn default() -> Self {
        Self { waiting: Vec::new(), leading: false, units_left: true, last_began: None, last_read: None }
    }
}

impl Batch {
    /// The defect the end-to-end suite plants (`sold_out_cache`, a failpoint, in no production
    /// build): `sold_out` from the last read if it is under two seconds old, whenever it began.
    fn planted_cache(&self, quantity: Quantity) -> Option<Verdict> {
        if !crate::runtime::failpoint::planted("sold_out_cache") {
            return None;
        }
        let (at, Some(left), units_may_return) = self.last_read? else { return None };
        let fresh = at.elapsed() < Duration::from_secs(2);
        (fresh && left < quantity.get()).then_some(Verdict::SoldOut { units_may_return })
    }
}

#[derive(Debug)]
struct Waiter {
    user: UserId,
    key: String,
    quantity: Quantity,
    verdict: oneshot::Sender<Verdict>,
}

impl SoldOutReads {
    /// What a read that begins after this call says to `entry`: [`Verdict::SoldOut`] only
    /// from such a read; [`Verdict::Door`] at once while this process last saw units left.
    pub async fn ask(self: &Arc<Self>, pool: &Pool, entry: &Entry<'_>) -> Verdict {
        let (verdict, answered) = oneshot::channel();
        let lead = {
            let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
            if products.len() >= MOST_PRODUCTS && !products.contains_key(entry.product_id) {
                return Verdict::Door;
            }
            let batch = products.entry(entry.product_id.clone()).or_default();
            if batch.units_left {
                return Verdict::Door;
            }
            if let Some(cached) = batch.planted_cache(entry.quantity) {
                return cached;
            }
            batch.waiting.push(Waiter {
                user: entry.user.clone(),
                key: entry.key.to_owned(),
                quantity: entry.quantity,
                verdict,
            });
            !std::mem::replace(&mut batch.leading, true)
        };
        if lead {
            tokio::spawn(Arc::clone(self).lead(pool.clone(), entry.product_id.clone()));
        }
        answered.await.unwrap_or(Verdict::Door)
    }

    /// What a read or the door saw of `product`: units left (an order let in), or none for
    /// the request (`sold_out`). Any other answer of the door says nothing of the units.
    pub fn saw_units_left(&self, product: &Sku, units_left: bool) {
        let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(batch) = products.get_mut(product) {
            batch.units_left = units_left;
        }
    }

    /// What a read saw: units left, for the requests after it to go to the door.
    fn read_ended(&self, product: &Sku, units_left: Option<i32>, units_may_return: bool) {
        let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(batch) = products.get_mut(product) {
            batch.units_left |= units_left.is_some_and(|left| left > 0);
            batch.last_read = Some((Instant::now(), units_left, units_may_return));
        }
    }

    /// The product's leader: while requests wait, takes them as one batch, reads for them,
    /// and answers each. Runs as a task of its own, so a request that goes away does not take
    /// the read of the others with it.
    async fn lead(self: Arc<Self>, pool: Pool, product: Sku) {
        loop {
            let spaced = {
                let products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(batch) = products.get(&product) else { return };
                batch.last_began.map(|began| began + READ_SPACING)
            };
            if let Some(next) = spaced {
                tokio::time::sleep_until(next.into()).await;
            }
            let batch = {
                let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(batch) = products.get_mut(&product) else { return };
                if batch.waiting.is_empty() {
                    batch.leading = false;
                    return;
                }
                batch.last_began = Some(Instant::now());
                let end = batch.waiting.len().min(MOST_A_BATCH);
                batch.waiting.drain(..end).collect::<Vec<_>>()
            };
            metrics::counter!("intake_sold_out_reads_total").increment(1);
            metrics::histogram!("intake_sold_out_read_requests").record(batch.len() as f64);
            let verdicts = match read_batch(&pool, &product, &batch).await {
                Ok((units_left, units_may_return, verdicts)) => {
                    self.read_ended(&product, units_left, units_may_return);
                    verdicts
                }
                Err(error) => {
                    tracing::warn!(%error, "the sold-out read failed; its requests go to the door");
                    vec![Verdict::Door; batch.len()]
                }
            };
            for (waiter, verdict) in batch.into_iter().zip(verdicts) {
                // A request gone (its deadline passed) needs no answer.
                let _ = waiter.verdict.send(verdict);
            }
        }
    }
}

/// A batch's read, ONE statement (`sold_out.sql`): the product's units left (`None`: no such
/// product) and whether an order holding units may give them back, and for each request
/// whether its key made an order; with the verdicts, in the batch's order.
async fn read_batch(
    pool: &Pool,
    product: &Sku,
    batch: &[Waiter],
) -> sqlx::Result<(Option<i32>, bool, Vec<Verdict>)> {
    let users: Vec<&str> = batch.iter().map(|w| w.user.as_str()).collect();
    let keys: Vec<&str> = batch.iter().map(|w| w.key.as_str()).collect();
    let rows = sqlx::query_file!(
        "src/domain/door/sold_out.sql",
        product.as_str(),
        &users as &[&str],
        &keys as &[&str]
    )
    .fetch_all(pool)
    .await?;
    let mut verdicts = vec![Verdict::Door; batch.len()];
    let (mut left, mut may_return) = (None, false);
    for row in rows {
        let (Some(units_left), Some(units_may_return)) = (row.units_left, row.units_may_return) else {
            continue;
        };
        (left, may_return) = (Some(units_left), units_may_return);
        let i = usize::try_from(row.n - 1).ok();
        let Some((i, waiter)) = i.and_then(|i| batch.get(i).map(|w| (i, w))) else { continue };
        if !row.key_used && units_left < waiter.quantity.get() {
            verdicts[i] = Verdict::SoldOut { units_may_return };
        }
    }
    Ok((left, may_return, verdicts))
}
