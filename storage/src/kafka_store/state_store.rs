//! [`KafkaStateStore`]: the config and status topics behind the synchronous
//! [`StateStore`](crate::StateStore) the herder is written against, so that a distributed
//! worker's herder checks, validates and writes exactly as the single worker's does.
//!
//! Reads come from the view as of the last read of the topics (no round trip). A write is
//! produced, confirmed, and read back before it returns, so this worker's next read sees it;
//! other workers see it after their next refresh. In distributed mode only the leader writes
//! configs (the others forward their REST writes to it), so its reads are up to date.
//!
//! The Kafka calls run on a runtime of the store's own and the caller's thread waits for them:
//! the herder calls the store from blocking threads and from the REST executor, neither of
//! which may drive the Kafka futures itself (a current-thread executor blocked on its own
//! future would never finish it).

use std::future::Future;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use super::config_store::{KafkaConfigStore, KafkaStoreError};
use super::records::{Status, StatusKey};
use super::status_store::KafkaStatusStore;
use crate::error::StorageError;
use crate::model::{ConnectorKey, ConnectorRecord, TargetState, TaskRecord, Tenant};
use crate::StateStore;

/// The cluster's state in Kafka, as one worker sees and writes it.
pub struct KafkaStateStore {
    configs: Arc<KafkaConfigStore>,
    statuses: Arc<KafkaStatusStore>,
    io: tokio::runtime::Handle,
    /// Keeps `io` alive (dropped on a thread of its own: a runtime cannot be dropped inside
    /// another's async context).
    runtime: Option<tokio::runtime::Runtime>,
    /// The worker id written into statuses (Connect's host:port).
    worker_id: String,
    /// The group generation statuses are written in.
    generation: AtomicI32,
}

impl std::fmt::Debug for KafkaStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaStateStore")
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

impl Drop for KafkaStateStore {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn kafka(error: KafkaStoreError) -> StorageError {
    StorageError::Kafka(error.to_string())
}

impl KafkaStateStore {
    /// Wraps the opened stores; `worker_id` names this worker in the statuses it writes.
    pub fn new(
        configs: Arc<KafkaConfigStore>,
        statuses: Arc<KafkaStatusStore>,
        worker_id: String,
    ) -> std::io::Result<KafkaStateStore> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kafka-state-store")
            .enable_all()
            .build()?;
        Ok(KafkaStateStore {
            configs,
            statuses,
            io: runtime.handle().clone(),
            runtime: Some(runtime),
            worker_id,
            generation: AtomicI32::new(0),
        })
    }

    /// The config topic's store (for refreshes and task configs).
    pub fn configs(&self) -> &Arc<KafkaConfigStore> {
        &self.configs
    }

    /// The status topic's store.
    pub fn statuses(&self) -> &Arc<KafkaStatusStore> {
        &self.statuses
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The generation statuses are written in from now on.
    pub fn set_generation(&self, generation: i32) {
        self.generation.store(generation, Ordering::Release);
    }

    pub fn generation(&self) -> i32 {
        self.generation.load(Ordering::Acquire)
    }

    /// A status of this worker, in the current generation.
    pub fn status(&self, state: &str, trace: Option<String>, restarts: u32) -> Status {
        Status {
            state: state.to_owned(),
            trace,
            worker_id: self.worker_id.clone(),
            generation: self.generation(),
            restarts,
        }
    }

    /// Runs `call` on the store's runtime and waits for it on this thread.
    fn wait<T: Send + 'static>(
        &self,
        call: impl Future<Output = Result<T, KafkaStoreError>> + Send + 'static,
    ) -> Result<T, StorageError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.io.spawn(async move {
            let _ = tx.send(call.await);
        });
        rx.recv()
            .map_err(|_| StorageError::Kafka("the store's runtime stopped".into()))?
            .map_err(kafka)
    }

    fn record(state: &super::records::ConnectorState) -> ConnectorRecord {
        ConnectorRecord {
            config: state.config.clone(),
            target_state: state.target_state,
            restarts: state.restarts,
        }
    }
}

impl StateStore for KafkaStateStore {
    fn put_tenant(&self, tenant: &Tenant) -> Result<(), StorageError> {
        let (configs, tenant) = (Arc::clone(&self.configs), tenant.clone());
        self.wait(async move { configs.put_tenant(&tenant).await })
    }

