//! `fleetctl drop status --id SKU [--watch | --json]`: the operator's one screen for a drop
//! (SPEC §2). One statement reads what PostgreSQL knows of the product — its sale's state and
//! opening, the draw's seed, its pauses, its units, its orders by status, the sold-out answers
//! the intakes counted, the fleet's Stripe budget and the 429s it got, its stuck orders and dead
//! outbox rows — and SQS gives the queues' depths and dead letters. `--watch` does that once a
//! second, so a screen costs the database one statement a second, and reads nothing it locks.

use std::collections::BTreeMap;

use anyhow::Context;
use chrono::{DateTime, Utc};
use orderfleet_runtime::db::Pool;
use orderfleet_words::Sku;
use serde::Serialize;
use sqlx::types::Json;

use crate::dlq::Pair;

/// Everything the screen shows, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DropStatus {
    pub product: String,
    /// `scheduled`, `queueing`, `open`, `paused` or `sold_out`.
    pub state: &'static str,
    pub now: DateTime<Utc>,
    pub opens_at: Option<DateTime<Utc>>,
    pub queue_opens_at: Option<DateTime<Utc>>,
    pub opened_at: Option<DateTime<Utc>>,
    /// Seconds until the pre-queue or the sale opens, while neither has.
    pub opens_in_seconds: Option<f64>,
    /// The draw's seed, in hex, once drawn.
    pub draw_seed: Option<String>,
    pub paused_since: Option<DateTime<Utc>>,
    /// Every pause, oldest first.
    pub pauses: Vec<PauseRecord>,
    pub units: UnitFigures,
    /// Queued orders still waiting for a unit (or for the opening).
    pub queued_waiting: i64,
    pub orders_by_status: BTreeMap<String, i64>,
    /// Orders whose buyer is completing 3-D Secure (`requires_action`).
    pub three_d_secure_in_progress: i64,
    /// `sold_out` answers a second, over the last ten whole seconds, every intake's.
    pub sold_out_answers_per_second: f64,
    /// The fleet's Stripe budget on each operation.
    pub stripe: Vec<StripeOperation>,
    /// Each queue and its DLQ; empty when SQS was not asked.
    pub queues: Vec<QueueFigures>,
    /// Orders of the product that stopped moving: pending past a minute with no live lease, or
    /// past their 3-D Secure deadline (the relay's `orders_pending_authorization_stuck`).
    pub stuck_orders: i64,
    /// Outbox rows of the product's orders the relay gave up on (`fleetctl outbox dead`).
    pub dead_outbox_rows: i64,
}

/// One pause.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct PauseRecord {
    pub paused_at: DateTime<Utc>,
    pub resumed_at: Option<DateTime<Utc>>,
}

/// The product's units (SPEC §2): its total, promised (sold ones included), sold, and left
/// (total less promised).
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct UnitFigures {
    pub total: i64,
    pub promised: i64,
    pub sold: i64,
    pub left: i64,
}

/// The fleet's budget on one Stripe operation.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StripeOperation {
    pub operation: String,
    /// The fleet's limit a second (`STRIPE_ENDPOINT_REQUESTS_PER_SECOND`, as this command reads
    /// it).
    pub limit_per_second: u32,
    /// The shares the fleet's processes hold now, together.
    pub in_use_per_second: i64,
    /// `429 rate_limit` answers in the last minute.
    pub rate_limited_last_minute: i64,
    /// `429 lock_timeout` answers in the last minute.
    pub lock_timeouts_last_minute: i64,
}

/// A queue and its DLQ, as SQS counts them (approximately).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueFigures {
    pub queue: String,
    pub visible: u64,
    pub in_flight: u64,
    pub dead_letters: u64,
}

/// The operations the fleet calls, as Stripe's docs name them.
const OPERATIONS: [&str; 5] = [
    "POST /v1/payment_intents",
    "GET /v1/payment_intents/{id}",
    "GET /v1/payment_intents",
    "POST /v1/payment_intents/{id}/capture",
    "POST /v1/payment_intents/{id}/cancel",
];

