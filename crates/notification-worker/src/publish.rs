//! Publishing to SNS: a `PublishBatch` call's failure classified next to the call, its answer
//! read entry by entry, the publish tried until SNS answers (the claims kept meanwhile), and
//! the inbox rows moved with what was published.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sns::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sns::operation::publish_batch::{PublishBatchError, PublishBatchOutput};
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use orderfleet_runtime::backoff::Backoff;
use orderfleet_runtime::db;
use orderfleet_runtime::failure::{Failure, Source};
use uuid::Uuid;

use crate::message::Ready;
use crate::{CLAIM_SECONDS, CONSUMER, Notifier};

/// Between attempts of a batch whose `PublishBatch` failed as a whole: 1 s, doubling, at most 30 s.
const PUBLISH_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// A whole `PublishBatch` call's failure, classified next to the call: a request SNS refuses
/// as malformed is permanent (no retry can help); anything else is an outage of Publish
/// (throttling, a KMS fault on the topic, a 5xx, no answer). Also whether SNS's answer says
/// nothing was published (an error answer; with no answer, some entries may have been).
pub(super) fn classify(error: &SdkError<PublishBatchError>) -> (Failure, bool) {
    let reason = format!("PublishBatch failed: {}", DisplayErrorContext(error));
    match error {
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or("Unknown").to_owned();
            match MALFORMED.contains(&code.as_str()) {
                true => (Failure::permanent(Source::Sns, code, reason), true),
                false => (Failure::outage(Source::Sns, code, reason), true),
            }
        }
        SdkError::ConstructionFailure(_) => (Failure::permanent(Source::Sns, "construction", reason), true),
        SdkError::TimeoutError(_) => (Failure::outage(Source::Sns, "timeout", reason), false),
        _ => (Failure::outage(Source::Sns, "no_answer", reason), false),
    }
}

/// Its label in `notification_publish_failures_total{kind}`.
pub(super) fn kind_label(failure: &Failure, nothing_published: bool) -> &'static str {
    match (failure.kind, nothing_published) {
        (orderfleet_runtime::failure::Kind::Permanent, _) => "malformed",
        (_, true) => "refused",
        (_, false) => "no_answer",
    }
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

/// What a `PublishBatch` answer says of the entries sent, whose ids are their places in the
/// batch.
#[derive(Debug)]
pub(super) struct Answer<'r> {
    /// Listed as published.
    pub(super) published: Vec<&'r Ready>,
    /// Listed as failed, each with its failure: not published, to try again.
    pub(super) refused: Vec<(&'r Ready, Failure)>,
    /// In neither list (an answer SNS should never give; a mangled one can): maybe published.
    pub(super) unknown: Vec<&'r Ready>,
}

/// Splits a `PublishBatch` answer by entry: listed as published, listed as failed, or in
/// neither list. A pure function of the answer, so each case is a unit test.
pub(super) fn read_answer<'r>(out: &PublishBatchOutput, fresh: &'r [Ready]) -> Answer<'r> {
    let failed: HashMap<&str, Failure> = out
        .failed()
        .iter()
        .map(|f| {
            let reason = format!("{}: {}", f.code(), f.message().unwrap_or(""));
            (f.id(), Failure::transient(Source::Sns, f.code(), reason))
        })
        .collect();
    let sent: HashSet<&str> = out.successful().iter().filter_map(|s| s.id()).collect();
    let mut answer = Answer { published: Vec::new(), refused: Vec::new(), unknown: Vec::new() };
    for r in fresh {
        let id = r.index.to_string();
        if sent.contains(id.as_str()) {
            answer.published.push(r);
        } else if let Some(failure) = failed.get(id.as_str()) {
            answer.refused.push((r, failure.clone()));
        } else {
            answer.unknown.push(r);
        }
    }
    answer
}

