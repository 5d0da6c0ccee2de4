//! `notification-worker`: publishes each notification message to the SNS topic, once.
//!
//! A batch at a time: messages already in the inbox (published before; this is a duplicate or
//! a redrive) are deleted without a publish; the rest go out in one `PublishBatch`, with the
//! message attributes `event_type` and `user_id`; each published message id is recorded in the
//! inbox, then the message is deleted. Only a crash between the publish and its inbox record
//! can repeat a notification; on a FIFO topic the message id is the deduplication id and SNS
//! drops even that repeat.
//!
//! **A Publish outage dead-letters nothing.** When a whole `PublishBatch` call fails — SNS
//! throttling Publish, a KMS fault on the topic, connections dropped — while the topic itself
//! still answers, the worker keeps the batch and tries again with backoff for as long as the
//! outage lasts: the messages stay in its hands (the consumer's heartbeat keeps them
//! invisible) and their inbox claims are extended, so no receive is spent on them and no other
//! copy publishes meanwhile. A probe would not tell this outage apart, because the topic
//! answers; the failing publish is what recognises it. Only a request SNS refuses as malformed
//! is given up at once (its messages go to the DLQ with the reason). On a stop the worker lets
//! the batch go, releasing its claims when SNS's answer said nothing was published.
//!
//! **Another worker's claim is waited out, not retried.** A message whose inbox claim another
//! worker holds (a duplicate delivery, or the copy a stopped or crashed worker left) comes
//! back when the claim ends, so it spends one receive on the wait, not one per backoff.

use std::collections::HashMap;
use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use aws_sdk_sns::Client;
use aws_sdk_sns::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sns::operation::publish_batch::{PublishBatchError, PublishBatchOutput};
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use orderfleet::backoff::Backoff;
use orderfleet::consumer::{Handler, Outcome, Received};
use orderfleet::order::OrderNotification;
use orderfleet::outbox::{Envelope, EventType};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The inbox's name for this consumer.
pub const CONSUMER: &str = "notification-worker";

/// How long a claim keeps other workers off a message id: longer than a publish takes.
pub const CLAIM_SECONDS: i64 = 30;

/// Between attempts of a batch whose `PublishBatch` failed as a whole: 1 s, doubling, at most 30 s.
const PUBLISH_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

#[derive(Clone)]
pub struct Notifier {
    pub pool: PgPool,
    pub sns: Client,
    pub topic_arn: String,
    /// Fires at the stop signal: a batch waiting out a Publish outage lets go.
    pub stop: CancellationToken,
}

/// How a whole `PublishBatch` call failed, decided next to the call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PublishFailure {
    /// SNS refused the request as malformed: no retry can help.
    Malformed(String),
    /// SNS answered with an error (throttled, a KMS fault, a 5xx): nothing was published.
    Refused(String),
    /// No answer (dropped, timed out, unreadable): some entries may have been published.
    NoAnswer(String),
}

/// Error codes SNS gives a `PublishBatch` request that is wrong in itself.
const MALFORMED: [&str; 8] = [
    "InvalidParameter",
    "InvalidParameterValue",
    "ValidationError",
    "EmptyBatchRequest",
    "TooManyEntriesInBatchRequest",
    "BatchEntryIdsNotDistinct",
    "BatchRequestTooLong",
    "InvalidBatchEntryId",
];

fn classify(error: &SdkError<PublishBatchError>) -> PublishFailure {
    let reason = format!("PublishBatch failed: {}", DisplayErrorContext(error));
    match error {
        SdkError::ServiceError(service) if MALFORMED.contains(&service.err().code().unwrap_or_default()) => {
            PublishFailure::Malformed(reason)
        }
        SdkError::ServiceError(_) => PublishFailure::Refused(reason),
        SdkError::ConstructionFailure(_) => PublishFailure::Malformed(reason),
        _ => PublishFailure::NoAnswer(reason),
    }
}

/// Why a batch was let go without a publish.
enum LetGo {
    /// SNS will never take it as it is.
    Malformed(String),
    /// The worker is stopping during an outage.
    Stopping(String),
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
            // A database failure of the batch's inbox statements: unreachable pauses the worker
            // until it answers; anything else lets the batch come back soon (SNS failures are
            // handled in publish_new itself).
            let reason = format!("{e:#}");
            let failed = match orderfleet::db::failure_kind(&e) {
                orderfleet::db::FailureKind::Outage => Outcome::Blocked { reason },
                orderfleet::db::FailureKind::Transient | orderfleet::db::FailureKind::Permanent => {
                    Outcome::Retry { reason }
                }
            };
            for outcome in outcomes.iter_mut().filter(|o| o.is_none()) {
                *outcome = Some(failed.clone());
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
            self.settle_unclaimed(unclaimed, outcomes).await?;
        }
        if fresh.is_empty() {
            return Ok(());
        }

