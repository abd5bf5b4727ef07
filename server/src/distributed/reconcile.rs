//! [`Reconciler`]: makes a distributed worker run what the group assigned it; see the
//! module docs of [`crate::distributed`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use spillway_actors::limits::TASKS_MAX_PER_WORKER;
use spillway_connectors::runtime_keys::TASK_ID;
use spillway_core::ConfigMap;
use spillway_kafka::cluster::Cluster;
use spillway_kafka::worker_group::{MemberEvent, WorkerGroupConfig, WorkerGroupMember};
use spillway_storage::kafka_store::{Status, StatusKey};
use spillway_storage::{ConnectorKey, TargetState};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::{configured_work, runtime_key, tasks_of, ClusterLink, Host, Role, REFRESH_INTERVAL};
use crate::herder::Herder;

/// How often a worker checks whether the tasks it gave up have drained.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// What runs here of one connector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Running {
    config: ConfigMap,
    /// The restart count it was started at: a higher one in the config topic (a restart
    /// asked for through any worker) restarts it.
    restarts: u32,
    tasks: BTreeSet<u32>,
}

/// One worker's reconciler; see the module docs.
pub struct Reconciler {
    herder: Arc<Herder>,
    link: Arc<ClusterLink>,
    host: Arc<Host>,
    member: WorkerGroupMember,
    events: mpsc::UnboundedReceiver<MemberEvent>,
    running: BTreeMap<ConnectorKey, Running>,
    /// Connector statuses this worker last wrote (state, trace), to write only changes.
    written: BTreeMap<ConnectorKey, (String, Option<String>)>,
    /// Task counts the leader computed, with the config they were computed from.
    task_counts: BTreeMap<ConnectorKey, (ConfigMap, usize)>,
    rebalance_timeout: Duration,
}

/// Stops a running reconciler.
pub struct ReconcilerHandle {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Option<WorkerGroupMember>>,
    /// Fires when the member stopped for good (the group refused this worker).
    pub failed: Option<oneshot::Receiver<String>>,
}

impl ReconcilerHandle {
    /// Stops reconciling; returns the group member so that the worker can leave the group
    /// after its tasks stopped.
    pub async fn stop(mut self) -> Option<WorkerGroupMember> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.ok().flatten()
    }
}

impl Reconciler {
    /// Joins the group on `cluster` and starts reconciling.
    pub fn start(
        herder: Arc<Herder>,
        cluster: Arc<Cluster>,
        group: WorkerGroupConfig,
    ) -> anyhow::Result<ReconcilerHandle> {
        let link = herder
            .cluster()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the herder is not a distributed worker's"))?;
        let host = Arc::new(Host::new(
            Arc::clone(&link),
            herder.worker().limits().tasks_per_worker,
        ));
        let rebalance_timeout = group.rebalance_timeout;
        let (member, events) = WorkerGroupMember::start(cluster, group, Arc::clone(&host) as _);
        let reconciler = Reconciler {
            herder,
            link,
            host,
            member,
            events,
            running: BTreeMap::new(),
            written: BTreeMap::new(),
            task_counts: BTreeMap::new(),
            rebalance_timeout,
        };
        let (stop, stopped) = oneshot::channel();
        let (fail, failed) = oneshot::channel();
        let task = tokio::spawn(reconciler.run(stopped, fail));
        Ok(ReconcilerHandle {
            stop: Some(stop),
            task,
            failed: Some(failed),
        })
    }

    async fn run(
        mut self,
        mut stop: oneshot::Receiver<()>,
        fail: oneshot::Sender<String>,
    ) -> Option<WorkerGroupMember> {
        let mut fail = Some(fail);
        loop {
            let link = Arc::clone(&self.link);
            tokio::select! {
                _ = &mut stop => return Some(self.member),
                event = self.events.recv() => match event {
                    Some(MemberEvent::Assigned { generation, leader, assignment, running, applied, .. }) => {
                        let revoked = assignment.revoked.clone();
                        self.link.set_role(Role {
                            generation,
                            leader,
                            leader_url: Some(assignment.leader_url.clone()),
                            allocation: running,
                            workers: assignment.workers.clone(),
                            unassigned: assignment.unassigned.clone(),
                        });
                        self.link.store().set_generation(generation);
                        self.herder.rewrite_statuses();
                        self.written.clear();
                        self.tick().await;
                        self.wait_drained(&revoked).await;
                        let _ = applied.send(());
                        continue;
                    }
                    Some(MemberEvent::Lost { reason }) => {
                        warn!(%reason, "this worker lost its place in the group: stopping what it runs until it is back");
                        self.link.set_role(Role::default());
                    }
                    Some(MemberEvent::Failed(e)) => {
                        error!(error = %e, "the worker cannot take part in its group");
                        self.link.set_role(Role::default());
                        self.tick().await;
                        if let Some(fail) = fail.take() {
                            let _ = fail.send(e.to_string());
                        }
                        return None;
                    }
                    None => return None,
                },
                _ = link.wake.notified() => {}
                _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
            }
            self.tick().await;
        }
    }

