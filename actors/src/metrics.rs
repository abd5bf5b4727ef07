//! Kafka Connect's metrics, plus what share groups add, recorded by the runtime and exported
//! through the OpenTelemetry metrics API (docs/metrics.md lists every one).
//!
//! Cost stays off the record path: counters are the task's atomics ([`TaskCounters`], bumped
//! once per batch) read by observable instruments when a reader collects; windowed averages,
//! maxima and rates are computed then too. Only the histograms are fed per record, through
//! instruments bound to the task's labels when it starts (no attribute lookup per value).
//!
//! Names follow Connect: an instrument is `kafka.connect.<group>.<metric>`, which Prometheus
//! spells `kafka_connect_<group>_<metric>` with `-` and `.` as `_`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::{BoundHistogram, Histogram, Meter};
use opentelemetry::KeyValue;
use spillway_core::{Ack, Disposition, RawRecord, RecordCoordinates};

use crate::status::{Counts, State, StatusBoard};

/// Kafka's sampled statistics keep two samples of 30 s (`metrics.sample.window.ms`,
/// `metrics.num.samples`): averages, maxima and rates cover the last 30 to 60 s.
const SAMPLE_WINDOW: Duration = Duration::from_secs(30);
/// Rates are computed from totals remembered at least this far apart.
const RATE_STEP: Duration = Duration::from_secs(1);

const GROUP_SINK_TASK: &str = "sink-task-metrics";
const GROUP_TASK: &str = "connector-task-metrics";
const GROUP_ERRORS: &str = "task-error-metrics";
const GROUP_CONNECTOR: &str = "connector-metrics";
const GROUP_WORKER: &str = "connect-worker-metrics";

/// The OpenTelemetry instrument name of a Connect metric.
pub fn instrument_name(group: &str, metric: &str) -> String {
    format!("kafka.connect.{group}.{metric}")
}

/// The Prometheus name of a Connect metric, as the exporter writes it.
pub fn prometheus_name(group: &str, metric: &str) -> String {
    instrument_name(group, metric).replace(['.', '-'], "_")
}

/// What a connector's series are labelled with, besides the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorLabels {
    pub tenant: String,
    /// The connector's own name (the worker keys a tenant's connectors `tenant/name`).
    pub connector: String,
    /// `share`, or `classic` for consumer groups (the classic and the KIP-848 protocol).
    pub mode: &'static str,
    pub connector_class: String,
    pub connector_version: String,
}

impl ConnectorLabels {
    fn of_task(&self, task: u32) -> Vec<KeyValue> {
        vec![
            KeyValue::new("tenant", self.tenant.clone()),
            KeyValue::new("connector", self.connector.clone()),
            KeyValue::new("task", task.to_string()),
            KeyValue::new("mode", self.mode),
        ]
    }

    fn of_connector(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new("tenant", self.tenant.clone()),
            KeyValue::new("connector", self.connector.clone()),
            KeyValue::new("mode", self.mode),
        ]
    }
}

/// An average and maximum over Kafka's two 30 s samples.
#[derive(Debug, Default)]
pub struct Windowed {
    samples: Mutex<[Sample; 2]>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Sample {
    start: Option<Instant>,
    count: u64,
    sum: f64,
    max: f64,
}

impl Windowed {
    fn lock(&self) -> MutexGuard<'_, [Sample; 2]> {
        // Each update is a few assignments; a panic elsewhere cannot tear it.
        self.samples.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, value: f64, now: Instant) {
        let mut samples = self.lock();
        let current = samples[1];
        if current
            .start
            .is_none_or(|s| now.duration_since(s) >= SAMPLE_WINDOW)
        {
            samples[0] = current;
            samples[1] = Sample {
                start: Some(now),
                ..Sample::default()
            };
        }
        let s = &mut samples[1];
        s.count += 1;
        s.sum += value;
        s.max = if s.count == 1 {
            value
        } else {
            s.max.max(value)
        };
    }

    /// Average and maximum of the values recorded in the last one or two windows; `None`
    /// when there were none (Connect reports NaN then).
    pub fn read(&self, now: Instant) -> Option<(f64, f64)> {
        let samples = *self.lock();
        let live = samples.iter().filter(|s| {
            s.count > 0
                && s.start
                    .is_some_and(|start| now.duration_since(start) < SAMPLE_WINDOW * 2)
        });
        let (mut count, mut sum, mut max) = (0u64, 0.0, f64::MIN);
        for s in live {
            count += s.count;
            sum += s.sum;
            max = max.max(s.max);
        }
        (count > 0).then(|| (sum / count as f64, max))
    }
}

/// Per-second rates of totals, over about the last 30 s.
#[derive(Debug, Default)]
pub struct Rates {
    history: Mutex<HashMap<&'static str, VecDeque<(Instant, u64)>>>,
}

impl Rates {
    /// The rate of `total` (a counter named `name`) as seen at `now`.
    pub fn rate(&self, name: &'static str, total: u64, now: Instant) -> f64 {
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let seen = history.entry(name).or_default();
        if seen
            .back()
            .is_none_or(|(at, _)| now.duration_since(*at) >= RATE_STEP)
        {
            seen.push_back((now, total));
        }
        // Keep one sample older than the window as the base of the rate.
        while seen.len() > 2 && now.duration_since(seen[1].0) >= SAMPLE_WINDOW {
            seen.pop_front();
        }
        let (at, base) = seen[0];
        let elapsed = now.duration_since(at).as_secs_f64();
        if elapsed < 0.001 {
            return 0.0;
        }
        total.saturating_sub(base) as f64 / elapsed
    }
}

/// Counts of the worker's connector and task starts (connect-worker-metrics).
#[derive(Debug, Default)]
pub struct StartupCounters {
    pub connector_attempts: AtomicU64,
    pub connector_successes: AtomicU64,
    pub connector_failures: AtomicU64,
    pub task_attempts: AtomicU64,
    pub task_successes: AtomicU64,
    pub task_failures: AtomicU64,
}

impl StartupCounters {
    pub fn connector_started(&self, ok: bool) {
        self.connector_attempts.fetch_add(1, Ordering::Relaxed);
        let outcome = if ok {
            &self.connector_successes
        } else {
            &self.connector_failures
        };
        outcome.fetch_add(1, Ordering::Relaxed);
    }
}

