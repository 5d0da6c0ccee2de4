//! Fresh queues per test, made from the deployed stack's definitions: the test reads the
//! attributes of the queue `make up` deployed from `infra/messaging.yaml` and creates a new
//! source queue and DLQ with the same attributes, so every test runs against what production
//! runs, without sharing messages with other tests.

use std::collections::HashMap;

use anyhow::Context;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName as Attr;
use serde_json::{Value, json};

/// One of the stack's queue pairs.
#[derive(Debug, Clone, Copy)]
pub enum StackQueue {
    StockCheck,
    Notification,
}

impl StackQueue {
    fn url_variable(self) -> &'static str {
        match self {
            StackQueue::StockCheck => "STOCK_QUEUE_URL",
            StackQueue::Notification => "NOTIFICATION_QUEUE_URL",
        }
    }
}

/// A source queue and its DLQ, the test's own.
#[derive(Debug, Clone)]
pub struct TestQueues {
    pub url: String,
    pub arn: String,
    pub dlq_url: String,
    pub dlq_arn: String,
    pub max_receive_count: u32,
}

pub async fn attributes(sqs: &Client, url: &str) -> anyhow::Result<HashMap<Attr, String>> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(Attr::All)
        .send()
        .await
        .with_context(|| format!("failed to read the attributes of {url}"))?;
    Ok(out.attributes.unwrap_or_default())
}

impl TestQueues {
    /// New queues shaped like the deployed `queue` pair, named after `test`.
    pub async fn like(sqs: &Client, queue: StackQueue, test: &str) -> anyhow::Result<Self> {
        Self::like_with_visibility(sqs, queue, test, None).await
    }

    /// The same, with another visibility timeout (for tests of slow handling).
    pub async fn like_with_visibility(
        sqs: &Client,
        queue: StackQueue,
        test: &str,
        visibility_seconds: Option<u32>,
    ) -> anyhow::Result<Self> {
        let source_url = crate::stack_var(queue.url_variable());
        let source = attributes(sqs, &source_url).await?;
        let redrive: Value =
            serde_json::from_str(source.get(&Attr::RedrivePolicy).context("no RedrivePolicy")?)?;
        let deployed_dlq_arn = redrive["deadLetterTargetArn"].as_str().context("no deadLetterTargetArn")?;
        let deployed_dlq_name = deployed_dlq_arn.rsplit(':').next().context("a DLQ ARN")?;
        let deployed_dlq_url = sqs.get_queue_url().queue_name(deployed_dlq_name).send().await?;
        let dlq = attributes(sqs, deployed_dlq_url.queue_url().context("a DLQ URL")?).await?;
        let max_receive_count = match &redrive["maxReceiveCount"] {
            Value::Number(n) => n.as_u64().context("maxReceiveCount")? as u32,
            Value::String(s) => s.parse()?,
            other => anyhow::bail!("maxReceiveCount is {other}"),
        };

        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("t-{}-{}", sanitize(test), &suffix[..12]);
        let region = crate::stack_var("AWS_REGION");
        let account = deployed_dlq_arn.split(':').nth(4).context("an account id in the DLQ ARN")?;
        let source_arn = format!("arn:aws:sqs:{region}:{account}:{name}");

        let copy = |from: &HashMap<Attr, String>, names: &[Attr]| -> HashMap<Attr, String> {
            names.iter().filter_map(|n| from.get(n).map(|v| (n.clone(), v.clone()))).collect()
        };
        let mut dlq_attrs = copy(&dlq, &[Attr::MessageRetentionPeriod, Attr::SqsManagedSseEnabled]);
        if dlq.contains_key(&Attr::RedriveAllowPolicy) {
            let policy = json!({ "redrivePermission": "byQueue", "sourceQueueArns": [source_arn] });
            dlq_attrs.insert(Attr::RedriveAllowPolicy, policy.to_string());
        }
        let dlq_url = create(sqs, &format!("{name}-dlq"), dlq_attrs).await?;
        let dlq_arn = attributes(sqs, &dlq_url).await?.remove(&Attr::QueueArn).context("QueueArn")?;

        let mut source_attrs = copy(
            &source,
            &[
                Attr::MessageRetentionPeriod,
                Attr::ReceiveMessageWaitTimeSeconds,
                Attr::VisibilityTimeout,
                Attr::SqsManagedSseEnabled,
            ],
        );
        if let Some(seconds) = visibility_seconds {
            source_attrs.insert(Attr::VisibilityTimeout, seconds.to_string());
        }
        let policy = json!({ "deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count });
        source_attrs.insert(Attr::RedrivePolicy, policy.to_string());
        let url = create(sqs, &name, source_attrs).await?;
        Ok(Self { url, arn: source_arn, dlq_url, dlq_arn, max_receive_count })
    }

    /// Deletes both queues (call at the end of a passing test).
    pub async fn delete(&self, sqs: &Client) -> anyhow::Result<()> {
        sqs.delete_queue().queue_url(&self.url).send().await?;
        sqs.delete_queue().queue_url(&self.dlq_url).send().await?;
        Ok(())
    }
}

async fn create(sqs: &Client, name: &str, attributes: HashMap<Attr, String>) -> anyhow::Result<String> {
    let out = sqs
        .create_queue()
        .queue_name(name)
        .set_attributes(Some(attributes))
        .send()
        .await
        .with_context(|| format!("failed to create queue {name}"))?;
    out.queue_url.context("CreateQueue returned no URL")
}

fn sanitize(test: &str) -> String {
    test.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).take(40).collect()
}
