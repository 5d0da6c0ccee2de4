#![warn(missing_docs)]
//! `notification-worker`: publishes each notification message to the SNS topic, once.
//!
//! A batch at a time: messages already in the inbox (published before; this is a duplicate or
//! a redrive) are deleted without a publish; the rest go out in one `PublishBatch`, with the
//! message attributes `event_type`, `user_id` and `notification_id` (the envelope's message
//! id); each published message id is recorded in the inbox, then the message is deleted.
//! Two things can repeat a notification: a crash between the publish and its inbox record, and
//! an answer lost after SNS took the publish (the call timed out; SNS cannot be asked what it
//! did, so the batch is published again). Every copy carries the same `notification_id`, so a
//! subscriber drops a repeat by it (docs/operations.md); on a FIFO topic it is the
//! deduplication id and SNS drops the repeat itself.
//! A database failure between a publish and its record is neither: the worker remembers what
//! SNS took, keeps the messages in hand whatever the failure, and retries only the record,
//! every second, through a stop too, for the grace period (`SHUTDOWN_GRACE_SECONDS`), before
//! it gives them back. Two windows are left, both needing the database down longer than a
//! bound: a second copy of the message at another worker, which claims it once this worker's
//! claim (30 s) has lapsed during a longer database outage, and before this worker's record
//! goes through, publishes it again; and a stop during an outage that outlasts the grace
//! period hands the messages back, to be published again once the claim has lapsed.
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
//! **Another worker's claim is waited out in hand.** A message whose inbox claim another
//! worker holds (a duplicate delivery, or the copy a stopped or crashed worker left) is kept
//! by the consumer, invisible, and looked at again every few seconds until the holder has
//! published it (then it is done) or its claim has lapsed (then this copy claims it): it spends
//! no receive on the wait, however long a Publish outage keeps the holder's claim.

mod publish;
pub mod service;

use publish::{Answer, InboxMove, read_answer};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use aws_sdk_sns::Client;
use aws_sdk_sns::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sns::operation::publish_batch::{PublishBatchError, PublishBatchOutput};
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use chrono::{DateTime, Utc};
use orderfleet::domain::OrderId;
use orderfleet::domain::order::OrderNotification;
use orderfleet::domain::outbox::{Destination, Envelope, EventType, Payload};
use orderfleet::runtime::backoff::Backoff;
use orderfleet::runtime::consumer::{Handler, Outcome, Received};
use orderfleet::runtime::db;
use orderfleet::runtime::db::Pool;
use orderfleet::runtime::failure::{Failure, Source};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The inbox's name for this consumer.
pub(crate) const CONSUMER: &str = "notification-worker";

/// How long a claim keeps other workers off a message id: longer than a publish takes.
pub(crate) const CLAIM_SECONDS: i64 = 30;

/// How often a copy of a message kept in hand while another worker holds its claim looks at
/// the claim again.
const CLAIM_LOOKED_AT_EVERY: Duration = Duration::from_secs(5);

/// Between attempts of a batch whose `PublishBatch` failed as a whole: 1 s, doubling, at most 30 s.
const PUBLISH_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

#[derive(Clone)]
/// Publishes each notification once: the inbox claims it, SNS gets it, the inbox marks it.
pub struct Notifier {
    /// The inbox's pool.
    pub pool: Pool,
    /// The SNS client.
    pub sns: Client,
    /// `NOTIFICATION_TOPIC_ARN`.
    pub topic_arn: String,
    /// Fires at the stop signal: a batch waiting out a Publish outage lets go.
    pub stop: CancellationToken,
    /// What SNS took whose inbox record failed, remembered for the record's retry.
    unrecorded: Arc<Unrecorded>,
}

/// The notifications this worker published whose inbox record failed (the database down
/// between the publish and its record). The message is held through the outage and handled
/// again; the notification is then not published again, only recorded: SPEC §1.4 allows a
/// repeat only after a crash or a lost answer. Forgotten once recorded, or after
/// [`Unrecorded::KEPT`] (by then the message has come back to some worker, which publishes
/// it as after a crash).
#[derive(Debug, Default)]
struct Unrecorded(std::sync::Mutex<HashMap<Uuid, std::time::Instant>>);

