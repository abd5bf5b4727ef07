//! [`Herder`]: Kafka Connect's name for the part of a worker that owns the connectors' life —
//! creating, reconfiguring, pausing, stopping, restarting — between the REST API, the durable
//! [`StateStore`] and the [`Worker`] that runs the tasks.
//!
//! Every change is written to the store before the worker acts on it and before the caller
//! gets an answer, so a worker killed at any moment comes back with what it last confirmed.
//! Changes are serialised by one lock; reads take none. The store is read and written on
//! blocking threads (sled may wait for the disk), never on the executor serving REST requests.
//!
//! Everything the herder hands out has the values of sensitive keys replaced by `[hidden]`
//! ([`secrets`]): configurations, task configurations, validation answers and messages.
//!
//! The herder's jobs, a file each: [`lifecycle`] (create, reconfigure, delete, pause, resume,
//! restart), [`connectors`] (what it shows of the stored connectors), [`status`] (the status
//! answer and the task statuses it keeps in the store), [`validation`] (the checks before a
//! configuration is stored), [`quotas`] (tenants, their quotas and the worker's task limit),
//! [`offsets`] (KIP-875's offsets API) and [`cluster`] (what distributed mode adds).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use spillway_actors::settings::runtime_config_def;
use spillway_actors::{Confinement, RuntimeError, State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{
    sink_connector::CONNECTOR_CLASS, ConfigDef, ConfigType, KeyInfo, ValidationReport,
};
use spillway_core::ConfigMap;
use spillway_storage::{ConnectorKey, ConnectorRecord, StateStore, StorageError, TaskRecord};

use crate::distributed::ClusterLink;
use crate::secrets;
pub use crate::tenants::DEFAULT_TENANT;
use crate::tenants::{TenantError, Tenants};

mod cluster;
mod connectors;
mod lifecycle;
mod offsets;
mod quotas;
mod status;
mod validation;

pub use connectors::{ConnectorInfo, TaskId, TaskInfo};
pub use lifecycle::RestartRequest;
pub use offsets::{OffsetChange, Offsets, PartitionOffset, OFFSETS_ALTERED, OFFSETS_RESET};
pub use quotas::{TenantDetails, Usage, DEFAULT_TENANT_TASKS, TENANT_DEFAULT_QUOTA_TASKS};
pub use status::{ConnectorStateInfo, StateInfo, TaskState};

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

/// One entry of `GET /connector-plugins`.
#[derive(Debug, Clone, Serialize)]
pub struct PluginInfo {
    pub class: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub version: String,
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
    /// MirrorMaker 2's connectors running here (their flows run beside the worker's runtime).
    mirrors: crate::mirror::connectors::MirrorConnectors,
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
            mirrors: Default::default(),
        })
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

    pub fn plugins(&self) -> Vec<PluginInfo> {
        use crate::mirror::connectors::MirrorConnector;
        let mut plugins: Vec<PluginInfo> = self
            .registry
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
            .collect();
        // MM2's connectors are source connectors in Connect's terms (they write the target).
        for connector in [
            MirrorConnector::Source,
            MirrorConnector::Checkpoint,
            MirrorConnector::Heartbeat,
        ] {
            plugins.push(PluginInfo {
                class: connector.class(),
                kind: "source",
                version: env!("CARGO_PKG_VERSION").to_owned(),
            });
        }
        plugins
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
            || crate::mirror::connectors::MirrorConnector::of_class(plugin).is_some()
    }

    /// Runs a change of the store on a blocking thread: sled writes it to disk before it
    /// returns, which must not hold up the executor serving the other REST requests.
    async fn write<T: Send + 'static>(
        &self,
        change: impl FnOnce(&dyn StateStore) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, HerderError> {
        let written = self.off_executor("write", change).await?;
        if let Some(cluster) = &self.cluster {
            // The reconcilers act on what was written; this one (the leader's) at once.
            cluster.changed();
        }
        Ok(written)
    }

    /// Runs a read of the store on a blocking thread, as [`write`](Self::write) does a
    /// change: a sled read that misses its cache waits for the disk, and the REST handlers
    /// that ask run on the executor.
    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&dyn StateStore) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, HerderError> {
        self.off_executor("read", query).await
    }

    /// Every stored connector, of every tenant, read off the executor.
    async fn stored_connectors(&self) -> Result<Vec<(ConnectorKey, ConnectorRecord)>, HerderError> {
        self.read(|store| store.connectors()).await
    }

    async fn off_executor<T: Send + 'static>(
        &self,
        what: &'static str,
        work: impl FnOnce(&dyn StateStore) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, HerderError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || work(store.as_ref()))
            .await
            .map_err(|e| {
                HerderError::Runtime(RuntimeError::Task(format!(
                    "the state store {what} did not finish: {e}"
                )))
            })?
            .map_err(HerderError::from)
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

