//! `fleetctl dlq …`: the dead-letter queues, for the person who reads them.
//!
//! Each source queue names its DLQ in its `RedrivePolicy`, so only the source queues'
//! URLs (`STOCK_QUEUE_URL`, `NOTIFICATION_QUEUE_URL`) are configured. Peeking receives the
//! messages and releases them at once (visibility 0), as the console's "poll for messages"
//! does: nothing is consumed. Redrive is `StartMessageMoveTask`, what the console's
//! "Start DLQ redrive" calls: the messages go back to their source queue and are processed
//! exactly as fresh ones.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use orderfleet::domain::records::outbox::{Destination, Envelope};
use orderfleet_runtime::db::Pool;

/// One of the fleet's queue pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueName {
    Stock,
    Notification,
}

impl QueueName {
    pub fn all() -> [QueueName; 2] {
        [QueueName::Stock, QueueName::Notification]
    }

    /// The queue `--queue` names, or every one when it names none.
    pub fn chosen(queue: Option<QueueName>) -> Vec<QueueName> {
        queue.map(|q| vec![q]).unwrap_or_else(|| QueueName::all().to_vec())
    }
}

/// A source queue and its dead-letter queue.
pub struct Pair {
    pub name: QueueName,
    pub source_url: String,
    pub dlq_url: String,
    pub dlq_arn: String,
}

impl Pair {
    pub async fn resolve(sqs: &Client, name: QueueName, source_url: &str) -> anyhow::Result<Self> {
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(source_url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .with_context(|| format!("failed to read the redrive policy of {source_url}"))?;
        let policy = attrs
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
            .with_context(|| format!("{source_url} has no RedrivePolicy (no DLQ)"))?;
        let policy: serde_json::Value = serde_json::from_str(policy)?;
        let dlq_arn = policy["deadLetterTargetArn"].as_str().context("no deadLetterTargetArn")?.to_owned();
        let dlq_name = dlq_arn.rsplit(':').next().context("a queue ARN")?;
        let dlq_url =
            sqs.get_queue_url().queue_name(dlq_name).send().await?.queue_url.context("a DLQ URL")?;
        Ok(Self { name, source_url: source_url.to_owned(), dlq_url, dlq_arn })
    }
}

/// A dead letter, as peeked.
pub struct Peeked {
    pub message_id: String,
    pub receive_count: String,
    pub sent_at_ms: Option<u64>,
    pub body: String,
}

impl Peeked {
    /// The key the workers recorded its failures under
    /// ([`orderfleet_runtime::consumer::failure_key`]).
    pub fn failure_key(&self) -> String {
        orderfleet_runtime::consumer::failure_key(&self.body, &self.message_id)
    }
}

/// Receives up to `max` messages from `queue_url` and releases them at once.
pub async fn peek(sqs: &Client, queue_url: &str, max: usize) -> anyhow::Result<Vec<Peeked>> {
    let mut seen: HashMap<String, Peeked> = HashMap::new();
    let mut receipts = Vec::new();
    // Received messages stay hidden for the few seconds this takes, so each comes once.
    while seen.len() < max {
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages((max - seen.len()).min(10) as i32)
            .visibility_timeout(30)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .context("failed to receive from the DLQ")?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            let attrs = m.attributes.clone().unwrap_or_default();
            receipts.push(m.receipt_handle.clone().unwrap_or_default());
            let id = m.message_id.clone().unwrap_or_default();
            seen.entry(id.clone()).or_insert(Peeked {
                message_id: id,
                receive_count: attrs
                    .get(&MessageSystemAttributeName::ApproximateReceiveCount)
                    .cloned()
                    .unwrap_or_default(),
                sent_at_ms: attrs
                    .get(&MessageSystemAttributeName::SentTimestamp)
                    .and_then(|v| v.parse().ok()),
                body: m.body.unwrap_or_default(),
            });
        }
    }
    for chunk in receipts.chunks(10) {
        let entries: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, r)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .visibility_timeout(0)
                    .build()
                    .expect("id and receipt are set")
            })
            .collect();
        sqs.change_message_visibility_batch().queue_url(queue_url).set_entries(Some(entries)).send().await?;
    }
    let mut peeked: Vec<Peeked> = seen.into_values().collect();
    peeked.sort_by_key(|p| p.sent_at_ms);
    Ok(peeked)
}

