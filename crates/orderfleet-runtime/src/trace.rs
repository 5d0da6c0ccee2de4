//! Trace context, end to end: one trace per order request, carried as a W3C `traceparent`.
//!
//! The intake starts a trace for each order request (or continues the caller's, when the
//! request carries a valid `traceparent` header) and stores it on the order and on every
//! outbox row the order causes, in the same statements. The relay sends it as the SQS message
//! attribute `traceparent`; each worker reads it back, works on the message inside a span
//! that carries `trace_id` and `order_id`, and the notification worker passes it on as an SNS
//! message attribute. So every log line about an order, in every process, carries its
//! `trace_id` and `order_id` ([`crate::telemetry`] lifts span fields to the top of each JSON
//! line), and one `trace_id` finds an order's whole path through the fleet.
//!
//! Every message an order causes carries the order's own context, so exported spans hang off
//! the intake's request span; a worker's span is never the parent of another worker's. That
//! keeps the context where the order is (a message redriven, retried by an operator or
//! recovered by the sweeper keeps it) at the cost of a flatter tree.
//!
//! Parsing and formatting are the OpenTelemetry SDK's (`TraceContextPropagator`): an invalid
//! header, an all-zero id or an unknown version's malformed fields are ignored, as the W3C
//! recommendation says, and a new trace starts.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header, the SQS and the SNS message attribute that carry the context.
pub const TRACEPARENT: &str = "traceparent";

/// A trace context: the trace and the span that is the parent of what follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace(SpanContext);

impl Trace {
    /// A `traceparent` value, when it is valid.
    pub fn parse(traceparent: &str) -> Option<Self> {
        let traceparent = traceparent.trim();
        // The propagator reads the ids as numbers, so it would take a 31-digit trace id; the
        // recommendation wants exactly 2-32-16-2 hex digits (a later version may add fields).
        let lengths: Vec<usize> = traceparent.split('-').map(str::len).collect();
        if lengths.len() < 4 || lengths[..4] != [2, 32, 16, 2] {
            return None;
        }
        let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
        let context = TraceContextPropagator::new().extract(&carrier);
        let span = context.span().span_context().clone();
        span.is_valid().then_some(Self(span))
    }

    /// A new trace, with random ids.
    pub fn random() -> Self {
        let trace_id = TraceId::from(rand::random::<u128>().max(1));
        Self::of(trace_id)
    }

    /// A new span of `trace_id` (random span id), sampled.
    fn of(trace_id: TraceId) -> Self {
        let span_id = SpanId::from(rand::random::<u64>().max(1));
        // Remote: a context handed on to another process, like a parsed one.
        Self(SpanContext::new(trace_id, span_id, TraceFlags::SAMPLED, true, TraceState::default()))
    }

    /// The trace id, 32 lowercase hex digits: what log lines carry.
    pub fn trace_id(&self) -> String {
        self.0.trace_id().to_string()
    }

    /// The W3C `traceparent` value.
    pub fn traceparent(&self) -> String {
        let mut carrier = HashMap::new();
        let context = opentelemetry::Context::new().with_remote_span_context(self.0.clone());
        TraceContextPropagator::new().inject_context(&context, &mut carrier);
        carrier.remove(TRACEPARENT).expect("a valid span context is always injected")
    }

    /// Makes `span` a child of this context in exported traces (nothing when spans are not
    /// exported), and records the trace id on it.
    pub fn enter(&self, span: &tracing::Span) {
        let parent = opentelemetry::Context::new().with_remote_span_context(self.0.clone());
        // Fails only when no exporter is installed, or the span is disabled: nothing to parent.
        let _ = span.set_parent(parent);
        span.record("trace_id", tracing::field::display(self.0.trace_id()));
    }

    /// The context of what `span` causes: `span` itself when spans are exported, so the trace
    /// tree shows it; otherwise a new span id of this trace.
    fn child_of(&self, span: &tracing::Span) -> Self {
        let exported = span.context().span().span_context().clone();
        if exported.is_valid() && exported.trace_id() == self.0.trace_id() {
            Self(exported)
        } else {
            Self::of(self.0.trace_id())
        }
    }

