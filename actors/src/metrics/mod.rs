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
//!
//! A file per job: [`task`] (one task's counters and histograms, fed by the data path, and
//! the per-task metrics read from them), [`sampled`] (Kafka's windowed averages, maxima and
//! rates), [`telemetry`] (what the worker shares: startup counts, the histogram instruments),
//! [`worker`] (the connector- and worker-level metrics) and [`registry`] (registering every
//! instrument on a meter).

use opentelemetry::KeyValue;
use std::sync::atomic::{AtomicU64, Ordering};

mod registry;
mod sampled;
mod task;
mod telemetry;
mod worker;

pub use registry::register;
pub use sampled::{Rates, Windowed};
pub use task::{task_metrics, BatchMeta, CommitOutcome, TaskMetric, TaskMetrics, TaskView};
pub use telemetry::{Histograms, StartupCounters, WorkerTelemetry, HISTOGRAMS};
pub use worker::{OtherMetric, OTHER_METRICS};

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

fn percentage(part: &AtomicU64, other: &AtomicU64) -> Option<f64> {
    let (p, o) = (part.load(Ordering::Relaxed), other.load(Ordering::Relaxed));
    (p + o > 0).then(|| 100.0 * p as f64 / (p + o) as f64)
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
mod testing;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

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
}
