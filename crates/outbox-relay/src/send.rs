//! Sending claimed rows to SQS and classifying every failure where it happens.
//!
//! What became of one row's send is an [`Outcome`]: `Ok` when SQS took it, or why not
//! ([`orderfleet_runtime::failure`]):
//! - permanent: it will never succeed as it is (too large, a queue that does not exist or
//!   denies us): `dead` at once;
//! - transient: this entry failed for a passing reason: retried with backoff, charged to its
//!   budget;
//! - outage: the whole call failed for a passing reason (SQS, or the way to it, is down):
//!   held, charged to nothing, tried again after `retry_in`.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use futures::future::join_all;
use orderfleet::domain::records::outbox::{Destination, Envelope};
use orderfleet_runtime::config::QueueConfig;
use orderfleet_runtime::failure::{Failure, Kind, Outcome, Source};

use crate::Claimed;

/// SQS refuses a message body over 256 KiB, and a batch whose bodies sum over it.
pub(crate) const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// How soon a row held by an outage comes due again.
pub(crate) const OUTAGE_RETRY: Duration = Duration::from_secs(1);

#[derive(Clone)]
/// Sends claimed rows to their queues, batched or one by one.
pub struct Sender {
    sqs: Client,
    queues: HashMap<Destination, String>,
    batching: bool,
}

impl Sender {
    /// A sender for the two queues of `queues`; `batching` uses `SendMessageBatch`.
    pub fn new(sqs: Client, queues: &QueueConfig, batching: bool) -> Self {
        let queues = HashMap::from([
            (Destination::StockCheck, queues.stock_queue_url.as_str().to_owned()),
            (Destination::Notification, queues.notification_queue_url.as_str().to_owned()),
        ]);
        Self { sqs, queues, batching }
    }

    /// Sends every row (batches in parallel) and returns each row with its outcome.
    pub async fn send(&self, rows: Vec<Claimed>) -> Vec<(Claimed, Outcome)> {
        let mut results = Vec::with_capacity(rows.len());
        let mut by_queue: HashMap<String, Vec<(Claimed, String)>> = HashMap::new();
        for row in rows {
            match self.prepare(&row) {
                Ok((queue_url, body)) => by_queue.entry(queue_url).or_default().push((row, body)),
                Err(failure) => results.push((row, Err(failure))),
            }
        }

        let mut calls = Vec::new();
        for (queue_url, entries) in by_queue {
            for chunk in chunks(entries, if self.batching { 10 } else { 1 }, MAX_MESSAGE_BYTES) {
                calls.push(self.send_chunk(queue_url.clone(), chunk));
            }
        }
        for chunk_results in join_all(calls).await {
            results.extend(chunk_results);
        }
        results
    }

    /// The row's queue and message body, or why it can never be sent.
    fn prepare(&self, row: &Claimed) -> Result<(String, String), Failure> {
        let permanent = |code: &str, reason: String| Failure::permanent(Source::Message, code, reason);
        let body = envelope(row);
        if body.len() > MAX_MESSAGE_BYTES {
            let reason =
                format!("the message is {} bytes; SQS takes at most {MAX_MESSAGE_BYTES}", body.len());
            return Err(permanent("message_too_large", reason));
        }
        Ok((self.queues[&row.destination].clone(), body))
    }