    /// Starts the trace of a request: the caller's, when it sent a valid `traceparent`; else a
    /// new one, whose ids are the exported span's when spans are exported. Records the trace
    /// id on `span`, and returns the context to store with what the request causes.
    pub fn start(traceparent: Option<&str>, span: &tracing::Span) -> Self {
        let caller = traceparent.and_then(Self::parse);
        let trace = match caller {
            Some(caller) => {
                caller.enter(span);
                caller
            }
            None => {
                let exported = span.context().span().span_context().clone();
                let trace = if exported.is_valid() { Self(exported) } else { Self::random() };
                span.record("trace_id", tracing::field::display(trace.0.trace_id()));
                trace
            }
        };
        trace.child_of(span)
    }
}

/// Whose trace a request joins, when it carries a `traceparent` (`INTAKE_CALLER_TRACE`).
///
/// A client on the internet can send any context, its sampled flag included: trusting it lets
/// a stranger choose the ids our traces are filed under and how many of them are kept. So by
/// default ([`CallerTrace::Link`]) the intake starts its own trace at the edge and keeps the
/// caller's id as a link: on the span (exported spans carry it as an OpenTelemetry link) and
/// as `caller_trace_id` on the request's log lines. [`CallerTrace::Continue`] is for an intake
/// whose callers are the operator's own services, behind a gateway that sets the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallerTrace {
    /// Start a trace of ours and link the caller's to it (the default).
    #[default]
    Link,
    /// Join the caller's trace.
    Continue,
}

impl crate::config::Setting for CallerTrace {
    fn parse_setting(s: &str) -> Result<Self, String> {
        match s {
            "link" => Ok(Self::Link),
            "continue" => Ok(Self::Continue),
            other => Err(format!("must be `link` or `continue`, not {other:?}")),
        }
    }
}

impl Trace {
    /// [`Trace::start`] at the edge, where `policy` decides what a caller's context may do.
    /// The span needs a `caller_trace_id` field.
    pub fn start_at_edge(traceparent: Option<&str>, policy: CallerTrace, span: &tracing::Span) -> Self {
        match (policy, traceparent.and_then(Self::parse)) {
            (CallerTrace::Continue, _) | (CallerTrace::Link, None) => Self::start(traceparent, span),
            (CallerTrace::Link, Some(caller)) => {
                span.add_link(caller.0.clone());
                span.record("caller_trace_id", tracing::field::display(caller.0.trace_id()));
                Self::start(None, span)
            }
        }
    }
}

/// The span of work on one order outside a request or a message (the sweeper's): its
/// `order_id`, and its `trace_id` when the order has a trace context. An error-level span, so
/// that it stays on whatever `RUST_LOG` keeps: the warnings and errors need it most.
pub fn order_span(order_id: impl std::fmt::Display, traceparent: Option<&str>) -> tracing::Span {
    let span = tracing::error_span!("order", trace_id = tracing::field::Empty, order_id = %order_id);
    follow(&span, traceparent);
    span
}

/// Puts `span` in the trace `traceparent` names ([`Trace::enter`]); nothing when it names none
/// (a row or message from before traces, or an invalid value).
pub fn follow(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(trace) = traceparent.and_then(Trace::parse) {
        trace.enter(span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips() {
        let raw = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace = Trace::parse(raw).expect("valid");
        assert_eq!(trace.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.traceparent(), raw);
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for raw in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(Trace::parse(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_takes_a_new_span() {
        let trace = Trace::random();
        let child = trace.child_of(&tracing::Span::none());
        assert_eq!(child.trace_id(), trace.trace_id());
        assert_ne!(child.traceparent(), trace.traceparent());
        assert_eq!(Trace::parse(&child.traceparent()), Some(child));
    }

    #[test]
    fn a_request_without_a_traceparent_starts_a_new_trace_and_one_with_continues_it() {
        let span = tracing::Span::none();
        let (a, b) = (Trace::start(None, &span), Trace::start(None, &span));
        assert_ne!(a.trace_id(), b.trace_id());
        let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let continued = Trace::start(Some(caller), &span);
        assert_eq!(continued.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(continued.traceparent(), caller, "a span of its own");
        assert_ne!(Trace::start(Some("bogus"), &span).trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
}
