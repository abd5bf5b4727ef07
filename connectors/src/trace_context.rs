//! W3C trace context (`traceparent`, `tracestate`) in Kafka record headers.
//!
//! The runtime reads a record's context to make its processing part of the producer's trace;
//! the `kafka` sink writes Spillway's own context onto the records it produces, so a trace
//! crosses Spillway end to end. Both go through OpenTelemetry's `TraceContextPropagator`, which
//! validates the header format; a malformed header is simply no context.

use bytes::Bytes;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The W3C header that names the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header of vendor-specific trace data, travelling with `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// Kafka headers as a propagation carrier. Keys may repeat on the wire; the first one counts,
/// as W3C asks receivers to use a single `traceparent`.
struct HeaderCarrier<'a>(&'a mut Vec<(String, Option<Bytes>)>);

struct HeaderReader<'a>(&'a [(String, Option<Bytes>)]);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .and_then(|(_, value)| value.as_deref())
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

impl Injector for HeaderCarrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), Some(Bytes::from(value))));
    }
}

/// The remote span context a record's headers carry, if they hold a valid `traceparent`.
pub fn extract(headers: &[(String, Option<Bytes>)]) -> Option<SpanContext> {
    let context = TraceContextPropagator::new().extract(&HeaderReader(headers));
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| span_context.clone())
}

/// Replaces the record's `traceparent` and `tracestate` with `context`'s span, when that span
/// is a real one; otherwise leaves the headers as they are (tracing is off, so the producer's
/// context passes through untouched). Returns whether the headers were replaced.
pub fn replace(headers: &mut Vec<(String, Option<Bytes>)>, context: &Context) -> bool {
    if !context.span().span_context().is_valid() {
        return false;
    }
    headers.retain(|(name, _)| {
        !name.eq_ignore_ascii_case(TRACEPARENT) && !name.eq_ignore_ascii_case(TRACESTATE)
    });
    TraceContextPropagator::new().inject_context(context, &mut HeaderCarrier(headers));
    true
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, Option<Bytes>)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Some(Bytes::from((*v).to_owned()))))
            .collect()
    }

    fn text(headers: &[(String, Option<Bytes>)], key: &str) -> Vec<String> {
        headers
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| String::from_utf8(v.clone().unwrap_or_default().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_valid_traceparent_becomes_a_remote_span_context() {
        let context = extract(&headers(&[
            ("other", "x"),
            ("traceparent", PARENT),
            ("tracestate", "vendor=1"),
        ]))
        .expect("a context");
        assert_eq!(
            context.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(
            context.span_id(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        );
        assert!(context.is_remote());
        assert!(context.is_sampled());
        assert_eq!(context.trace_state().get("vendor"), Some("1"));
    }

    #[test]
    fn malformed_or_missing_traceparents_are_no_context() {
        assert!(extract(&headers(&[("traceparent", "00-7")])).is_none());
        assert!(extract(&headers(&[(
            "traceparent",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        )]))
        .is_none());
        assert!(extract(&[("traceparent".to_owned(), None)]).is_none());
        assert!(extract(&[]).is_none());
    }

    #[test]
    fn replacing_writes_exactly_one_new_traceparent_and_keeps_other_headers() {
        let span = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("1111111111111111").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::from_key_value([("vendor", "2")]).unwrap(),
        );
        let context = Context::new().with_remote_span_context(span);
        let mut h = headers(&[
            ("traceparent", PARENT),
            ("keep", "me"),
            ("tracestate", "vendor=1"),
        ]);
        assert!(replace(&mut h, &context));
        assert_eq!(
            text(&h, "traceparent"),
            ["00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"]
        );
        assert_eq!(text(&h, "tracestate"), ["vendor=2"]);
        assert_eq!(text(&h, "keep"), ["me"]);
    }

    #[test]
    fn without_a_span_the_producers_context_passes_through() {
        let mut h = headers(&[("traceparent", PARENT)]);
        assert!(!replace(&mut h, &Context::new()));
        assert_eq!(text(&h, "traceparent"), [PARENT]);
    }
}
