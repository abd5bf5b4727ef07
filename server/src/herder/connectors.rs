//! What the herder shows of the stored connectors: names, configurations, info, task
//! configurations and topics, secrets hidden.

use serde::Serialize;
use spillway_actors::RuntimeError;
use spillway_connectors::runtime_keys::TASK_ID;
use spillway_core::config::{SinkConnectorConfig, TopicSelection};
use spillway_core::{ConfigError, ConfigMap};
use spillway_storage::{ConnectorRecord, TargetState};

use super::{key, runtime_key, Herder, HerderError};

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

/// One entry of `GET /connectors/{name}/tasks`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskInfo {
    pub id: TaskId,
    pub config: ConfigMap,
}

impl Herder {
    /// The stored connector; a connector of another tenant is as unknown as a missing one.
    pub(super) async fn record(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<ConnectorRecord, HerderError> {
        let k = key(tenant, name);
        self.read(move |store| store.connector(&k))
            .await?
            .ok_or_else(|| HerderError::UnknownConnector(name.to_owned()))
    }

    /// The names of the tenant's connectors, sorted.
    pub async fn connector_names(&self, tenant: &str) -> Result<Vec<String>, HerderError> {
        Ok(self
            .stored_connectors()
            .await?
            .into_iter()
            .filter(|(k, _)| k.tenant == tenant)
            .map(|(k, _)| k.name)
            .collect())
    }

    /// The configuration, secrets hidden.
    pub async fn config(&self, tenant: &str, name: &str) -> Result<ConfigMap, HerderError> {
        Ok(self.masked(&self.record(tenant, name).await?.config))
    }

    pub async fn info(&self, tenant: &str, name: &str) -> Result<ConnectorInfo, HerderError> {
        let record = self.record(tenant, name).await?;
        Ok(self.info_of(tenant, name, &record))
    }

    pub(super) fn info_of(
        &self,
        tenant: &str,
        name: &str,
        record: &ConnectorRecord,
    ) -> ConnectorInfo {
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
    pub(super) fn task_ids(&self, tenant: &str, name: &str, record: &ConnectorRecord) -> Vec<u32> {
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

    /// The configuration of each task, as the connector splits it; secrets hidden.
    pub async fn task_configs(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Vec<TaskInfo>, HerderError> {
        let record = self.record(tenant, name).await?;
        if record.target_state == TargetState::Stopped {
            return Ok(Vec::new());
        }
        if crate::mirror::connectors::MirrorConnector::of_config(&record.config).is_some() {
            // One task runs the connector's part of its flow, with the connector's keys.
            let mut config = record.config.clone();
            config.insert(TASK_ID.to_owned(), "0".to_owned());
            return Ok(vec![TaskInfo {
                id: TaskId {
                    connector: name.to_owned(),
                    task: 0,
                },
                config: self.masked(&config),
            }]);
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

    /// The topics a connector reads (`GET /connectors/{name}/topics`): the configured names,
    /// or the pattern for `topics.regex`.
    pub async fn topics(&self, tenant: &str, name: &str) -> Result<Vec<String>, HerderError> {
        let record = self.record(tenant, name).await?;
        if crate::mirror::connectors::MirrorConnector::of_config(&record.config).is_some() {
            // The source topics its flow copies, as the patterns of its `topics` key.
            let topics = record
                .config
                .get("topics")
                .map(String::as_str)
                .unwrap_or(crate::mirror::config::defaults::TOPICS);
            return Ok(topics
                .split(',')
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect());
        }
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
}
