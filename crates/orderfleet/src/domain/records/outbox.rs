//! The transactional outbox: messages are rows written in the same transaction as the state
//! change that causes them — [`crate::domain::records::order::Transition`] does both in one
//! statement — and `outbox-relay` delivers them to SQS at least once.
//!
//! On the wire every message is an [`Envelope`]: its `message_id` is the outbox row's id, so
//! consumers can recognise a redelivery by it (the inbox), and the same id and event type
//! travel as SQS message attributes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::words::status::{FailureReason, OrderStatus};
use orderfleet_words::{Currency, OrderId, Quantity, Sku, UserId};

/// Where a message goes: the `outbox_destination` enum of the `destination` column. Stored by
/// name; the relay maps it to a queue URL from configuration, so rows survive a change of
/// environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type)]
#[sqlx(type_name = "outbox_destination", rename_all = "kebab-case")]
pub enum Destination {
    /// The stock-check queue (`STOCK_QUEUE_URL`).
    StockCheck,
    /// The notification queue (`NOTIFICATION_QUEUE_URL`).
    Notification,
}

impl Destination {
    /// Its name in the `destination` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Destination::StockCheck => "stock-check",
            Destination::Notification => "notification",
        }
    }
}

/// Event types: the `outbox_event_type` enum of the `event_type` column, and the envelope's
/// and the SQS message attribute's `event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "outbox_event_type")]
pub enum EventType {
    /// To the stock worker: reserve stock for an authorized order, then capture or cancel.
    #[serde(rename = "order.stock_check_requested")]
    #[sqlx(rename = "order.stock_check_requested")]
    StockCheckRequested,
    /// To the user: the order is accepted (authorized).
    #[serde(rename = "order.accepted")]
    #[sqlx(rename = "order.accepted")]
    OrderAccepted,
    /// To the user: the order is paid.
    #[serde(rename = "order.paid")]
    #[sqlx(rename = "order.paid")]
    OrderPaid,
    /// To the user: the order is rejected (out of stock, declined after acceptance,
    /// authentication failed or timed out, the capture failed, the hold cancelled).
    #[serde(rename = "order.rejected")]
    #[sqlx(rename = "order.rejected")]
    OrderRejected,
    /// To the user: the paid order was refunded in full.
    #[serde(rename = "order.refunded")]
    #[sqlx(rename = "order.refunded")]
    OrderRefunded,
    /// To the stock worker: a queued order was promised its units (at the opening, or when a
    /// unit came back); authorize it, without its buyer, with its payment method.
    #[serde(rename = "order.promoted")]
    #[sqlx(rename = "order.promoted")]
    OrderPromoted,
    /// To the user: a promoted order's card needs its buyer's 3-D Secure, before its deadline.
    #[serde(rename = "order.action_required")]
    #[sqlx(rename = "order.action_required")]
    OrderActionRequired,
}

impl EventType {
    /// Every event type.
    pub const ALL: [EventType; 7] = [
        EventType::StockCheckRequested,
        EventType::OrderAccepted,
        EventType::OrderPaid,
        EventType::OrderRejected,
        EventType::OrderRefunded,
        EventType::OrderPromoted,
        EventType::OrderActionRequired,
    ];

    /// Its name in the envelope, the `event_type` attribute and the `event_type` column.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::StockCheckRequested => "order.stock_check_requested",
            EventType::OrderAccepted => "order.accepted",
            EventType::OrderPaid => "order.paid",
            EventType::OrderRejected => "order.rejected",
            EventType::OrderRefunded => "order.refunded",
            EventType::OrderPromoted => "order.promoted",
            EventType::OrderActionRequired => "order.action_required",
        }
    }

    /// The event type a name stands for, if any.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == raw)
    }

    /// Where this kind of event is delivered.
    pub fn destination(self) -> Destination {
        match self {
            EventType::StockCheckRequested | EventType::OrderPromoted => Destination::StockCheck,
            EventType::OrderAccepted
            | EventType::OrderPaid
            | EventType::OrderRejected
            | EventType::OrderRefunded
            | EventType::OrderActionRequired => Destination::Notification,
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON body of every message the relay sends. Written by the relay from an outbox row,
/// its payload the row's JSON as it is (`Envelope<serde_json::Value>`); read by the consumers
/// with [`Envelope::parse`], which types the payload by the event type and says why a body is
/// refused.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope<P = Payload> {
    /// The outbox row's id: the consumers' key for recognising a redelivery.
    pub message_id: Uuid,
    /// What happened.
    pub event_type: EventType,
    /// The order it is about.
    pub order_id: OrderId,
    /// When the row was written, with the change that caused it.
    pub occurred_at: DateTime<Utc>,
    /// The event's data.
    pub payload: P,
}

/// An envelope's payload, typed by its event type.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// `order.stock_check_requested`: `Some` when the commit that authorized the order took its
    /// units too (nothing was cut): what its capture needs, so the stock worker captures
    /// without reading the order first. `None` (the order was left `authorized`, or a message
    /// written before this was) : the stock worker reads the order and reserves it in line.
    StockCheck(Option<Box<ReservedAtCommit>>),
    /// `order.accepted`, `order.paid`, `order.rejected`: what the buyer is told.
    Notification(OrderNotification),
}

