//! Structured logs through `tracing`: human-readable text by default, one JSON object per
//! line when `LOG_FORMAT=json` (what log shippers on ECS and EC2 want). `RUST_LOG` filters,
//! with `info` as the default.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // `try_init` so that tests which build several apps in one process do not panic.
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Logs an error with its whole cause chain, once, where it is handled.
pub fn error_chain(error: &anyhow::Error) -> String {
    format!("{error:#}")
}
