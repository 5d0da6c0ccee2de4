//! A notification message as the worker reads it: the envelope parsed, checked to be a
//! notification, and turned into what is published ([`Ready`]), and the body a subscriber of
//! the topic receives ([`Notification`]). A message that does not parse is refused for good
//! here, before any inbox statement or publish.

use chrono::{DateTime, Utc};
use orderfleet::domain::records::outbox::OrderNotification;
use orderfleet::domain::records::outbox::{Destination, Envelope, EventType, Payload};
use orderfleet_runtime::consumer::Received;
use orderfleet_runtime::failure::{Failure, Source};
use orderfleet_words::OrderId;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A message that passed parsing.
#[derive(Debug)]
pub(crate) struct Ready {
    pub(crate) index: usize,
    pub(crate) message_id: Uuid,
    pub(crate) event_type: EventType,
    pub(crate) user_id: orderfleet_words::UserId,
    pub(crate) order_id: orderfleet_words::OrderId,
    pub(crate) body: String,
    /// The order's trace context, passed on as the `traceparent` attribute.
    pub(crate) traceparent: Option<String>,
}

impl Ready {
    /// The message as published: the envelope's ids and the notification.
    pub(crate) fn parse(index: usize, message: &Received) -> Result<Self, Failure> {
        let permanent = |code: &str, reason: String| Failure::permanent(Source::Message, code, reason);
        let envelope = Envelope::parse(&message.body, Destination::Notification)
            .map_err(|refused| permanent(refused.code, refused.reason))?;
        let Payload::Notification(notification) = envelope.payload else {
            unreachable!("a notification queue's envelope carries a notification")
        };
        let user_id = notification.user_id.clone();
        let published = Notification {
            message_id: envelope.message_id,
            event_type: envelope.event_type,
            order_id: envelope.order_id,
            occurred_at: envelope.occurred_at,
            notification,
        };
        Ok(Self {
            index,
            message_id: envelope.message_id,
            event_type: envelope.event_type,
            user_id,
            order_id: envelope.order_id,
            body: serde_json::to_string(&published).expect("a notification serializes"),
            traceparent: message.traceparent.clone(),
        })
    }
}

/// What a subscriber of the topic receives: the body of every notification the worker
/// publishes (docs/operations.md describes it for subscribers). Its attributes carry
/// `event_type`, `user_id`, `notification_id` (this `message_id`) and, when the order has one,
/// `traceparent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// The notification's id, the same on every copy of it: a subscriber drops a repeat by it
    /// (the `notification_id` attribute).
    pub message_id: Uuid,
    /// What happened: `order.accepted`, `order.paid` or `order.rejected`.
    pub event_type: EventType,
    /// The order.
    pub order_id: OrderId,
    /// When the order moved.
    pub occurred_at: DateTime<Utc>,
    /// The order as the buyer is told of it.
    pub notification: OrderNotification,
}

#[cfg(test)]
pub(crate) mod tests {
    use orderfleet::domain::words::status::{FailureReason, OrderStatus};
    use orderfleet_runtime::failure::Kind;
    use orderfleet_words::{Currency, Quantity, Sku, UserId};

    use super::*;

    /// A notification as the worker publishes it.
    pub(crate) fn notification() -> Notification {
        Notification {
            message_id: Uuid::now_v7(),
            event_type: EventType::OrderRejected,
            order_id: OrderId::new(),
            occurred_at: "2026-11-25T10:00:00.123Z".parse().unwrap(),
            notification: OrderNotification {
                user_id: UserId::parse("ola").unwrap(),
                order_id: OrderId::new(),
                status: OrderStatus::RejectedOutOfStock,
                product_id: Sku::parse("sku-1").unwrap(),
                quantity: Quantity::parse(2).unwrap(),
                amount: 2_000,
                currency: Currency::parse("jpy").unwrap(),
                reason: Some(FailureReason::OutOfStock),
            },
        }
    }

    /// A message that passed parsing, at `index` in its batch.
    pub(crate) fn ready(index: usize) -> Ready {
        let sent = notification();
        Ready {
            index,
            message_id: sent.message_id,
            event_type: sent.event_type,
            user_id: sent.notification.user_id.clone(),
            order_id: sent.order_id,
            body: serde_json::to_string(&sent).unwrap(),
            traceparent: None,
        }
    }

    #[test]
    fn a_notification_reads_back_what_was_published_under_the_names_subscribers_read() {
        let sent = notification();
        let body = serde_json::to_value(&sent).unwrap();
        let keys: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["event_type", "message_id", "notification", "occurred_at", "order_id"]);
        assert_eq!(body["event_type"], "order.rejected");
        assert_eq!(body["occurred_at"], "2026-11-25T10:00:00.123Z");
        let inner: Vec<&str> = body["notification"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            inner,
            ["amount", "currency", "order_id", "product_id", "quantity", "reason", "status", "user_id"]
        );
        assert_eq!(serde_json::from_value::<Notification>(body).unwrap(), sent);
    }

    #[test]
    fn a_message_of_the_stock_worker_s_is_refused_for_good() {
        let body = serde_json::json!({
            "message_id": Uuid::now_v7(), "event_type": "order.stock_check_requested",
            "order_id": Uuid::now_v7(), "occurred_at": "2026-11-25T10:00:00Z", "payload": {},
        });
        let received = Received {
            message_id: "m-1".to_owned(),
            receipt_handle: "r-1".to_owned(),
            body: body.to_string(),
            receive_count: 1,
            traceparent: None,
            span: tracing::Span::none(),
        };
        let refused = Ready::parse(0, &received).unwrap_err();
        assert_eq!((refused.kind, refused.code.as_str()), (Kind::Permanent, "unknown_event_type"));
    }
}