impl Envelope {
    /// The reservation a stock check carries, to capture from it without reading the order:
    /// only while Stripe keeps the capture's idempotency key (24 hours; 23 here, for clocks).
    /// An older message — a redrive, a day in the DLQ — is taken as any stock check is, from
    /// the order's status.
    pub fn captures_from_its_payload(&self, now: DateTime<Utc>) -> Option<&ReservedAtCommit> {
        let Payload::StockCheck(Some(reserved)) = &self.payload else { return None };
        let fresh = now - self.occurred_at < chrono::Duration::hours(23);
        (fresh && reserved.order.order_id == self.order_id).then_some(reserved.as_ref())
    }
}

/// A stock check's payload when the authorization's commit took the order's units
/// ([`crate::domain::records::order::Transition::apply`]): the order as the buyer's notifications tell
/// it, and the attempt and PaymentIntent to capture under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedAtCommit {
    /// The order (its status the one the commit's `order.accepted` told: `authorized`).
    pub order: OrderNotification,
    /// The order's payment attempt at the commit: its capture's idempotency key.
    pub attempt: i32,
    /// The PaymentIntent holding the buyer's funds.
    pub payment_intent_id: String,
}

impl ReservedAtCommit {
    /// Reads a stock check's payload; `None` unless it says the commit reserved the units.
    fn of(payload: serde_json::Value) -> Option<Box<Self>> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(flatten)]
            order: OrderNotification,
            reserved: Option<Reserved>,
        }
        #[derive(Deserialize)]
        struct Reserved {
            attempt: i32,
            payment_intent_id: String,
        }
        let Wire { order, reserved } = serde_json::from_value(payload).ok()?;
        let Reserved { attempt, payment_intent_id } = reserved?;
        Some(Box::new(Self { order, attempt, payment_intent_id }))
    }
}

/// What a user-facing notification says about an order (the `payload` of its envelope).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderNotification {
    /// The order's buyer, whom the notification is for.
    pub user_id: UserId,
    /// The order.
    pub order_id: OrderId,
    /// Its status as of this notification.
    pub status: OrderStatus,
    /// The product.
    pub product_id: Sku,
    /// How many units.
    pub quantity: Quantity,
    /// The amount in minor units.
    pub amount: i64,
    /// The amount's currency.
    pub currency: Currency,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Why it failed, for a rejection (a code, never Stripe's words).
    pub reason: Option<FailureReason>,
}

/// Why a message body is not an envelope a consumer can use: a permanent failure of the
/// message, its `code` what a person reads beside it in the DLQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// `not_an_envelope` (not JSON, or not the envelope's fields), `unknown_event_type` (or
    /// not one of this queue's), or `not_a_notification` (a notification's event type without
    /// a notification).
    pub code: &'static str,
    /// What was wrong, for a person.
    pub reason: String,
}

impl Envelope {
    /// Reads a message body from `queue`, its payload typed by the event type. Unknown fields
    /// are refused, so a body meant for another system is not taken for one of ours, and so is
    /// an event that belongs on another queue.
    pub fn parse(body: &str, queue: Destination) -> Result<Self, Unreadable> {
        /// The envelope as it travels, its event type still a string, so that an unknown one
        /// is told apart from a body that is no envelope at all.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Wire {
            message_id: Uuid,
            event_type: String,
            order_id: OrderId,
            occurred_at: DateTime<Utc>,
            payload: serde_json::Value,
        }
        let wire: Wire = serde_json::from_str(body).map_err(|e| Unreadable {
            code: "not_an_envelope",
            reason: format!("not a message envelope: {e}"),
        })?;
        let Some(event_type) = EventType::parse(&wire.event_type) else {
            return Err(Unreadable {
                code: "unknown_event_type",
                reason: format!("unknown event type {:?}", wire.event_type),
            });
        };
        if event_type.destination() != queue {
            return Err(Unreadable {
                code: "unknown_event_type",
                reason: format!(
                    "event type {:?} does not belong on the {} queue",
                    event_type.as_str(),
                    queue.as_str()
                ),
            });
        }
        let payload = match queue {
            Destination::StockCheck => Payload::StockCheck(ReservedAtCommit::of(wire.payload)),
            Destination::Notification => {
                Payload::Notification(serde_json::from_value(wire.payload).map_err(|e| Unreadable {
                    code: "not_a_notification",
                    reason: format!("the payload is not an order notification: {e}"),
                })?)
            }
        };
        let Wire { message_id, order_id, occurred_at, .. } = wire;
        Ok(Self { message_id, event_type, order_id, occurred_at, payload })
    }
}

/// A message to enqueue with the state change that causes it.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// What happened; it decides the destination.
    pub event_type: EventType,
    /// The order it is about.
    pub order_id: OrderId,
    /// The event's data, as JSON.
    pub payload: serde_json::Value,
}

