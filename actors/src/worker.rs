//! [`Worker`]: the API the server (and tests) use to run connectors. It owns an actix system on
//! a thread of its own; every method may be called from any async runtime.
//!
//! Starting a connector decides everything up front — the shared keys, the group protocol
//! (KIP-1302's resolution order), the group id, the runtime settings, the share-group id check —
//! and refuses the connector with a message that names the problem, before any task runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::prelude::*;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{
    resolve_group_protocol, sink_connector::TASKS_MAX, SinkConnectorConfig, TopicSelection,
};
use spillway_core::{ConfigError, ConfigMap};
use spillway_kafka::admin::AdminClients;
use spillway_kafka::groups::Membership;
use spillway_kafka::producer::IdempotentProducer;
use tracing::{info, warn};

use crate::consumer_settings::ConsumerSettings;
use crate::dead_letter::ProducerDeadLetters;
use crate::error::RuntimeError;
use crate::group_ids::{conflict_reason, GroupIdChecker, GroupIdQuery, GroupIdVerdict, JoinWatch};
use crate::limits::{task_weight, TaskCost, WorkerLimits};
use crate::pool::{task_threads, TaskPool};
use crate::router::{Assign, ConnectorRouter, Kill, List, Resize, RestartOne, Start, Stop};
use crate::settings::{TaskSettings, BOOTSTRAP_SERVERS};
use crate::share_group::{Preparation, ShareGroupWish};
use crate::status::{ConnectorStatus, StatusBoard};
use crate::supervisor::ConnectorPlan;
use crate::tenancy::{OverridePolicy, TenantScope, OVERRIDE_POLICY};

/// How long one admin request may take (group configs, topic creation).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the group id check may take.
const GROUP_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The connector key a group id refusal is reported on: where the fix goes.
const GROUP_ID_KEY: &str = "consumer.override.group.id";

/// A running worker.
pub struct Worker {
    config: ConfigMap,
    registry: ConnectorRegistry,
    board: StatusBoard,
    router: Addr<ConnectorRouter>,
    system: System,
    thread: Option<JoinHandle<()>>,
    /// The configuration each connector runs with, to tell a resize from a reconfiguration.
    configs: Mutex<BTreeMap<String, ConfigMap>>,
    /// `connector.client.config.override.policy`: the overrides the `default` tenant may set.
    policy: OverridePolicy,
    /// Tasks per connector and per worker.
    limits: WorkerLimits,
    /// The first panic on the runtime thread (an actor died with it).
    panic: crate::panics::PanicSlot,
    /// Kafka admin clients, one per cluster and security setting, shared by every connector
    /// and kept for the worker's life.
    admin: Arc<AdminClients>,
    /// Asks Kafka whether a group of another type holds a connector's group id.
    group_ids: Arc<GroupIdChecker>,
    /// The threads every task runs on (`task.threads`).
    pool: TaskPool,
    /// Distributed mode: the task ids of a connector this worker runs (the others run on other
    /// workers). A connector not in it runs every task here.
    assignments: Mutex<BTreeMap<String, BTreeSet<u32>>>,
}

impl Worker {
    /// Starts a worker with `config` (its `bootstrap.servers` is required) and the plugins of
    /// `registry`.
    pub fn start(config: ConfigMap, registry: ConnectorRegistry) -> Result<Worker, RuntimeError> {
        Self::start_with_meter(config, registry, &opentelemetry::global::meter("spillway"))
    }

