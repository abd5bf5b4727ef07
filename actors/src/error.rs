//! The runtime's errors: what stops a connector from starting, or a task from running.

use spillway_core::ConfigError;

/// Errors of the sink runtime.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    #[error("connector '{connector}': {source}")]
    Config {
        connector: String,
        #[source]
        source: ConfigError,
    },
    #[error("worker configuration: {0}")]
    WorkerConfig(ConfigError),
    /// Kafka has one namespace for group ids: a group of another type holds the connector's.
    #[error("connector '{connector}' cannot use group id '{group}': {reason}")]
    GroupIdConflict {
        connector: String,
        group: String,
        reason: String,
    },
    #[error("no connector named '{0}' runs on this worker")]
    UnknownConnector(String),
    #[error(
        "a connector named '{0}' already runs on this worker; stop it first or reconfigure it"
    )]
    ConnectorExists(String),
    #[error("connector '{connector}' has no task {task}")]
    UnknownTask { connector: String, task: u32 },
    #[error("the worker has stopped")]
    WorkerStopped,
    #[error("cannot read from Kafka: {0}")]
    Source(String),
    /// A broker of a cluster the tenant named is refused by the worker's egress policy: a
    /// restart cannot help.
    #[error("cannot read from Kafka: {0}")]
    Egress(String),
    #[error("cannot write the dead letter for {record} to '{topic}': {reason}")]
    DeadLetter {
        record: String,
        topic: String,
        reason: String,
    },
    #[error("{0}")]
    Task(String),
}