    /// Reads the topics, leads when leading, and brings the runtime in line.
    async fn tick(&mut self) {
        let store = Arc::clone(self.link.store());
        if let Err(e) = store.configs().refresh().await {
            warn!(error = %e, "cannot read the config topic; acting on what was read before");
        }
        if let Err(e) = store.statuses().refresh().await {
            warn!(error = %e, "cannot read the status topic");
        }
        let view = store.configs().view();
        let tenants: Vec<_> = view.tenants.values().cloned().collect();
        self.herder
            .tenants()
            .sync(&tenants, view.offset, || store.configs().offset());
        if self.link.is_leader() {
            self.lead().await;
        }
        self.apply().await;
        self.write_connector_statuses().await;
        if self.link.is_leader() {
            self.write_unassigned_statuses().await;
        }
    }

    /// The leader's report of tasks no worker has room for: UNASSIGNED with why, so that a
    /// task left out is visible in its status rather than silently missing.
    async fn write_unassigned_statuses(&mut self) {
        let role = self.link.role();
        if role.unassigned.tasks.is_empty() {
            return;
        }
        let store = Arc::clone(self.link.store());
        let view = store.configs().view();
        let known = store.statuses().view().statuses;
        let caps: Vec<String> = role
            .workers
            .iter()
            .map(|w| w.max_tasks.map_or("no limit".into(), |c| c.to_string()))
            .collect();
        let reason = format!(
            "no worker has room for this task: every live worker runs as many tasks as its \
             {TASKS_MAX_PER_WORKER} allows ({}). It starts when a worker joins or other tasks \
             stop",
            caps.join(" + ")
        );
        let mut statuses = Vec::new();
        for task in &role.unassigned.tasks {
            let Some((tenant, name)) = task.connector.split_once('/') else {
                continue;
            };
            let connector = ConnectorKey::new(tenant, name);
            if !view.connectors.contains_key(&connector) {
                continue;
            }
            let key = StatusKey::Task(connector, task.task);
            let already = known.get(&key).is_some_and(|s| {
                s.state == "UNASSIGNED"
                    && s.trace.as_deref() == Some(reason.as_str())
                    && s.worker_id == store.worker_id()
            });
            if !already {
                statuses.push((key, store.status("UNASSIGNED", Some(reason.clone()), 0)));
            }
        }
        if statuses.is_empty() {
            return;
        }
        warn!(
            tasks = statuses.len(),
            "tasks wait for room: every worker is at its tasks.max.per.worker"
        );
        if let Err(e) = store.statuses().put_all(&statuses).await {
            warn!(error = %e, "cannot write the status of tasks no worker has room for");
        }
    }

    /// The leader's part: task configs for every connector whose configuration changed, and
    /// a rebalance when the configured work is not what the group was assigned from.
    async fn lead(&mut self) {
        let store = Arc::clone(self.link.store());
        let view = store.configs().view();
        for (key, state) in &view.connectors {
            if state.target_state == TargetState::Stopped {
                continue;
            }
            let count = match self.task_counts.get(key) {
                Some((config, count)) if *config == state.config => *count,
                _ => {
                    let count = self.herder.task_count(&state.config);
                    self.task_counts
                        .insert(key.clone(), (state.config.clone(), count));
                    count
                }
            };
            let tasks: Vec<ConfigMap> = (0..count)
                .map(|i| {
                    let mut config = state.config.clone();
                    config.insert(TASK_ID.to_owned(), i.to_string());
                    config
                })
                .collect();
            if state.tasks != tasks {
                info!(tenant = %key.tenant, connector = %key.name, tasks = count, "writing task configs");
                if let Err(e) = store.configs().put_task_configs(key, &tasks).await {
                    warn!(tenant = %key.tenant, connector = %key.name, error = %e, "cannot write the task configs; trying again");
                }
            }
        }
        self.task_counts
            .retain(|k, _| view.connectors.contains_key(k));
        let work = configured_work(&store.configs().view());
        if self.host.work_changed(&work) {
            info!("the configured connectors and tasks changed: rebalancing");
            self.member.request_rejoin();
        }
    }

