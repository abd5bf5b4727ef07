//! ConnectorSupervisor: one connector. It starts the plugin, splits its configuration into task
//! configurations, runs each task on its own thread, restarts a failed task with backoff
//! (after `task.restart.max.attempts` restarts in a row, or at once after a failure a restart
//! cannot help, it stays FAILED with its error trace),
//! changes the number of tasks while records flow, and stops every task gracefully.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::lock_retry::TargetHealth;
use actix::prelude::*;
use futures::FutureExt;
use spillway_connectors::runtime_keys::{
    EGRESS_ALLOW, FILES_ROOT, SOURCE_BOOTSTRAP_SERVERS, TASK_ID, TENANT, TENANT_PREFIX,
};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{GroupProtocol, SinkConnectorConfig};
use spillway_core::{ConfigMap, RecordPipeline, SinkConnector};
use spillway_kafka::admin::AdminClients;
use spillway_kafka::classic::{ClassicConfig, ClassicSource, RebalanceProtocol};
use spillway_kafka::cluster::Cluster;
use spillway_kafka::security::ClientSecurity;
use spillway_kafka::share::ShareConsumer;
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::consumer::SourceFactory;
use crate::consumer_settings::ConsumerSettings;
use crate::dead_letter::DeadLetterWriter;
use crate::error::RuntimeError;
use crate::group_ids::JoinWatch;
use crate::messages::{CloseGate, Reporter, TaskEvent};
use crate::metrics::{self, ConnectorLabels, TaskMetrics};
use crate::panic_guard::guard;
use crate::pool::TaskPool;
use crate::settings::TaskSettings;
use crate::share_group::Preparation;
use crate::source::{ConsumerGroupSource, RecordSource, ShareGroupSource};
use crate::status::{State, StatusBoard};
use crate::task::{spawn_task, RunningTask, TaskSpec};
use crate::telemetry::DEFAULT_TENANT;
use crate::tenancy::TenantScope;

/// Everything decided about a connector before it runs (see `Worker::start_connector`).
#[derive(Clone)]
pub struct ConnectorPlan {
    /// The connector's name in the worker (its name, or `tenant/name` for a tenant's).
    pub key: String,
    /// Its tenant: prefix of its names in Kafka, and the budget its tasks share.
    pub scope: TenantScope,
    pub config: SinkConnectorConfig,
    pub worker: ConfigMap,
    pub protocol: GroupProtocol,
    /// How the protocol was chosen, for the status API (`share (from ...)`).
    pub protocol_text: String,
    pub group_id: String,
    pub bootstrap: String,
    /// Topic names; in classic mode a `^`-prefixed entry is `topics.regex`.
    pub topics: Vec<String>,
    pub settings: TaskSettings,
    /// The tasks' consumer settings (worker `consumer.*`, connector `consumer.override.*`),
    /// checked for the connector's mode.
    pub consumer: ConsumerSettings,
    pub dead_letters: Option<Arc<dyn DeadLetterWriter>>,
    pub registry: ConnectorRegistry,
    /// What to set up in Kafka before the tasks run (share-group configs, the DLQ topic).
    pub preparation: Preparation,
    /// The worker's admin clients.
    pub admin: Arc<AdminClients>,
    /// The worker's task threads.
    pub pool: TaskPool,
    /// The task ids this worker runs (distributed mode, where the workers share a connector's
    /// tasks); `None`: every task.
    pub assigned: Option<BTreeSet<u32>>,
    /// KIP-848 `consumer` protocol: watches each task's join (see `JoinWatch`).
    pub join_watch: Option<JoinWatch>,
}

struct Slot {
    running: Option<RunningTask>,
    generation: u64,
    restarts: u32,
    /// Stopping because the task count went down: removed once stopped.
    retiring: bool,
    /// Killed on request: not restarted.
    killed: bool,
    /// Stopping to be started again (a restart of this task alone).
    restarting: bool,
}

pub struct ConnectorSupervisor {
    plan: ConnectorPlan,
    board: StatusBoard,
    connector: Option<Box<dyn SinkConnector>>,
    task_configs: Vec<ConfigMap>,
    slots: BTreeMap<u32, Slot>,
    stopping: bool,
    stop_waiters: Vec<oneshot::Sender<()>>,
    /// Setting up the group and topics: tasks start when it is done.
    preparing: bool,
    /// Shared by the tasks: a success of one ends the others' fetch pauses (share mode).
    target_health: TargetHealth,
    /// The setup failed: the tasks are FAILED without having run.
    preparation_failed: bool,
    /// Share mode: the cluster connections the tasks' members share (made by the first).
    shared_cluster: SharedCluster,
}

