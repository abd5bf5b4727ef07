//! What we know about the cluster: brokers, topics (with ids), partition leaders, and one
//! persistent connection per broker.
//!
//! Connections are kept for the life of the client and only replaced when they fail, with a
//! growing backoff between attempts. That is good manners in general and required by the dev
//! broker, which destroys every share session on a broker when *any* connection to it closes
//! (brief §8.6 #9): a short-lived side connection would cost every member its sessions.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use spillway_core::egress::EgressRefusal;
use thiserror::Error;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::connection::{Connection, ConnectionError};
use crate::error_name;
use crate::security::ClientSecurity;

const FIND_COORDINATOR_KEY: i16 = 10;
/// Metadata carries topic ids from v10; the crate goes up to v13.
const METADATA_VERSIONS: (i16, i16) = (10, 13);
const FIND_COORDINATOR_VERSIONS: (i16, i16) = (0, 6);
/// First and longest wait between attempts to reach a broker that failed.
/// Dial limit unless the client sets one: seconds, not the request timeout, so a dead broker
/// is given up on quickly (Kafka's `socket.connection.setup.timeout.ms` is 10 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Errors of the cluster layer.
#[derive(Debug, Error)]
pub enum ClusterError {
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    #[error("none of the bootstrap servers answered ({servers}); last error: {last}")]
    NoBootstrap { servers: String, last: String },
    #[error("broker id {id} is not in the cluster metadata (known: {known:?})")]
    UnknownBroker { id: i32, known: Vec<i32> },
    #[error("broker {addr} failed recently; next attempt in {wait:?} (last error: {last})")]
    Backoff {
        addr: String,
        wait: Duration,
        last: String,
    },
    #[error("FindCoordinator for {kind} '{key}' failed with error {code} ({name}): {message}")]
    Coordinator {
        /// "group" or "transactional id".
        kind: &'static str,
        key: String,
        code: i16,
        name: String,
        message: String,
    },
    #[error("Metadata request failed at the top level with error {code} ({name})")]
    Metadata { code: i16, name: String },
    #[error("invalid bootstrap server '{0}': expected host:port")]
    BadBootstrap(String),
}

/// Which coordinator FindCoordinator looks for (its KeyType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorKind {
    /// KeyType 0: the group coordinator of a consumer or share group.
    Group,
    /// KeyType 1: the transaction coordinator of a transactional id.
    Transaction,
}

impl CoordinatorKind {
    fn key_type(self) -> i8 {
        match self {
            CoordinatorKind::Group => 0,
            CoordinatorKind::Transaction => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            CoordinatorKind::Group => "group",
            CoordinatorKind::Transaction => "transactional id",
        }
    }
}

/// One topic as the latest metadata describes it.
#[derive(Debug, Clone)]
pub struct TopicMeta {
    pub id: Uuid,
    /// partition → leader broker id (-1 when there is none)
    pub leaders: BTreeMap<i32, i32>,
    /// partition → the leader epoch the leader above came with (-1: the broker sent none).
    pub leader_epochs: BTreeMap<i32, i32>,
}

#[derive(Default)]
struct Meta {
    brokers: HashMap<i32, String>,
    topics: HashMap<Arc<str>, TopicMeta>,
    names: HashMap<Uuid, Arc<str>>,
}

impl Meta {
    /// Takes a topic's partitions (index, leader, leader epoch) from a Metadata answer. As in
    /// Kafka's clients, a partition whose answer carries an older leader epoch than the one
    /// known keeps what is known: answers from a broker that has not yet heard of a leader
    /// change must not move a partition back. A recreated topic (new id) starts afresh.
    fn apply_topic(&mut self, name: Arc<str>, id: Uuid, partitions: &[(i32, i32, i32)]) {
        let known = self.topics.get(&name).filter(|t| t.id == id);
        let mut leaders = BTreeMap::new();
        let mut leader_epochs = BTreeMap::new();
        for &(partition, leader, epoch) in partitions {
            let kept = known.and_then(|t| {
                let known_epoch = *t.leader_epochs.get(&partition)?;
                let known_leader = *t.leaders.get(&partition)?;
                (epoch < known_epoch).then_some((known_leader, known_epoch))
            });
            let (leader, epoch) = match kept {
                Some(kept) => {
                    debug!(
                        topic = &*name,
                        partition,
                        epoch,
                        known_epoch = kept.1,
                        "ignoring a stale leader from metadata"
                    );
                    kept
                }
                None => (leader, epoch),
            };
            leaders.insert(partition, leader);
            leader_epochs.insert(partition, epoch);
        }
        self.names.insert(id, Arc::clone(&name));
        self.topics.insert(
            name,
            TopicMeta {
                id,
                leaders,
                leader_epochs,
            },
        );
    }