/// The histogram instruments, unbound; each task binds them to its labels.
#[derive(Clone)]
pub struct Histograms {
    e2e_latency: Histogram<f64>,
    lock_margin: Histogram<f64>,
    ack_commit_time: Histogram<f64>,
    put_batch_time: Histogram<f64>,
}

impl fmt::Debug for Histograms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Histograms")
    }
}

/// Milliseconds, from 1 ms to 5 min.
const LATENCY_BUCKETS_MS: [f64; 16] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0,
    30_000.0, 60_000.0, 300_000.0,
];
/// Milliseconds left on a lock; fine near zero, up to beyond the 30 s default lock.
const LOCK_MARGIN_BUCKETS_MS: [f64; 14] = [
    0.0, 100.0, 250.0, 500.0, 1_000.0, 2_000.0, 3_000.0, 5_000.0, 10_000.0, 15_000.0, 20_000.0,
    25_000.0, 30_000.0, 60_000.0,
];

/// The histograms of the sink-task group: (metric, unit, buckets, description).
pub const HISTOGRAMS: [(&str, &str, &[f64], &str); 4] = [
    (
        "sink-record-e2e-latency-ms",
        "ms",
        &LATENCY_BUCKETS_MS,
        "Time from a record's timestamp to its final verdict (ACCEPT or REJECT) being committed.",
    ),
    (
        "sink-record-lock-margin-ms",
        "ms",
        &LOCK_MARGIN_BUCKETS_MS,
        "Share mode: time left on a record's acquisition lock when its acknowledgement was sent (0 when it had run out).",
    ),
    (
        "ack-commit-time-ms",
        "ms",
        &LATENCY_BUCKETS_MS,
        "Time one commit of acknowledgements (share) or offsets (classic) took.",
    ),
    (
        "put-batch-time-ms",
        "ms",
        &LATENCY_BUCKETS_MS,
        "Time one put of a batch into the sink took.",
    ),
];

impl Histograms {
    fn new(meter: &Meter) -> Histograms {
        let build = |(metric, unit, buckets, help): (&str, &str, &[f64], &str)| {
            meter
                .f64_histogram(instrument_name(GROUP_SINK_TASK, metric))
                .with_unit(unit.to_owned())
                .with_description(help.to_owned())
                .with_boundaries(buckets.to_vec())
                .build()
        };
        Histograms {
            e2e_latency: build(HISTOGRAMS[0]),
            lock_margin: build(HISTOGRAMS[1]),
            ack_commit_time: build(HISTOGRAMS[2]),
            put_batch_time: build(HISTOGRAMS[3]),
        }
    }
}

/// What is shared by the worker's metrics: startup counts and the histogram instruments.
#[derive(Debug, Default)]
pub struct WorkerTelemetry {
    pub startups: Arc<StartupCounters>,
    histograms: OnceLock<Histograms>,
}

/// One task's histograms, bound to its labels, and the worker's startup counters.
struct Bound {
    e2e_latency: BoundHistogram<f64>,
    lock_margin: BoundHistogram<f64>,
    ack_commit_time: BoundHistogram<f64>,
    put_batch_time: BoundHistogram<f64>,
    startups: Arc<StartupCounters>,
}

impl fmt::Debug for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Bound")
    }
}

/// The metrics of one task beyond [`TaskCounters`]' verdict counts. Lives inside them, so
/// every actor of the task reaches it, and it survives the task's restarts as they do.
#[derive(Debug, Default)]
pub struct TaskMetrics {
    /// Share mode: records acquired (every delivery, redeliveries included).
    pub acquired: AtomicU64,
    /// Deliveries with a delivery count above 1.
    pub redelivered: AtomicU64,
    /// Records the broker archives instead of redelivering: released (or their lock expired)
    /// at the delivery attempt limit.
    pub archived_by_limit: AtomicU64,
    /// Acknowledgements that failed because the record's acquisition lock had run out.
    pub lock_expired: AtomicU64,
    /// Records released because their batch was lost inside the task (a panic, a failure, a
    /// stop past its deadline) before their verdicts were decided.
    pub released_unsettled: AtomicU64,
    pub record_errors: AtomicU64,
    pub record_failures: AtomicU64,
    pub records_skipped: AtomicU64,
    pub retries: AtomicU64,
    pub errors_logged: AtomicU64,
    pub dead_letter_requests: AtomicU64,
    pub dead_letter_failures: AtomicU64,
    /// Milliseconds since the epoch of the last record error; 0 before any.
    pub last_error_ms: AtomicU64,
    /// Commits whose every verdict took effect.
    pub commits_completed: AtomicU64,
    /// Commits with verdicts that did not take effect (their records come again).
    pub commits_skipped: AtomicU64,
    /// Records read and not yet committed, in this run of the task.
    pub active: AtomicI64,
    pub partitions: AtomicU64,
    pub put_batch_time: Windowed,
    pub commit_time: Windowed,
    pub batch_size: Windowed,
    pub rates: Rates,
    bound: OnceLock<Bound>,
}

