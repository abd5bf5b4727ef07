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
use spillway_actors::settings::runtime_config_def;
use spillway_actors::{RuntimeError, State, Worker};
use spillway_connectors::runtime_keys::TASK_ID;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{
    resolve_group_protocol, sink_connector::CONNECTOR_CLASS, validate_sink_connector, ConfigDef,
    ConfigKey, ConfigType, Importance, KeyInfo, SinkConnectorConfig, TopicSelection,
    ValidationReport,
};
use spillway_core::{ConfigError, ConfigMap};
use spillway_storage::{
    ConnectorKey, ConnectorRecord, StateStore, StorageError, TargetState, TaskRecord,
};
use tracing::{info, warn};

use crate::secrets;

/// The tenant every connector belongs to while authentication is off.
pub const DEFAULT_TENANT: &str = "default";

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
    #[error("cannot read the committed offsets of group '{group}' from {bootstrap}: {reason}")]
    Offsets {
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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every use is one map operation; a panic elsewhere cannot leave a map half changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(name: &str) -> ConnectorKey {
    ConnectorKey::new(DEFAULT_TENANT, name)
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
    ) -> Herder {
        Herder {
            worker_config: worker.config().clone(),
            worker,
            store,
            registry,
            worker_id,
            control: Arc::new(tokio::sync::Mutex::new(())),
            failures: Mutex::default(),
            persisted: Mutex::default(),
        }
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
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
        for (key, record) in self.store.connectors()? {
            if key.tenant != DEFAULT_TENANT {
                continue;
            }
            for (task, stored) in self.store.tasks(&key)? {
                lock(&self.persisted).insert((key.name.clone(), task), stored);
            }
            info!(connector = %key.name, target = %record.target_state, "restoring");
            if record.target_state == TargetState::Running {
                self.start(&key.name, record.config).await;
            }
        }
        Ok(())
    }

    /// Starts a connector in the worker, remembering a failure for the status API.
    async fn start(&self, name: &str, config: ConfigMap) {
        lock(&self.failures).remove(name);
        if let Err(e) = self.worker.start_connector(config.clone()).await {
            self.failed(name, &config, &e);
        }
    }

    /// Logs why a connector cannot run and keeps it for the status API, secrets hidden.
    fn failed(&self, name: &str, config: &ConfigMap, error: &RuntimeError) {
        let message = self.redact(config, &error.to_string());
        warn!(connector = %name, error = %message, "the connector cannot start");
        lock(&self.failures).insert(name.to_owned(), message);
    }

    /// Stops a connector in the worker if it runs there.
    async fn halt(&self, name: &str) -> Result<(), HerderError> {
        lock(&self.failures).remove(name);
        match self.worker.stop_connector(name).await {
            Ok(()) | Err(RuntimeError::UnknownConnector(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn record(&self, name: &str) -> Result<ConnectorRecord, HerderError> {
        self.store
            .connector(&key(name))?
            .ok_or_else(|| HerderError::UnknownConnector(name.to_owned()))
    }

    /// The names of every connector, sorted.
    pub fn connector_names(&self) -> Result<Vec<String>, HerderError> {
        Ok(self
            .store
            .connectors()?
            .into_iter()
            .filter(|(k, _)| k.tenant == DEFAULT_TENANT)
            .map(|(k, _)| k.name)
            .collect())
    }

    /// The configuration, secrets hidden.
    pub fn config(&self, name: &str) -> Result<ConfigMap, HerderError> {
        Ok(self.masked(&self.record(name)?.config))
    }

    pub fn info(&self, name: &str) -> Result<ConnectorInfo, HerderError> {
        let record = self.record(name)?;
        Ok(self.info_of(name, &record))
    }

    fn info_of(&self, name: &str, record: &ConnectorRecord) -> ConnectorInfo {
        ConnectorInfo {
            name: name.to_owned(),
            config: self.masked(&record.config),
            tasks: self
                .task_ids(name, record)
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
    fn task_ids(&self, name: &str, record: &ConnectorRecord) -> Vec<u32> {
        match record.target_state {
            TargetState::Stopped => Vec::new(),
            TargetState::Running => self
                .worker
                .status(name)
                .map(|s| s.tasks.iter().map(|t| t.id).collect())
                .unwrap_or_default(),
            TargetState::Paused => (0..self.task_count(&record.config) as u32).collect(),
        }
    }

    /// How many tasks the connector's plugin makes of `config` (`tasks.max` at most).
    fn task_count(&self, config: &ConfigMap) -> usize {
        let Ok(parsed) = SinkConnectorConfig::parse(config) else {
            return 1;
        };
        let Ok(mut plugin) = self.registry.create(&parsed.connector_class) else {
            return parsed.tasks_max;
        };
        if plugin.start(config).is_err() {
            return parsed.tasks_max;
        }
        let count = plugin
            .task_configs(parsed.tasks_max)
            .map(|c| c.len())
            .unwrap_or(parsed.tasks_max);
        plugin.stop();
        count
    }

    /// Connect's status answer.
    pub fn status(&self, name: &str) -> Result<ConnectorStateInfo, HerderError> {
        let record = self.record(name)?;
        let state = |state: String, trace: Option<String>| StateInfo {
            state,
            worker_id: self.worker_id.clone(),
            trace,
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
                self.task_ids(name, &record)
                    .into_iter()
                    .map(|id| task(id, "PAUSED".into(), None))
                    .collect(),
            ),
            TargetState::Running => {
                let failure = lock(&self.failures).get(name).cloned();
                match (failure, self.worker.status(name)) {
                    (Some(trace), _) => (state("FAILED".into(), Some(trace)), Vec::new()),
                    (None, Some(status)) => (
                        state(
                            to_state_name(status.state),
                            status.trace.map(|t| self.redact(&record.config, &t)),
                        ),
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

    pub fn task_status(&self, name: &str, task: u32) -> Result<TaskState, HerderError> {
        self.status(name)?
            .tasks
            .into_iter()
            .find(|t| t.id == task)
            .ok_or_else(|| HerderError::UnknownTask {
                connector: name.to_owned(),
                task,
            })
    }

    /// The configuration of each task, as the connector splits it; secrets hidden.
    pub fn task_configs(&self, name: &str) -> Result<Vec<TaskInfo>, HerderError> {
        let record = self.record(name)?;
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
        let configs = plugin.task_configs(parsed.tasks_max).map_err(refused)?;
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

    /// Creates a connector (`POST /connectors`).
    pub async fn create(
        &self,
        mut config: ConfigMap,
        name: &str,
        initial: TargetState,
    ) -> Result<ConnectorInfo, HerderError> {
        config
            .entry("name".to_owned())
            .or_insert_with(|| name.to_owned());
        let _guard = self.control.lock().await;
        if self.store.connector(&key(name))?.is_some() {
            return Err(HerderError::ConnectorExists(name.to_owned()));
        }
        self.check(&config)?;
        let record = ConnectorRecord::new(config.clone(), initial);
        self.store.put_connector(&key(name), &record)?;
        info!(connector = %name, target = %initial, "created");
        if initial == TargetState::Running {
            self.start(name, config).await;
        }
        Ok(self.info_of(name, &record))
    }

    /// Creates or replaces a configuration (`PUT /connectors/{name}/config`); true when created.
    pub async fn put_config(
        &self,
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
        self.write_config(name, config).await
    }

    /// Writes a whole configuration and applies it; the caller holds the control lock.
    async fn write_config(
        &self,
        name: &str,
        mut config: ConfigMap,
    ) -> Result<(bool, ConnectorInfo), HerderError> {
        let existing = self.store.connector(&key(name))?;
        let created = existing.is_none();
        let mut record = existing
            .unwrap_or_else(|| ConnectorRecord::new(ConfigMap::new(), TargetState::Running));
        // A value sent back as `[hidden]` (as GET shows it) keeps the stored secret.
        for (k, v) in config.iter_mut() {
            if v == secrets::HIDDEN {
                if let Some(old) = record.config.get(k) {
                    v.clone_from(old);
                }
            }
        }
        self.check(&config)?;
        record.config = config.clone();
        self.store.put_connector(&key(name), &record)?;
        info!(connector = %name, created, "configuration written");
        if record.target_state == TargetState::Running {
            if created || lock(&self.failures).contains_key(name) {
                self.halt(name).await?;
                self.start(name, config).await;
            } else if let Err(e) = self.worker.reconfigure_connector(config.clone()).await {
                self.failed(name, &config, &e);
            }
        }
        Ok((created, self.info_of(name, &record)))
    }

    /// Changes some keys (`PATCH /connectors/{name}/config`); a `None` value removes the key.
    pub async fn patch_config(
        &self,
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
        let mut config = self.record(name)?.config;
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
        let (_, info) = self.write_config(name, config).await?;
        Ok(info)
    }

    /// Deletes a connector: stops it, then forgets it.
    pub async fn delete(&self, name: &str) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        self.record(name)?;
        self.halt(name).await?;
        self.store.delete_connector(&key(name))?;
        lock(&self.persisted).retain(|(n, _), _| n != name);
        info!(connector = %name, "deleted");
        Ok(())
    }

    /// Moves a connector to `target`: PAUSED and STOPPED stop its tasks (keeping the
    /// configuration), RUNNING starts them again.
    pub async fn set_target(&self, name: &str, target: TargetState) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(name)?;
        if record.target_state == target {
            return Ok(());
        }
        self.store.set_target_state(&key(name), target)?;
        info!(connector = %name, from = %record.target_state, to = %target, "target state");
        match target {
            TargetState::Running => self.start(name, record.config).await,
            TargetState::Paused | TargetState::Stopped => self.halt(name).await?,
        }
        Ok(())
    }

    /// Restarts a connector (`POST /connectors/{name}/restart`). Returns `None` for the plain
    /// request (Connect answers 204), or the status showing what restarts (202).
    ///
    /// The worker restarts a connector with all its tasks, so a restart that touches anything
    /// restarts everything and the answer marks every task RESTARTING.
    pub async fn restart(
        &self,
        name: &str,
        request: RestartRequest,
    ) -> Result<Option<ConnectorStateInfo>, HerderError> {
        let mut status = self.status(name)?;
        let plain = !request.include_tasks && !request.only_failed;
        let connector_failed = status.connector.state == "FAILED";
        let task_failed = status.tasks.iter().any(|t| t.state == "FAILED");
        let wanted = match (request.include_tasks, request.only_failed) {
            (_, false) => true,
            (false, true) => connector_failed,
            (true, true) => connector_failed || task_failed,
        };
        if wanted {
            self.restart_all(name).await?;
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

    /// Restarts one task (`POST /connectors/{name}/tasks/{id}/restart`); see [`Self::restart`].
    pub async fn restart_task(&self, name: &str, task: u32) -> Result<(), HerderError> {
        self.task_status(name, task)?;
        self.restart_all(name).await
    }

    async fn restart_all(&self, name: &str) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(name)?;
        self.store.count_connector_restart(&key(name))?;
        if record.target_state == TargetState::Running {
            info!(connector = %name, "restarting");
            self.halt(name).await?;
            self.start(name, record.config).await;
        }
        Ok(())
    }

    /// The topics a connector reads (`GET /connectors/{name}/topics`): the configured names,
    /// or the pattern for `topics.regex`.
    pub fn topics(&self, name: &str) -> Result<Vec<String>, HerderError> {
        let record = self.record(name)?;
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

    /// The connector's offsets (`GET /connectors/{name}/offsets`): the consumer group's
    /// committed offsets in classic mode. A share group has no offsets per partition — each
    /// record is acknowledged on its own — so share mode answers with an empty list and says so.
    pub async fn offsets(&self, name: &str) -> Result<Offsets, HerderError> {
        let record = self.record(name)?;
        let refused = |source: ConfigError| RuntimeError::Config {
            connector: name.to_owned(),
            source,
        };
        let parsed = SinkConnectorConfig::parse(&record.config).map_err(refused)?;
        let protocol =
            resolve_group_protocol(&record.config, &self.worker_config).map_err(refused)?;
        let group = parsed.group_id();
        if protocol.protocol.is_share() {
            return Ok(Offsets {
                offsets: Vec::new(),
                message: Some(format!(
                    "connector {name} reads through share group '{group}' ({protocol}). A share group \
                     acknowledges records one by one instead of committing an offset per partition, so \
                     there are no sink offsets to show; records not yet acknowledged are delivered again"
                )),
            });
        }
        let bootstrap = parsed
            .consumer_overrides
            .get("bootstrap.servers")
            .or_else(|| self.worker_config.get("bootstrap.servers"))
            .cloned()
            .unwrap_or_default();
        let topics = parsed.topics.clone();
        let (g, b) = (group.clone(), bootstrap.clone());
        let read = tokio::task::spawn_blocking(move || committed_offsets(&b, &g, &topics)).await;
        let offsets = match read {
            Ok(result) => result,
            Err(e) => Err(format!("the offset reader stopped: {e}")),
        }
        .map_err(|reason| HerderError::Offsets {
            group,
            bootstrap,
            reason,
        })?;
        Ok(Offsets {
            offsets,
            message: None,
        })
    }

    /// The `validate` answer for `config`, secrets hidden.
    pub fn validate(&self, config: &ConfigMap) -> ValidationReport {
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
        for entry in &mut report.configs {
            if secrets::is_sensitive(&entry.value.name) && entry.value.value.is_some() {
                entry.value.value = Some(secrets::HIDDEN.to_owned());
            }
            for e in &mut entry.value.errors {
                *e = self.redact(config, e);
            }
        }
        report
    }

    /// Refuses a configuration with errors.
    fn check(&self, config: &ConfigMap) -> Result<(), HerderError> {
        let report = self.validate(config);
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

    /// Writes the tasks' states, traces and restart counts to the store when they changed.
    pub fn persist_task_statuses(&self) -> Result<(), HerderError> {
        for status in self.worker.statuses() {
            let config = self
                .store
                .connector(&key(&status.name))?
                .map(|r| r.config)
                .unwrap_or_default();
            for task in status.tasks {
                let record = TaskRecord {
                    state: to_state_name(task.state),
                    trace: task.trace.map(|t| self.redact(&config, &t)),
                    restarts: task.restarts,
                };
                let id = (status.name.clone(), task.id);
                if lock(&self.persisted).get(&id) == Some(&record) {
                    continue;
                }
                if self.store.put_task(&key(&status.name), task.id, &record)? {
                    lock(&self.persisted).insert(id, record);
                }
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
        match self.registry.create(class) {
            Ok(plugin) => plugin
                .config_def()
                .keys()
                .iter()
                .filter(|k| k.kind == ConfigType::Password)
                .map(|k| k.name.clone())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Reads a consumer group's committed offsets for the partitions of `topics`.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topics: &TopicSelection,
) -> Result<Vec<PartitionOffset>, String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
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
