//! One task's metrics: the counters and histograms the data path feeds (once per batch, the
//! histograms per record), and the per-task metrics of the sink-task, connector-task and
//! task-error groups read from them when a reader collects.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;
use spillway_core::{Ack, Disposition, RawRecord, RecordCoordinates};

use super::telemetry::{Bound, WorkerTelemetry};
use super::{percentage, Kind, Rates, Windowed, GROUP_ERRORS, GROUP_SINK_TASK, GROUP_TASK};
use crate::status::Counts;

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
    /// Share mode; empty for classic records, which count as first deliveries.
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
        // Classic records carry no delivery count: none is kept for them (each counts as a
        // first delivery).
        let counted = records[0].delivery_count.is_some();
        let mut meta = BatchMeta {
            offsets: Vec::with_capacity(n),
            timestamps: Vec::with_capacity(n),
            delivery_counts: Vec::with_capacity(if counted { n } else { 0 }),
            lock_deadlines,
        };
        let mut redelivered = 0;
        for r in records {
            meta.offsets.push(r.offset);
            meta.timestamps.push(r.timestamp.unwrap_or(-1));
            if counted {
                let delivery_count = r.delivery_count.unwrap_or(1);
                redelivered += usize::from(delivery_count > 1);
                meta.delivery_counts.push(delivery_count);
            }
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
        let locked = batches
            .iter()
            .any(|(_, meta)| meta.as_ref().is_some_and(|m| !m.lock_deadlines.is_empty()));
        let now_ms = now_epoch_ms();
        if outcome.unapplied.is_empty() && !locked {
            // Every verdict took effect and no lock was held (classic mode): nothing expired
            // or was archived, so only the latencies of ACCEPT and REJECT are left to record,
            // when the instruments are bound. A loop of its own: the one below costs about
            // twice as much per record.
            let mut settled = 0;
            for (acks, meta) in batches {
                settled += acks.len();
                let Some(b) = bound else { continue };
                let Some(m) = meta.as_ref().filter(|m| m.offsets.len() == acks.len()) else {
                    continue;
                };
                for ((ack, offset), timestamp) in acks.iter().zip(&m.offsets).zip(&m.timestamps) {
                    if ack.record.offset == *offset
                        && *timestamp >= 0
                        && !matches!(ack.disposition, Disposition::Release)
                    {
                        b.e2e_latency
                            .record(now_ms.saturating_sub(*timestamp).max(0) as f64);
                    }
                }
            }
            self.active.fetch_sub(settled as i64, Ordering::Relaxed);
            return;
        }
        let unapplied: HashSet<&RecordCoordinates> = outcome.unapplied.iter().collect();
        let refused_expired: HashSet<&RecordCoordinates> = outcome.expired.iter().collect();
        let (mut settled, mut expired, mut archived) = (0usize, 0usize, 0usize);
        // The records of one ShareFetch response share a lock deadline, so they share a
        // margin: one value per deadline per commit (what the histogram counts).
        let mut margins_recorded: Vec<Instant> = Vec::new();
        for (acks, meta) in batches {
            settled += acks.len();
            let aligned = meta.as_ref().filter(|m| m.offsets.len() == acks.len());
            for (i, ack) in acks.iter().enumerate() {
                let m = aligned.filter(|m| m.offsets[i] == ack.record.offset);
                let applied = !unapplied.contains(&ack.record);
                let delivery_count =
                    m.map_or(1, |m| m.delivery_counts.get(i).copied().unwrap_or(1));
                let deadline = m.and_then(|m| m.lock_deadlines.get(i));
                if let (Some(b), Some(deadline)) = (bound, deadline) {
                    // Newest first: a batch's records come in fetch order.
                    if !margins_recorded.iter().rev().any(|d| d == deadline) {
                        margins_recorded.push(*deadline);
                        b.lock_margin
                            .record(millis(deadline.saturating_duration_since(outcome.started)));
                    }
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
        task_metric!(S, "put-batch-avg-time-ms", Gauge, "ms", "Average time of one put over the last 30-60 s.", |v| v.metrics.put_batch_time.read(v.now).map(|s| s.avg)),
        task_metric!(S, "put-batch-max-time-ms", Gauge, "ms", "Longest put over the last 30-60 s.", |v| v.metrics.put_batch_time.read(v.now).map(|s| s.max)),
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
        task_metric!(T, "batch-size-avg", Gauge, "{record}", "Average records per polled batch over the last 30-60 s.", |v| v.metrics.batch_size.read(v.now).map(|s| s.avg)),
        task_metric!(T, "batch-size-max", Gauge, "{record}", "Largest polled batch over the last 30-60 s.", |v| v.metrics.batch_size.read(v.now).map(|s| s.max)),
        task_metric!(T, "offset-commit-avg-time-ms", Gauge, "ms", "Average commit time over the last 30-60 s.", |v| v.metrics.commit_time.read(v.now).map(|s| s.avg)),
        task_metric!(T, "offset-commit-max-time-ms", Gauge, "ms", "Longest commit over the last 30-60 s.", |v| v.metrics.commit_time.read(v.now).map(|s| s.max)),
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use spillway_core::{Ack, Disposition, RawRecord, RecordCoordinates};

    use super::super::testing::{exported, sample};
    use super::super::{
        prometheus_name, GROUP_CONNECTOR, GROUP_ERRORS, GROUP_SINK_TASK, GROUP_TASK, GROUP_WORKER,
    };
    use super::*;

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

    /// Commits ACCEPT, RELEASE, ACCEPT for offsets 0 to 2 of `meta`; the last ACCEPT does not
    /// take effect (its lock ran out, or its partition was lost).
    fn commit_with_the_last_accept_unapplied(
        m: &TaskMetrics,
        meta: BatchMeta,
        started: Instant,
        delivery_attempt_limit: u16,
    ) {
        let acks = [
            ack(0, Disposition::Accept),
            ack(1, Disposition::Release),
            ack(2, Disposition::Accept),
        ];
        let unapplied = [acks[2].record.clone()];
        m.committed(
            &[(&acks, Some(meta))],
            &CommitOutcome {
                started,
                elapsed: Duration::from_millis(7),
                all_applied: false,
                unapplied: &unapplied,
                expired: &[],
                delivery_attempt_limit,
            },
        );
    }

    #[test]
    fn a_committed_classic_batch_only_settles_its_records() {
        let e = exported();
        let m = &e.task.metrics;
        m.task_starting();
        let mut untimed = record(3, 1, 0);
        untimed.timestamp = None;
        let records = [
            record(0, 1, 40),
            record(1, 1, 40),
            record(2, 1, 40),
            untimed,
        ];
        let meta = m.polled(&records, Vec::new());
        let acks = [
            ack(0, Disposition::Accept),
            ack(1, Disposition::Release),
            ack(
                2,
                Disposition::Reject {
                    reason: "bad".into(),
                },
            ),
            ack(3, Disposition::Accept),
        ];
        m.committed(
            &[(&acks, Some(meta))],
            &CommitOutcome {
                started: Instant::now(),
                elapsed: Duration::from_millis(3),
                all_applied: true,
                unapplied: &[],
                expired: &[],
                delivery_attempt_limit: 1,
            },
        );
        let get = |name: &str| sample(&e.registry, &prometheus_name(GROUP_SINK_TASK, name));
        assert_eq!(get("sink-record-active-count"), Some(0.0));
        assert_eq!(
            get("sink-record-archived-by-limit-total"),
            Some(0.0),
            "no delivery limit without acquisition locks"
        );
        assert_eq!(get("sink-record-lock-expired-total"), Some(0.0));
        assert_eq!(get("offset-commit-completion-total"), Some(1.0));
        assert_eq!(
            get("sink-record-e2e-latency-ms_count"),
            Some(2.0),
            "a latency per final verdict of a record with a timestamp: the ACCEPT and the REJECT"
        );
        let latency = get("sink-record-e2e-latency-ms_sum").expect("a sum");
        assert!(
            (80.0..60_000.0).contains(&latency),
            "two records 40 ms old: {latency}"
        );
    }

    #[test]
    fn classic_records_keep_no_delivery_counts_and_count_as_first_deliveries() {
        let e = exported();
        let m = &e.task.metrics;
        m.task_starting();
        let records: Vec<RawRecord> = (0..3)
            .map(|offset| {
                let mut r = record(offset, 1, 40);
                r.delivery_count = None;
                r
            })
            .collect();
        let meta = m.polled(&records, Vec::new());
        assert!(meta.delivery_counts.is_empty());
        assert_eq!(meta.offsets, [0, 1, 2]);
        // A partition lost before the commit: offset 2's verdict did not take effect, which
        // takes the path that reads each record's delivery count.
        commit_with_the_last_accept_unapplied(m, meta, Instant::now(), 1);
        let get = |name: &str| sample(&e.registry, &prometheus_name(GROUP_SINK_TASK, name));
        assert_eq!(get("sink-record-redelivered-total"), Some(0.0));
        assert_eq!(get("sink-record-archived-by-limit-total"), Some(0.0));
        assert_eq!(get("sink-record-e2e-latency-ms_count"), Some(1.0));
        assert_eq!(get("sink-record-active-count"), Some(0.0));
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
        // Offset 2's lock ran out before the commit: its ACCEPT is not applied.
        commit_with_the_last_accept_unapplied(m, meta, now, 2);
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
            Some(2.0),
            "one margin per lock deadline the commit's acknowledgements had"
        );
        let margin_sum = get("sink-record-lock-margin-ms_sum").expect("a sum");
        assert!(
            (margin_sum - 10_000.0).abs() < 1.0,
            "the 10 s margin of offsets 0 and 1, and 0 for offset 2: {margin_sum}"
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
    fn a_lock_margin_per_deadline_per_commit_and_a_latency_per_record() {
        let e = exported();
        let m = &e.task.metrics;
        let now = Instant::now();
        let (first, second) = (now + Duration::from_secs(4), now + Duration::from_secs(6));
        let commit = |batches: &[(&[Ack], Option<BatchMeta>)]| {
            m.committed(
                batches,
                &CommitOutcome {
                    started: now,
                    elapsed: Duration::from_millis(1),
                    all_applied: true,
                    unapplied: &[],
                    expired: &[],
                    delivery_attempt_limit: 5,
                },
            )
        };
        // Two batches, whose records two fetches acquired (two lock deadlines, interleaved).
        let one = [record(0, 1, 10), record(1, 1, 10), record(2, 1, 10)];
        let two = [record(3, 1, 10), record(4, 1, 10)];
        let meta_one = m.polled(&one, vec![first, first, second]);
        let meta_two = m.polled(&two, vec![second, first]);
        let acks_one = [
            ack(0, Disposition::Accept),
            ack(1, Disposition::Accept),
            ack(2, Disposition::Release),
        ];
        let acks_two = [ack(3, Disposition::Accept), ack(4, Disposition::Accept)];
        commit(&[(&acks_one, Some(meta_one)), (&acks_two, Some(meta_two))]);
        let get = |name: &str| sample(&e.registry, &prometheus_name(GROUP_SINK_TASK, name));
        assert_eq!(get("sink-record-lock-margin-ms_count"), Some(2.0));
        let sum = get("sink-record-lock-margin-ms_sum").expect("a sum");
        assert!((sum - 10_000.0).abs() < 1.0, "4 s and 6 s: {sum}");
        assert_eq!(
            get("sink-record-e2e-latency-ms_count"),
            Some(4.0),
            "every applied ACCEPT, not the RELEASE"
        );
        // The next commit's acknowledgements of the first fetch: its margin again.
        let three = [record(5, 1, 10)];
        let meta_three = m.polled(&three, vec![first]);
        commit(&[(&[ack(5, Disposition::Accept)], Some(meta_three))]);
        assert_eq!(get("sink-record-lock-margin-ms_count"), Some(3.0));
        assert_eq!(get("sink-record-e2e-latency-ms_count"), Some(5.0));
        let latency = get("sink-record-e2e-latency-ms_sum").expect("a sum");
        assert!(
            (50.0..50_000.0).contains(&latency),
            "five records 10 ms old: {latency}"
        );
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
}
