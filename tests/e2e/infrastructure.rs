//! The messaging stack `make up` deployed from `infra/messaging.yaml`, read back through the
//! SDK: what SPEC §7 requires of it (a DLQ after three receives, encryption at rest), and
//! queues and a topic that refuse requests without TLS.

use std::collections::HashMap;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName as Attr};
use orderfleet_tests::queues::{StackQueue, attributes};
use orderfleet_tests::{TestQueues, aws, stack_var};
use serde_json::Value;

fn number(attrs: &HashMap<Attr, String>, name: Attr) -> u64 {
    attrs.get(&name).unwrap_or_else(|| panic!("{name:?} is missing")).parse().unwrap()
}

async fn check_queue_pair(queue_var: &str, dlq_var: &str) {
    let sqs = aws().await.sqs();
    let source = attributes(&sqs, &stack_var(queue_var)).await.unwrap();
    let dlq = attributes(&sqs, &stack_var(dlq_var)).await.unwrap();

    // Redrive after three receives, to this pair's own DLQ.
    let redrive: Value = serde_json::from_str(&source[&Attr::RedrivePolicy]).unwrap();
    assert_eq!(redrive["deadLetterTargetArn"], dlq[&Attr::QueueArn].as_str());
    assert_eq!(redrive["maxReceiveCount"].to_string().trim_matches('"'), "3");

    // Long polling, and a visibility timeout set for the worker.
    assert_eq!(number(&source, Attr::ReceiveMessageWaitTimeSeconds), 20);
    assert!(number(&source, Attr::VisibilityTimeout) >= 30);

    // Dead letters outlive their source: 14 days against 4.
    assert_eq!(number(&source, Attr::MessageRetentionPeriod), 4 * 24 * 3600);
    assert_eq!(number(&dlq, Attr::MessageRetentionPeriod), 14 * 24 * 3600);

    // Only the source queue may send to (and be redriven from) this DLQ.
    let allow: Value = serde_json::from_str(&dlq[&Attr::RedriveAllowPolicy]).unwrap();
    assert_eq!(allow["redrivePermission"], "byQueue");
    assert_eq!(allow["sourceQueueArns"], serde_json::json!([source[&Attr::QueueArn]]));

    // Encrypted at rest with SQS-managed keys.
    assert_eq!(source[&Attr::SqsManagedSseEnabled], "true");
    assert_eq!(dlq[&Attr::SqsManagedSseEnabled], "true");
}

#[tokio::test]
async fn the_stock_check_queue_redrives_to_its_dlq_after_three_receives() {
    check_queue_pair("STOCK_QUEUE_URL", "STOCK_DLQ_URL").await;
}

#[tokio::test]
async fn the_notification_queue_redrives_to_its_dlq_after_three_receives() {
    check_queue_pair("NOTIFICATION_QUEUE_URL", "NOTIFICATION_DLQ_URL").await;
}

#[tokio::test]
async fn the_notification_topic_is_encrypted_and_named_order_notifications() {
    let sns = aws().await.sns();
    let arn = stack_var("NOTIFICATION_TOPIC_ARN");
    assert!(arn.ends_with(":order-notifications"), "{arn}");
    let attrs = sns.get_topic_attributes().topic_arn(&arn).send().await.unwrap();
    let attrs = attrs.attributes.unwrap_or_default();
    assert_eq!(attrs.get("KmsMasterKeyId").map(String::as_str), Some("alias/aws/sns"));
}

#[tokio::test]
async fn a_message_received_three_times_is_in_the_dlq_after_the_fourth_receive() {
    // Arrange
    let sqs = aws().await.sqs();
    let queues = TestQueues::like(&sqs, StackQueue::StockCheck, "dlq-after-3").await.unwrap();
    assert_eq!(queues.max_receive_count, 3);
    sqs.send_message().queue_url(&queues.url).message_body("poison").send().await.unwrap();

    // Act: three receives that never delete; each makes the message visible again at once.
    for expected_count in 1..=3 {
        let received = sqs
            .receive_message()
            .queue_url(&queues.url)
            .wait_time_seconds(5)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .unwrap();
        let message = &received.messages()[0];
        let count = &message.attributes().unwrap()[&MessageSystemAttributeName::ApproximateReceiveCount];
        assert_eq!(count, &expected_count.to_string());
        sqs.change_message_visibility()
            .queue_url(&queues.url)
            .receipt_handle(message.receipt_handle().unwrap())
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }
    // The fourth receive finds nothing: SQS moved the message to the DLQ instead.
    let fourth = sqs.receive_message().queue_url(&queues.url).wait_time_seconds(1).send().await.unwrap();

    // Assert
    assert!(fourth.messages().is_empty(), "the fourth receive still got the message");
    let dead = sqs.receive_message().queue_url(&queues.dlq_url).wait_time_seconds(5).send().await.unwrap();
    assert_eq!(dead.messages().len(), 1);
    assert_eq!(dead.messages()[0].body(), Some("poison"));
    queues.delete(&sqs).await.unwrap();
}

/// Whether a resource policy denies every request made without TLS.
fn denies_requests_without_tls(policy: &str) -> bool {
    let policy: serde_json::Value = serde_json::from_str(policy).unwrap_or_default();
    let statements = match &policy["Statement"] {
        serde_json::Value::Array(all) => all.clone(),
        one => vec![one.clone()],
    };
    statements.iter().any(|s| {
        s["Effect"] == "Deny"
            && s["Principal"] == "*"
            && (s["Condition"]["Bool"]["aws:SecureTransport"] == "false"
                || s["Condition"]["Bool"]["aws:SecureTransport"] == false)
    })
}

#[tokio::test]
async fn the_queues_and_the_topic_deny_requests_without_tls() {
    use aws_sdk_sqs::types::QueueAttributeName;
    let sdk = aws().await;
    let sqs = sdk.sqs();
    for variable in ["STOCK_QUEUE_URL", "NOTIFICATION_QUEUE_URL", "STOCK_DLQ_URL", "NOTIFICATION_DLQ_URL"] {
        let url = stack_var(variable);
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::Policy)
            .send()
            .await;
        let policy = attrs.unwrap().attributes.unwrap_or_default().remove(&QueueAttributeName::Policy);
        assert!(policy.as_deref().is_some_and(denies_requests_without_tls), "{variable}: {policy:?}");
    }
    let topic = stack_var("NOTIFICATION_TOPIC_ARN");
    let attrs = sdk
        .sns()
        .get_topic_attributes()
        .topic_arn(&topic)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default();
    let policy = attrs.get("Policy").map(String::as_str);
    assert!(policy.is_some_and(denies_requests_without_tls), "topic: {policy:?}");
}