/// The connections the share-group members of one connector share for their heartbeats and
/// metadata: made by the first task that needs them, kept while the connector runs, so a
/// task's restart does not reconnect.
type SharedCluster = Arc<tokio::sync::OnceCell<Arc<Cluster>>>;

/// Change the number of tasks.
#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct SetTaskCount(pub usize);

/// Stop every task gracefully; the answer resolves once they all stopped (or were cut off
/// after `task.shutdown.graceful.timeout.ms`).
#[derive(Message)]
#[rtype(result = "oneshot::Receiver<()>")]
pub struct StopConnector;

/// Runs only these task ids here (`None`: every task); tasks given up drain gracefully,
/// newly given ones start.
#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct AssignTasks(pub Option<BTreeSet<u32>>);

/// Answered once the actor has started (its tasks are spawned and on the status board).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ready;

impl Handler<Ready> for ConnectorSupervisor {
    type Result = ();

    fn handle(&mut self, _msg: Ready, _ctx: &mut Context<Self>) {}
}

/// Restart one task: a graceful stop, then a new run; the other tasks go on.
#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct RestartTask(pub u32);

/// Kill a task as a crash would; it is not restarted.
#[derive(Message)]
#[rtype(result = "Result<(), RuntimeError>")]
pub struct KillTask(pub u32);

impl ConnectorSupervisor {
    pub fn new(plan: ConnectorPlan, board: StatusBoard) -> Self {
        ConnectorSupervisor {
            plan,
            board,
            connector: None,
            task_configs: Vec::new(),
            slots: BTreeMap::new(),
            stopping: false,
            stop_waiters: Vec::new(),
            preparing: false,
            target_health: TargetHealth::default(),
            preparation_failed: false,
            shared_cluster: SharedCluster::default(),
        }
    }

    /// The connector's name in the worker (the key of its status).
    fn name(&self) -> &str {
        &self.plan.key
    }

    /// Whether task `id` is this worker's to run.
    fn runs_here(&self, id: u32) -> bool {
        self.plan
            .assigned
            .as_ref()
            .is_none_or(|tasks| tasks.contains(&id))
    }

    /// The configuration the plugin sees: the user's, plus where it reads from, and for a
    /// tenant's connector its prefix, directory and egress allow-list (replacing any value the
    /// user wrote).
    fn plugin_config(&self) -> ConfigMap {
        let mut config = self.plan.config.originals.clone();
        config
            .entry(SOURCE_BOOTSTRAP_SERVERS.to_owned())
            .or_insert_with(|| self.plan.bootstrap.clone());
        let scope = &self.plan.scope;
        for (key, value) in [
            (TENANT_PREFIX, scope.prefix.clone()),
            (
                FILES_ROOT,
                scope.files_dir.as_ref().map(|d| d.display().to_string()),
            ),
            (
                EGRESS_ALLOW,
                scope.egress.as_ref().map(|policy| policy.to_string()),
            ),
        ] {
            match value {
                Some(value) => config.insert(key.to_owned(), value),
                None => config.remove(key),
            };
        }
        config
    }

    fn start_connector(&mut self) -> Result<(), String> {
        let registry = &self.plan.registry;
        let class = &self.plan.config.connector_class;
        let mut connector = guard(|| registry.create(class))
            .map_err(|panic| format!("creating the connector {panic}"))?
            .map_err(|e| e.to_string())?;
        let config = self.plugin_config();
        guard(|| connector.start(&config))
            .map_err(|panic| format!("the connector's start {panic}"))?
            .map_err(|e| format!("the connector failed to start: {e}"))?;
        self.connector = Some(connector);
        Ok(())
    }

    fn split(&mut self, tasks: usize) -> Result<(), String> {
        let connector = self
            .connector
            .as_ref()
            .ok_or_else(|| "the connector is not started".to_owned())?;
        let mut configs = guard(|| connector.task_configs(tasks))
            .map_err(|panic| format!("the connector's task_configs {panic}"))?
            .map_err(|e| format!("the connector cannot split into {tasks} tasks: {e}"))?;
        configs.truncate(tasks);
        for (i, c) in configs.iter_mut().enumerate() {
            c.insert(TASK_ID.to_owned(), i.to_string());
        }
        self.task_configs = configs;
        Ok(())
    }