    fn delete_tenant(&self, name: &str) -> Result<bool, StorageError> {
        let (configs, name) = (Arc::clone(&self.configs), name.to_owned());
        self.wait(async move { configs.delete_tenant(&name).await })
    }

    fn tenants(&self) -> Result<Vec<Tenant>, StorageError> {
        Ok(self.configs.view().tenants.into_values().collect())
    }

    fn put_connector(
        &self,
        key: &ConnectorKey,
        record: &ConnectorRecord,
    ) -> Result<(), StorageError> {
        let configs = Arc::clone(&self.configs);
        let (key, record) = (key.clone(), record.clone());
        self.wait(async move {
            configs
                .put_connector(&key, &record.config, Some(record.target_state))
                .await
        })
    }

    fn connector(&self, key: &ConnectorKey) -> Result<Option<ConnectorRecord>, StorageError> {
        Ok(self.configs.view().connectors.get(key).map(Self::record))
    }

    fn set_target_state(
        &self,
        key: &ConnectorKey,
        state: TargetState,
    ) -> Result<bool, StorageError> {
        let (configs, key) = (Arc::clone(&self.configs), key.clone());
        self.wait(async move { configs.set_target_state(&key, state).await })
    }

    fn count_connector_restart(&self, key: &ConnectorKey) -> Result<Option<u32>, StorageError> {
        let (configs, key) = (Arc::clone(&self.configs), key.clone());
        self.wait(async move { configs.count_connector_restart(&key).await })
    }

    fn delete_connector(&self, key: &ConnectorKey) -> Result<bool, StorageError> {
        let tasks = self
            .configs
            .view()
            .connectors
            .get(key)
            .map_or(0, |c| c.tasks.len() as u32);
        let (configs, statuses, key) = (
            Arc::clone(&self.configs),
            Arc::clone(&self.statuses),
            key.clone(),
        );
        self.wait(async move {
            let deleted = configs.delete_connector(&key).await?;
            if deleted {
                statuses.delete_connector(&key, tasks).await?;
            }
            Ok(deleted)
        })
    }

    fn connectors(&self) -> Result<Vec<(ConnectorKey, ConnectorRecord)>, StorageError> {
        Ok(self
            .configs
            .view()
            .connectors
            .iter()
            .map(|(k, c)| (k.clone(), Self::record(c)))
            .collect())
    }

    fn put_task(
        &self,
        key: &ConnectorKey,
        task: u32,
        record: &TaskRecord,
    ) -> Result<bool, StorageError> {
        if !self.configs.view().connectors.contains_key(key) {
            return Ok(false);
        }
        let status = self.status(&record.state, record.trace.clone(), record.restarts);
        let (statuses, key) = (
            Arc::clone(&self.statuses),
            StatusKey::Task(key.clone(), task),
        );
        self.wait(async move { statuses.put(&key, &status).await })?;
        Ok(true)
    }

    fn put_tasks(
        &self,
        records: &[(ConnectorKey, u32, TaskRecord)],
    ) -> Result<Vec<bool>, StorageError> {
        // One produce and one read back for all: after a rebalance a worker writes the status
        // of every task it took over, and one round trip each would delay them by seconds.
        let connectors = self.configs.view().connectors;
        let mut written = Vec::with_capacity(records.len());
        let mut statuses = Vec::new();
        for (key, task, record) in records {
            let known = connectors.contains_key(key);
            written.push(known);
            if known {
                statuses.push((
                    StatusKey::Task(key.clone(), *task),
                    self.status(&record.state, record.trace.clone(), record.restarts),
                ));
            }
        }
        let store = Arc::clone(&self.statuses);
        self.wait(async move { store.put_all(&statuses).await })?;
        Ok(written)
    }

    fn tasks(&self, key: &ConnectorKey) -> Result<Vec<(u32, TaskRecord)>, StorageError> {
        Ok(self
            .statuses
            .view()
            .statuses
            .into_iter()
            .filter_map(|(k, s)| match k {
                StatusKey::Task(c, task) if &c == key => Some((
                    task,
                    TaskRecord {
                        state: s.state,
                        trace: s.trace,
                        restarts: s.restarts,
                    },
                )),
                _ => None,
            })
            .collect())
    }
}
