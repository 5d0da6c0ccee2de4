//! Structured logs through `tracing`: human-readable text by default, one JSON object per
//! line when `LOG_FORMAT=json` (what log shippers on ECS and EC2 want). `RUST_LOG` filters,
//! with `info` as the default.
//!
//! In JSON, the fields of every span a line is logged in stand at the top level of the line,
//! beside the event's own: a line logged while handling an order carries that order's
//! `trace_id` and `order_id` ([`crate::trace`]) as plain keys a log query can filter on.
//!
//! Spans are exported over OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: off by default, and then nothing of
//! OpenTelemetry runs. The endpoint is plain HTTP (a collector beside the process, such as
//! the ADOT sidecar on ECS); the service name is the binary's unless `OTEL_SERVICE_NAME`
//! says otherwise.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::LogFormat;

/// What must be flushed before the process exits: the span exporter, when there is one.
#[must_use = "call shutdown before exiting, or the last spans are lost"]
pub struct Telemetry {
    exporter: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still buffered (bounded by the exporter's own timeout).
    pub async fn shutdown(self) {
        if let Some(provider) = self.exporter {
            // The exporter's HTTP client blocks: off the async threads.
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// Installs the global subscriber for the binary `service`. Call once, first thing in `main`.
pub fn init(format: LogFormat, service: &str) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Json => {
            let mut json = json_subscriber::JsonLayer::stderr();
            json.with_timer("timestamp", tracing_subscriber::fmt::time::SystemTime)
                .with_level("level")
                .with_target("target")
                .with_flattened_event()
                .with_top_level_flattened_span_list();
            Box::new(json)
        }
        LogFormat::Text => Box::new(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)),
    };
    let (exporter, spans) = match otlp_endpoint_set() {
        true => match span_exporter(service) {
            Ok(provider) => {
                let tracer = provider.tracer(service.to_owned());
                let layer = tracing_opentelemetry::layer().with_tracer(tracer);
                (Some(provider), Some(layer))
            }
            Err(e) => {
                eprintln!("{service}: spans are not exported: {e}");
                (None, None)
            }
        },
        false => (None, None),
    };
    // `try_init` so that tests which build several apps in one process do not panic.
    let _ = tracing_subscriber::registry().with(lines).with(spans).with(filter).try_init();
    Telemetry { exporter }
}

fn otlp_endpoint_set() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()))
}

/// A batching OTLP/HTTP exporter, configured by the `OTEL_*` variables.
fn span_exporter(service: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned());
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(name).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// Logs an error with its whole cause chain, once, where it is handled.
pub(crate) fn error_chain(error: &anyhow::Error) -> String {
    format!("{error:#}")
}