    async fn send_chunk(&self, queue_url: String, chunk: Vec<(Claimed, String)>) -> Vec<(Claimed, Outcome)> {
        if !self.batching {
            let (row, body) = chunk.into_iter().next().expect("chunks are not empty");
            return vec![self.send_one(&queue_url, row, body).await];
        }

        let entries: Vec<SendMessageBatchRequestEntry> = chunk
            .iter()
            .enumerate()
            .map(|(i, (row, body))| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body)
                    .set_message_attributes(Some(attributes(row)))
                    .build()
                    .expect("id and body are set")
            })
            .collect();
        let result =
            self.sqs.send_message_batch().queue_url(&queue_url).set_entries(Some(entries)).send().await;
        match result {
            Ok(out) => {
                let failed: HashMap<String, Failure> = out
                    .failed()
                    .iter()
                    .map(|f| {
                        (
                            f.id().to_owned(),
                            classify_entry(f.code(), f.message().unwrap_or(""), f.sender_fault()),
                        )
                    })
                    .collect();
                let sent: Vec<&str> = out.successful().iter().map(|s| s.id()).collect();
                let outcomes = entry_outcomes(chunk.len(), &sent, &failed);
                chunk.into_iter().map(|(row, _)| row).zip(outcomes).collect()
            }
            Err(e) => {
                let failure = classify_call(&e);
                if chunk.len() > 1
                    && failure.kind == Kind::Permanent
                    && failure.code.ends_with("InvalidMessageContents")
                {
                    // One entry's body may fail the whole call: each on its own, so that the
                    // others go and only the bad one is dead.
                    let mut results = Vec::with_capacity(chunk.len());
                    for (row, body) in chunk {
                        results.push(self.send_one(&queue_url, row, body).await);
                    }
                    return results;
                }
                chunk.into_iter().map(|(row, _)| (row, Err(failure.clone()))).collect()
            }
        }
    }

    /// One row, with `SendMessage`.
    async fn send_one(&self, queue_url: &str, row: Claimed, body: String) -> (Claimed, Outcome) {
        let attributes = attributes(&row);
        let result = self
            .sqs
            .send_message()
            .queue_url(queue_url)
            .message_body(body)
            .set_message_attributes(Some(attributes))
            .send()
            .await;
        (row, result.map(|_| ()).map_err(|e| classify_call(&e)))
    }
}

