//! What distributed mode adds to the herder: the group decides what runs where, statuses of
//! what runs elsewhere come from the status topic, and task counts from the leader's commits.

use std::sync::Arc;

use spillway_actors::Worker;
use spillway_connectors::ConnectorRegistry;
use spillway_storage::kafka_store::StatusKey;
use spillway_storage::{ConnectorRecord, StateStore};

use super::{key, lock, runtime_key, to_state_name, Herder, HerderError, StateInfo, TaskState};
use crate::distributed::ClusterLink;

impl Herder {
    /// A herder of a distributed worker: its store is the cluster's (in Kafka), and what runs
    /// here is what the group assigns ([`crate::distributed`]), not what the REST calls ask.
    pub fn distributed(
        worker: Worker,
        link: Arc<ClusterLink>,
        registry: ConnectorRegistry,
        worker_id: String,
    ) -> Result<Herder, HerderError> {
        let store: Arc<dyn StateStore> = Arc::clone(link.store()) as Arc<dyn StateStore>;
        let mut herder = Herder::new(worker, store, registry, worker_id)?;
        herder.cluster = Some(link);
        Ok(herder)
    }

    /// Distributed mode's link to the group; `None` for a single worker.
    pub fn cluster(&self) -> Option<&Arc<ClusterLink>> {
        self.cluster.as_ref()
    }

    /// Distributed mode: how many task configs the leader committed for the connector.
    pub(super) fn committed_tasks(&self, tenant: &str, name: &str) -> usize {
        self.cluster.as_ref().map_or(0, |c| {
            c.store()
                .configs()
                .view()
                .connectors
                .get(&key(tenant, name))
                .map_or(0, |s| s.tasks.len())
        })
    }

    /// Distributed mode: a running connector's status, from this worker for what runs here
    /// and from the status topic for what runs elsewhere.
    pub(super) fn cluster_running_status(
        &self,
        tenant: &str,
        name: &str,
        record: &ConnectorRecord,
    ) -> (StateInfo, Vec<TaskState>) {
        let runtime = runtime_key(tenant, name);
        let connector_key = key(tenant, name);
        let statuses = self
            .cluster
            .as_ref()
            .map(|c| c.store().statuses().view().statuses)
            .unwrap_or_default();
        let redact = |t: Option<String>| t.map(|t| self.redact(&record.config, &t));
        let local = self.worker.status(&runtime);
        let failure = lock(&self.failures).get(&runtime).cloned();
        let owns = self
            .cluster
            .as_ref()
            .is_some_and(|c| c.owns_connector(&runtime));
        let connector = match (owns, failure, &local) {
            (true, Some(trace), _) => StateInfo {
                state: "FAILED".into(),
                worker_id: self.worker_id.clone(),
                trace: Some(trace),
                group_settings: None,
            },
            (true, None, Some(status)) => StateInfo {
                state: to_state_name(status.state),
                worker_id: self.worker_id.clone(),
                trace: redact(status.trace.clone()),
                group_settings: status.group_settings.clone(),
            },
            _ => match statuses.get(&StatusKey::Connector(connector_key.clone())) {
                Some(s) => StateInfo {
                    state: s.state.clone(),
                    worker_id: s.worker_id.clone(),
                    trace: redact(s.trace.clone()),
                    group_settings: None,
                },
                None => StateInfo {
                    state: "UNASSIGNED".into(),
                    worker_id: self.worker_id.clone(),
                    trace: None,
                    group_settings: None,
                },
            },
        };
        let tasks = (0..self.committed_tasks(tenant, name) as u32)
            .map(|id| {
                let here = local
                    .as_ref()
                    .and_then(|s| s.tasks.iter().find(|t| t.id == id));
                match here {
                    Some(t) => TaskState {
                        id,
                        state: to_state_name(t.state),
                        worker_id: self.worker_id.clone(),
                        trace: redact(t.trace.clone()),
                    },
                    None => match statuses.get(&StatusKey::Task(connector_key.clone(), id)) {
                        Some(s) => TaskState {
                            id,
                            state: s.state.clone(),
                            worker_id: s.worker_id.clone(),
                            trace: redact(s.trace.clone()),
                        },
                        None => TaskState {
                            id,
                            state: "UNASSIGNED".into(),
                            worker_id: self.worker_id.clone(),
                            trace: None,
                        },
                    },
                }
            })
            .collect();
        (connector, tasks)
    }

    /// Distributed mode: the worker (Connect's host:port worker id) the status topic names
    /// as running task `task`, if another.
    pub fn task_owner(&self, tenant: &str, name: &str, task: u32) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        let statuses = cluster.store().statuses().view().statuses;
        statuses
            .get(&StatusKey::Task(key(tenant, name), task))
            .map(|s| s.worker_id.clone())
            .filter(|w| *w != self.worker_id)
    }
}
