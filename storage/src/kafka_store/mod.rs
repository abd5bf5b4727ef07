//! Distributed mode's state in Kafka: connector configs, target states, task configs, tenants
//! (with their hashed tokens, quotas and override policies) in a compacted config topic, and
//! connector and task status in a compacted status topic, as Kafka Connect's distributed
//! workers keep them. Every worker reads both topics and rebuilds the same view from them.
//!
//! Beside [`StateStore`](crate::StateStore), not behind it: that trait is synchronous and
//! promises that a read sees every write of any caller, which a Kafka log only gives after a
//! read to the end — a network round trip that must not block the async runtime. So these
//! stores are async, every write returns once it is confirmed *and* read back into this
//! worker's view, and other workers see it after their next [`refresh`](KafkaConfigStore::refresh).
//! sled stays the single worker's store.

mod config_store;
mod records;
mod state_store;
mod status_store;

pub use config_store::{KafkaConfigStore, KafkaStoreError, StoreTopic};
pub use records::{ConfigKey, ConfigView, ConnectorState, Status, StatusKey, StatusView};
pub use state_store::KafkaStateStore;
pub use status_store::KafkaStatusStore;
