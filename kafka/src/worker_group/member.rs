//! [`WorkerGroupMember`]: one worker's membership in the workers' classic group.
//!
//! One task drives the member through the classic group protocol, one step at a time:
//! FindCoordinator, JoinGroup (the coordinator waits for every member and elects a leader),
//! the leader's assignment, SyncGroup (every member gets its part), then Heartbeat at the
//! heartbeat interval until the coordinator answers that a rebalance is under way, the worker
//! asks for one, or held work's delay is over; then it joins again with the same member id.
//! Stopping sends LeaveGroup so the others rebalance at once instead of after the session
//! timeout.
//!
//! The member owns its [`Cluster`] (its own connections): a JoinGroup may wait the whole
//! rebalance timeout for its answer, and nothing else of the worker should queue behind it.
//!
//! What the worker has to do arrives as [`MemberEvent`]s. An assignment that revokes work is
//! acknowledged by the worker once that work has stopped; only then does the member join again,
//! so the leader never hands out work that still runs (the cooperative protocol's promise).
//! A member that cannot reach its coordinator for longer than the session timeout has been
//! dropped from the group by then and its work handed on after the delay: it reports
//! [`MemberEvent::Lost`] so that the worker stops everything rather than run it twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    HeartbeatRequest, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::assignor::IncrementalAssignor;
use super::protocol::{
    Allocation, AssignmentError, ProtocolError, WorkerAssignment, WorkerCapacity, WorkerMetadata,
    PROTOCOL_NAME, PROTOCOL_TYPE, PROTOCOL_VERSION,
};
use crate::backoff::Backoff;
use crate::cluster::{Cluster, ClusterError};
use crate::connection::{Connection, ConnectionError};
use crate::error_name;