    fn reporter(ctx: &Context<Self>) -> Reporter {
        let addr = ctx.address();
        Arc::new(move |event| addr.do_send(event))
    }

    fn spawn(&mut self, id: u32, ctx: &Context<Self>) {
        let Some(task_config) = self.task_configs.get(id as usize).cloned() else {
            return;
        };
        let generation = self.slots.get(&id).map_or(1, |s| s.generation + 1);
        let counters = self.board.task_counters(self.name(), id);
        if let Some(labels) = self.board.labels(self.name()) {
            let labels = metrics::task_labels(&labels, id);
            counters.metrics.bind(self.board.telemetry(), &labels);
        }
        let spec = match self.task_spec(id, generation, task_config, ctx) {
            Ok(spec) => spec,
            Err(e) => {
                TaskMetrics::task_setup_failed(self.board.telemetry());
                self.board.set_task(self.name(), id, State::Failed, Some(e));
                return;
            }
        };
        let spec = TaskSpec { counters, ..spec };
        let running = spawn_task(spec, &self.plan.pool);
        let slot = self.slots.entry(id).or_insert(Slot {
            running: None,
            generation,
            restarts: 0,
            retiring: false,
            killed: false,
            restarting: false,
        });
        slot.generation = generation;
        slot.running = Some(running);
        let trace = None;
        self.board
            .set_task(&self.plan.key, id, State::Running, trace);
    }

    fn task_spec(
        &self,
        id: u32,
        generation: u64,
        task_config: ConfigMap,
        ctx: &Context<Self>,
    ) -> Result<TaskSpec, String> {
        let plan = &self.plan;
        let pipeline = RecordPipeline::from_config(&plan.config.originals, &plan.worker)
            .map_err(|e| e.to_string())?;
        let connector = self
            .connector
            .as_ref()
            .ok_or_else(|| "the connector is not started".to_owned())?;
        let (sink_task, task_commits_offsets, sink_reads_headers) = guard(|| {
            (
                connector.create_task(),
                connector.task_commits_offsets(),
                connector.tasks_read_headers(),
            )
        })
        .map_err(|panic| format!("the connector's create_task {panic}"))?;
        let headers_read = headers_read(sink_reads_headers, &pipeline, &plan.config);
        Ok(TaskSpec {
            tenant: self.tenant_label(),
            connector: plan.config.name.clone(),
            connector_class: plan.config.connector_class.clone(),
            task: id,
            generation,
            share: plan.protocol.is_share(),
            errors: plan.config.errors.clone(),
            task_config,
            pipeline,
            sink_task,
            source: source_factory(
                plan,
                id,
                task_commits_offsets,
                headers_read,
                &self.shared_cluster,
            ),
            dead_letters: plan.dead_letters.clone(),
            settings: plan.settings.clone(),
            counters: Arc::default(),
            reporter: Self::reporter(ctx),
            throttle: plan.scope.throttle.clone(),
            inflight_bytes: plan.scope.inflight.clone(),
            target_health: self.target_health.clone(),
        })
    }

    /// The tenant that traces, logs and metrics name: the connector's tenant when it belongs to
    /// one, else the `spillway.tenant` key (a label for standalone workers), else `default`.
    fn tenant_label(&self) -> String {
        if self.plan.scope.prefix.is_some() {
            return self.plan.scope.tenant().to_owned();
        }
        self.plan
            .config
            .originals
            .get(TENANT)
            .filter(|t| !t.trim().is_empty())
            .cloned()
            .unwrap_or_else(|| DEFAULT_TENANT.to_owned())
    }

    /// How this connector's metrics are labelled.
    fn metric_labels(&self) -> ConnectorLabels {
        let config = &self.plan.config;
        ConnectorLabels {
            tenant: self.tenant_label(),
            connector: self.plan.config.name.clone(),
            mode: if self.plan.protocol.is_share() {
                "share"
            } else {
                "classic"
            },
            connector_class: config.connector_class.clone(),
            connector_version: self
                .connector
                .as_ref()
                .and_then(|c| guard(|| c.version().to_owned()).ok())
                .unwrap_or_else(|| "unknown".to_owned()),
        }
    }