fn add(counter: &AtomicU64, n: usize) {
    if n > 0 {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

fn now_epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What the consumer remembers of a polled batch until its verdicts are committed: per record,
/// in poll order (the order its verdicts come back in).
#[derive(Debug, Default)]
pub struct BatchMeta {
    offsets: Vec<i64>,
    timestamps: Vec<i64>,
    delivery_counts: Vec<u16>,
    /// Share mode: when each record's acquisition lock runs out.
    lock_deadlines: Vec<Instant>,
}

/// What a commit came to, as the metrics need it.
pub struct CommitOutcome<'a> {
    pub started: Instant,
    pub elapsed: Duration,
    pub all_applied: bool,
    pub unapplied: &'a [RecordCoordinates],
    /// Unapplied acknowledgements the broker refused because the lock had run out.
    pub expired: &'a [RecordCoordinates],
    /// Share mode: records released at this delivery count are archived by the broker.
    pub delivery_attempt_limit: u16,
}

impl TaskMetrics {
    /// Binds the histograms to this task's labels, once per task (restarts keep them).
    pub fn bind(&self, telemetry: &WorkerTelemetry, labels: &[KeyValue]) {
        let Some(h) = telemetry.histograms.get() else {
            return;
        };
        let _ = self.bound.set(Bound {
            e2e_latency: h.e2e_latency.bind(labels),
            lock_margin: h.lock_margin.bind(labels),
            ack_commit_time: h.ack_commit_time.bind(labels),
            put_batch_time: h.put_batch_time.bind(labels),
            startups: Arc::clone(&telemetry.startups),
        });
    }

    /// A new run of the task starts: nothing of it is in flight yet.
    pub fn task_starting(&self) {
        self.active.store(0, Ordering::Relaxed);
        if let Some(b) = self.bound.get() {
            add(&b.startups.task_attempts, 1);
        }
    }

    /// The sink task's `start` returned.
    pub fn task_started(&self, ok: bool) {
        if let Some(b) = self.bound.get() {
            let outcome = if ok {
                &b.startups.task_successes
            } else {
                &b.startups.task_failures
            };
            add(outcome, 1);
        }
    }

    /// A task could not even be set up (its configuration or plugin failed).
    pub fn task_setup_failed(telemetry: &WorkerTelemetry) {
        add(&telemetry.startups.task_attempts, 1);
        add(&telemetry.startups.task_failures, 1);
    }

    /// A batch was polled: counts it, and returns what its commit will need.
    pub fn polled(&self, records: &[RawRecord], lock_deadlines: Vec<Instant>) -> BatchMeta {
        let n = records.len();
        if n == 0 {
            return BatchMeta::default();
        }
        let share = !lock_deadlines.is_empty();
        let mut meta = BatchMeta {
            offsets: Vec::with_capacity(n),
            timestamps: Vec::with_capacity(n),
            delivery_counts: Vec::with_capacity(n),
            lock_deadlines,
        };
        let mut redelivered = 0;
        for r in records {
            let delivery_count = r.delivery_count.unwrap_or(1);
            redelivered += usize::from(delivery_count > 1);
            meta.offsets.push(r.offset);
            meta.timestamps.push(r.timestamp.unwrap_or(-1));
            meta.delivery_counts.push(delivery_count);
        }
        if share {
            add(&self.acquired, n);
        }
        add(&self.redelivered, redelivered);
        self.active.fetch_add(n as i64, Ordering::Relaxed);
        self.batch_size.record(n as f64, Instant::now());
        meta
    }

    /// A commit returned: its time, and per acknowledged record the lock margin, the
    /// end-to-end latency, lock expiries and archiving at the delivery limit.
    pub fn committed(&self, batches: &[(&[Ack], Option<BatchMeta>)], outcome: &CommitOutcome<'_>) {
        let time_ms = millis(outcome.elapsed);
        self.commit_time.record(time_ms, Instant::now());
        if outcome.all_applied {
            add(&self.commits_completed, 1);
        } else {
            add(&self.commits_skipped, 1);
        }
        let bound = self.bound.get();
        if let Some(b) = bound {
            b.ack_commit_time.record(time_ms);
        }
        let unapplied: HashSet<&RecordCoordinates> = outcome.unapplied.iter().collect();
        let refused_expired: HashSet<&RecordCoordinates> = outcome.expired.iter().collect();
        let now_ms = now_epoch_ms();
        let (mut settled, mut expired, mut archived) = (0usize, 0usize, 0usize);
        for (acks, meta) in batches {
            settled += acks.len();
            let aligned = meta.as_ref().filter(|m| m.offsets.len() == acks.len());
            for (i, ack) in acks.iter().enumerate() {
                let m = aligned.filter(|m| m.offsets[i] == ack.record.offset);
                let applied = !unapplied.contains(&ack.record);
                let delivery_count = m.map_or(1, |m| m.delivery_counts[i]);
                let deadline = m.and_then(|m| m.lock_deadlines.get(i));
                if let (Some(b), Some(deadline)) = (bound, deadline) {
                    b.lock_margin
                        .record(millis(deadline.saturating_duration_since(outcome.started)));
                }
                if !applied {
                    let ran_out = refused_expired.contains(&ack.record)
                        || deadline.is_some_and(|d| *d <= outcome.started);
                    if ran_out {
                        expired += 1;
                        archived += usize::from(delivery_count >= outcome.delivery_attempt_limit);
                    }
                    continue;
                }
                match ack.disposition {
                    Disposition::Release => {
                        if deadline.is_some() {
                            archived +=
                                usize::from(delivery_count >= outcome.delivery_attempt_limit);
                        }
                    }
                    Disposition::Accept | Disposition::Reject { .. } => {
                        if let (Some(b), Some(m)) = (bound, m) {
                            let timestamp = m.timestamps[i];
                            if timestamp >= 0 {
                                b.e2e_latency
                                    .record(now_ms.saturating_sub(timestamp).max(0) as f64);
                            }
                        }
                    }
                }
            }
        }
        add(&self.lock_expired, expired);
        add(&self.archived_by_limit, archived);
        self.active.fetch_sub(settled as i64, Ordering::Relaxed);
    }

    /// One `put` call of `records` records took `elapsed`; `failed` of them failed.
    pub fn put_done(&self, elapsed: Duration, failed: usize) {
        let ms = millis(elapsed);
        self.put_batch_time.record(ms, Instant::now());
        if let Some(b) = self.bound.get() {
            b.put_batch_time.record(ms);
        }
        if failed > 0 {
            add(&self.record_failures, failed);
            self.error_now();
        }
    }

    /// A record failed conversion or a transform.
    pub fn conversion_failed(&self) {
        add(&self.record_failures, 1);
        self.error_now();
    }

    /// Records are tried again: put again after a backoff (classic) or released (share).
    pub fn retried(&self, n: usize) {
        add(&self.retries, n);
    }

    /// A record ended in error; `skipped` when it was dropped from the pipeline (REJECT under
    /// `errors.tolerance=all`), `logged` when the error was logged.
    pub fn record_error(&self, skipped: bool, logged: bool) {
        add(&self.record_errors, 1);
        add(&self.records_skipped, usize::from(skipped));
        self.logged(logged);
        self.error_now();
    }

    pub fn logged(&self, logged: bool) {
        add(&self.errors_logged, usize::from(logged));
    }

    pub fn dead_letters_written(&self, requests: usize, failures: usize) {
        add(&self.dead_letter_requests, requests);
        add(&self.dead_letter_failures, failures);
    }

    fn error_now(&self) {
        self.last_error_ms
            .store(now_epoch_ms().max(0) as u64, Ordering::Relaxed);
    }
}

/// How an observed task metric is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic total (Prometheus counter).
    Counter,
    /// A value now (Prometheus gauge).
    Gauge,
    /// Per second over the last 30 to 60 s, from a total (Prometheus gauge).
    Rate,
}

