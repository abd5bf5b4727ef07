//! Traces cross Spillway end to end: records produced with a W3C `traceparent` are replicated
//! by a `kafka` sink (share mode and classic mode); the batch stage spans reach an OTLP/HTTP
//! receiver running in this test as children of the producer's span (or, for batches with
//! several producer contexts, as a new trace whose poll span links to them), with their
//! attributes; and every replicated record carries the `traceparent` of an exported `put` span.
//!
//! The tracer provider is process-wide, so this file is its own test binary and sets up
//! telemetry once, in-process, pointed at the receiver.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use actix_web::web::{self, Bytes, Data};
use actix_web::{App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as ProtoValue;
use prost::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use spillway::telemetry::{self, LogFormat, Telemetry, TelemetryConfig, TraceExport};
use spillway_actors::Worker;
use spillway_connectors::ConnectorRegistry;
use spillway_tests::{produce, DevBroker, TestRecord};

const SERVICE: &str = "spillway-trace-test";
const RECORDS: usize = 12;

/// A span as the receiver decoded it; ids in lowercase hex.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    links: BTreeSet<(String, String)>,
    attributes: BTreeMap<String, String>,
}

impl Received {
    fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }

    fn int(&self, key: &str) -> i64 {
        self.attr(key)
            .parse()
            .unwrap_or_else(|_| panic!("{key} of {self:?} is not a number"))
    }
}

fn text(value: Option<&ProtoValue>) -> String {
    match value {
        Some(ProtoValue::StringValue(s)) => s.clone(),
        Some(ProtoValue::IntValue(i)) => i.to_string(),
        Some(ProtoValue::BoolValue(b)) => b.to_string(),
        Some(ProtoValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Spans received so far.
type Collected = Arc<Mutex<Vec<Received>>>;

async fn accept_traces(body: Bytes, collected: Data<Collected>) -> HttpResponse {
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return HttpResponse::BadRequest().body(format!("not an OTLP request: {e}")),
    };
    let mut spans = collected.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                });
            }
        }
    }
    HttpResponse::Ok()
        .content_type("application/x-protobuf")
        .body(ExportTraceServiceResponse::default().encode_to_vec())
}

/// An OTLP/HTTP receiver on a free port, on a thread of its own; returns its traces URL.
fn start_receiver(collected: Collected) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!(
        "http://{}/v1/traces",
        listener.local_addr().expect("address")
    );
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let collected = Data::new(collected);
            HttpServer::new(move || {
                App::new()
                    .app_data(collected.clone())
                    .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                    .route("/v1/traces", web::post().to(accept_traces))
            })
            .workers(1)
            .disable_signals()
            .listen(listener)
            .expect("listens")
            .run()
            .await
            .expect("the receiver runs")
        })
    });
    url
}

struct Setup {
    collected: Collected,
    telemetry: Telemetry,
}

/// The receiver and this process's telemetry, set up once for every test of this binary.
fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let collected = Collected::default();
        let mut export = TraceExport::to(start_receiver(Arc::clone(&collected)));
        export.service_name = SERVICE.to_owned();
        let telemetry = telemetry::init_with_writer(
            TelemetryConfig {
                log_format: LogFormat::Text,
                log_filter: "warn".to_owned(),
                traces: Some(export),
            },
            std::io::stderr,
        )
        .expect("telemetry starts");
        assert!(telemetry.traces_enabled());
        Setup {
            collected,
            telemetry,
        }
    })
}

use spillway_core::config::config_map as config;

/// A traceparent of a sampled producer span.
fn traceparent(trace: &str, span: &str) -> Vec<u8> {
    format!("00-{trace}-{span}-01").into_bytes()
}

fn traced_records(contexts: &[(&str, &str)]) -> Vec<TestRecord> {
    (0..RECORDS)
        .map(|i| {
            let (trace, span) = contexts[i % contexts.len()];
            TestRecord {
                partition: Some(0),
                key: Some(format!("k{i}").into_bytes()),
                value: Some(format!("v{i}").into_bytes()),
                headers: vec![
                    ("traceparent".into(), Some(traceparent(trace, span))),
                    ("tracestate".into(), Some(b"vendor=test".to_vec())),
                ],
                timestamp: None,
            }
        })
        .collect()
}

/// Reads `topic` from the start: each record's (traceparent, tracestate).
fn replicated_contexts(bootstrap: &str, topic: &str) -> Vec<(String, Option<String>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("reader");
    consumer.subscribe(&[topic]).expect("subscribes");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < RECORDS && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let header = |name: &str| {
                m.headers().and_then(|hs| {
                    hs.iter()
                        .filter(|h| h.key == name)
                        .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                        .collect::<Vec<_>>()
                        .into_iter()
                        .reduce(|a, b| format!("{a}|{b}"))
                })
            };
            out.push((
                header("traceparent").unwrap_or_default(),
                header("tracestate"),
            ));
        }
    }
    assert_eq!(out.len(), RECORDS, "every record replicated to {topic}");
    out
}

