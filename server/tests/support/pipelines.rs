//! A worker (REST API and `/metrics`) running a share-group connector and a classic one on
//! known data with known failures, for the metrics and dashboard tests, and a reader of
//! Prometheus' text format.
//!
//! The share connector (`flaky` sink, tenant `acme`) reads `SHARE_RECORDS` JSON records plus
//! one record that is not JSON (rejected, dead-lettered), fails the first delivery of each
//! offset in `FLAKY_ONCE` retriably (released, redelivered, accepted) and every delivery of
//! `FLAKY_ALWAYS` (released at its first delivery; at its second, the last the delivery limit
//! of 2 allows, dead-lettered and rejected rather than released, so the broker archives
//! nothing). `errors.retry.timeout=1` keeps share mode from retrying within the 15 s locks, so
//! each delivery is put once. The classic connector (file sink, tenant `default`) reads
//! `CLASSIC_RECORDS` records.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use spillway::worker_cmd::RunningWorker;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{
    ConfigError, ConfigMap, PutOutcome, SinkConnector, SinkError, SinkRecord, SinkTask,
};
use spillway_tests::{produce, DevBroker, TestRecord};

use super::{worker_config, Client, VaultConnector};

pub const SHARE: &str = "orders-share";
pub const CLASSIC: &str = "orders-classic";
pub const SHARE_TOPIC: &str = "orders-s";
pub const CLASSIC_TOPIC: &str = "orders-c";
pub const DLQ_TOPIC: &str = "orders-dlq";
/// JSON records of the share topic; the record that is not JSON comes after them.
pub const SHARE_RECORDS: i64 = 40;
pub const POISON_OFFSET: i64 = SHARE_RECORDS;
pub const FLAKY_ONCE: [i64; 2] = [5, 17];
pub const FLAKY_ALWAYS: i64 = 29;
pub const CLASSIC_RECORDS: usize = 30;
/// The broker's (and the connector's) share delivery attempt limit.
pub const DELIVERY_LIMIT: i32 = 2;

/// The running pipelines; dropping it stops the worker abruptly (call `stop` to finish).
pub struct Pipelines {
    pub broker: DevBroker,
    pub worker: RunningWorker,
    pub client: Client,
    pub base: String,
    _dir: tempfile::TempDir,
}

impl Pipelines {
    pub async fn stop(self) {
        self.worker.stop().await;
    }
}

/// The built-in sinks, `vault`, and `flaky`.
pub fn registry() -> ConnectorRegistry {
    ConnectorRegistry::builtin()
        .with(&["vault"], || Box::new(VaultConnector::default()))
        .with(&["flaky"], || Box::new(FlakyConnector::default()))
}

