//! What the worker reports about its connectors and tasks: Connect's states (RUNNING, FAILED
//! with the error trace, ...) and counters per task. Actors update it as they go; readers
//! (the status API, the demo's progress line) take snapshots without asking any actor.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde::Serialize;

use crate::metrics::{ConnectorLabels, TaskMetrics, WorkerTelemetry};
use crate::share_group::GroupSettingsReport;

/// Connect's states, as the REST API spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    Unassigned,
    Running,
    Restarting,
    Failed,
    Stopped,
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            State::Unassigned => "UNASSIGNED",
            State::Running => "RUNNING",
            State::Restarting => "RESTARTING",
            State::Failed => "FAILED",
            State::Stopped => "STOPPED",
        })
    }
}

/// Live counters of one task, shared by its actors.
#[derive(Debug, Default)]
pub struct TaskCounters {
    /// Records polled from Kafka (Connect's sink-record-read-total).
    pub read: AtomicU64,
    /// Records handed to `put` (Connect's sink-record-send-total).
    pub put: AtomicU64,
    /// Verdicts that took effect (acknowledged and committed, or offsets committed past).
    pub accepted: AtomicU64,
    pub released: AtomicU64,
    pub rejected: AtomicU64,
    /// Records written to the dead letter queue.
    pub dead_lettered: AtomicU64,
    /// Records a transform dropped (acknowledged as handled).
    pub filtered: AtomicU64,
    /// Batches whose acknowledgements or offsets were committed without any failure.
    pub committed_batches: AtomicU64,
    /// Verdicts that did not take effect (lock or session lost): those records come again.
    pub ack_failures: AtomicU64,
    /// Everything else the metrics report about the task (docs/metrics.md).
    pub metrics: TaskMetrics,
}

impl TaskCounters {
    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            read: get(&self.read),
            put: get(&self.put),
            accepted: get(&self.accepted),
            released: get(&self.released),
            rejected: get(&self.rejected),
            dead_lettered: get(&self.dead_lettered),
            filtered: get(&self.filtered),
            committed_batches: get(&self.committed_batches),
            ack_failures: get(&self.ack_failures),
            archived_by_limit: get(&self.metrics.archived_by_limit),
        }
    }
}

/// A snapshot of [`TaskCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub read: u64,
    pub put: u64,
    pub accepted: u64,
    pub released: u64,
    pub rejected: u64,
    pub dead_lettered: u64,
    pub filtered: u64,
    pub committed_batches: u64,
    pub ack_failures: u64,
    /// Share mode: records released (or whose lock ran out) on their last allowed delivery,
    /// which the broker archives (`sink-record-archived-by-limit-total`).
    pub archived_by_limit: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.read += o.read;
        self.put += o.put;
        self.accepted += o.accepted;
        self.released += o.released;
        self.rejected += o.rejected;
        self.dead_lettered += o.dead_lettered;
        self.filtered += o.filtered;
        self.committed_batches += o.committed_batches;
        self.ack_failures += o.ack_failures;
        self.archived_by_limit += o.archived_by_limit;
    }
}

/// One task as the status API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TaskStatus {
    pub id: u32,
    pub state: State,
    /// The error that failed the task, when FAILED (or the last one, when RESTARTING).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Restarts in a row since the task last made progress.
    pub restarts: u32,
    /// Counters over the task's whole life, restarts included.
    pub counts: Counts,
}

/// One connector as the status API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectorStatus {
    pub name: String,
    pub state: State,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// `share`, `classic` or `consumer`, and where that came from.
    pub group_protocol: String,
    pub group_id: String,
    /// In share mode: the share group's configs in force and where each came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_settings: Option<GroupSettingsReport>,
    pub tasks: Vec<TaskStatus>,
}

impl ConnectorStatus {
    /// The counters of all tasks added up.
    pub fn totals(&self) -> Counts {
        let mut total = Counts::default();
        for t in &self.tasks {
            total += t.counts;
        }
        total
    }
}

#[derive(Debug)]
struct TaskEntry {
    state: State,
    trace: Option<String>,
    restarts: u32,
    counters: Arc<TaskCounters>,
}

#[derive(Debug)]
struct ConnectorEntry {
    state: State,
    trace: Option<String>,
    group_protocol: String,
    group_id: String,
    group_settings: Option<GroupSettingsReport>,
    tasks: BTreeMap<u32, TaskEntry>,
    /// How the connector's metrics are labelled; set once its plugin is known.
    labels: Option<Arc<ConnectorLabels>>,
}

/// One connector as the metrics see it: name, labels, and per task its id, state and counters.
pub type MetricView = (
    String,
    Arc<ConnectorLabels>,
    Vec<(u32, State, Arc<TaskCounters>)>,
);

/// The worker's status of every connector, shared between the actors and the API.
#[derive(Debug, Clone, Default)]
pub struct StatusBoard {
    inner: Arc<Mutex<BTreeMap<String, ConnectorEntry>>>,
    telemetry: Arc<WorkerTelemetry>,
}

/// A [`StatusBoard`] that does not keep the worker's state alive (held by metric callbacks).
#[derive(Debug, Clone)]
pub struct WeakStatusBoard {
    inner: Weak<Mutex<BTreeMap<String, ConnectorEntry>>>,
    telemetry: Weak<WorkerTelemetry>,
}

