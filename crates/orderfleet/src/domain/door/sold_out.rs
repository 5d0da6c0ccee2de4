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
//! with another body): it is never told `sold_out`. The units a read sees left go to the
//! door's requests in arrival order, as many as they cover ([`allot`]); a request they would
//! have covered but for those ahead of it waits for the next read, which begins after it
//! arrived too. A product there is no row of, and a read that failed, send their requests to
//! the door. Going to the door is never wrong, only dearer: so a process sends a product's
//! requests straight to the door until the door answers one `sold_out`, and again after a
//! read saw more units left than its batch asked for (a raise, say), until the door says sold
//! out once more. Only a sold-out product's requests wait for a read. The line inside the
//! process holds through that turn: the read that turns the fast path on sends every request
//! still waiting (those that arrived while it was in flight) on to the door with its own
//! batch, told so before any request that arrives after it is let straight through (the door's
//! statements then race as any concurrent requests do, and §8.7 orders them by their answers)
//! ([`SoldOutReads::answer_batch`]; the order model plants the rule before and finds the
//! request it lets pass, `FastPathRule::LaterArrivalsFirst`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::Entry;
use orderfleet_runtime::db::Pool;
use orderfleet_words::{Quantity, Sku, UserId};

/// The most requests one read answers; more waiting are the next batch's.
const MOST_A_BATCH: usize = 4_096;

/// The most products a process keeps batches for (each one the door said was sold out); past
/// it, a product newly sold out keeps sending its requests to the door.
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
    /// A product the door has just said is sold out: its requests wait for reads.
    fn default() -> Self {
        Self { waiting: Vec::new(), leading: false, units_left: false, last_began: None, last_read: None }
    }
}

