//! A task's telemetry: the log context of its thread, and the spans of its batches' stages
//! (poll, convert, put, ack, commit) with how they join the traces of the records' producers.
//!
//! - Logs: each task runs on a thread of its own, which runs inside the task's `task` span
//!   (`tenant`, `connector`, `task` fields) for its whole life, so every line the task emits
//!   carries them.
//! - Traces: one span per stage per batch. Attributes: `tenant`, `connector`, `task`, `batch.seq`,
//!   `record.count`, `partitions` and `offset.ranges` (every topic-partition of the batch and
//!   its first..last offset); when the batch holds one topic-partition also `topic`,
//!   `partition`, `offset.first` and `offset.last`, and `topic` when it holds one topic.
//! - The trace rule: the distinct producer span contexts (W3C `traceparent` headers) of the
//!   batch's records decide where the spans hang. Exactly one: every stage span is a child of
//!   the producer's span, in its trace. None: the batch's `poll` span starts a new trace and
//!   the other stage spans are its children. Several: the same, and the `poll` span links to
//!   every producer span (at most [`MAX_LINKS`]). So a batch is always one trace.
//! - `poll` is exported only for polls that returned records (an idle task polls several
//!   times a second); it starts when that poll call started. The others are `tracing` spans,
//!   so log lines emitted while they are entered belong to them.
//!
//! Nothing is computed when no subscriber wants the spans (tracing off).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::trace::{Link, Span as _, SpanContext, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use spillway_connectors::trace_context;
use spillway_core::RawRecord;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the stage spans (and only of them): a telemetry layer selects them
/// by it, and `/admin/loggers` can show them in the logs at DEBUG.
pub const TARGET: &str = "spillway_actors::stage";

/// Instrumentation scope of the spans Spillway creates with the OpenTelemetry API directly.
pub const TRACER_NAME: &str = "spillway";

/// Most links one stage span gets (OpenTelemetry's default span limit).
pub const MAX_LINKS: usize = 128;

/// The tenant of connectors whose configuration does not name one (see
/// `runtime_keys::TENANT`).
pub const DEFAULT_TENANT: &str = "default";

/// Whose batches these are: what every stage span and every log line of a task carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskIdentity {
    pub tenant: String,
    pub connector: String,
    pub task: u32,
}

impl TaskIdentity {
    /// The span a task's actors run in, so every log line emitted by the task (its actors,
    /// its consumer, its sink) names the tenant, connector and task.
    /// At ERROR level so that it is on whenever any log line is: a task's warnings keep their
    /// context when the levels are set to WARN or ERROR.
    pub fn log_span(&self) -> Span {
        tracing::error_span!(
            "task",
            tenant = %self.tenant,
            connector = %self.connector,
            task = self.task
        )
    }
}

/// A stage of a batch's way through a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchStage {
    Poll,
    Convert,
    Put,
    Ack,
    Commit,
}

impl BatchStage {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStage::Poll => "poll",
            BatchStage::Convert => "convert",
            BatchStage::Put => "put",
            BatchStage::Ack => "ack",
            BatchStage::Commit => "commit",
        }
    }
}

/// The offsets of one topic-partition in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartitionRange {
    topic: String,
    partition: i32,
    first: i64,
    last: i64,
}

#[derive(Debug)]
struct BatchInfo {
    identity: Arc<TaskIdentity>,
    seq: u64,
    count: usize,
    ranges: Vec<PartitionRange>,
    /// Distinct producer span contexts, in the order first seen.
    producers: Vec<SpanContext>,
    /// The `poll` span, parent of the other stage spans when the batch does not have exactly
    /// one producer context.
    poll: Option<SpanContext>,
}

/// What a batch's stage spans say and where they hang; travels with the batch through the
/// task's actors. Empty (and free) when tracing is off.
#[derive(Debug, Clone, Default)]
pub struct BatchTrace {
    info: Option<Arc<BatchInfo>>,
}

/// True when some subscriber records stage spans.
pub(crate) fn stage_spans_wanted() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

