//! [`Herder`]: Kafka Connect's name for the part of a worker that owns the connectors' life —
//! creating, reconfiguring, pausing, stopping, restarting — between the REST API, the durable
//! [`StateStore`] and the [`Worker`] that runs the tasks.
//!
//! Every change is written to the store before the worker acts on it and before the caller
//! gets an answer, so a worker killed at any moment comes back with what it last confirmed.
//! Changes are serialised by one lock; reads take none.
//!
//! Everything the herder hands out has the values of sensitive keys replaced by `[hidden]`
//! ([`secrets`]): configurations, task configurations, validation answers and messages.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use spillway_actors::consumer_settings::{ConsumerSettings, DEFAULT_MAX_POLL_RECORDS};
use spillway_actors::limits::TaskCost;
use spillway_actors::settings::{runtime_config_def, TaskSettings};
use spillway_actors::share_group::GroupSettingsReport;
use spillway_actors::{Confinement, OverridePolicy, RuntimeError, State, Worker};
use spillway_connectors::runtime_keys::TASK_ID;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{
    resolve_group_protocol, sink_connector::CONNECTOR_CLASS, validate_sink_connector, ConfigDef,
    ConfigKey, ConfigType, Importance, KeyInfo, SinkConnectorConfig, TopicSelection,
    ValidationReport,
};
use spillway_core::{ConfigError, ConfigMap};
use spillway_storage::kafka_store::StatusKey;
use spillway_storage::{
    ConnectorKey, ConnectorRecord, StateStore, StorageError, TargetState, TaskRecord,
};
use tracing::{info, warn};

use crate::distributed::ClusterLink;
use crate::secrets;
pub use crate::tenants::DEFAULT_TENANT;
use crate::tenants::{Quotas, TenantError, TenantInfo, Tenants};

/// How long reading committed offsets from Kafka may take.
const OFFSETS_TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong with a request to the herder; the REST layer maps each to a status code.
#[derive(Debug, thiserror::Error)]
pub enum HerderError {
    #[error("Connector {0} not found")]
    UnknownConnector(String),
    #[error("Task {task} of connector {connector} not found")]
    UnknownTask { connector: String, task: u32 },
    #[error("Connector {0} already exists")]
    ConnectorExists(String),
    /// The configuration has errors; the report holds them per key.
    #[error("Connector configuration is invalid and contains the following {} error(s):\n{}", .0.error_count, .0.errors().join("\n"))]
    InvalidConfig(Box<ValidationReport>),
    /// A request that cannot be done as asked (the message says why).
    #[error("{0}")]
    BadRequest(String),
    #[error("Unknown plugin '{name}'; this worker has {known}")]
    UnknownPlugin { name: String, known: String },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    /// A change would take a tenant over one of its quotas.
    #[error("Tenant {tenant} would exceed its quota {quota}={limit}: {detail}. Lower the request, stop or delete connectors, or ask the worker admin to raise the quota")]
    Quota {
        tenant: String,
        quota: &'static str,
        limit: u64,
        detail: String,
    },
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error("Tenant {tenant} still owns connectors ({}); delete them first, or delete the tenant with ?deleteConnectors=true to stop and delete them", .connectors.join(", "))]
    TenantHasConnectors {
        tenant: String,
        connectors: Vec<String>,
    },
    /// The request is valid but cannot be done in the connector's current state.
    #[error("{0}")]
    Conflict(String),
    #[error("cannot {action} the committed offsets of group '{group}' on {bootstrap}: {reason}")]
    Offsets {
        action: &'static str,
        group: String,
        bootstrap: String,
        reason: String,
    },
}

/// Connect's `ConnectorInfo`.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectorInfo {
    pub name: String,
    pub config: ConfigMap,
    pub tasks: Vec<TaskId>,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// Connect's `ConnectorTaskId`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskId {
    pub connector: String,
    pub task: u32,
}

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

/// One entry of `GET /connectors/{name}/tasks`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskInfo {
    pub id: TaskId,
    pub config: ConfigMap,
}

/// One entry of `GET /connector-plugins`.
#[derive(Debug, Clone, Serialize)]
pub struct PluginInfo {
    pub class: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub version: String,
}

/// The answer of `GET /connectors/{name}/offsets`.
#[derive(Debug, Clone, Serialize)]
pub struct Offsets {
    pub offsets: Vec<PartitionOffset>,
    /// Present when offsets cannot be given (share mode): says why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A sink connector's offset of one partition, in Connect's shape.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionOffset {
    pub partition: serde_json::Value,
    pub offset: serde_json::Value,
}

/// One entry of `PATCH /connectors/{name}/offsets`: a partition and its new offset; `None`
/// resets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetChange {
    pub topic: String,
    pub partition: i32,
    pub offset: Option<i64>,
}

/// The topics of a share-mode connector (share mode takes topic names only).
fn share_topics(parsed: &SinkConnectorConfig) -> Vec<String> {
    match &parsed.topics {
        TopicSelection::Names(names) => names.clone(),
        TopicSelection::Pattern(_) => Vec::new(),
    }
}

/// Connect's answers to a successful offsets change.
pub const OFFSETS_ALTERED: &str = "The offsets for this connector have been altered successfully";
pub const OFFSETS_RESET: &str = "The offsets for this connector have been reset successfully";

/// Which restarts a restart request asked for (KIP-745).
#[derive(Debug, Clone, Copy, Default)]
pub struct RestartRequest {
    pub include_tasks: bool,
    pub only_failed: bool,
}

/// The connectors of one worker, their configurations and target states.
pub struct Herder {
    worker: Worker,
    worker_config: ConfigMap,
    store: Arc<dyn StateStore>,
    registry: ConnectorRegistry,
    worker_id: String,
    /// Serialises changes so that the store and the worker see them in the same order.
    control: Arc<tokio::sync::Mutex<()>>,
    /// Why a connector that should run could not start (shown as FAILED until restarted).
    failures: Mutex<BTreeMap<String, String>>,
    /// The task records last written to the store, so unchanged statuses are not rewritten.
    persisted: Mutex<BTreeMap<(String, u32), TaskRecord>>,
    tenants: Tenants,
    /// The `tasks` quota a new tenant gets when none is given (`tenant.default.quota.tasks`).
    default_tasks: Option<u64>,
    /// Distributed mode: the group decides what runs here, and changes wake its reconciler.
    cluster: Option<Arc<ClusterLink>>,
}

/// Worker key: the `tasks` quota of a tenant created without one; empty: unlimited.
pub const TENANT_DEFAULT_QUOTA_TASKS: &str = "tenant.default.quota.tasks";
/// Its default: half the tasks one connector may have, so a new tenant cannot fill a worker
/// (whose default holds 48 tasks at an open-file limit of 1024) alone.
pub const DEFAULT_TENANT_TASKS: u64 = 32;

/// What a tenant's connectors take of its quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub connectors: u64,
    /// `tasks.max` of every connector not STOPPED.
    pub tasks: u64,
    #[serde(rename = "inflight.records")]
    pub inflight_records: u64,
    /// Bytes the tenant's running tasks hold between poll and commit now (a gauge).
    #[serde(rename = "inflight.bytes")]
    pub inflight_bytes: u64,
}

