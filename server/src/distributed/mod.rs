//! Distributed mode's worker: the pieces that join a worker to its cluster.
//!
//! - [`ClusterLink`]: what the herder and the REST API need to know of the group — the
//!   cluster's state store (the config and status topics), who leads, what this worker was
//!   assigned — and the bell that wakes the reconciler after a change.
//! - [`Reconciler`]: one task per worker. It reads the config topic (every
//!   [`REFRESH_INTERVAL`] and after every change this worker writes), takes the group's
//!   assignments, and makes the worker's runtime run exactly the assigned connectors and tasks
//!   whose target state is RUNNING, with their latest configuration. The leader also writes
//!   each connector's task configs (with the commit record) and asks for a rebalance when the
//!   configured work changed.
//!
//! Only the leader writes configs (the REST API of the others forwards writes to it, see
//! `rest::forward`), so its checks — quotas, names, validation — see every earlier change.

mod reconcile;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use spillway_core::ConfigMap;
use spillway_kafka::admin::AdminClient;
use spillway_kafka::cluster::Cluster;
use spillway_kafka::security::SecuritySettings;
use spillway_kafka::worker_group::{
    Allocation, TaskId, WorkerCapacity, WorkerGroupConfig, WorkerHost,
};
use spillway_storage::kafka_store::{
    ConfigView, KafkaConfigStore, KafkaStateStore, KafkaStatusStore, StatusKey, StoreTopic,
};
use spillway_storage::{ConnectorKey, TargetState};
use tokio::sync::Notify;

pub use reconcile::{Reconciler, ReconcilerHandle};

use crate::distributed_config::{DistributedConfig, StorageTopic};

/// How often every worker reads the config topic for changes other workers made.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// How long one read of a state topic to its end may take.
const STORE_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests of the worker's own Kafka clients (admin, group member).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// What this worker knows of its place in the group.
#[derive(Debug, Clone, Default)]
pub struct Role {
    pub generation: i32,
    pub leader: bool,
    /// The leader's REST URL; `None` before the first assignment and after losing the group.
    pub leader_url: Option<String>,
    /// What the group gave this worker to run.
    pub allocation: Allocation,
    /// Every live worker with its `tasks.max.per.worker`, as of the last assignment.
    pub workers: Vec<WorkerCapacity>,
    /// Tasks the leader found no room for in the last assignment.
    pub unassigned: Allocation,
}

impl Role {
    /// The live workers' task caps, for the cluster-wide check; `None` when the cluster's
    /// capacity is unknown (no assignment yet, or a worker that states no cap): the worker
    /// then checks its own cap, as a single worker does.
    pub fn worker_caps(&self) -> Option<Vec<u64>> {
        if self.workers.is_empty() {
            return None;
        }
        self.workers.iter().map(|w| w.max_tasks).collect()
    }
}

/// The herder's and the REST API's view of the group; see the module docs.
pub struct ClusterLink {
    store: Arc<KafkaStateStore>,
    /// This worker's REST URL, sent to the group.
    url: String,
    wake: Notify,
    role: Mutex<Role>,
}