const JOIN_GROUP_KEY: i16 = 11;
const LEAVE_GROUP_KEY: i16 = 13;
const SYNC_GROUP_KEY: i16 = 14;
/// The group APIs are spoken in their last non-flexible versions, which Kafka 4.2 accepts:
/// the dev broker (librdkafka's mock, `rdkafka_mock_handlers.c`) announces flexible versions of
/// JoinGroup (v6), SyncGroup (v4), Heartbeat (v4) and LeaveGroup (v3-4) but reads every version
/// with the old layout (int32 array counts, one member at the top level), so a flexible request
/// makes it drop the connection. Nothing of the newer versions is needed here: the join reason
/// (v8), the protocol type echoed in SyncGroup (v5), batch leaves (v3).
///
/// JoinGroup v4+: the coordinator hands out member ids (MEMBER_ID_REQUIRED, KIP-394).
const JOIN_GROUP_VERSIONS: (i16, i16) = (4, 5);
const SYNC_GROUP_VERSIONS: (i16, i16) = (0, 3);
const HEARTBEAT_VERSIONS: (i16, i16) = (0, 3);
const LEAVE_GROUP_VERSIONS: (i16, i16) = (0, 2);
/// A JoinGroup or SyncGroup may wait up to the rebalance timeout; the request limit is that
/// plus this margin (Kafka's clients add 5 s too).
const REBALANCE_REQUEST_MARGIN: Duration = Duration::from_secs(5);
/// How long a leader of several members waits before its SyncGroup. On Kafka it costs only this
/// much per rebalance (followers wait for the leader's SyncGroup anyway). The dev broker needs
/// it: it completes a generation as soon as the leader's SyncGroup names every member's
/// assignment and then refuses the followers whose SyncGroup came later
/// (`rdkafka_mock_cgrp.c`, `sync_check` counts assignments, not synced members), where Kafka
/// answers them from the stored assignment.
const LEADER_SYNC_GRACE: Duration = Duration::from_millis(200);
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The group settings of a distributed worker (Connect's names in the docs of each field).
#[derive(Debug, Clone)]
pub struct WorkerGroupConfig {
    /// `group.id`.
    pub group_id: String,
    /// `session.timeout.ms`: without a heartbeat for this long, the coordinator drops the member.
    pub session_timeout: Duration,
    /// `rebalance.timeout.ms`: how long the coordinator waits for members to join again.
    pub rebalance_timeout: Duration,
    /// `heartbeat.interval.ms`.
    pub heartbeat_interval: Duration,
    /// `scheduled.rebalance.max.delay.ms`: how long a departed worker's work is held for it.
    pub scheduled_rebalance_max_delay: Duration,
}

impl WorkerGroupConfig {
    /// Kafka Connect's defaults: session 10 s, rebalance 60 s, heartbeat 3 s, delay 5 min.
    pub fn new(group_id: impl Into<String>) -> WorkerGroupConfig {
        WorkerGroupConfig {
            group_id: group_id.into(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(3),
            scheduled_rebalance_max_delay: Duration::from_secs(300),
        }
    }
}

/// What the member needs from its worker.
pub trait WorkerHost: Send + Sync + 'static {
    /// The worker's REST URL, sent to the others.
    fn url(&self) -> String;
    /// The config-topic offset the worker has read up to (-1: nothing yet).
    fn config_offset(&self) -> i64;
    /// The most tasks the worker runs (`tasks.max.per.worker`), sent to the leader.
    fn max_tasks(&self) -> Option<u64>;
    /// As leader: every configured connector and task, read from the config topic at least
    /// up to `at_least`, with the offset read to; `None` when the worker cannot read that far
    /// now (the group then reads on and joins again).
    fn configured_work(&self, at_least: i64) -> Option<(i64, Allocation)>;
}

/// What the worker is told.
#[derive(Debug)]
pub enum MemberEvent {
    /// A generation completed. The worker stops `assignment.revoked`, starts
    /// `assignment.assigned`, and then sends on (or drops) `applied`; the member joins again
    /// after that when the assignment revoked work or carried an error.
    Assigned {
        generation: i32,
        member_id: String,
        leader: bool,
        assignment: Box<WorkerAssignment>,
        /// Everything the worker should run now.
        running: Allocation,
        applied: oneshot::Sender<()>,
    },
    /// The member lost its place in the group (coordinator unreachable past the session
    /// timeout): the worker stops everything; the member keeps trying to join.
    Lost { reason: String },
    /// The member stopped for good: the group cannot be joined with these settings.
    Failed(Arc<WorkerGroupError>),
}

/// Why the member cannot take part in the group.
#[derive(Debug, thiserror::Error)]
pub enum WorkerGroupError {
    #[error("{api} for worker group '{group}' was refused with {name} ({code}){message}{hint}")]
    Refused {
        api: &'static str,
        group: String,
        code: i16,
        name: String,
        message: String,
        hint: &'static str,
    },
    #[error("worker group '{group}': {source}")]
    Protocol {
        group: String,
        #[source]
        source: ProtocolError,
    },
    #[error("worker group '{group}': the coordinator chose protocol '{chosen}', not '{PROTOCOL_NAME}'; another kind of member is in the group")]
    ForeignProtocol { group: String, chosen: String },
    #[error("worker group '{group}': the security settings do not let this worker in: {source}")]
    Security {
        group: String,
        #[source]
        source: ClusterError,
    },
}

/// A step of the protocol that did not complete, and what to do about it.
enum Setback {
    /// Join again at once (a rebalance began, the generation moved on).
    Rejoin,
    /// The coordinator moved or is unreachable: find it again after a backoff.
    Coordinator(String),
    /// Try the same again after a backoff.
    Retry(String),
    Fatal(WorkerGroupError),
}

/// A worker's membership; see the module docs.
pub struct WorkerGroupMember {
    rejoin: Arc<Notify>,
    leave: Option<oneshot::Sender<oneshot::Sender<()>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for WorkerGroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerGroupMember").finish_non_exhaustive()
    }
}

impl WorkerGroupMember {
    /// Starts taking part in the group on `cluster` (which the member should have to itself).
    pub fn start(
        cluster: Arc<Cluster>,
        config: WorkerGroupConfig,
        host: Arc<dyn WorkerHost>,
    ) -> (WorkerGroupMember, mpsc::UnboundedReceiver<MemberEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let (leave_tx, leave_rx) = oneshot::channel();
        let rejoin = Arc::new(Notify::new());
        let member = Member {
            assignor: IncrementalAssignor::new(
                config.scheduled_rebalance_max_delay.as_millis() as u64
            ),
            cluster,
            config,
            host,
            events,
            rejoin: Arc::clone(&rejoin),
            member_id: String::new(),
            generation: -1,
            last_completed: None,
            running: Allocation::default(),
            coordinator: None,
            last_contact: Instant::now(),
            epoch: Instant::now(),
        };
        let task = tokio::spawn(member.run(leave_rx));
        (
            WorkerGroupMember {
                rejoin,
                leave: Some(leave_tx),
                task,
            },
            receiver,
        )
    }