impl Notifier {
    pub(super) fn entries(&self, fresh: &[Ready]) -> Vec<PublishBatchRequestEntry> {
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
                    .message_attributes("event_type", string(r.event_type.as_str()))
                    .message_attributes("user_id", string(r.user_id.as_str()))
                    // The same on every copy of this notification: a subscriber's key to drop
                    // repeats (SPEC §1.4).
                    .message_attributes("notification_id", string(&r.message_id.to_string()));
                if let Some(traceparent) = &r.traceparent {
                    entry =
                        entry.message_attributes(orderfleet_runtime::trace::TRACEPARENT, string(traceparent));
                }
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
    /// long as that lasts; the batch is let go only if SNS calls it malformed (permanent) or
    /// the worker stops (handed back as transient). Between attempts the batch's claims are
    /// extended past the next attempt, so no other copy of these messages publishes while this
    /// one still may.
    pub(super) async fn publish_until_answered(
        &self,
        fresh: &[Ready],
    ) -> Result<PublishBatchOutput, Failure> {
        let entries = self.entries(fresh);
        let ids: Vec<Uuid> = fresh.iter().map(|r| r.message_id).collect();
        let mut attempt = 0;
        loop {
            // One attempt per call: the SDK's own retries of a call whose answer was lost would
            // each publish the batch again; this loop retries after its backoff instead.
            // Measured with every answer withheld for 45 s: at most 5 deliveries of one
            // notification with the SDK's retries, 4 without (docs/failure-modes.md).
            let sent =
                self.sns
                    .publish_batch()
                    .topic_arn(&self.topic_arn)
                    .set_publish_batch_request_entries(Some(entries.clone()))
                    .customize()
                    .config_override(aws_sdk_sns::config::Builder::default().retry_config(
                        aws_sdk_sns::config::retry::RetryConfig::standard().with_max_attempts(1),
                    ));
            let (failure, nothing_published) = match sent.send().await {
                Ok(out) => return Ok(out),
                Err(e) => classify(&e),
            };
            metrics::counter!(crate::metrics::NOTIFICATION_PUBLISH_FAILURES.name, "kind" => kind_label(&failure, nothing_published))
                .increment(1);
            if failure.kind == orderfleet_runtime::failure::Kind::Permanent {
                self.release_claims(&ids).await;
                return Err(failure);
            }
            if attempt % 10 == 0 {
                tracing::warn!(
                    attempt,
                    reason = failure.reason,
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
                    // The stop lets the batch go, not the outage: it comes back to the next
                    // worker like any passing failure, and this stopping one probes nothing.
                    let reason = format!("stopping during a Publish outage: {}", failure.reason);
                    return Err(Failure::transient(Source::Sns, failure.code, reason));
                }
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Best effort: a claim not extended only lets a duplicate copy wait less.
    pub(super) async fn extend_claims(&self, ids: &[Uuid], by: Duration) {
        let what = "failed to extend inbox claims";
        if let Err(e) = self.update_inbox(InboxMove::Extend(by), ids, what).await {
            tracing::warn!(error = format!("{e:#}"), "{what}");
        }
    }

    /// Best effort: a claim not released expires by itself.
    pub(super) async fn release_claims(&self, ids: &[Uuid]) {
        let what = "failed to release inbox claims";
        if let Err(e) = self.update_inbox(InboxMove::Release, ids, what).await {
            tracing::warn!(error = format!("{e:#}"), "{what}");
        }
    }

    /// ONE statement on this consumer's inbox rows `ids`; bounded ([`db::bounded`]), its
    /// failure said as `what`.
    pub(super) async fn update_inbox(
        &self,
        change: InboxMove,
        ids: &[Uuid],
        what: &'static str,
    ) -> anyhow::Result<()> {
        let update = match change {
            InboxMove::Processed => sqlx::query!(
                "UPDATE inbox SET processed_at = now() WHERE consumer = $1 AND message_id = ANY($2)",
                CONSUMER,
                ids,
            ),
            InboxMove::Extend(by) => sqlx::query!(
                "UPDATE inbox SET claimed_until = now() + $3::int8 * interval '1 ms'
                  WHERE consumer = $1 AND message_id = ANY($2) AND processed_at IS NULL",
                CONSUMER,
                ids,
                by.as_millis() as i64,
            ),
            InboxMove::Release => sqlx::query!(
                "UPDATE inbox SET claimed_until = now()
                  WHERE consumer = $1 AND message_id = ANY($2) AND processed_at IS NULL",
                CONSUMER,
                ids,
            ),
        };
        let update = update.execute(&self.pool);
        db::bounded(what, async { update.await.map_err(anyhow::Error::from) }).await.map(drop)
    }
}

/// What [`Notifier::update_inbox`] does to its rows.
#[derive(Debug, Clone, Copy)]
pub(super) enum InboxMove {
    /// Published: never again.
    Processed,
    /// Keep the claim this much longer.
    Extend(Duration),
    /// End the claim now: not published, so the next delivery may claim it at once.
    Release,
}

#[cfg(test)]
mod tests {
    use aws_sdk_sns::types::{BatchResultErrorEntry, PublishBatchResultEntry};
    use orderfleet_runtime::failure::Kind;

    use super::*;
    use crate::message::tests::ready;

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
}