impl NewMessage {
    /// A message of `event_type` about `order_id`, its payload serialized now.
    pub fn new(event_type: EventType, order_id: OrderId, payload: impl Serialize) -> Self {
        let payload = serde_json::to_value(payload).expect("an outbox payload serializes to JSON");
        Self { event_type, order_id, payload }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_round_trip_and_route() {
        for e in EventType::ALL {
            assert_eq!(EventType::parse(e.as_str()), Some(e));
            assert_eq!(serde_json::to_value(e).unwrap(), serde_json::json!(e.as_str()));
        }
        assert_eq!(EventType::StockCheckRequested.destination(), Destination::StockCheck);
        assert_eq!(EventType::OrderPaid.destination(), Destination::Notification);
        assert_eq!(EventType::parse("order.shipped"), None);
    }

    fn body(event_type: &str, extra: &str) -> String {
        format!(
            r#"{{"message_id":"018f0000-0000-7000-8000-000000000000","event_type":"{event_type}",
            "order_id":"018f0000-0000-7000-8000-000000000001","occurred_at":"2026-11-22T00:00:00Z",
            "payload":{{}}{extra}}}"#
        )
    }

    #[test]
    fn a_stock_check_whose_commit_reserved_the_units_says_what_to_capture_and_any_other_says_nothing() {
        let reserved = r#""payload":{"user_id":"ola","order_id":"018f0000-0000-7000-8000-000000000001",
            "status":"authorized","product_id":"sku-1","quantity":1,"amount":1500,"currency":"usd",
            "reserved":{"attempt":2,"payment_intent_id":"pi_1"}}"#;
        let read = Envelope::parse(
            &body("order.stock_check_requested", "").replace(r#""payload":{}"#, reserved),
            Destination::StockCheck,
        )
        .unwrap();
        let at = read.occurred_at;
        assert!(read.captures_from_its_payload(at + chrono::Duration::hours(22)).is_some());
        assert!(
            read.captures_from_its_payload(at + chrono::Duration::hours(24)).is_none(),
            "a day old: Stripe may have forgotten the capture's key, so the order is read first"
        );
        let Payload::StockCheck(Some(reserved)) = read.payload else { panic!("{:?}", read.payload) };
        assert_eq!((reserved.attempt, reserved.payment_intent_id.as_str()), (2, "pi_1"));
        assert_eq!(reserved.order.order_id, read.order_id);
        let left = r#""payload":{"user_id":"ola","order_id":"018f0000-0000-7000-8000-000000000001",
            "status":"authorized","product_id":"sku-1","quantity":1,"amount":1500,"currency":"usd"}"#;
        let read = Envelope::parse(
            &body("order.stock_check_requested", "").replace(r#""payload":{}"#, left),
            Destination::StockCheck,
        )
        .unwrap();
        assert_eq!(read.payload, Payload::StockCheck(None));
    }

    #[test]
    fn an_envelope_reads_back_what_was_written_with_its_payload_typed_by_its_event_type() {
        let stock_check =
            Envelope::parse(&body("order.stock_check_requested", ""), Destination::StockCheck).unwrap();
        assert_eq!(stock_check.payload, Payload::StockCheck(None));
        let notification = OrderNotification {
            user_id: orderfleet_words::UserId::parse("ola").unwrap(),
            order_id: stock_check.order_id,
            status: crate::domain::words::status::OrderStatus::Paid,
            product_id: orderfleet_words::Sku::parse("sku-1").unwrap(),
            quantity: orderfleet_words::Quantity::parse(2).unwrap(),
            amount: 2_000,
            currency: orderfleet_words::Currency::parse("jpy").unwrap(),
            reason: None,
        };
        let written = Envelope {
            message_id: stock_check.message_id,
            event_type: EventType::OrderPaid,
            order_id: stock_check.order_id,
            occurred_at: stock_check.occurred_at,
            payload: serde_json::to_value(&notification).unwrap(),
        };
        let read =
            Envelope::parse(&serde_json::to_string(&written).unwrap(), Destination::Notification).unwrap();
        assert_eq!(read.payload, Payload::Notification(notification));
        assert_eq!(
            (read.message_id, read.order_id, read.occurred_at),
            (written.message_id, written.order_id, written.occurred_at)
        );
    }

    #[test]
    fn a_body_that_is_no_envelope_or_names_an_unknown_event_is_refused_with_its_code() {
        let code =
            |body: &str| Envelope::parse(body, Destination::Notification).map(|_| ()).map_err(|e| e.code);
        assert_eq!(code("not json"), Err("not_an_envelope"));
        assert_eq!(code(&body("order.paid", r#","extra":1"#)), Err("not_an_envelope"));
        assert_eq!(code(&body("order.shipped", "")), Err("unknown_event_type"));
        assert_eq!(code(&body("order.paid", "")), Err("not_a_notification"));
        // An event of the other queue's, whatever its payload.
        assert_eq!(code(&body("order.stock_check_requested", "")), Err("unknown_event_type"));
    }
}
