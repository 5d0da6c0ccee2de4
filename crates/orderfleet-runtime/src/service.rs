//! The one way every long-running binary starts and stops.
//!
//! A binary is a [`Service`]: its configuration, read once by [`Service::load`] (a missing or
//! malformed setting is one line naming it, and exit 1, before anything else happens), and
//! [`Service::start`], which builds its parts and hands its tasks to the supervisor
//! ([`Tasks`]). [`main`] does the rest for all four: telemetry, the stop signal, `/healthz` and
//! `/metrics`, running until stopped, and one line saying how it ended — a task that ended
//! early is named, and the process exits 1 so its supervisor (systemd, ECS) starts another.
//!
//! Each binary's `main.rs` is one line: `orderfleet_runtime::service::main::<stock_worker::StockWorker>()`.

use std::process::ExitCode;

use crate::config::{ConfigError, Env, RuntimeConfig};
use crate::tasks::Tasks;

/// A long-running binary: what it reads at start, and what it runs until stopped.
pub trait Service: Sized {
    /// The binary's name, on its log lines and its one-line errors.
    const NAME: &'static str;

    /// The lists of metrics the binary exports beyond the runtime's own
    /// ([`crate::metrics::ALL`]): each crate's `metrics::ALL` it records through.
    const METRICS: &'static [&'static [crate::metrics::Metric]];

    /// Reads the binary's own settings (and the AWS SDK's), so that none fails later. Those
    /// every binary shares ([`RuntimeConfig`]) are read by [`main`].
    fn load(env: &Env) -> impl Future<Output = Result<Self, ConfigError>>;

    /// Builds the binary's parts and spawns its tasks on `tasks`; each must run until
    /// `tasks.stop_signal()` fires. An error here (a port taken, a bad key) stops the binary.
    fn start(self, runtime: &RuntimeConfig, tasks: &mut Tasks) -> impl Future<Output = anyhow::Result<()>>;
}

/// The `main` of every long-running binary.
pub async fn main<S: Service>() -> ExitCode {
    let env = Env::process();
    let loaded = async { Ok::<_, ConfigError>((RuntimeConfig::from_env(&env)?, S::load(&env).await?)) };
    let (runtime, service) = match loaded.await {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("{}: {error}", S::NAME);
            return ExitCode::FAILURE;
        }
    };
    let telemetry = crate::telemetry::init(runtime.log_format, S::NAME);
    crate::ops::describe(&[crate::metrics::ALL]);
    crate::ops::describe(S::METRICS);
    let outcome = run_until_stopped(service, &runtime).await;
    crate::aws::log_operations_called(S::NAME, tracing::Level::INFO);
    let code = match outcome {
        Ok(()) => {
            tracing::info!("{} stopped", S::NAME);
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(
                error = crate::telemetry::error_chain(&error),
                "{} stopped with an error",
                S::NAME
            );
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}

/// Arms the stop signal (SIGTERM, SIGINT), serves `/healthz` and `/metrics` if asked, starts
/// the service, and supervises every task until the signal or the first to end early.
async fn run_until_stopped<S: Service>(service: S, runtime: &RuntimeConfig) -> anyhow::Result<()> {
    let mut tasks = Tasks::new(crate::shutdown::on_signal());
    let metrics = crate::ops::start(runtime.metrics_listen_addr, tasks.stop_signal()).await?;
    if let Some(metrics) = metrics {
        tasks.adopt("metrics", metrics);
    }
    service.start(runtime, &mut tasks).await?;
    tracing::info!("{} running", S::NAME);
    tasks.run_until_stopped().await
}
