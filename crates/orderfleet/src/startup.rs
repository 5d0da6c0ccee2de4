//! The `main` of every long-running binary, once: read the configuration (a missing or
//! malformed setting is one line naming it, and exit 1, before anything else happens), set up
//! telemetry, run until stopped, and report how it ended.

use std::process::ExitCode;

use crate::config::{ConfigError, LogFormat};

pub async fn main<C, Fut>(
    name: &'static str,
    config: Result<C, ConfigError>,
    log_format: impl FnOnce(&C) -> LogFormat,
    run: impl FnOnce(C) -> Fut,
) -> ExitCode
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = crate::telemetry::init(log_format(&config), name);
    let outcome = run(config).await;
    crate::aws::log_operations_called(name, tracing::Level::INFO);
    let code = match outcome {
        Ok(()) => {
            tracing::info!("{name} stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(error = crate::telemetry::error_chain(&error), "{name} stopped with an error");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}