impl std::fmt::Debug for ClusterLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterLink")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ClusterLink {
    pub fn new(store: Arc<KafkaStateStore>, url: String) -> ClusterLink {
        ClusterLink {
            store,
            url,
            wake: Notify::new(),
            role: Mutex::new(Role::default()),
        }
    }

    /// The cluster's state in Kafka.
    pub fn store(&self) -> &Arc<KafkaStateStore> {
        &self.store
    }

    /// This worker's REST URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Something was written: the reconciler reads the config topic and acts at once.
    pub fn changed(&self) {
        self.wake.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Role> {
        // Replaced whole; a panic elsewhere cannot leave it half written.
        self.role.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn role(&self) -> Role {
        self.lock().clone()
    }

    pub(crate) fn set_role(&self, role: Role) {
        *self.lock() = role;
    }

    pub fn is_leader(&self) -> bool {
        self.lock().leader
    }

    /// Where writes go; `None` while the worker has no assignment (joining, rebalancing
    /// after losing the group): the REST API answers 409 then, as Connect does.
    pub fn leader_url(&self) -> Option<String> {
        self.lock().leader_url.clone()
    }

    /// Whether this worker runs the connector `runtime` (`tenant/name`) itself — the
    /// instance whose status the cluster shows — as opposed to only some of its tasks.
    pub fn owns_connector(&self, runtime: &str) -> bool {
        self.lock().allocation.connectors.contains(runtime)
    }
}

/// A clean stop (SIGTERM), after this worker's connectors and tasks stopped and before it
/// leaves the group: marks what it was assigned UNASSIGNED under its own id, as Connect's
/// worker does, so that no status shows RUNNING on a worker that is gone while its work is
/// held. The next owner's status (a newer generation) replaces it.
pub async fn mark_unassigned_on_stop(link: &ClusterLink) {
    let role = link.role();
    let store = link.store();
    let connectors = store.configs().view().connectors;
    let known = |runtime: &str| {
        runtime
            .split_once('/')
            .map(|(tenant, name)| ConnectorKey::new(tenant, name))
            .filter(|key| connectors.contains_key(key))
    };
    let mut statuses = Vec::new();
    for runtime in &role.allocation.connectors {
        if let Some(key) = known(runtime) {
            statuses.push((
                StatusKey::Connector(key),
                store.status("UNASSIGNED", None, 0),
            ));
        }
    }
    for task in &role.allocation.tasks {
        if let Some(key) = known(&task.connector) {
            statuses.push((
                StatusKey::Task(key, task.task),
                store.status("UNASSIGNED", None, 0),
            ));
        }
    }
    if statuses.is_empty() {
        return;
    }
    match store.statuses().put_all(&statuses).await {
        Ok(()) => tracing::info!(
            statuses = statuses.len(),
            "marked this worker's connectors and tasks UNASSIGNED"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "cannot mark this worker's connectors and tasks UNASSIGNED; their statuses show RUNNING here until their next owner writes")
        }
    }
}

/// The work the config topic describes: every connector (whatever its target state, so that
/// its status has an owner) and the committed tasks of those not STOPPED.
pub fn configured_work(view: &ConfigView) -> Allocation {
    let mut work = Allocation::default();
    for (key, state) in &view.connectors {
        let name = runtime_key(&key.tenant, &key.name);
        if state.target_state != TargetState::Stopped {
            for task in 0..state.tasks.len() as u32 {
                work.tasks.insert(TaskId::new(name.clone(), task));
            }
        }
        work.connectors.insert(name);
    }
    work
}

/// `tenant/name`: the connector's name in the worker's runtime and in the group's
/// assignments (the herder's runtime key).
pub fn runtime_key(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

/// The task ids of connector `runtime` in `allocation`.
pub fn tasks_of(allocation: &Allocation, runtime: &str) -> BTreeSet<u32> {
    allocation
        .tasks
        .iter()
        .filter(|t| t.connector == runtime)
        .map(|t| t.task)
        .collect()
}

/// What the group member asks of this worker.
pub(crate) struct Host {
    link: Arc<ClusterLink>,
    /// The work last handed to the assignor (as leader): a change means a rebalance is due.
    offered: Mutex<Option<Allocation>>,
    /// This worker's `tasks.max.per.worker`.
    max_tasks: u64,
}

impl Host {
    pub(crate) fn new(link: Arc<ClusterLink>, max_tasks: u64) -> Host {
        Host {
            link,
            offered: Mutex::new(None),
            max_tasks,
        }
    }

    /// Whether the configured work differs from what the last assignment was computed from.
    pub(crate) fn work_changed(&self, now: &Allocation) -> bool {
        self.offered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|offered| offered != now)
    }
}

impl WorkerHost for Host {
    fn url(&self) -> String {
        self.link.url.clone()
    }

    fn config_offset(&self) -> i64 {
        self.link.store.configs().offset()
    }

    fn max_tasks(&self) -> Option<u64> {
        Some(self.max_tasks)
    }

    fn configured_work(&self, at_least: i64) -> Option<(i64, Allocation)> {
        let view = self.link.store.configs().view();
        if view.offset < at_least {
            // Another worker has read further: read on, the group joins again.
            self.link.changed();
            return None;
        }
        let work = configured_work(&view);
        *self.offered.lock().unwrap_or_else(|e| e.into_inner()) = Some(work.clone());
        Some((view.offset, work))
    }
}

/// Where a state topic lives, from the worker's keys.
fn store_topic(config: &ConfigMap, topic: &StorageTopic, partitions: i32) -> StoreTopic {
    StoreTopic {
        bootstrap: config.get("bootstrap.servers").cloned().unwrap_or_default(),
        client: security_keys(config),
        topic: topic.name.clone(),
        partitions,
        replication_factor: topic.replication_factor,
        read_timeout: STORE_READ_TIMEOUT,
    }
}