impl Batch {
    /// The defect the end-to-end suite plants (`sold_out_cache`, a failpoint, in no production
    /// build): `sold_out` from the last read if it is under two seconds old, whenever it began.
    fn planted_cache(&self, quantity: Quantity) -> Option<Verdict> {
        if !orderfleet_runtime::failpoint::planted("sold_out_cache") {
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

/// Where a request stands once it has asked ([`SoldOutReads::arrive`]).
#[derive(Debug)]
enum Arrival {
    /// Answered at once: the door (the fast path, or no batch for the product), or the
    /// defect the end-to-end suite plants.
    Answered(Verdict),
    /// In the product's batch, for a read that begins after now; `lead`: this request starts
    /// the product's leader.
    Waits { answered: oneshot::Receiver<Verdict>, lead: bool },
}

impl SoldOutReads {
    /// What a read that begins after this call says to `entry`: [`Verdict::SoldOut`] only
    /// from such a read; [`Verdict::Door`] at once while this process last saw units left.
    pub async fn ask(self: &Arc<Self>, pool: &Pool, entry: &Entry<'_>) -> Verdict {
        match self.arrive(entry) {
            Arrival::Answered(verdict) => verdict,
            Arrival::Waits { answered, lead } => {
                if lead {
                    tokio::spawn(Arc::clone(self).lead(pool.clone(), entry.product_id.clone()));
                }
                answered.await.unwrap_or(Verdict::Door)
            }
        }
    }

    /// `entry` arrives at its product's batch, under the lock: straight to the door while the
    /// fast path is on, else into the batch, behind every request already there.
    fn arrive(&self, entry: &Entry<'_>) -> Arrival {
        let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
        // A product the door never said was sold out (or no such product) has no batch.
        let Some(batch) = products.get_mut(entry.product_id) else { return Arrival::Answered(Verdict::Door) };
        if batch.units_left {
            return Arrival::Answered(Verdict::Door);
        }
        if let Some(cached) = batch.planted_cache(entry.quantity) {
            return Arrival::Answered(cached);
        }
        let (verdict, answered) = oneshot::channel();
        batch.waiting.push(Waiter {
            user: entry.user.clone(),
            key: entry.key.to_owned(),
            quantity: entry.quantity,
            verdict,
        });
        Arrival::Waits { answered, lead: !std::mem::replace(&mut batch.leading, true) }
    }

    /// The door answered a request for `product` `sold_out`: its next requests wait for reads.
    pub fn door_sold_out(&self, product: &Sku) {
        let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(batch) = products.get_mut(product) {
            batch.units_left = false;
        } else if products.len() < MOST_PRODUCTS {
            products.insert(product.clone(), Batch::default());
        }
    }

    /// The product's leader: while requests wait, takes them as one batch, reads for them,
    /// and answers each. Runs as a task of its own, so a request that goes away does not take
    /// the read of the others with it.
    async fn lead(self: Arc<Self>, pool: Pool, product: Sku) {
        // However the leader ends (a panic, the runtime shutting down mid-read), the product
        // gets a leader again with its next request, and every request left waiting goes to
        // the door rather than waiting for a read that will not come.
        let mut ended = Ended { reads: &self, product: &product, normally: false };
        loop {
            let spaced = {
                let products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(batch) = products.get(&product) else { return };
                batch.last_began.map(|began| began + READ_SPACING)
            };
            if let Some(next) = spaced {
                tokio::time::sleep_until(next.into()).await;
            }
            let Some(batch) = self.take_batch(&product) else {
                ended.normally = true;
                return;
            };
            if batch.is_empty() {
                continue;
            }
            metrics::counter!(crate::metrics::INTAKE_SOLD_OUT_READS.name).increment(1);
            metrics::histogram!(crate::metrics::INTAKE_SOLD_OUT_READ_REQUESTS.name)
                .record(batch.len() as f64);
            // Bounded: the leader outlives the requests' own deadlines, and a connection frozen
            // mid-read would otherwise keep the product's requests waiting until they time out.
            let reading = async { read_batch(&pool, &product, &batch).await.map_err(anyhow::Error::from) };
            let read = match orderfleet_runtime::db::bounded("the sold-out read", reading).await {
                Ok(read) => read,
                Err(error) => {
                    tracing::warn!(%error, "the sold-out read failed; its requests go to the door");
                    Read::failed(batch.len())
                }
            };
            self.answer_batch(&product, batch, &read);
        }
    }

    /// A read begins: the requests waiting for `product` (up to [`MOST_A_BATCH`]) are its
    /// batch, and those that arrive from now on wait for the next. `None` when nobody waits:
    /// the leader ends, under the lock, so that the next request starts one.
    fn take_batch(&self, product: &Sku) -> Option<Vec<Waiter>> {
        let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = products.get_mut(product)?;
        if batch.waiting.is_empty() {
            batch.leading = false;
            return None;
        }
        batch.last_began = Some(Instant::now());
        // A request gone (its deadline passed, its buyer hung up) asks nothing.
        batch.waiting.retain(|waiter| !waiter.verdict.is_closed());
        let end = batch.waiting.len().min(MOST_A_BATCH);
        Some(batch.waiting.drain(..end).collect())
    }

    /// A read ended: each request of its `batch` answered from it ([`allot`]), and what it saw
    /// kept for the requests that come next. Units left beyond the batch's turn the fast path
    /// on; then every request still waiting (each arrived while the read was in flight, so
    /// before any that comes after) is sent on to the door now, under the same lock, before any
    /// later arrival is let straight through.
    fn answer_batch(&self, product: &Sku, batch: Vec<Waiter>, read: &Read) {
        let asked: Vec<(i32, bool)> =
            batch.iter().zip(&read.key_used).map(|(w, used)| (w.quantity.get(), *used)).collect();
        let (answers, plenty) = allot(&asked, read.units_left, read.units_may_return);
        let mut again = Vec::new();
        for (waiter, answer) in batch.into_iter().zip(answers) {
            match answer {
                // A request gone (its deadline passed) needs no answer.
                Allotted::Answer(verdict) => _ = waiter.verdict.send(verdict),
                Allotted::Again => again.push(waiter),
            }
        }
        let mut products = self.products.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(batch) = products.get_mut(product) {
            batch.last_read = Some((Instant::now(), read.units_left, read.units_may_return));
            if plenty {
                // None waits again (`allot`), and these came before anyone the fast path lets by.
                for waiter in batch.waiting.drain(..) {
                    let _ = waiter.verdict.send(Verdict::Door);
                }
                batch.units_left = true;
            } else {
                // Ahead of the requests that came after them: the next read answers them.
                batch.waiting.splice(..0, again);
            }
        }
    }
}

/// A leader's end other than the normal one ([`SoldOutReads::lead`]): no leader for the
/// product, and its waiting requests sent to the door.
struct Ended<'a> {
    reads: &'a SoldOutReads,
    product: &'a Sku,
    /// Ended with nobody waiting, `leading` reset under the lock: nothing to do.
    normally: bool,
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        if self.normally {
            return;
        }
        let mut products = self.reads.products.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(batch) = products.get_mut(self.product) {
            batch.leading = false;
            for waiter in batch.waiting.drain(..) {
                let _ = waiter.verdict.send(Verdict::Door);
            }
        }
    }
}

/// What a read's snapshot says to one request of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allotted {
    Answer(Verdict),
    /// Units were left, but not beyond those of the requests ahead of it in the batch, which
    /// go to the door for them: the next read (which begins after this request arrived, as
    /// this one did) answers it.
    Again,
}

