//! [`KafkaStatusStore`]: connector and task status in the status topic.

use std::sync::Mutex;

use bytes::Bytes;
use spillway_kafka::admin::AdminClient;
use spillway_kafka::kafka_log::KafkaLog;
use tracing::warn;

use super::config_store::{KafkaStoreError, StoreTopic};
use super::records::{Status, StatusKey, StatusView};
use crate::model::ConnectorKey;

/// The status topic: each worker writes the status of what it runs; every worker reads all.
pub struct KafkaStatusStore {
    log: KafkaLog,
    view: Mutex<StatusView>,
}

impl std::fmt::Debug for KafkaStatusStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaStatusStore")
            .field("topic", &self.log.topic())
            .finish_non_exhaustive()
    }
}

impl KafkaStatusStore {
    /// Creates the status topic (compacted, `partitions` of them) when it is missing and reads
    /// it to the end.
    pub async fn open(
        admin: &AdminClient,
        topic: &StoreTopic,
    ) -> Result<KafkaStatusStore, KafkaStoreError> {
        let log = topic
            .open_log(admin, topic.partitions, "the status topic")
            .await?;
        let store = KafkaStatusStore {
            log,
            view: Mutex::new(StatusView::default()),
        };
        store.refresh().await?;
        Ok(store)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatusView> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the topic to its end and returns the view.
    pub async fn refresh(&self) -> Result<StatusView, KafkaStoreError> {
        let records = self.log.read_to_end().await?;
        let mut view = self.lock();
        let before = view.unreadable.len();
        for r in &records {
            view.apply(r.offset, r.key.as_deref(), r.value.as_deref());
        }
        for problem in &view.unreadable[before..] {
            warn!(topic = self.log.topic(), %problem, "status topic record ignored");
        }
        Ok(view.clone())
    }

    /// The view as of the last read.
    pub fn view(&self) -> StatusView {
        self.lock().clone()
    }

    /// Writes a status and reads it back.
    pub async fn put(&self, key: &StatusKey, status: &Status) -> Result<(), KafkaStoreError> {
        let value = Bytes::from(serde_json::to_vec(status).expect("status serialises"));
        self.log.send(key.encode(), Some(value)).await?;
        self.refresh().await?;
        Ok(())
    }

    /// Writes several statuses together and reads them back.
    pub async fn put_all(&self, statuses: &[(StatusKey, Status)]) -> Result<(), KafkaStoreError> {
        if statuses.is_empty() {
            return Ok(());
        }
        let records = statuses
            .iter()
            .map(|(key, status)| {
                let value = Bytes::from(serde_json::to_vec(status).expect("status serialises"));
                (key.encode(), Some(value))
            })
            .collect();
        self.log.send_all(records).await?;
        self.refresh().await?;
        Ok(())
    }

    /// Removes the statuses of a deleted connector and of its `tasks` tasks.
    pub async fn delete_connector(
        &self,
        key: &ConnectorKey,
        tasks: u32,
    ) -> Result<(), KafkaStoreError> {
        let mut records = vec![(StatusKey::Connector(key.clone()).encode(), None)];
        for t in 0..tasks {
            records.push((StatusKey::Task(key.clone(), t).encode(), None));
        }
        self.log.send_all(records).await?;
        self.refresh().await?;
        Ok(())
    }
}
