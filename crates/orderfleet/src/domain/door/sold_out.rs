//! The door's answer to a herd: `sold_out` (or, before the opening, `not_open`) from a read of
//! the product that the requests waiting in this process share, so that a drop's buyers who get
//! nothing cost PostgreSQL one statement a batch, not one each.
//!
//! `not_open` and `sale_paused` are read the same way, never from a schedule kept in the process: an operator may
//! move `opens_at` earlier, or pause and resume a sale, at any moment, and a request is told `not_open` only by a read that
//! began after it arrived. A pre-queue that is open sends its requests to the door, which
//! writes each one's entry.
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
    /// The product is not open, nor its pre-queue, and the key is unused: `not_open`, to ask
    /// again after this long.
    NotOpen(Duration),
    /// An operator paused the product, and the key is unused: `sale_paused`.
    SalePaused,
    /// The door decides: units are left, the pre-queue is open, the key made an order, no
    /// such product, or the read failed.
    Door,
}

/// This process's reads of its products for the requests that may be sold out.
#[derive(Debug, Default)]
pub struct SoldOutReads {
    products: Mutex<HashMap<Sku, Batch>>,
    /// The `sold_out` answers given since the last [`SoldOutReads::record_answers`], by
    /// product, for `fleetctl drop status`.
    answered: Mutex<HashMap<Sku, i64>>,
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

