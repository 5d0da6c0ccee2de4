//! `notification-worker`: publishes each notification message to the SNS topic, once.
//!
//! A batch at a time: messages already in the inbox (published before; this is a duplicate or
//! a redrive) are deleted without a publish; the rest go out in one `PublishBatch`, with the
//! message attributes `event_type` and `user_id`; each published message id is recorded in the
//! inbox, then the message is deleted. Only a crash between the publish and its inbox record
//! can repeat a notification; on a FIFO topic the message id is the deduplication id and SNS
//! drops even that repeat.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use aws_sdk_sns::Client;
use aws_sdk_sns::error::DisplayErrorContext;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use orderfleet::consumer::{Handler, Outcome, Received};
use orderfleet::order::OrderNotification;
use orderfleet::outbox::{Envelope, EventType};
use sqlx::PgPool;
use uuid::Uuid;

/// The inbox's name for this consumer.
pub const CONSUMER: &str = "notification-worker";

/// How long a claim keeps other workers off a message id: longer than a publish takes.
pub const CLAIM_SECONDS: i64 = 30;

#[derive(Clone)]
pub struct Notifier {
    pub pool: PgPool,
    pub sns: Client,
    pub topic_arn: String,
}

/// A message that passed parsing.
struct Ready {
    index: usize,
    message_id: Uuid,
    event_type: String,
    user_id: String,
    order_id: Uuid,
    body: String,
}

fn parse(body: &str) -> Result<(Envelope, OrderNotification), String> {
    let envelope: Envelope =
        serde_json::from_str(body).map_err(|e| format!("not a message envelope: {e}"))?;
    match EventType::parse(&envelope.event_type) {
        Some(EventType::OrderAccepted | EventType::OrderPaid | EventType::OrderRejected) => {}
        _ => return Err(format!("unknown event type {:?} on the notification queue", envelope.event_type)),
    }
    let notification: OrderNotification = serde_json::from_value(envelope.payload.clone())
        .map_err(|e| format!("the payload is not an order notification: {e}"))?;
    Ok((envelope, notification))
}

impl Handler for Notifier {
    async fn handle(&self, batch: Vec<Received>) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut ready = Vec::new();
        for (index, message) in batch.iter().enumerate() {
            match parse(&message.body) {
                Ok((envelope, notification)) => ready.push(Ready {
                    index,
                    message_id: envelope.message_id,
                    event_type: envelope.event_type.clone(),
                    user_id: notification.user_id.clone(),
                    order_id: envelope.order_id,
                    body: serde_json::json!({
                        "message_id": envelope.message_id,
                        "event_type": envelope.event_type,
                        "order_id": envelope.order_id,
                        "occurred_at": envelope.occurred_at,
                        "notification": notification,
                    })
                    .to_string(),
                }),
                Err(reason) => outcomes[index] = Some(Outcome::Poison { reason }),
            }
        }
        if let Err(e) = self.publish_new(ready, &mut outcomes).await {
            // The database or SNS did not answer: the worker pauses until both do.
            let reason = format!("{e:#}");
            for outcome in outcomes.iter_mut().filter(|o| o.is_none()) {
                *outcome = Some(Outcome::Blocked { reason: reason.clone() });
            }
        }
        outcomes.into_iter().map(|o| o.unwrap_or(Outcome::Retry { reason: "not handled".into() })).collect()
    }

    async fn ready(&self) -> Result<(), String> {
        self.probe().await
    }
}

