//! What each command prints, as functions of what it found: the commands only fetch and
//! print, and the tests below hold the words an operator reads (and scripts may grep).
//! Each returns its lines joined by newlines, without a trailing one.

use anyhow::Context;
use chrono::{DateTime, Utc};
use orderfleet::domain::records::order::Order;
use orderfleet::domain::records::pause::Switched;
use orderfleet::domain::records::product::{ProductUpsert, Units};
use orderfleet::domain::recovery::resolution::Evidence;
use orderfleet::domain::recovery::sweeper::SweepReport;
use orderfleet::domain::steps::authorization;
use orderfleet::domain::words::status::OrderStatus;
use orderfleet_runtime::config::ConfigError;
use orderfleet_words::Sku;

use crate::dlq::{self, HoldEnding, Pair, Peeked, Recorded};
use crate::outbox::DeadRow;

/// The line a failed command ends with, on stderr: a configuration error is one line naming
/// the variable; anything else is its whole cause chain on one line.
pub(crate) fn failure(error: &anyhow::Error) -> String {
    match error.downcast_ref::<ConfigError>() {
        Some(config) => format!("fleetctl: {config}"),
        None => format!("fleetctl: error: {error:#}"),
    }
}

/// `product upsert`: what the product is now, and the units promised beyond a cut.
pub(crate) fn upserted(product: &ProductUpsert, units: &Units) -> String {
    let cap = match product.max_per_buyer {
        Some(n) => format!("at most {n} per buyer"),
        None => "no cap per buyer".to_owned(),
    };
    let cap = match product.max_per_card {
        Some(n) => format!("{cap}, at most {n} per card"),
        None => format!("{cap}, no cap per card"),
    };
    let mut text = format!(
        "product {} upserted: price {} {}, {} units for sale in all, {} sold or reserved, {} promised, {cap}",
        product.id.as_str(),
        product.price_minor,
        product.currency.as_str(),
        units.total,
        units.taken,
        units.promised,
    );
    if units.overpromised() > 0 {
        text += &format!(
            "\n{} units are promised beyond the new total: the stock workers reject the orders last in line \
             for them and release their holds",
            units.overpromised()
        );
    }
    text
}

/// `product pause` and `product resume`: what changed; no such product is an error.
pub(crate) fn switched(id: &Sku, switched: Option<Switched>) -> anyhow::Result<String> {
    let id = id.as_str();
    Ok(match switched.with_context(|| format!("no product {id}; nothing was changed"))? {
        Switched::Paused(at) => format!(
            "product {id} paused at {}: no unit is promised and no queue entry taken until `fleetctl product resume --id {id}`",
            at.to_rfc3339()
        ),
        Switched::AlreadyPaused(since) => {
            format!("product {id} is paused already, since {}; nothing was changed", since.to_rfc3339())
        }
        Switched::Resumed(since) => {
            format!("product {id} resumed: on sale again after its pause of {}", since.to_rfc3339())
        }
        Switched::NotPaused => format!("product {id} is not paused; nothing was changed"),
    })
}

/// `outbox dead`: a count, then a line per row.
pub(crate) fn dead_rows(rows: &[DeadRow]) -> String {
    let mut lines = vec![format!("{} dead outbox rows", rows.len())];
    lines.extend(rows.iter().map(|row| {
        format!(
            "{}  {}  to {}  order {}  after {} attempts  {}: {}  (since {})",
            row.id,
            row.event_type,
            row.destination.as_str(),
            row.aggregate_id,
            row.retry_count,
            row.last_error_code.as_deref().unwrap_or("-"),
            row.last_error_reason.as_deref().unwrap_or("-"),
            row.updated_at.format("%Y-%m-%d %H:%M:%S UTC")
        )
    }));
    lines.join("\n")
}

/// `outbox retry`: how many rows went back to the relay. Naming a row that is not dead is an
/// error (retrying them all when none is dead is not).
pub(crate) fn retried(id: Option<uuid::Uuid>, retried: u64) -> anyhow::Result<String> {
    if id.is_some() && retried == 0 {
        anyhow::bail!("no dead outbox row with that id");
    }
    Ok(format!("{retried} outbox rows re-queued"))
}