#[cfg(test)]
pub(crate) mod test_store;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spillway_core::config::config_map;
    use spillway_storage::TargetState;

    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use spillway_actors::{Confinement, OverridePolicy};
    use spillway_storage::StateStore;

    use super::test_store::{herder_on, ticks_during, CountingStore};
    use super::{HerderError, DEFAULT_TENANT};
    use crate::tenants::{Quotas, Tenants};

    fn file_config(file: &str) -> spillway_core::ConfigMap {
        config_map(&[
            ("connector.class", "file"),
            ("topics", "t"),
            ("file", file),
            ("tasks.max", "1"),
            ("consumer.override.group.protocol", "classic"),
        ])
    }

    /// A store write that takes long (sled syncing to a slow disk) runs on a blocking thread:
    /// the executor serving REST requests goes on meanwhile. One thread, as a worker under load
    /// has every executor thread busy.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_store_write_does_not_hold_up_the_executor() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CountingStore::open(dir.path(), Duration::from_millis(800), Duration::ZERO);
        let herder = herder_on(&store);
        let file = dir.path().join("out.txt").display().to_string();
        let (created, during, took) = ticks_during(herder.create(
            DEFAULT_TENANT,
            file_config(&file),
            "slow",
            TargetState::Stopped,
        ))
        .await;
        created.expect("created");
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

    /// The store's reads run on blocking threads too: the connector record (is the name free,
    /// what is its state), the other connectors for the group-id, task-limit and quota checks,
    /// and what the REST API shows. A store slow to read (a cold cache on a busy disk) holds up
    /// only the request that reads.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_store_read_does_not_hold_up_the_executor() {
        let read_delay = Duration::from_millis(200);
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CountingStore::open(dir.path(), Duration::ZERO, read_delay);
        let herder = herder_on(&store);
        let file = dir.path().join("out.txt").display().to_string();
        // A change reads before it writes: the record (create: is the name free; pause: what
        // is its state) and every connector (group ids; task limit and quotas on resuming).
        let (changed, during, took) = ticks_during(async {
            herder
                .create(
                    DEFAULT_TENANT,
                    file_config(&file),
                    "slow",
                    TargetState::Stopped,
                )
                .await?;
            herder
                .set_target(DEFAULT_TENANT, "slow", TargetState::Paused)
                .await
        })
        .await;
        changed.expect("created and paused");
        assert!(took >= read_delay * 4, "the reads took {took:?}");
        // 10 ms ticks: took/10 if the executor were free all along; blocked, 0 or 1.
        assert!(
            during as u128 * 40 >= took.as_millis(),
            "the executor was held up by the store reads of a change: {during} ticks in {took:?}"
        );
        // What the REST API shows is read off the executor as well.
        let (shown, during, took) = ticks_during(async {
            let config = herder.config(DEFAULT_TENANT, "slow").await?;
            let status = herder.status(DEFAULT_TENANT, "slow").await?;
            let names = herder.connector_names(DEFAULT_TENANT).await?;
            let tenant = herder.tenant_details(DEFAULT_TENANT).await?;
            Ok::<_, super::HerderError>((config, status, names, tenant))
        })
        .await;
        let (config, status, names, tenant) = shown.expect("shown");
        assert_eq!(config.get("file"), Some(&file));
        assert_eq!(status.connector.state, "PAUSED");
        assert_eq!(names, vec!["slow".to_owned()]);
        assert_eq!(tenant.usage.connectors, 1);
        assert!(took >= read_delay * 4, "the reads took {took:?}");
        assert!(
            during as u128 * 40 >= took.as_millis(),
            "the executor was held up by the store reads of the REST answers: {during} ticks in {took:?}"
        );
    }

    /// The tenant admin calls write the store on a blocking thread too: creating a tenant,
    /// changing its quotas, rotating its token and deleting it on a slow store hold up only
    /// the admin's request, not the executor the other requests (and their authentication)
    /// run on.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_tenant_write_does_not_hold_up_the_executor() {
        let write_delay = Duration::from_millis(300);
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CountingStore::open(dir.path(), write_delay, Duration::ZERO);
        let herder = herder_on(&store);
        let (changed, during, took) = ticks_during(async {
            herder
                .create_tenant("acme", Quotas::default(), None)
                .await?;
            let quotas = Quotas {
                connectors: Some(2),
                ..Quotas::default()
            };
            herder.update_tenant("acme", quotas, None).await?;
            let token = herder.rotate_token("acme").await?;
            herder.delete_tenant("acme", false).await?;
            Ok::<_, HerderError>(token)
        })
        .await;
        let token = changed.expect("created, changed, rotated and deleted");
        assert!(!herder.tenants().exists("acme"));
        assert_eq!(herder.tenants().by_token(&token), None);
        assert!(took >= write_delay * 4, "the writes took {took:?}");
        // 10 ms ticks: took/10 if the executor were free all along; blocked, 0 to 4.
        assert!(
            during as u128 * 40 >= took.as_millis(),
            "the executor was held up by the tenant writes: {during} ticks in {took:?}"
        );
    }

    /// Tenant changes take turns from reading the tenant until memory follows the store,
    /// whoever calls (here the tenants directly, without the herder's change lock): a quota
    /// change and two token rotations at once all take effect, none undoing another, and the
    /// one token that works is the one the store holds. A change the store refuses changes
    /// nothing in memory and says why.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tenant_changes_take_turns_and_one_the_store_refuses_changes_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CountingStore::open(dir.path(), Duration::from_millis(100), Duration::ZERO);
        let herder = Arc::new(herder_on(&store));
        let (_, first) = herder
            .create_tenant("acme", Quotas::default(), None)
            .await
            .expect("created");
        let updating = tokio::spawn({
            let herder = Arc::clone(&herder);
            let quotas = Quotas {
                connectors: Some(2),
                ..Quotas::default()
            };
            async move { herder.tenants().update("acme", quotas, None).await }
        });
        let rotations: Vec<_> = (0..2)
            .map(|_| {
                let herder = Arc::clone(&herder);
                tokio::spawn(async move { herder.tenants().rotate_token("acme").await })
            })
            .collect();
        updating.await.expect("joined").expect("updated");
        let mut tokens = Vec::new();
        for rotation in rotations {
            tokens.push(rotation.await.expect("joined").expect("rotated"));
        }
        let working: Vec<&String> = tokens
            .iter()
            .filter(|t| herder.tenants().by_token(t).is_some())
            .collect();
        assert_eq!(working.len(), 1, "one token works: {working:?}");
        assert_eq!(herder.tenants().by_token(&first), None);
        assert_eq!(herder.tenants().quotas("acme").connectors, Some(2));
        let stored = || {
            Tenants::load(
                Arc::clone(&store) as Arc<dyn StateStore>,
                OverridePolicy::All,
                Confinement::default(),
            )
            .expect("the stored tenants")
        };
        assert_eq!(
            stored().by_token(working[0]).as_deref(),
            Some("acme"),
            "memory holds the token the store holds"
        );
        assert_eq!(
            stored().quotas("acme").connectors,
            Some(2),
            "no rotation undid the quota change"
        );

        store.refuse_tenant_writes.store(true, Ordering::SeqCst);
        let before = herder.tenants().get("acme").expect("acme").quotas;
        let quotas = Quotas {
            connectors: Some(1),
            ..Quotas::default()
        };
        let refusals = [
            herder
                .create_tenant("beta", Quotas::default(), None)
                .await
                .map(|_| ()),
            herder.update_tenant("acme", quotas, None).await.map(|_| ()),
            herder.rotate_token("acme").await.map(|_| ()),
            herder.delete_tenant("acme", false).await,
        ];
        for refused in refusals {
            let err = refused.expect_err("the store refuses");
            assert!(
                err.to_string().contains("refuses tenant writes"),
                "the error says why: {err}"
            );
        }
        let tenants = herder.tenants();
        assert!(
            !tenants.exists("beta"),
            "a refused creation leaves no tenant"
        );
        assert_eq!(tenants.get("acme").expect("acme kept").quotas, before);
        assert_eq!(tenants.by_token(working[0]).as_deref(), Some("acme"));
        assert_eq!(stored().quotas("acme"), before);
    }
}
