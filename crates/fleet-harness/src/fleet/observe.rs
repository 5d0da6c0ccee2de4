//! The observer's view of the fleet: its processes' metrics and logs, the queue it observes
//! the topic through and the notifications seen there, the queues' depths and messages, the
//! database's counts, and what the audits read (holds on buyers who got nothing).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::Value;

use super::Fleet;

/// A queue of the fleet's own for the topic's notifications, subscribed to the topic when
/// `observe`: its URL and the subscription's ARN (empty when not subscribed).
pub(super) async fn observer(
    sqs: &aws_sdk_sqs::Client,
    sns: &aws_sdk_sns::Client,
    topic_arn: &str,
    observe: bool,
) -> anyhow::Result<(String, String)> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let observer = sqs.create_queue().queue_name(format!("observer-{}", &suffix[..12])).send().await?;
    let observer_url = observer.queue_url.context("an observer queue URL")?;
    let observer_arn = sqs
        .get_queue_attributes()
        .queue_url(&observer_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .context("the observer's ARN")?;
    if !observe {
        return Ok((observer_url, String::new()));
    }
    let subscription = sns
        .subscribe()
        .topic_arn(topic_arn)
        .protocol("sqs")
        .endpoint(&observer_arn)
        .return_subscription_arn(true)
        .send()
        .await?
        .subscription_arn
        .unwrap_or_default();
    Ok((observer_url, subscription))
}

impl Fleet {
    /// The `/metrics` URL of the process `label`.
    pub fn metrics_url(&self, label: &str) -> Option<&str> {
        self.metrics_urls.iter().find(|(l, _)| l == label).map(|(_, url)| url.as_str())
    }

    /// PaymentIntents that hold or held funds (authorized, or cancelled after authorizing) for
    /// an order that was not paid: holds on buyers who got nothing (SPEC §8.8).
    pub async fn holds_without_a_unit(&self) -> anyhow::Result<usize> {
        let paid: std::collections::HashSet<String> =
            sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM orders WHERE sold(status)")
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(|id| id.to_string())
                .collect();
        Ok(self
            .intents()
            .await?
            .iter()
            .filter(|i| {
                // A cancelled intent held funds only if it was authorized (it has a charge, and
                // no payment error): one cancelled while its buyer was at 3-D Secure never held
                // anything, nor one whose charge the issuer declined (after 3-D Secure, say).
                let held = i["status"] == "requires_capture"
                    || (i["status"] == "canceled"
                        && !i["latest_charge"].is_null()
                        && i["last_payment_error"].is_null());
                !paid.contains(i["metadata"]["order_id"].as_str().unwrap_or("")) && held
            })
            .count())
    }

    /// The product's units for sale in all, in stock, and promised.
    pub async fn units(&self, product: &str) -> anyhow::Result<(i32, i32, i32)> {
        Ok(sqlx::query_as("SELECT units_total, stock, units_promised FROM products WHERE id = $1")
            .bind(product)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Orders by status.
    pub async fn statuses(&self) -> anyhow::Result<HashMap<String, i64>> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT status::text, count(*) FROM orders GROUP BY status")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().collect())
    }

    /// A queue's messages: (visible, in flight).
    pub async fn queue_depth(&self, queue_url: &str) -> anyhow::Result<(u64, u64)> {
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .context("failed to read the queue's depth")?;
        let attributes = out.attributes.unwrap_or_default();
        let get = |a: QueueAttributeName| attributes.get(&a).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok((
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    }

    /// Waits until both work queues hold no message, visible or in flight: every message
    /// handled and deleted. A message whose delete was lost is in flight until its visibility
    /// timeout ends and it is handled again (found done), so this can take that long.
    pub async fn wait_drained(&self, within: Duration) -> anyhow::Result<()> {
        let queues = [self.stack.stock_queue_url.clone(), self.stack.notification_queue_url.clone()];
        crate::eventually("the work queues drained", within, || async {
            for queue in &queues {
                if self.queue_depth(queue).await.ok()? != (0, 0) {
                    return None;
                }
            }
            Some(())
        })
        .await
    }

    /// Waits until every order is terminal (and its hold released where it needs to be).
    pub async fn wait_settled(&self, timeout: Duration) -> anyhow::Result<HashMap<String, i64>> {
        let deadline = Instant::now() + timeout;
        loop {
            let unsettled: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM orders
                  WHERE holds_units(status)
                     OR (status IN ('rejected_out_of_stock', 'capture_failed') AND authorization_released_at IS NULL)",
            )
            .fetch_one(&self.pool)
            .await?;
            if unsettled == 0 {
                return self.statuses().await;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{unsettled} orders unsettled after {timeout:?}: {:?}",
                self.statuses().await?
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Notifications seen on the topic: (event_type, order_id) for each, after waiting until
    /// `expected` arrived and a quiet second passed (to catch duplicates).
    pub async fn notifications(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut seen = Vec::new();
        for outer in self.notification_messages(expected, timeout).await? {
            let event_type =
                outer["MessageAttributes"]["event_type"]["Value"].as_str().unwrap_or("?").to_owned();
            let inner: Value = serde_json::from_str(outer["Message"].as_str().unwrap_or("{}"))?;
            seen.push((event_type, inner["order_id"].as_str().unwrap_or("?").to_owned()));
        }
        Ok(seen)
    }

    /// The notifications seen on the topic as SNS delivered them (its JSON, with the message
    /// attributes), waiting as [`Fleet::notifications`] does.
    pub async fn notification_messages(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let wait = if seen.len() >= expected { 1 } else { 2 };
            let out = self
                .sqs
                .receive_message()
                .queue_url(&self.observer_url)
                .max_number_of_messages(10)
                .wait_time_seconds(wait)
                .send()
                .await?;
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() && (seen.len() >= expected || Instant::now() > deadline) {
                return Ok(seen);
            }
            for m in messages {
                seen.push(serde_json::from_str(m.body().unwrap_or("{}"))?);
                self.sqs
                    .delete_message()
                    .queue_url(&self.observer_url)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await?;
            }
        }
    }

    /// The `/metrics` text of every fleet process that answers.
    pub async fn scrape_metrics(&self) -> Vec<String> {
        let mut texts = Vec::new();
        for (_, url) in &self.metrics_urls {
            if let Ok(response) = self.http.get(url).timeout(Duration::from_secs(2)).send().await
                && let Ok(text) = response.text().await
            {
                texts.push(text);
            }
        }
        texts
    }

    /// Where the processes' logs are.
    pub fn log_dir(&self) -> &std::path::Path {
        &self.log_dir
    }

    /// Takes `n` messages off a queue (waiting up to 30 s for them to arrive) and deletes
    /// them; their bodies, in the order received.
    pub async fn take_messages(&self, queue_url: &str, n: usize) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut bodies = Vec::new();
        while bodies.len() < n {
            anyhow::ensure!(Instant::now() < deadline, "only {} of {n} messages arrived", bodies.len());
            let received = self
                .sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages((n - bodies.len()).min(10) as i32)
                .wait_time_seconds(1)
                .send()
                .await?;
            for message in received.messages.unwrap_or_default() {
                bodies.push(message.body.unwrap_or_default());
                if let Some(receipt) = message.receipt_handle {
                    self.sqs.delete_message().queue_url(queue_url).receipt_handle(receipt).send().await?;
                }
            }
        }
        Ok(bodies)
    }
}