    /// Asks for a rebalance (the leader does after a config change, so that new work is
    /// assigned).
    pub fn request_rejoin(&self) {
        self.rejoin.notify_one();
    }

    /// Leaves the group (LeaveGroup) and stops; the others rebalance at once.
    pub async fn leave(mut self) {
        if let Some(leave) = self.leave.take() {
            let (done, left) = oneshot::channel();
            if leave.send(done).is_ok() {
                let _ = left.await;
            }
        }
        let _ = (&mut self.task).await;
    }

    /// Stops without leaving, as a worker that dies: the coordinator notices only when the
    /// session times out.
    pub fn abandon(self) {
        self.task.abort();
    }
}

impl Drop for WorkerGroupMember {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The member's state, owned by its task.
struct Member {
    cluster: Arc<Cluster>,
    config: WorkerGroupConfig,
    host: Arc<dyn WorkerHost>,
    events: mpsc::UnboundedSender<MemberEvent>,
    rejoin: Arc<Notify>,
    assignor: IncrementalAssignor,
    /// Empty until the coordinator gives one; kept across rejoins.
    member_id: String,
    generation: i32,
    /// The last generation whose SyncGroup answered.
    last_completed: Option<i32>,
    /// What the worker runs: what it was given, minus what it was told to stop.
    running: Allocation,
    coordinator: Option<Arc<Connection>>,
    /// The last answer from the coordinator, for telling when membership must be lost.
    last_contact: Instant,
    /// The start of the assignor's clock.
    epoch: Instant,
}

/// What happened to one join.
enum Joined {
    /// Heartbeat until something asks for a rebalance, joining again after `rejoin_after`.
    Stable { rejoin_after: Option<Duration> },
    /// Join again now.
    Again,
}

impl Member {
    async fn run(mut self, mut leave: oneshot::Receiver<oneshot::Sender<()>>) {
        let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
        loop {
            let joined = tokio::select! {
                joined = self.join_and_sync() => joined,
                done = &mut leave => {
                    self.leave_group(done.ok()).await;
                    return;
                }
            };
            let rejoin_after = match joined {
                Ok(Joined::Stable { rejoin_after }) => {
                    backoff.reset();
                    rejoin_after
                }
                Ok(Joined::Again) => continue,
                Err(setback) => {
                    if !self.setback(setback, &mut backoff).await {
                        return;
                    }
                    continue;
                }
            };
            tokio::select! {
                setback = self.heartbeat_until_rebalance(rejoin_after) => {
                    if !self.setback(setback, &mut backoff).await {
                        return;
                    }
                }
                done = &mut leave => {
                    self.leave_group(done.ok()).await;
                    return;
                }
            }
        }
    }

    /// Handles a setback; false when the member must stop.
    async fn setback(&mut self, setback: Setback, backoff: &mut Backoff) -> bool {
        match setback {
            Setback::Rejoin => {}
            Setback::Coordinator(why) => {
                debug!(group = %self.config.group_id, %why, "finding the coordinator again");
                self.coordinator = None;
                self.lose_membership_if_cut_off(&why);
                tokio::time::sleep(backoff.next_wait()).await;
            }
            Setback::Retry(why) => {
                debug!(group = %self.config.group_id, %why, "retrying");
                self.lose_membership_if_cut_off(&why);
                tokio::time::sleep(backoff.next_wait()).await;
            }
            Setback::Fatal(error) => {
                warn!(group = %self.config.group_id, %error, "the worker cannot take part in its group");
                let _ = self.events.send(MemberEvent::Failed(Arc::new(error)));
                return false;
            }
        }
        true
    }