    /// [`Worker::start`], recording its metrics (docs/metrics.md) through `meter`.
    pub fn start_with_meter(
        config: ConfigMap,
        registry: ConnectorRegistry,
        meter: &opentelemetry::metrics::Meter,
    ) -> Result<Worker, RuntimeError> {
        if config
            .get(BOOTSTRAP_SERVERS)
            .is_none_or(|s| s.trim().is_empty())
        {
            return Err(RuntimeError::WorkerConfig(ConfigError::Missing {
                key: BOOTSTRAP_SERVERS.into(),
            }));
        }
        resolve_group_protocol(&ConfigMap::new(), &config).map_err(RuntimeError::WorkerConfig)?;
        TaskSettings::resolve(&ConfigMap::new(), &config).map_err(RuntimeError::WorkerConfig)?;
        let policy = match config.get(OVERRIDE_POLICY) {
            Some(text) => {
                OverridePolicy::parse(OVERRIDE_POLICY, text).map_err(RuntimeError::WorkerConfig)?
            }
            None => OverridePolicy::All,
        };
        // Before the limits: the tasks' descriptors are weighed against the open-file limit.
        match crate::limits::raise_open_files_limit() {
            Ok((before, after)) if after > before => {
                info!(
                    before,
                    after, "raised the soft open-file limit to the hard limit"
                )
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot raise the soft open-file limit"),
        }
        let limits =
            WorkerLimits::from_worker_config(&config).map_err(RuntimeError::WorkerConfig)?;
        let threads = task_threads(&config).map_err(RuntimeError::WorkerConfig)?;
        let board = StatusBoard::default();
        crate::metrics::register(meter, &board);
        let supervisor_board = board.clone();
        let panic = crate::panics::PanicSlot::default();
        let watched = Arc::clone(&panic);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("spillway-worker".into())
            .spawn(move || {
                crate::panics::watch_current_thread(watched);
                let system = System::new();
                system.block_on(async move {
                    let addr = ConnectorRouter::new(supervisor_board).start();
                    // Arbiters of this system: they stop with it.
                    let pool = TaskPool::start(threads);
                    let _ = tx.send((addr, System::current(), pool));
                });
                // Returns when the system is stopped.
                let _ = system.run();
            })
            .map_err(|e| RuntimeError::Task(format!("cannot start the worker thread: {e}")))?;
        let (router, system, pool) = rx.recv().map_err(|_| RuntimeError::WorkerStopped)?;
        let group_ids = GroupIdChecker::new()
            .map(Arc::new)
            .map_err(|e| RuntimeError::Task(format!("cannot start the group id checker: {e}")))?;
        Ok(Worker {
            config,
            registry,
            board,
            router,
            system,
            thread: Some(thread),
            configs: Mutex::new(BTreeMap::new()),
            assignments: Mutex::new(BTreeMap::new()),
            policy,
            limits,
            panic,
            admin: Arc::default(),
            group_ids,
            pool,
        })
    }

    /// The worker's Kafka admin clients (one per cluster and security setting).
    pub fn admin_clients(&self) -> Arc<AdminClients> {
        Arc::clone(&self.admin)
    }

    /// The threads the worker's tasks run on.
    pub fn task_pool(&self) -> &TaskPool {
        &self.pool
    }

    /// The worker's task limits.
    pub fn limits(&self) -> WorkerLimits {
        self.limits
    }

    /// The checks of `config` that starting it makes beyond its keys' declarations, without
    /// reaching Kafka: the worker's bounds, what it reaches outside the worker (the tenant's
    /// directory, clusters, the egress policy), and every client setting's value as the
    /// client would read it (`consumer.override.max.poll.records=abc`, a librdkafka setting
    /// of the wrong type). `validate` reports them, so what it accepts also starts.
    pub fn start_checks(&self, scope: &TenantScope, config: &ConfigMap) -> Vec<ConfigError> {
        let mut errors = self.limits.check_connector(config);
        if let Some(plugin) = config
            .get(spillway_core::config::sink_connector::CONNECTOR_CLASS)
            .and_then(|class| self.registry.create(class).ok())
        {
            errors.extend(scope.reach_violations(&plugin.config_def(), config));
        }
        let overrides = spillway_core::convert::strip_prefix(config, "consumer.override.");
        let consumer = ConsumerSettings::collect(&self.config, &overrides);
        match resolve_group_protocol(config, &self.config) {
            Ok(resolved) if resolved.protocol.is_share() => {
                if let Err(e) = consumer.share_config("localhost:9092", "check", "check") {
                    errors.extend(e.flatten().into_iter().cloned());
                }
                if let Some(regex) = config
                    .get(spillway_core::config::sink_connector::TOPICS_REGEX)
                    .filter(|r| !r.trim().is_empty())
                {
                    errors.push(ConfigError::InvalidValue {
                        key: "topics.regex".into(),
                        value: regex.clone(),
                        reason: format!(
                            "share mode ({resolved}) subscribes to topic names; list them in \
                             topics instead, or run the connector in classic mode \
                             (consumer.override.group.protocol=classic)"
                        ),
                    });
                }
            }
            Ok(_) => {
                if let Err(e) = consumer.max_poll_records() {
                    errors.push(e);
                }
                // Security keys (files read) as starting the connector checks them; share mode
                // checks them in share_config above.
                if let Err(e) = consumer
                    .security()
                    .and_then(|s| s.client_security().map_err(|e| e.into_config_error()))
                {
                    errors.extend(e.flatten().into_iter().cloned());
                }
                // The connector's own settings, named as written; the worker's consumer.*
                // settings are its admin's.
                let settings = overrides
                    .iter()
                    .filter(|(k, _)| !spillway_kafka::classic::OWNED_KEYS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()));
                errors.extend(librdkafka_refusals("consumer.override.", settings));
            }
            // Reported by validate's own check of the protocol.
            Err(_) => {}
        }
        let producer = spillway_core::convert::strip_prefix(config, "producer.override.");
        if !producer.is_empty() {
            errors.extend(librdkafka_refusals("producer.override.", producer));
        }
        errors
    }