    /// Set up the share group and topics (`Preparation`), then start the tasks; when that
    /// fails, every task is FAILED with the reason (restarting one tries again).
    fn prepare_then_start(&mut self, ctx: &mut Context<Self>) {
        let name = self.name().to_owned();
        let preparation = &self.plan.preparation;
        if preparation.share.is_none() && preparation.dead_letter_queue.is_none() {
            self.start_tasks(ctx);
            return;
        }
        self.preparing = true;
        // Listed at once, as Connect lists tasks not yet running: UNASSIGNED.
        self.list_unassigned_tasks();
        let preparation = preparation.clone();
        let admin = Arc::clone(&self.plan.admin);
        let prepare = async move { preparation.run(&admin, &name).await };
        ctx.spawn(prepare.into_actor(self).map(|result, act, ctx| {
            act.preparing = false;
            if act.stopping {
                act.finish_stop_if_done();
                return;
            }
            let name = act.name().to_owned();
            match result {
                Ok(prepared) => {
                    act.preparation_failed = false;
                    if let Some(report) = prepared.report {
                        if let Some(limit) = report.delivery_count_limit {
                            // The brokers' value is the truth; the setting is a fallback.
                            if limit != act.plan.settings.delivery_attempt_limit {
                                info!(connector = %name, brokers = limit, setting = act.plan.settings.delivery_attempt_limit, "using the brokers' group.share.delivery.count.limit");
                            }
                            act.plan.settings.delivery_attempt_limit = limit;
                        }
                        act.board.set_group_settings(&name, report);
                    }
                    act.start_tasks(ctx);
                }
                Err(reason) => {
                    error!(connector = %name, %reason, "the connector's tasks cannot run");
                    act.preparation_failed = true;
                    let here = (0..act.task_configs.len() as u32).filter(|id| act.runs_here(*id));
                    for id in here.collect::<Vec<_>>() {
                        act.board.task_counters(&name, id);
                        act.board
                            .set_task(&name, id, State::Failed, Some(reason.clone()));
                    }
                }
            }
        }));
    }

    /// Put the tasks on the status board (UNASSIGNED) before they run.
    fn list_unassigned_tasks(&self) {
        for id in 0..self.task_configs.len() as u32 {
            if self.runs_here(id) {
                self.board.task_counters(&self.plan.key, id);
            }
        }
    }

    fn start_tasks(&mut self, ctx: &mut Context<Self>) {
        info!(connector = %self.plan.key, protocol = %self.plan.protocol_text, group = %self.plan.group_id, tasks = self.task_configs.len(), "starting tasks");
        for id in 0..self.task_configs.len() as u32 {
            if self.runs_here(id) {
                self.spawn(id, ctx);
            }
        }
    }