/// The spans of `connector`, once every stage has been exported for all its records.
async fn stage_spans(setup: &Setup, connector: &str) -> Vec<Received> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        setup.telemetry.flush().expect("flush");
        let spans: Vec<Received> = setup
            .collected
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.attr("connector") == connector)
            .cloned()
            .collect();
        let complete = ["poll", "convert", "put", "ack", "commit"]
            .iter()
            .all(|stage| {
                spans
                    .iter()
                    .filter(|s| s.name == *stage)
                    .map(|s| s.int("record.count"))
                    .sum::<i64>()
                    >= RECORDS as i64
            });
        if complete {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "not every stage of {connector} was exported: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker on `broker` that polls every 100 ms.
fn start_worker(broker: &DevBroker) -> Worker {
    Worker::start(
        config(&[
            ("bootstrap.servers", &broker.bootstrap()),
            ("task.poll.timeout.ms", "100"),
        ]),
        ConnectorRegistry::builtin(),
    )
    .expect("worker starts")
}

const TRACE_A: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_A: &str = "00f067aa0ba902b7";
const TRACE_B: &str = "0af7651916cd43dd8448eb211c80319c";
const SPAN_B: &str = "b7ad6b7169203331";
const TRACE_C: &str = "5b8efff798038103d269b633813fc60c";
const SPAN_C: &str = "eee19b7ec3c1b174";

/// Replicates two topics with two connectors in `mode` and checks spans and output records:
/// `single` holds records of one producer span (every stage span is its child), `mixed`
/// alternates two producer spans (a batch holding both is a new trace linking to them).
async fn traces_cross_spillway(mode: Option<&str>, prefix: &str) {
    let setup = setup();
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    let single = format!("{prefix}-single");
    let mixed = format!("{prefix}-mixed");
    for topic in [&single, &mixed] {
        broker.create_topic(topic, 1);
        broker.create_topic(&format!("{topic}.out"), 1);
    }
    produce(
        &broker.bootstrap(),
        &single,
        traced_records(&[(TRACE_A, SPAN_A)]),
        "none",
    )
    .await;
    produce(
        &broker.bootstrap(),
        &mixed,
        traced_records(&[(TRACE_B, SPAN_B), (TRACE_C, SPAN_C)]),
        "none",
    )
    .await;
    let worker = start_worker(&broker);
    for topic in [&single, &mixed] {
        let mut c = config(&[
            ("name", topic),
            ("connector.class", "kafka"),
            ("topics", topic),
            ("tasks.max", "1"),
            ("topic.rename.format", "${topic}.out"),
        ]);
        if let Some(protocol) = mode {
            c.insert("consumer.override.group.protocol".into(), protocol.into());
        }
        worker.start_connector(c).await.expect("connector starts");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while [&single, &mixed].iter().any(|c| {
        worker
            .status(c)
            .is_none_or(|s| s.totals().accepted < RECORDS as u64)
    }) {
        assert!(Instant::now() < deadline, "records not replicated in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await;

    // One producer context: every stage span is its child, in its trace.
    let spans = stage_spans(setup, &single).await;
    for span in &spans {
        assert_eq!(span.service, SERVICE);
        assert_eq!(
            (span.trace_id.as_str(), span.parent_span_id.as_str()),
            (TRACE_A, SPAN_A),
            "{span:?}"
        );
        assert!(span.links.is_empty(), "{span:?}");
        assert_eq!(span.attr("tenant"), "default");
        assert_eq!(span.attr("task"), "0");
        assert_eq!(span.attr("topic"), single);
        assert_eq!(span.attr("partition"), "0");
        assert!(
            span.int("offset.first") <= span.int("offset.last"),
            "{span:?}"
        );
        assert_eq!(
            span.int("offset.last") - span.int("offset.first") + 1,
            span.int("record.count"),
            "{span:?}"
        );
        assert_eq!(
            span.attr("offset.ranges"),
            format!(
                "{single}-0:{}..{}",
                span.attr("offset.first"),
                span.attr("offset.last")
            )
        );
    }
    let puts: BTreeSet<(String, String)> = spans
        .iter()
        .filter(|s| s.name == "put")
        .map(|s| (s.trace_id.clone(), s.span_id.clone()))
        .collect();
    for (parent, state) in replicated_contexts(&broker.bootstrap(), &format!("{single}.out")) {
        let parts: Vec<&str> = parent.split('-').collect();
        assert_eq!(parts.len(), 4, "one valid traceparent: {parent}");
        assert_eq!(
            parts[1], TRACE_A,
            "the output stays in the producer's trace"
        );
        assert!(
            puts.contains(&(parts[1].to_owned(), parts[2].to_owned())),
            "{parent} names an exported put span of {puts:?}"
        );
        assert_eq!(
            state.as_deref(),
            Some("vendor=test"),
            "tracestate travels on"
        );
    }

    // Two producer contexts: a batch holding both is a new trace whose poll span links to
    // them, the other stage spans being the poll's children; a batch of one record is a child
    // of its producer.
    let producers: BTreeSet<(String, String)> = [(TRACE_B, SPAN_B), (TRACE_C, SPAN_C)]
        .iter()
        .map(|(t, s)| ((*t).to_owned(), (*s).to_owned()))
        .collect();
    let spans = stage_spans(setup, &mixed).await;
    let linking_polls: BTreeSet<(String, String)> = spans
        .iter()
        .filter(|s| !s.links.is_empty())
        .map(|s| (s.trace_id.clone(), s.span_id.clone()))
        .collect();
    assert!(
        !linking_polls.is_empty(),
        "a batch of several records links: {spans:#?}"
    );
    let mut poll_children = 0;
    for span in &spans {
        if !span.links.is_empty() {
            assert_eq!(span.name, "poll", "{span:?}");
            assert_eq!(span.links, producers, "{span:?}");
            assert_eq!(span.parent_span_id, "", "a new trace: {span:?}");
            assert_eq!(span.attr("producer.contexts"), "2");
        } else if producers.contains(&(span.trace_id.clone(), span.parent_span_id.clone())) {
            assert_eq!(span.int("record.count"), 1, "{span:?}");
        } else {
            assert!(
                linking_polls.contains(&(span.trace_id.clone(), span.parent_span_id.clone())),
                "a child of its batch's poll span: {span:?}"
            );
            poll_children += 1;
        }
    }
    assert!(poll_children >= 4, "{spans:#?}");
    let puts: BTreeSet<(String, String)> = spans
        .iter()
        .filter(|s| s.name == "put")
        .map(|s| (s.trace_id.clone(), s.span_id.clone()))
        .collect();
    for (parent, _) in replicated_contexts(&broker.bootstrap(), &format!("{mixed}.out")) {
        let parts: Vec<&str> = parent.split('-').collect();
        assert_eq!(parts.len(), 4, "one valid traceparent: {parent}");
        assert!(
            puts.contains(&(parts[1].to_owned(), parts[2].to_owned())),
            "{parent} names an exported put span of {puts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_cross_spillway_in_share_mode() {
    traces_cross_spillway(Some("share"), "share").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_cross_spillway_in_classic_mode() {
    traces_cross_spillway(None, "classic").await;
}

/// A file sink reads no header, so a classic-mode task of it leaves headers unread, except
/// while stage spans are recorded: their parents are the producers' contexts, read from the
/// records' `traceparent` headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_reads_no_header_still_continues_the_producers_trace() {
    let setup = setup();
    let broker = DevBroker::start(1);
    let topic = "file-traced";
    broker.create_topic(topic, 1);
    produce(
        &broker.bootstrap(),
        topic,
        traced_records(&[(TRACE_A, SPAN_A)]),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("out.txt");
    let worker = start_worker(&broker);
    worker
        .start_connector(config(&[
            ("name", topic),
            ("connector.class", "FileStreamSink"),
            ("topics", topic),
            ("tasks.max", "1"),
            ("file", &file.to_string_lossy()),
            ("value.converter", "string"),
            ("consumer.override.auto.offset.reset", "earliest"),
        ]))
        .await
        .expect("connector starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker
        .status(topic)
        .is_none_or(|s| s.totals().accepted < RECORDS as u64)
    {
        assert!(Instant::now() < deadline, "records not written in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await;
    let spans = stage_spans(setup, topic).await;
    for span in &spans {
        assert_eq!(
            (span.trace_id.as_str(), span.parent_span_id.as_str()),
            (TRACE_A, SPAN_A),
            "every stage span is a child of the producer's span: {span:?}"
        );
    }
}

/// The `spillway` command reads the `OTEL_*` variables and flushes its spans when it ends: with
/// the batch exporter's schedule far beyond the demo's run time, only the flush on shutdown can
/// deliver them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exports_its_spans_over_otlp_before_it_exits() {
    let collected = Collected::default();
    let url = start_receiver(Arc::clone(&collected));
    let base = url.trim_end_matches("/v1/traces").to_owned();
    let dir = tempfile::tempdir().expect("temp dir");
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["--log-format", "json", "demo"])
        .args([
            "--records",
            "200",
            "--partitions",
            "2",
            "--share-tasks",
            "1",
        ])
        .arg("--output-dir")
        .arg(dir.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &base)
        .env("OTEL_SERVICE_NAME", "spillway-demo-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OTEL_SDK_DISABLED")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .expect("the demo runs");
    assert!(status.success(), "the demo failed: {status}");
    let spans = collected.lock().unwrap().clone();
    for connector in ["orders-share", "orders-classic"] {
        for stage in ["poll", "convert", "put", "ack", "commit"] {
            let records: i64 = spans
                .iter()
                .filter(|s| s.attr("connector") == connector && s.name == stage)
                .map(|s| s.int("record.count"))
                .sum();
            assert!(
                records >= 200,
                "{connector} {stage}: spans for {records} of 200 records"
            );
        }
    }
    assert!(spans.iter().all(|s| s.service == "spillway-demo-test"));
}