/// Reads the product's figures in ONE statement; `None`: no such product.
pub(crate) async fn read(pool: &Pool, id: &Sku, endpoint_limit: u32) -> anyhow::Result<Option<DropStatus>> {
    let row = sqlx::query_file!("src/drop_status.sql", id.as_str())
        .fetch_optional(pool)
        .await
        .with_context(|| format!("failed to read the drop of product {}", id.as_str()))?;
    let Some(row) = row else { return Ok(None) };
    let by_status = row.by_status.0;
    let count = |status: &str| by_status.get(status).copied().unwrap_or(0);
    let units = UnitFigures {
        total: row.total,
        promised: row.promised,
        sold: row.sold,
        left: row.total - row.promised,
    };
    let opening =
        Opening { opens_at: row.opens_at, queue_opens_at: row.queue_opens_at, opened_at: row.opened_at };
    let stripe = OPERATIONS
        .iter()
        .map(|&operation| StripeOperation {
            operation: operation.to_owned(),
            limit_per_second: endpoint_limit,
            in_use_per_second: row.in_use.0.get(operation).copied().unwrap_or(0),
            rate_limited_last_minute: row
                .rate_limited
                .0
                .get(&format!("{operation} rate_limit"))
                .copied()
                .unwrap_or(0),
            lock_timeouts_last_minute: row
                .rate_limited
                .0
                .get(&format!("{operation} lock_timeout"))
                .copied()
                .unwrap_or(0),
        })
        .collect();
    Ok(Some(DropStatus {
        product: id.as_str().to_owned(),
        state: state(&opening, row.paused_at, units, count("queued"), row.now),
        now: row.now,
        opens_at: row.opens_at,
        queue_opens_at: row.queue_opens_at,
        opened_at: row.opened_at,
        opens_in_seconds: opening.opens_in(row.now),
        draw_seed: row.draw_seed.map(|seed| seed.iter().map(|b| format!("{b:02x}")).collect()),
        paused_since: row.paused_at,
        pauses: row.pauses.0,
        units,
        queued_waiting: count("queued"),
        three_d_secure_in_progress: count("requires_action"),
        orders_by_status: by_status,
        sold_out_answers_per_second: row.sold_out_10s as f64 / 10.0,
        stripe,
        queues: Vec::new(),
        stuck_orders: row.stuck,
        dead_outbox_rows: row.dead_rows,
    }))
}

/// A product's opening, as its row has it.
#[derive(Debug, Clone, Copy)]
struct Opening {
    opens_at: Option<DateTime<Utc>>,
    queue_opens_at: Option<DateTime<Utc>>,
    opened_at: Option<DateTime<Utc>>,
}

impl Opening {
    /// Whether the product is on sale (opened, or with no opening).
    fn open(&self) -> bool {
        self.opens_at.is_none() || self.opened_at.is_some()
    }

    /// Whether its pre-queue takes entries at `now`.
    fn queueing(&self, now: DateTime<Utc>) -> bool {
        !self.open()
            && self.queue_opens_at.is_some_and(|q| q <= now)
            && self.opens_at.is_some_and(|o| now < o)
    }

    /// The seconds until the pre-queue or the sale opens, while neither has.
    fn opens_in(&self, now: DateTime<Utc>) -> Option<f64> {
        if self.open() {
            return None;
        }
        let next = match self.queue_opens_at {
            Some(queue) if now < queue => queue,
            _ => self.opens_at?,
        };
        Some((next - now).as_seconds_f64().max(0.0))
    }
}

