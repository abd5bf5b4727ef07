//! Shared by the `runtime_*` integration tests: a dev broker set up for share groups, a worker,
//! and a probe sink that records which task received which record.

#![allow(dead_code)] // Each test file uses a different part of this module.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use spillway_actors::Worker;
use spillway_connectors::runtime_keys::TASK_ID;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{
    Assignment, ConfigError, ConfigMap, PutOutcome, SinkConnector, SinkError, SinkRecord, SinkTask,
};
use spillway_tests::{DevBroker, Produced};

/// A dev broker with share groups reading from the earliest offset, short heartbeats (so
/// membership changes show quickly) and the given acquisition lock and session timeout.
pub fn share_broker(brokers: u32, lock_ms: i32, session_ms: i32) -> DevBroker {
    let broker = DevBroker::start(brokers);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(lock_ms);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(session_ms);
    broker
}

pub use spillway_core::config::config_map as config;

/// A worker on `broker` with the built-in sinks and the probe.
pub fn worker(broker: &DevBroker) -> Worker {
    worker_on(&broker.bootstrap())
}

/// A worker reading from `bootstrap` (a broker, or the test-kit proxy in front of one).
pub fn worker_on(bootstrap: &str) -> Worker {
    Worker::start(
        config(&[
            ("bootstrap.servers", bootstrap),
            ("task.restart.backoff.ms", "200"),
            ("task.poll.timeout.ms", "100"),
        ]),
        ConnectorRegistry::builtin().with(&["probe"], || Box::new(ProbeConnector::default())),
    )
    .expect("worker starts")
}

/// One record as the probe received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub task: u32,
    pub at: Instant,
}

/// What every task of one probe connector received.
#[derive(Debug, Default)]
pub struct Probe {
    received: Mutex<Vec<Received>>,
    /// Every `open` and `close` call, in order: ("open" | "close", the assignment).
    assignments: Mutex<Vec<(&'static str, String)>>,
    /// Faults to inject, shared by the connector's tasks (and their restarts).
    faults: Mutex<Faults>,
    /// Each injected fault: when, and the records of the batch it hit.
    faulted: Mutex<Vec<Faulted>>,
}

/// One injected fault: when, and the records (topic, partition, offset) of the batch it hit.
pub type Faulted = (Instant, Vec<(String, i32, i64)>);

/// Faults a probe injects: a plugin with a bug (a panic) or a target that breaks.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// `put` or `flush` panics, this many times in all.
    pub panic_in: Option<&'static str>,
    pub panics: u32,
    /// `flush` fails fatally (a task failure, not a record's), this many times in all.
    pub flush_errors: u32,
    /// Only this task is hit.
    pub task: Option<u32>,
}

impl Probe {
    /// Arms `faults` for the probe's tasks.
    pub fn inject(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// The faults injected so far: when, and the records of the batch each hit.
    pub fn faulted(&self) -> Vec<Faulted> {
        self.faulted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes one fault of `call` for `task`, recording the batch it hits; true when it fires.
    fn fault(&self, call: &str, task: u32, batch: &[SinkRecord]) -> bool {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        if faults.task.is_some_and(|t| t != task) {
            return false;
        }
        let left = if call == "flush-error" {
            &mut faults.flush_errors
        } else if faults.panic_in == Some(call) {
            &mut faults.panics
        } else {
            return false;
        };
        if *left == 0 {
            return false;
        }
        *left -= 1;
        let records = batch
            .iter()
            .map(|r| {
                let c = &r.original;
                (c.topic.to_string(), c.partition, c.offset)
            })
            .collect();
        self.faulted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now(), records));
        true
    }

    /// The tasks' `open` and `close` calls so far, in order.
    pub fn assignment_calls(&self) -> Vec<(&'static str, String)> {
        self.assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn assignment_call(&self, call: &'static str, assignment: &Assignment) {
        self.assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((call, format!("{assignment:?}")));
    }

    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn coordinates(&self) -> Vec<(String, i32, i64)> {
        self.received()
            .into_iter()
            .map(|r| (r.topic, r.partition, r.offset))
            .collect()
    }

    pub fn distinct(&self) -> usize {
        self.coordinates()
            .into_iter()
            .collect::<BTreeSet<_>>()
            .len()
    }

    pub fn per_task(&self) -> BTreeMap<u32, usize> {
        let mut counts = BTreeMap::new();
        for r in self.received() {
            *counts.entry(r.task).or_default() += 1;
        }
        counts
    }
}

fn probes() -> &'static Mutex<HashMap<String, Arc<Probe>>> {
    static PROBES: OnceLock<Mutex<HashMap<String, Arc<Probe>>>> = OnceLock::new();
    PROBES.get_or_init(Mutex::default)
}