/// The answers a read's snapshot gives a batch, in arrival order: each request `(quantity,
/// key_used)`. A key that made an order goes to the door (which answers from the order); the
/// units left go to the door's requests in arrival order, as many as they cover; a request
/// they do not cover but that the units left would have covered alone waits for the next
/// read; any other is sold out. `None` units (no such product) send every request to the
/// door. With whether units are left beyond the batch's (none of it waiting again), so that
/// the requests after it go straight to the door.
fn allot(asked: &[(i32, bool)], units_left: Option<i32>, units_may_return: bool) -> (Vec<Allotted>, bool) {
    let Some(units_left) = units_left else {
        return (vec![Allotted::Answer(Verdict::Door); asked.len()], true);
    };
    let mut left = units_left;
    let answers = asked
        .iter()
        .map(|&(quantity, key_used)| {
            if key_used {
                Allotted::Answer(Verdict::Door)
            } else if quantity <= left {
                left -= quantity;
                Allotted::Answer(Verdict::Door)
            } else if quantity <= units_left {
                Allotted::Again
            } else {
                Allotted::Answer(Verdict::SoldOut { units_may_return })
            }
        })
        .collect::<Vec<_>>();
    let plenty = left > 0 && !answers.contains(&Allotted::Again);
    (answers, plenty)
}

/// What a batch's read saw: the product's units left (`None`: no such product, or the read
/// failed), whether an order holding units may give them back, and for each request whether
/// its key made an order.
struct Read {
    units_left: Option<i32>,
    units_may_return: bool,
    key_used: Vec<bool>,
}

impl Read {
    /// A read that failed: every request goes to the door.
    fn failed(batch: usize) -> Self {
        Self { units_left: None, units_may_return: true, key_used: vec![true; batch] }
    }
}