    /// Records a leader a broker named (NOT_LEADER_OR_FOLLOWER with CurrentLeader), unless the
    /// epoch it came with is older than the one known. Returns whether it was taken.
    fn move_leader(&mut self, topic: &str, partition: i32, leader: i32, epoch: i32) -> bool {
        let Some(t) = self.topics.get_mut(topic) else {
            return false;
        };
        if t.leader_epochs
            .get(&partition)
            .is_some_and(|known| epoch < *known)
        {
            return false;
        }
        t.leaders.insert(partition, leader);
        t.leader_epochs.insert(partition, epoch);
        true
    }
}

/// One broker address and its connection (or the memory of why it failed).
#[derive(Default)]
struct Slot {
    conn: Option<Arc<Connection>>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

/// The cluster as seen by one client. Shared by all its tasks.
pub struct Cluster {
    bootstrap: Vec<String>,
    client_id: String,
    /// How every connection is opened (TLS, SASL).
    security: ClientSecurity,
    request_timeout: Duration,
    /// Limit for dialling a broker (TCP and TLS handshake).
    connect_timeout: Duration,
    /// Shared with the clusters made by [`Cluster::own_connections`].
    meta: Arc<Mutex<Meta>>,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
    /// The first broker the egress policy refused (shared with [`Cluster::own_connections`]):
    /// the clients on this cluster fail with it rather than retry a dial that cannot pass.
    egress_refusal: Arc<Mutex<Option<(String, EgressRefusal)>>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Critical sections are plain map updates that cannot be left half-done by a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ClusterError {
    /// See [`ConnectionError::is_security_error`].
    pub fn is_security_error(&self) -> bool {
        match self {
            ClusterError::Connection(e) => e.is_security_error(),
            _ => false,
        }
    }

    /// See [`ConnectionError::is_egress_refusal`].
    pub fn is_egress_refusal(&self) -> bool {
        match self {
            ClusterError::Connection(e) => e.is_egress_refusal(),
            _ => false,
        }
    }
}

impl Cluster {
    /// Parse `bootstrap` ("host:port,host:port") and contact the first server that answers,
    /// in plaintext.
    pub async fn connect(
        bootstrap: &str,
        client_id: &str,
        request_timeout: Duration,
    ) -> Result<Arc<Cluster>, ClusterError> {
        Cluster::connect_secured(
            bootstrap,
            client_id,
            request_timeout,
            ClientSecurity::plaintext(),
        )
        .await
    }

    /// [`Cluster::connect`] with every connection opened as `security` says. A security
    /// failure (credentials, certificate, listener mismatch) is returned at once, not retried
    /// on the other bootstrap servers.
    pub async fn connect_secured(
        bootstrap: &str,
        client_id: &str,
        request_timeout: Duration,
        security: ClientSecurity,
    ) -> Result<Arc<Cluster>, ClusterError> {
        Cluster::connect_with(
            bootstrap,
            client_id,
            request_timeout,
            DEFAULT_CONNECT_TIMEOUT,
            security,
        )
        .await
    }