/// `sweep`: the counts, then each stuck order with why.
pub(crate) fn swept(report: &SweepReport) -> String {
    let mut lines = vec![format!(
        "authorizations resolved {}, provider unavailable {}; 3-D Secure settled {}, waiting {}; \
         fulfilments settled {}, blocked {}; strays released {}; stuck {}",
        report.authorizations_resolved,
        report.authorizations_unavailable,
        report.actions_settled,
        report.actions_waiting,
        report.fulfilments_settled,
        report.fulfilments_blocked,
        report.strays_released,
        report.stuck.len()
    )];
    lines.extend(report.stuck.iter().map(|(order_id, reason)| format!("stuck {order_id}: {reason}")));
    lines.join("\n")
}

/// `order resolve`: what the order is now, and what follows. An order that moved on under the
/// resolution (a webhook, say) is an error: nothing was recorded by it.
pub(crate) fn resolved(
    order: &Order,
    evidence: &Evidence,
    recorded: &authorization::Recorded,
) -> anyhow::Result<String> {
    use authorization::Recorded;
    let from = match evidence {
        Evidence::Intent(intent) => format!("resolved from {}", intent.as_str()),
        Evidence::NoIntent => "resolved with no PaymentIntent".to_owned(),
    };
    let next = match recorded {
        Recorded::Authorized if order.status == OrderStatus::StockReserved => {
            "authorized, its units taken from stock; a stock worker captures the hold".to_owned()
        }
        Recorded::Authorized => {
            "authorized; a stock worker reserves its units and captures the hold".to_owned()
        }
        Recorded::RequiresAction => match order.action_expires_at {
            Some(until) => format!(
                "requires_action; the buyer completes 3-D Secure by {}, or the sweeper releases it",
                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None => "requires_action; the buyer completes 3-D Secure, or the sweeper releases it".to_owned(),
        },
        Recorded::Declined(detail) => {
            let units = match order.quantity.get() {
                1 => "1 unit".to_owned(),
                n => format!("{n} units"),
            };
            let why = match evidence {
                Evidence::Intent(_) => format!(" ({detail})"),
                Evidence::NoIntent => String::new(),
            };
            format!("payment_declined; {units} of {} back for the next buyer{why}", order.product_id)
        }
        Recorded::Refused(words) => format!("payment_declined (order_refused); its hold released: {words}"),
        Recorded::Incomplete(detail) => {
            format!("payment_declined (authorization_incomplete), not the buyer's card: {detail}")
        }
        Recorded::OverCardCap => format!(
            "payment_declined (card_limit_reached): its card holds the most units of {} its cap allows; no hold",
            order.product_id
        ),
        Recorded::MovedElsewhere => {
            anyhow::bail!("order {} moved on to {} meanwhile; nothing was recorded", order.id, order.status)
        }
    };
    Ok(format!("order {} {from}: {next}", order.id))
}

/// `dlq stats`, one queue: its depth and the age of the oldest of `sample`, at `now_ms`.
pub(crate) fn dlq_stats(
    pair: &Pair,
    (visible, in_flight): (u64, u64),
    sample: &[Peeked],
    now_ms: u64,
) -> String {
    let oldest = match visible + in_flight {
        0 => "-".to_owned(),
        _ => dlq::age(sample.iter().filter_map(|p| p.sent_at_ms).min(), now_ms),
    };
    format!(
        "{:?} DLQ: {visible} messages ({in_flight} in flight), oldest {oldest}  {}",
        pair.name, pair.dlq_url
    )
}

/// `dlq peek`, one message: its id, count and age, the last failure the workers recorded for
/// it, and the start of its body.
pub(crate) fn peeked(message: &Peeked, recorded: Option<&Recorded>, now_ms: u64) -> String {
    let failure = match recorded {
        Some(r) => format!(
            "last error (receive {}, {}): {} ({} failures recorded in all, across redrives)",
            r.receive_count, r.outcome, r.reason, r.failures
        ),
        None => "no error recorded by the workers".into(),
    };
    let body: String = message.body.chars().take(300).collect();
    format!(
        "- {}  received {} times  age {}\n  {failure}\n  body: {body}",
        message.message_id,
        message.receive_count,
        dlq::age(message.sent_at_ms, now_ms)
    )
}

/// `dlq stats`, after the stock queue: the dead-lettered stock checks whose hold ends within a
/// day (`ending` is not empty), seen at `now`.
pub(crate) fn holds_ending(ending: &[HoldEnding], now: DateTime<Utc>) -> String {
    let (checks, hold) = match ending.len() {
        1 => ("stock check", "holds an authorization that ends"),
        _ => ("stock checks", "hold authorizations that end"),
    };
    let mut lines = vec![format!(
        "WARNING: {} dead-lettered {checks} {hold} within a day; after that Stripe cancels the hold and \
         the order ends capture_failed. Fix the cause and redrive (fleetctl dlq redrive --queue stock) before then:",
        ending.len()
    )];
    lines.extend(ending.iter().map(|hold| {
        format!(
            "  order {}: hold ends {} ({})",
            hold.order_id,
            dlq::until(hold.expires_at, now),
            hold.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    }));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use orderfleet::domain::records::outbox::{Destination, EventType};
    use orderfleet_words::OrderId;
    use orderfleet_words::{Currency, Sku};

    use super::*;

    fn kettle(max_per_buyer: Option<i32>) -> ProductUpsert {
        ProductUpsert {
            id: Sku::parse("sku-1").unwrap(),
            name: "Kettle".into(),
            price_minor: 2500,
            currency: Currency::parse("usd").unwrap(),
            units_total: 3,
            max_per_buyer,
            opens_at: None,
            queue_opens_at: None,
            max_per_card: None,
        }
    }

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().with_timezone(&Utc)
    }

    fn message(sent_at_ms: Option<u64>, body: &str) -> Peeked {
        Peeked { message_id: "m-1".into(), receive_count: "4".into(), sent_at_ms, body: body.into() }
    }

    fn stock_pair() -> Pair {
        Pair {
            name: dlq::QueueName::Stock,
            source_url: "http://sqs/stock".into(),
            dlq_url: "http://sqs/stock-dlq".into(),
            dlq_arn: "arn:aws:sqs:eu-west-1:000000000000:stock-dlq".into(),
        }
    }

    #[test]
    fn a_configuration_error_is_one_line_naming_the_variable_and_any_other_carries_its_causes() {
        let missing = anyhow::Error::from(ConfigError::Missing { name: "DATABASE_URL" });
        assert_eq!(failure(&missing), "fleetctl: configuration error: DATABASE_URL is not set");

        let chained = anyhow::anyhow!("connection refused").context("failed to connect to the database");
        assert_eq!(
            failure(&chained),
            "fleetctl: error: failed to connect to the database: connection refused"
        );
    }

    #[test]
    fn an_upsert_tells_the_products_units_and_cap() {
        let units = Units { total: 3, taken: 1, promised: 2 };
        assert_eq!(
            upserted(&kettle(Some(2)), &units),
            "product sku-1 upserted: price 2500 usd, 3 units for sale in all, 1 sold or reserved, 2 promised, \
             at most 2 per buyer, no cap per card"
        );
        assert!(upserted(&kettle(None), &units).ends_with(", 2 promised, no cap per buyer, no cap per card"));
        let carded = ProductUpsert { max_per_card: Some(1), ..kettle(None) };
        assert!(upserted(&carded, &units).ends_with(", no cap per buyer, at most 1 per card"));
    }

    #[test]
    fn an_upsert_below_the_promised_units_warns_that_the_last_in_line_are_rejected() {
        let text = upserted(&kettle(None), &Units { total: 3, taken: 1, promised: 5 });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[1],
            "2 units are promised beyond the new total: the stock workers reject the orders last in line for \
             them and release their holds"
        );
    }

    #[test]
    fn dead_rows_are_counted_then_listed_with_their_last_error() {
        let order = OrderId::new();
        let id = uuid::Uuid::nil();
        let row = DeadRow {
            id,
            event_type: EventType::OrderPaid,
            destination: Destination::Notification,
            aggregate_id: order,
            retry_count: 12,
            last_error_code: Some("InvalidParameterValue".into()),
            last_error_reason: None,
            updated_at: at("2025-03-01T10:20:30Z"),
        };
        assert_eq!(dead_rows(&[]), "0 dead outbox rows");
        assert_eq!(
            dead_rows(&[row]),
            format!(
                "1 dead outbox rows\n{id}  order.paid  to notification  order {order}  after 12 attempts  \
                 InvalidParameterValue: -  (since 2025-03-01 10:20:30 UTC)"
            )
        );
    }

    #[test]
    fn retrying_a_row_that_is_not_dead_is_an_error_and_retrying_none_of_all_is_not() {
        let id = Some(uuid::Uuid::nil());
        assert_eq!(retried(id, 1).unwrap(), "1 outbox rows re-queued");
        assert_eq!(retried(id, 0).unwrap_err().to_string(), "no dead outbox row with that id");
        assert_eq!(retried(None, 0).unwrap(), "0 outbox rows re-queued");
    }

    #[test]
    fn a_sweep_counts_what_it_did_then_names_each_stuck_order() {
        let order = OrderId::new();
        let report = SweepReport {
            authorizations_resolved: 3,
            authorizations_unavailable: 1,
            actions_settled: 4,
            actions_waiting: 5,
            fulfilments_settled: 2,
            fulfilments_blocked: 0,
            stuck: vec![(order, "captured at Stripe but the stock is gone".into())],
            strays_released: 6,
        };
        assert_eq!(
            swept(&report),
            format!(
                "authorizations resolved 3, provider unavailable 1; 3-D Secure settled 4, waiting 5; \
                 fulfilments settled 2, blocked 0; strays released 6; stuck 1\n\
                 stuck {order}: captured at Stripe but the stock is gone"
            )
        );
    }

    #[test]
    fn ages_are_told_in_their_largest_whole_unit() {
        let now = 1_000_000_000_000;
        for (seconds_ago, told) in [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (7199, "119m"),
            (7200, "2h"),
            (172_799, "47h"),
            (172_800, "2d"),
        ] {
            assert_eq!(dlq::age(Some(now - seconds_ago * 1000), now), told, "{seconds_ago}s ago");
        }
        assert_eq!(dlq::age(None, now), "?");
        // A clock behind the sender's is not a negative age.
        assert_eq!(dlq::age(Some(now + 5000), now), "0s");
    }

    #[test]
    fn dlq_stats_give_the_depth_and_the_oldest_message_or_a_dash_when_empty() {
        let now = 1_000_000_000_000;
        let sample = [message(Some(now - 300_000), "{}"), message(Some(now - 60_000), "{}")];
        assert_eq!(
            dlq_stats(&stock_pair(), (2, 1), &sample, now),
            "Stock DLQ: 2 messages (1 in flight), oldest 5m  http://sqs/stock-dlq"
        );
        assert_eq!(
            dlq_stats(&stock_pair(), (0, 0), &[], now),
            "Stock DLQ: 0 messages (0 in flight), oldest -  http://sqs/stock-dlq"
        );
    }

    #[test]
    fn a_peeked_message_shows_its_last_recorded_failure_and_the_start_of_its_body() {
        let now = 1_000_000_000_000;
        let recorded = Recorded {
            receive_count: 3,
            outcome: "transient".into(),
            reason: "stripe unavailable".into(),
            failures: 7,
        };
        assert_eq!(
            peeked(&message(Some(now - 30_000), "{\"a\":1}"), Some(&recorded), now),
            "- m-1  received 4 times  age 30s\n  last error (receive 3, transient): stripe unavailable (7 failures \
             recorded in all, across redrives)\n  body: {\"a\":1}"
        );
        let long = "x".repeat(400);
        let text = peeked(&message(None, &long), None, now);
        assert_eq!(
            text,
            format!(
                "- m-1  received 4 times  age ?\n  no error recorded by the workers\n  body: {}",
                "x".repeat(300)
            )
        );
    }

    #[test]
    fn holds_ending_are_warned_of_with_their_deadline_soonest_first() {
        let now = at("2025-03-01T10:00:00Z");
        let (a, b) = (uuid::Uuid::from_u128(1), uuid::Uuid::from_u128(2));
        let one = [HoldEnding { order_id: a, expires_at: at("2025-03-01T08:30:00Z") }];
        assert_eq!(
            holds_ending(&one, now),
            format!(
                "WARNING: 1 dead-lettered stock check holds an authorization that ends within a day; after that \
                 Stripe cancels the hold and the order ends capture_failed. Fix the cause and redrive (fleetctl \
                 dlq redrive --queue stock) before then:\n  order {a}: hold ends 1h 30m ago (2025-03-01T08:30:00Z)"
            )
        );
        let two = [
            HoldEnding { order_id: a, expires_at: at("2025-03-01T08:30:00Z") },
            HoldEnding { order_id: b, expires_at: Utc.with_ymd_and_hms(2025, 3, 1, 15, 12, 0).unwrap() },
        ];
        let text = holds_ending(&two, now);
        assert!(
            text.starts_with(
                "WARNING: 2 dead-lettered stock checks hold authorizations that end within a day;"
            )
        );
        assert!(
            text.ends_with(&format!("\n  order {b}: hold ends in 5h 12m (2025-03-01T15:12:00Z)")),
            "{text}"
        );
    }
}
