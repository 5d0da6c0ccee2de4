//! A long-running process's tasks, supervised: each must run until the stop signal.
//!
//! A worker whose pollers all panicked, or a relay whose retention job died, would otherwise
//! go on looking alive (its `/healthz` answers) or exit 0, which systemd's
//! `Restart=on-failure` and an ECS service both take for a clean stop. Here the first task to
//! end before the stop signal — done, failed or panicked — stops the others, and the process
//! exits non-zero with one line naming the task and why ([`crate::service::main`]), so its
//! supervisor starts a new one.

use std::collections::HashMap;

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

/// The supervised tasks of one process.
pub struct Tasks {
    set: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, &'static str>,
    cancel: CancellationToken,
}

impl Tasks {
    /// Tasks that stop at `cancel` (the process's stop signal), which the first to end early
    /// fires for the rest.
    pub fn new(cancel: CancellationToken) -> Self {
        Self { set: JoinSet::new(), names: HashMap::new(), cancel }
    }

    /// The stop signal every task must stop at.
    pub fn stop_signal(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// A task that must run until the stop signal.
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// A task that returns nothing runs until the stop signal; ending is its only failure.
    pub fn spawn_loop(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.spawn(name, async move {
            task.await;
            Ok(())
        });
    }

    /// A server: after the stop signal it has `grace` to finish what is in flight (it stops
    /// accepting at the signal), then it is let go with a warning — a request still running
    /// then is cut off, and what it was doing is left for a retry or the sweeper to finish.
    pub fn spawn_server(
        &mut self,
        name: &'static str,
        grace: std::time::Duration,
        server: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let stop = self.cancel.clone();
        self.spawn(name, async move {
            tokio::select! {
                served = server => served?,
                () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
                    tracing::warn!(?grace, "{name}: requests still in flight after the shutdown grace; stopping anyway");
                }
            }
            Ok(())
        });
    }

    /// A task already running (the metrics server's), supervised like the rest.
    pub(crate) fn adopt(&mut self, name: &'static str, running: tokio::task::JoinHandle<anyhow::Result<()>>) {
        self.spawn(name, async move { running.await.map_err(|e| anyhow::anyhow!("{}", why_it_ended(e)))? });
    }

    /// Waits for every task. One that ends before the stop signal, or fails or panics at any
    /// time, stops the others and is the error returned (the first, if several).
    pub(crate) async fn run_until_stopped(mut self) -> anyhow::Result<()> {
        let mut first: Option<anyhow::Error> = None;
        while let Some(joined) = self.set.join_next_with_id().await {
            let (id, result) = match joined {
                Ok((id, result)) => (id, result),
                Err(e) => (e.id(), Err(anyhow::anyhow!("{}", why_it_ended(e)))),
            };
            let name = self.names.get(&id).copied().unwrap_or("a task");
            let ended = match result {
                Err(e) => Some(e.context(format!("the {name} task failed"))),
                Ok(()) if !self.cancel.is_cancelled() => {
                    Some(anyhow::anyhow!("the {name} task ended before the stop signal"))
                }
                Ok(()) => None,
            };
            if let Some(error) = ended {
                self.cancel.cancel();
                first.get_or_insert(error);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// A task's panic or cancellation, in words.
pub(crate) fn why_it_ended(error: JoinError) -> String {
    if !error.is_panic() {
        return "cancelled".to_owned();
    }
    let panic = error.into_panic();
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("panicked: {message}")
}

/// Sleeps for `delay`; false if the stop signal came first.
pub async fn sleep_or_stop(cancel: &CancellationToken, delay: std::time::Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_stops_the_others_and_is_named_in_the_error() {
        let cancel = CancellationToken::new();
        let mut tasks = Tasks::new(cancel.clone());
        let waits = cancel.clone();
        tasks.spawn_loop("consumer", async move { waits.cancelled().await });
        tasks.spawn_loop("sweeper", async { panic!("the sweeper's bug") });
        let error = tasks.run_until_stopped().await.unwrap_err();
        assert_eq!(format!("{error:#}"), "the sweeper task failed: panicked: the sweeper's bug");
        assert!(cancel.is_cancelled());
    }

    #[tokio::test]
    async fn a_task_that_returns_before_the_stop_signal_is_an_error_and_after_it_is_not() {
        let cancel = CancellationToken::new();
        let mut tasks = Tasks::new(cancel.clone());
        tasks.spawn_loop("gauges", async {});
        let error = tasks.run_until_stopped().await.unwrap_err();
        assert_eq!(format!("{error:#}"), "the gauges task ended before the stop signal");

        let cancel = CancellationToken::new();
        let mut tasks = Tasks::new(cancel.clone());
        let waits = cancel.clone();
        tasks.spawn_loop("retention", async move { waits.cancelled().await });
        cancel.cancel();
        tasks.run_until_stopped().await.unwrap();
    }
}