/// Splits rows into batches of at most `size` entries whose bodies add up to at most
/// `max_bytes` (SQS refuses a whole batch over its size limit).
fn chunks<T>(items: Vec<(T, String)>, size: usize, max_bytes: usize) -> Vec<Vec<(T, String)>> {
    let mut out = Vec::new();
    let mut current: Vec<(T, String)> = Vec::new();
    let mut bytes = 0;
    for item in items {
        if !current.is_empty() && (current.len() == size || bytes + item.1.len() > max_bytes) {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += item.1.len();
        current.push(item);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The JSON body: `message_id` is the outbox id, the consumers' key for redeliveries.
fn envelope(row: &Claimed) -> String {
    let envelope = Envelope {
        message_id: row.id,
        event_type: row.event_type,
        order_id: row.aggregate_id,
        occurred_at: row.created_at,
        payload: row.payload.clone(),
    };
    serde_json::to_string(&envelope).expect("an envelope serializes: its payload is already JSON")
}

fn attributes(row: &Claimed) -> HashMap<String, MessageAttributeValue> {
    let string = |v: String| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .expect("data type is set")
    };
    let mut attributes = HashMap::from([
        ("message_id".to_owned(), string(row.id.to_string())),
        ("event_type".to_owned(), string(row.event_type.as_str().to_owned())),
    ]);
    if let Some(traceparent) = &row.traceparent {
        attributes.insert(orderfleet_runtime::trace::TRACEPARENT.to_owned(), string(traceparent.clone()));
    }
    attributes
}

/// Each entry's outcome from a `SendMessageBatch` answer, entries being ids `0..count`:
/// listed as failed, its classified failure; listed as sent, done. An entry in neither list
/// (an answer SQS should never give, and a truncated or mangled one can) is not known to be
/// sent, so it is not marked sent: it is tried again, a duplicate at worst, which the
/// consumers drop.
fn entry_outcomes(count: usize, sent: &[&str], failed: &HashMap<String, Failure>) -> Vec<Outcome> {
    (0..count)
        .map(|i| {
            let id = i.to_string();
            match failed.get(&id) {
                Some(failure) => Err(failure.clone()),
                None if sent.contains(&id.as_str()) => Ok(()),
                None => Err(Failure::transient(
                    Source::Sqs,
                    "missing_from_answer",
                    format!("SendMessageBatch's answer lists entry {id} neither as sent nor as failed"),
                )),
            }
        })
        .collect()
}

/// A failed entry of a batch that SQS otherwise accepted: permanent when SQS blames the entry,
/// transient otherwise.
fn classify_entry(code: &str, message: &str, sender_fault: bool) -> Failure {
    let passing =
        matches!(code, "InternalError" | "ServiceUnavailable" | "ThrottlingException" | "RequestThrottled");
    match sender_fault && !passing {
        true => Failure::permanent(Source::Sqs, code, message),
        false => Failure::transient(Source::Sqs, code, message),
    }
}

/// A call that failed as a whole: a missing queue or a denial is permanent for every row in
/// it; anything that says "not now" (no connection, timeout, 5xx, throttling) is an outage.
fn classify_call<E, R>(error: &SdkError<E, R>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let reason = DisplayErrorContext(error).to_string();
    match error {
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or("Unknown").to_owned();
            let permanent = [
                "QueueDoesNotExist",
                "AWS.SimpleQueueService.NonExistentQueue",
                "AccessDenied",
                "AccessDeniedException",
                "InvalidAddress",
                "InvalidSecurity",
                "KmsAccessDenied",
                "KmsDisabled",
                "KmsNotFound",
                "InvalidParameterValue",
                // A body with characters SQS does not take: the same row fails the same way.
                "InvalidMessageContents",
                "BatchRequestTooLong",
                "UnsupportedOperation",
            ];
            if permanent.iter().any(|p| code == *p || code.ends_with(p)) {
                Failure::permanent(Source::Sqs, code, reason)
            } else {
                Failure::outage(Source::Sqs, code, reason).retry_after(OUTAGE_RETRY)
            }
        }
        SdkError::TimeoutError(_) => {
            Failure::outage(Source::Sqs, "timeout", reason).retry_after(OUTAGE_RETRY)
        }
        SdkError::DispatchFailure(_) => {
            Failure::outage(Source::Sqs, "unreachable", reason).retry_after(OUTAGE_RETRY)
        }
        _ => Failure::outage(Source::Sqs, "response_error", reason).retry_after(OUTAGE_RETRY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_failures_are_permanent_only_when_the_sender_is_at_fault() {
        use orderfleet_runtime::failure::Kind;
        assert_eq!(classify_entry("InvalidMessageContents", "bad", true).kind, Kind::Permanent);
        assert_eq!(classify_entry("InternalError", "oops", false).kind, Kind::Transient);
        assert_eq!(classify_entry("RequestThrottled", "slow down", true).kind, Kind::Transient);
    }

    #[test]
    fn an_entry_the_answer_lists_neither_as_sent_nor_as_failed_is_sent_again() {
        use orderfleet_runtime::failure::Kind;
        let failed = HashMap::from([("1".to_owned(), classify_entry("InternalError", "oops", false))]);
        let outcomes = entry_outcomes(3, &["0"], &failed);
        assert_eq!(outcomes[0], Ok(()));
        assert_eq!(outcomes[1].as_ref().unwrap_err().code, "InternalError");
        let missing = outcomes[2].as_ref().unwrap_err();
        assert_eq!((missing.kind, missing.code.as_str()), (Kind::Transient, "missing_from_answer"));
    }

    #[test]
    fn a_message_sqs_refuses_as_invalid_contents_unbatched_is_permanent() {
        use aws_sdk_sqs::operation::send_message::SendMessageError;
        use orderfleet_runtime::failure::Kind;
        let meta = aws_sdk_sqs::error::ErrorMetadata::builder()
            .code("InvalidMessageContents")
            .message("Invalid binary character '#x0' was found in the message body")
            .build();
        let error = SdkError::service_error(SendMessageError::generic(meta), ());
        assert_eq!(classify_call(&error).kind, Kind::Permanent);
    }

    #[test]
    fn rows_are_chunked_in_tens_and_by_size() {
        let small: Vec<(u32, String)> = (0..23).map(|i| (i, "x".repeat(10))).collect();
        let sizes: Vec<usize> = chunks(small, 10, MAX_MESSAGE_BYTES).iter().map(Vec::len).collect();
        assert_eq!(sizes, [10, 10, 3]);
        let large: Vec<(u32, String)> = (0..5).map(|i| (i, "x".repeat(100 * 1024))).collect();
        let sizes: Vec<usize> = chunks(large, 10, MAX_MESSAGE_BYTES).iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 1]);
    }
}