pub async fn depth(sqs: &Client, queue_url: &str) -> anyhow::Result<(u64, u64)> {
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await?;
    let get = |name: QueueAttributeName| {
        attrs.attributes().and_then(|a| a.get(&name)).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    Ok((
        get(QueueAttributeName::ApproximateNumberOfMessages),
        get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    ))
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How long ago a message was sent, in its largest whole unit ("45s", "3m", "5h", "2d"), at
/// `now_ms`; "?" when SQS gave no time.
pub fn age(sent_at_ms: Option<u64>, now_ms: u64) -> String {
    let Some(sent) = sent_at_ms else { return "?".into() };
    match now_ms.saturating_sub(sent) / 1000 {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A message's recorded failures: the last one, and how many were recorded in all.
pub struct Recorded {
    pub receive_count: i32,
    pub outcome: String,
    pub reason: String,
    pub failures: i32,
}

/// The failures the workers recorded for each message, by its failure key
/// ([`orderfleet_runtime::consumer::failure_key`]: the envelope's message id, kept through redrives).
pub async fn recorded_failures(pool: &Pool, keys: &[String]) -> anyhow::Result<HashMap<String, Recorded>> {
    let rows = sqlx::query!(
        "SELECT DISTINCT ON (message_key) message_key, receive_count, outcome, reason, failures
           FROM message_failures WHERE message_key = ANY($1) ORDER BY message_key, updated_at DESC",
        keys,
    )
    .fetch_all(pool)
    .await
    .context("failed to read message_failures")?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let recorded = Recorded {
                receive_count: row.receive_count,
                outcome: row.outcome,
                reason: row.reason,
                failures: row.failures,
            };
            (row.message_key, recorded)
        })
        .collect())
}

/// Within this long of its hold's end, a dead-lettered stock check is worth a warning: after
/// it, Stripe cancels the authorization and the order can only end `capture_failed`.
pub const HOLD_WARNING: chrono::TimeDelta = chrono::TimeDelta::days(1);

/// A dead-lettered stock check whose order still holds an authorization that ends soon (or
/// has ended): its order and the deadline Stripe gave.
pub struct HoldEnding {
    pub order_id: uuid::Uuid,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// Of the dead-lettered messages' bodies, the stock checks whose order holds an authorization
/// (not yet captured or released) that ends within [`HOLD_WARNING`], soonest first. A body
/// that is not an envelope names no order and is skipped.
pub async fn holds_ending_soon(pool: &Pool, bodies: &[&str]) -> anyhow::Result<Vec<HoldEnding>> {
    let orders: Vec<uuid::Uuid> = bodies
        .iter()
        .filter_map(|body| Envelope::parse(body, Destination::StockCheck).ok())
        .map(|envelope| envelope.order_id.as_uuid())
        .collect();
    let rows = sqlx::query!(
        r#"SELECT id, authorization_expires_at AS "expires_at!" FROM orders
            WHERE id = ANY($1) AND holds_units(status) AND NOT awaiting_authorization(status)
              AND authorization_released_at IS NULL
              AND authorization_expires_at < now() + $2 * interval '1 second'
            ORDER BY authorization_expires_at"#,
        &orders,
        HOLD_WARNING.num_seconds() as f64,
    )
    .fetch_all(pool)
    .await
    .context("failed to read the orders' hold deadlines")?;
    Ok(rows.into_iter().map(|row| HoldEnding { order_id: row.id, expires_at: row.expires_at }).collect())
}

/// "in 5h 12m" or "2h 3m ago", seen at `now`.
pub fn until(deadline: chrono::DateTime<chrono::Utc>, now: chrono::DateTime<chrono::Utc>) -> String {
    let left = deadline - now;
    let minutes = left.num_minutes().abs();
    let span = format!("{}h {}m", minutes / 60, minutes % 60);
    if left >= chrono::TimeDelta::zero() { format!("in {span}") } else { format!("{span} ago") }
}

/// Starts a move task from the DLQ back to its source and reports its progress until done.
pub async fn redrive(sqs: &Client, pair: &Pair, max_per_second: Option<i32>) -> anyhow::Result<()> {
    let (waiting, _) = depth(sqs, &pair.dlq_url).await?;
    if waiting == 0 {
        println!("{:?}: the DLQ is empty; nothing to redrive", pair.name);
        return Ok(());
    }
    let started = sqs
        .start_message_move_task()
        .source_arn(&pair.dlq_arn)
        .set_max_number_of_messages_per_second(max_per_second)
        .send()
        .await
        .context("StartMessageMoveTask failed")?;
    let handle = started.task_handle.unwrap_or_default();
    println!("{:?}: redriving about {waiting} messages to {} (task {handle})", pair.name, pair.source_url);
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        let tasks = sqs.list_message_move_tasks().source_arn(&pair.dlq_arn).max_results(1).send().await?;
        let Some(task) = tasks.results().first() else {
            anyhow::bail!("the move task is not listed");
        };
        let status = task.status().unwrap_or("UNKNOWN");
        println!(
            "{:?}: {status}: moved {} of {}",
            pair.name,
            task.approximate_number_of_messages_moved(),
            task.approximate_number_of_messages_to_move().unwrap_or(waiting as i64)
        );
        match status {
            "COMPLETED" => return Ok(()),
            "FAILED" | "CANCELLED" => {
                anyhow::bail!("the move task ended {status}: {}", task.failure_reason().unwrap_or(""))
            }
            _ => {}
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the move task did not finish in 10 minutes");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
