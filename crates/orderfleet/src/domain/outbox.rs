//! The transactional outbox: messages are rows written in the same transaction as the state
//! change that causes them — [`crate::domain::order::Transition`] does both in one
//! statement — and `outbox-relay` delivers them to SQS at least once.
//!
//! On the wire every message is an [`Envelope`]: its `message_id` is the outbox row's id, so
//! consumers can recognise a redelivery by it (the inbox), and the same id and event type
//! travel as SQS message attributes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::OrderId;

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
    /// To the user: the order is rejected (out of stock, or the capture failed).
    #[serde(rename = "order.rejected")]
    #[sqlx(rename = "order.rejected")]
    OrderRejected,
}

impl EventType {
    /// Every event type.
    pub const ALL: [EventType; 4] = [
        EventType::StockCheckRequested,
        EventType::OrderAccepted,
        EventType::OrderPaid,
        EventType::OrderRejected,
    ];

    /// Its name in the envelope, the `event_type` attribute and the `event_type` column.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::StockCheckRequested => "order.stock_check_requested",
            EventType::OrderAccepted => "order.accepted",
            EventType::OrderPaid => "order.paid",
            EventType::OrderRejected => "order.rejected",
        }
    }

    /// The event type a name stands for, if any.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == raw)
    }

    /// Where this kind of event is delivered.
    pub fn destination(self) -> Destination {
        match self {
            EventType::StockCheckRequested => Destination::StockCheck,
            EventType::OrderAccepted | EventType::OrderPaid | EventType::OrderRejected => {
                Destination::Notification
            }
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON body of every message the relay sends. Written by the relay from an outbox row;
/// read by the consumers with [`Envelope::parse`], which says why a body is refused.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    /// The outbox row's id: the consumers' key for recognising a redelivery.
    pub message_id: Uuid,
    /// What happened.
    pub event_type: EventType,
    /// The order it is about.
    pub order_id: OrderId,
    /// When the row was written, with the change that caused it.
    pub occurred_at: DateTime<Utc>,
    /// The event's data as the row holds it: an [`crate::domain::order::OrderNotification`], which
    /// the notification worker reads; the stock worker reads the order itself.
    pub payload: serde_json::Value,
}

/// Why a message body is not an envelope a consumer can use: a permanent failure of the
/// message, its `code` what a person reads beside it in the DLQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// `not_an_envelope` (not JSON, or not the envelope's fields) or `unknown_event_type`.
    pub code: &'static str,
    /// What was wrong, for a person.
    pub reason: String,
}

impl Envelope {
    /// Reads a message body. Unknown fields are refused, so a body meant for another system
    /// is not taken for one of ours.
    pub fn parse(body: &str) -> Result<Self, Unreadable> {
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
        let Wire { message_id, order_id, occurred_at, payload, .. } = wire;
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
    fn an_envelope_reads_back_what_was_written() {
        let envelope = Envelope::parse(&body("order.paid", "")).unwrap();
        assert_eq!(envelope.event_type, EventType::OrderPaid);
        let written = serde_json::to_string(&envelope).unwrap();
        assert_eq!(Envelope::parse(&written), Ok(envelope));
    }

    #[test]
    fn a_body_that_is_no_envelope_or_names_an_unknown_event_is_refused_with_its_code() {
        let code = |body: &str| Envelope::parse(body).map(|_| ()).map_err(|e| e.code);
        assert_eq!(code("not json"), Err("not_an_envelope"));
        assert_eq!(code(&body("order.paid", r#","extra":1"#)), Err("not_an_envelope"));
        assert_eq!(code(&body("order.shipped", "")), Err("unknown_event_type"));
    }
}