        let out = match self.publish_until_answered(&fresh).await {
            Ok(out) => out,
            Err(LetGo::Malformed(reason)) => {
                for r in &fresh {
                    outcomes[r.index] = Some(Outcome::Poison { reason: reason.clone() });
                }
                return Ok(());
            }
            Err(LetGo::Stopping(reason)) => {
                for r in &fresh {
                    outcomes[r.index] = Some(Outcome::Retry { reason: reason.clone() });
                }
                return Ok(());
            }
        };
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
            self.release_claims(&failed_ids).await;
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

impl Notifier {
    /// Messages whose claim this worker did not get: done if published already; otherwise
    /// another worker holds the claim, and the message comes back when the claim ends.
    async fn settle_unclaimed(
        &self,
        unclaimed: Vec<Ready>,
        outcomes: &mut [Option<Outcome>],
    ) -> anyhow::Result<()> {
        let ids: Vec<Uuid> = unclaimed.iter().map(|r| r.message_id).collect();
        let rows: Vec<(Uuid, bool, f64)> = sqlx::query_as(
            "SELECT message_id, processed_at IS NOT NULL,
                    GREATEST(EXTRACT(EPOCH FROM (claimed_until - now())), 0)::float8
               FROM inbox WHERE consumer = $1 AND message_id = ANY($2)",
        )
        .bind(CONSUMER)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .context("failed to read the inbox")?;
        let state: HashMap<Uuid, (bool, f64)> =
            rows.into_iter().map(|(id, p, left)| (id, (p, left))).collect();
        for r in unclaimed {
            outcomes[r.index] = Some(match state.get(&r.message_id) {
                Some((true, _)) => Outcome::Done,
                Some((false, left)) => Outcome::Wait {
                    reason: "another worker holds this message's claim".into(),
                    after: Duration::from_secs_f64(left + 1.0),
                },
                // Claimed a moment ago and gone since: try again soon.
                None => Outcome::Retry { reason: "the inbox claim changed under this delivery".into() },
            });
        }
        Ok(())
    }

    fn entries(&self, fresh: &[Ready]) -> Vec<PublishBatchRequestEntry> {
        let fifo = self.topic_arn.ends_with(".fifo");
        let string = |v: &str| {
            MessageAttributeValue::builder().data_type("String").string_value(v).build().expect("type is set")
        };
        fresh
            .iter()
            .map(|r| {
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
            .collect()
    }

    /// Publishes the batch, trying again with backoff while SNS fails the whole call, for as
    /// long as that lasts; the batch is let go only if SNS calls it malformed or the worker
    /// stops. Between attempts the batch's claims are extended past the next attempt, so no
    /// other copy of these messages publishes while this one still may.
    async fn publish_until_answered(&self, fresh: &[Ready]) -> Result<PublishBatchOutput, LetGo> {
        let entries = self.entries(fresh);
        let ids: Vec<Uuid> = fresh.iter().map(|r| r.message_id).collect();
        let mut attempt = 0;
        loop {
            let sent = self
                .sns
                .publish_batch()
                .topic_arn(&self.topic_arn)
                .set_publish_batch_request_entries(Some(entries.clone()))
                .send()
                .await;
            let error = match sent {
                Ok(out) => return Ok(out),
                Err(e) => e,
            };
            let failure = classify(&error);
            metrics::counter!("notification_publish_failures_total", "kind" => failure.kind()).increment(1);
            let (reason, nothing_published) = match failure {
                PublishFailure::Malformed(reason) => {
                    self.release_claims(&ids).await;
                    return Err(LetGo::Malformed(reason));
                }
                PublishFailure::Refused(reason) => (reason, true),
                PublishFailure::NoAnswer(reason) => (reason, false),
            };
            if attempt % 10 == 0 {
                tracing::warn!(
                    attempt,
                    reason,
                    "PublishBatch failed as a whole; keeping the batch and trying again"
                );
            }
            let delay = PUBLISH_BACKOFF.delay(attempt);
            attempt += 1;
            // Past this wait and the next attempt's own retries and timeouts.
            self.extend_claims(&ids, delay + Duration::from_secs(CLAIM_SECONDS as u64)).await;
            tokio::select! {
                () = self.stop.cancelled() => {
                    if nothing_published {
                        self.release_claims(&ids).await;
                    }
                    return Err(LetGo::Stopping(reason));
                }
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Best effort: a claim not extended only lets a duplicate copy wait less.
    async fn extend_claims(&self, ids: &[Uuid], by: Duration) {
        let extended = sqlx::query(
            "UPDATE inbox SET claimed_until = now() + $3 * interval '1 ms'
              WHERE consumer = $1 AND message_id = ANY($2) AND processed_at IS NULL",
        )
        .bind(CONSUMER)
        .bind(ids)
        .bind(by.as_millis() as i64)
        .execute(&self.pool)
        .await;
        if let Err(e) = extended {
            tracing::warn!(error = %e, "failed to extend inbox claims");
        }
    }

    /// Best effort: a claim not released expires by itself.
    async fn release_claims(&self, ids: &[Uuid]) {
        let released = sqlx::query(
            "UPDATE inbox SET claimed_until = now() WHERE consumer = $1 AND message_id = ANY($2) AND processed_at IS NULL",
        )
        .bind(CONSUMER)
        .bind(ids)
        .execute(&self.pool)
        .await;
        if let Err(e) = released {
            tracing::warn!(error = %e, "failed to release inbox claims");
        }
    }
}

impl PublishFailure {
    fn kind(&self) -> &'static str {
        match self {
            PublishFailure::Malformed(_) => "malformed",
            PublishFailure::Refused(_) => "refused",
            PublishFailure::NoAnswer(_) => "no_answer",
        }
    }
}

/// The handler, shared by the consumer's tasks; `stop` is the worker's stop signal.
pub fn handler(pool: PgPool, sns: Client, topic_arn: String, stop: CancellationToken) -> Arc<Notifier> {
    Arc::new(Notifier { pool, sns, topic_arn, stop })
}