impl BatchTrace {
    /// Reads the batch's offsets and its records' trace contexts, and exports its `poll` span:
    /// from `poll_started` (when the poll call that returned the batch began) to now.
    pub fn new(
        identity: &Arc<TaskIdentity>,
        seq: u64,
        records: &[RawRecord],
        poll_started: SystemTime,
    ) -> BatchTrace {
        if records.is_empty() || !stage_spans_wanted() {
            return BatchTrace::default();
        }
        let mut ranges: BTreeMap<(&str, i32), (i64, i64)> = BTreeMap::new();
        let mut producers: Vec<SpanContext> = Vec::new();
        for record in records {
            let range = ranges
                .entry((record.topic.as_str(), record.partition))
                .or_insert((record.offset, record.offset));
            range.0 = range.0.min(record.offset);
            range.1 = range.1.max(record.offset);
            if let Some(producer) = trace_context::extract(&record.headers) {
                let known = producers.iter().any(|p| {
                    p.trace_id() == producer.trace_id() && p.span_id() == producer.span_id()
                });
                if !known {
                    producers.push(producer);
                }
            }
        }
        let mut info = BatchInfo {
            identity: Arc::clone(identity),
            seq,
            count: records.len(),
            ranges: ranges
                .into_iter()
                .map(|((topic, partition), (first, last))| PartitionRange {
                    topic: topic.to_owned(),
                    partition,
                    first,
                    last,
                })
                .collect(),
            producers,
            poll: None,
        };
        let poll = info.record_poll(poll_started);
        if info.producers.len() != 1 && poll.is_valid() {
            info.poll = Some(poll);
        }
        BatchTrace {
            info: Some(Arc::new(info)),
        }
    }

    /// The span of `stage` for this batch, parented or linked by the trace rule; disabled when
    /// tracing is off. Enter it (or `instrument` a future with it) for the stage's work.
    pub fn span(&self, stage: BatchStage) -> Span {
        let Some(info) = &self.info else {
            return Span::none();
        };
        let span = match stage {
            BatchStage::Poll => {
                tracing::debug_span!(target: TARGET, "poll", batch.seq = info.seq as i64, otel.kind = "consumer")
            }
            BatchStage::Convert => {
                tracing::debug_span!(target: TARGET, "convert", batch.seq = info.seq as i64)
            }
            BatchStage::Put => {
                tracing::debug_span!(target: TARGET, "put", batch.seq = info.seq as i64)
            }
            BatchStage::Ack => {
                tracing::debug_span!(target: TARGET, "ack", batch.seq = info.seq as i64)
            }
            BatchStage::Commit => {
                tracing::debug_span!(target: TARGET, "commit", batch.seq = info.seq as i64)
            }
        };
        if span.is_disabled() {
            return span;
        }
        // Without a layer that exports spans these calls do nothing.
        let parent = match &info.poll {
            Some(poll) => Context::new().with_remote_span_context(poll.clone()),
            None => info.parent(),
        };
        let _ = span.set_parent(parent);
        for attribute in info.attributes() {
            span.set_attribute(attribute.key, attribute.value);
        }
        span
    }
}

impl BatchInfo {
    /// Exports the `poll` span through the global tracer provider (which must be the one the
    /// `tracing` layer exports with) and returns its context (invalid when none is installed). Created through the OpenTelemetry API because a `tracing` span cannot
    /// start in the past, and a poll is only known to matter once it returned records.
    fn record_poll(&self, started: SystemTime) -> SpanContext {
        let tracer = opentelemetry::global::tracer(TRACER_NAME);
        let mut attributes = self.attributes();
        attributes.push(KeyValue::new("batch.seq", self.seq as i64));
        let mut span = tracer
            .span_builder(BatchStage::Poll.as_str())
            .with_kind(SpanKind::Consumer)
            .with_start_time(started)
            .with_attributes(attributes)
            .with_links(self.links())
            .start_with_context(&tracer, &self.parent());
        let context = span.span_context().clone();
        span.end();
        context
    }

    /// A child of the one producer span, or a new trace.
    fn parent(&self) -> Context {
        match self.producers.as_slice() {
            [one] => Context::new().with_remote_span_context(one.clone()),
            _ => Context::new(),
        }
    }

    /// A link to each producer span when there are several.
    fn links(&self) -> Vec<Link> {
        if self.producers.len() < 2 {
            return Vec::new();
        }
        self.producers
            .iter()
            .take(MAX_LINKS)
            .map(|p| Link::with_context(p.clone()))
            .collect()
    }

