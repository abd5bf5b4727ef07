//! Keys the runtime adds to the configuration it hands a connector and its tasks (users do not
//! set them): what a plugin may need to know about where it runs.

/// The task's number within its connector (0-based), in each task's configuration.
pub const TASK_ID: &str = "task.id";
/// The bootstrap servers of the cluster the connector reads from (the worker's, or the
/// connector's `consumer.override.bootstrap.servers`).
pub const SOURCE_BOOTSTRAP_SERVERS: &str = "source.bootstrap.servers";
/// The tenant owning the connector, in the connector configuration; `default` when absent.
/// Names the tenant in the connector's log lines and trace spans.
pub const TENANT: &str = "spillway.tenant";
/// Set by the runtime for a connector of a tenant (never `default`), in the connector
/// configuration: the tenant whose prefix (`<tenant>.`) the plugin puts on the names it
/// derives in Kafka (transactional ids, ledger topics), as the runtime does for group ids.
/// A value the user wrote is replaced (or removed for `default`).
pub const TENANT_PREFIX: &str = "spillway.tenant.prefix";
/// Set by the runtime when the connector's tenant is confined to a directory (authentication
/// on, a tenant other than `default`): every path-valued key resolves inside it
/// ([`crate::paths`]). A value the user wrote is replaced (or removed when not confined).
pub const FILES_ROOT: &str = "spillway.files.root";
/// Set by the runtime when the connector's tenant is held to the worker's egress policy
/// (authentication on, a tenant other than `default`): the allow-list, by which the plugin
/// vets every address it connects to ([`spillway_core::egress::EgressPolicy::vet`]). A value
/// the user wrote is replaced (or removed when not confined).
pub use spillway_core::egress::EGRESS_RUNTIME_KEY as EGRESS_ALLOW;