/// The probe named `id` (the connector config's `probe.id`).
pub fn probe(id: &str) -> Arc<Probe> {
    Arc::clone(
        probes()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_default(),
    )
}

/// Records what it is given. `probe.put.delay.ms` slows every put; `probe.fail.every=k` makes
/// the first attempt at every k-th offset fail retriably; `probe.fail.until.ms=t` makes every
/// put fail retriably until `t` ms after the task's first put.
#[derive(Default)]
pub struct ProbeConnector {
    config: ConfigMap,
}

fn probe_def() -> ConfigDef {
    ConfigDef::new()
        .define(ConfigKey::new(
            "probe.id",
            ConfigType::String,
            Importance::High,
            "Probe name.",
        ))
        .define(
            ConfigKey::new(
                "probe.put.delay.ms",
                ConfigType::Long,
                Importance::Low,
                "Delay per put.",
            )
            .default("0"),
        )
        .define(
            ConfigKey::new(
                "probe.fail.every",
                ConfigType::Long,
                Importance::Low,
                "Fail every k-th offset once.",
            )
            .default("0"),
        )
        .define(
            ConfigKey::new(
                "probe.poison",
                ConfigType::String,
                Importance::Low,
                "partition:offset of a record every put fails (fatally, or retriably with probe.poison.retriable).",
            )
            .default(""),
        )
        .define(
            ConfigKey::new(
                "probe.poison.retriable",
                ConfigType::Boolean,
                Importance::Low,
                "The poison record fails retriably (a target that never takes it) instead of fatally.",
            )
            .default("false"),
        )
        .define(
            ConfigKey::new(
                "probe.fail.until.ms",
                ConfigType::Long,
                Importance::Low,
                "Fail every put until this long after the first one.",
            )
            .default("0"),
        )
}

impl SinkConnector for ProbeConnector {
    fn version(&self) -> &str {
        "test"
    }

    fn config_def(&self) -> ConfigDef {
        probe_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        probe_def().parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(ProbeTask::default())
    }
}

#[derive(Default)]
struct ProbeTask {
    probe: Option<Arc<Probe>>,
    task: u32,
    delay: Duration,
    fail_every: i64,
    fail_for: Duration,
    /// (partition, offset) of the record every put fails, and whether retriably.
    poison: Option<(i32, i64)>,
    poison_retriable: bool,
    first_put: Option<Instant>,
    /// Records that already failed once (shared by nobody: a redelivery may reach another
    /// task, which then succeeds anyway since only first attempts fail).
    failed: BTreeSet<(String, i32, i64)>,
    /// The records of the last put, for a fault injected in the flush after it.
    last_put: Vec<SinkRecord>,
}

