//! The relay's settings: what it reads from the environment once, at start.

use std::time::Duration;

use orderfleet_runtime::backoff::Backoff;
use orderfleet_runtime::config::{ConfigError, DatabaseConfig, Env, QueueConfig, Setting};

use crate::gauges;
use crate::retention::{RetentionMode, RetentionPolicy};

#[derive(Debug, Clone)]
pub(crate) struct RelayConfig {
    pub database: DatabaseConfig,
    pub queues: QueueConfig,
    pub retention: RetentionPolicy,
    pub tuning: RelayTuning,
    pub gauges: gauges::GaugeConfig,
}

/// The relay's knobs; defaults fit a flash sale on a small box.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RelayTuning {
    /// Rows claimed per round.
    pub claim_batch: i64,
    /// Rounds at once while claims come back full; one otherwise.
    pub lanes: usize,
    /// How long a claim lasts before another relay may take the rows over.
    pub claim_lease: Duration,
    /// Sends per row before it is `dead` (entry-level transient failures only).
    pub max_attempts: i32,
    pub retry_backoff: Backoff,
    /// Between rounds during an outage.
    pub outage_backoff: Backoff,
    /// The fallback poll when no notification comes.
    pub poll_interval: Duration,
    /// After a round that claimed fewer rows than `claim_batch`, how long to wait before the
    /// next claim, so that under a burst the next round's batches go out full rather than a
    /// few rows at a time (the first row after a quiet spell is never delayed).
    pub fill_delay: Duration,
    /// Whether to use SendMessageBatch (10 per call) or one SendMessage per row, for the
    /// benchmark that shows what batching buys.
    pub batching: bool,
}

impl Default for RelayTuning {
    fn default() -> Self {
        Self {
            claim_batch: 100,
            lanes: 3,
            claim_lease: Duration::from_secs(30),
            max_attempts: 8,
            retry_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            outage_backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            poll_interval: Duration::from_secs(5),
            fill_delay: Duration::from_millis(100),
            batching: true,
        }
    }
}

struct Mode(RetentionMode);

impl Setting for Mode {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        match raw {
            "archive" => Ok(Mode(RetentionMode::Archive)),
            "delete" => Ok(Mode(RetentionMode::Delete)),
            _ => Err(format!("expected \"archive\" or \"delete\", got {raw:?}")),
        }
    }
}

/// `OUTBOX_METRICS_INTERVAL_SECONDS`: 30 by default, 1 to 60. The alarms read one-minute
/// periods, the pending-age one treating a missing minute as breaching: a slower interval
/// would page with nothing wrong.
fn gauge_interval(env: &Env) -> Result<Duration, ConfigError> {
    let seconds: u64 = env.or_default("OUTBOX_METRICS_INTERVAL_SECONDS", 30)?;
    if !(1..=60).contains(&seconds) {
        return Err(ConfigError::Malformed {
            name: "OUTBOX_METRICS_INTERVAL_SECONDS",
            reason: format!("must be 1 to 60 (the alarms' period), got {seconds}"),
        });
    }
    Ok(Duration::from_secs(seconds))
}

impl RelayConfig {
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let hours: u64 = env.or_default("OUTBOX_RETENTION_HOURS", 168)?;
        let mode: Option<Mode> = env.optional("OUTBOX_RETENTION_MODE")?;
        let max_attempts: u32 =
            env.or_default("OUTBOX_MAX_ATTEMPTS", RelayTuning::default().max_attempts as u32)?;
        if max_attempts == 0 {
            return Err(ConfigError::Malformed {
                name: "OUTBOX_MAX_ATTEMPTS",
                reason: "must be at least 1".into(),
            });
        }
        let batching = orderfleet_runtime::config::batching(env)?;
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            queues: QueueConfig::from_env(env)?,
            gauges: gauges::GaugeConfig {
                namespace: env.optional("CLOUDWATCH_NAMESPACE")?,
                every: gauge_interval(env)?,
            },
            retention: RetentionPolicy {
                age: Duration::from_secs(hours * 3600),
                mode: mode.map(|m| m.0).unwrap_or(RetentionMode::Archive),
                batch: 500,
                every: Duration::from_secs(60),
            },
            tuning: RelayTuning {
                max_attempts: max_attempts as i32,
                batching,
                // One message per call gains nothing from waiting for more.
                fill_delay: if batching { RelayTuning::default().fill_delay } else { Duration::ZERO },
                ..RelayTuning::default()
            },
        })
    }
}
