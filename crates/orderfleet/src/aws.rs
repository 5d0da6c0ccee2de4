//! The AWS SDK clients, built with `aws-config` so that the SDK's own variables
//! (`AWS_REGION`, credentials, `AWS_ENDPOINT_URL` for LocalStack) apply unchanged.

use aws_config::BehaviorVersion;

use crate::config::ConfigError;

/// The SDK configuration every AWS client of a process is built from.
#[derive(Debug, Clone)]
pub struct Aws {
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

    pub fn sqs(&self) -> aws_sdk_sqs::Client {
        aws_sdk_sqs::Client::new(&self.sdk)
    }

    pub fn sns(&self) -> aws_sdk_sns::Client {
        aws_sdk_sns::Client::new(&self.sdk)
    }
}