/// Produces the data, starts the worker and both connectors.
pub async fn start() -> Pipelines {
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(15_000);
    broker.set_share_max_delivery_attempts(DELIVERY_LIMIT);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(10_000);
    broker.create_topic(SHARE_TOPIC, 1);
    broker.create_topic(CLASSIC_TOPIC, 1);
    broker.create_topic(DLQ_TOPIC, 1);
    // Everything is produced before any share session exists: the dev broker drops every share
    // session of a broker when a connection to it closes, as a producer's does when it ends.
    let mut share_records: Vec<TestRecord> = (0..SHARE_RECORDS)
        .map(|n| TestRecord {
            partition: Some(0),
            value: Some(format!("{{\"n\":{n}}}").into_bytes()),
            ..TestRecord::default()
        })
        .collect();
    share_records.push(TestRecord {
        partition: Some(0),
        value: Some(b"this is not JSON".to_vec()),
        ..TestRecord::default()
    });
    produce(&broker.bootstrap(), SHARE_TOPIC, share_records, "none").await;
    let classic_records = (0..CLASSIC_RECORDS)
        .map(|n| TestRecord {
            partition: Some(0),
            value: Some(format!("line {n}").into_bytes()),
            ..TestRecord::default()
        })
        .collect();
    produce(&broker.bootstrap(), CLASSIC_TOPIC, classic_records, "none").await;

    let dir = tempfile::tempdir().expect("temp dir");
    let worker = RunningWorker::start(
        worker_config(&broker, &dir.path().join("state")),
        registry(),
    )
    .await
    .expect("the worker starts");
    let base = format!("http://{}", worker.address());
    let client = Client::new(&base);
    client
        .wait_for("/health", Duration::from_secs(30), |h| {
            h["status"] == "healthy"
        })
        .await;
    let flaky_once = FLAKY_ONCE.map(|o| o.to_string()).join(",");
    let created = client
        .post(
            "/connectors",
            json!({"name": SHARE, "config": {
                "connector.class": "flaky",
                "spillway.tenant": "acme",
                "topics": SHARE_TOPIC,
                "tasks.max": "1",
                "value.converter": "json",
                "value.converter.schemas.enable": "false",
                "errors.tolerance": "all",
                "errors.deadletterqueue.topic.name": DLQ_TOPIC,
                "consumer.override.group.protocol": "share",
                "group.share.delivery.count.limit": DELIVERY_LIMIT.to_string(),
                "errors.retry.timeout": "1",
                "errors.retry.delay.max.ms": "300",
                "flaky.once": flaky_once,
                "flaky.always": FLAKY_ALWAYS.to_string(),
            }}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let out = dir.path().join("classic.txt");
    let created = client
        .post(
            "/connectors",
            json!({"name": CLASSIC, "config": {
                "connector.class": "FileStreamSink",
                "topics": CLASSIC_TOPIC,
                "tasks.max": "1",
                "value.converter": "string",
                "file": out.display().to_string(),
            }}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    Pipelines {
        broker,
        worker,
        client,
        base,
        _dir: dir,
    }
}

/// `GET /metrics` as text, checking the content type Prometheus expects.
pub async fn scrape(base: &str) -> String {
    let response = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    response.text().await.expect("a body")
}

/// One sample of the text format.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus' text format (the subset the exporter writes: no timestamps).
pub fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("NAME{LABELS} VALUE");
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
        };
        let value = match value {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|e| panic!("value of '{line}': {e}")),
        };
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    samples
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        rest = &after[end..];
    }
    labels
}

/// The value of the one sample named `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
    found.first().map(|s| s.value)
}

/// Fails the first delivery of each offset in `flaky.once` and every delivery of the offsets
/// in `flaky.always`, retriably; accepts everything else.
#[derive(Default)]
pub struct FlakyConnector {
    config: ConfigMap,
}

fn flaky_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                "flaky.once",
                ConfigType::List,
                Importance::Low,
                "Offsets whose first delivery fails.",
            )
            .default(""),
        )
        .define(
            ConfigKey::new(
                "flaky.always",
                ConfigType::List,
                Importance::Low,
                "Offsets that always fail.",
            )
            .default(""),
        )
}

impl SinkConnector for FlakyConnector {
    fn version(&self) -> &str {
        "2.1"
    }

    fn config_def(&self) -> ConfigDef {
        flaky_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        flaky_def().parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(FlakyTask::default())
    }
}

#[derive(Default)]
struct FlakyTask {
    once: BTreeSet<i64>,
    always: BTreeSet<i64>,
}

fn offsets(config: &ConfigMap, key: &str) -> BTreeSet<i64> {
    config
        .get(key)
        .map(|list| {
            list.split(',')
                .filter_map(|o| o.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[async_trait]
impl SinkTask for FlakyTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        self.once = offsets(config, "flaky.once");
        self.always = offsets(config, "flaky.always");
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        Ok(records
            .iter()
            .map(|r| {
                let offset = r.original.offset;
                let first = r.delivery_count.is_none_or(|d| d <= 1);
                if self.always.contains(&offset) || (first && self.once.contains(&offset)) {
                    PutOutcome::Retriable(SinkError::retriable(format!(
                        "injected failure at offset {offset}"
                    )))
                } else {
                    PutOutcome::Ok
                }
            })
            .collect())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