impl WeakStatusBoard {
    pub fn upgrade(&self) -> Option<StatusBoard> {
        Some(StatusBoard {
            inner: self.inner.upgrade()?,
            telemetry: self.telemetry.upgrade()?,
        })
    }
}

impl StatusBoard {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, ConnectorEntry>> {
        // Each update is one map operation; a panic elsewhere cannot leave it half done.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn connector_started(&self, name: &str, group_protocol: String, group_id: String) {
        self.lock().insert(
            name.to_owned(),
            ConnectorEntry {
                state: State::Running,
                trace: None,
                group_protocol,
                group_id,
                group_settings: None,
                tasks: BTreeMap::new(),
                labels: None,
            },
        );
    }

    pub fn telemetry(&self) -> &WorkerTelemetry {
        &self.telemetry
    }

    pub fn downgrade(&self) -> WeakStatusBoard {
        WeakStatusBoard {
            inner: Arc::downgrade(&self.inner),
            telemetry: Arc::downgrade(&self.telemetry),
        }
    }

    pub fn set_labels(&self, name: &str, labels: ConnectorLabels) {
        if let Some(c) = self.lock().get_mut(name) {
            c.labels = Some(Arc::new(labels));
        }
    }

    pub fn labels(&self, name: &str) -> Option<Arc<ConnectorLabels>> {
        self.lock().get(name).and_then(|c| c.labels.clone())
    }

    /// The connectors whose labels are set, with their tasks, for the metric readers.
    pub fn metric_view(&self) -> Vec<MetricView> {
        self.lock()
            .iter()
            .filter_map(|(name, c)| {
                let labels = c.labels.clone()?;
                let tasks = c
                    .tasks
                    .iter()
                    .map(|(id, t)| (*id, t.state, Arc::clone(&t.counters)))
                    .collect();
                Some((name.clone(), labels, tasks))
            })
            .collect()
    }

    pub fn set_connector(&self, name: &str, state: State, trace: Option<String>) {
        if let Some(c) = self.lock().get_mut(name) {
            c.state = state;
            c.trace = trace;
        }
    }

    /// The share group's settings in force, once the connector has set them up.
    pub fn set_group_settings(&self, name: &str, report: GroupSettingsReport) {
        if let Some(c) = self.lock().get_mut(name) {
            c.group_settings = Some(report);
        }
    }

    pub fn connector_removed(&self, name: &str) {
        self.lock().remove(name);
    }

    /// The counters of a task, created on first use and kept across its restarts.
    pub fn task_counters(&self, name: &str, task: u32) -> Arc<TaskCounters> {
        let mut board = self.lock();
        match board.get_mut(name) {
            Some(c) => Arc::clone(
                &c.tasks
                    .entry(task)
                    .or_insert_with(|| TaskEntry {
                        state: State::Unassigned,
                        trace: None,
                        restarts: 0,
                        counters: Arc::default(),
                    })
                    .counters,
            ),
            None => Arc::default(),
        }
    }

    pub fn set_task(&self, name: &str, task: u32, state: State, trace: Option<String>) {
        if let Some(t) = self
            .lock()
            .get_mut(name)
            .and_then(|c| c.tasks.get_mut(&task))
        {
            t.state = state;
            t.trace = trace;
        }
    }

    pub fn set_restarts(&self, name: &str, task: u32, restarts: u32) {
        if let Some(t) = self
            .lock()
            .get_mut(name)
            .and_then(|c| c.tasks.get_mut(&task))
        {
            t.restarts = restarts;
        }
    }

    pub fn remove_task(&self, name: &str, task: u32) {
        if let Some(c) = self.lock().get_mut(name) {
            c.tasks.remove(&task);
        }
    }

    pub fn get(&self, name: &str) -> Option<ConnectorStatus> {
        self.lock().get(name).map(|c| snapshot(name, c))
    }

    pub fn all(&self) -> Vec<ConnectorStatus> {
        self.lock().iter().map(|(n, c)| snapshot(n, c)).collect()
    }
}

fn snapshot(name: &str, c: &ConnectorEntry) -> ConnectorStatus {
    ConnectorStatus {
        name: name.to_owned(),
        state: c.state,
        trace: c.trace.clone(),
        group_protocol: c.group_protocol.clone(),
        group_id: c.group_id.clone(),
        group_settings: c.group_settings.clone(),
        tasks: c
            .tasks
            .iter()
            .map(|(id, t)| TaskStatus {
                id: *id,
                state: t.state,
                trace: t.trace.clone(),
                restarts: t.restarts,
                counts: t.counters.snapshot(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_survive_restarts_and_add_up_per_connector() {
        let board = StatusBoard::default();
        board.connector_started("c", "share (default)".into(), "connect-c".into());
        let a = board.task_counters("c", 0);
        TaskCounters::add(&a.accepted, 3);
        let again = board.task_counters("c", 0);
        TaskCounters::add(&again.accepted, 2);
        TaskCounters::add(&board.task_counters("c", 1).rejected, 1);
        board.set_task("c", 1, State::Failed, Some("boom".into()));
        let status = board.get("c").expect("registered");
        assert_eq!(status.totals().accepted, 5);
        assert_eq!(status.totals().rejected, 1);
        assert_eq!(status.tasks[1].state, State::Failed);
        assert_eq!(status.tasks[1].trace.as_deref(), Some("boom"));
        assert_eq!(
            serde_json::to_value(status.tasks[1].state).expect("serializes"),
            "FAILED"
        );
    }
}