/// What a task metric's reader sees.
pub struct TaskView<'a> {
    pub counts: Counts,
    pub metrics: &'a TaskMetrics,
    pub now: Instant,
}

/// One metric observed per task: group, Connect's name, kind, unit, description, value.
pub struct TaskMetric {
    pub group: &'static str,
    pub name: &'static str,
    pub kind: Kind,
    pub unit: &'static str,
    pub help: &'static str,
    /// `None` when there is nothing to report (an average without samples).
    pub value: fn(&TaskView<'_>) -> Option<f64>,
}

fn load(c: &AtomicU64) -> Option<f64> {
    Some(c.load(Ordering::Relaxed) as f64)
}

macro_rules! task_metric {
    ($group:expr, $name:expr, $kind:ident, $unit:expr, $help:expr, |$v:ident| $value:expr) => {
        TaskMetric {
            group: $group,
            name: $name,
            kind: Kind::$kind,
            unit: $unit,
            help: $help,
            value: |$v: &TaskView<'_>| $value,
        }
    };
}

/// Every per-task metric but the histograms and the task status.
pub fn task_metrics() -> Vec<TaskMetric> {
    use GROUP_ERRORS as E;
    use GROUP_SINK_TASK as S;
    use GROUP_TASK as T;
    vec![
        task_metric!(S, "sink-record-read-total", Counter, "{record}", "Records read from Kafka (every delivery).", |v| Some(v.counts.read as f64)),
        task_metric!(S, "sink-record-read-rate", Rate, "{record}/s", "Records read from Kafka per second.", |v| Some(v.counts.read as f64)),
        task_metric!(S, "sink-record-send-total", Counter, "{record}", "Records handed to the sink's put, after transforms (a record put again counts again).", |v| Some(v.counts.put as f64)),
        task_metric!(S, "sink-record-send-rate", Rate, "{record}/s", "Records handed to put per second.", |v| Some(v.counts.put as f64)),
        task_metric!(S, "sink-record-active-count", Gauge, "{record}", "Records read and not yet committed (acknowledged or offset-committed).", |v| Some(v.metrics.active.load(Ordering::Relaxed).max(0) as f64)),
        task_metric!(S, "partition-count", Gauge, "{partition}", "Partitions assigned to the task (share mode: by the share group).", |v| load(&v.metrics.partitions)),
        task_metric!(S, "offset-commit-completion-total", Counter, "{commit}", "Commits whose every acknowledgement or offset took effect.", |v| load(&v.metrics.commits_completed)),
        task_metric!(S, "offset-commit-completion-rate", Rate, "{commit}/s", "Completed commits per second.", |v| load(&v.metrics.commits_completed)),
        task_metric!(S, "offset-commit-skip-total", Counter, "{commit}", "Commits some of whose verdicts did not take effect (lock or session lost, offset commit failed); those records come again.", |v| load(&v.metrics.commits_skipped)),
        task_metric!(S, "offset-commit-skip-rate", Rate, "{commit}/s", "Skipped commits per second.", |v| load(&v.metrics.commits_skipped)),
        task_metric!(S, "put-batch-avg-time-ms", Gauge, "ms", "Average time of one put over the last 30-60 s.", |v| v.metrics.put_batch_time.read(v.now).map(|(avg, _)| avg)),
        task_metric!(S, "put-batch-max-time-ms", Gauge, "ms", "Longest put over the last 30-60 s.", |v| v.metrics.put_batch_time.read(v.now).map(|(_, max)| max)),
        task_metric!(S, "sink-record-acquired-total", Counter, "{record}", "Share mode: records acquired from the share group (redeliveries included).", |v| load(&v.metrics.acquired)),
        task_metric!(S, "sink-record-acquired-rate", Rate, "{record}/s", "Share mode: records acquired per second.", |v| load(&v.metrics.acquired)),
        task_metric!(S, "sink-record-accepted-total", Counter, "{record}", "Records whose ACCEPT took effect (classic mode: offsets committed past them).", |v| Some(v.counts.accepted as f64)),
        task_metric!(S, "sink-record-accepted-rate", Rate, "{record}/s", "Accepted records per second.", |v| Some(v.counts.accepted as f64)),
        task_metric!(S, "sink-record-released-total", Counter, "{record}", "Records whose RELEASE took effect (classic mode: read again).", |v| Some(v.counts.released as f64)),
        task_metric!(S, "sink-record-released-rate", Rate, "{record}/s", "Released records per second.", |v| Some(v.counts.released as f64)),
        task_metric!(S, "sink-record-rejected-total", Counter, "{record}", "Records whose REJECT took effect (classic mode: skipped after the error handling).", |v| Some(v.counts.rejected as f64)),
        task_metric!(S, "sink-record-rejected-rate", Rate, "{record}/s", "Rejected records per second.", |v| Some(v.counts.rejected as f64)),
        task_metric!(S, "sink-record-archived-by-limit-total", Counter, "{record}", "Share mode: records released (or whose lock ran out) at the delivery attempt limit, which the broker archives instead of redelivering.", |v| load(&v.metrics.archived_by_limit)),
        task_metric!(S, "sink-record-archived-by-limit-rate", Rate, "{record}/s", "Share mode: records archived at the delivery limit per second.", |v| load(&v.metrics.archived_by_limit)),
        task_metric!(S, "sink-record-redelivered-total", Counter, "{record}", "Deliveries with a delivery count above 1 (share mode).", |v| load(&v.metrics.redelivered)),
        task_metric!(S, "sink-record-redelivered-rate", Rate, "{record}/s", "Redeliveries per second.", |v| load(&v.metrics.redelivered)),
        task_metric!(S, "sink-record-released-unsettled-total", Counter, "{record}", "Records released at once because their batch was lost inside the task before their verdicts were decided (a panic, a failed put or flush, a stop past task.shutdown.graceful.timeout.ms); classic mode: read again. Also counted in sink-record-released-total.", |v| load(&v.metrics.released_unsettled)),
        task_metric!(S, "sink-record-lock-expired-total", Counter, "{record}", "Share mode: acknowledgements that failed because the record's acquisition lock had run out.", |v| load(&v.metrics.lock_expired)),
        task_metric!(S, "sink-record-ack-failed-total", Counter, "{record}", "Verdicts that did not take effect for any reason (lock or session lost); their records come again.", |v| Some(v.counts.ack_failures as f64)),
        task_metric!(T, "batch-size-avg", Gauge, "{record}", "Average records per polled batch over the last 30-60 s.", |v| v.metrics.batch_size.read(v.now).map(|(avg, _)| avg)),
        task_metric!(T, "batch-size-max", Gauge, "{record}", "Largest polled batch over the last 30-60 s.", |v| v.metrics.batch_size.read(v.now).map(|(_, max)| max)),
        task_metric!(T, "offset-commit-avg-time-ms", Gauge, "ms", "Average commit time over the last 30-60 s.", |v| v.metrics.commit_time.read(v.now).map(|(avg, _)| avg)),
        task_metric!(T, "offset-commit-max-time-ms", Gauge, "ms", "Longest commit over the last 30-60 s.", |v| v.metrics.commit_time.read(v.now).map(|(_, max)| max)),
        task_metric!(T, "offset-commit-success-percentage", Gauge, "%", "Completed commits as a percentage of all commits of the task.", |v| percentage(&v.metrics.commits_completed, &v.metrics.commits_skipped)),
        task_metric!(T, "offset-commit-failure-percentage", Gauge, "%", "Skipped commits as a percentage of all commits of the task.", |v| percentage(&v.metrics.commits_skipped, &v.metrics.commits_completed)),
        task_metric!(E, "total-record-errors", Counter, "{record}", "Records that ended in an error (conversion, transform or put failure after retries).", |v| load(&v.metrics.record_errors)),
        task_metric!(E, "total-record-failures", Counter, "{attempt}", "Failed attempts at a record: each conversion or transform failure and each failed put of it.", |v| load(&v.metrics.record_failures)),
        task_metric!(E, "total-records-skipped", Counter, "{record}", "Records skipped because of an error under errors.tolerance=all (rejected, dead-lettered when a DLQ is set).", |v| load(&v.metrics.records_skipped)),
        task_metric!(E, "total-retries", Counter, "{record}", "Records tried again after a retriable error: put again (classic) or released for redelivery (share).", |v| load(&v.metrics.retries)),
        task_metric!(E, "total-errors-logged", Counter, "{record}", "Errors written to the log (errors.log.enable).", |v| load(&v.metrics.errors_logged)),
        task_metric!(E, "deadletterqueue-produce-requests", Counter, "{record}", "Records written to the dead letter queue topic.", |v| load(&v.metrics.dead_letter_requests)),
        task_metric!(E, "deadletterqueue-produce-failures", Counter, "{record}", "Dead letters the broker did not confirm.", |v| load(&v.metrics.dead_letter_failures)),
        task_metric!(E, "last-error-timestamp", Gauge, "ms", "Milliseconds since the epoch of the task's last record error; 0 when none.", |v| load(&v.metrics.last_error_ms)),
    ]
}

fn percentage(part: &AtomicU64, other: &AtomicU64) -> Option<f64> {
    let (p, o) = (part.load(Ordering::Relaxed), other.load(Ordering::Relaxed));
    (p + o > 0).then(|| 100.0 * p as f64 / (p + o) as f64)
}

/// A metric observed per connector or for the worker (documented beside the task metrics).
pub struct OtherMetric {
    pub group: &'static str,
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static str,
    pub help: &'static str,
}

/// The connector-level and worker-level metrics (for the documentation test).
pub const OTHER_METRICS: [OtherMetric; 19] = [
    OtherMetric {
        group: GROUP_CONNECTOR,
        name: "status",
        kind: Kind::Gauge,
        labels:
            "tenant, connector, mode, status, connector_class, connector_type, connector_version",
        help: "1 for the connector's current status (running, failed, ...).",
    },
    OtherMetric {
        group: GROUP_TASK,
        name: "status",
        kind: Kind::Gauge,
        labels: "tenant, connector, task, mode, status",
        help: "1 for the task's current status (running, failed, restarting, unassigned, stopped).",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-count",
        kind: Kind::Gauge,
        labels: "",
        help: "Connectors on this worker.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "task-count",
        kind: Kind::Gauge,
        labels: "",
        help: "Tasks on this worker.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-startup-attempts-total",
        kind: Kind::Counter,
        labels: "",
        help: "Connector starts attempted.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-startup-success-total",
        kind: Kind::Counter,
        labels: "",
        help: "Connectors that started.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-startup-failure-total",
        kind: Kind::Counter,
        labels: "",
        help: "Connectors that failed to start.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-startup-success-percentage",
        kind: Kind::Gauge,
        labels: "",
        help: "Started connectors as a percentage of attempts.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-startup-failure-percentage",
        kind: Kind::Gauge,
        labels: "",
        help: "Failed connector starts as a percentage of attempts.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "task-startup-attempts-total",
        kind: Kind::Counter,
        labels: "",
        help: "Task starts attempted (restarts included).",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "task-startup-success-total",
        kind: Kind::Counter,
        labels: "",
        help: "Tasks whose sink task started.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "task-startup-failure-total",
        kind: Kind::Counter,
        labels: "",
        help: "Tasks that failed to start.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "task-startup-success-percentage",
        kind: Kind::Gauge,
        labels: "",
        help: "Started tasks as a percentage of attempts.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "task-startup-failure-percentage",
        kind: Kind::Gauge,
        labels: "",
        help: "Failed task starts as a percentage of attempts.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-total-task-count",
        kind: Kind::Gauge,
        labels: "tenant, connector, mode",
        help: "Tasks of the connector.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-running-task-count",
        kind: Kind::Gauge,
        labels: "tenant, connector, mode",
        help: "Running tasks of the connector.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-failed-task-count",
        kind: Kind::Gauge,
        labels: "tenant, connector, mode",
        help: "Failed tasks of the connector.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-restarting-task-count",
        kind: Kind::Gauge,
        labels: "tenant, connector, mode",
        help: "Tasks of the connector waiting to be restarted.",
    },
    OtherMetric {
        group: GROUP_WORKER,
        name: "connector-unassigned-task-count",
        kind: Kind::Gauge,
        labels: "tenant, connector, mode",
        help: "Tasks of the connector not running yet.",
    },
];

fn status_label(state: State) -> &'static str {
    match state {
        State::Unassigned => "unassigned",
        State::Running => "running",
        State::Restarting => "restarting",
        State::Failed => "failed",
        State::Stopped => "stopped",
    }
}

