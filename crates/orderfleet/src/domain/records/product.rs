//! Products: what is for sale, at what price, and how many units are left.
//!
//! ## The unit counters, and every statement that moves them
//!
//! A product row carries `units_total` (for sale, sold ones included), `units_promised`
//! (held by orders that have not failed: the door's count), `stock` (not yet taken out by a
//! reservation) and `last_position` (the line's end). SPEC §8.3 is that they always add up:
//! `units_promised` is the units of the product's orders in `pending_authorization`,
//! `authorized`, `stock_reserved` or `paid`; `units_total - stock` is those in
//! `stock_reserved` or `paid`. Each counter moves only in the same statement as the order
//! move that changes those sums — never in a statement of its own — so no crash between
//! two statements can leave them apart. These are all the statements that move them:
//!
//! | the order's move | counters | statement |
//! |---|---|---|
//! | admitted at the door (a new `pending_authorization`) | `units_promised` += q, `last_position` += 1 | `door::door` |
//! | `pending_authorization` → `payment_declined` | `units_promised` −= q | `authorization::decline` |
//! | → `authorized`, and on to `stock_reserved` when nothing was cut (the commit of an authorization) | `stock` −= q if it went on | `order::Transition::apply` (`transition.sql`) |
//! | `authorized` → `stock_reserved` (after a cut) | `stock` −= q | `fulfilment::Fulfilment::reserve` (and `reserve_in_line`) |
//! | `authorized` → `rejected_out_of_stock` | `units_promised` −= q | `reserve_in_line` |
//! | `stock_reserved` → `capture_failed` or `authorization_canceled` | `stock` += q, `units_promised` −= q | `order::Transition::apply` (from `fulfilment::Fulfilment::fail_capture`, or the webhook's `lose_hold`) |
//! | `authorized` → `authorization_canceled` (the webhook's `lose_hold`) | `units_promised` −= q | `order::Transition::apply` |
//! | the total changed (`fleetctl product upsert`) | `units_total` and `stock` by the change | [`upsert`] |
//!
//! The door lives in the intake because it is one statement with the order's insert and the
//! idempotency key's check; the others live with the moves they belong to. The suite's audit
//! (`fleet_harness::audit`, its `stock_mismatch` and `promised_mismatch`) checks the sums
//! after every end-to-end and fault case, and the order model checks them in every state
//! (`order_model::properties::UNITS`).

use anyhow::Context;
use chrono::{DateTime, Utc};
use orderfleet_runtime::db::Pool;

use orderfleet_words::{Currency, Sku};

/// The most units a product may be given: far beyond any drop, and far from the limits of the
/// counters (`integer`) however many orders are promised on top.
pub const MAX_UNITS: i32 = 100_000_000;

/// What `fleetctl product upsert` writes.
#[derive(Debug, Clone)]
pub struct ProductUpsert {
    /// The product's id.
    pub id: Sku,
    /// Its name, for people.
    pub name: String,
    /// The price in the currency's minor units (cents), > 0.
    pub price_minor: i64,
    /// The price's currency.
    pub currency: Currency,
    /// The product's total units for sale, sold ones included (0..=[`MAX_UNITS`]). Repeating
    /// an upsert therefore changes nothing, and never sells a unit twice.
    pub units_total: i32,
    /// The most units one buyer may hold in this product's orders that have not failed
    /// ("limit N per customer"); `None`: no cap.
    pub max_per_buyer: Option<i32>,
    /// The most units one card (Stripe's `card.fingerprint`) may hold in this product's orders
    /// that have not failed, whoever's they are; `None`: no cap, and no payment method is read.
    pub max_per_card: Option<i32>,
    /// When the sale opens (SPEC §1.8); `None`: as it is (a new product opens at once).
    pub opens_at: Option<DateTime<Utc>>,
    /// When its pre-queue opens, before `opens_at`; `None`: as it is (a new product has none).
    pub queue_opens_at: Option<DateTime<Utc>>,
}

/// The highest `--max-per-buyer` taken: a cap above any drop's stock is no cap at all.
pub const MAX_PER_BUYER: i32 = 1_000_000;

/// A product's units after an upsert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Units {
    /// For sale in all, sold ones included.
    pub total: i32,
    /// Taken by orders: reserved or sold. Never more than `total`.
    pub taken: i32,
    /// Promised at the door to orders that have not failed (sold ones included). More than
    /// `total` only after a cut, until the stock worker rejects the orders last in line.
    pub promised: i32,
}