    /// Past the session timeout without an answer, the coordinator has dropped this member
    /// and the others will take its work: stop it here too.
    fn lose_membership_if_cut_off(&mut self, why: &str) {
        if self.last_contact.elapsed() < self.config.session_timeout {
            return;
        }
        self.member_id.clear();
        self.generation = -1;
        if !self.running.is_empty() {
            let reason = format!(
                "no answer from the coordinator of worker group '{}' for more than session.timeout.ms ({:?}): {why}",
                self.config.group_id, self.config.session_timeout
            );
            warn!(%reason, "stopping all work of this worker");
            self.running = Allocation::default();
            let _ = self.events.send(MemberEvent::Lost { reason });
        }
    }

    async fn coordinator(&mut self) -> Result<Arc<Connection>, Setback> {
        if let Some(conn) = &self.coordinator {
            if !conn.is_poisoned() {
                return Ok(Arc::clone(conn));
            }
        }
        let group = &self.config.group_id;
        let id = self
            .cluster
            .find_coordinator(group)
            .await
            .map_err(|e| self.cluster_setback(e))?;
        let conn = self
            .cluster
            .broker(id)
            .await
            .map_err(|e| self.cluster_setback(e))?;
        self.coordinator = Some(Arc::clone(&conn));
        Ok(conn)
    }

    fn cluster_setback(&self, e: ClusterError) -> Setback {
        if e.is_security_error() {
            return Setback::Fatal(WorkerGroupError::Security {
                group: self.config.group_id.clone(),
                source: e,
            });
        }
        Setback::Coordinator(e.to_string())
    }

    fn connection_setback(&self, api: &'static str, e: ConnectionError) -> Setback {
        match e {
            ConnectionError::UnsupportedApi { .. } | ConnectionError::NoCommonVersion { .. } => {
                Setback::Fatal(WorkerGroupError::Refused {
                    api,
                    group: self.config.group_id.clone(),
                    code: ResponseError::UnsupportedVersion.code(),
                    name: "UnsupportedVersion".into(),
                    message: format!(": {e}"),
                    hint:
                        "; distributed mode needs a broker with classic groups (Kafka 2.3 or newer)",
                })
            }
            e if e.is_security_error() => Setback::Fatal(WorkerGroupError::Security {
                group: self.config.group_id.clone(),
                source: ClusterError::Connection(e),
            }),
            e => Setback::Coordinator(format!("{api}: {e}")),
        }
    }

    /// The setback for a non-zero error code of `api`.
    fn refusal(&mut self, api: &'static str, code: i16, message: Option<&StrBytes>) -> Setback {
        use ResponseError::*;
        let Some(error) = ResponseError::try_from_code(code) else {
            return Setback::Retry(format!("{api}: unknown error code {code}"));
        };
        match error {
            RebalanceInProgress => Setback::Rejoin,
            IllegalGeneration => {
                self.generation = -1;
                Setback::Rejoin
            }
            UnknownMemberId => {
                // Dropped by the coordinator (session expired): join as a new member, still
                // reporting what runs here so the leader can settle duplicates.
                self.member_id.clear();
                self.generation = -1;
                Setback::Rejoin
            }
            NotCoordinator | CoordinatorNotAvailable => {
                Setback::Coordinator(format!("{api}: {}", error_name(code)))
            }
            CoordinatorLoadInProgress => Setback::Retry(format!("{api}: {}", error_name(code))),
            _ => {
                let hint = match error {
                    InconsistentGroupProtocol => "; group.id names a group of another kind (a consumer group, a share group or Kafka Connect workers): give the workers a group id of their own",
                    GroupAuthorizationFailed => "; grant the worker's principal READ on the group",
                    InvalidSessionTimeout => "; session.timeout.ms must lie within the broker's group.min.session.timeout.ms and group.max.session.timeout.ms",
                    GroupMaxSizeReached => "; the broker's group.max.size limits the number of workers",
                    _ => "",
                };
                Setback::Fatal(WorkerGroupError::Refused {
                    api,
                    group: self.config.group_id.clone(),
                    code,
                    name: error_name(code),
                    message: message
                        .filter(|m| !m.is_empty())
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default(),
                    hint,
                })
            }
        }
    }

