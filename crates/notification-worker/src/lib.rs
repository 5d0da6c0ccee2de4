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
//!
//! The modules, in the order a message meets them:
//! - `message`: the envelope read into what is published, and the body subscribers receive
//!   ([`Notification`]);
//! - `handle`: the consumer's step, a batch at a time — the inbox claims, the copies another
//!   worker holds settled, the publish, what SNS took recorded, every message's outcome;
//! - `publish`: the `PublishBatch` call tried until SNS answers, its failure classified and its
//!   answer read entry by entry, and the inbox rows moved with what was published;
//! - `unrecorded`: what SNS took whose inbox record failed, remembered so it is not published
//!   again;
//! - [`service`]: the binary's settings and what it runs until stopped.

mod handle;
mod message;
pub mod metrics;
mod publish;
pub mod service;
mod unrecorded;

use std::sync::Arc;

use aws_sdk_sns::Client;
use orderfleet_runtime::db::Pool;
use tokio_util::sync::CancellationToken;

pub use message::Notification;
use unrecorded::Unrecorded;

/// The inbox's name for this consumer.
pub(crate) const CONSUMER: &str = "notification-worker";

/// How long a claim keeps other workers off a message id: longer than a publish takes.
pub(crate) const CLAIM_SECONDS: i64 = 30;

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

/// The handler, shared by the consumer's tasks; `stop` is the worker's stop signal.
pub fn handler(pool: Pool, sns: Client, topic_arn: String, stop: CancellationToken) -> Arc<Notifier> {
    Arc::new(Notifier { pool, sns, topic_arn, stop, unrecorded: Arc::default() })
}