impl Units {
    /// Units promised beyond the total: the orders last in line that will be rejected.
    pub fn overpromised(&self) -> i32 {
        (self.promised - self.total).max(0)
    }
}

#[derive(Debug, thiserror::Error)]
/// Why `fleetctl product upsert` refused a total, or could not write it.
pub enum UpsertError {
    #[error(
        "refused: product {sku} has {taken} units sold or reserved, so --stock (its total units for sale, \
         sold ones included) cannot be {asked}; the smallest total it accepts is {least}; nothing was changed"
    )]
    /// A total below the units already sold or reserved.
    BelowTaken {
        /// The product.
        sku: String,
        /// The total asked for.
        asked: i32,
        /// Its units sold or reserved.
        taken: i32,
        /// The smallest total it accepts.
        least: i32,
    },
    #[error(
        "refused: product {sku} has an order reserved or sold at place {position} in line, and the orders up to \
         it hold {least} units, so --stock {asked} would reject an order ahead of one already served; the \
         smallest total it accepts is {least}; nothing was changed"
    )]
    /// A total that would reject an order ahead in line of one already served.
    BelowLine {
        /// The product.
        sku: String,
        /// The total asked for.
        asked: i32,
        /// The place in line of the last order reserved or sold.
        position: i64,
        /// The units the orders up to it hold: the smallest total it accepts.
        least: i32,
    },
    #[error(
        "refused: the price {price} is below Stripe's minimum charge for {currency}, {minimum} ({major} {currency}): \
         Stripe refuses every payment under it (amount_too_small, docs.stripe.com/currencies), so no buyer \
         could pay; nothing was changed"
    )]
    /// A price Stripe will not charge in its currency.
    BelowMinimumCharge {
        /// The price asked for, in minor units.
        price: i64,
        /// The currency, upper case as people write it.
        currency: String,
        /// Stripe's minimum in the currency, in minor units.
        minimum: i64,
        /// The same, in major units (`0.50`).
        major: String,
    },
    #[error(
        "refused: product {sku} opened at {opened}, so its opening can no longer move \
         (--opens-at and --queue-opens-at); nothing was changed"
    )]
    /// A move of the opening once it has happened.
    OpeningPassed {
        /// The product.
        sku: String,
        /// When it opened (or was due to).
        opened: DateTime<Utc>,
    },
    #[error(
        "refused: the pre-queue must open before the sale (--queue-opens-at {queue} is not before \
         --opens-at {opens}); nothing was changed"
    )]
    /// A pre-queue that would open at or after the sale.
    QueueAfterOpening {
        /// The pre-queue's opening asked for.
        queue: DateTime<Utc>,
        /// The sale's opening.
        opens: DateTime<Utc>,
    },
    #[error(
        "refused: --queue-opens-at needs --opens-at: a pre-queue is for a sale that opens later; nothing was changed"
    )]
    /// A pre-queue for a product that opens at once.
    QueueWithoutOpening,
    #[error(transparent)]
    /// The database failed.
    Database(#[from] anyhow::Error),
}

/// A price under Stripe's minimum charge for its currency
/// ([`orderfleet_words::minimum_charge`]); a currency Stripe lists no minimum for is Stripe's to
/// judge.
fn below_minimum_charge(product: &ProductUpsert) -> Option<UpsertError> {
    let minimum = orderfleet_words::minimum_charge::minimum_charge(product.currency.as_str())?;
    (product.price_minor < minimum.minor).then(|| UpsertError::BelowMinimumCharge {
        price: product.price_minor,
        currency: minimum.currency.to_ascii_uppercase(),
        minimum: minimum.minor,
        major: minimum.major(),
    })
}

