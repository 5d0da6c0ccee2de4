//! A fleet in a world of its own: a fresh database, fresh queues shaped like the deployed
//! stack's, and a fresh topic, so tests run in parallel without seeing each other.

use std::ops::{Deref, DerefMut};

use fleet_harness::{Fleet, Stack};

use crate::queues::StackQueue;
use crate::{TestDatabase, TestQueues, aws};

pub struct TestFleet {
    fleet: Fleet,
    pub db: TestDatabase,
    pub stock: TestQueues,
    pub notification: TestQueues,
    pub topic_arn: String,
}

impl Deref for TestFleet {
    type Target = Fleet;
    fn deref(&self) -> &Fleet {
        &self.fleet
    }
}

impl DerefMut for TestFleet {
    fn deref_mut(&mut self) -> &mut Fleet {
        &mut self.fleet
    }
}

impl TestFleet {
    async fn world(
        name: &str,
    ) -> anyhow::Result<(TestDatabase, TestQueues, TestQueues, String, Stack, std::path::PathBuf)> {
        let sdk = aws().await;
        let sqs = sdk.sqs();
        let db = TestDatabase::migrated().await?;
        let stock = TestQueues::like(&sqs, StackQueue::StockCheck, name).await?;
        let notification = TestQueues::like(&sqs, StackQueue::Notification, name).await?;
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let topic =
            sdk.sns().create_topic().name(format!("t-{}-order-notifications", &suffix[..12])).send().await?;
        let topic_arn = topic.topic_arn.unwrap_or_default();
        let stack = Stack {
            database_url: db.url.clone(),
            stock_queue_url: stock.url.clone(),
            notification_queue_url: notification.url.clone(),
            topic_arn: topic_arn.clone(),
            aws_env: Stack::aws_env_from_process(),
        };
        let log_dir = fleet_harness::binary("fleetctl").parent().unwrap().join("e2e-logs").join(name);
        Ok((db, stock, notification, topic_arn, stack, log_dir))
    }

    /// stripe-sim and an observer; no fleet binaries yet.
    pub async fn prepare(name: &str) -> anyhow::Result<Self> {
        let (db, stock, notification, topic_arn, stack, log_dir) = Self::world(name).await?;
        let fleet = Fleet::prepare(name, stack, log_dir).await?;
        Ok(Self { fleet, db, stock, notification, topic_arn })
    }

    /// The whole fleet with `stock_workers` stock-worker processes.
    pub async fn start(name: &str, stock_workers: usize) -> anyhow::Result<Self> {
        let (db, stock, notification, topic_arn, stack, log_dir) = Self::world(name).await?;
        let fleet = Fleet::start(name, stack, log_dir, stock_workers).await?;
        Ok(Self { fleet, db, stock, notification, topic_arn })
    }

    /// Stops the processes (SIGTERM; each must exit 0) and removes the world.
    pub async fn stop(self) -> anyhow::Result<()> {
        let failed = self.fleet.stop().await?;
        let sdk = aws().await;
        let sqs = sdk.sqs();
        let _ = sdk.sns().delete_topic().topic_arn(&self.topic_arn).send().await;
        let _ = self.stock.delete(&sqs).await;
        let _ = self.notification.delete(&sqs).await;
        self.db.drop().await?;
        anyhow::ensure!(failed.is_empty(), "these processes did not stop cleanly on SIGTERM: {failed:?}");
        Ok(())
    }
}