    /// [`Cluster::connect_secured`] with the limit for dialling a broker (TCP connect and TLS
    /// handshake), Kafka's `socket.connection.setup.timeout.ms`.
    pub async fn connect_with(
        bootstrap: &str,
        client_id: &str,
        request_timeout: Duration,
        connect_timeout: Duration,
        security: ClientSecurity,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let servers: Vec<String> = bootstrap
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        for s in &servers {
            if s.rsplit_once(':')
                .is_none_or(|(_, p)| p.parse::<u16>().is_err())
            {
                return Err(ClusterError::BadBootstrap(s.clone()));
            }
        }
        if servers.is_empty() {
            return Err(ClusterError::BadBootstrap(bootstrap.to_string()));
        }
        let cluster = Arc::new(Cluster {
            bootstrap: servers,
            client_id: client_id.to_string(),
            security,
            request_timeout,
            connect_timeout,
            meta: Arc::default(),
            slots: Mutex::new(HashMap::new()),
            egress_refusal: Arc::default(),
        });
        cluster.refresh_metadata(&[]).await?;
        Ok(cluster)
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The same cluster (its metadata shared, kept up to date by either) with connections of
    /// its own. Kafka handles one request at a time per connection, in order (the protocol
    /// guide's ordering guarantee): a client whose requests wait at the broker (a ShareFetch
    /// long poll) needs its own connections, while quick requests of many clients (heartbeats,
    /// metadata) can share this one's.
    pub fn own_connections(&self) -> Arc<Cluster> {
        Arc::new(Cluster {
            bootstrap: self.bootstrap.clone(),
            client_id: self.client_id.clone(),
            security: self.security.clone(),
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            meta: Arc::clone(&self.meta),
            slots: Mutex::new(HashMap::new()),
            egress_refusal: Arc::clone(&self.egress_refusal),
        })
    }

    /// The connection to `addr`, opened if needed. A failed address is not retried before its
    /// backoff has passed.
    pub async fn connection_to(&self, addr: &str) -> Result<Arc<Connection>, ClusterError> {
        let slot = {
            let mut slots = locked(&self.slots);
            Arc::clone(slots.entry(addr.to_string()).or_default())
        };
        let mut slot = slot.lock().await;
        if let Some(conn) = &slot.conn {
            if !conn.is_poisoned() {
                return Ok(Arc::clone(conn));
            }
            slot.conn = None;
        }
        if let Some(at) = slot.retry_at {
            let now = Instant::now();
            if at > now {
                return Err(ClusterError::Backoff {
                    addr: addr.to_string(),
                    wait: at - now,
                    last: slot.last_error.clone(),
                });
            }
        }
        match Connection::dial(
            addr,
            &self.client_id,
            self.connect_timeout,
            self.request_timeout,
            &self.security,
        )
        .await
        {
            Ok(conn) => {
                let conn = Arc::new(conn);
                slot.conn = Some(Arc::clone(&conn));
                slot.failures = 0;
                slot.retry_at = None;
                debug!(%addr, "connected");
                Ok(conn)
            }
            Err(e) => {
                if let ConnectionError::Egress { addr, refusal } = &e {
                    warn!(%addr, %refusal, "broker refused by the egress policy");
                    locked(&self.egress_refusal)
                        .get_or_insert_with(|| (addr.clone(), (**refusal).clone()));
                }
                slot.failures = slot.failures.saturating_add(1);
                let wait = BACKOFF_MIN
                    .saturating_mul(1u32 << slot.failures.min(5).saturating_sub(1))
                    .min(BACKOFF_MAX);
                slot.retry_at = Some(Instant::now() + wait);
                slot.last_error = e.to_string();
                Err(e.into())
            }
        }
    }

    /// For a client that dials on its own (librdkafka): contacts `bootstrap` under `security`
    /// (its egress policy vets the dial) and judges every broker the cluster advertises. No
    /// policy in `security`: nothing to judge.
    pub async fn vet_egress(bootstrap: &str, security: ClientSecurity) -> Result<(), ClusterError> {
        if security.egress().is_none() {
            return Ok(());
        }
        let cluster = Cluster::connect_secured(
            bootstrap,
            "spillway-egress-check",
            Duration::from_secs(10),
            security,
        )
        .await?;
        cluster.vet_advertised_brokers().await
    }

    /// Judges every broker the cluster advertises (as of the last Metadata) by the egress
    /// policy of this cluster's security, without dialling them: for clients that dial on
    /// their own (librdkafka), checked before they start.
    pub async fn vet_advertised_brokers(&self) -> Result<(), ClusterError> {
        let Some(policy) = self.security.egress() else {
            return Ok(());
        };
        let mut addresses: Vec<String> = locked(&self.meta).brokers.values().cloned().collect();
        addresses.sort();
        for addr in addresses {
            let Some((host, port)) = addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
            else {
                continue;
            };
            let policy = Arc::clone(policy);
            let verdict = tokio::task::spawn_blocking(move || policy.vet(&host, port))
                .await
                .unwrap_or_else(|e| panic!("the egress check panicked: {e}"));
            if let Err(refusal) = verdict {
                return Err(ClusterError::Connection(ConnectionError::Egress {
                    addr,
                    refusal: Box::new(refusal),
                }));
            }
        }
        Ok(())
    }

    /// The first broker the egress policy refused on this cluster, as the error to fail with.
    pub fn egress_refusal(&self) -> Option<ConnectionError> {
        locked(&self.egress_refusal)
            .clone()
            .map(|(addr, refusal)| ConnectionError::Egress {
                addr,
                refusal: Box::new(refusal),
            })
    }

    /// The connection to broker `id`.
    pub async fn broker(&self, id: i32) -> Result<Arc<Connection>, ClusterError> {
        let addr = {
            let meta = locked(&self.meta);
            match meta.brokers.get(&id) {
                Some(addr) => addr.clone(),
                None => {
                    let mut known: Vec<i32> = meta.brokers.keys().copied().collect();
                    known.sort_unstable();
                    return Err(ClusterError::UnknownBroker { id, known });
                }
            }
        };
        self.connection_to(&addr).await
    }

    /// Some live connection: a known broker first (re-using its connection), else a bootstrap
    /// server.
    pub(crate) async fn any_connection(&self) -> Result<Arc<Connection>, ClusterError> {
        let mut candidates: Vec<String> = {
            let meta = locked(&self.meta);
            let mut ids: Vec<_> = meta.brokers.iter().collect();
            ids.sort();
            ids.into_iter().map(|(_, a)| a.clone()).collect()
        };
        for b in &self.bootstrap {
            if !candidates.contains(b) {
                candidates.push(b.clone());
            }
        }
        let mut last = String::from("no servers");
        for addr in &candidates {
            match self.connection_to(addr).await {
                Ok(conn) => return Ok(conn),
                // Every broker has the same listener settings: no point trying the others.
                Err(ClusterError::Connection(e)) if e.is_security_error() => {
                    return Err(ClusterError::Connection(e))
                }
                Err(e) => last = e.to_string(),
            }
        }
        // No server answered and one was refused by the egress policy: that is the cause.
        if let Some(refused) = self.egress_refusal() {
            return Err(ClusterError::Connection(refused));
        }
        Err(ClusterError::NoBootstrap {
            servers: self.bootstrap.join(","),
            last,
        })
    }

    /// Ask for metadata of `topics` (all brokers are always returned). An empty list asks for
    /// no topics, not all of them.
    pub async fn refresh_metadata(&self, topics: &[String]) -> Result<(), ClusterError> {
        let conn = self.any_connection().await?;
        let mut request = MetadataRequest::default();
        request.topics = Some(
            topics
                .iter()
                .map(|t| {
                    let mut topic = MetadataRequestTopic::default();
                    topic.name = Some(TopicName(StrBytes::from_string(t.clone())));
                    topic
                })
                .collect(),
        );
        request.allow_auto_topic_creation = false;
        let (response, _) = conn
            .request_in_range(
                &request,
                METADATA_VERSIONS.0,
                METADATA_VERSIONS.1,
                self.request_timeout,
            )
            .await?;
        self.apply_metadata(&response)
    }

    fn apply_metadata(&self, response: &MetadataResponse) -> Result<(), ClusterError> {
        if response.error_code != 0 {
            return Err(ClusterError::Metadata {
                code: response.error_code,
                name: error_name(response.error_code),
            });
        }
        let mut meta = locked(&self.meta);
        for b in &response.brokers {
            meta.brokers
                .insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
        }
        for t in &response.topics {
            let Some(name) = &t.name else { continue };
            if t.error_code != 0 {
                debug!(
                    topic = name.0.as_str(),
                    code = t.error_code,
                    "topic metadata error"
                );
                continue;
            }
            let name: Arc<str> = Arc::from(name.0.as_str());
            let partitions: Vec<(i32, i32, i32)> = t
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.leader_id.0, p.leader_epoch))
                .collect();
            meta.apply_topic(name, t.topic_id, &partitions);
        }
        Ok(())
    }

