//! Connect's status answer, and the task statuses kept in the store: written each tick when
//! they changed (from memory, never re-reading the connector records), so a restarted worker
//! shows what its tasks last were.

use serde::Serialize;
use spillway_actors::share_group::GroupSettingsReport;
use spillway_storage::{ConnectorKey, TargetState, TaskRecord};

use super::{lock, runtime_key, split_runtime_key, to_state_name, Herder, HerderError};

/// The state of the connector instance in Connect's status answer.
#[derive(Debug, Clone, Serialize)]
pub struct StateInfo {
    pub state: String,
    pub worker_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Spillway's addition, in share mode: the share group's configs in force and where each
    /// came from (docs/runtime.md, "Share-group settings").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_settings: Option<GroupSettingsReport>,
}

/// One task in Connect's status answer.
#[derive(Debug, Clone, Serialize)]
pub struct TaskState {
    pub id: u32,
    pub state: String,
    pub worker_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

/// Connect's `ConnectorStateInfo`.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectorStateInfo {
    pub name: String,
    pub connector: StateInfo,
    pub tasks: Vec<TaskState>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl Herder {
    /// Connect's status answer.
    pub async fn status(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<ConnectorStateInfo, HerderError> {
        let record = self.record(tenant, name).await?;
        let runtime = runtime_key(tenant, name);
        let state = |state: String, trace: Option<String>| StateInfo {
            state,
            worker_id: self.worker_id.clone(),
            trace,
            group_settings: None,
        };
        let task = |id: u32, state: String, trace: Option<String>| TaskState {
            id,
            state,
            worker_id: self.worker_id.clone(),
            trace,
        };
        let mirror = (record.target_state == TargetState::Running)
            .then(|| self.mirrors.status(&runtime))
            .flatten();
        let (connector, tasks) = match (record.target_state, mirror) {
            // A mirror connector's flow part runs as one unit here: one task.
            (_, Some(mirror)) => {
                let trace = mirror.trace.map(|t| self.redact(&record.config, &t));
                (
                    state(mirror.state.into(), trace.clone()),
                    vec![task(0, mirror.state.into(), trace)],
                )
            }
            (TargetState::Stopped, None) => (state("STOPPED".into(), None), Vec::new()),
            (TargetState::Paused, None) => (
                state("PAUSED".into(), None),
                self.task_ids(tenant, name, &record)
                    .into_iter()
                    .map(|id| task(id, "PAUSED".into(), None))
                    .collect(),
            ),
            (TargetState::Running, None) if self.cluster.is_some() => {
                self.cluster_running_status(tenant, name, &record)
            }
            (TargetState::Running, None) => {
                let failure = lock(&self.failures).get(&runtime).cloned();
                match (failure, self.worker.status(&runtime)) {
                    (Some(trace), _) => (state("FAILED".into(), Some(trace)), Vec::new()),
                    (None, Some(status)) => (
                        StateInfo {
                            group_settings: status.group_settings,
                            ..state(
                                to_state_name(status.state),
                                status.trace.map(|t| self.redact(&record.config, &t)),
                            )
                        },
                        status
                            .tasks
                            .into_iter()
                            .map(|t| {
                                task(
                                    t.id,
                                    to_state_name(t.state),
                                    t.trace.map(|tr| self.redact(&record.config, &tr)),
                                )
                            })
                            .collect(),
                    ),
                    (None, None) => (state("UNASSIGNED".into(), None), Vec::new()),
                }
            }
        };
        let kind =
            if crate::mirror::connectors::MirrorConnector::of_config(&record.config).is_some() {
                "source"
            } else {
                "sink"
            };
        Ok(ConnectorStateInfo {
            name: name.to_owned(),
            connector,
            tasks,
            kind,
        })
    }

    /// Whether task `task` of the connector runs on this worker now.
    pub fn runs_task_here(&self, tenant: &str, name: &str, task: u32) -> bool {
        self.worker
            .status(&runtime_key(tenant, name))
            .is_some_and(|s| s.tasks.iter().any(|t| t.id == task))
    }

    /// Writes every task status again at the next persist (a new generation: the statuses
    /// must carry it).
    pub(crate) fn rewrite_statuses(&self) {
        lock(&self.persisted).clear();
    }

    pub async fn task_status(
        &self,
        tenant: &str,
        name: &str,
        task: u32,
    ) -> Result<TaskState, HerderError> {
        self.status(tenant, name)
            .await?
            .tasks
            .into_iter()
            .find(|t| t.id == task)
            .ok_or_else(|| HerderError::UnknownTask {
                connector: name.to_owned(),
                task,
            })
    }

    /// Writes the tasks' states, traces and restart counts to the store when they changed
    /// (all changes in one write, on a blocking thread: sled syncs it to disk).
    pub async fn persist_task_statuses(&self) -> Result<(), HerderError> {
        let mut changed = Vec::new();
        for status in self.worker.statuses() {
            let Some(key) = split_runtime_key(&status.name) else {
                continue;
            };
            // The configuration the runtime holds (the stored one): the store is only written
            // here, never read on each tick.
            let config = self
                .worker
                .connector_config(&status.name)
                .unwrap_or_default();
            for task in status.tasks {
                let record = TaskRecord {
                    state: to_state_name(task.state),
                    trace: task.trace.map(|t| self.redact(&config, &t)),
                    restarts: task.restarts,
                };
                if lock(&self.persisted).get(&(status.name.clone(), task.id)) != Some(&record) {
                    changed.push((status.name.clone(), key.clone(), task.id, record));
                }
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        let records: Vec<(ConnectorKey, u32, TaskRecord)> = changed
            .iter()
            .map(|(_, key, task, record)| (key.clone(), *task, record.clone()))
            .collect();
        let written = self
            .off_executor("write", move |store| store.put_tasks(&records))
            .await?;
        let mut persisted = lock(&self.persisted);
        for ((name, _, task, record), written) in changed.into_iter().zip(written) {
            if written {
                persisted.insert((name, task), record);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use spillway_core::config::config_map;
    use spillway_storage::{StateStore, TargetState};

    use super::super::test_store::{herder_on, CountingStore};
    use super::super::{key, DEFAULT_TENANT};

    #[tokio::test]
    async fn the_status_tick_writes_changed_statuses_without_reading_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CountingStore::open(dir.path(), Duration::ZERO, Duration::ZERO);
        // No broker answers here: the tasks fail to connect, which is a status to record.
        let herder = herder_on(&store);
        let file = dir.path().join("out.txt").display().to_string();
        herder
            .create(
                DEFAULT_TENANT,
                config_map(&[
                    ("connector.class", "file"),
                    ("topics", "t"),
                    ("file", &file),
                    ("tasks.max", "2"),
                ]),
                "files",
                TargetState::Running,
            )
            .await
            .expect("created");
        store.connector_reads.store(0, Ordering::SeqCst);
        for _ in 0..5 {
            herder.persist_task_statuses().await.expect("recorded");
        }
        assert_eq!(
            store.connector_reads.load(Ordering::SeqCst),
            0,
            "a status tick reads the configuration from memory, not from the store"
        );
        let recorded = store
            .inner
            .tasks(&key(DEFAULT_TENANT, "files"))
            .expect("tasks");
        assert_eq!(
            recorded.len(),
            2,
            "both tasks' statuses are recorded: {recorded:?}"
        );
    }
}
