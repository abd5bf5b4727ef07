//! What the worker's tasks share for their metrics: the counts of connector and task starts
//! (connect-worker-metrics) and the histogram instruments, bound to each task's labels when it
//! starts.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use opentelemetry::metrics::{BoundHistogram, Histogram, Meter};

use super::{instrument_name, GROUP_SINK_TASK};

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
    pub(super) e2e_latency: Histogram<f64>,
    pub(super) lock_margin: Histogram<f64>,
    pub(super) ack_commit_time: Histogram<f64>,
    pub(super) put_batch_time: Histogram<f64>,
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
        "Share mode: time left on the acquisition lock of acknowledged records when their acknowledgements were sent (0 when it had run out). One value per lock deadline per commit: the records one ShareFetch acquired share a deadline, so a commit of one fetch's records adds one value.",
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
    pub(super) fn new(meter: &Meter) -> Histograms {
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
    pub(super) histograms: OnceLock<Histograms>,
}

/// One task's histograms, bound to its labels, and the worker's startup counters.
pub(super) struct Bound {
    pub(super) e2e_latency: BoundHistogram<f64>,
    pub(super) lock_margin: BoundHistogram<f64>,
    pub(super) ack_commit_time: BoundHistogram<f64>,
    pub(super) put_batch_time: BoundHistogram<f64>,
    pub(super) startups: Arc<StartupCounters>,
}

impl fmt::Debug for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Bound")
    }
}