    fn attributes(&self) -> Vec<KeyValue> {
        let id = &self.identity;
        let mut attributes = vec![
            KeyValue::new("tenant", id.tenant.clone()),
            KeyValue::new("connector", id.connector.clone()),
            KeyValue::new("task", i64::from(id.task)),
            KeyValue::new("record.count", self.count as i64),
            KeyValue::new(
                "partitions",
                join(
                    self.ranges
                        .iter()
                        .map(|r| format!("{}-{}", r.topic, r.partition)),
                ),
            ),
            KeyValue::new(
                "offset.ranges",
                join(
                    self.ranges
                        .iter()
                        .map(|r| format!("{}-{}:{}..{}", r.topic, r.partition, r.first, r.last)),
                ),
            ),
        ];
        if self.producers.len() > 1 {
            attributes.push(KeyValue::new(
                "producer.contexts",
                self.producers.len() as i64,
            ));
        }
        if let [only] = self.ranges.as_slice() {
            attributes.extend([
                KeyValue::new("partition", i64::from(only.partition)),
                KeyValue::new("offset.first", only.first),
                KeyValue::new("offset.last", only.last),
            ]);
        }
        if let Some(first) = self.ranges.first() {
            if self.ranges.iter().all(|r| r.topic == first.topic) {
                attributes.push(KeyValue::new("topic", first.topic.clone()));
            }
        }
        attributes
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use bytes::Bytes;
    use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    const TRACE_A: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const TRACE_B: &str = "0af7651916cd43dd8448eb211c80319c";
    const STAGES: [BatchStage; 4] = [
        BatchStage::Convert,
        BatchStage::Put,
        BatchStage::Ack,
        BatchStage::Commit,
    ];

    fn record(topic: &str, partition: i32, offset: i64, traceparent: Option<String>) -> RawRecord {
        let mut r = RawRecord::new(topic, partition, offset);
        if let Some(t) = traceparent {
            r.headers
                .push(("traceparent".into(), Some(Bytes::from(t.into_bytes()))));
        }
        r
    }

    fn parent(trace: &str, span: &str) -> Option<String> {
        Some(format!("00-{trace}-{span}-01"))
    }

    /// The process-wide provider the `poll` spans go to, and what it exported.
    fn exported() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
        static PROVIDER: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
        PROVIDER.get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            opentelemetry::global::set_tracer_provider(provider.clone());
            (provider, exporter)
        })
    }

    /// Polls a batch of `records` for `connector` and runs `stages` over it with an exporting
    /// subscriber; returns the spans of that connector, `poll` first.
    fn spans_of(connector: &str, records: &[RawRecord], stages: &[BatchStage]) -> Vec<SpanData> {
        let (provider, exporter) = exported();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer(TRACER_NAME)));
        let identity = Arc::new(TaskIdentity {
            tenant: "acme".into(),
            connector: connector.into(),
            task: 3,
        });
        tracing::subscriber::with_default(subscriber, || {
            let trace = BatchTrace::new(&identity, 7, records, SystemTime::now());
            for stage in stages {
                let span = trace.span(*stage);
                let _entered = span.enter();
            }
        });
        exporter
            .get_finished_spans()
            .expect("spans")
            .into_iter()
            .filter(|s| attribute(s, "connector") == Some(connector.to_owned().into()))
            .collect()
    }

    fn attribute(span: &SpanData, key: &str) -> Option<opentelemetry::Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    }

    #[test]
    fn with_one_producer_context_every_stage_is_its_child() {
        let records = [
            record("orders", 1, 10, parent(TRACE_A, "00f067aa0ba902b7")),
            record("orders", 1, 11, parent(TRACE_A, "00f067aa0ba902b7")),
            record("orders", 1, 12, None),
        ];
        let spans = spans_of("single", &records, &STAGES);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["poll", "convert", "put", "ack", "commit"]);
        for span in &spans {
            assert_eq!(
                span.span_context.trace_id(),
                TraceId::from_hex(TRACE_A).unwrap()
            );
            assert_eq!(
                span.parent_span_id,
                SpanId::from_hex("00f067aa0ba902b7").unwrap()
            );
            assert!(span.links.is_empty());
            assert_eq!(attribute(span, "tenant"), Some("acme".into()));
            assert_eq!(attribute(span, "connector"), Some("single".into()));
            assert_eq!(attribute(span, "task"), Some(3i64.into()));
            assert_eq!(attribute(span, "topic"), Some("orders".into()));
            assert_eq!(attribute(span, "partition"), Some(1i64.into()));
            assert_eq!(attribute(span, "offset.first"), Some(10i64.into()));
            assert_eq!(attribute(span, "offset.last"), Some(12i64.into()));
            assert_eq!(attribute(span, "record.count"), Some(3i64.into()));
            assert_eq!(attribute(span, "batch.seq"), Some(7i64.into()));
        }
    }

    #[test]
    fn with_several_producer_contexts_the_batch_is_a_new_trace_whose_poll_links_them_all() {
        let records = [
            record("orders", 0, 5, parent(TRACE_A, "00f067aa0ba902b7")),
            record("orders", 2, 8, parent(TRACE_B, "b7ad6b7169203331")),
            record("orders", 2, 9, parent(TRACE_A, "00f067aa0ba902b7")),
            record("refunds", 0, 1, None),
        ];
        let spans = spans_of("several", &records, &STAGES);
        let [poll, stages @ ..] = spans.as_slice() else {
            panic!("spans: {spans:?}")
        };
        assert_eq!(poll.name, "poll");
        assert_eq!(poll.parent_span_id, SpanId::INVALID, "a new trace");
        let trace = poll.span_context.trace_id();
        assert!(
            trace != TraceId::from_hex(TRACE_A).unwrap()
                && trace != TraceId::from_hex(TRACE_B).unwrap()
        );
        assert_eq!(stages.len(), 4);
        for stage in stages {
            assert_eq!(stage.span_context.trace_id(), trace, "one trace per batch");
            assert_eq!(stage.parent_span_id, poll.span_context.span_id());
            assert!(stage.links.is_empty(), "the poll span holds the links");
        }
        let put = &stages[1];
        let linked: Vec<(TraceId, SpanId)> = poll
            .links
            .iter()
            .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
            .collect();
        assert_eq!(
            linked,
            [
                (
                    TraceId::from_hex(TRACE_A).unwrap(),
                    SpanId::from_hex("00f067aa0ba902b7").unwrap()
                ),
                (
                    TraceId::from_hex(TRACE_B).unwrap(),
                    SpanId::from_hex("b7ad6b7169203331").unwrap()
                )
            ]
        );
        assert_eq!(
            attribute(put, "partitions"),
            Some("orders-0,orders-2,refunds-0".into())
        );
        assert_eq!(
            attribute(put, "offset.ranges"),
            Some("orders-0:5..5,orders-2:8..9,refunds-0:1..1".into())
        );
        assert_eq!(attribute(put, "producer.contexts"), Some(2i64.into()));
        assert_eq!(attribute(put, "partition"), None, "several partitions");
        assert_eq!(attribute(put, "topic"), None, "several topics");
    }

    #[test]
    fn without_producer_contexts_each_batch_starts_its_own_trace() {
        let records = [record("orders", 0, 1, None), record("orders", 0, 2, None)];
        let spans = spans_of("none", &records, &STAGES);
        let [poll, stages @ ..] = spans.as_slice() else {
            panic!("spans: {spans:?}")
        };
        assert_eq!(poll.parent_span_id, SpanId::INVALID);
        assert!(poll.links.is_empty());
        assert_eq!(stages.len(), 4);
        for stage in stages {
            assert_eq!(stage.span_context.trace_id(), poll.span_context.trace_id());
            assert_eq!(stage.parent_span_id, poll.span_context.span_id());
        }
    }

    #[test]
    fn without_a_subscriber_nothing_is_computed() {
        let identity = Arc::new(TaskIdentity {
            tenant: "acme".into(),
            connector: "off".into(),
            task: 0,
        });
        let trace = BatchTrace::new(&identity, 1, &[record("t", 0, 0, None)], SystemTime::now());
        assert!(trace.info.is_none());
        assert!(trace.span(BatchStage::Put).is_disabled());
    }
}
