//! The AWS SDK clients, built with `aws-config` so that the SDK's own variables
//! (`AWS_REGION`, credentials, `AWS_ENDPOINT_URL` for LocalStack) apply unchanged.
//!
//! Every client counts the requests it sends — each attempt, retries included, since each is
//! billed — by service and operation, in the `aws_requests_total` metric that `/metrics`
//! exports and the demo and the benchmark report per order. An attempt that fails is counted
//! in `aws_request_failures_total` (and logged at debug): the SDK retries it, and a `ReceiveMessage`
//! attempt abandoned after SQS took its messages leaves them invisible for the queue's
//! visibility timeout.
//!
//! The operations a process called are also kept by name (`operations_called`) and logged
//! when it stops (target `aws_operations`): what its IAM role must allow, which the test
//! command compares with what `infra/` grants each role.
//!
//! **Every call is bounded** ([`timeouts`]): a connection in 3 s, an attempt in 10 s, a call
//! with its retries in 20 s; a long poll gets its wait on top (`long_poll_timeouts`). Without
//! them a peer that stops answering without closing holds a call forever: a hung
//! `DeleteMessageBatch` would block the consumer's acknowledgements (its heartbeats among
//! them) and its final flush at a stop, and a hung `PublishBatch` would outlive the
//! notification's inbox claim (30 s), letting a duplicate copy publish too.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use aws_smithy_types::timeout::TimeoutConfig;

use crate::config::ConfigError;

/// The SDK configuration every AWS client of a process is built from.
#[derive(Debug, Clone)]
pub struct Aws {
    /// The SDK's configuration: region, credentials, endpoint.
    pub sdk: aws_config::SdkConfig,
}

impl Aws {
    /// Loads the SDK configuration from the environment (and, on EC2/ECS, the instance or
    /// task role). A region is required: without one every call would fail later, so the
    /// binary stops now, naming the variable.
    pub async fn load() -> Result<Self, ConfigError> {
        let sdk = aws_config::defaults(BehaviorVersion::latest()).load().await;
        if sdk.region().is_none() {
            return Err(ConfigError::Missing { name: "AWS_REGION" });
        }
        Ok(Self { sdk })
    }

    /// An SQS client, counted and bounded.
    pub fn sqs(&self) -> aws_sdk_sqs::Client {
        counted_and_bounded!(aws_sdk_sqs, &self.sdk)
    }

    /// A CloudWatch client, counted and bounded.
    pub fn cloudwatch(&self) -> aws_sdk_cloudwatch::Client {
        counted_and_bounded!(aws_sdk_cloudwatch, &self.sdk)
    }

    /// An SNS client, counted and bounded.
    pub fn sns(&self) -> aws_sdk_sns::Client {
        counted_and_bounded!(aws_sdk_sns, &self.sdk)
    }
}

/// A client of one SDK crate, counting its requests and bounded by [`timeouts`]. A macro
/// because each SDK crate has its own config builder, with no trait in common.
macro_rules! counted_and_bounded {
    ($sdk:ident, $config:expr) => {
        $sdk::Client::from_conf(
            $sdk::config::Builder::from($config)
                .interceptor(CountRequests)
                .timeout_config(timeouts())
                .build(),
        )
    };
}
use counted_and_bounded;

/// The bound on every AWS call of the fleet. The whole call (20 s) stays under the
/// notification worker's inbox claim (30 s).
pub fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(20))
        .build()
}

/// The bound on a long poll that waits up to `wait` for messages: an attempt may take the
/// wait and 10 s more.
pub(crate) fn long_poll_timeouts(wait: Duration) -> TimeoutConfig {
    let attempt = wait + Duration::from_secs(10);
    TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(attempt)
        .operation_timeout(attempt * 2)
        .build()
}

/// Every `service:Operation` this process has sent a request for.
static CALLED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The AWS operations this process has called (`sqs:ReceiveMessage,sns:PublishBatch`, in
/// order; `none` for none).
pub(crate) fn operations_called() -> String {
    let called = CALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if called.is_empty() { "none".to_owned() } else { called.iter().cloned().collect::<Vec<_>>().join(",") }
}

/// Logs `operations_called` for `binary` (target `aws_operations`, at `level`): the line the
/// test command's least-privilege check reads.
pub fn log_operations_called(binary: &str, level: tracing::Level) {
    let operations = operations_called();
    if level == tracing::Level::INFO {
        tracing::info!(target: "aws_operations", binary, operations, "AWS operations this process called");
    } else {
        tracing::debug!(target: "aws_operations", binary, operations, "AWS operations this process called");
    }
}

/// Counts every request attempt by service and operation.
#[derive(Debug)]
struct CountRequests;

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(metadata) = cfg.load::<Metadata>() {
            metrics::counter!(
                crate::metrics::AWS_REQUESTS.name,
                "service" => metadata.service().to_owned(),
                "operation" => metadata.name().to_owned()
            )
            .increment(1);
            let called = format!("{}:{}", metadata.service(), metadata.name());
            CALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(called);
        }
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(Err(error)) = context.output_or_error()
            && let Some(metadata) = cfg.load::<Metadata>()
        {
            metrics::counter!(
                crate::metrics::AWS_REQUEST_FAILURES.name,
                "service" => metadata.service().to_owned(),
                "operation" => metadata.name().to_owned()
            )
            .increment(1);
            // Debug, not warn: the callers log outages once per interval, and an outage fails
            // many attempts a second; the counter is what to alert on.
            tracing::debug!(
                service = metadata.service(),
                operation = metadata.name(),
                error = ?error,
                "an AWS request attempt failed"
            );
        }
        Ok(())
    }
}