/// The sale's state, in SPEC §2's words.
fn state(
    opening: &Opening,
    paused_at: Option<DateTime<Utc>>,
    units: UnitFigures,
    queued: i64,
    now: DateTime<Utc>,
) -> &'static str {
    if paused_at.is_some() {
        "paused"
    } else if opening.queueing(now) {
        "queueing"
    } else if !opening.open() {
        "scheduled"
    } else if units.left <= 0 && queued == 0 || units.sold >= units.total {
        "sold_out"
    } else {
        "open"
    }
}

/// Each queue's and its DLQ's depth.
pub(crate) async fn queues(sqs: &aws_sdk_sqs::Client, pairs: &[Pair]) -> anyhow::Result<Vec<QueueFigures>> {
    let mut figures = Vec::new();
    for pair in pairs {
        let (visible, in_flight) = crate::dlq::depth(sqs, &pair.source_url).await?;
        let (dead, dead_in_flight) = crate::dlq::depth(sqs, &pair.dlq_url).await?;
        figures.push(QueueFigures {
            queue: format!("{:?}", pair.name).to_lowercase(),
            visible,
            in_flight,
            dead_letters: dead + dead_in_flight,
        });
    }
    Ok(figures)
}

/// The screen, one line each.
pub(crate) fn screen(s: &DropStatus) -> String {
    let mut lines =
        vec![format!("drop {}: {}    ({})", s.product, s.state.replace('_', " ").to_uppercase(), at(&s.now))];
    lines.extend(the_sale(s));
    lines.extend(the_fleet(s));
    lines.join("\n")
}

/// A time as the screen shows it.
fn at(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// The sale's lines: its opening, seed, pauses, units, queue and orders.
fn the_sale(s: &DropStatus) -> Vec<String> {
    let mut lines = Vec::new();
    let opening = match (s.opens_at, s.opened_at) {
        (None, _) => "on sale since its upsert (no --opens-at)".to_owned(),
        (Some(opens), Some(opened)) => format!("opened {} (opens_at {})", at(&opened), at(&opens)),
        (Some(opens), None) => format!(
            "opens {}{}{}",
            at(&opens),
            s.queue_opens_at.map(|q| format!(", its pre-queue from {}", at(&q))).unwrap_or_default(),
            s.opens_in_seconds.map(|n| format!("; in {}", duration(n))).unwrap_or_default()
        ),
    };
    lines.push(format!("  opening      {opening}"));
    lines.push(format!("  draw seed    {}", s.draw_seed.as_deref().unwrap_or("not drawn yet")));
    let pauses = match (s.paused_since, s.pauses.len()) {
        (Some(since), n) => format!("PAUSED since {} ({n} pause(s) in all)", at(&since)),
        (None, 0) => "none".to_owned(),
        (None, n) => {
            let last = &s.pauses[n - 1];
            format!(
                "{n} in all; the last {} to {}",
                at(&last.paused_at),
                last.resumed_at.as_ref().map(at).unwrap_or_default()
            )
        }
    };
    lines.push(format!("  pauses       {pauses}"));
    let u = s.units;
    lines.push(format!(
        "  units        total {}  promised {}  sold {}  left {}",
        u.total, u.promised, u.sold, u.left
    ));
    lines.push(format!("  queue        {} queued orders waiting", s.queued_waiting));
    let by_status: Vec<String> =
        s.orders_by_status.iter().map(|(status, n)| format!("{status} {n}")).collect();
    lines.push(format!(
        "  orders       {}",
        if by_status.is_empty() { "none".to_owned() } else { by_status.join("  ") }
    ));
    lines.push(format!("  3-D Secure   {} in progress", s.three_d_secure_in_progress));
    lines
}

/// The fleet's lines: the answers, the Stripe budget, the queues, what is stuck.
fn the_fleet(s: &DropStatus) -> Vec<String> {
    let mut lines = Vec::new();
    lines.push(format!(
        "  sold out     {:.1} answers a second (the last 10 s, every intake)",
        s.sold_out_answers_per_second
    ));
    for op in &s.stripe {
        lines.push(format!(
            "  stripe       {:<38} in use {:>3}/{}/s   429s in the last minute: {} rate_limit, {} lock_timeout",
            op.operation, op.in_use_per_second, op.limit_per_second, op.rate_limited_last_minute, op.lock_timeouts_last_minute
        ));
    }
    for q in &s.queues {
        lines.push(format!(
            "  queue        {:<13} {} visible  {} in flight  {} dead letters",
            q.queue, q.visible, q.in_flight, q.dead_letters
        ));
    }
    lines.push(format!(
        "  stuck        {} orders stuck  {} dead outbox rows",
        s.stuck_orders, s.dead_outbox_rows
    ));
    lines
}

/// Redraws the screen in place every second until Ctrl-C (or SIGTERM), with crossterm, on the
/// terminal's alternate screen, so the shell's lines are as they were once it ends. A read that
/// fails shows its error in place of the figures, and the next second reads again.
pub(crate) async fn watch<F, Fut>(read: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<DropStatus>>,
{
    use std::io::Write;

    use crossterm::{cursor, execute, queue, style::Print, terminal};
    use tokio::signal::unix::{SignalKind, signal};

    let (mut interrupt, mut terminate) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    let mut out = std::io::stdout();
    execute!(out, terminal::EnterAlternateScreen, cursor::Hide)?;
    let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let drawn = loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = interrupt.recv() => break Ok(()),
            _ = terminate.recv() => break Ok(()),
        }
        let text = match read().await {
            Ok(status) => screen(&status),
            Err(e) => format!("cannot read the drop: {e:#}"),
        };
        let drawn = (|| {
            queue!(out, cursor::MoveTo(0, 0), terminal::Clear(terminal::ClearType::All))?;
            for line in text.lines().chain(["", "(redrawn every second; Ctrl-C to stop)"]) {
                queue!(out, Print(line), cursor::MoveToNextLine(1))?;
            }
            out.flush()
        })();
        if let Err(e) = drawn {
            break Err(anyhow::Error::new(e).context("cannot draw the screen"));
        }
    };
    execute!(out, cursor::Show, terminal::LeaveAlternateScreen)?;
    drawn
}