    fn rebalance_request_timeout(&self) -> Duration {
        self.config.rebalance_timeout + REBALANCE_REQUEST_MARGIN
    }

    async fn join_and_sync(&mut self) -> Result<Joined, Setback> {
        let conn = self.coordinator().await?;
        let metadata = WorkerMetadata {
            version: PROTOCOL_VERSION,
            url: self.host.url(),
            config_offset: self.host.config_offset(),
            running: self.running.clone(),
            max_tasks: self.host.max_tasks(),
        };
        let version = conn
            .pick(JOIN_GROUP_KEY, JOIN_GROUP_VERSIONS.0, JOIN_GROUP_VERSIONS.1)
            .map_err(|e| self.connection_setback("JoinGroup", e))?;
        let mut request = JoinGroupRequest::default();
        request.group_id = Cluster::group_id(&self.config.group_id);
        request.session_timeout_ms = millis(self.config.session_timeout);
        request.rebalance_timeout_ms = millis(self.config.rebalance_timeout);
        request.member_id = StrBytes::from_string(self.member_id.clone());
        request.protocol_type = StrBytes::from_static_str(PROTOCOL_TYPE);
        let mut protocol = JoinGroupRequestProtocol::default();
        protocol.name = StrBytes::from_static_str(PROTOCOL_NAME);
        protocol.metadata = Bytes::from(metadata.encode());
        request.protocols = vec![protocol];
        if version >= 8 {
            request.reason = Some(StrBytes::from_static_str("worker joins"));
        }
        let timeout = self.rebalance_request_timeout();
        let response = conn
            .request(&request, version, timeout)
            .await
            .map_err(|e| self.connection_setback("JoinGroup", e))?;
        self.last_contact = Instant::now();
        if response.error_code == ResponseError::MemberIdRequired.code() {
            // KIP-394: the coordinator names the member, which joins again with that id.
            self.member_id = response.member_id.to_string();
            return Ok(Joined::Again);
        }
        if response.error_code != 0 {
            return Err(self.refusal("JoinGroup", response.error_code, None));
        }
        if let Some(chosen) = &response.protocol_name {
            if chosen.as_str() != PROTOCOL_NAME {
                return Err(Setback::Fatal(WorkerGroupError::ForeignProtocol {
                    group: self.config.group_id.clone(),
                    chosen: chosen.to_string(),
                }));
            }
        }
        self.member_id = response.member_id.to_string();
        self.generation = response.generation_id;
        let leader = response.leader.as_str() == self.member_id;
        let assignments = if leader {
            self.lead(&response, &metadata)?
        } else {
            Vec::new()
        };
        debug!(group = %self.config.group_id, member = %self.member_id, generation = self.generation, leader, "joined");
        if leader && response.members.len() > 1 {
            tokio::time::sleep(LEADER_SYNC_GRACE).await;
        }
        self.sync(&conn, assignments, leader).await
    }

