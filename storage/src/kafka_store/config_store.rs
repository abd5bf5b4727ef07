//! [`KafkaConfigStore`]: the config topic, written and read as a log.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use spillway_kafka::admin::AdminClient;
use spillway_kafka::kafka_log::{ensure_compacted_topic, CompactedTopic, KafkaLog, KafkaLogError};
use tracing::warn;

use super::records::{
    CommitValue, ConfigKey, ConfigView, ConnectorConfigValue, RestartsValue, TargetStateValue,
    TaskConfigValue, TenantValue,
};
use crate::model::{ConnectorKey, TargetState, Tenant};

/// Errors of the Kafka-backed stores.
#[derive(Debug, thiserror::Error)]
pub enum KafkaStoreError {
    #[error(transparent)]
    Log(#[from] KafkaLogError),
    #[error("the config topic '{topic}' has {partitions} partitions; it must have exactly one, so that every worker reads the configs in the order they were written. Point config.storage.topic at a topic with one partition (or a new name, which the worker creates)")]
    ConfigTopicPartitions { topic: String, partitions: usize },
    #[error("{kind} name '{name}' cannot be stored: it must be non-empty")]
    InvalidName { kind: &'static str, name: String },
}

/// Where a store lives and how its topic is created when missing.
#[derive(Debug, Clone)]
pub struct StoreTopic {
    pub bootstrap: String,
    /// The worker's client settings (security keys), for the producer and the reader.
    pub client: Vec<(String, String)>,
    pub topic: String,
    /// `*.storage.partitions` (-1: the broker's default); the config topic always has one.
    pub partitions: i32,
    /// `*.storage.replication.factor` (-1: the broker's default).
    pub replication_factor: i16,
    /// How long a read to the end may take.
    pub read_timeout: Duration,
}

impl StoreTopic {
    pub(crate) async fn open_log(
        &self,
        admin: &AdminClient,
        partitions: i32,
        purpose: &'static str,
    ) -> Result<KafkaLog, KafkaStoreError> {
        ensure_compacted_topic(
            admin,
            &CompactedTopic {
                name: self.topic.clone(),
                partitions,
                replication_factor: self.replication_factor,
                purpose,
            },
        )
        .await?;
        let client = self
            .client
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>();
        Ok(KafkaLog::open(&self.bootstrap, &self.topic, client, self.read_timeout).await?)
    }
}

/// The config topic; see the module docs of `kafka_store`.
pub struct KafkaConfigStore {
    log: KafkaLog,
    view: Mutex<ConfigView>,
}

impl std::fmt::Debug for KafkaConfigStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfigStore")
            .field("topic", &self.log.topic())
            .finish_non_exhaustive()
    }
}

fn value<T: Serialize>(v: &T) -> Option<Bytes> {
    // Maps of strings and numbers: serialising cannot fail.
    Some(Bytes::from(
        serde_json::to_vec(v).expect("record serialises"),
    ))
}

fn check(kind: &'static str, name: &str) -> Result<(), KafkaStoreError> {
    if name.is_empty() {
        return Err(KafkaStoreError::InvalidName {
            kind,
            name: name.to_owned(),
        });
    }
    Ok(())
}

fn check_connector(key: &ConnectorKey) -> Result<(), KafkaStoreError> {
    check("tenant", &key.tenant)?;
    check("connector", &key.name)
}