/// Seconds as the screen says them: `1h 02m 03s`, `4m 05s`, `6s`.
fn duration(seconds: f64) -> String {
    let s = seconds.ceil() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s:02}s"),
        (h, m, s) => format!("{h}h {m:02}m {s:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    const UNITS: UnitFigures = UnitFigures { total: 10, promised: 4, sold: 2, left: 6 };

    #[test]
    fn the_state_follows_the_opening_the_pause_and_the_units() {
        let scheduled = Opening { opens_at: Some(at(100)), queue_opens_at: Some(at(50)), opened_at: None };
        assert_eq!(state(&scheduled, None, UNITS, 0, at(0)), "scheduled");
        assert_eq!(state(&scheduled, None, UNITS, 3, at(60)), "queueing");
        assert_eq!(state(&scheduled, Some(at(55)), UNITS, 3, at(60)), "paused");
        let opened = Opening { opened_at: Some(at(100)), ..scheduled };
        assert_eq!(state(&opened, None, UNITS, 0, at(120)), "open");
        let gone = UnitFigures { promised: 10, left: 0, ..UNITS };
        assert_eq!(state(&opened, None, gone, 0, at(120)), "sold_out");
        assert_eq!(state(&opened, None, gone, 5, at(120)), "open", "units may still come back to the queue");
        assert_eq!(scheduled.opens_in(at(20)), Some(30.0), "the pre-queue opens first");
        assert_eq!(scheduled.opens_in(at(60)), Some(40.0));
        assert_eq!(opened.opens_in(at(60)), None);
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(
            (duration(5.2), duration(245.0), duration(3723.0)),
            ("6s".into(), "4m 05s".into(), "1h 02m 03s".into())
        );
    }
}