    fn finish_stop_if_done(&mut self) {
        if self.stopping && self.slots.values().all(|s| s.running.is_none()) {
            for waiter in self.stop_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

/// Whether anything after the consumer reads the records' headers: the sink's tasks
/// (`sink_reads`), transforms (header transforms and predicates), the dead letter queue (a
/// dead letter keeps the record's headers) and error logs that include the record.
fn headers_read(sink_reads: bool, pipeline: &RecordPipeline, config: &SinkConnectorConfig) -> bool {
    let errors = &config.errors;
    sink_reads
        || pipeline.transforms()
        || errors.dead_letter_queue.is_some()
        || errors.log_include_messages
}

/// Connects a share-group member or a consumer-group member for task `id`. When the task
/// commits offsets itself (`task_commits_offsets`), a consumer-group member commits none and
/// hands its group metadata over with each batch instead. Without `headers_read` (nothing
/// downstream reads a header), a consumer-group member reads headers only while stage spans
/// are recorded or the tenant's budget counts bytes.
fn source_factory(
    plan: &ConnectorPlan,
    id: u32,
    task_commits_offsets: bool,
    headers_read: bool,
    shared_cluster: &SharedCluster,
) -> SourceFactory {
    let client_id = plan.scope.prefixed(&format!("{}-{id}", plan.config.name));
    let connector_client_id = plan.scope.prefixed(&plan.config.name);
    let topics = plan.topics.clone();
    let bootstrap = plan.bootstrap.clone();
    let group = plan.group_id.clone();
    // The settings were checked when the plan was made; were one wrong after all, the task
    // fails with the same message.
    match plan.protocol {
        GroupProtocol::Share => {
            // A cluster the tenant named is held to its egress policy at every dial.
            let egress = plan
                .scope
                .kafka_egress(&plan.config.originals, "consumer.override.");
            let config = plan
                .consumer
                .share_config(&bootstrap, &group, &client_id)
                .map(|(mut config, _warned_at_plan)| {
                    config.security = config.security.with_egress(egress);
                    config
                });
            let egress_checks = librdkafka_egress_checks(plan, false);
            let shared_cluster = Arc::clone(shared_cluster);
            Box::new(move || {
                async move {
                    vet_clusters(egress_checks).await?;
                    let config = config.map_err(|e| RuntimeError::Source(e.to_string()))?;
                    let cluster = shared_cluster
                        .get_or_try_init(|| {
                            let mut shared = config.clone();
                            shared.client_id = connector_client_id;
                            async move { ShareConsumer::connect_cluster(&shared).await }
                        })
                        .await
                        .map_err(crate::source::share_failure)?;
                    let consumer = ShareConsumer::connect_sharing(config, cluster)
                        .map_err(crate::source::share_failure)?;
                    Ok(Box::new(ShareGroupSource::new(consumer, topics)) as Box<dyn RecordSource>)
                }
                .boxed_local()
            })
        }
        GroupProtocol::Classic | GroupProtocol::Consumer => {
            let mut config = ClassicConfig::new(&bootstrap, &group);
            config.protocol = if plan.protocol == GroupProtocol::Consumer {
                RebalanceProtocol::Consumer
            } else {
                RebalanceProtocol::Classic
            };
            let max_poll_records = plan.consumer.max_poll_records();
            let mut overrides = plan.consumer.classic_overrides();
            overrides.insert("client.id".into(), client_id);
            config.overrides = overrides;
            config.commit_offsets = !task_commits_offsets;
            let join_watch = plan.join_watch.clone();
            let throttle = plan.scope.throttle.clone();
            let egress_checks = librdkafka_egress_checks(plan, true);
            Box::new(move || {
                async move {
                    vet_clusters(egress_checks).await?;
                    config.max_poll_records =
                        max_poll_records.map_err(|e| RuntimeError::Source(e.to_string()))?;
                    let source = ClassicSource::connect(config)
                        .map_err(|e| RuntimeError::Source(e.to_string()))?;
                    let mut source = ConsumerGroupSource::new(source, &topics)?;
                    if task_commits_offsets {
                        source = source.with_group_metadata();
                    }
                    if !headers_read {
                        source = source.without_headers(throttle);
                    }
                    if let Some(watch) = join_watch {
                        source = source.with_join_watch(watch);
                    }
                    Ok(Box::new(source) as Box<dyn RecordSource>)
                }
                .boxed_local()
            })
        }
    }
}

/// A cluster to judge before a task starts: its bootstrap list and the security (with the
/// tenant's egress policy) its client connects with.
type EgressCheck = (String, Result<ClientSecurity, String>);

/// The clusters a confined tenant named for this connector's librdkafka clients, which dial
/// on their own: the consumer's (`classic`: the share consumer vets its every dial itself)
/// and the dead letter queue producer's (`producer.override.bootstrap.servers`).
fn librdkafka_egress_checks(plan: &ConnectorPlan, classic: bool) -> Vec<EgressCheck> {
    let originals = &plan.config.originals;
    let mut checks = Vec::new();
    if let Some(egress) = plan
        .scope
        .kafka_egress(originals, "consumer.override.")
        .filter(|_| classic)
    {
        let security = plan
            .consumer
            .security()
            .and_then(|s| s.client_security().map_err(|e| e.into_config_error()))
            .map(|security| security.with_egress(Some(egress)))
            .map_err(|e| e.to_string());
        checks.push((plan.bootstrap.clone(), security));
    }
    if let Some(egress) = plan
        .scope
        .kafka_egress(originals, "producer.override.")
        .filter(|_| plan.dead_letters.is_some())
    {
        // The dead letter queue producer's settings: the worker's `producer.*`, then the
        // connector's overrides (as the worker builds it).
        let mut producer = spillway_core::convert::strip_prefix(&plan.worker, "producer.");
        producer.retain(|k, _| !k.starts_with("override."));
        let overrides = spillway_core::convert::strip_prefix(originals, "producer.override.");
        let bootstrap = crate::tenancy::CLUSTER_ADDRESS_KEYS
            .iter()
            .find_map(|key| overrides.get(*key))
            .cloned()
            .unwrap_or_default();
        producer.extend(overrides);
        let security = spillway_kafka::security::SecuritySettings::from_config(
            &producer.into_iter().collect(),
        )
        .and_then(|s| s.client_security())
        .map(|security| security.with_egress(Some(egress)))
        .map_err(|e| e.to_string());
        checks.push((bootstrap, security));
    }
    checks
}

/// Contacts each cluster under its security (the egress policy vetting the dial) and judges
/// every broker it advertises; a refusal is final ([`RuntimeError::Egress`]).
async fn vet_clusters(checks: Vec<EgressCheck>) -> Result<(), RuntimeError> {
    for (bootstrap, security) in checks {
        let security = security.map_err(RuntimeError::Source)?;
        Cluster::vet_egress(&bootstrap, security)
            .await
            .map_err(|e| {
                if e.is_egress_refusal() {
                    RuntimeError::Egress(e.to_string())
                } else {
                    RuntimeError::Source(e.to_string())
                }
            })?;
    }
    Ok(())
}

impl Actor for ConnectorSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let name = self.name().to_owned();
        self.board.connector_started(
            &name,
            self.plan.protocol_text.clone(),
            self.plan.group_id.clone(),
        );
        let tasks = self.plan.config.tasks_max;
        let started = self.start_connector();
        self.board
            .telemetry()
            .startups
            .connector_started(started.is_ok());
        self.board.set_labels(&name, self.metric_labels());
        if let Err(e) = started.and_then(|()| self.split(tasks)) {
            error!(connector = %name, error = %e, "connector failed");
            self.board.set_connector(&name, State::Failed, Some(e));
            return;
        }
        self.prepare_then_start(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for slot in self.slots.values() {
            if let Some(r) = &slot.running {
                r.kill();
            }
        }
        if let Some(c) = self.connector.as_mut() {
            if let Err(panic) = guard(|| c.stop()) {
                warn!(connector = %self.plan.key, "the connector's stop {panic}");
            }
        }
    }
}

impl Handler<TaskEvent> for ConnectorSupervisor {
    type Result = ();

    fn handle(&mut self, event: TaskEvent, ctx: &mut Context<Self>) {
        let name = self.name().to_owned();
        match event {
            TaskEvent::Progress { task, generation } => {
                if let Some(slot) = self.slots.get_mut(&task) {
                    if slot.generation == generation && slot.restarts > 0 {
                        slot.restarts = 0;
                        self.board.set_restarts(&name, task, 0);
                    }
                }
            }
            TaskEvent::Stopped { task, generation } => {
                let Some(slot) = self.slots.get_mut(&task) else {
                    return;
                };
                if slot.generation != generation {
                    return;
                }
                if let Some(r) = slot.running.take() {
                    r.kill();
                }
                if slot.restarting && !slot.retiring && !self.stopping {
                    slot.restarting = false;
                    self.spawn(task, ctx);
                    return;
                }
                if slot.retiring {
                    self.slots.remove(&task);
                    self.board.remove_task(&name, task);
                } else {
                    self.board.set_task(&name, task, State::Stopped, None);
                }
                self.finish_stop_if_done();
            }
            TaskEvent::Failed {
                task,
                generation,
                trace,
                for_good,
            } => {
                let max = self.plan.settings.restart_max_attempts;
                let stopping = self.stopping;
                let Some(slot) = self.slots.get_mut(&task) else {
                    return;
                };
                if slot.generation != generation || slot.killed {
                    return;
                }
                if let Some(r) = slot.running.take() {
                    r.kill();
                }
                if slot.restarting && !slot.retiring && !stopping {
                    // Failed while stopping for its restart: the restart was asked for anyway.
                    slot.restarting = false;
                    self.spawn(task, ctx);
                    return;
                }
                if stopping || slot.retiring {
                    if slot.retiring {
                        self.slots.remove(&task);
                        self.board.remove_task(&name, task);
                    } else {
                        self.board.set_task(&name, task, State::Failed, Some(trace));
                    }
                    self.finish_stop_if_done();
                    return;
                }
                if for_good {
                    error!(connector = %name, task, trace = %trace, "task failed for good: a restart cannot help");
                    self.board.set_task(&name, task, State::Failed, Some(trace));
                    return;
                }
                slot.restarts += 1;
                let restarts = slot.restarts;
                self.board.set_restarts(&name, task, restarts);
                if restarts > max {
                    error!(connector = %name, task, restarts = max, trace = %trace, "task failed for good");
                    self.board.set_task(&name, task, State::Failed, Some(trace));
                    return;
                }
                let wait = self.plan.settings.backoff(restarts);
                warn!(connector = %name, task, attempt = restarts, wait_ms = wait.as_millis() as u64, trace = %trace, "task failed; restarting");
                self.board
                    .set_task(&name, task, State::Restarting, Some(trace));
                ctx.run_later(wait, move |act, ctx| {
                    let wanted = act
                        .slots
                        .get(&task)
                        .is_some_and(|s| s.running.is_none() && !s.retiring && !s.killed);
                    if wanted && !act.stopping {
                        act.spawn(task, ctx);
                    }
                });
            }
        }
    }
}

impl Handler<SetTaskCount> for ConnectorSupervisor {
    type Result = Result<(), RuntimeError>;

    fn handle(&mut self, msg: SetTaskCount, ctx: &mut Context<Self>) -> Self::Result {
        let wanted = msg.0.max(1);
        let listed = self.task_configs.len() as u32;
        self.split(wanted).map_err(RuntimeError::Task)?;
        self.plan.config.tasks_max = self.task_configs.len();
        self.run_wanted_tasks(listed, ctx);
        info!(connector = %self.name(), tasks = self.task_configs.len(), "task count changed");
        Ok(())
    }
}

impl Handler<AssignTasks> for ConnectorSupervisor {
    type Result = Result<(), RuntimeError>;

    fn handle(&mut self, msg: AssignTasks, ctx: &mut Context<Self>) -> Self::Result {
        if self.plan.assigned == msg.0 {
            return Ok(());
        }
        self.plan.assigned = msg.0;
        let listed = self.task_configs.len() as u32;
        self.run_wanted_tasks(listed, ctx);
        info!(connector = %self.name(), assigned = ?self.plan.assigned, "tasks assigned to this worker changed");
        Ok(())
    }
}

impl ConnectorSupervisor {
    /// After a change of the task count or of the tasks assigned here: tasks no longer wanted
    /// here drain and go, wanted ones not running start. `listed`: how many task configs there
    /// were before the change.
    fn run_wanted_tasks(&mut self, listed: u32, ctx: &mut Context<Self>) {
        let name = self.name().to_owned();
        let count = self.task_configs.len() as u32;
        if self.preparing {
            // The wanted tasks start once the group and topics are set up.
            for id in 0..listed.max(count) {
                if id >= count || !self.runs_here(id) {
                    self.board.remove_task(&name, id);
                }
            }
            self.list_unassigned_tasks();
            return;
        }
        let wanted: BTreeSet<u32> = (0..count).filter(|id| self.runs_here(*id)).collect();
        for (id, slot) in self.slots.iter_mut() {
            if !wanted.contains(id) && !slot.retiring {
                slot.retiring = true;
                match &slot.running {
                    Some(r) => r.drain(),
                    None => self.board.remove_task(&name, *id),
                }
            }
        }
        self.slots
            .retain(|id, s| wanted.contains(id) || s.running.is_some());
        for id in wanted {
            let needs_start = match self.slots.get_mut(&id) {
                None => true,
                Some(slot) => {
                    slot.retiring = false;
                    false
                }
            };
            if needs_start {
                self.spawn(id, ctx);
            }
        }
    }
}

impl Handler<StopConnector> for ConnectorSupervisor {
    type Result = MessageResult<StopConnector>;

    fn handle(&mut self, _msg: StopConnector, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.stop_waiters.push(tx);
        if !self.stopping {
            self.stopping = true;
            let running = self.slots.values().filter(|s| s.running.is_some()).count();
            let gate = CloseGate::new(running);
            for slot in self.slots.values() {
                if let Some(r) = &slot.running {
                    r.drain_together(Arc::clone(&gate));
                }
            }
            ctx.run_later(self.plan.settings.shutdown_timeout, |act, _ctx| {
                for (id, slot) in act.slots.iter_mut() {
                    if let Some(r) = slot.running.take() {
                        warn!(connector = %act.plan.key, task = id, "task did not stop in time; cutting it off");
                        r.kill();
                    }
                }
                act.finish_stop_if_done();
            });
        }
        self.finish_stop_if_done();
        MessageResult(rx)
    }
}

impl Handler<RestartTask> for ConnectorSupervisor {
    type Result = Result<(), RuntimeError>;

    fn handle(&mut self, msg: RestartTask, ctx: &mut Context<Self>) -> Self::Result {
        let name = self.name().to_owned();
        let id = msg.0;
        let unknown = || RuntimeError::UnknownTask {
            connector: name.clone(),
            task: id,
        };
        if self.stopping {
            return Err(RuntimeError::Task(format!(
                "connector {name} is stopping; its tasks cannot be restarted"
            )));
        }
        if self.preparing {
            return Err(RuntimeError::Task(format!(
                "connector {name} is setting up its share group and topics; its tasks start after that"
            )));
        }
        if self.preparation_failed {
            if id as usize >= self.task_configs.len() {
                return Err(unknown());
            }
            info!(connector = %name, task = id, "setting up the share group and topics again");
            self.prepare_then_start(ctx);
            return Ok(());
        }
        let slot = self.slots.get_mut(&id).ok_or_else(unknown)?;
        if slot.retiring {
            return Err(unknown());
        }
        slot.killed = false;
        slot.restarts = 0;
        self.board.set_restarts(&name, id, 0);
        let Some(running) = &slot.running else {
            info!(connector = %name, task = id, "starting the task again");
            self.spawn(id, ctx);
            return Ok(());
        };
        if slot.restarting {
            return Ok(());
        }
        info!(connector = %name, task = id, "restarting the task");
        slot.restarting = true;
        running.drain();
        let generation = slot.generation;
        self.board.set_task(&name, id, State::Restarting, None);
        // A task that does not finish its graceful stop in time is cut off and started anew.
        ctx.run_later(self.plan.settings.shutdown_timeout, move |act, ctx| {
            let Some(slot) = act.slots.get_mut(&id) else {
                return;
            };
            if slot.generation != generation || !slot.restarting {
                return;
            }
            if let Some(r) = slot.running.take() {
                warn!(connector = %act.plan.key, task = id, "task did not stop in time for its restart; cutting it off");
                r.kill();
            }
            slot.restarting = false;
            if !act.stopping {
                act.spawn(id, ctx);
            }
        });
        Ok(())
    }
}

impl Handler<KillTask> for ConnectorSupervisor {
    type Result = Result<(), RuntimeError>;

    fn handle(&mut self, msg: KillTask, _ctx: &mut Context<Self>) -> Self::Result {
        let name = self.name().to_owned();
        let slot = self
            .slots
            .get_mut(&msg.0)
            .ok_or_else(|| RuntimeError::UnknownTask {
                connector: name.clone(),
                task: msg.0,
            })?;
        slot.killed = true;
        if let Some(r) = slot.running.take() {
            r.kill();
        }
        self.board.set_task(
            &name,
            msg.0,
            State::Failed,
            Some("killed on request (as a crash would): not restarted".into()),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::config::config_map;

    fn read(sink_reads: bool, extra: &[(&str, &str)]) -> bool {
        let mut pairs = vec![
            ("name", "files"),
            ("connector.class", "FileStreamSink"),
            ("topics", "orders"),
        ];
        pairs.extend_from_slice(extra);
        let config = config_map(&pairs);
        let parsed = SinkConnectorConfig::parse(&config).expect("valid config");
        let pipeline = RecordPipeline::from_config(&config, &ConfigMap::new()).expect("pipeline");
        headers_read(sink_reads, &pipeline, &parsed)
    }

    #[test]
    fn headers_are_left_unread_only_when_nothing_after_the_consumer_reads_them() {
        assert!(!read(false, &[]), "a sink that reads none, nothing else");
        assert!(read(true, &[]), "a sink that reads them");
        assert!(
            read(
                false,
                &[
                    ("transforms", "drop"),
                    ("transforms.drop.type", "DropHeaders"),
                    ("transforms.drop.headers", "h")
                ]
            ),
            "transforms may read them"
        );
        assert!(
            read(
                false,
                &[
                    ("errors.tolerance", "all"),
                    ("errors.deadletterqueue.topic.name", "dlq")
                ]
            ),
            "a dead letter keeps them"
        );
        assert!(
            read(
                false,
                &[
                    ("errors.log.enable", "true"),
                    ("errors.log.include.messages", "true")
                ]
            ),
            "error logs show them"
        );
        assert!(
            !read(
                false,
                &[("errors.tolerance", "all"), ("errors.log.enable", "true")]
            ),
            "error logs without the record do not"
        );
    }
}