/// The worker's top-level security keys: its own clients use them, as Connect's do.
fn security_keys(config: &ConfigMap) -> Vec<(String, String)> {
    config
        .iter()
        .filter(|(k, _)| spillway_kafka::security::is_security_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The worker's Kafka cluster with its security settings (the group member's own).
pub async fn connect(config: &ConfigMap, client_id: &str) -> Result<Arc<Cluster>> {
    let bootstrap = config.get("bootstrap.servers").cloned().unwrap_or_default();
    let security = SecuritySettings::from_config(config)
        .and_then(|s| s.client_security())
        .context("the worker's security settings")?;
    Cluster::connect_secured(&bootstrap, client_id, CLIENT_TIMEOUT, security)
        .await
        .with_context(|| format!("cannot reach the Kafka cluster at {bootstrap}"))
}

/// Opens the config and status topics (creating them compacted when missing) and reads them.
pub async fn open_link(
    config: &ConfigMap,
    distributed: &DistributedConfig,
    worker_id: String,
    url: String,
) -> Result<Arc<ClusterLink>> {
    let cluster = connect(config, &format!("spillway-worker-admin-{worker_id}")).await?;
    let admin = AdminClient::from_cluster(cluster);
    let configs =
        KafkaConfigStore::open(&admin, &store_topic(config, &distributed.config_topic, 1))
            .await
            .with_context(|| {
                format!(
                    "cannot open the config topic '{}'",
                    distributed.config_topic.name
                )
            })?;
    let statuses = KafkaStatusStore::open(
        &admin,
        &store_topic(
            config,
            &distributed.status_topic,
            distributed.status_topic.partitions,
        ),
    )
    .await
    .with_context(|| {
        format!(
            "cannot open the status topic '{}'",
            distributed.status_topic.name
        )
    })?;
    let store = KafkaStateStore::new(Arc::new(configs), Arc::new(statuses), worker_id)
        .context("cannot start the state store's thread")?;
    Ok(Arc::new(ClusterLink::new(Arc::new(store), url)))
}

/// The member's group settings from the worker's keys.
pub fn group_config(distributed: &DistributedConfig) -> WorkerGroupConfig {
    let mut group = WorkerGroupConfig::new(distributed.group_id.clone());
    group.session_timeout = distributed.session_timeout;
    group.heartbeat_interval = distributed.heartbeat_interval;
    group.rebalance_timeout = distributed.rebalance_timeout;
    group.scheduled_rebalance_max_delay = distributed.scheduled_rebalance_max_delay;
    group
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_storage::kafka_store::ConfigKey;

    fn view_with(connectors: &[(&str, &str, TargetState, usize)]) -> ConfigView {
        let mut view = ConfigView::default();
        let mut offset = 0;
        let mut put = |view: &mut ConfigView, key: ConfigKey, value: serde_json::Value| {
            view.apply(
                offset,
                Some(&key.encode()),
                Some(value.to_string().as_bytes()),
            );
            offset += 1;
        };
        for (tenant, name, state, tasks) in connectors {
            let key = ConnectorKey::new(*tenant, *name);
            put(
                &mut view,
                ConfigKey::TargetState(key.clone()),
                serde_json::json!({"state": state.as_str()}),
            );
            put(
                &mut view,
                ConfigKey::Connector(key.clone()),
                serde_json::json!({"config": {"tasks.max": tasks.to_string()}}),
            );
            for t in 0..*tasks {
                put(
                    &mut view,
                    ConfigKey::Task(key.clone(), t as u32),
                    serde_json::json!({"config": {}}),
                );
            }
            put(
                &mut view,
                ConfigKey::Commit(key),
                serde_json::json!({"tasks": tasks}),
            );
        }
        view
    }

    #[test]
    fn the_configured_work_is_every_connector_and_the_committed_tasks_of_those_not_stopped() {
        let view = view_with(&[
            ("default", "orders", TargetState::Running, 2),
            ("acme", "audit", TargetState::Paused, 1),
            ("acme", "old", TargetState::Stopped, 3),
        ]);
        assert!(view.unreadable.is_empty(), "{:?}", view.unreadable);
        let work = configured_work(&view);
        assert_eq!(
            work.connectors.iter().cloned().collect::<Vec<_>>(),
            vec!["acme/audit", "acme/old", "default/orders"]
        );
        let tasks: Vec<String> = work.tasks.iter().map(|t| t.to_string()).collect();
        assert_eq!(
            tasks,
            vec!["acme/audit-0", "default/orders-0", "default/orders-1"]
        );
        assert_eq!(tasks_of(&work, "default/orders"), BTreeSet::from([0, 1]));
        assert!(tasks_of(&work, "acme/old").is_empty());
    }
}
