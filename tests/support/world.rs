//! A fleet in a world of its own: a fresh database, fresh queues shaped like the deployed
//! stack's, and a fresh topic, so tests run in parallel without seeing each other.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

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

/// What a test's fleet runs against, before the fleet starts.
struct World {
    db: TestDatabase,
    stock: TestQueues,
    notification: TestQueues,
    topic_arn: String,
    log_dir: PathBuf,
}

impl World {
    async fn create(name: &str, stock_visibility: Option<u32>, db: TestDatabase) -> anyhow::Result<Self> {
        let sdk = aws().await;
        let sqs = sdk.sqs();
        let stock =
            TestQueues::like_with_visibility(&sqs, StackQueue::StockCheck, name, stock_visibility).await?;
        let notification = TestQueues::like(&sqs, StackQueue::Notification, name).await?;
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let topic =
            sdk.sns().create_topic().name(format!("t-{}-order-notifications", &suffix[..12])).send().await?;
        let topic_arn = topic.topic_arn.unwrap_or_default();
        let log_dir = fleet_harness::binary("fleetctl").parent().unwrap().join("e2e-logs").join(name);
        Ok(Self { db, stock, notification, topic_arn, log_dir })
    }

    fn stack(&self) -> Stack {
        Stack {
            database_url: self.db.url.clone(),
            stock_queue_url: self.stock.url.clone(),
            notification_queue_url: self.notification.url.clone(),
            topic_arn: self.topic_arn.clone(),
            aws_env: Stack::aws_env_from_process(),
        }
    }

    fn with(self, fleet: Fleet) -> TestFleet {
        TestFleet {
            fleet,
            db: self.db,
            stock: self.stock,
            notification: self.notification,
            topic_arn: self.topic_arn,
        }
    }
}

/// Tests hammer the intake from a few users, and some decline many cards: they run with the
/// per-user limits out of the way. The limits themselves are tested at their defaults
/// ([`Builder::default_limits`]).
const GENEROUS_LIMITS: [(&str, &str); 3] = [
    ("INTAKE_USER_RATE_PER_SECOND", "10000"),
    ("INTAKE_USER_BURST", "10000"),
    ("INTAKE_DECLINES_PER_HOUR", "0"),
];

/// How a test's fleet is made: `TestFleet::builder(name)`, what differs from the usual, then
/// [`Builder::prepare`] (stripe-sim and an observer, no fleet binaries) or
/// [`Builder::start`] (the whole fleet).
pub struct Builder {
    name: String,
    stock_visibility: Option<u32>,
    db: Option<TestDatabase>,
    generous_limits: bool,
}

impl Builder {
    /// The stock-check queue with another visibility timeout (so a crashed worker's message
    /// comes back in seconds, not a minute).
    pub fn stock_visibility(self, seconds: u32) -> Self {
        Self { stock_visibility: Some(seconds), ..self }
    }

    /// Against `db` (a database on a server of the test's own), not a fresh one on the suite's.
    pub fn database(self, db: TestDatabase) -> Self {
        Self { db: Some(db), ..self }
    }

    /// The intake's per-user limits, and Stripe's search lag, at their defaults: the product as
    /// it ships.
    pub fn default_limits(self) -> Self {
        Self { generous_limits: false, ..self }
    }

    /// stripe-sim and an observer; no fleet binaries yet.
    pub async fn prepare(self) -> anyhow::Result<TestFleet> {
        let db = match self.db {
            Some(db) => db,
            None => TestDatabase::migrated().await?,
        };
        let world = World::create(&self.name, self.stock_visibility, db).await?;
        let mut fleet = Fleet::prepare(&self.name, world.stack(), world.log_dir.clone()).await?;
        if self.generous_limits {
            for (key, value) in GENEROUS_LIMITS {
                fleet.set_env(key, value);
            }
        }
        Ok(world.with(fleet))
    }

    /// The whole fleet, with `stock_workers` stock-worker processes.
    pub async fn start(self, stock_workers: usize) -> anyhow::Result<TestFleet> {
        let mut fleet = self.prepare().await?;
        fleet.spawn_all(stock_workers).await?;
        Ok(fleet)
    }
}

impl TestFleet {
    /// A fleet named `name` (its logs, its queues), made as the [`Builder`] is told.
    pub fn builder(name: &str) -> Builder {
        Builder { name: name.to_owned(), stock_visibility: None, db: None, generous_limits: true }
    }

    /// stripe-sim and an observer; no fleet binaries yet.
    pub async fn prepare(name: &str) -> anyhow::Result<Self> {
        Self::builder(name).prepare().await
    }

    /// The whole fleet with `stock_workers` stock-worker processes.
    pub async fn start(name: &str, stock_workers: usize) -> anyhow::Result<Self> {
        Self::builder(name).start(stock_workers).await
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