/// A tenant with what it uses (`GET /tenants/{tenant}`).
#[derive(Debug, Clone, Serialize)]
pub struct TenantDetails {
    #[serde(flatten)]
    pub tenant: TenantInfo,
    pub usage: Usage,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every use is one map operation; a panic elsewhere cannot leave a map half changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(tenant: &str, name: &str) -> ConnectorKey {
    ConnectorKey::new(tenant, name)
}

/// The connector's name in the worker: `tenant/name`. Tenant names hold no `/`, so the key
/// splits back at its first `/`, and two tenants' connectors of one name never meet.
fn runtime_key(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

fn split_runtime_key(key: &str) -> Option<ConnectorKey> {
    let (tenant, name) = key.split_once('/')?;
    Some(ConnectorKey::new(tenant, name))
}

fn to_state_name(state: State) -> String {
    state.to_string()
}

impl Herder {
    pub fn new(
        worker: Worker,
        store: Arc<dyn StateStore>,
        registry: ConnectorRegistry,
        worker_id: String,
    ) -> Result<Herder, HerderError> {
        let auth = worker
            .config()
            .get(crate::worker_cmd::REST_AUTH_ENABLED)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let confinement = Confinement::from_worker_config(worker.config(), auth)
            .map_err(|e| TenantError::Invalid(e.to_string()))?;
        let default_tasks = match worker.config().get(TENANT_DEFAULT_QUOTA_TASKS) {
            None => Some(DEFAULT_TENANT_TASKS),
            Some(text) if text.trim().is_empty() => None,
            Some(text) => Some(text.trim().parse::<u64>().map_err(|_| {
                TenantError::Invalid(format!(
                    "invalid value '{text}' for {TENANT_DEFAULT_QUOTA_TASKS}: expected a number of tasks (or an empty value for no default quota)"
                ))
            })?),
        };
        let tenants = Tenants::load(Arc::clone(&store), worker.override_policy(), confinement)?;
        Ok(Herder {
            worker_config: worker.config().clone(),
            worker,
            store,
            registry,
            worker_id,
            control: Arc::new(tokio::sync::Mutex::new(())),
            failures: Mutex::default(),
            persisted: Mutex::default(),
            tenants,
            default_tasks,
            cluster: None,
        })
    }

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

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The connector runtime this herder drives.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Why the connector runtime is broken, if it is (`/health`).
    pub fn runtime_failure(&self) -> Option<String> {
        self.worker.runtime_failure()
    }

    /// Takes the lock that serialises changes, for [`restore`](Self::restore): taken before
    /// the REST API serves, so that no change can come before the restore.
    pub async fn lock_for_restore(&self) -> tokio::sync::OwnedMutexGuard<()> {
        Arc::clone(&self.control).lock_owned().await
    }

    /// Starts every stored connector whose target state is RUNNING. A connector that cannot
    /// start shows as FAILED with the reason; the others start regardless. `_guard` (from
    /// [`lock_for_restore`](Self::lock_for_restore)) is held until every connector is back.
    pub async fn restore(
        &self,
        _guard: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<(), HerderError> {
        if self.cluster.is_some() {
            // The group's assignments start what runs here.
            return Ok(());
        }
        for (key, record) in self.store.connectors()? {
            secrets::remember(&record.config, &self.secret_keys(&record.config));
            let runtime = runtime_key(&key.tenant, &key.name);
            if !self.tenants.exists(&key.tenant) {
                warn!(tenant = %key.tenant, connector = %key.name, "the connector's tenant is gone; not starting it");
                continue;
            }
            for (task, stored) in self.store.tasks(&key)? {
                lock(&self.persisted).insert((runtime.clone(), task), stored);
            }
            info!(tenant = %key.tenant, connector = %key.name, target = %record.target_state, "restoring");
            if record.target_state == TargetState::Running {
                self.start(&key, record.config).await;
            }
        }
        Ok(())
    }

    /// Starts a connector in the worker, remembering a failure for the status API. In
    /// distributed mode the reconciler starts it where the group assigned it.
    async fn start(&self, key: &ConnectorKey, config: ConfigMap) {
        if let Some(cluster) = &self.cluster {
            cluster.changed();
            return;
        }
        self.launch(key, config).await
    }

    /// Starts a connector in this worker's runtime now.
    pub(crate) async fn launch(&self, key: &ConnectorKey, config: ConfigMap) {
        let runtime = runtime_key(&key.tenant, &key.name);
        lock(&self.failures).remove(&runtime);
        let scope = self.tenants.scope(&key.tenant);
        if let Err(e) = self
            .worker
            .start_tenant_connector(runtime, scope, config.clone())
            .await
        {
            self.failed(key, &config, &e);
        }
    }

    /// Logs why a connector cannot run and keeps it for the status API, secrets hidden.
    fn failed(&self, key: &ConnectorKey, config: &ConfigMap, error: &RuntimeError) {
        let message = self.redact(config, &error.to_string());
        warn!(tenant = %key.tenant, connector = %key.name, error = %message, "the connector cannot start");
        lock(&self.failures).insert(runtime_key(&key.tenant, &key.name), message);
    }

    /// Stops a connector in the worker if it runs there (in distributed mode: wherever it
    /// runs, through the reconcilers).
    async fn halt(&self, key: &ConnectorKey) -> Result<(), HerderError> {
        if let Some(cluster) = &self.cluster {
            cluster.changed();
            return Ok(());
        }
        self.shut(key).await
    }

    /// Stops a connector in this worker's runtime now.
    pub(crate) async fn shut(&self, key: &ConnectorKey) -> Result<(), HerderError> {
        let runtime = runtime_key(&key.tenant, &key.name);
        lock(&self.failures).remove(&runtime);
        match self.worker.stop_connector(&runtime).await {
            // A stopped runtime runs nothing: the connector is stopped already.
            Ok(()) | Err(RuntimeError::UnknownConnector(_)) | Err(RuntimeError::WorkerStopped) => {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The stored connector; a connector of another tenant is as unknown as a missing one.
    fn record(&self, tenant: &str, name: &str) -> Result<ConnectorRecord, HerderError> {
        self.store
            .connector(&key(tenant, name))?
            .ok_or_else(|| HerderError::UnknownConnector(name.to_owned()))
    }

    /// The names of the tenant's connectors, sorted.
    pub fn connector_names(&self, tenant: &str) -> Result<Vec<String>, HerderError> {
        Ok(self
            .store
            .connectors()?
            .into_iter()
            .filter(|(k, _)| k.tenant == tenant)
            .map(|(k, _)| k.name)
            .collect())
    }

    /// The configuration, secrets hidden.
    pub fn config(&self, tenant: &str, name: &str) -> Result<ConfigMap, HerderError> {
        Ok(self.masked(&self.record(tenant, name)?.config))
    }

    pub fn info(&self, tenant: &str, name: &str) -> Result<ConnectorInfo, HerderError> {
        let record = self.record(tenant, name)?;
        Ok(self.info_of(tenant, name, &record))
    }

    fn info_of(&self, tenant: &str, name: &str, record: &ConnectorRecord) -> ConnectorInfo {
        ConnectorInfo {
            name: name.to_owned(),
            config: self.masked(&record.config),
            tasks: self
                .task_ids(tenant, name, record)
                .into_iter()
                .map(|task| TaskId {
                    connector: name.to_owned(),
                    task,
                })
                .collect(),
            kind: "sink",
        }
    }

    /// The tasks a connector has: none when STOPPED (KIP-875), the running ones when RUNNING,
    /// those its plugin would make when PAUSED.
    fn task_ids(&self, tenant: &str, name: &str, record: &ConnectorRecord) -> Vec<u32> {
        match record.target_state {
            TargetState::Stopped => Vec::new(),
            TargetState::Running if self.cluster.is_some() => {
                (0..self.committed_tasks(tenant, name) as u32).collect()
            }
            TargetState::Running => self
                .worker
                .status(&runtime_key(tenant, name))
                .map(|s| s.tasks.iter().map(|t| t.id).collect())
                .unwrap_or_default(),
            TargetState::Paused => (0..self.task_count(&record.config) as u32).collect(),
        }
    }

    /// Distributed mode: how many task configs the leader committed for the connector.
    fn committed_tasks(&self, tenant: &str, name: &str) -> usize {
        self.cluster.as_ref().map_or(0, |c| {
            c.store()
                .configs()
                .view()
                .connectors
                .get(&key(tenant, name))
                .map_or(0, |s| s.tasks.len())
        })
    }

    /// How many tasks the connector's plugin makes of `config` (`tasks.max` at most).
    pub(crate) fn task_count(&self, config: &ConfigMap) -> usize {
        let Ok(parsed) = SinkConnectorConfig::parse(config) else {
            return 1;
        };
        // A stored tasks.max beyond the worker's limit (from an older version) must not make
        // the plugin allocate that many task configurations.
        let tasks_max = self.worker.limits().clamp_tasks(parsed.tasks_max);
        let Ok(mut plugin) = self.registry.create(&parsed.connector_class) else {
            return tasks_max;
        };
        if plugin.start(config).is_err() {
            return tasks_max;
        }
        let count = plugin
            .task_configs(tasks_max)
            .map(|c| c.len())
            .unwrap_or(tasks_max);
        plugin.stop();
        count
    }

    /// Connect's status answer.
    pub fn status(&self, tenant: &str, name: &str) -> Result<ConnectorStateInfo, HerderError> {
        let record = self.record(tenant, name)?;
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
        let (connector, tasks) = match record.target_state {
            TargetState::Stopped => (state("STOPPED".into(), None), Vec::new()),
            TargetState::Paused => (
                state("PAUSED".into(), None),
                self.task_ids(tenant, name, &record)
                    .into_iter()
                    .map(|id| task(id, "PAUSED".into(), None))
                    .collect(),
            ),
            TargetState::Running if self.cluster.is_some() => {
                self.cluster_running_status(tenant, name, &record)
            }
            TargetState::Running => {
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
        Ok(ConnectorStateInfo {
            name: name.to_owned(),
            connector,
            tasks,
            kind: "sink",
        })
    }

    /// Distributed mode: a running connector's status, from this worker for what runs here
    /// and from the status topic for what runs elsewhere.
    fn cluster_running_status(
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

    /// Whether task `task` of the connector runs on this worker now.
    pub fn runs_task_here(&self, tenant: &str, name: &str, task: u32) -> bool {
        self.worker
            .status(&runtime_key(tenant, name))
            .is_some_and(|s| s.tasks.iter().any(|t| t.id == task))
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

    /// Writes every task status again at the next persist (a new generation: the statuses
    /// must carry it).
    pub(crate) fn rewrite_statuses(&self) {
        lock(&self.persisted).clear();
    }

    pub fn task_status(
        &self,
        tenant: &str,
        name: &str,
        task: u32,
    ) -> Result<TaskState, HerderError> {
        self.status(tenant, name)?
            .tasks
            .into_iter()
            .find(|t| t.id == task)
            .ok_or_else(|| HerderError::UnknownTask {
                connector: name.to_owned(),
                task,
            })
    }

    /// The configuration of each task, as the connector splits it; secrets hidden.
    pub fn task_configs(&self, tenant: &str, name: &str) -> Result<Vec<TaskInfo>, HerderError> {
        let record = self.record(tenant, name)?;
        if record.target_state == TargetState::Stopped {
            return Ok(Vec::new());
        }
        let refused = |source: ConfigError| RuntimeError::Config {
            connector: name.to_owned(),
            source,
        };
        let parsed = SinkConnectorConfig::parse(&record.config).map_err(refused)?;
        let mut plugin = self
            .registry
            .create(&parsed.connector_class)
            .map_err(refused)?;
        plugin.start(&record.config).map_err(refused)?;
        let tasks_max = self.worker.limits().clamp_tasks(parsed.tasks_max);
        let configs = plugin.task_configs(tasks_max).map_err(refused)?;
        plugin.stop();
        Ok(configs
            .into_iter()
            .enumerate()
            .map(|(i, mut config)| {
                config.insert(TASK_ID.to_owned(), i.to_string());
                TaskInfo {
                    id: TaskId {
                        connector: name.to_owned(),
                        task: i as u32,
                    },
                    config: self.masked(&config),
                }
            })
            .collect())
    }

    /// What one connector takes of its tenant's quotas in `target`.
    fn footprint(&self, config: &ConfigMap, target: TargetState) -> Usage {
        if target == TargetState::Stopped {
            return Usage {
                connectors: 1,
                ..Usage::default()
            };
        }
        let tasks = config
            .get("tasks.max")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1);
        let batches = TaskSettings::resolve(config, &self.worker_config)
            .map(|s| s.inflight_batches as u64)
            .unwrap_or(1);
        let overrides = spillway_core::convert::strip_prefix(config, "consumer.override.");
        let poll = ConsumerSettings::collect(&self.worker_config, &overrides)
            .max_poll_records()
            .unwrap_or(DEFAULT_MAX_POLL_RECORDS) as u64;
        Usage {
            connectors: 1,
            tasks,
            inflight_records: tasks.saturating_mul(batches).saturating_mul(poll),
            inflight_bytes: 0,
        }
    }

    /// What the tenant's connectors take of its quotas, leaving out `except`.
    fn usage(&self, tenant: &str, except: Option<&str>) -> Result<Usage, HerderError> {
        let mut usage = Usage::default();
        for (k, record) in self.store.connectors()? {
            if k.tenant != tenant || Some(k.name.as_str()) == except {
                continue;
            }
            let one = self.footprint(&record.config, record.target_state);
            usage.connectors += one.connectors;
            usage.tasks = usage.tasks.saturating_add(one.tasks);
            usage.inflight_records = usage.inflight_records.saturating_add(one.inflight_records);
        }
        usage.inflight_bytes = self.tenants.inflight_bytes(tenant);
        Ok(usage)
    }

    /// Refuses a connector (new or changed) that would take its tenant over a quota.
    fn check_quotas(
        &self,
        tenant: &str,
        name: &str,
        config: &ConfigMap,
        target: TargetState,
    ) -> Result<(), HerderError> {
        self.check_worker_tasks(tenant, name, config, target)?;
        let quotas = self.tenants.quotas(tenant);
        if quotas == Quotas::default() {
            return Ok(());
        }
        let others = self.usage(tenant, Some(name))?;
        let this = self.footprint(config, target);
        let over = |quota: &'static str, limit: Option<u64>, total: u64, detail: String| match limit
        {
            Some(limit) if total > limit => Err(HerderError::Quota {
                tenant: tenant.to_owned(),
                quota,
                limit,
                detail,
            }),
            _ => Ok(()),
        };
        let connectors = others.connectors + 1;
        over(
            "connectors",
            quotas.connectors,
            connectors,
            format!("it would own {connectors} connectors"),
        )?;
        let tasks = others.tasks.saturating_add(this.tasks);
        over(
            "tasks",
            quotas.tasks,
            tasks,
            format!(
                "its connectors would have {tasks} tasks (tasks.max of every connector not STOPPED; {name} asks for {})",
                this.tasks
            ),
        )?;
        let inflight = others
            .inflight_records
            .saturating_add(this.inflight_records);
        over(
            "inflight.records",
            quotas.inflight_records,
            inflight,
            format!(
                "its tasks could hold {inflight} records in flight (tasks.max x task.inflight.batches x max.poll.records of every connector not STOPPED; {name} asks for {})",
                this.inflight_records
            ),
        )
    }

    /// Refuses a connector (new, changed or coming back from STOPPED) that would take the
    /// worker over `tasks.max.per.worker`, counting every tenant's connectors not STOPPED; in
    /// distributed mode, the cluster over the sum of its live workers' caps.
    fn check_worker_tasks(
        &self,
        tenant: &str,
        name: &str,
        config: &ConfigMap,
        target: TargetState,
    ) -> Result<(), HerderError> {
        if target == TargetState::Stopped {
            return Ok(());
        }
        let others = self
            .store
            .connectors()?
            .into_iter()
            .filter(|(k, r)| {
                !(k.tenant == tenant && k.name == name) && r.target_state != TargetState::Stopped
            })
            .map(|(_, r)| self.worker.task_cost(&r.config))
            .fold(TaskCost::default(), TaskCost::plus);
        // Distributed mode: the store is the cluster's, and so is the capacity — the sum of
        // every live worker's cap (the assignor gives no worker more than its own; each worker
        // still weighs the tasks it is given against its own descriptors and threads).
        if let Some(caps) = self.cluster.as_ref().and_then(|c| c.role().worker_caps()) {
            return spillway_actors::limits::check_cluster_tasks(
                name,
                others.tasks,
                self.worker.task_cost(config).tasks,
                &caps,
            )
            .map_err(|e| HerderError::BadRequest(e.to_string()));
        }
        self.worker
            .limits()
            .check_worker_tasks(name, others, self.worker.task_cost(config))
            .map_err(|e| HerderError::BadRequest(e.to_string()))
    }

    /// Creates a connector (`POST /connectors`).
    pub async fn create(
        &self,
        tenant: &str,
        mut config: ConfigMap,
        name: &str,
        initial: TargetState,
    ) -> Result<ConnectorInfo, HerderError> {
        config
            .entry("name".to_owned())
            .or_insert_with(|| name.to_owned());
        let _guard = self.control.lock().await;
        if self.store.connector(&key(tenant, name))?.is_some() {
            return Err(HerderError::ConnectorExists(name.to_owned()));
        }
        self.check(tenant, &config).await?;
        self.check_quotas(tenant, name, &config, initial)?;
        let record = ConnectorRecord::new(config.clone(), initial);
        let key = key(tenant, name);
        let (k, r) = (key.clone(), record.clone());
        self.write(move |store| store.put_connector(&k, &r)).await?;
        info!(tenant, connector = %name, target = %initial, "created");
        if initial == TargetState::Running {
            self.start(&key, config).await;
        }
        Ok(self.info_of(tenant, name, &record))
    }

    /// Creates or replaces a configuration (`PUT /connectors/{name}/config`); true when created.
    pub async fn put_config(
        &self,
        tenant: &str,
        name: &str,
        mut config: ConfigMap,
    ) -> Result<(bool, ConnectorInfo), HerderError> {
        match config.get("name") {
            Some(n) if n != name => {
                return Err(HerderError::BadRequest(format!(
                    "Connector name configuration ({n}) doesn't match connector name in the URL ({name})"
                )))
            }
            Some(_) => {}
            None => {
                config.insert("name".into(), name.to_owned());
            }
        }
        let _guard = self.control.lock().await;
        self.write_config(tenant, name, config).await
    }

    /// Writes a whole configuration and applies it; the caller holds the control lock.
    async fn write_config(
        &self,
        tenant: &str,
        name: &str,
        mut config: ConfigMap,
    ) -> Result<(bool, ConnectorInfo), HerderError> {
        let key = key(tenant, name);
        let existing = self.store.connector(&key)?;
        let created = existing.is_none();
        let mut record = existing
            .unwrap_or_else(|| ConnectorRecord::new(ConfigMap::new(), TargetState::Running));
        // A value sent back as GET shows it (`[hidden]`, a URL with `****`) keeps the stored
        // secret.
        let shown = self.masked(&record.config);
        for (k, v) in config.iter_mut() {
            if let (Some(old), Some(old_shown)) = (record.config.get(k), shown.get(k)) {
                if v == old_shown || v == secrets::HIDDEN {
                    v.clone_from(old);
                }
            }
        }
        self.check(tenant, &config).await?;
        self.check_quotas(tenant, name, &config, record.target_state)?;
        record.config = config.clone();
        let (k, r) = (key.clone(), record.clone());
        self.write(move |store| store.put_connector(&k, &r)).await?;
        info!(tenant, connector = %name, created, "configuration written");
        let runtime = runtime_key(tenant, name);
        if let Some(cluster) = &self.cluster {
            cluster.changed();
        } else if record.target_state == TargetState::Running {
            if created || lock(&self.failures).contains_key(&runtime) {
                self.halt(&key).await?;
                self.start(&key, config).await;
            } else if let Err(e) = self
                .worker
                .reconfigure_tenant_connector(runtime, self.tenants.scope(tenant), config.clone())
                .await
            {
                self.failed(&key, &config, &e);
            }
        }
        Ok((created, self.info_of(tenant, name, &record)))
    }

    /// Changes some keys (`PATCH /connectors/{name}/config`); a `None` value removes the key.
    pub async fn patch_config(
        &self,
        tenant: &str,
        name: &str,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<ConnectorInfo, HerderError> {
        if let Some(Some(n)) = patch.get("name") {
            if n != name {
                return Err(HerderError::BadRequest(format!(
                    "Connector name configuration ({n}) doesn't match connector name in the URL ({name})"
                )));
            }
        }
        let _guard = self.control.lock().await;
        let mut config = self.record(tenant, name)?.config;
        for (k, v) in patch {
            match v {
                Some(v) => {
                    config.insert(k, v);
                }
                None => {
                    config.remove(&k);
                }
            }
        }
        config.insert("name".into(), name.to_owned());
        let (_, info) = self.write_config(tenant, name, config).await?;
        Ok(info)
    }

    /// Deletes a connector: stops it, then forgets it.
    pub async fn delete(&self, tenant: &str, name: &str) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        self.delete_locked(tenant, name).await
    }

    async fn delete_locked(&self, tenant: &str, name: &str) -> Result<(), HerderError> {
        self.record(tenant, name)?;
        let key = key(tenant, name);
        self.halt(&key).await?;
        let k = key.clone();
        self.write(move |store| store.delete_connector(&k)).await?;
        let runtime = runtime_key(tenant, name);
        lock(&self.persisted).retain(|(n, _), _| *n != runtime);
        info!(tenant, connector = %name, "deleted");
        Ok(())
    }

    /// Moves a connector to `target`: PAUSED and STOPPED stop its tasks (keeping the
    /// configuration), RUNNING starts them again.
    pub async fn set_target(
        &self,
        tenant: &str,
        name: &str,
        target: TargetState,
    ) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name)?;
        if record.target_state == target {
            return Ok(());
        }
        if record.target_state == TargetState::Stopped {
            // A stopped connector takes no tasks of the quota; coming back it does again.
            self.check_quotas(tenant, name, &record.config, target)?;
        }
        let key = key(tenant, name);
        let k = key.clone();
        self.write(move |store| store.set_target_state(&k, target))
            .await?;
        info!(tenant, connector = %name, from = %record.target_state, to = %target, "target state");
        match target {
            TargetState::Running => self.start(&key, record.config).await,
            TargetState::Paused | TargetState::Stopped => self.halt(&key).await?,
        }
        Ok(())
    }

    /// Restarts a connector (`POST /connectors/{name}/restart`). Returns `None` for the plain
    /// request (Connect answers 204), or the status showing what restarts (202).
    ///
    /// Restarting the connector instance restarts it with all its tasks (the worker runs the
    /// instance and its tasks as one); `includeTasks=true&onlyFailed=true` on a connector that
    /// did not fail restarts only the failed tasks, each on its own.
    pub async fn restart(
        &self,
        tenant: &str,
        name: &str,
        request: RestartRequest,
    ) -> Result<Option<ConnectorStateInfo>, HerderError> {
        let mut status = self.status(tenant, name)?;
        let plain = !request.include_tasks && !request.only_failed;
        let connector_failed = status.connector.state == "FAILED";
        let failed_tasks: Vec<u32> = status
            .tasks
            .iter()
            .filter(|t| t.state == "FAILED")
            .map(|t| t.id)
            .collect();
        if request.include_tasks && request.only_failed && !connector_failed {
            for id in &failed_tasks {
                self.restart_task(tenant, name, *id).await?;
            }
            for t in status
                .tasks
                .iter_mut()
                .filter(|t| failed_tasks.contains(&t.id))
            {
                t.state = "RESTARTING".into();
                t.trace = None;
            }
            return Ok(Some(status));
        }
        let wanted = !request.only_failed || connector_failed;
        if wanted {
            self.restart_all(tenant, name).await?;
            if !plain {
                status.connector.state = "RESTARTING".into();
                status.connector.trace = None;
                for t in &mut status.tasks {
                    t.state = "RESTARTING".into();
                    t.trace = None;
                }
            }
        }
        Ok((!plain).then_some(status))
    }

    /// Restarts one task (`POST /connectors/{name}/tasks/{id}/restart`): it stops gracefully
    /// and runs again while the connector's other tasks go on.
    pub async fn restart_task(
        &self,
        tenant: &str,
        name: &str,
        task: u32,
    ) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name)?;
        let runtime = runtime_key(tenant, name);
        if self.cluster.is_some()
            && record.target_state == TargetState::Running
            && !self.runs_task_here(tenant, name, task)
        {
            drop(_guard);
            self.task_status(tenant, name, task)?;
            return Err(HerderError::Conflict(format!(
                "task {task} of connector {name} does not run on this worker ({}); ask the worker that runs it ({}), or retry after the rebalance",
                self.worker_id,
                self.task_owner(tenant, name, task).unwrap_or_else(|| "none yet".into())
            )));
        }
        if record.target_state != TargetState::Running
            || lock(&self.failures).contains_key(&runtime)
        {
            // Not running (or its instance failed to start): only an existing task id is
            // accepted, and there is nothing to restart on its own.
            drop(_guard);
            self.task_status(tenant, name, task)?;
            return Ok(());
        }
        match self.worker.restart_task(&runtime, task).await {
            Ok(()) => {
                info!(tenant, connector = %name, task, "task restarted");
                Ok(())
            }
            Err(RuntimeError::UnknownTask { .. }) | Err(RuntimeError::UnknownConnector(_)) => {
                Err(HerderError::UnknownTask {
                    connector: name.to_owned(),
                    task,
                })
            }
            Err(RuntimeError::Task(message)) => Err(HerderError::Conflict(message)),
            Err(e) => Err(e.into()),
        }
    }

    async fn restart_all(&self, tenant: &str, name: &str) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name)?;
        let key = key(tenant, name);
        let k = key.clone();
        self.write(move |store| store.count_connector_restart(&k))
            .await?;
        if record.target_state == TargetState::Running {
            info!(tenant, connector = %name, "restarting");
            self.halt(&key).await?;
            self.start(&key, record.config).await;
        }
        Ok(())
    }

    /// The topics a connector reads (`GET /connectors/{name}/topics`): the configured names,
    /// or the pattern for `topics.regex`.
    pub fn topics(&self, tenant: &str, name: &str) -> Result<Vec<String>, HerderError> {
        let record = self.record(tenant, name)?;
        let parsed =
            SinkConnectorConfig::parse(&record.config).map_err(|source| RuntimeError::Config {
                connector: name.to_owned(),
                source,
            })?;
        Ok(match parsed.topics {
            TopicSelection::Names(names) => names,
            TopicSelection::Pattern(regex) => vec![regex.as_str().to_owned()],
        })
    }

    /// Where a connector reads: group protocol, group id (with its tenant's prefix), cluster.
    fn group_of(
        &self,
        tenant: &str,
        name: &str,
        record: &ConnectorRecord,
    ) -> Result<(SinkConnectorConfig, bool, String, String), HerderError> {
        self.group_of_config(tenant, name, &record.config)
    }

    fn group_of_config(
        &self,
        tenant: &str,
        name: &str,
        config: &ConfigMap,
    ) -> Result<(SinkConnectorConfig, bool, String, String), HerderError> {
        let refused = |source: ConfigError| RuntimeError::Config {
            connector: name.to_owned(),
            source,
        };
        let parsed = SinkConnectorConfig::parse(config).map_err(refused)?;
        let protocol = resolve_group_protocol(config, &self.worker_config).map_err(refused)?;
        let group = self
            .tenants
            .scope(tenant)
            .group_id(&parsed, protocol.protocol);
        let bootstrap = parsed
            .consumer_overrides
            .get("bootstrap.servers")
            .or_else(|| self.worker_config.get("bootstrap.servers"))
            .cloned()
            .unwrap_or_default();
        Ok((parsed, protocol.protocol.is_share(), group, bootstrap))
    }

    /// Another stored connector on the same cluster whose group id is this one's but whose
    /// group is of the other type: the two could never both run (Kafka has one namespace for
    /// group ids). Checked without the broker, so it holds while the cluster is down too.
    fn group_id_clashes(&self, tenant: &str, config: &ConfigMap) -> Vec<ConfigError> {
        let name = config.get("name").cloned().unwrap_or_default();
        let Ok((_, share, group, bootstrap)) = self.group_of_config(tenant, &name, config) else {
            return Vec::new();
        };
        let Ok(stored) = self.store.connectors() else {
            return Vec::new();
        };
        let kind = |share: bool| if share { "share" } else { "consumer" };
        stored
            .into_iter()
            .filter(|(k, _)| !(k.tenant == tenant && k.name == name))
            .filter_map(|(k, record)| {
                let (_, other_share, other_group, other_bootstrap) = self
                    .group_of_config(&k.tenant, &k.name, &record.config)
                    .ok()?;
                (other_group == group && other_share != share && other_bootstrap == bootstrap).then(
                    || ConfigError::InvalidValue {
                        key: "consumer.override.group.id".into(),
                        value: group.clone(),
                        reason: format!(
                            "connector '{}' uses '{group}' as a {} group id, and Kafka has one \
                             namespace for group ids: a {} group cannot have the same id. Set \
                             consumer.override.group.id to an id no other connector uses (or \
                             remove it for the default, connect-<name> in classic mode and \
                             connect-share-<name> in share mode)",
                            k.name,
                            kind(other_share),
                            kind(share)
                        ),
                    },
                )
            })
            .collect()
    }

    /// The connector's offsets (`GET /connectors/{name}/offsets`): the consumer group's
    /// committed offsets in classic mode. A share group has no offsets per partition — each
    /// record is acknowledged on its own — so share mode answers with an empty list and says so.
    pub async fn offsets(&self, tenant: &str, name: &str) -> Result<Offsets, HerderError> {
        let record = self.record(tenant, name)?;
        let (parsed, share, group, bootstrap) = self.group_of(tenant, name, &record)?;
        if share {
            let admin = self
                .share_admin(&parsed, &group, &bootstrap, "read")
                .await?;
            let topics = share_topics(&parsed);
            let offsets = match admin.describe_share_offsets(&group, &topics).await {
                Ok(offsets) => offsets,
                // A read on an older cluster answers what it can, saying why it is empty.
                Err(e) if e.is_unsupported() => {
                    return Ok(Offsets {
                        offsets: Vec::new(),
                        message: Some(format!(
                            "connector {name} reads through share group '{group}', whose start \
                             offsets cannot be shown: {e} (Kafka 4.1+ has it)"
                        )),
                    })
                }
                Err(e) => {
                    return Err(HerderError::Offsets {
                        action: "read",
                        group: group.clone(),
                        bootstrap: bootstrap.clone(),
                        reason: e.to_string(),
                    })
                }
            };
            return Ok(Offsets {
                offsets: offsets
                    .partitions
                    .into_iter()
                    .filter_map(|p| {
                        let offset = p.start_offset?;
                        Some(PartitionOffset {
                            partition: serde_json::json!({
                                "kafka_topic": p.topic,
                                "kafka_partition": p.partition,
                            }),
                            offset: serde_json::json!({ "kafka_offset": offset }),
                        })
                    })
                    .collect(),
                message: Some(format!(
                    "connector {name} reads through share group '{group}': each offset is the \
                     share-partition's start offset, the first record not yet acknowledged (records \
                     after it may be acknowledged already). A partition the group has no state for \
                     is not listed: it starts where share.auto.offset.reset says"
                )),
            });
        }
        let topics = parsed.topics.clone();
        let security = self.client_security(&parsed);
        let (g, b) = (group.clone(), bootstrap.clone());
        let read =
            tokio::task::spawn_blocking(move || committed_offsets(&b, &g, &security, &topics))
                .await;
        let offsets = match read {
            Ok(result) => result,
            Err(e) => Err(format!("the offset reader stopped: {e}")),
        }
        .map_err(|reason| HerderError::Offsets {
            action: "read",
            group,
            bootstrap,
            reason,
        })?;
        Ok(Offsets {
            offsets,
            message: None,
        })
    }

    /// Changes a STOPPED classic-mode connector's committed offsets (KIP-875):
    /// `PATCH /connectors/{name}/offsets` with `changes`, or `DELETE` (`None`: reset every
    /// partition). A reset partition gets the offset its consumer's `auto.offset.reset` names
    /// (Connect's sink default, `earliest`: the log start; `latest`: the end), committed for the
    /// connector's group — where the connector would start without a committed offset.
    pub async fn alter_offsets(
        &self,
        tenant: &str,
        name: &str,
        changes: Option<Vec<OffsetChange>>,
    ) -> Result<&'static str, HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name)?;
        if record.target_state != TargetState::Stopped {
            return Err(HerderError::BadRequest(format!(
                "Connector {name} is {}: its offsets can be changed only while it is STOPPED \
                 (PUT /connectors/{name}/stop first), so that no task commits meanwhile",
                record.target_state
            )));
        }
        let (parsed, share, group, bootstrap) = self.group_of(tenant, name, &record)?;
        if let Some(changes) = &changes {
            for change in changes {
                if !parsed.topics.includes(&change.topic) {
                    return Err(HerderError::BadRequest(format!(
                        "topic '{}' in the offsets is not one connector {name} reads; it reads {}",
                        change.topic,
                        match &parsed.topics {
                            TopicSelection::Names(names) => names.join(", "),
                            TopicSelection::Pattern(regex) =>
                                format!("topics matching {}", regex.as_str()),
                        }
                    )));
                }
            }
        }
        if share {
            return self
                .alter_share_offsets(name, &parsed, &group, &bootstrap, changes)
                .await;
        }
        if let Some(changes) = &changes {
            for change in changes {
                if !parsed.topics.includes(&change.topic) {
                    return Err(HerderError::BadRequest(format!(
                        "topic '{}' in the offsets is not one connector {name} reads; it reads {}",
                        change.topic,
                        match &parsed.topics {
                            TopicSelection::Names(names) => names.join(", "),
                            TopicSelection::Pattern(regex) =>
                                format!("topics matching {}", regex.as_str()),
                        }
                    )));
                }
            }
        }
        let reset_to = parsed
            .consumer_overrides
            .get("auto.offset.reset")
            .or_else(|| self.worker_config.get("consumer.auto.offset.reset"))
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_else(|| "earliest".to_owned());
        let start_at_end = match reset_to.as_str() {
            "earliest" | "smallest" | "beginning" => false,
            "latest" | "largest" | "end" => true,
            other => {
                return Err(HerderError::BadRequest(format!(
                    "connector {name} has auto.offset.reset={other}, so a reset partition has no \
                     offset to start from; give the offsets in a PATCH instead"
                )))
            }
        };
        let security = self.client_security(&parsed);
        let topics = parsed.topics.clone();
        let reset = changes.is_none();
        let (g, b) = (group.clone(), bootstrap.clone());
        let done = tokio::task::spawn_blocking(move || {
            commit_offsets(&b, &g, &security, &topics, changes, start_at_end)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the offset writer stopped: {e}")));
        done.map_err(|reason| HerderError::Offsets {
            action: if reset { "reset" } else { "alter" },
            group: group.clone(),
            bootstrap,
            reason,
        })?;
        info!(tenant, connector = %name, %group, reset, "offsets changed");
        Ok(if reset {
            OFFSETS_RESET
        } else {
            OFFSETS_ALTERED
        })
    }

    /// The worker's admin client for a share-mode connector's cluster, reached with its
    /// consumer's security settings.
    async fn share_admin(
        &self,
        parsed: &SinkConnectorConfig,
        group: &str,
        bootstrap: &str,
        action: &'static str,
    ) -> Result<Arc<spillway_kafka::admin::AdminClient>, HerderError> {
        let failed = |reason: String| HerderError::Offsets {
            action,
            group: group.to_owned(),
            bootstrap: bootstrap.to_owned(),
            reason,
        };
        let security = ConsumerSettings::collect(&self.worker_config, &parsed.consumer_overrides)
            .security()
            .map_err(|e| failed(e.to_string()))?;
        self.worker
            .admin_clients()
            .get(bootstrap, &security, OFFSETS_TIMEOUT)
            .await
            .map_err(|e| failed(e.to_string()))
    }

    /// KIP-875's PATCH and DELETE for a STOPPED share-mode connector: AlterShareGroupOffsets
    /// sets start offsets; DeleteShareGroupOffsets removes the group's state for the
    /// connector's topics, so it starts again where `share.auto.offset.reset` says.
    async fn alter_share_offsets(
        &self,
        name: &str,
        parsed: &SinkConnectorConfig,
        group: &str,
        bootstrap: &str,
        changes: Option<Vec<OffsetChange>>,
    ) -> Result<&'static str, HerderError> {
        let reset = changes.is_none();
        let action = if reset { "reset" } else { "alter" };
        let admin = self.share_admin(parsed, group, bootstrap, action).await?;
        let failed = |e: spillway_kafka::admin::AdminError| match e.code() {
            Some(spillway_kafka::admin::codes::GROUP_NOT_EMPTY) => HerderError::Conflict(format!(
                "share group '{group}' of connector {name} still has members (its tasks may take a \
                 moment to leave after the stop, or another client uses the group); try again \
                 when it is empty: {e}"
            )),
            _ => HerderError::Offsets {
                action,
                group: group.to_owned(),
                bootstrap: bootstrap.to_owned(),
                reason: e.to_string(),
            },
        };
        match changes {
            None => {
                admin
                    .delete_share_offsets(group, &share_topics(parsed))
                    .await
                    .map_err(failed)?;
            }
            Some(changes) => {
                let mut offsets = Vec::new();
                for change in changes {
                    let Some(offset) = change.offset else {
                        return Err(HerderError::BadRequest(format!(
                            "connector {name} reads through share group '{group}', whose state can be \
                             removed only for whole topics: give an offset for {}-{} (a share \
                             group's start offset), or reset all its offsets with DELETE \
                             /connectors/{name}/offsets",
                            change.topic, change.partition
                        )));
                    };
                    offsets.push((change.topic, change.partition, offset));
                }
                admin
                    .alter_share_offsets(group, &offsets)
                    .await
                    .map_err(failed)?;
            }
        }
        info!(connector = %name, %group, reset, "share group offsets changed");
        Ok(if reset {
            OFFSETS_RESET
        } else {
            OFFSETS_ALTERED
        })
    }

    /// The security settings of the connector's consumer (worker `consumer.*`, then its
    /// overrides): what a client of its group needs to reach the cluster.
    fn client_security(&self, parsed: &SinkConnectorConfig) -> Vec<(String, String)> {
        let security =
            |k: &str| k == "security.protocol" || k.starts_with("sasl.") || k.starts_with("ssl.");
        let mut settings: BTreeMap<String, String> = self
            .worker_config
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("consumer.")
                    .map(|k| (k.to_owned(), v.clone()))
            })
            .filter(|(k, _)| security(k))
            .collect();
        settings.extend(
            parsed
                .consumer_overrides
                .iter()
                .filter(|(k, _)| security(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        settings.into_iter().collect()
    }

    /// The `validate` answer for `config` in `tenant`, secrets hidden: every refusal starting
    /// the connector would meet (the client overrides the tenant's policy refuses, the
    /// worker's start checks, a group id another type of group holds — asked of the cluster
    /// when it answers, and of the other stored connectors), so what it accepts also starts.
    pub async fn validate(&self, tenant: &str, config: &ConfigMap) -> ValidationReport {
        let scope = self.tenants.scope(tenant);
        let mut errors = self.group_id_clashes(tenant, config);
        if errors.is_empty() {
            errors = self.worker.group_id_errors(&scope, config).await;
        }
        self.validate_with(tenant, config, errors)
    }

    /// The `validate` answer without asking the cluster, plus `extra` errors.
    fn validate_with(
        &self,
        tenant: &str,
        config: &ConfigMap,
        extra: Vec<ConfigError>,
    ) -> ValidationReport {
        let class = config.get(CONNECTOR_CLASS).cloned().unwrap_or_default();
        let (mut report, plugin_error) = match self.registry.create(&class) {
            Ok(plugin) => (plugin.validate(config), None),
            Err(e) => (validate_sink_connector(config, &ConfigDef::new()), Some(e)),
        };
        let mut configs = std::mem::take(&mut report.configs);
        configs.extend(runtime_config_def().validate(config));
        let mut report = ValidationReport::new(report.name, configs);
        let mut errors: Vec<ConfigError> = plugin_error.into_iter().collect();
        if let Err(e) = resolve_group_protocol(config, &self.worker_config) {
            errors.extend(e.flatten().into_iter().cloned());
        }
        let owner = if tenant == DEFAULT_TENANT {
            format!("the worker ({})", spillway_actors::tenancy::OVERRIDE_POLICY)
        } else {
            format!("tenant {tenant}")
        };
        let scope = self.tenants.scope(tenant);
        errors.extend(scope.policy.violations(config, &owner));
        errors.extend(self.worker.start_checks(&scope, config));
        errors.extend(extra);
        for error in errors {
            let key = error.key().unwrap_or(CONNECTOR_CLASS).to_owned();
            let message = error.to_string();
            if !report.add_error(&key, message.clone()) {
                // A key no definition covers gets an entry of its own to carry the error.
                let mut extra = ConfigDef::new()
                    .define(
                        ConfigKey::new(key.clone(), ConfigType::String, Importance::Medium, "")
                            .null_default(),
                    )
                    .validate(config);
                for entry in &mut extra {
                    entry.value.errors.push(message.clone());
                }
                let mut configs = report.configs;
                configs.extend(extra);
                report = ValidationReport::new(report.name, configs);
            }
        }
        let shown = self.masked(config);
        let declared = self.secret_keys(config);
        for entry in &mut report.configs {
            if let Some(value) = &entry.value.value {
                entry.value.value = Some(match shown.get(&entry.value.name) {
                    Some(masked) => masked.clone(),
                    None => secrets::mask_value(&entry.value.name, value, &declared, config),
                });
            }
            for e in &mut entry.value.errors {
                *e = self.redact(config, e);
            }
        }
        report
    }

    /// Refuses a configuration with errors.
    async fn check(&self, tenant: &str, config: &ConfigMap) -> Result<(), HerderError> {
        // Its secrets are kept out of every log line from now on (secrets::RedactingWriter).
        secrets::remember(config, &self.secret_keys(config));
        let report = self.validate(tenant, config).await;
        if report.is_valid() {
            Ok(())
        } else {
            Err(HerderError::InvalidConfig(Box::new(report)))
        }
    }

    pub fn plugins(&self) -> Vec<PluginInfo> {
        self.registry
            .classes()
            .into_iter()
            .filter_map(|class| {
                let plugin = self.registry.create(&class).ok()?;
                Some(PluginInfo {
                    version: plugin.version().to_owned(),
                    class,
                    kind: "sink",
                })
            })
            .collect()
    }

    /// The plugin's own keys (`GET /connector-plugins/{plugin}/config`).
    pub fn plugin_config(&self, plugin: &str) -> Result<Vec<KeyInfo>, HerderError> {
        let connector = self
            .registry
            .create(plugin)
            .map_err(|_| HerderError::UnknownPlugin {
                name: plugin.to_owned(),
                known: self.registry.classes().join(", "),
            })?;
        Ok(connector
            .config_def()
            .validate(&ConfigMap::new())
            .into_iter()
            .map(|c| c.definition)
            .collect())
    }

    pub fn knows_plugin(&self, plugin: &str) -> bool {
        self.registry.create(plugin).is_ok()
    }

    /// The worker's tenants (token lookup, scopes, quotas).
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// A tenant with what its connectors use of its quotas.
    pub fn tenant_details(&self, name: &str) -> Result<TenantDetails, HerderError> {
        Ok(TenantDetails {
            tenant: self.tenants.get(name)?,
            usage: self.usage(name, None)?,
        })
    }

    /// Creates a tenant; the answer holds its token, shown this once.
    pub async fn create_tenant(
        &self,
        name: &str,
        quotas: Quotas,
        policy: Option<OverridePolicy>,
    ) -> Result<(TenantInfo, String), HerderError> {
        let _guard = self.control.lock().await;
        let mut quotas = quotas;
        if quotas.tasks.is_none() {
            quotas.tasks = self.default_tasks;
        }
        let created = self.tenants.create(name, quotas, policy)?;
        info!(tenant = %name, "tenant created");
        Ok(created)
    }

    /// Replaces a tenant's quotas (and policy when given). Lower quotas than what the tenant
    /// uses are accepted: running connectors go on, and further growth is refused.
    pub async fn update_tenant(
        &self,
        name: &str,
        quotas: Quotas,
        policy: Option<OverridePolicy>,
    ) -> Result<TenantDetails, HerderError> {
        let _guard = self.control.lock().await;
        self.tenants.update(name, quotas, policy)?;
        info!(tenant = %name, ?quotas, "tenant quotas changed");
        drop(_guard);
        self.tenant_details(name)
    }

    /// Gives a tenant a new token; the old one stops working at once.
    pub async fn rotate_token(&self, name: &str) -> Result<String, HerderError> {
        let _guard = self.control.lock().await;
        let token = self.tenants.rotate_token(name)?;
        info!(tenant = %name, "tenant token rotated");
        Ok(token)
    }

    /// Deletes a tenant. One that still owns connectors is refused unless
    /// `delete_connectors`, which stops and deletes them first.
    pub async fn delete_tenant(
        &self,
        name: &str,
        delete_connectors: bool,
    ) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        self.tenants.get(name)?;
        if name == DEFAULT_TENANT {
            return Err(TenantError::Invalid("the default tenant cannot be deleted".into()).into());
        }
        let owned = self.connector_names(name)?;
        if !owned.is_empty() && !delete_connectors {
            return Err(HerderError::TenantHasConnectors {
                tenant: name.to_owned(),
                connectors: owned,
            });
        }
        for connector in owned {
            self.delete_locked(name, &connector).await?;
        }
        self.tenants.delete(name)?;
        info!(tenant = %name, "tenant deleted");
        Ok(())
    }

    /// Runs a change of the store on a blocking thread: sled writes it to disk before it
    /// returns, which must not hold up the executor serving the other REST requests.
    async fn write<T: Send + 'static>(
        &self,
        change: impl FnOnce(&dyn StateStore) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, HerderError> {
        let store = Arc::clone(&self.store);
        let written = tokio::task::spawn_blocking(move || change(store.as_ref()))
            .await
            .map_err(|e| {
                HerderError::Runtime(RuntimeError::Task(format!(
                    "the state store write did not finish: {e}"
                )))
            })?
            .map_err(HerderError::from)?;
        if let Some(cluster) = &self.cluster {
            // The reconcilers act on what was written; this one (the leader's) at once.
            cluster.changed();
        }
        Ok(written)
    }

    /// Writes the tasks' states, traces and restart counts to the store when they changed
    /// (all changes in one write).
    pub fn persist_task_statuses(&self) -> Result<(), HerderError> {
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
        let written = self.store.put_tasks(&records)?;
        let mut persisted = lock(&self.persisted);
        for ((name, _, task, record), written) in changed.into_iter().zip(written) {
            if written {
                persisted.insert((name, task), record);
            }
        }
        Ok(())
    }

    /// Stops every connector gracefully without changing target states (worker shutdown).
    pub async fn shutdown(&self) {
        let _guard = self.control.lock().await;
        if let Err(e) = self.persist_task_statuses() {
            warn!(error = %e, "cannot record the last task statuses");
        }
        for status in self.worker.statuses() {
            if let Err(e) = self.worker.stop_connector(&status.name).await {
                warn!(connector = %status.name, error = %e, "stopping the connector failed");
            }
        }
    }

    fn masked(&self, config: &ConfigMap) -> ConfigMap {
        secrets::mask(config, &self.secret_keys(config))
    }

    fn redact(&self, config: &ConfigMap, text: &str) -> String {
        secrets::redact(text, config, &self.secret_keys(config))
    }

    /// Keys declared as passwords by the connector's plugin (beside those named like secrets).
    fn secret_keys(&self, config: &ConfigMap) -> Vec<String> {
        let class = config
            .get(CONNECTOR_CLASS)
            .map(String::as_str)
            .unwrap_or_default();
        let passwords = |def: ConfigDef| -> Vec<String> {
            def.keys()
                .iter()
                .filter(|k| k.kind == ConfigType::Password)
                .map(|k| k.name.clone())
                .collect()
        };
        let mut keys = passwords(runtime_config_def());
        if let Ok(plugin) = self.registry.create(class) {
            keys.extend(passwords(plugin.config_def()));
        }
        keys
    }
}

/// Commits offsets for `group`: the `changes` given (a `None` offset resets the partition),
/// or a reset of every partition of `topics` when `changes` is `None`. A reset partition gets
/// its log start offset, or its end offset when `start_at_end`.
///
/// Like Connect's `Admin.alterConsumerGroupOffsets`, the commit comes from outside the group
/// (no member id, generation -1), which Kafka accepts while the group is empty — as it is
/// while the connector is STOPPED. (The development broker refuses such commits once the
/// group has had members: see docs/dev-broker.md.)
fn commit_offsets(
    bootstrap: &str,
    group: &str,
    security: &[(String, String)],
    topics: &TopicSelection,
    changes: Option<Vec<OffsetChange>>,
    start_at_end: bool,
) -> Result<(), String> {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    // Security keys in either spelling, translated for librdkafka (issue 13).
    let context = spillway_kafka::security::rdkafka_config(
        &mut config,
        security.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map_err(|e| e.to_string())?;
    let consumer: BaseConsumer<spillway_kafka::security::SecurityContext> = config
        .create_with_context(context)
        .map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(None, OFFSETS_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let exists = |topic: &str, partition: i32| {
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.partitions().iter().any(|p| p.id() == partition))
    };
    let changes = match changes {
        Some(changes) => changes,
        None => metadata
            .topics()
            .iter()
            .filter(|t| topics.includes(t.name()))
            .flat_map(|t| {
                t.partitions().iter().map(|p| OffsetChange {
                    topic: t.name().to_owned(),
                    partition: p.id(),
                    offset: None,
                })
            })
            .collect(),
    };
    if changes.is_empty() {
        return Ok(());
    }
    let mut partitions = TopicPartitionList::new();
    for change in &changes {
        if !exists(&change.topic, change.partition) {
            return Err(format!(
                "partition {} of topic '{}' does not exist",
                change.partition, change.topic
            ));
        }
        let offset = match change.offset {
            Some(offset) => offset,
            None => {
                let (low, high) = consumer
                    .fetch_watermarks(&change.topic, change.partition, OFFSETS_TIMEOUT)
                    .map_err(|e| e.to_string())?;
                if start_at_end {
                    high
                } else {
                    low
                }
            }
        };
        partitions
            .add_partition_offset(&change.topic, change.partition, Offset::Offset(offset))
            .map_err(|e| e.to_string())?;
    }
    consumer
        .commit(&partitions, CommitMode::Sync)
        .map_err(|e| match e.rdkafka_error_code() {
            Some(rdkafka::types::RDKafkaErrorCode::UnknownMemberId) => format!(
                "{e}: the group is not empty (a member of it is still alive), or the broker refuses commits from outside a group it knows"
            ),
            _ => e.to_string(),
        })
}

/// Reads a consumer group's committed offsets for the partitions of `topics`.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    security: &[(String, String)],
    topics: &TopicSelection,
) -> Result<Vec<PartitionOffset>, String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let context = spillway_kafka::security::rdkafka_config(
        &mut config,
        security.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map_err(|e| e.to_string())?;
    let consumer: BaseConsumer<spillway_kafka::security::SecurityContext> = config
        .create_with_context(context)
        .map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(None, OFFSETS_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let mut partitions = TopicPartitionList::new();
    for topic in metadata
        .topics()
        .iter()
        .filter(|t| topics.includes(t.name()))
    {
        for p in topic.partitions() {
            partitions.add_partition(topic.name(), p.id());
        }
    }
    if partitions.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer
        .committed_offsets(partitions, OFFSETS_TIMEOUT)
        .map_err(|e| e.to_string())?;
    Ok(committed
        .elements()
        .into_iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some(PartitionOffset {
                partition: serde_json::json!({"kafka_topic": e.topic(), "kafka_partition": e.partition()}),
                offset: serde_json::json!({"kafka_offset": offset}),
            }),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use spillway_core::config::config_map;
    use spillway_storage::{
        ConnectorKey, ConnectorRecord, SledStore, StateStore, StorageError, TaskRecord, Tenant,
    };

    use super::*;

    /// The worker's store, counting the reads of connector records; its connector writes take
    /// `write_delay` (a disk that is slow to sync).
    struct CountingStore {
        inner: SledStore,
        connector_reads: AtomicUsize,
        write_delay: Duration,
    }

    impl StateStore for CountingStore {
        fn put_tenant(&self, tenant: &Tenant) -> Result<(), StorageError> {
            self.inner.put_tenant(tenant)
        }
        fn delete_tenant(&self, name: &str) -> Result<bool, StorageError> {
            self.inner.delete_tenant(name)
        }
        fn tenants(&self) -> Result<Vec<Tenant>, StorageError> {
            self.inner.tenants()
        }
        fn put_connector(
            &self,
            key: &ConnectorKey,
            record: &ConnectorRecord,
        ) -> Result<(), StorageError> {
            std::thread::sleep(self.write_delay);
            self.inner.put_connector(key, record)
        }
        fn connector(&self, key: &ConnectorKey) -> Result<Option<ConnectorRecord>, StorageError> {
            self.connector_reads.fetch_add(1, Ordering::SeqCst);
            self.inner.connector(key)
        }
        fn set_target_state(
            &self,
            key: &ConnectorKey,
            state: TargetState,
        ) -> Result<bool, StorageError> {
            self.inner.set_target_state(key, state)
        }
        fn count_connector_restart(&self, key: &ConnectorKey) -> Result<Option<u32>, StorageError> {
            self.inner.count_connector_restart(key)
        }
        fn delete_connector(&self, key: &ConnectorKey) -> Result<bool, StorageError> {
            self.inner.delete_connector(key)
        }
        fn connectors(&self) -> Result<Vec<(ConnectorKey, ConnectorRecord)>, StorageError> {
            self.inner.connectors()
        }
        fn put_task(
            &self,
            key: &ConnectorKey,
            task: u32,
            record: &TaskRecord,
        ) -> Result<bool, StorageError> {
            self.inner.put_task(key, task, record)
        }
        fn tasks(&self, key: &ConnectorKey) -> Result<Vec<(u32, TaskRecord)>, StorageError> {
            self.inner.tasks(key)
        }
    }

    /// A herder on `store` whose worker reaches no broker.
    fn herder_on(store: &Arc<CountingStore>) -> Herder {
        let worker = Worker::start(
            config_map(&[("bootstrap.servers", "127.0.0.1:1")]),
            ConnectorRegistry::builtin(),
        )
        .expect("worker");
        Herder::new(
            worker,
            Arc::clone(store) as Arc<dyn StateStore>,
            ConnectorRegistry::builtin(),
            "w1".into(),
        )
        .expect("herder")
    }

    #[tokio::test]
    async fn the_status_tick_writes_changed_statuses_without_reading_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(CountingStore {
            inner: SledStore::open(dir.path()).expect("store"),
            connector_reads: AtomicUsize::new(0),
            write_delay: Duration::ZERO,
        });
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
            herder.persist_task_statuses().expect("recorded");
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

    /// A store write that takes long (sled syncing to a slow disk) runs on a blocking thread:
    /// the executor serving REST requests goes on meanwhile. One thread, as a worker under load
    /// has every executor thread busy.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_store_write_does_not_hold_up_the_executor() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(CountingStore {
            inner: SledStore::open(dir.path()).expect("store"),
            connector_reads: AtomicUsize::new(0),
            write_delay: Duration::from_millis(800),
        });
        let herder = herder_on(&store);
        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let file = dir.path().join("out.txt").display().to_string();
        let created = herder.create(
            DEFAULT_TENANT,
            config_map(&[
                ("connector.class", "file"),
                ("topics", "t"),
                ("file", &file),
                ("tasks.max", "1"),
                ("consumer.override.group.protocol", "classic"),
            ]),
            "slow",
            TargetState::Stopped,
        );
        let started = std::time::Instant::now();
        created.await.expect("created");
        let took = started.elapsed();
        let during = ticks.load(Ordering::SeqCst);
        ticker.abort();
        assert!(
            took >= Duration::from_millis(800),
            "the write took {took:?}"
        );
        // 800 ms of 10 ms ticks: 80 if the executor were free all along; blocked, 0 or 1.
        assert!(
            during >= 20,
            "the executor was held up by the store write: {during} ticks in {took:?}"
        );
    }
}