    /// The leader's part: every member's assignment, encoded.
    fn lead(
        &mut self,
        response: &JoinGroupResponse,
        own: &WorkerMetadata,
    ) -> Result<Vec<SyncGroupRequestAssignment>, Setback> {
        let mut members = BTreeMap::new();
        for member in &response.members {
            let id = member.member_id.to_string();
            let metadata = WorkerMetadata::decode(&id, &member.metadata).map_err(|source| {
                Setback::Fatal(WorkerGroupError::Protocol {
                    group: self.config.group_id.clone(),
                    source,
                })
            })?;
            members.insert(id, metadata);
        }
        let max_offset = members
            .values()
            .map(|m| m.config_offset)
            .max()
            .unwrap_or(-1);
        let leader_url = members
            .get(&self.member_id)
            .map(|m| m.url.clone())
            .unwrap_or_else(|| own.url.clone());
        let workers: Vec<WorkerCapacity> = members
            .values()
            .map(|m| WorkerCapacity {
                url: m.url.clone(),
                max_tasks: m.max_tasks,
            })
            .collect();
        let caps: BTreeMap<String, u64> = members
            .iter()
            .filter_map(|(id, m)| m.max_tasks.map(|cap| (id.clone(), cap)))
            .collect();
        let base = |error, offset| WorkerAssignment {
            version: PROTOCOL_VERSION,
            error,
            leader: self.member_id.clone(),
            leader_url: leader_url.clone(),
            config_offset: offset,
            assigned: Allocation::default(),
            revoked: Allocation::default(),
            delay_ms: 0,
            workers: workers.clone(),
            unassigned: Allocation::default(),
        };
        let mut out: BTreeMap<String, WorkerAssignment> = BTreeMap::new();
        match self.host.configured_work(max_offset) {
            None => {
                info!(group = %self.config.group_id, max_offset, "leader has not read the config topic as far as another worker; everyone reads on and joins again");
                for id in members.keys() {
                    out.insert(
                        id.clone(),
                        base(Some(AssignmentError::ConfigMismatch), max_offset),
                    );
                }
            }
            Some((offset, configured)) => {
                let running: BTreeMap<String, Allocation> = members
                    .iter()
                    .map(|(id, m)| (id.clone(), m.running.clone()))
                    .collect();
                let now = self.epoch.elapsed().as_millis() as u64;
                let result = self.assignor.assign(
                    now,
                    self.last_completed,
                    self.generation,
                    &running,
                    &configured,
                    &caps,
                );
                if !result.unassigned.is_empty() {
                    warn!(group = %self.config.group_id, tasks = result.unassigned.tasks.len(), "no worker has room for some tasks (every worker is at its tasks.max.per.worker); they wait for capacity");
                }
                for (id, member) in result.members {
                    let mut assignment = base(None, offset);
                    assignment.assigned = member.assigned;
                    assignment.revoked = member.revoked;
                    assignment.delay_ms = result.delay_ms;
                    assignment.unassigned = result.unassigned.clone();
                    out.insert(id, assignment);
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|(id, assignment)| {
                let mut a = SyncGroupRequestAssignment::default();
                a.member_id = StrBytes::from_string(id);
                a.assignment = Bytes::from(assignment.encode());
                a
            })
            .collect())
    }

    async fn sync(
        &mut self,
        conn: &Connection,
        assignments: Vec<SyncGroupRequestAssignment>,
        leader: bool,
    ) -> Result<Joined, Setback> {
        let version = conn
            .pick(SYNC_GROUP_KEY, SYNC_GROUP_VERSIONS.0, SYNC_GROUP_VERSIONS.1)
            .map_err(|e| self.connection_setback("SyncGroup", e))?;
        let mut request = SyncGroupRequest::default();
        request.group_id = Cluster::group_id(&self.config.group_id);
        request.generation_id = self.generation;
        request.member_id = StrBytes::from_string(self.member_id.clone());
        if version >= 5 {
            request.protocol_type = Some(StrBytes::from_static_str(PROTOCOL_TYPE));
            request.protocol_name = Some(StrBytes::from_static_str(PROTOCOL_NAME));
        }
        request.assignments = assignments;
        let response = conn
            .request(&request, version, self.rebalance_request_timeout())
            .await
            .map_err(|e| self.connection_setback("SyncGroup", e))?;
        self.last_contact = Instant::now();
        if response.error_code != 0 {
            return Err(self.refusal("SyncGroup", response.error_code, None));
        }
        if response.assignment.is_empty() {
            // The leader left us out (it joined before us and saw an older member list).
            return Ok(Joined::Again);
        }
        let assignment =
            WorkerAssignment::decode("the leader", &response.assignment).map_err(|source| {
                Setback::Fatal(WorkerGroupError::Protocol {
                    group: self.config.group_id.clone(),
                    source,
                })
            })?;
        self.last_completed = Some(self.generation);
        if assignment.error.is_none() {
            self.running.remove_all(&assignment.revoked);
            self.running.add_all(&assignment.assigned);
        }
        let must_rejoin = assignment.error.is_some() || !assignment.revoked.is_empty();
        let delay = assignment.delay_ms;
        info!(
            group = %self.config.group_id,
            member = %self.member_id,
            generation = self.generation,
            leader,
            assigned = assignment.assigned.len(),
            revoked = assignment.revoked.len(),
            delay_ms = delay,
            "assignment received"
        );
        let (applied, done) = oneshot::channel();
        let _ = self.events.send(MemberEvent::Assigned {
            generation: self.generation,
            member_id: self.member_id.clone(),
            leader,
            assignment: Box::new(assignment),
            running: self.running.clone(),
            applied,
        });
        if must_rejoin {
            // Revoked work must have stopped before the leader hands it on; a worker that
            // does not answer within the rebalance timeout would be dropped anyway. Heartbeats
            // go on meanwhile, so stopping slow tasks does not cost the session; a refused
            // heartbeat only ends them (the rejoin that follows answers it).
            let deadline = tokio::time::Instant::now() + self.config.rebalance_timeout;
            let mut done = done;
            let mut beating = true;
            loop {
                let interval = self.config.heartbeat_interval;
                tokio::select! {
                    _ = &mut done => break,
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = tokio::time::sleep(interval), if beating => {
                        beating = self.heartbeat().await.is_ok();
                    }
                }
            }
            return Ok(Joined::Again);
        }
        Ok(Joined::Stable {
            rejoin_after: (delay > 0).then(|| Duration::from_millis(delay)),
        })
    }

    /// Heartbeats until a rebalance is due; returns why.
    async fn heartbeat_until_rebalance(&mut self, rejoin_after: Option<Duration>) -> Setback {
        let deadline = rejoin_after.map(|d| tokio::time::Instant::now() + d);
        let rejoin = Arc::clone(&self.rejoin);
        loop {
            let sleep = tokio::time::sleep(self.config.heartbeat_interval);
            tokio::select! {
                _ = sleep => {}
                _ = rejoin.notified() => return Setback::Rejoin,
                _ = until(deadline) => return Setback::Rejoin,
            }
            if let Err(setback) = self.heartbeat().await {
                return setback;
            }
        }
    }

    async fn heartbeat(&mut self) -> Result<(), Setback> {
        let conn = self.coordinator().await?;
        let mut request = HeartbeatRequest::default();
        request.group_id = Cluster::group_id(&self.config.group_id);
        request.generation_id = self.generation;
        request.member_id = StrBytes::from_string(self.member_id.clone());
        let timeout = self.cluster.request_timeout();
        let (response, _) = conn
            .request_in_range(
                &request,
                HEARTBEAT_VERSIONS.0,
                HEARTBEAT_VERSIONS.1,
                timeout,
            )
            .await
            .map_err(|e| self.connection_setback("Heartbeat", e))?;
        self.last_contact = Instant::now();
        if response.error_code != 0 {
            return Err(self.refusal("Heartbeat", response.error_code, None));
        }
        Ok(())
    }

    /// LeaveGroup, best effort: a member that cannot leave is dropped after the session
    /// timeout anyway.
    async fn leave_group(&mut self, done: Option<oneshot::Sender<()>>) {
        if !self.member_id.is_empty() {
            if let Ok(conn) = self.coordinator().await {
                let mut request = LeaveGroupRequest::default();
                request.group_id = Cluster::group_id(&self.config.group_id);
                match conn.pick(
                    LEAVE_GROUP_KEY,
                    LEAVE_GROUP_VERSIONS.0,
                    LEAVE_GROUP_VERSIONS.1,
                ) {
                    Ok(version) => {
                        if version >= 3 {
                            let mut member = MemberIdentity::default();
                            member.member_id = StrBytes::from_string(self.member_id.clone());
                            request.members = vec![member];
                        } else {
                            request.member_id = StrBytes::from_string(self.member_id.clone());
                        }
                        let timeout = self.cluster.request_timeout();
                        match conn.request(&request, version, timeout).await {
                            Ok(r) if r.error_code == 0 => {
                                info!(group = %self.config.group_id, member = %self.member_id, "left the group")
                            }
                            Ok(r) => {
                                warn!(group = %self.config.group_id, member = %self.member_id, error = %error_name(r.error_code), "LeaveGroup refused; the coordinator drops the member after session.timeout.ms")
                            }
                            Err(e) => {
                                warn!(group = %self.config.group_id, member = %self.member_id, error = %e, "LeaveGroup failed; the coordinator drops the member after session.timeout.ms")
                            }
                        }
                    }
                    Err(e) => {
                        warn!(group = %self.config.group_id, error = %e, "cannot send LeaveGroup")
                    }
                }
            }
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}