/// Creates the product, or sets its name, price, currency, total units and per-buyer cap (an
/// upsert without a cap removes it). The units not yet
/// taken (`stock`) move by the change of the total, so units already sold or reserved stay
/// sold. A total below the units promised is allowed: the stock worker then rejects the orders
/// last in line. But a cut may reject only orders *behind* every order already served: the
/// total must cover every order still in line up to the last one that took its units
/// (SPEC §8.7), or an order ahead of one already reserved or sold would lose its unit to it.
/// Anything less is refused, naming the smallest total accepted, and changes nothing. So is a
/// price below Stripe's minimum charge for the currency: every order of it would be refused by
/// Stripe.
///
/// ONE short transaction: the product row is locked first (as a stock worker's reservation
/// locks it), so the line read next sees every reservation committed before it and none can
/// slip in between the check and the update.
pub async fn upsert(pool: &Pool, product: &ProductUpsert) -> Result<Units, UpsertError> {
    if let Some(refused) = below_minimum_charge(product) {
        return Err(refused);
    }
    let mut tx = orderfleet_runtime::db::begin(pool).await.context("failed to begin the upsert")?;
    // A new product has no row to lock yet: its insert takes the lock.
    sqlx::query!("SELECT 1 AS locked FROM products WHERE id = $1 FOR UPDATE", product.id.as_str())
        .fetch_optional(&mut *tx)
        .await
        .with_context(|| format!("failed to lock product {}", product.id.as_str()))?;
    if let Err(refused) = check_opening(&mut tx, product).await {
        tx.rollback().await.context("failed to end the refused upsert")?;
        return Err(refused);
    }
    let (last_served, least) = line_served(&mut tx, &product.id).await?;
    let units = sqlx::query_file_as!(
        Units,
        "src/domain/records/upsert.sql",
        product.id.as_str(),
        &product.name,
        product.price_minor,
        product.currency.as_str(),
        product.units_total,
        product.max_per_buyer,
        least,
        product.opens_at,
        product.queue_opens_at,
        product.max_per_card,
    )
    .fetch_optional(&mut *tx)
    .await
    .with_context(|| format!("failed to upsert product {}", product.id.as_str()))?;
    if let Some(units) = units {
        if product.opens_at.is_some() {
            // The openers look again at once: the new time may be sooner than they sleep.
            sqlx::query!("SELECT pg_notify($1, $2)", OPENINGS_CHANNEL, product.id.as_str())
                .execute(&mut *tx)
                .await
                .context("failed to tell the openers")?;
        }
        tx.commit().await.context("failed to commit the upsert")?;
        return Ok(units);
    }
    let taken = sqlx::query_scalar!(
        r#"SELECT units_total - stock AS "taken!" FROM products WHERE id = $1"#,
        product.id.as_str()
    )
    .fetch_one(&mut *tx)
    .await
    .with_context(|| format!("failed to read product {}", product.id.as_str()))?;
    tx.rollback().await.context("failed to end the refused upsert")?;
    let (sku, asked) = (product.id.as_str().to_owned(), product.units_total);
    Err(match last_served {
        Some(position) if asked >= taken => UpsertError::BelowLine { sku, asked, position, least },
        _ => UpsertError::BelowTaken { sku, asked, taken, least: least.max(taken) },
    })
}

/// Whether the upsert's opening may be written, read inside its transaction after the product
/// row is locked: never moved once the product has opened (or its opening is due), and a
/// pre-queue only before a later opening. A time given again as it is moves nothing.
async fn check_opening(tx: &mut sqlx::PgConnection, product: &ProductUpsert) -> Result<(), UpsertError> {
    let now = sqlx::query!(
        r#"SELECT opens_at, queue_opens_at, opened_at, now() AS "now!",
                  EXISTS (SELECT 1 FROM orders WHERE product_id = $1) AS "sold_before!"
             FROM products WHERE id = $1"#,
        product.id.as_str()
    )
    .fetch_optional(&mut *tx)
    .await
    .with_context(|| format!("failed to read the opening of product {}", product.id.as_str()))?;
    let (was_opens, was_queue, opened, clock, sold_before) = match now {
        Some(row) => (row.opens_at, row.queue_opens_at, row.opened_at, row.now, row.sold_before),
        None => (None, None, None, Utc::now(), false),
    };
    // A product on sale already (orders taken with no opening) has opened: it cannot be given one.
    let opened = opened.or_else(|| (was_opens.is_none() && sold_before).then_some(clock));
    let opens = product.opens_at.or(was_opens);
    let queue = product.queue_opens_at.or(was_queue);
    let moved = (product.opens_at.is_some() && product.opens_at != was_opens)
        || (product.queue_opens_at.is_some() && product.queue_opens_at != was_queue);
    let passed = opened.or(was_opens.filter(|at| *at <= clock));
    if let (true, Some(opened)) = (moved, passed) {
        return Err(UpsertError::OpeningPassed { sku: product.id.as_str().to_owned(), opened });
    }
    match (queue, opens) {
        (Some(_), None) => Err(UpsertError::QueueWithoutOpening),
        (Some(queue), Some(opens)) if queue >= opens => Err(UpsertError::QueueAfterOpening { queue, opens }),
        _ => Ok(()),
    }
}

