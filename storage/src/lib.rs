//! Durable worker state: what a restarted worker needs to bring every connector back as it was.
//!
//! [`StateStore`] is the contract the server uses; [`SledStore`] keeps it in sled under the
//! worker's `state.dir`. Every call that changes state returns only once the change is on disk,
//! so a REST call that answered survives a `kill -9` right after. Opening refuses — with the
//! path and what to do — a store written by a newer Spillway or one that cannot be read;
//! nothing is ever reset silently.
//!
//! [`kafka_store`] keeps the same state in Kafka topics for distributed mode, as Kafka Connect's
//! distributed workers do.

mod error;
pub mod kafka_store;
mod model;
mod sled_store;

pub use error::StorageError;
pub use model::{ConnectorKey, ConnectorRecord, TargetState, TaskRecord, Tenant};
pub use sled_store::{SledStore, FORMAT_VERSION};

/// The worker's durable state, per tenant.
///
/// Writes are durable when they return. Reads see every write that returned before them.
pub trait StateStore: Send + Sync {
    /// Adds or replaces a tenant.
    fn put_tenant(&self, tenant: &Tenant) -> Result<(), StorageError>;
    /// Removes a tenant and every connector it owns; false when there was no such tenant.
    fn delete_tenant(&self, name: &str) -> Result<bool, StorageError>;
    fn tenants(&self) -> Result<Vec<Tenant>, StorageError>;

    /// Adds or replaces a connector's configuration and target state.
    fn put_connector(
        &self,
        key: &ConnectorKey,
        record: &ConnectorRecord,
    ) -> Result<(), StorageError>;
    fn connector(&self, key: &ConnectorKey) -> Result<Option<ConnectorRecord>, StorageError>;
    /// Changes only the target state; false when there is no such connector.
    fn set_target_state(
        &self,
        key: &ConnectorKey,
        state: TargetState,
    ) -> Result<bool, StorageError>;
    /// Adds one to the connector's restart count and returns the new count; `None` when there
    /// is no such connector.
    fn count_connector_restart(&self, key: &ConnectorKey) -> Result<Option<u32>, StorageError>;
    /// Removes a connector with its task records; false when there was no such connector.
    fn delete_connector(&self, key: &ConnectorKey) -> Result<bool, StorageError>;
    /// Every connector of every tenant, ordered by tenant then name.
    fn connectors(&self) -> Result<Vec<(ConnectorKey, ConnectorRecord)>, StorageError>;

    /// Records a task's last known status; ignored (false) when the connector does not exist,
    /// so a late status report cannot resurrect a deleted connector.
    fn put_task(
        &self,
        key: &ConnectorKey,
        task: u32,
        record: &TaskRecord,
    ) -> Result<bool, StorageError>;
    /// [`put_task`](Self::put_task) for several tasks at once (a store that writes over the
    /// network sends them together); one answer per record, in order.
    fn put_tasks(
        &self,
        records: &[(ConnectorKey, u32, TaskRecord)],
    ) -> Result<Vec<bool>, StorageError> {
        records
            .iter()
            .map(|(key, task, record)| self.put_task(key, *task, record))
            .collect()
    }
    /// The task records of one connector, by task id.
    fn tasks(&self, key: &ConnectorKey) -> Result<Vec<(u32, TaskRecord)>, StorageError>;
}
