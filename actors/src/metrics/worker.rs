//! The metrics observed per connector and for the worker rather than per task: connector and
//! task status (connector-metrics, connector-task-metrics), and connect-worker-metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;

use super::{
    instrument_name, percentage, Kind, StartupCounters, GROUP_CONNECTOR, GROUP_TASK, GROUP_WORKER,
};
use crate::status::{State, StatusBoard};

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

pub(super) fn register_statuses(meter: &Meter, board: &StatusBoard) {
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

pub(super) fn register_worker(meter: &Meter, board: &StatusBoard) {
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