#[async_trait]
impl SinkTask for ProbeTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let get = |k: &str| config.get(k).cloned().unwrap_or_default();
        self.probe = Some(probe(&get("probe.id")));
        self.task = get(TASK_ID).parse().unwrap_or(u32::MAX);
        self.delay = Duration::from_millis(get("probe.put.delay.ms").parse().unwrap_or(0));
        self.fail_every = get("probe.fail.every").parse().unwrap_or(0);
        self.fail_for = Duration::from_millis(get("probe.fail.until.ms").parse().unwrap_or(0));
        self.poison = get("probe.poison")
            .split_once(':')
            .and_then(|(p, o)| Some((p.parse().ok()?, o.parse().ok()?)));
        self.poison_retriable = get("probe.poison.retriable") == "true";
        Ok(())
    }

    async fn open(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
        if let Some(probe) = &self.probe {
            probe.assignment_call("open", assignment);
        }
        Ok(())
    }

    async fn close(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
        if let Some(probe) = &self.probe {
            probe.assignment_call("close", assignment);
        }
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let probe = self
            .probe
            .as_ref()
            .ok_or_else(|| SinkError::fatal("not started"))?;
        if probe.fault("put", self.task, records) {
            panic!("injected panic in put (task {})", self.task);
        }
        self.last_put = records.to_vec();
        let first_put = *self.first_put.get_or_insert_with(Instant::now);
        if first_put.elapsed() < self.fail_for {
            return Err(SinkError::retriable("injected outage"));
        }
        let mut outcomes = Vec::with_capacity(records.len());
        let mut received = probe.received.lock().unwrap_or_else(|e| e.into_inner());
        for r in records {
            let c = &r.original;
            if self.poison == Some((c.partition, c.offset)) {
                let message = format!("poison record {c} (delivery {:?})", r.delivery_count);
                outcomes.push(if self.poison_retriable {
                    PutOutcome::Retriable(SinkError::retriable(message))
                } else {
                    PutOutcome::Fatal(SinkError::fatal(message))
                });
                continue;
            }
            let first_attempt = r.delivery_count.is_none_or(|d| d <= 1);
            if self.fail_every > 0
                && c.offset % self.fail_every == 0
                && first_attempt
                && self
                    .failed
                    .insert((c.topic.to_string(), c.partition, c.offset))
            {
                outcomes.push(PutOutcome::Retriable(SinkError::retriable(format!(
                    "injected failure for {c}"
                ))));
                continue;
            }
            received.push(Received {
                topic: c.topic.to_string(),
                partition: c.partition,
                offset: c.offset,
                task: self.task,
                at: Instant::now(),
            });
            outcomes.push(PutOutcome::Ok);
        }
        Ok(outcomes)
    }

    async fn flush(
        &mut self,
        _offsets: &BTreeMap<spillway_core::TopicPartition, i64>,
    ) -> Result<(), SinkError> {
        let Some(probe) = &self.probe else {
            return Ok(());
        };
        let batch = std::mem::take(&mut self.last_put);
        if probe.fault("flush", self.task, &batch) {
            panic!("injected panic in flush (task {})", self.task);
        }
        if probe.fault("flush-error", self.task, &batch) {
            return Err(SinkError::fatal(
                "injected flush failure: the target lost the batch",
            ));
        }
        Ok(())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Waits until `done` holds, checking every 50 ms; panics with `what` after `limit`.
pub async fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn coordinates(produced: &[Produced]) -> Vec<(String, i32, i64)> {
    produced
        .iter()
        .map(|p| (p.topic.clone(), p.partition, p.offset))
        .collect()
}

/// Share mode: no task of connector `name` released a record on its last allowed delivery or
/// let its lock run out there (`sink-record-archived-by-limit-total` is 0): the broker
/// archived nothing Spillway did not deliver, dead-letter or name in a FAILED status.
pub fn assert_nothing_archived(worker: &Worker, name: &str) {
    let status = worker.status(name).expect("registered");
    let archived: Vec<(u32, u64)> = status
        .tasks
        .iter()
        .map(|t| (t.id, t.counts.archived_by_limit))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(
        archived.is_empty(),
        "records archived by the delivery limit, per task: {archived:?}"
    );
}

/// An HTTP receiver that answers `refusal` (503 for an outage, 401 for a token being fixed) for
/// `refuse_for` from its first request, then 200, keeping every `n` of the JSON arrays it took
/// (records made by [`json_records`]).
pub struct HttpReceiver {
    refusal: axum::http::StatusCode,
    refuse_for: Duration,
    /// Set on the first request: the refusal runs from then.
    pub first_request: Mutex<Option<Instant>>,
    /// Requests answered with the refusal.
    pub refused: Mutex<u64>,
    pub taken: Mutex<BTreeSet<u64>>,
}

async fn http_receive(
    axum::extract::State(r): axum::extract::State<Arc<HttpReceiver>>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    let first = *r
        .first_request
        .lock()
        .expect("lock")
        .get_or_insert_with(Instant::now);
    if first.elapsed() < r.refuse_for {
        *r.refused.lock().expect("lock") += 1;
        return r.refusal;
    }
    let Ok(values) = serde_json::from_slice::<Vec<serde_json::Value>>(&body) else {
        return axum::http::StatusCode::BAD_REQUEST;
    };
    let mut taken = r.taken.lock().expect("lock");
    for v in values {
        if let Some(n) = v.get("n").and_then(serde_json::Value::as_u64) {
            taken.insert(n);
        }
    }
    axum::http::StatusCode::OK
}

/// Starts an [`HttpReceiver`] on a free port; returns its URL (`/ingest`) and the receiver.
pub async fn start_http_receiver(
    refusal: axum::http::StatusCode,
    refuse_for: Duration,
) -> (String, Arc<HttpReceiver>) {
    let receiver = Arc::new(HttpReceiver {
        refusal,
        refuse_for,
        first_request: Mutex::new(None),
        refused: Mutex::new(0),
        taken: Mutex::new(BTreeSet::new()),
    });
    let app = axum::Router::new()
        .route("/ingest", axum::routing::post(http_receive))
        .with_state(Arc::clone(&receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/ingest", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, receiver)
}

/// `n` records whose values are `{"n":<i>}`, spread over `partitions`.
pub fn json_records(n: u64, partitions: i32) -> Vec<spillway_tests::TestRecord> {
    (0..n)
        .map(|i| spillway_tests::TestRecord {
            partition: Some((i % partitions as u64) as i32),
            value: Some(format!("{{\"n\":{i}}}").into_bytes()),
            ..spillway_tests::TestRecord::default()
        })
        .collect()
}