impl Unrecorded {
    const KEPT: Duration = Duration::from_secs(12 * 3600);

    fn remember(&self, ids: &[Uuid]) {
        let mut unrecorded = self.0.lock().expect("not poisoned");
        unrecorded.retain(|_, at| at.elapsed() < Self::KEPT);
        let now = std::time::Instant::now();
        unrecorded.extend(ids.iter().map(|id| (*id, now)));
    }

    fn forget(&self, ids: &[Uuid]) {
        let mut unrecorded = self.0.lock().expect("not poisoned");
        for id in ids {
            unrecorded.remove(id);
        }
    }

    /// Splits `ready` into the notifications published here and not yet recorded, and the rest.
    fn split(&self, ready: Vec<Ready>) -> (Vec<Ready>, Vec<Ready>) {
        let unrecorded = self.0.lock().expect("not poisoned");
        ready.into_iter().partition(|r| unrecorded.contains_key(&r.message_id))
    }
}

/// A message that passed parsing.
#[derive(Debug)]
struct Ready {
    index: usize,
    message_id: Uuid,
    event_type: EventType,
    user_id: orderfleet::domain::UserId,
    order_id: orderfleet::domain::OrderId,
    body: String,
    /// The order's trace context, passed on as the `traceparent` attribute.
    traceparent: Option<String>,
}

impl Ready {
    /// The message as published: the envelope's ids and the notification.
    fn parse(index: usize, message: &Received) -> Result<Self, Failure> {
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

/// The outcomes of a batch as they are decided, by the message's place in the batch.
struct Outcomes(Vec<Option<Outcome>>);

impl Outcomes {
    fn set(&mut self, ready: &Ready, outcome: Outcome) {
        self.0[ready.index] = Some(outcome);
    }

    fn set_all<'a>(&mut self, ready: impl IntoIterator<Item = &'a Ready>, outcome: &Outcome) {
        for r in ready {
            self.set(r, outcome.clone());
        }
    }
}

impl Handler for Notifier {
    async fn handle(&self, batch: Vec<Received>) -> Vec<Outcome> {
        let mut outcomes = Outcomes(vec![None; batch.len()]);
        let mut ready = Vec::new();
        for (index, message) in batch.iter().enumerate() {
            match Ready::parse(index, message) {
                Ok(r) => ready.push(r),
                Err(failure) => outcomes.0[index] = Some(Err(failure)),
            }
        }
        if let Err(e) = self.publish_new(ready, &mut outcomes).await {
            // A database failure of the batch's inbox statements, classified where it
            // happened: unreachable pauses the worker until it answers. A permanent one is
            // the batch's statement's, not any message's, so it comes back too.
            let mut failure = orderfleet::runtime::db::failure(&e);
            if failure.kind == orderfleet::runtime::failure::Kind::Permanent {
                failure.kind = orderfleet::runtime::failure::Kind::Transient;
            }
            for outcome in outcomes.0.iter_mut().filter(|o| o.is_none()) {
                *outcome = Some(Err(failure.clone()));
            }
        }
        let unhandled = || Err(Failure::transient(Source::Message, "not_handled", "not handled"));
        outcomes.0.into_iter().map(|o| o.unwrap_or_else(unhandled)).collect()
    }

    async fn ready(&self) -> Result<(), String> {
        self.probe().await
    }
}

impl Notifier {
    /// The database and SNS both answer.
    async fn probe(&self) -> Result<(), String> {
        db::probe(&self.pool).await?;
        self.sns
            .get_topic_attributes()
            .topic_arn(&self.topic_arn)
            .send()
            .await
            .map_err(|e| format!("SNS: {}", DisplayErrorContext(&e)))?;
        Ok(())
    }