/// The last place in the product's line that took its units (reserved or sold), and the units
/// the orders up to it hold; read inside the upsert's transaction after the product row is
/// locked.
async fn line_served(tx: &mut sqlx::PgConnection, id: &Sku) -> anyhow::Result<(Option<i64>, i32)> {
    let served = sqlx::query!(
        r#"WITH served AS (
             SELECT max(position) AS position FROM orders
              WHERE product_id = $1 AND (status = 'stock_reserved' OR sold(status))
         )
         SELECT served.position AS last_served,
                COALESCE((SELECT sum(quantity) FROM orders
                           WHERE product_id = $1 AND position <= served.position
                             AND (holds_units(status) OR sold(status))), 0)::int8 AS "least!"
           FROM served"#,
        id.as_str(),
    )
    .fetch_one(tx)
    .await
    .with_context(|| format!("failed to read the line of product {}", id.as_str()))?;
    Ok((served.last_served, i32::try_from(served.least).unwrap_or(i32::MAX)))
}

/// The channel `fleetctl product upsert` notifies when it sets an opening, so the openers
/// look again at once.
pub const OPENINGS_CHANNEL: &str = "orderfleet_openings";

/// A connection that hears [`OPENINGS_CHANNEL`]: the openers' wake-up.
pub struct OpeningsListener(sqlx::postgres::PgListener);

impl OpeningsListener {
    /// Listens on a connection of its own; `None` when it cannot be had.
    pub async fn connect(pool: &orderfleet_runtime::db::Pool) -> Option<Self> {
        let connected = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool.for_listener()).await?;
            listener.listen(OPENINGS_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        connected
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "cannot LISTEN for openings"))
            .ok()
            .map(Self)
    }

    /// Waits for a notification: `false` when the connection failed (connect again).
    pub async fn woken(&mut self) -> bool {
        self.0.recv().await.is_ok()
    }
}

/// What one look of the opener found.
#[derive(Debug, Default)]
pub struct Looked {
    /// Each product opened now, with the queued orders drawn.
    pub opened: Vec<(Sku, i32)>,
    /// How long until the next opening the schedule shows, if any.
    pub next_in: Option<std::time::Duration>,
}

/// A draw's seed: 32 bytes from `rand`'s thread generator, a CSPRNG (ChaCha12) seeded from the
/// operating system's and reseeded from it as it goes, so no one can guess a draw ahead.
pub fn draw_seed() -> [u8; 32] {
    rand::random()
}

/// Opens every product whose opening has come (SPEC §1.8): for each, ONE transaction
/// (`open_product`) that lets one caller in, whatever the number of processes, draws its
/// queue in a uniformly random order under a seed of 32 bytes from a CSPRNG seeded by the
/// operating system (kept on the product for the audit), puts it in line ahead of every later
/// order, and promises units down the line. A caller killed midway leaves the opening not
/// begun, for the next look. A paused product is not opened: its resume wakes the openers, and
/// they look each second while one is due. It also ends what is left of a queue no unit can
/// reach any more, 500 orders a call. One statement reads the schedule: what is due, when the
/// next opening is, and which queues are left to end.
pub async fn open_due(pool: &orderfleet_runtime::db::Pool) -> sqlx::Result<Looked> {
    let schedule = sqlx::query!(
        r#"SELECT due.id AS "id!: Sku", due.in_s AS "in_s!", due.paused AS "paused!", false AS "to_end!"
             FROM (SELECT id, EXTRACT(EPOCH FROM opens_at - now())::float8 AS in_s, paused_at IS NOT NULL AS paused
                     FROM products WHERE opened_at IS NULL AND opens_at IS NOT NULL
                    ORDER BY opens_at LIMIT 100) due
           UNION ALL
           SELECT p.id, 0, false, true FROM products p
            WHERE p.queue_waiting AND p.opened_at IS NOT NULL AND p.paused_at IS NULL
              AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.product_id = p.id AND holds_units(o.status))"#
    )
    .fetch_all(pool)
    .await?;
    let mut looked = Looked::default();
    let (to_end, due): (Vec<_>, Vec<_>) = schedule.into_iter().partition(|row| row.to_end);
    for row in to_end {
        // Every unit sold and none held: what is left of its queue ends sold_out, 500 orders
        // in a transaction of its own each call (`promote_queued`), rather than in the one
        // that sold the last unit; the next look comes at once while some are left.
        sqlx::query!("SELECT promote_queued($1) AS promised", &row.id as _).fetch_one(pool).await?;
        looked.look_within(std::time::Duration::ZERO);
    }
    for row in due {
        if row.in_s > 0.0 {
            looked.look_within(std::time::Duration::from_secs_f64(row.in_s));
            break;
        }
        if row.paused {
            // Due, and paused: it opens at the resume. The resume wakes the openers; looking
            // each second meanwhile keeps that within a second even if the wake-up is lost.
            looked.look_within(std::time::Duration::from_secs(1));
            continue;
        }
        let seed = draw_seed();
        let drawn = open(pool, &row.id, &seed).await;
        // One product's failed opening (tried again at the next look) holds up no other's.
        match drawn {
            Ok(Some(drawn)) => looked.opened.push((row.id, drawn)),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(product = %row.id, error = %e, "the opening failed; trying again");
                looked.look_within(std::time::Duration::from_secs(1));
            }
        }
    }
    Ok(looked)
}