    /// Whether a group of another type holds the group id `config` would use (Kafka has one
    /// namespace for group ids; docs/runtime.md): `Err` with the reason and the fix when one
    /// does. A cluster that cannot be asked, or lacks the APIs, gives a warning (logged) and no
    /// refusal: the task's consumer then meets the broker's answer itself, and a refused join
    /// fails the task with it. A configuration that does not parse is left to the other checks.
    pub async fn check_group_id(
        &self,
        scope: &TenantScope,
        config: &ConfigMap,
    ) -> Result<(), String> {
        let Some((query, chosen)) = self.group_id_query(scope, config) else {
            return Ok(());
        };
        let name = config.get("name").cloned().unwrap_or_default();
        let (group, wanted) = (query.group.clone(), query.wanted);
        match self.group_ids.check(query, GROUP_CHECK_TIMEOUT).await {
            GroupIdVerdict::Free { warnings } => {
                for warning in warnings {
                    warn!(connector = %name, %group, "{warning}");
                }
                if wanted == Membership::Share && !chosen {
                    self.warn_of_a_former_share_group(scope, config, &name, &group)
                        .await;
                }
                Ok(())
            }
            GroupIdVerdict::Taken { other, warnings } => {
                for warning in warnings {
                    warn!(connector = %name, %group, "{warning}");
                }
                Err(conflict_reason(&group, wanted, &other, chosen))
            }
            GroupIdVerdict::Unchecked { reason } => {
                warn!(connector = %name, %group, "cannot check whether another type of group holds the group id ({reason}); the connector's consumer will meet the broker's answer itself");
                Ok(())
            }
        }
    }

    /// A share connector on its default id `connect-share-<name>` whose consumer group id
    /// `connect-<name>` is a share group: the connector ran in share mode before the defaults
    /// differed, and now starts a new share group (at `share.auto.offset.reset`) instead of
    /// going on where the old one stands. Said in the log with the key that keeps the old one.
    async fn warn_of_a_former_share_group(
        &self,
        scope: &TenantScope,
        config: &ConfigMap,
        name: &str,
        group: &str,
    ) {
        let Some((mut query, _)) = self.group_id_query(scope, config) else {
            return;
        };
        let Ok(parsed) = SinkConnectorConfig::parse(config) else {
            return;
        };
        let former = scope.group_id(&parsed, spillway_core::config::GroupProtocol::Classic);
        query.group = former.clone();
        query.wanted = Membership::Consumer;
        if let GroupIdVerdict::Taken { other, .. } =
            self.group_ids.check(query, GROUP_CHECK_TIMEOUT).await
        {
            if other.group_type == "share" {
                warn!(connector = %name, %group, "share group '{former}' exists: this connector's share group id was '{former}' before share mode got its own default; it now reads through the share group '{group}', which starts where share.auto.offset.reset says. To go on where '{former}' stands, set consumer.override.group.id={former} (a later rollback to a consumer group then needs that share group deleted or another id)");
            }
        }
    }

    /// [`check_group_id`](Self::check_group_id) as a configuration error on the key to change,
    /// for `validate` and the REST create/update calls.
    pub async fn group_id_errors(
        &self,
        scope: &TenantScope,
        config: &ConfigMap,
    ) -> Vec<ConfigError> {
        match self.check_group_id(scope, config).await {
            Ok(()) => Vec::new(),
            Err(reason) => {
                let group = self
                    .group_id_query(scope, config)
                    .map(|(q, _)| q.group)
                    .unwrap_or_default();
                vec![ConfigError::InvalidValue {
                    key: GROUP_ID_KEY.into(),
                    value: group,
                    reason,
                }]
            }
        }
    }

    /// The group id question of `config` and whether the user chose the id; `None` when the
    /// configuration does not parse far enough (the other checks report why).
    fn group_id_query(
        &self,
        scope: &TenantScope,
        config: &ConfigMap,
    ) -> Option<(GroupIdQuery, bool)> {
        let parsed = SinkConnectorConfig::parse(config).ok()?;
        let resolved = resolve_group_protocol(config, &self.config).ok()?;
        let consumer = ConsumerSettings::collect(&self.config, &parsed.consumer_overrides);
        let security = consumer.security().ok()?.client_security().ok()?;
        let bootstrap = parsed
            .consumer_overrides
            .get(BOOTSTRAP_SERVERS)
            .or_else(|| self.config.get(BOOTSTRAP_SERVERS))
            .cloned()
            .unwrap_or_default();
        let topics = match &parsed.topics {
            TopicSelection::Names(names) => names.clone(),
            TopicSelection::Pattern(_) => Vec::new(),
        };
        let chosen = parsed.consumer_overrides.contains_key("group.id");
        Some((
            GroupIdQuery {
                bootstrap,
                security,
                security_key: format!("{:?}", consumer.security_overrides()),
                group: scope.group_id(&parsed, resolved.protocol),
                wanted: if resolved.protocol.is_share() {
                    Membership::Share
                } else {
                    Membership::Consumer
                },
                topics,
            },
            chosen,
        ))
    }

    /// What `config`'s tasks cost against the worker's limits (their count, and the
    /// descriptors and threads they weigh in their mode): [`WorkerLimits::cost`].
    pub fn task_cost(&self, config: &ConfigMap) -> TaskCost {
        self.limits.cost(config, &self.config)
    }

    /// What the other connectors running on this worker cost together; in distributed mode a
    /// connector counts the tasks assigned here, not all of its tasks.
    fn tasks_of_others(&self, key: &str) -> TaskCost {
        let assignments = lock_map(&self.assignments).clone();
        self.configs()
            .iter()
            .filter(|(name, _)| name.as_str() != key)
            .map(|(name, c)| self.cost_here(&assignments, name, c))
            .fold(TaskCost::default(), TaskCost::plus)
    }