    /// Publishes the messages not published before: claim them in the inbox, settle the
    /// ones another worker holds, publish the rest in one call, record what went out.
    /// `Err` is a database failure of the inbox statements.
    async fn publish_new(&self, ready: Vec<Ready>, outcomes: &mut Outcomes) -> anyhow::Result<()> {
        let (published, unique) = self.unrecorded.split(once_each(ready, outcomes));
        if !published.is_empty() {
            // SNS took them; only their record failed, so only the record is tried again.
            let ids: Vec<Uuid> = published.iter().map(|r| r.message_id).collect();
            match self.mark_processed(&ids).await {
                Ok(()) => {
                    self.unrecorded.forget(&ids);
                    outcomes.set_all(&published, &Ok(()));
                }
                Err(e) => outcomes.set_all(&published, &Err(unrecorded(&e))),
            }
        }
        if unique.is_empty() {
            return Ok(());
        }
        // Every statement is bounded (`db::bounded`): a connection frozen mid-exchange is an
        // outage, not a batch held forever.
        let claimed = db::bounded("failed to claim the messages in the inbox", self.claim(&unique)).await?;
        let (fresh, unclaimed): (Vec<Ready>, Vec<Ready>) =
            unique.into_iter().partition(|r| claimed.contains(&r.message_id));
        if !unclaimed.is_empty() {
            db::bounded("failed to read the inbox", self.settle_unclaimed(unclaimed, outcomes)).await?;
        }
        if fresh.is_empty() {
            return Ok(());
        }
        match self.publish_until_answered(&fresh).await {
            Ok(out) => self.record_published(&out, &fresh, outcomes).await,
            Err(failure) => {
                outcomes.set_all(&fresh, &Err(failure));
                Ok(())
            }
        }
    }