/// How long the opening's one statement may run: the draw of a queue of 100,000 entries and
/// the promotion of its first orders, with room to spare on a 2-core machine.
const OPENING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Opens `product` with `seed` (`open_product`), in a transaction of its own: the
/// `during_opening` failpoint kills the process between the draw and its commit, and the draw
/// is then undone whole, for the next look to make. The draw writes every queued order's place
/// (a narrow row of `queue_places` each, not the order: BENCHMARKS.md, the opening of a large
/// queue), about a second for 100,000 on a busy 2-core machine; its transaction lifts the
/// statement timeout to [`OPENING_TIMEOUT`] all the same, so a slower machine's opening is
/// slow, never cancelled and tried again for ever.
async fn open(pool: &Pool, product: &Sku, seed: &[u8]) -> sqlx::Result<Option<i32>> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "SELECT set_config('statement_timeout', $1, true)",
        format!("{}ms", OPENING_TIMEOUT.as_millis())
    )
    .fetch_one(&mut *tx)
    .await?;
    let drawn = sqlx::query_scalar!(r#"SELECT open_product($1, $2) AS "drawn""#, product as _, seed)
        .fetch_one(&mut *tx)
        .await?;
    orderfleet_runtime::failpoint::hit("during_opening");
    tx.commit().await?;
    Ok(drawn)
}

impl Looked {
    /// The next look is due within `wait` (the sooner of it and any set before).
    fn look_within(&mut self, wait: std::time::Duration) {
        self.next_in = Some(self.next_in.map_or(wait, |next| next.min(wait)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skus_are_checked() {
        assert!(Sku::parse("sku-1").is_ok());
        assert!(Sku::parse("").is_err());
        assert!(Sku::parse("-x").is_err());
        assert!(Sku::parse("a b").is_err());
        assert!(Sku::parse(&"a".repeat(65)).is_err());
    }

    #[test]
    fn currencies_are_lower_cased_iso_codes() {
        assert_eq!(Currency::parse("USD").unwrap().as_str(), "usd");
        assert!(Currency::parse("dollars").is_err());
    }

    fn priced(price_minor: i64, currency: &str) -> ProductUpsert {
        ProductUpsert {
            id: Sku::parse("sku-1").unwrap(),
            name: "Kettle".into(),
            price_minor,
            currency: Currency::parse(currency).unwrap(),
            units_total: 5,
            max_per_buyer: None,
            opens_at: None,
            queue_opens_at: None,
            max_per_card: None,
        }
    }

    #[test]
    fn a_price_below_stripe_s_minimum_charge_is_refused_naming_the_minimum() {
        let refused = below_minimum_charge(&priced(1, "usd")).expect("1 cent is below Stripe's minimum");
        let message = refused.to_string();
        assert!(
            message.contains("the price 1 is below Stripe's minimum charge for USD, 50 (0.50 USD)"),
            "{message}"
        );
        assert!(message.contains("nothing was changed"), "{message}");
        assert!(below_minimum_charge(&priced(49, "jpy")).is_some());
        for accepted in [priced(50, "usd"), priced(30, "gbp"), priced(50, "jpy"), priced(1, "isk")] {
            assert!(below_minimum_charge(&accepted).is_none(), "{accepted:?}");
        }
    }
}