    /// What connector `name`'s tasks cost here: those assigned to this worker when it has an
    /// assignment, else its `tasks.max` (bounded by `tasks.max.per.connector`), at the weight
    /// of its mode.
    fn cost_here(
        &self,
        assignments: &BTreeMap<String, BTreeSet<u32>>,
        name: &str,
        config: &ConfigMap,
    ) -> TaskCost {
        match assignments.get(name) {
            Some(tasks) => TaskCost::of(tasks.len() as u64, task_weight(config, &self.config)),
            None => self.task_cost(config),
        }
    }

    /// Why the runtime is broken, if it is: its thread or supervisor is gone, or an actor on
    /// it panicked (what that actor ran is lost until the worker restarts).
    pub fn runtime_failure(&self) -> Option<String> {
        let panic = self.panic.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let gone = !self.router.connected() || self.thread.as_ref().is_none_or(|t| t.is_finished());
        match (panic, gone) {
            (Some(panic), true) => Some(format!("the connector runtime has stopped; it {panic}")),
            (Some(panic), false) => Some(format!("an actor of the connector runtime {panic}")),
            (None, true) => Some("the connector runtime has stopped".to_owned()),
            (None, false) => None,
        }
    }

    /// The worker's `connector.client.config.override.policy` (Connect's default: All).
    pub fn override_policy(&self) -> OverridePolicy {
        self.policy
    }

    pub fn config(&self) -> &ConfigMap {
        &self.config
    }