    /// Claims the messages in the inbox for [`CLAIM_SECONDS`]; the ids this worker got (not
    /// published before, and nobody else's claim running).
    async fn claim(&self, unique: &[Ready]) -> anyhow::Result<Vec<Uuid>> {
        let ids: Vec<Uuid> = unique.iter().map(|r| r.message_id).collect();
        sqlx::query_scalar!(
            "INSERT INTO inbox (consumer, message_id, claimed_until)
             SELECT $1, id, now() + $3::int8 * interval '1 second' FROM UNNEST($2::uuid[]) AS id
             ON CONFLICT (consumer, message_id) DO UPDATE SET claimed_until = EXCLUDED.claimed_until
              WHERE inbox.processed_at IS NULL AND inbox.claimed_until < now()
             RETURNING message_id",
            CONSUMER,
            &ids,
            CLAIM_SECONDS,
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to claim the messages in the inbox")
    }

    /// Reads SNS's answer: entries it failed come back (their claims released, since they were
    /// not published); the published ones are marked processed, then done.
    async fn record_published(
        &self,
        out: &PublishBatchOutput,
        fresh: &[Ready],
        outcomes: &mut Outcomes,
    ) -> anyhow::Result<()> {
        let Answer { published, refused, unknown } = read_answer(out, fresh);
        for (r, failure) in &refused {
            outcomes.set(r, Err(failure.clone()));
        }
        for r in &unknown {
            let reason = "PublishBatch's answer lists the entry neither as published nor as failed";
            let failure = Failure::transient(Source::Sns, "missing_from_answer", reason)
                .retry_in(Duration::from_secs(CLAIM_SECONDS as u64));
            outcomes.set(r, Err(failure));
        }
        if !refused.is_empty() {
            // Not published: let the next delivery claim them at once.
            self.release_claims(&refused.iter().map(|(r, _)| r.message_id).collect::<Vec<_>>()).await;
        }
        if !published.is_empty() {
            let ids: Vec<Uuid> = published.iter().map(|r| r.message_id).collect();
            match self.mark_processed(&ids).await {
                Ok(()) => outcomes.set_all(published, &Ok(())),
                Err(e) => {
                    self.unrecorded.remember(&ids);
                    outcomes.set_all(published, &Err(unrecorded(&e)));
                }
            }
        }
        Ok(())
    }

    /// Marks published messages processed. This mark is what keeps them from being published
    /// again, so it is worth a few tries before the messages are left to come back.
    async fn mark_processed(&self, ids: &[Uuid]) -> anyhow::Result<()> {
        let mut attempt = 0;
        loop {
            let marked = self
                .update_inbox(InboxMove::Processed, ids, "failed to mark published messages processed")
                .await;
            match marked {
                Ok(_) => return Ok(()),
                Err(e) if attempt < 3 => {
                    attempt += 1;
                    tracing::warn!(
                        error = format!("{e:#}"),
                        attempt,
                        "published, but failed to mark it processed; retrying"
                    );
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
                Err(e) => return Err(e.context("published, but failed to mark it processed")),
            }
        }
    }
}

/// The failure of a notification SNS took whose record failed: kept in hand, whatever the
/// database's failure, and its record tried again every second, so that it goes to no other
/// worker, which would publish it again; through a stop too, for the grace period, before it is
/// handed back. (A crash hands it back.)
fn unrecorded(e: &anyhow::Error) -> Failure {
    db::failure(e).retry_in(Duration::from_secs(1)).kept_through_stop()
}

/// A message delivered twice within one batch is handled once: the later copies are done.
fn once_each(ready: Vec<Ready>, outcomes: &mut Outcomes) -> Vec<Ready> {
    let mut seen = std::collections::HashSet::new();
    let mut unique = Vec::new();
    for r in ready {
        if seen.insert(r.message_id) {
            unique.push(r);
        } else {
            outcomes.set(&r, Ok(()));
        }
    }
    unique
}

/// The handler, shared by the consumer's tasks; `stop` is the worker's stop signal.
pub fn handler(pool: Pool, sns: Client, topic_arn: String, stop: CancellationToken) -> Arc<Notifier> {
    Arc::new(Notifier { pool, sns, topic_arn, stop, unrecorded: Arc::default() })
}

#[cfg(test)]
mod tests {
    use aws_sdk_sns::types::{BatchResultErrorEntry, PublishBatchResultEntry};
    use orderfleet::domain::order::{FailureReason, OrderStatus};
    use orderfleet::domain::{Currency, Quantity, Sku, UserId};
    use orderfleet::runtime::failure::Kind;

    use super::*;

    fn notification() -> Notification {
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

    fn ready(index: usize) -> Ready {
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
    fn a_publish_batch_answer_splits_into_published_refused_and_unknown() {
        let fresh = [ready(0), ready(1), ready(2)];
        let out = PublishBatchOutput::builder()
            .successful(PublishBatchResultEntry::builder().id("0").message_id("sns-0").build())
            .failed(
                BatchResultErrorEntry::builder()
                    .id("1")
                    .code("InternalError")
                    .message("try again")
                    .sender_fault(false)
                    .build()
                    .unwrap(),
            )
            .build();

        let answer = read_answer(&out, &fresh);

        let ids = |rs: &[&Ready]| rs.iter().map(|r| r.index).collect::<Vec<_>>();
        assert_eq!(ids(&answer.published), [0]);
        assert_eq!(answer.refused.len(), 1);
        let (refused, failure) = &answer.refused[0];
        assert_eq!(
            (refused.index, failure.kind, failure.code.as_str()),
            (1, Kind::Transient, "InternalError")
        );
        assert_eq!(failure.reason, "InternalError: try again");
        assert_eq!(ids(&answer.unknown), [2]);
    }

    #[test]
    fn an_entry_listed_as_published_is_published_even_if_also_listed_as_failed() {
        let fresh = [ready(0)];
        let out = PublishBatchOutput::builder()
            .successful(PublishBatchResultEntry::builder().id("0").build())
            .failed(BatchResultErrorEntry::builder().id("0").code("X").sender_fault(true).build().unwrap())
            .build();
        let answer = read_answer(&out, &fresh);
        assert_eq!((answer.published.len(), answer.refused.len(), answer.unknown.len()), (1, 0, 0));
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