/// A batch's read, ONE statement (`sold_out.sql`).
async fn read_batch(pool: &Pool, product: &Sku, batch: &[Waiter]) -> sqlx::Result<Read> {
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
    let mut read = Read { units_left: None, units_may_return: false, key_used: vec![false; batch.len()] };
    for row in rows {
        if let (Some(units_left), Some(units_may_return)) = (row.units_left, row.units_may_return) {
            (read.units_left, read.units_may_return) = (Some(units_left), units_may_return);
        }
        if let Some(used) = usize::try_from(row.n - 1).ok().and_then(|i| read.key_used.get_mut(i)) {
            *used = row.key_used;
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOLD_OUT: Allotted = Allotted::Answer(Verdict::SoldOut { units_may_return: true });
    const DOOR: Allotted = Allotted::Answer(Verdict::Door);

    #[test]
    fn the_units_left_go_to_the_first_requests_and_the_rest_wait_for_the_next_read() {
        let asked = [(1, false), (2, false), (1, false), (3, false)];
        let (answers, plenty) = allot(&asked, Some(2), true);
        assert_eq!(answers, [DOOR, Allotted::Again, DOOR, SOLD_OUT]);
        assert!(!plenty);
    }

    #[test]
    fn a_key_with_an_order_goes_to_the_door_and_takes_no_unit_even_sold_out() {
        let (answers, _) = allot(&[(1, true), (1, false)], Some(1), true);
        assert_eq!(answers, [DOOR, DOOR]);
        let (answers, plenty) = allot(&[(1, true), (1, false)], Some(0), false);
        assert_eq!(answers, [DOOR, Allotted::Answer(Verdict::SoldOut { units_may_return: false })]);
        assert!(!plenty);
    }

    #[test]
    fn units_left_over_while_a_request_waits_again_do_not_send_later_requests_ahead_of_it() {
        let (answers, plenty) = allot(&[(2, false), (2, false)], Some(3), true);
        assert_eq!(answers, [DOOR, Allotted::Again]);
        assert!(!plenty, "the request waiting again comes before later ones");
    }

    #[test]
    fn units_beyond_the_batch_send_the_requests_after_it_to_the_door() {
        let (answers, plenty) = allot(&[(1, false)], Some(5), true);
        assert_eq!((answers, plenty), (vec![DOOR], true));
    }

    /// A request for `product` by `user`, of one unit.
    fn one_unit<'a>(user: &'a UserId, product: &'a Sku) -> Entry<'a> {
        Entry {
            user,
            key: user.as_str(),
            product_id: product,
            quantity: Quantity::parse(1).unwrap(),
            payment_method: "pm_card_visa",
            fingerprint: b"",
            lease: Duration::from_secs(30),
            traceparent: "",
        }
    }

    #[test]
    fn a_read_turning_the_fast_path_on_sends_its_waiters_before_later_ones() {
        // Arrange: the door said sold out; A waits and its read begins; B arrives during it.
        let reads = SoldOutReads::default();
        let product = Sku::parse("herd").unwrap();
        let [a, b, c] = ["a", "b", "c"].map(|user| UserId::parse(user).unwrap());
        reads.door_sold_out(&product);
        let Arrival::Waits { lead: true, .. } = reads.arrive(&one_unit(&a, &product)) else {
            panic!("the first request waits, and leads");
        };
        let batch = reads.take_batch(&product).expect("A's read begins");
        let Arrival::Waits { answered: mut b_answered, lead: false } = reads.arrive(&one_unit(&b, &product))
        else {
            panic!("B waits for the next read");
        };

        // Act: A's read sees units beyond its batch (a raise), and C arrives after it.
        let units_beyond = Read { units_left: Some(5), units_may_return: true, key_used: vec![false] };
        reads.answer_batch(&product, batch, &units_beyond);
        let c_arrival = reads.arrive(&one_unit(&c, &product));

        // Assert: C goes straight to the door, and B, ahead of it, was sent there first.
        assert!(matches!(c_arrival, Arrival::Answered(Verdict::Door)), "{c_arrival:?}");
        assert_eq!(b_answered.try_recv(), Ok(Verdict::Door), "B, which came before C, still waits");
    }

    #[test]
    fn no_such_product_or_a_failed_read_sends_everyone_to_the_door() {
        let (answers, plenty) = allot(&[(1, false), (1, true)], None, false);
        assert_eq!((answers, plenty), (vec![DOOR, DOOR], true));
        let failed = Read::failed(2);
        let asked: Vec<(i32, bool)> = failed.key_used.iter().map(|used| (1, *used)).collect();
        assert_eq!(allot(&asked, failed.units_left, true).0, [DOOR, DOOR]);
    }
}