    /// Starts, stops and re-assigns connectors so that this worker runs what the group gave
    /// it of what should run.
    async fn apply(&mut self) {
        let view = self.link.store().configs().view();
        let allocation = self.link.role().allocation;
        let mut wanted: BTreeMap<ConnectorKey, Running> = BTreeMap::new();
        for (key, state) in &view.connectors {
            if state.target_state != TargetState::Running
                || !self.herder.tenants().exists(&key.tenant)
            {
                continue;
            }
            let runtime = runtime_key(&key.tenant, &key.name);
            let tasks = tasks_of(&allocation, &runtime);
            if tasks.is_empty() && !allocation.connectors.contains(&runtime) {
                continue;
            }
            wanted.insert(
                key.clone(),
                Running {
                    config: state.config.clone(),
                    restarts: state.restarts,
                    tasks,
                },
            );
        }
        let worker = self.herder.worker();
        let stale: Vec<ConnectorKey> = self
            .running
            .iter()
            .filter(|(key, have)| {
                wanted
                    .get(*key)
                    .is_none_or(|want| want.config != have.config || want.restarts != have.restarts)
            })
            .map(|(key, _)| key.clone())
            .collect();
        // Connectors stop and start side by side: each waits on Kafka (group checks, share
        // group setup, graceful drains), and a worker taking over a dead one's work may have
        // dozens to start.
        let herder = &self.herder;
        let stops = stale.iter().map(|key| async move {
            info!(tenant = %key.tenant, connector = %key.name, "stopping here");
            if let Err(e) = herder.shut(key).await {
                warn!(tenant = %key.tenant, connector = %key.name, error = %e, "stopping the connector failed");
            }
            worker.forget_assignment(&runtime_key(&key.tenant, &key.name));
        });
        futures::future::join_all(stops).await;
        for key in &stale {
            self.running.remove(key);
        }
        let mut starts = Vec::new();
        let mut reassigned = Vec::new();
        for (key, want) in wanted {
            match self.running.get(&key) {
                None => starts.push((key, want)),
                Some(have) if have.tasks != want.tasks => reassigned.push((key, want)),
                Some(_) => {}
            }
        }
        let reassigning = reassigned.iter().map(|(key, want)| async move {
            info!(tenant = %key.tenant, connector = %key.name, tasks = ?want.tasks, "tasks here changed");
            let runtime = runtime_key(&key.tenant, &key.name);
            if let Err(e) = worker.assign_tasks(&runtime, Some(want.tasks.clone())).await {
                warn!(connector = %runtime, error = %e, "cannot assign the tasks");
            }
        });
        let starting = starts.iter().map(|(key, want)| async move {
            info!(tenant = %key.tenant, connector = %key.name, tasks = ?want.tasks, "starting here");
            let runtime = runtime_key(&key.tenant, &key.name);
            if let Err(e) = worker.assign_tasks(&runtime, Some(want.tasks.clone())).await {
                warn!(connector = %runtime, error = %e, "cannot assign the tasks");
            }
            herder.launch(key, want.config.clone()).await;
        });
        futures::future::join(
            futures::future::join_all(reassigning),
            futures::future::join_all(starting),
        )
        .await;
        self.running.extend(starts);
        self.running.extend(reassigned);
    }

    /// Waits until the tasks the group took away have drained (their in-flight batches
    /// finished and acknowledged), so the leader never hands out a task still running here.
    async fn wait_drained(&self, revoked: &spillway_kafka::worker_group::Allocation) {
        if revoked.tasks.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.rebalance_timeout;
        let worker = self.herder.worker();
        let by_connector: BTreeSet<&str> =
            revoked.tasks.iter().map(|t| t.connector.as_str()).collect();
        loop {
            let drained = by_connector
                .iter()
                .all(|c| worker.tasks_stopped(c, &tasks_of(revoked, c)));
            if drained {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                warn!("tasks given up did not stop within rebalance.timeout.ms; going on");
                return;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Writes the status of the connectors this worker owns, when it changed.
    async fn write_connector_statuses(&mut self) {
        let allocation = self.link.role().allocation;
        let store = Arc::clone(self.link.store());
        for runtime in &allocation.connectors {
            let Some((tenant, name)) = runtime.split_once('/') else {
                continue;
            };
            let key = ConnectorKey::new(tenant, name);
            let Ok(status) = self.herder.status(tenant, name).await else {
                continue;
            };
            let now = (
                status.connector.state.clone(),
                status.connector.trace.clone(),
            );
            if self.written.get(&key) == Some(&now) {
                continue;
            }
            let written: Status = store.status(&now.0, now.1.clone(), 0);
            match store
                .statuses()
                .put(&StatusKey::Connector(key.clone()), &written)
                .await
            {
                Ok(()) => {
                    self.written.insert(key, now);
                }
                Err(e) => {
                    warn!(connector = %runtime, error = %e, "cannot write the connector status")
                }
            }
        }
    }
}