    fn configs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ConfigMap>> {
        // Each use is one map operation; a panic elsewhere cannot leave it half done.
        self.configs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Validates `config`, checks its group, and starts its tasks.
    pub async fn start_connector(&self, config: ConfigMap) -> Result<(), RuntimeError> {
        let key = config.get("name").cloned().unwrap_or_default();
        let scope = TenantScope::default_tenant(self.policy);
        self.start_tenant_connector(key, scope, config).await
    }

    /// Starts a connector of a tenant under `key`, the name the worker's other methods know
    /// it by (a tenant's connectors may share names with another tenant's).
    pub async fn start_tenant_connector(
        &self,
        key: String,
        scope: TenantScope,
        config: ConfigMap,
    ) -> Result<(), RuntimeError> {
        let plan = self.plan(key, scope, &config).await?;
        self.start_plan(plan, config).await
    }

    async fn start_plan(&self, plan: ConnectorPlan, config: ConfigMap) -> Result<(), RuntimeError> {
        let name = plan.key.clone();
        self.router
            .send(Start(plan))
            .await
            .map_err(|_| RuntimeError::WorkerStopped)??;
        self.configs().insert(name, config);
        Ok(())
    }

    /// Stops a connector gracefully: in-flight batches finish, acknowledgements are committed,
    /// the group is left.
    pub async fn stop_connector(&self, name: &str) -> Result<(), RuntimeError> {
        self.router
            .send(Stop(name.to_owned()))
            .await
            .map_err(|_| RuntimeError::WorkerStopped)??;
        self.configs().remove(name);
        Ok(())
    }

    /// Applies a new configuration. A change of `tasks.max` alone changes the number of tasks
    /// while the others keep running; any other change restarts the connector (this is how a
    /// connector moves between share and classic mode, e.g. rolling back by removing
    /// `consumer.override.group.protocol`).
    pub async fn reconfigure_connector(&self, config: ConfigMap) -> Result<(), RuntimeError> {
        let key = config.get("name").cloned().unwrap_or_default();
        let scope = TenantScope::default_tenant(self.policy);
        self.reconfigure_tenant_connector(key, scope, config).await
    }

    /// [`reconfigure_connector`](Self::reconfigure_connector) for a tenant's connector started
    /// with [`start_tenant_connector`](Self::start_tenant_connector).
    pub async fn reconfigure_tenant_connector(
        &self,
        key: String,
        scope: TenantScope,
        config: ConfigMap,
    ) -> Result<(), RuntimeError> {
        let name = key;
        let current = self.configs().get(&name).cloned();
        let Some(current) = current else {
            return self.start_tenant_connector(name, scope, config).await;
        };
        let without_tasks = |c: &ConfigMap| {
            let mut c = c.clone();
            c.remove(TASKS_MAX);
            c
        };
        if without_tasks(&current) == without_tasks(&config) {
            self.check_bounds(&name, &config)?;
            let parsed =
                SinkConnectorConfig::parse(&config).map_err(|source| RuntimeError::Config {
                    connector: name.clone(),
                    source,
                })?;
            self.set_task_count(&name, parsed.tasks_max).await?;
            self.configs().insert(name, config);
            return Ok(());
        }
        // Decide (and check) the new configuration before stopping the running one, so a
        // refused configuration leaves the connector running as it was.
        let plan = self.plan(name.clone(), scope, &config).await?;
        self.stop_connector(&name).await?;
        self.start_plan(plan, config).await
    }

    /// Changes the number of tasks of a running connector (elastic scaling).
    pub async fn set_task_count(&self, name: &str, tasks: usize) -> Result<(), RuntimeError> {
        if let Some(mut config) = self.connector_config(name) {
            config.insert(TASKS_MAX.to_owned(), tasks.to_string());
            self.check_bounds(name, &config)?;
        }
        self.router
            .send(Resize(name.to_owned(), tasks))
            .await
            .map_err(|_| RuntimeError::WorkerStopped)??;
        if let Some(c) = self.configs().get_mut(name) {
            c.insert(TASKS_MAX.to_owned(), tasks.to_string());
        }
        Ok(())
    }

    /// Distributed mode: runs only `tasks` of the connector `name` on this worker (`None`:
    /// every task). Kept for the connector's later starts and reconfigurations; applied at
    /// once when it runs (tasks given up drain gracefully, see
    /// [`tasks_stopped`](Self::tasks_stopped)).
    pub async fn assign_tasks(
        &self,
        name: &str,
        tasks: Option<BTreeSet<u32>>,
    ) -> Result<(), RuntimeError> {
        match &tasks {
            Some(t) => lock_map(&self.assignments).insert(name.to_owned(), t.clone()),
            None => lock_map(&self.assignments).remove(name),
        };
        if !self.configs().contains_key(name) {
            return Ok(());
        }
        self.router
            .send(Assign(name.to_owned(), tasks))
            .await
            .map_err(|_| RuntimeError::WorkerStopped)?
    }

    /// Whether none of `tasks` of connector `name` runs here any more (they have drained).
    pub fn tasks_stopped(&self, name: &str, tasks: &BTreeSet<u32>) -> bool {
        // A task given up leaves the board once it has drained.
        self.board
            .get(name)
            .is_none_or(|status| !status.tasks.iter().any(|t| tasks.contains(&t.id)))
    }

    /// Forgets a connector's assignment (it was deleted or moved away).
    pub fn forget_assignment(&self, name: &str) {
        lock_map(&self.assignments).remove(name);
    }

    /// Ends one task abruptly, as a crash would (no acknowledgements, no leaving the group);
    /// it is not restarted. For failure drills and tests.
    pub async fn kill_task(&self, name: &str, task: u32) -> Result<(), RuntimeError> {
        self.router
            .send(Kill(name.to_owned(), task))
            .await
            .map_err(|_| RuntimeError::WorkerStopped)?
    }

    /// Restarts one task of a running connector: it stops gracefully (in-flight batches
    /// finish, acknowledgements are committed), then runs again; the other tasks go on.
    /// A task that failed for good, or was killed, is started again.
    pub async fn restart_task(&self, name: &str, task: u32) -> Result<(), RuntimeError> {
        self.router
            .send(RestartOne(name.to_owned(), task))
            .await
            .map_err(|_| RuntimeError::WorkerStopped)?
    }

    pub fn status(&self, name: &str) -> Option<ConnectorStatus> {
        self.board.get(name)
    }

    pub fn statuses(&self) -> Vec<ConnectorStatus> {
        self.board.all()
    }

    pub fn connector_config(&self, name: &str) -> Option<ConfigMap> {
        self.configs().get(name).cloned()
    }

    /// Stops every connector gracefully, all at once (so a shutdown takes one
    /// `task.shutdown.graceful.timeout.ms` at most, not one per connector), then the worker.
    pub async fn shutdown(mut self) {
        let names = self.router.send(List).await.unwrap_or_default();
        let worker = &self;
        let stops = names.iter().map(|name| async move {
            if let Err(e) = worker.stop_connector(name).await {
                warn!(connector = %name, error = %e, "stopping the connector failed");
            }
        });
        futures::future::join_all(stops).await;
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    /// Refuses a connector beyond the worker's bounds (its name, values, `tasks.max`, the
    /// worker's task total): a stored configuration from an older version fails here instead
    /// of allocating or spawning without bound.
    fn check_bounds(&self, key: &str, config: &ConfigMap) -> Result<(), RuntimeError> {
        let name = config.get("name").cloned().unwrap_or_default();
        let refused = |source: ConfigError| RuntimeError::Config {
            connector: name.clone(),
            source,
        };
        if let Some(error) = ConfigError::from_list(self.limits.check_connector(config)) {
            return Err(refused(error));
        }
        let here = self.cost_here(&lock_map(&self.assignments), key, config);
        self.limits
            .check_worker_tasks(&name, self.tasks_of_others(key), here)
            .map_err(refused)
    }

    /// Everything decided before a connector runs.
    async fn plan(
        &self,
        key: String,
        scope: TenantScope,
        config: &ConfigMap,
    ) -> Result<ConnectorPlan, RuntimeError> {
        self.check_bounds(&key, config)?;
        let name = config.get("name").cloned().unwrap_or_default();
        let refused = |source: ConfigError| RuntimeError::Config {
            connector: name.clone(),
            source,
        };
        let mut parsed = SinkConnectorConfig::parse(config).map_err(refused)?;
        let owner = match &scope.prefix {
            Some(tenant) => format!("tenant {tenant}"),
            None => format!("the worker ({OVERRIDE_POLICY})"),
        };
        if let Some(refusal) = scope.policy.violations(config, &owner).into_iter().next() {
            return Err(refused(refusal));
        }
        scope.namespace(&mut parsed);
        let resolved = resolve_group_protocol(config, &self.config).map_err(refused)?;
        let settings = TaskSettings::resolve(config, &self.config).map_err(refused)?;
        let consumer = ConsumerSettings::collect(&self.config, &parsed.consumer_overrides);
        consumer.max_poll_records().map_err(refused)?;
        // Security keys are checked (files read) now, in both modes, so a connector that
        // cannot work is refused at creation naming the key.
        consumer
            .security()
            .and_then(|s| s.client_security().map_err(|e| e.into_config_error()))
            .map_err(refused)?;
        let plugin = self
            .registry
            .create(&parsed.connector_class)
            .map_err(refused)?;
        plugin.config_def().parse(config).map_err(refused)?;
        if let Some(error) = ConfigError::from_list(self.start_checks(&scope, config)) {
            return Err(refused(error));
        }
        let bootstrap = parsed
            .consumer_overrides
            .get(BOOTSTRAP_SERVERS)
            .or_else(|| self.config.get(BOOTSTRAP_SERVERS))
            .cloned()
            .unwrap_or_default();
        let group_id = scope.group_id(&parsed, resolved.protocol);
        let topics = match (&parsed.topics, resolved.protocol.is_share()) {
            (TopicSelection::Names(names), _) => names.clone(),
            (TopicSelection::Pattern(regex), false) => vec![format!("^{}$", regex.as_str())],
            // Refused by start_checks above.
            (TopicSelection::Pattern(regex), true) => {
                return Err(refused(ConfigError::InvalidValue {
                    key: "topics.regex".into(),
                    value: regex.as_str().to_owned(),
                    reason: "share mode subscribes to topic names; list them in topics".into(),
                }))
            }
        };
        if resolved.protocol.is_share() {
            let (_, warnings) = consumer
                .share_config(&bootstrap, &group_id, &name)
                .map_err(refused)?;
            for warning in &warnings {
                warn!(connector = %name, "{warning}");
            }
        }
        if let Err(reason) = self.check_group_id(&scope, config).await {
            return Err(RuntimeError::GroupIdConflict {
                connector: name.clone(),
                group: group_id,
                reason,
            });
        }
        let dead_letters = match &parsed.errors.dead_letter_queue {
            None => None,
            Some(_) => {
                // The worker's `producer.*` keys, then the connector's overrides (as Connect
                // configures a sink's dead letter queue producer).
                let mut overrides = spillway_core::convert::strip_prefix(&self.config, "producer.");
                overrides.retain(|k, _| !k.starts_with("override."));
                overrides.extend(spillway_core::convert::strip_prefix(
                    &parsed.originals,
                    "producer.override.",
                ));
                let producer = IdempotentProducer::new(
                    &bootstrap,
                    overrides.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .map_err(|e| RuntimeError::Source(e.to_string()))?;
                Some(ProducerDeadLetters::shared(producer))
            }
        };
        let preparation = Preparation {
            bootstrap: bootstrap.clone(),
            security: consumer.security().map_err(refused)?,
            timeout: ADMIN_TIMEOUT,
            share: match resolved.protocol.is_share() {
                true => Some(ShareGroupWish {
                    group: group_id.clone(),
                    topics: topics.clone(),
                    configs: consumer.group_configs().map_err(refused)?,
                    // The consumer group of classic mode, when it has another id (the
                    // defaults differ; a chosen id is the same in both modes, and the
                    // group id check refuses it while a consumer group holds it).
                    positions_from: Some(
                        scope.group_id(&parsed, spillway_core::config::GroupProtocol::Classic),
                    )
                    .filter(|classic| *classic != group_id),
                }),
                false => None,
            },
            dead_letter_queue: parsed.errors.dead_letter_queue.clone(),
        };
        // librdkafka does not report a KIP-848 join the coordinator refuses: watched instead.
        let join_watch = match resolved.protocol {
            spillway_core::config::GroupProtocol::Consumer => self
                .group_id_query(&scope, config)
                .map(|(query, chosen)| JoinWatch::new(Arc::clone(&self.group_ids), query, chosen)),
            _ => None,
        };
        Ok(ConnectorPlan {
            scope,
            config: parsed,
            worker: self.config.clone(),
            protocol: resolved.protocol,
            protocol_text: resolved.to_string(),
            group_id,
            bootstrap,
            topics,
            settings,
            consumer,
            dead_letters: dead_letters.map(|d| d as Arc<_>),
            registry: self.registry.clone(),
            preparation,
            admin: Arc::clone(&self.admin),
            pool: self.pool.clone(),
            join_watch,
            assigned: lock_map(&self.assignments).get(&key).cloned(),
            key,
        })
    }
}

fn lock_map<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each use is one map operation; a panic elsewhere cannot leave it half done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The settings librdkafka refuses (an unknown key, a value of the wrong type), each named with
/// `prefix` as the user wrote it: what creating the client would fail on.
fn librdkafka_refusals(
    prefix: &str,
    settings: impl IntoIterator<Item = (String, String)>,
) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    // Security keys come in Java's spelling too: the security translation checks them (and
    // turns them into librdkafka's names), so librdkafka's parser never sees them raw.
    let settings = settings
        .into_iter()
        .filter(|(key, _)| !spillway_kafka::security::is_security_key(key));
    for (key, value) in settings {
        let mut one = rdkafka::ClientConfig::new();
        one.set(&key, &value);
        if let Err(e) = one.create_native_config() {
            let secret = spillway_kafka::security::is_secret_key(&key);
            errors.push(ConfigError::InvalidValue {
                key: format!("{prefix}{key}"),
                value: if secret { "[hidden]".to_owned() } else { value },
                reason: format!("the Kafka client refuses it: {e}"),
            });
        }
    }
    errors
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Not a graceful stop (that is `shutdown`): the brokers release what the tasks held.
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use async_trait::async_trait;
    use spillway_core::config::ConfigDef;
    use spillway_core::connector::replicate_task_configs;
    use spillway_core::{PutOutcome, SinkConnector, SinkError, SinkRecord, SinkTask};

    use super::*;
    use crate::status::State;

    /// A sink whose tasks cannot start.
    struct Broken;

    struct BrokenTask;

    #[async_trait]
    impl SinkTask for BrokenTask {
        async fn start(&mut self, _config: &ConfigMap) -> Result<(), SinkError> {
            Err(SinkError::fatal("database 'orders' does not exist"))
        }

        async fn put(&mut self, _records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
            Ok(Vec::new())
        }

        async fn stop(&mut self) -> Result<(), SinkError> {
            Ok(())
        }
    }

    impl SinkConnector for Broken {
        fn version(&self) -> &str {
            "test"
        }

        fn config_def(&self) -> ConfigDef {
            ConfigDef::new()
        }

        fn start(&mut self, _config: &ConfigMap) -> Result<(), ConfigError> {
            Ok(())
        }

        fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
            Ok(replicate_task_configs(&ConfigMap::new(), max_tasks))
        }

        fn create_task(&self) -> Box<dyn SinkTask> {
            Box::new(BrokenTask)
        }
    }

    /// A sink that notes the task id of every task start.
    struct Counted {
        starts: Arc<Mutex<Vec<u32>>>,
    }

    struct CountedTask {
        starts: Arc<Mutex<Vec<u32>>>,
    }

    #[async_trait]
    impl SinkTask for CountedTask {
        async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
            let id = config
                .get(spillway_connectors::runtime_keys::TASK_ID)
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::MAX);
            self.starts.lock().unwrap().push(id);
            Ok(())
        }