impl KafkaConfigStore {
    /// Creates the config topic (one partition, compacted) when it is missing, checks it,
    /// and reads it to the end.
    pub async fn open(
        admin: &AdminClient,
        topic: &StoreTopic,
    ) -> Result<KafkaConfigStore, KafkaStoreError> {
        let log = topic.open_log(admin, 1, "the config topic").await?;
        if log.partitions().len() != 1 {
            return Err(KafkaStoreError::ConfigTopicPartitions {
                topic: topic.topic.clone(),
                partitions: log.partitions().len(),
            });
        }
        let store = KafkaConfigStore {
            log,
            view: Mutex::new(ConfigView::default()),
        };
        store.refresh().await?;
        Ok(store)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConfigView> {
        // Each critical section applies whole records; a panic cannot leave half of one.
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the topic to its end and returns the view: every write confirmed (by any worker)
    /// before the call is in it.
    pub async fn refresh(&self) -> Result<ConfigView, KafkaStoreError> {
        let records = self.log.read_to_end().await?;
        let mut view = self.lock();
        let unreadable_before = view.unreadable.len();
        for r in &records {
            view.apply(r.offset, r.key.as_deref(), r.value.as_deref());
        }
        for problem in &view.unreadable[unreadable_before..] {
            warn!(topic = self.log.topic(), %problem, "config topic record ignored");
        }
        Ok(view.clone())
    }

    /// The view as of the last read (no round trip).
    pub fn view(&self) -> ConfigView {
        self.lock().clone()
    }

    /// The offset of the next record to read: what the worker's group metadata reports.
    pub fn offset(&self) -> i64 {
        self.lock().offset
    }

    /// Writes `records` in order and reads them back into the view.
    async fn write(&self, records: Vec<(ConfigKey, Option<Bytes>)>) -> Result<(), KafkaStoreError> {
        self.log
            .send_all(records.into_iter().map(|(k, v)| (k.encode(), v)).collect())
            .await?;
        self.refresh().await?;
        Ok(())
    }

    /// Adds or replaces a tenant (its settings hold the token digest, quotas and policy).
    pub async fn put_tenant(&self, tenant: &Tenant) -> Result<(), KafkaStoreError> {
        check("tenant", &tenant.name)?;
        self.write(vec![(
            ConfigKey::Tenant(tenant.name.clone()),
            value(&TenantValue {
                settings: tenant.settings.clone(),
            }),
        )])
        .await
    }

    /// Removes a tenant: tombstones for each of its connectors, then for the tenant.
    pub async fn delete_tenant(&self, name: &str) -> Result<bool, KafkaStoreError> {
        check("tenant", name)?;
        let view = self.refresh().await?;
        if !view.tenants.contains_key(name) {
            return Ok(false);
        }
        let mut records = Vec::new();
        for key in view.connectors.keys().filter(|k| k.tenant == name) {
            records.push((ConfigKey::TargetState(key.clone()), None));
            records.push((ConfigKey::Connector(key.clone()), None));
        }
        records.push((ConfigKey::Tenant(name.to_owned()), None));
        self.write(records).await?;
        Ok(true)
    }

    /// Adds or replaces a connector's config. A new connector's target state is written first,
    /// so that no reader ever sees it running when it was created paused or stopped.
    pub async fn put_connector(
        &self,
        key: &ConnectorKey,
        config: &BTreeMap<String, String>,
        target_state: Option<TargetState>,
    ) -> Result<(), KafkaStoreError> {
        check_connector(key)?;
        let mut records = Vec::new();
        if let Some(state) = target_state {
            records.push((
                ConfigKey::TargetState(key.clone()),
                value(&TargetStateValue { state }),
            ));
        }
        records.push((
            ConfigKey::Connector(key.clone()),
            value(&ConnectorConfigValue {
                config: config.clone(),
            }),
        ));
        self.write(records).await
    }

    /// Changes only the target state; false when there is no such connector.
    pub async fn set_target_state(
        &self,
        key: &ConnectorKey,
        state: TargetState,
    ) -> Result<bool, KafkaStoreError> {
        check_connector(key)?;
        if !self.refresh().await?.connectors.contains_key(key) {
            return Ok(false);
        }
        self.write(vec![(
            ConfigKey::TargetState(key.clone()),
            value(&TargetStateValue { state }),
        )])
        .await?;
        Ok(true)
    }

    /// Writes a connector's task configs, then the commit record that makes them take effect.
    pub async fn put_task_configs(
        &self,
        key: &ConnectorKey,
        tasks: &[BTreeMap<String, String>],
    ) -> Result<(), KafkaStoreError> {
        check_connector(key)?;
        let mut records: Vec<(ConfigKey, Option<Bytes>)> = tasks
            .iter()
            .enumerate()
            .map(|(i, config)| {
                (
                    ConfigKey::Task(key.clone(), i as u32),
                    value(&TaskConfigValue {
                        config: config.clone(),
                    }),
                )
            })
            .collect();
        records.push((
            ConfigKey::Commit(key.clone()),
            value(&CommitValue {
                tasks: tasks.len() as u32,
            }),
        ));
        self.write(records).await
    }

    /// Adds one to the connector's restart count; `None` when there is no such connector.
    pub async fn count_connector_restart(
        &self,
        key: &ConnectorKey,
    ) -> Result<Option<u32>, KafkaStoreError> {
        check_connector(key)?;
        let Some(state) = self.refresh().await?.connectors.get(key).cloned() else {
            return Ok(None);
        };
        let restarts = state.restarts + 1;
        self.write(vec![(
            ConfigKey::Restarts(key.clone()),
            value(&RestartsValue { restarts }),
        )])
        .await?;
        Ok(Some(restarts))
    }

    /// Removes a connector (tombstones for its target state and config); false when there
    /// was no such connector.
    pub async fn delete_connector(&self, key: &ConnectorKey) -> Result<bool, KafkaStoreError> {
        check_connector(key)?;
        if !self.refresh().await?.connectors.contains_key(key) {
            return Ok(false);
        }
        self.write(vec![
            (ConfigKey::TargetState(key.clone()), None),
            (ConfigKey::Connector(key.clone()), None),
        ])
        .await?;
        Ok(true)
    }
}