impl Notifier {
    /// The database and SNS both answer.
    async fn probe(&self) -> Result<(), String> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(|e| format!("PostgreSQL: {e}"))?;
        self.sns
            .get_topic_attributes()
            .topic_arn(&self.topic_arn)
            .send()
            .await
            .map_err(|e| format!("SNS: {}", DisplayErrorContext(&e)))?;
        Ok(())
    }

    async fn publish_new(&self, ready: Vec<Ready>, outcomes: &mut [Option<Outcome>]) -> anyhow::Result<()> {
        if ready.is_empty() {
            return Ok(());
        }
        // A message delivered twice within one batch is handled once: the copy is deleted.
        let mut first_in_batch: HashMap<Uuid, usize> = HashMap::new();
        let mut unique = Vec::new();
        for r in ready {
            if first_in_batch.contains_key(&r.message_id) {
                outcomes[r.index] = Some(Outcome::Done);
                continue;
            }
            first_in_batch.insert(r.message_id, r.index);
            unique.push(r);
        }
        let ids: Vec<Uuid> = unique.iter().map(|r| r.message_id).collect();
        let claimed: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO inbox (consumer, message_id, claimed_until)
             SELECT $1, id, now() + $3 * interval '1 second' FROM UNNEST($2::uuid[]) AS id
             ON CONFLICT (consumer, message_id) DO UPDATE SET claimed_until = EXCLUDED.claimed_until
              WHERE inbox.processed_at IS NULL AND inbox.claimed_until < now()
             RETURNING message_id",
        )
        .bind(CONSUMER)
        .bind(&ids)
        .bind(CLAIM_SECONDS)
        .fetch_all(&self.pool)
        .await
        .context("failed to claim the messages in the inbox")?;
        let mut fresh = Vec::new();
        let mut unclaimed = Vec::new();
        for r in unique {
            if claimed.contains(&r.message_id) { fresh.push(r) } else { unclaimed.push(r) }
        }
        if !unclaimed.is_empty() {
            let unclaimed_ids: Vec<Uuid> = unclaimed.iter().map(|r| r.message_id).collect();
            let processed: Vec<Uuid> = sqlx::query_scalar(
                "SELECT message_id FROM inbox WHERE consumer = $1 AND message_id = ANY($2) AND processed_at IS NOT NULL",
            )
            .bind(CONSUMER)
            .bind(&unclaimed_ids)
            .fetch_all(&self.pool)
            .await
            .context("failed to read the inbox")?;
            for r in unclaimed {
                outcomes[r.index] = Some(if processed.contains(&r.message_id) {
                    Outcome::Done
                } else {
                    Outcome::Retry { reason: "another worker is publishing this message".into() }
                });
            }
        }
        if fresh.is_empty() {
            return Ok(());
        }

        let fifo = self.topic_arn.ends_with(".fifo");
        let entries: Vec<PublishBatchRequestEntry> = fresh
            .iter()
            .map(|r| {
                let string = |v: &str| {
                    MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(v)
                        .build()
                        .expect("type is set")
                };
                let mut entry = PublishBatchRequestEntry::builder()
                    .id(r.index.to_string())
                    .message(&r.body)
                    .message_attributes("event_type", string(&r.event_type))
                    .message_attributes("user_id", string(&r.user_id));
                if fifo {
                    entry = entry
                        .message_deduplication_id(r.message_id.to_string())
                        .message_group_id(r.order_id.to_string());
                }
                entry.build().expect("id and message are set")
            })
            .collect();
        let out = self
            .sns
            .publish_batch()
            .topic_arn(&self.topic_arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("PublishBatch failed: {}", DisplayErrorContext(&e)))?;

        let failed: HashMap<String, String> = out
            .failed()
            .iter()
            .map(|f| (f.id().to_owned(), format!("{}: {}", f.code(), f.message().unwrap_or(""))))
            .collect();
        let mut published = Vec::new();
        let mut failed_ids = Vec::new();
        for r in &fresh {
            match failed.get(&r.index.to_string()) {
                Some(reason) => {
                    outcomes[r.index] = Some(Outcome::Retry { reason: reason.clone() });
                    failed_ids.push(r.message_id);
                }
                None => published.push(r),
            }
        }
        if !failed_ids.is_empty() {
            // Not published: let the next delivery claim them at once.
            let _ = sqlx::query(
                "UPDATE inbox SET claimed_until = now() WHERE consumer = $1 AND message_id = ANY($2)",
            )
            .bind(CONSUMER)
            .bind(&failed_ids)
            .execute(&self.pool)
            .await;
        }
        if published.is_empty() {
            return Ok(());
        }
        let published_ids: Vec<Uuid> = published.iter().map(|r| r.message_id).collect();
        // Published: this mark is what keeps it from being published again, so it is worth a
        // few tries before the message is left to come back.
        let mut attempt = 0;
        loop {
            let marked = sqlx::query(
                "UPDATE inbox SET processed_at = now() WHERE consumer = $1 AND message_id = ANY($2)",
            )
            .bind(CONSUMER)
            .bind(&published_ids)
            .execute(&self.pool)
            .await;
            match marked {
                Ok(_) => break,
                Err(e) if attempt < 3 => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "published, but failed to mark it processed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context("published, but failed to mark it processed"));
                }
            }
        }
        for r in published {
            outcomes[r.index] = Some(Outcome::Done);
        }
        Ok(())
    }
}

pub fn handler(pool: PgPool, sns: Client, topic_arn: String) -> Arc<Notifier> {
    Arc::new(Notifier { pool, sns, topic_arn })
}