        async fn put(&mut self, _records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
            Ok(Vec::new())
        }

        async fn stop(&mut self) -> Result<(), SinkError> {
            Ok(())
        }
    }

    impl SinkConnector for Counted {
        fn version(&self) -> &str {
            "test"
        }

        fn config_def(&self) -> ConfigDef {
            ConfigDef::new()
        }

        fn start(&mut self, _config: &ConfigMap) -> Result<(), ConfigError> {
            Ok(())
        }

        fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
            Ok(replicate_task_configs(&ConfigMap::new(), max_tasks))
        }

        fn create_task(&self) -> Box<dyn SinkTask> {
            Box::new(CountedTask {
                starts: Arc::clone(&self.starts),
            })
        }
    }

    use spillway_core::config::config_map as config;

    fn worker() -> Worker {
        Worker::start(
            // Nothing listens there; classic mode does not contact the broker before polling.
            config(&[
                ("bootstrap.servers", "127.0.0.1:1"),
                ("task.restart.backoff.ms", "20"),
                ("task.restart.max.attempts", "2"),
            ]),
            ConnectorRegistry::builtin().with(&["broken"], || Box::new(Broken)),
        )
        .expect("worker starts")
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_runtime_whose_thread_has_stopped_is_reported_as_broken() {
        let worker = worker();
        assert_eq!(worker.runtime_failure(), None, "a fresh runtime is healthy");
        // What an unguarded panic or an exhausted resource does to the runtime thread.
        worker.system.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        let failure = loop {
            if let Some(failure) = worker.runtime_failure() {
                break failure;
            }
            assert!(
                Instant::now() < deadline,
                "the stopped runtime was never reported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            failure.contains("the connector runtime has stopped"),
            "{failure}"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_task_that_keeps_failing_is_restarted_then_failed_with_its_trace() {
        let worker = worker();
        worker
            .start_connector(config(&[
                ("name", "b"),
                ("connector.class", "broken"),
                ("topics", "t"),
            ]))
            .await
            .expect("the connector itself is valid");
        let deadline = Instant::now() + Duration::from_secs(10);
        let task = loop {
            let status = worker.status("b").expect("registered");
            let task = status.tasks[0].clone();
            if task.state == State::Failed {
                break task;
            }
            assert!(Instant::now() < deadline, "task never failed: {task:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            task.restarts, 3,
            "two restarts, then the third failure is final"
        );
        let trace = task.trace.expect("a failed task has a trace");
        assert!(
            trace.contains("database 'orders' does not exist"),
            "{trace}"
        );
        worker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn restarting_one_task_leaves_the_others_running() {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::clone(&starts);
        let worker = Worker::start(
            config(&[
                ("bootstrap.servers", "127.0.0.1:1"),
                ("task.shutdown.graceful.timeout.ms", "300"),
            ]),
            ConnectorRegistry::builtin().with(&["counted"], move || {
                Box::new(Counted {
                    starts: Arc::clone(&shared),
                })
            }),
        )
        .expect("worker starts");
        worker
            .start_connector(config(&[
                ("name", "c"),
                ("connector.class", "counted"),
                ("topics", "t"),
                ("tasks.max", "3"),
            ]))
            .await
            .expect("starts");
        let sorted = |starts: &Arc<Mutex<Vec<u32>>>| {
            let mut s = starts.lock().unwrap().clone();
            s.sort_unstable();
            s
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while sorted(&starts) != [0, 1, 2] {
            assert!(
                Instant::now() < deadline,
                "tasks started: {:?}",
                sorted(&starts)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        worker.restart_task("c", 1).await.expect("restart");
        while sorted(&starts) != [0, 1, 1, 2] {
            assert!(
                Instant::now() < deadline,
                "task starts after restarting task 1: {:?}",
                sorted(&starts)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let status = worker.status("c").expect("running");
        assert!(
            status.tasks.iter().all(|t| t.state == State::Running),
            "{status:?}"
        );
        let err = worker.restart_task("c", 7).await.expect_err("no task 7");
        assert!(
            matches!(err, RuntimeError::UnknownTask { task: 7, .. }),
            "{err}"
        );
        // Only task 1 started again, even after a while.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(sorted(&starts), [0, 1, 1, 2]);
        worker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn connectors_are_refused_with_messages_naming_the_problem() {
        let worker = worker();
        let err = worker
            .start_connector(config(&[
                ("name", "x"),
                ("connector.class", "s3"),
                ("topics", "t"),
            ]))
            .await
            .expect_err("no such plugin");
        let text = err.to_string();
        assert!(
            text.starts_with("connector 'x': unknown connector 's3' for connector.class; expected one of file, kafka"),
            "{text}"
        );
        assert!(text.contains("broken"), "{text}");
        let err = worker
            .start_connector(config(&[
                ("name", "y"),
                ("connector.class", "file"),
                ("topics", "t"),
                ("consumer.override.group.protocol", "queue"),
            ]))
            .await
            .expect_err("bad protocol");
        assert!(
            err.to_string().contains("consumer.override.group.protocol"),
            "{err}"
        );
        let err = worker
            .start_connector(config(&[
                ("name", "z"),
                ("connector.class", "file"),
                ("topics.regex", "orders-.*"),
                ("consumer.override.group.protocol", "share"),
            ]))
            .await
            .expect_err("share mode needs names");
        assert!(err.to_string().contains("topics.regex"), "{err}");
        // Refused before the group check (which would need a broker): a security protocol
        // that does not exist, and a consumer setting share groups do not take.
        for (key, value) in [
            ("consumer.override.security.protocol", "TLS"),
            ("consumer.override.session.timeout.ms", "45000"),
            ("consumer.override.auto.offset.reset", "none"),
            ("consumer.override.max.poll.records", "many"),
        ] {
            let err = worker
                .start_connector(config(&[
                    ("name", "s"),
                    ("connector.class", "file"),
                    ("topics", "t"),
                    ("file", "/dev/null"),
                    ("consumer.override.group.protocol", "share"),
                    (key, value),
                ]))
                .await
                .expect_err("share mode cannot honour it");
            let text = err.to_string();
            assert!(
                text.starts_with("connector 's': invalid value") && text.contains(key),
                "{text}"
            );
        }
        // In classic mode too, security keys are checked at creation: a CA file that is not
        // there is named with the key as written.
        let err = worker
            .start_connector(config(&[
                ("name", "c"),
                ("connector.class", "file"),
                ("topics", "t"),
                ("file", "/dev/null"),
                ("consumer.override.group.protocol", "classic"),
                ("consumer.override.security.protocol", "SSL"),
                ("consumer.override.ssl.ca.location", "/no/such/ca.pem"),
            ]))
            .await
            .expect_err("no CA file");
        let text = err.to_string();
        assert!(
            text.contains("consumer.override.ssl.ca.location") && text.contains("/no/such/ca.pem"),
            "{text}"
        );
        worker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_worker_protocol_applies_unless_the_connector_overrides_it() {
        let worker = Worker::start(
            config(&[
                ("bootstrap.servers", "127.0.0.1:1"),
                ("consumer.group.protocol", "consumer"),
            ]),
            ConnectorRegistry::builtin(),
        )
        .expect("worker starts");
        let plan = worker
            .plan(
                "p".into(),
                TenantScope::default(),
                &config(&[("name", "p"), ("connector.class", "file"), ("topics", "t")]),
            )
            .await
            .expect("valid");
        assert_eq!(
            plan.protocol_text,
            "consumer (from worker consumer.group.protocol)"
        );
        assert_eq!(plan.group_id, "connect-p");
        worker.shutdown().await;
    }
}
