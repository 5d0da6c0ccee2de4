//! The transactional outbox: messages are rows written in the same transaction as the state
//! change that causes them — [`crate::order::Transition`] does both in one
//! statement — and `outbox-relay` delivers them to SQS at least once.
//!
//! On the wire every message is an [`Envelope`]: its `message_id` is the outbox row's id, so
//! consumers can recognise a redelivery by it (the inbox), and the same id and event type
//! travel as SQS message attributes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Where a message goes. Stored by name; the relay maps it to a queue URL from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

    /// The destination a column names, if it names one.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "stock-check" => Some(Destination::StockCheck),
            "notification" => Some(Destination::Notification),
            _ => None,
        }
    }
}

/// Event types, as they appear in the envelope and in the `event_type` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// To the stock worker: reserve stock for an authorized order, then capture or cancel.
    StockCheckRequested,
    /// To the user: the order is accepted (authorized).
    OrderAccepted,
    /// To the user: the order is paid.
    OrderPaid,
    /// To the user: the order is rejected (out of stock, or the capture failed).
    OrderRejected,
}

impl EventType {
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
        [
            EventType::StockCheckRequested,
            EventType::OrderAccepted,
            EventType::OrderPaid,
            EventType::OrderRejected,
        ]
        .into_iter()
        .find(|e| e.as_str() == raw)
    }

    /// Where this kind of event is delivered.
    pub fn destination(self) -> Destination {
        match self {
            EventType::StockCheckRequested => Destination::StockCheck,
            _ => Destination::Notification,
        }
    }
}

/// The JSON body of every message the relay sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The outbox row's id: the consumers' key for recognising a redelivery.
    pub message_id: Uuid,
    /// What happened: an [`EventType`] by name.
    pub event_type: String,
    /// The order it is about.
    pub order_id: crate::domain::OrderId,
    /// When the row was written, with the change that caused it.
    pub occurred_at: DateTime<Utc>,
    /// The event's data (an [`crate::order::OrderNotification`]).
    pub payload: serde_json::Value,
}

/// A message to enqueue with the state change that causes it.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// What happened; it decides the destination.
    pub event_type: EventType,
    /// The order it is about.
    pub order_id: crate::domain::OrderId,
    /// The event's data, as JSON.
    pub payload: serde_json::Value,
}

impl NewMessage {
    /// A message of `event_type` about `order_id`, its payload serialized now.
    pub fn new(event_type: EventType, order_id: crate::domain::OrderId, payload: impl Serialize) -> Self {
        let payload = serde_json::to_value(payload).expect("an outbox payload serializes to JSON");
        Self { event_type, order_id, payload }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_round_trip_and_route() {
        for e in [
            EventType::StockCheckRequested,
            EventType::OrderAccepted,
            EventType::OrderPaid,
            EventType::OrderRejected,
        ] {
            assert_eq!(EventType::parse(e.as_str()), Some(e));
        }
        assert_eq!(EventType::StockCheckRequested.destination(), Destination::StockCheck);
        assert_eq!(EventType::OrderPaid.destination(), Destination::Notification);
        assert_eq!(EventType::parse("order.shipped"), None);
    }

    #[test]
    fn an_envelope_with_unknown_fields_is_refused() {
        let json = r#"{"message_id":"018f0000-0000-7000-8000-000000000000","event_type":"order.paid",
            "order_id":"018f0000-0000-7000-8000-000000000001","occurred_at":"2026-11-22T00:00:00Z",
            "payload":{},"extra":1}"#;
        assert!(serde_json::from_str::<Envelope>(json).is_err());
    }
}
