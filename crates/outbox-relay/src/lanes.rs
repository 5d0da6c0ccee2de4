//! The relay's lanes: [`run`] starts them and stops them together, and each [`Lane`] goes
//! round after round — claim due rows, send them, record every row's result, then pace itself
//! (back off while SQS is down, let the outbox fill after a short round). Lane 0 always runs
//! and wakes on new rows; the others claim only while claims come back full, so a burst is
//! sent by several rounds at once and a trickle by one, in full batches.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use orderfleet_runtime::backlog::Backlog;
use orderfleet_runtime::backoff::Backoff;
use orderfleet_runtime::db::Pool;
use orderfleet_runtime::failure::{Failure, Kind, Outcome, Source};
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::config::RelayTuning;
use crate::rows::{Claimed, claim, next_due, record};
use crate::send::{self, Sender};
use crate::wait::{connect_listener, pause, wait_for_rows};

/// The relay loop. Returns when `cancel` fires; a round in progress finishes first (its sends
/// are short and their results must be recorded, or the rows would wait out their lease).
pub(crate) async fn run(
    pool: Pool,
    sender: Sender,
    tuning: RelayTuning,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let backlog = Arc::new(Backlog::default());
    // A lane that panics stops the others at the end of their rounds (not mid-round, which
    // would leave sent rows unrecorded until their lease ends), and then the relay.
    let lanes_cancel = cancel.child_token();
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..tuning.lanes.max(1) {
        let lane = Lane {
            id: lane,
            pool: pool.clone(),
            sender: sender.clone(),
            tuning,
            backlog: backlog.clone(),
            cancel: lanes_cancel.clone(),
            listener: None,
            claim_failures: 0,
            outages: 0,
        };
        lanes.spawn(lane.run());
    }
    let mut panicked = None;
    while let Some(done) = lanes.join_next().await {
        if let Err(e) = done {
            tracing::error!(error = %e, "a relay lane panicked; stopping the others");
            lanes_cancel.cancel();
            panicked.get_or_insert(e);
        }
    }
    match panicked {
        Some(e) => Err(e).context("a relay lane panicked"),
        None => Ok(()),
    }
}

/// One lane of the relay: a round at a time. Lane 0 always runs and wakes on new rows; the
/// others run only while the backlog is deep.
struct Lane {
    id: usize,
    pool: Pool,
    sender: Sender,
    tuning: RelayTuning,
    backlog: Arc<Backlog>,
    cancel: CancellationToken,
    /// Lane 0's `LISTEN outbox_inserted`, reconnected when it drops.
    listener: Option<PgListener>,
    /// Claims failed in a row (the database), and rounds that found SQS down in a row.
    claim_failures: u32,
    outages: u32,
}

impl Lane {
    /// Rounds until the stop signal: claim, send, record, pace. A round in progress finishes
    /// first (its sends are short and their results must be recorded, or the rows would wait
    /// out their lease).
    async fn run(mut self) {
        if self.id == 0 {
            self.listener = connect_listener(&self.pool).await;
        }
        while !self.cancel.is_cancelled() {
            if self.id > 0 && !self.backlog.wait_deep(&self.cancel).await {
                return;
            }
            let Some(claimed) = self.claim().await else { continue };
            if claimed.is_empty() {
                self.wait_for_rows().await;
                continue;
            }
            let short_round = (claimed.len() as i64) < self.tuning.claim_batch;
            let outcomes = self.send(claimed).await;
            let outage = outcomes.iter().all(|(_, o)| o.as_ref().is_err_and(|f| f.kind == Kind::Outage));
            if let Err(e) = record(&self.pool, &outcomes, &self.tuning).await {
                // The rows stay `processing` until their lease ends, then come due again: they
                // may be sent twice, which the consumers' inbox and status guards absorb.
                tracing::warn!(error = %e, lane = self.id, "failed to record send results; the rows come due again after their lease");
            }
            self.pace(outage, short_round).await;
        }
    }

    /// Claims a round's rows; `None` after a failed claim (the database), once its backoff
    /// has passed.
    async fn claim(&mut self) -> Option<Vec<Claimed>> {
        match claim(&self.pool, self.tuning.claim_batch, self.tuning.claim_lease).await {
            Ok(rows) => {
                self.claim_failures = 0;
                // A full claim wakes the other lanes at once, unless this lane is probing an
                // outage: one lane is enough to find out when SQS answers again.
                if self.outages == 0 || rows.is_empty() {
                    self.backlog.observe(rows.len(), self.tuning.claim_batch as usize);
                }
                let result = if rows.is_empty() { "empty" } else { "rows" };
                metrics::counter!(crate::metrics::OUTBOX_CLAIMS.name, "result" => result).increment(1);
                Some(rows)
            }
            Err(e) => {
                self.claim_failures += 1;
                self.backlog.observe(0, 1);
                let (failures, lane) = (self.claim_failures, self.id);
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(error = %e, failures, lane, "cannot claim outbox rows; the database may be down");
                }
                let delay = Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).delay(failures);
                pause(&self.cancel, delay).await;
                None
            }
        }
    }

    /// Sends the rows. The round must end well inside the claim, or another relay may take
    /// the rows over while this one still sends them; a round cut short is an outage, charged
    /// to no row.
    async fn send(&self, claimed: Vec<Claimed>) -> Vec<(Claimed, Outcome)> {
        let limit = self.tuning.claim_lease / 2;
        match tokio::time::timeout(limit, self.sender.send(claimed.clone())).await {
            Ok(outcomes) => outcomes,
            Err(_) => {
                let reason = format!("the send round took longer than {limit:?}");
                let failure = Failure::outage(Source::Sqs, "timeout", reason).retry_after(send::OUTAGE_RETRY);
                claimed.into_iter().map(|row| (row, Err(failure.clone()))).collect()
            }
        }
    }

    /// After a round: back off while SQS is down; otherwise, after a short round, give the
    /// outbox a moment to fill so the next round's batches go out full.
    async fn pace(&mut self, outage: bool, short_round: bool) {
        let lane = self.id;
        if outage {
            self.backlog.observe(0, 1);
            self.outages += 1;
            let (outages, delay) = (self.outages, self.tuning.outage_backoff.delay(self.outages - 1));
            if outages == 1 || outages.is_multiple_of(20) {
                tracing::warn!(outages, lane, ?delay, "SQS is unreachable; holding every row, charging none");
            }
            return pause(&self.cancel, delay).await;
        }
        if self.outages > 0 {
            tracing::info!(outages = self.outages, lane, "SQS answers again; draining");
        }
        self.outages = 0;
        if short_round && !self.tuning.fill_delay.is_zero() {
            pause(&self.cancel, self.tuning.fill_delay).await;
        }
    }

    /// Nothing was due: lane 0 sleeps until a notification, the next row's due time or the
    /// fallback poll; another lane goes back to waiting for a deep backlog.
    async fn wait_for_rows(&mut self) {
        if self.id > 0 {
            return;
        }
        let wait = match next_due(&self.pool).await {
            Ok(Some(due)) => {
                (due - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO).min(self.tuning.poll_interval)
            }
            _ => self.tuning.poll_interval,
        };
        wait_for_rows(&mut self.listener, &self.pool, wait, &self.cancel).await;
    }
}