    /// The door answered a request for `product` `sold_out` or `not_open`: its next requests
    /// wait for reads.
    pub fn door_closed(&self, product: &Sku) {
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
        let (answers, plenty) = allot(&asked, read);
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

impl SoldOutReads {
    /// The intake answered a request for `product` `sold_out` (from a read or from the door).
    pub fn answered_sold_out(&self, product: &Sku) {
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = answered.get_mut(product) {
            *n += 1;
        } else if answered.len() < MOST_PRODUCTS {
            answered.insert(product.clone(), 1);
        }
    }

    /// Adds the `sold_out` answers counted since the last call to the database's count for
    /// this second (`door_answers`), in ONE statement that also drops seconds older than ten
    /// minutes; nothing when none were given. Counts that cannot be written are dropped: they
    /// are figures for a screen, not records.
    pub async fn record_answers(&self, pool: &Pool) {
        let counted: Vec<(Sku, i64)> =
            std::mem::take(&mut *self.answered.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .collect();
        if counted.is_empty() {
            return;
        }
        let products: Vec<&str> = counted.iter().map(|(p, _)| p.as_str()).collect();
        let answers: Vec<i64> = counted.iter().map(|(_, n)| *n).collect();
        let written = sqlx::query!(
            "WITH old AS (DELETE FROM door_answers WHERE second < now() - interval '10 minutes')
             INSERT INTO door_answers (product_id, second, sold_out)
             SELECT a.product_id, date_trunc('second', now()), a.n
               FROM unnest($1::text[], $2::int8[]) AS a(product_id, n)
             ON CONFLICT (product_id, second) DO UPDATE SET sold_out = door_answers.sold_out + EXCLUDED.sold_out",
            &products as &[&str],
            &answers
        )
        .execute(pool)
        .await;
        if let Err(error) = written {
            tracing::debug!(%error, "cannot record the sold-out answers for drop status");
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
/// key_used)`. A key that made an order goes to the door (which answers from the order). A
/// paused product is `sale_paused` to every other. A product not open yet, its pre-queue not open either, is `not_open` to every other; one
/// whose pre-queue is open sends every request to the door, which queues it. Else the units
/// left go to the door's requests in arrival order, as many as they cover; a request they do
/// not cover but that the units left would have covered alone waits for the next read; any
/// other is sold out. `None` units (no such product) send every request to the door. With
/// whether the requests after the batch go straight to the door: units are left beyond the
/// batch's (none of it waiting again), or the pre-queue is open.
fn allot(asked: &[(i32, bool)], read: &Read) -> (Vec<Allotted>, bool) {
    let Some(units_left) = read.units_left else {
        return (vec![Allotted::Answer(Verdict::Door); asked.len()], true);
    };
    if read.paused {
        let told = |&(_, key_used): &(i32, bool)| {
            Allotted::Answer(if key_used { Verdict::Door } else { Verdict::SalePaused })
        };
        return (asked.iter().map(told).collect(), false);
    }
    if read.queueing {
        return (vec![Allotted::Answer(Verdict::Door); asked.len()], true);
    }
    if let Some(opens_in) = read.opens_in {
        // As the door says it (`decision`): at least a second, even once `opens_at` passed and
        // the opening is a moment away.
        let wait = Duration::from_secs_f64(opens_in.max(0.0)).max(Duration::from_secs(1));
        let told = |&(_, key_used): &(i32, bool)| {
            Allotted::Answer(if key_used { Verdict::Door } else { Verdict::NotOpen(wait) })
        };
        return (asked.iter().map(told).collect(), false);
    }
    let units_may_return = read.units_may_return;
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
/// failed), whether an order holding units may give them back, its opening (the seconds until
/// it or its pre-queue opens, `None` once open; whether its pre-queue is open now), and for
/// each request whether its key made an order.
#[derive(Debug, Default)]
struct Read {
    units_left: Option<i32>,
    units_may_return: bool,
    opens_in: Option<f64>,
    queueing: bool,
    paused: bool,
    key_used: Vec<bool>,
}

impl Read {
    /// A read that failed: every request goes to the door.
    fn failed(batch: usize) -> Self {
        Self { units_may_return: true, key_used: vec![true; batch], ..Self::default() }
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
    let mut read = Read { key_used: vec![false; batch.len()], ..Read::default() };
    for row in rows {
        if let (Some(units_left), Some(units_may_return)) = (row.units_left, row.units_may_return) {
            (read.units_left, read.units_may_return) = (Some(units_left), units_may_return);
            (read.opens_in, read.queueing) = (row.opens_in, row.queueing.unwrap_or(false));
            read.paused = row.paused.unwrap_or(false);
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

    /// A read of an open product that saw `units_left`.
    fn saw(units_left: Option<i32>, units_may_return: bool) -> Read {
        Read { units_left, units_may_return, ..Read::default() }
    }

    #[test]
    fn before_the_opening_every_unused_key_is_told_not_open_and_the_batching_goes_on() {
        let read = Read { opens_in: Some(90.4), ..saw(Some(5), false) };
        let (answers, plenty) = allot(&[(1, false), (1, true)], &read);
        let not_open = Allotted::Answer(Verdict::NotOpen(Duration::from_secs_f64(90.4)));
        assert_eq!((answers, plenty), (vec![not_open, DOOR], false));
        let due = Read { opens_in: Some(0.0), ..saw(Some(5), false) };
        assert_eq!(
            allot(&[(1, false)], &due).0,
            [Allotted::Answer(Verdict::NotOpen(Duration::from_secs(1)))]
        );
    }

    #[test]
    fn a_paused_product_tells_every_unused_key_sale_paused() {
        let read = Read { paused: true, opens_in: Some(30.0), queueing: true, ..saw(Some(5), false) };
        let paused = Allotted::Answer(Verdict::SalePaused);
        assert_eq!(allot(&[(1, false), (1, true)], &read), (vec![paused, DOOR], false));
    }

    #[test]
    fn an_open_pre_queue_sends_every_request_to_the_door_which_queues_it() {
        let read = Read { opens_in: Some(30.0), queueing: true, ..saw(Some(0), false) };
        assert_eq!(allot(&[(1, false), (2, false)], &read), (vec![DOOR, DOOR], true));
    }

    #[test]
    fn the_units_left_go_to_the_first_requests_and_the_rest_wait_for_the_next_read() {
        let asked = [(1, false), (2, false), (1, false), (3, false)];
        let (answers, plenty) = allot(&asked, &saw(Some(2), true));
        assert_eq!(answers, [DOOR, Allotted::Again, DOOR, SOLD_OUT]);
        assert!(!plenty);
    }

    #[test]
    fn a_key_with_an_order_goes_to_the_door_and_takes_no_unit_even_sold_out() {
        let (answers, _) = allot(&[(1, true), (1, false)], &saw(Some(1), true));
        assert_eq!(answers, [DOOR, DOOR]);
        let (answers, plenty) = allot(&[(1, true), (1, false)], &saw(Some(0), false));
        assert_eq!(answers, [DOOR, Allotted::Answer(Verdict::SoldOut { units_may_return: false })]);
        assert!(!plenty);
    }

    #[test]
    fn units_left_over_while_a_request_waits_again_do_not_send_later_requests_ahead_of_it() {
        let (answers, plenty) = allot(&[(2, false), (2, false)], &saw(Some(3), true));
        assert_eq!(answers, [DOOR, Allotted::Again]);
        assert!(!plenty, "the request waiting again comes before later ones");
    }

    #[test]
    fn units_beyond_the_batch_send_the_requests_after_it_to_the_door() {
        let (answers, plenty) = allot(&[(1, false)], &saw(Some(5), true));
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
        reads.door_closed(&product);
        let Arrival::Waits { lead: true, .. } = reads.arrive(&one_unit(&a, &product)) else {
            panic!("the first request waits, and leads");
        };
        let batch = reads.take_batch(&product).expect("A's read begins");
        let Arrival::Waits { answered: mut b_answered, lead: false } = reads.arrive(&one_unit(&b, &product))
        else {
            panic!("B waits for the next read");
        };

        // Act: A's read sees units beyond its batch (a raise), and C arrives after it.
        let units_beyond = Read { key_used: vec![false], ..saw(Some(5), true) };
        reads.answer_batch(&product, batch, &units_beyond);
        let c_arrival = reads.arrive(&one_unit(&c, &product));

        // Assert: C goes straight to the door, and B, ahead of it, was sent there first.
        assert!(matches!(c_arrival, Arrival::Answered(Verdict::Door)), "{c_arrival:?}");
        assert_eq!(b_answered.try_recv(), Ok(Verdict::Door), "B, which came before C, still waits");
    }

    #[test]
    fn no_such_product_or_a_failed_read_sends_everyone_to_the_door() {
        let (answers, plenty) = allot(&[(1, false), (1, true)], &saw(None, false));
        assert_eq!((answers, plenty), (vec![DOOR, DOOR], true));
        let failed = Read::failed(2);
        let asked: Vec<(i32, bool)> = failed.key_used.iter().map(|used| (1, *used)).collect();
        assert_eq!(allot(&asked, &saw(failed.units_left, true)).0, [DOOR, DOOR]);
    }
}