/// Registers every instrument on `meter`, observing `board`. Instruments stop reporting once
/// the board (the worker) is gone.
pub fn register(meter: &Meter, board: &StatusBoard) {
    let _ = board.telemetry().histograms.set(Histograms::new(meter));
    for metric in task_metrics() {
        let weak = board.downgrade();
        let name = instrument_name(metric.group, metric.name);
        let TaskMetric {
            kind,
            unit,
            help,
            value,
            name: metric_name,
            ..
        } = metric;
        let each = move |observe: &mut dyn FnMut(f64, &[KeyValue])| {
            let Some(board) = weak.upgrade() else {
                return;
            };
            let now = Instant::now();
            for (_, labels, tasks) in board.metric_view() {
                for (task, _, counters) in tasks {
                    let view = TaskView {
                        counts: counters.snapshot(),
                        metrics: &counters.metrics,
                        now,
                    };
                    let Some(v) = value(&view) else { continue };
                    let v = match kind {
                        Kind::Rate => counters.metrics.rates.rate(metric_name, v as u64, now),
                        _ => v,
                    };
                    observe(v, &labels.of_task(task));
                }
            }
        };
        match kind {
            Kind::Counter => {
                meter
                    .u64_observable_counter(name)
                    .with_unit(unit)
                    .with_description(help)
                    .with_callback(move |o| each(&mut |v, attrs| o.observe(v as u64, attrs)))
                    .build();
            }
            Kind::Gauge | Kind::Rate => {
                meter
                    .f64_observable_gauge(name)
                    .with_unit(unit)
                    .with_description(help)
                    .with_callback(move |o| each(&mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
        }
    }
    register_statuses(meter, board);
    register_worker(meter, board);
}

fn register_statuses(meter: &Meter, board: &StatusBoard) {
    let weak = board.downgrade();
    meter
        .u64_observable_gauge(instrument_name(GROUP_CONNECTOR, "status"))
        .with_description(OTHER_METRICS[0].help)
        .with_callback(move |o| {
            let Some(board) = weak.upgrade() else { return };
            for status in board.all() {
                let Some(labels) = board.labels(&status.name) else {
                    continue;
                };
                let mut attrs = labels.of_connector();
                attrs.extend([
                    KeyValue::new("status", status_label(status.state)),
                    KeyValue::new("connector_class", labels.connector_class.clone()),
                    KeyValue::new("connector_type", "sink"),
                    KeyValue::new("connector_version", labels.connector_version.clone()),
                ]);
                o.observe(1, &attrs);
            }
        })
        .build();
    let weak = board.downgrade();
    meter
        .u64_observable_gauge(instrument_name(GROUP_TASK, "status"))
        .with_description(OTHER_METRICS[1].help)
        .with_callback(move |o| {
            let Some(board) = weak.upgrade() else { return };
            for (_, labels, tasks) in board.metric_view() {
                for (task, state, _) in tasks {
                    let mut attrs = labels.of_task(task);
                    attrs.push(KeyValue::new("status", status_label(state)));
                    o.observe(1, &attrs);
                }
            }
        })
        .build();
}

fn register_worker(meter: &Meter, board: &StatusBoard) {
    let gauge = |name: &'static str, read: fn(&StatusBoard) -> f64| {
        let weak = board.downgrade();
        meter
            .f64_observable_gauge(instrument_name(GROUP_WORKER, name))
            .with_description(help_of(name))
            .with_callback(move |o| {
                if let Some(board) = weak.upgrade() {
                    o.observe(read(&board), &[]);
                }
            })
            .build();
    };
    gauge("connector-count", |b| b.all().len() as f64);
    gauge("task-count", |b| {
        b.all().iter().map(|c| c.tasks.len()).sum::<usize>() as f64
    });
    let startups = Arc::clone(&board.telemetry().startups);
    type Read = fn(&StartupCounters) -> &AtomicU64;
    let counters: [(&'static str, Read); 6] = [
        ("connector-startup-attempts-total", |s| {
            &s.connector_attempts
        }),
        ("connector-startup-success-total", |s| {
            &s.connector_successes
        }),
        ("connector-startup-failure-total", |s| &s.connector_failures),
        ("task-startup-attempts-total", |s| &s.task_attempts),
        ("task-startup-success-total", |s| &s.task_successes),
        ("task-startup-failure-total", |s| &s.task_failures),
    ];
    for (name, read) in counters {
        let startups = Arc::clone(&startups);
        meter
            .u64_observable_counter(instrument_name(GROUP_WORKER, name))
            .with_description(help_of(name))
            .with_callback(move |o| o.observe(read(&startups).load(Ordering::Relaxed), &[]))
            .build();
    }
    let percentages: [(&'static str, Read, Read); 4] = [
        (
            "connector-startup-success-percentage",
            |s| &s.connector_successes,
            |s| &s.connector_failures,
        ),
        (
            "connector-startup-failure-percentage",
            |s| &s.connector_failures,
            |s| &s.connector_successes,
        ),
        (
            "task-startup-success-percentage",
            |s| &s.task_successes,
            |s| &s.task_failures,
        ),
        (
            "task-startup-failure-percentage",
            |s| &s.task_failures,
            |s| &s.task_successes,
        ),
    ];
    for (name, part, other) in percentages {
        let startups = Arc::clone(&startups);
        meter
            .f64_observable_gauge(instrument_name(GROUP_WORKER, name))
            .with_unit("%")
            .with_description(help_of(name))
            .with_callback(move |o| {
                let v = percentage(part(&startups), other(&startups)).unwrap_or(0.0);
                o.observe(v, &[]);
            })
            .build();
    }
    type Count = fn(State) -> bool;
    let per_connector: [(&'static str, Count); 5] = [
        ("connector-total-task-count", |_| true),
        ("connector-running-task-count", |s| s == State::Running),
        ("connector-failed-task-count", |s| s == State::Failed),
        ("connector-restarting-task-count", |s| {
            s == State::Restarting
        }),
        ("connector-unassigned-task-count", |s| {
            s == State::Unassigned
        }),
    ];
    for (name, wanted) in per_connector {
        let weak = board.downgrade();
        meter
            .u64_observable_gauge(instrument_name(GROUP_WORKER, name))
            .with_description(help_of(name))
            .with_callback(move |o| {
                let Some(board) = weak.upgrade() else { return };
                for (_, labels, tasks) in board.metric_view() {
                    let n = tasks.iter().filter(|(_, s, _)| wanted(*s)).count();
                    o.observe(n as u64, &labels.of_connector());
                }
            })
            .build();
    }
}

fn help_of(name: &str) -> &'static str {
    OTHER_METRICS
        .iter()
        .find(|m| m.group == GROUP_WORKER && m.name == name)
        .map_or("", |m| m.help)
}

/// The labels of a task's series (used when binding its histograms).
pub fn task_labels(labels: &ConnectorLabels, task: u32) -> Vec<KeyValue> {
    labels.of_task(task)
}

/// Every metric as (Prometheus name, kind), for the documentation and dashboard tests.
pub fn all_prometheus_names() -> Vec<(String, &'static str)> {
    let mut names: Vec<(String, &'static str)> = task_metrics()
        .iter()
        .map(|m| {
            let kind = if m.kind == Kind::Counter {
                "counter"
            } else {
                "gauge"
            };
            (prometheus_name(m.group, m.name), kind)
        })
        .collect();
    names.extend(
        HISTOGRAMS
            .iter()
            .map(|(name, ..)| (prometheus_name(GROUP_SINK_TASK, name), "histogram")),
    );
    names.extend(OTHER_METRICS.iter().map(|m| {
        let kind = if m.kind == Kind::Counter {
            "counter"
        } else {
            "gauge"
        };
        (prometheus_name(m.group, m.name), kind)
    }));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_connect_groups_and_convert_for_prometheus() {
        assert_eq!(
            prometheus_name("sink-task-metrics", "sink-record-read-total"),
            "kafka_connect_sink_task_metrics_sink_record_read_total"
        );
        let names = all_prometheus_names();
        let distinct: HashSet<&String> = names.iter().map(|(n, _)| n).collect();
        assert_eq!(distinct.len(), names.len(), "every name is unique");
    }

    #[test]
    fn windowed_average_and_maximum_cover_two_samples_then_age_out() {
        let w = Windowed::default();
        let t0 = Instant::now();
        assert_eq!(w.read(t0), None, "no samples: nothing to report");
        w.record(10.0, t0);
        w.record(30.0, t0 + Duration::from_secs(1));
        assert_eq!(w.read(t0 + Duration::from_secs(2)), Some((20.0, 30.0)));
        // A new sample starts after 30 s; the previous one still counts.
        w.record(2.0, t0 + Duration::from_secs(31));
        assert_eq!(w.read(t0 + Duration::from_secs(32)), Some((14.0, 30.0)));
        // Both samples are older than two windows.
        assert_eq!(w.read(t0 + Duration::from_secs(95)), None);
    }

    #[test]
    fn rates_are_per_second_over_the_window() {
        let r = Rates::default();
        let t0 = Instant::now();
        assert_eq!(r.rate("x", 100, t0), 0.0, "one sample: no rate yet");
        let rate = r.rate("x", 300, t0 + Duration::from_secs(2));
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        // After the window, old samples drop out and the rate follows the recent slope.
        for s in 3..=40 {
            r.rate("x", 300 + (s - 2) * 10, t0 + Duration::from_secs(s));
        }
        let rate = r.rate("x", 300 + 39 * 10, t0 + Duration::from_secs(41));
        assert!((rate - 10.0).abs() < 1e-9, "{rate}");
    }

    /// A board with one share connector (tenant `acme`) and one task, its metrics exported
    /// as Prometheus text.
    struct Exported {
        registry: prometheus::Registry,
        _provider: opentelemetry_sdk::metrics::SdkMeterProvider,
        board: StatusBoard,
        task: Arc<crate::status::TaskCounters>,
    }

    fn exported() -> Exported {
        use opentelemetry::metrics::MeterProvider as _;
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .without_counter_suffixes()
            .scope_info_enabled(false)
            .build()
            .expect("exporter");
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(exporter)
            .build();
        let board = StatusBoard::default();
        register(&provider.meter("spillway"), &board);
        board.connector_started("c", "share (default)".into(), "connect-c".into());
        let labels = ConnectorLabels {
            tenant: "acme".into(),
            connector: "c".into(),
            mode: "share",
            connector_class: "file".into(),
            connector_version: "1.0".into(),
        };
        board.set_labels("c", labels.clone());
        let task = board.task_counters("c", 0);
        task.metrics
            .bind(board.telemetry(), &task_labels(&labels, 0));
        board.set_task("c", 0, State::Running, None);
        Exported {
            registry,
            _provider: provider,
            board,
            task,
        }
    }

    /// The value of the sample `name` of tenant `acme` (the one task), or the unlabelled one.
    fn sample(registry: &prometheus::Registry, name: &str) -> Option<f64> {
        use prometheus::Encoder as _;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .expect("encodes");
        let text = String::from_utf8(out).expect("utf-8");
        text.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{').unwrap_or((series, ""));
            let wanted = labels.is_empty() || labels.contains("tenant=\"acme\"");
            (n == name && wanted).then(|| value.parse().expect("a number"))
        })
    }

    fn record(offset: i64, delivery_count: u16, age_ms: i64) -> RawRecord {
        let mut r = RawRecord::new("t", 0, offset);
        r.delivery_count = Some(delivery_count);
        r.timestamp = Some(now_epoch_ms() - age_ms);
        r
    }

    fn ack(offset: i64, disposition: Disposition) -> Ack {
        Ack {
            record: RecordCoordinates::new("t".to_owned(), 0, offset),
            disposition,
            implicit: false,
        }
    }

    #[test]
    fn a_committed_share_batch_is_counted_and_measured_per_record() {
        let e = exported();
        let m = &e.task.metrics;
        m.task_starting();
        let now = Instant::now();
        let records = [record(0, 1, 40), record(1, 2, 40), record(2, 1, 40)];
        crate::status::TaskCounters::add(&e.task.read, 3);
        let meta = m.polled(
            &records,
            vec![
                now + Duration::from_secs(10),
                now + Duration::from_secs(10),
                now - Duration::from_secs(1),
            ],
        );
        assert_eq!(
            sample(
                &e.registry,
                "kafka_connect_sink_task_metrics_sink_record_active_count"
            ),
            Some(3.0)
        );
        let acks = [
            ack(0, Disposition::Accept),
            ack(1, Disposition::Release),
            ack(2, Disposition::Accept),
        ];
        // Offset 2's lock ran out before the commit: its ACCEPT is not applied.
        let unapplied = [acks[2].record.clone()];
        m.committed(
            &[(&acks, Some(meta))],
            &CommitOutcome {
                started: now,
                elapsed: Duration::from_millis(7),
                all_applied: false,
                unapplied: &unapplied,
                expired: &[],
                delivery_attempt_limit: 2,
            },
        );
        let get = |name: &str| sample(&e.registry, &prometheus_name(GROUP_SINK_TASK, name));
        assert_eq!(get("sink-record-read-total"), Some(3.0));
        assert_eq!(get("sink-record-acquired-total"), Some(3.0));
        assert_eq!(get("sink-record-redelivered-total"), Some(1.0));
        assert_eq!(
            get("sink-record-archived-by-limit-total"),
            Some(1.0),
            "released at delivery 2 of 2"
        );
        assert_eq!(get("sink-record-lock-expired-total"), Some(1.0));
        assert_eq!(get("sink-record-active-count"), Some(0.0));
        assert_eq!(get("offset-commit-skip-total"), Some(1.0));
        assert_eq!(get("offset-commit-completion-total"), Some(0.0));
        assert_eq!(
            get("sink-record-lock-margin-ms_count"),
            Some(3.0),
            "every acknowledgement sent"
        );
        let margin_sum = get("sink-record-lock-margin-ms_sum").expect("a sum");
        assert!(
            (margin_sum - 20_000.0).abs() < 1.0,
            "two 10 s margins and one 0: {margin_sum}"
        );
        assert_eq!(
            get("sink-record-e2e-latency-ms_count"),
            Some(1.0),
            "only the applied ACCEPT"
        );
        assert!(get("sink-record-e2e-latency-ms_sum").expect("a sum") >= 40.0);
        assert_eq!(get("ack-commit-time-ms_count"), Some(1.0));
        let status = |group: &str| sample(&e.registry, &prometheus_name(group, "status"));
        assert_eq!(status(GROUP_TASK), Some(1.0));
        assert_eq!(status(GROUP_CONNECTOR), Some(1.0));
        let worker = |name: &str| sample(&e.registry, &prometheus_name(GROUP_WORKER, name));
        assert_eq!(worker("connector-count"), Some(1.0));
        assert_eq!(worker("task-count"), Some(1.0));
        assert_eq!(worker("task-startup-attempts-total"), Some(1.0));
    }

    #[test]
    fn put_times_and_errors_reach_their_groups() {
        let e = exported();
        let m = &e.task.metrics;
        m.put_done(Duration::from_millis(4), 0);
        m.put_done(Duration::from_millis(8), 2);
        m.retried(2);
        m.conversion_failed();
        m.record_error(true, true);
        m.dead_letters_written(1, 0);
        let get = |group: &str, name: &str| sample(&e.registry, &prometheus_name(group, name));
        assert_eq!(get(GROUP_SINK_TASK, "put-batch-avg-time-ms"), Some(6.0));
        assert_eq!(get(GROUP_SINK_TASK, "put-batch-max-time-ms"), Some(8.0));
        assert_eq!(get(GROUP_SINK_TASK, "put-batch-time-ms_count"), Some(2.0));
        assert_eq!(get(GROUP_ERRORS, "total-record-failures"), Some(3.0));
        assert_eq!(get(GROUP_ERRORS, "total-record-errors"), Some(1.0));
        assert_eq!(get(GROUP_ERRORS, "total-records-skipped"), Some(1.0));
        assert_eq!(get(GROUP_ERRORS, "total-retries"), Some(2.0));
        assert_eq!(get(GROUP_ERRORS, "total-errors-logged"), Some(1.0));
        assert_eq!(
            get(GROUP_ERRORS, "deadletterqueue-produce-requests"),
            Some(1.0)
        );
        let last = get(GROUP_ERRORS, "last-error-timestamp").expect("set");
        assert!((last - now_epoch_ms() as f64).abs() < 60_000.0, "{last}");
        // Without samples an average has nothing to report.
        assert_eq!(get(GROUP_TASK, "offset-commit-avg-time-ms"), None);
        drop(e.board);
    }

    #[test]
    fn metrics_stop_once_the_worker_is_gone() {
        let e = exported();
        assert!(sample(
            &e.registry,
            "kafka_connect_connect_worker_metrics_task_count"
        )
        .is_some());
        let Exported {
            registry,
            board,
            task,
            _provider,
        } = e;
        drop((board, task));
        assert_eq!(
            sample(&registry, "kafka_connect_connect_worker_metrics_task_count"),
            None
        );
    }
}
