//! A batch handled: each message read, a copy delivered twice in the batch handled once, the
//! rest claimed in the inbox; a message another worker holds is settled (done if published,
//! otherwise kept in hand and looked at again); the fresh ones published in one call; what
//! SNS took recorded, and what it took whose record failed kept in hand until it is recorded.
//! Every message's outcome is decided here, by its place in the batch.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use aws_sdk_sns::error::DisplayErrorContext;
use aws_sdk_sns::operation::publish_batch::PublishBatchOutput;
use orderfleet_runtime::consumer::{Handler, Outcome, Received};
use orderfleet_runtime::db;
use orderfleet_runtime::failure::{Failure, Source};
use uuid::Uuid;

use crate::message::Ready;
use crate::publish::{Answer, InboxMove, read_answer};
use crate::{CLAIM_SECONDS, CONSUMER, Notifier};

/// How often a copy of a message kept in hand while another worker holds its claim looks at
/// the claim again.
const CLAIM_LOOKED_AT_EVERY: Duration = Duration::from_secs(5);

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
            let mut failure = orderfleet_runtime::db::failure(&e);
            if failure.kind == orderfleet_runtime::failure::Kind::Permanent {
                failure.kind = orderfleet_runtime::failure::Kind::Transient;
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

    /// Messages whose claim this worker did not get: done if published already; otherwise
    /// another worker holds the claim, and the message comes back when the claim ends.
    async fn settle_unclaimed(&self, unclaimed: Vec<Ready>, outcomes: &mut Outcomes) -> anyhow::Result<()> {
        let ids: Vec<Uuid> = unclaimed.iter().map(|r| r.message_id).collect();
        let rows = sqlx::query!(
            r#"SELECT message_id, processed_at IS NOT NULL AS "processed!",
                      GREATEST(EXTRACT(EPOCH FROM (claimed_until - now())), 0)::float8 AS "claim_left!"
                 FROM inbox WHERE consumer = $1 AND message_id = ANY($2)"#,
            CONSUMER,
            &ids,
        )
        .fetch_all(&self.pool)
        .await
        .context("failed to read the inbox")?;
        let state: HashMap<Uuid, (bool, f64)> =
            rows.into_iter().map(|row| (row.message_id, (row.processed, row.claim_left))).collect();
        for r in unclaimed {
            let outcome = match state.get(&r.message_id) {
                Some((true, _)) => Ok(()),
                // Kept in hand, and looked at again every few seconds, until the holder has
                // published it or let its claim lapse: handed back, a copy would spend a receive
                // per claim, and a Publish outage of minutes would dead-letter it.
                Some((false, left)) => {
                    let reason = "another worker holds this message's claim";
                    let again = Duration::from_secs_f64(left + 1.0).min(CLAIM_LOOKED_AT_EVERY);
                    Err(Failure::transient(Source::Inbox, "claimed", reason).hold_in_hand(again))
                }
                // Claimed a moment ago and gone since: try again soon.
                None => Err(Failure::transient(
                    Source::Inbox,
                    "claim_changed",
                    "the inbox claim changed under this delivery",
                )),
            };
            outcomes.set(&r, outcome);
        }
        Ok(())
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
                .retry_after(Duration::from_secs(CLAIM_SECONDS as u64));
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
    db::failure(e).hold_through_stop(Duration::from_secs(1))
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