    /// The ids of the brokers the latest metadata named, lowest first.
    pub fn broker_ids(&self) -> Vec<i32> {
        let mut ids: Vec<i32> = locked(&self.meta).brokers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The topic's name for an id, if metadata has seen it.
    pub fn topic_name(&self, id: &Uuid) -> Option<Arc<str>> {
        locked(&self.meta).names.get(id).cloned()
    }

    pub fn topic(&self, name: &str) -> Option<TopicMeta> {
        locked(&self.meta).topics.get(name).cloned()
    }

    /// Record a leader learnt from a NOT_LEADER_OR_FOLLOWER answer (CurrentLeader: id and
    /// epoch), and the new leader's address when the broker sent it. A leader with an older
    /// epoch than the one known is ignored.
    pub fn set_leader(
        &self,
        topic: &str,
        partition: i32,
        leader: i32,
        leader_epoch: i32,
        addr: Option<String>,
    ) {
        let mut meta = locked(&self.meta);
        if let Some(addr) = addr {
            meta.brokers.insert(leader, addr);
        }
        if meta.move_leader(topic, partition, leader, leader_epoch) {
            info!(
                topic,
                partition, leader, leader_epoch, "partition leader moved"
            );
        }
    }

    /// Find the group coordinator (key type 0, GROUP) and return its broker id.
    pub async fn find_coordinator(&self, group: &str) -> Result<i32, ClusterError> {
        self.find_coordinator_of(CoordinatorKind::Group, group)
            .await
    }

    /// Find the coordinator of `kind` for `key` (a group id, or a transactional id) and return
    /// its broker id; its address is remembered for [`Cluster::broker`].
    pub async fn find_coordinator_of(
        &self,
        kind: CoordinatorKind,
        key: &str,
    ) -> Result<i32, ClusterError> {
        let conn = self.any_connection().await?;
        let version = conn.pick(
            FIND_COORDINATOR_KEY,
            FIND_COORDINATOR_VERSIONS.0,
            FIND_COORDINATOR_VERSIONS.1,
        )?;
        let mut request = FindCoordinatorRequest::default();
        request.key_type = kind.key_type();
        if version < 4 {
            request.key = StrBytes::from_string(key.to_string());
        } else {
            request.coordinator_keys = vec![StrBytes::from_string(key.to_string())];
        }
        let response = conn
            .request(&request, version, self.request_timeout)
            .await?;
        let (code, message, node, host, port) = if version < 4 {
            (
                response.error_code,
                response.error_message.as_ref().map(|m| m.to_string()),
                response.node_id.0,
                response.host.to_string(),
                response.port,
            )
        } else {
            match response.coordinators.first() {
                Some(c) => (
                    c.error_code,
                    c.error_message.as_ref().map(|m| m.to_string()),
                    c.node_id.0,
                    c.host.to_string(),
                    c.port,
                ),
                None => (
                    -1,
                    Some("response lists no coordinator".to_string()),
                    -1,
                    String::new(),
                    0,
                ),
            }
        };
        if code != 0 {
            return Err(ClusterError::Coordinator {
                kind: kind.name(),
                key: key.to_string(),
                code,
                name: error_name(code),
                message: message.unwrap_or_default(),
            });
        }
        locked(&self.meta)
            .brokers
            .insert(node, format!("{host}:{port}"));
        Ok(node)
    }

    /// The group id wrapper kafka-protocol wants.
    pub fn group_id(group: &str) -> GroupId {
        GroupId(StrBytes::from_string(group.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(meta: &Meta, partition: i32) -> (i32, i32) {
        let t = meta.topics.get("t").expect("topic known");
        (t.leaders[&partition], t.leader_epochs[&partition])
    }

    #[test]
    fn an_older_leader_epoch_in_metadata_cannot_move_a_partition_back() {
        let id = Uuid::new_v4();
        let mut meta = Meta::default();
        meta.apply_topic("t".into(), id, &[(0, 2, 5), (1, 1, 3)]);
        // A broker that missed the move answers with the old leader and epoch.
        meta.apply_topic("t".into(), id, &[(0, 1, 4), (1, 3, 4)]);
        assert_eq!(leader(&meta, 0), (2, 5), "stale answer ignored");
        assert_eq!(leader(&meta, 1), (3, 4), "newer answer taken");
        // The same epoch again (a repeated answer) is taken.
        meta.apply_topic("t".into(), id, &[(0, 2, 5), (1, 3, 4)]);
        assert_eq!(leader(&meta, 0), (2, 5));
        // A recreated topic (new id) starts afresh.
        meta.apply_topic("t".into(), Uuid::new_v4(), &[(0, 1, 0), (1, 1, 0)]);
        assert_eq!(leader(&meta, 0), (1, 0));
    }

    #[test]
    fn a_current_leader_from_a_fetch_answer_is_taken_only_when_not_older() {
        let mut meta = Meta::default();
        meta.apply_topic("t".into(), Uuid::new_v4(), &[(0, 1, 7)]);
        assert!(!meta.move_leader("t", 0, 2, 6), "older epoch refused");
        assert_eq!(leader(&meta, 0), (1, 7));
        assert!(meta.move_leader("t", 0, 2, 8));
        assert_eq!(leader(&meta, 0), (2, 8));
        assert!(!meta.move_leader("unknown", 0, 2, 9));
    }
}
