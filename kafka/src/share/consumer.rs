//! [`ShareConsumer`]: a member of a share group that polls records and acknowledges them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), spillway_kafka::share::ShareError> {
//! use std::time::Duration;
//! use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
//! let mut consumer = ShareConsumer::connect(ShareConsumerConfig::new("127.0.0.1:9092", "g")).await?;
//! consumer.subscribe(&["orders"]);
//! for record in consumer.poll(Duration::from_secs(1)).await? {
//!     consumer.acknowledge(&record, AcknowledgeType::Accept)?;
//! }
//! let results = consumer.commit_sync(Duration::from_secs(5)).await?;
//! consumer.close().await?;
//! # let _ = results; Ok(()) }
//! ```
//!
//! Inside, three kinds of task run: the heartbeat ([`super::membership`]), a router that maps
//! the assignment onto partition leaders and keeps metadata fresh, and one fetch task per
//! broker (`super::fetch`). `poll` only takes what the fetch tasks have already delivered, so
//! fetching overlaps with the application's processing.
//!
//! Records that were delivered but not acknowledged when the consumer closes are released by
//! the broker and count as a delivery attempt (brief §5.4).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, Instrument};

use super::ack::{
    AckBatch, AcknowledgementBatch, Ledger, PartitionAcknowledgements, ShareGroupMetadata,
    TransactionAcknowledgements, TransactionOutcome,
};
use super::fetch::{
    lock_ledger, spawn_broker, BrokerHandle, Command, Delivery, FetchContext, FetchParams,
};
use super::fetched::Fetched;
use super::membership::{self, Assignment, MemberState, MembershipLink};
use super::{AckError, AcknowledgeType, CommitResult, ShareError, ShareRecord, ShareSource, Tp};
use crate::cluster::Cluster;
use crate::security::ClientSecurity;

/// Settings of a [`ShareConsumer`]. Names follow the Java client's where one exists.
#[derive(Debug, Clone)]
pub struct ShareConsumerConfig {
    /// `bootstrap.servers`: "host:port,host:port".
    pub bootstrap_servers: String,
    /// `group.id`: the share group.
    pub group_id: String,
    /// `client.id`, sent in every request header.
    pub client_id: String,
    /// `max.poll.records`: most records one `poll` returns.
    pub max_poll_records: usize,
    /// MaxRecords of each ShareFetch: most records one broker acquires for us per request
    /// (`share.fetch.max.records`; 0 = `max_poll_records`, what the Java client sends). A
    /// larger value fetches several polls' worth in one request; the records wait in the
    /// consumer, their locks running, until `poll` hands them out.
    pub fetch_max_records: usize,
    /// `fetch.max.wait.ms`
    pub fetch_max_wait: Duration,
    /// `fetch.min.bytes`
    pub fetch_min_bytes: i32,
    /// `fetch.max.bytes`
    pub fetch_max_bytes: i32,
    /// `request.timeout.ms`. A request that times out closes its connection (as Kafka's
    /// clients do) and triggers a metadata refresh.
    pub request_timeout: Duration,
    /// `socket.connection.setup.timeout.ms`: limit for dialling a broker (TCP and TLS).
    pub connect_timeout: Duration,
    /// `metadata.max.age.ms`: how often metadata is refreshed to see new partitions and leaders.
    pub metadata_max_age: Duration,
    /// How many fetches' worth of records (MaxRecords each) a broker may have given us that
    /// are still unacknowledged — buffered here or in the application's hands — when we ask
    /// it for more. 1: fetch from a broker again once everything it gave us is acknowledged
    /// (the acks ride on that fetch); best on the dev broker, whose work per fetch grows with
    /// the records we hold (brief §8.6 #14, #32). 2 overlaps fetching with processing. It also
    /// bounds memory: at most this many fetches' worth of records per broker are held.
    /// The check is made at `poll` and `commit_sync` (and every 50 ms); records whose locks
    /// have expired no longer count.
    pub fetch_buffer_batches: usize,
    /// `security.protocol`, TLS and SASL, from [`crate::security::SecuritySettings`].
    pub security: ClientSecurity,
}

impl ShareConsumerConfig {
    pub fn new(bootstrap_servers: &str, group_id: &str) -> ShareConsumerConfig {
        ShareConsumerConfig {
            bootstrap_servers: bootstrap_servers.to_string(),
            group_id: group_id.to_string(),
            client_id: "spillway".to_string(),
            max_poll_records: 500,
            fetch_max_records: 0,
            fetch_max_wait: Duration::from_millis(500),
            fetch_min_bytes: 1,
            fetch_max_bytes: 52_428_800,
            request_timeout: Duration::from_secs(30),
            connect_timeout: crate::cluster::DEFAULT_CONNECT_TIMEOUT,
            metadata_max_age: Duration::from_secs(30),
            fetch_buffer_batches: 1,
            security: ClientSecurity::plaintext(),
        }
    }

    /// MaxRecords sent with each ShareFetch.
    fn fetch_records(&self) -> usize {
        if self.fetch_max_records == 0 {
            self.max_poll_records
        } else {
            self.fetch_max_records
        }
    }

    fn validate(&self) -> Result<(), ShareError> {
        if self.group_id.is_empty() {
            return Err(ShareError::Config(
                "group_id is empty; a share group needs a non-empty id".into(),
            ));
        }
        if self.max_poll_records == 0 || self.max_poll_records > i32::MAX as usize {
            return Err(ShareError::Config(format!(
                "max_poll_records = {} is out of range; expected 1..={}",
                self.max_poll_records,
                i32::MAX
            )));
        }
        if self.fetch_max_records > i32::MAX as usize {
            return Err(ShareError::Config(format!(
                "fetch_max_records = {} is out of range; expected 0 (= max_poll_records) or 1..={}",
                self.fetch_max_records,
                i32::MAX
            )));
        }
        if self.fetch_max_bytes <= 0 || self.fetch_min_bytes < 0 {
            return Err(ShareError::Config(format!(
                "fetch_min_bytes = {} / fetch_max_bytes = {} must be >= 0 / > 0",
                self.fetch_min_bytes, self.fetch_max_bytes
            )));
        }
        Ok(())
    }
}

/// A native KIP-932 share-group consumer.
pub struct ShareConsumer {
    config: ShareConsumerConfig,
    /// For topic ids of acknowledgements taken into a transaction.
    cluster: Arc<Cluster>,
    member_id: String,
    ledger: Arc<Mutex<Ledger>>,
    brokers: Arc<Mutex<HashMap<i32, BrokerHandle>>>,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    /// Delivered and not yet handed out by `poll`.
    buffer: Fetched<ShareRecord>,
    /// Bumped at every `poll` and `commit_sync`: the broker tasks, which fetch again only once
    /// the records they delivered are acknowledged, look at the ledger again then.
    app_ready: watch::Sender<u64>,
    subscription: watch::Sender<Vec<String>>,
    fatal: Arc<Mutex<Option<ShareError>>>,
    epoch: Arc<Mutex<i32>>,
    leave: Option<oneshot::Sender<oneshot::Sender<()>>>,
    heartbeat: JoinHandle<()>,
    router: JoinHandle<()>,
    /// The group's latest assignment to this member, for [`ShareConsumer::assigned_partitions`].
    assignment: watch::Receiver<Option<Arc<Assignment>>>,
    /// What the broker tasks share: the lock duration they learnt, the fetch pause.
    fetch: Arc<FetchContext>,
}

/// Whether held records' acquisition locks can be extended ([`ShareConsumer::lock_renewal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockRenewal {
    /// The brokers accept ShareAcknowledge `RENEW` (KIP-1222) from this client.
    Available,
    /// They do not (or this client cannot ask): why.
    Unavailable { reason: &'static str },
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section here is a single map operation; a panic cannot tear the data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`ShareConsumer::acknowledge_each`] on `ledger`.
pub(crate) fn acknowledge_each<'a>(
    ledger: &Mutex<Ledger>,
    acks: impl IntoIterator<Item = (&'a str, i32, i64, AcknowledgeType)>,
    mut outcome: impl FnMut(usize, Result<(), ShareError>),
) {
    let mut ledger = lock_ledger(ledger);
    for (i, (topic, partition, offset, kind)) in acks.into_iter().enumerate() {
        outcome(
            i,
            ledger
                .acknowledge(topic, partition, offset, kind)
                .map(|_| ()),
        );
    }
}

impl ShareConsumer {
    /// Contact the cluster and start the background tasks. Nothing is fetched before
    /// [`ShareConsumer::subscribe`].
    pub async fn connect(config: ShareConsumerConfig) -> Result<ShareConsumer, ShareError> {
        config.validate()?;
        let cluster = ShareConsumer::connect_cluster(&config).await?;
        ShareConsumer::start(config, cluster, None)
    }

    /// The cluster `config` names, contacted: to be shared by the members of one group
    /// ([`ShareConsumer::connect_sharing`]).
    pub async fn connect_cluster(config: &ShareConsumerConfig) -> Result<Arc<Cluster>, ShareError> {
        config.validate()?;
        Ok(Cluster::connect_with(
            &config.bootstrap_servers,
            &config.client_id,
            config.request_timeout,
            config.connect_timeout,
            config.security.clone(),
        )
        .await?)
    }

    /// [`ShareConsumer::connect`] as one of several members that share `cluster` (made by
    /// [`ShareConsumer::connect_cluster`] with the same bootstrap servers and security): their
    /// heartbeats and metadata requests share its connection per broker; each member fetches
    /// and acknowledges on connections of its own, since a ShareFetch waits at the broker and
    /// Kafka serves one request at a time per connection.
    pub fn connect_sharing(
        config: ShareConsumerConfig,
        cluster: &Arc<Cluster>,
    ) -> Result<ShareConsumer, ShareError> {
        config.validate()?;
        ShareConsumer::start(config, Arc::clone(cluster), Some(cluster.own_connections()))
    }

    /// Starts the member's background tasks on `cluster`; its fetches go through
    /// `fetch_cluster` when given.
    fn start(
        config: ShareConsumerConfig,
        cluster: Arc<Cluster>,
        fetch_cluster: Option<Arc<Cluster>>,
    ) -> Result<ShareConsumer, ShareError> {
        let member_id = membership::new_member_id();
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let (deliveries_tx, deliveries) = mpsc::unbounded_channel();
        let (app_ready, _) = watch::channel(0u64);
        let router_wake = Arc::new(Notify::new());
        let max_records = config.fetch_records() as i32;
        let ctx = Arc::new(FetchContext {
            cluster: fetch_cluster.unwrap_or_else(|| Arc::clone(&cluster)),
            group_id: Cluster::group_id(&config.group_id),
            member_id: StrBytes::from_string(member_id.clone()),
            ledger: Arc::clone(&ledger),
            deliveries: deliveries_tx,
            app_ready: app_ready.clone(),
            router: Arc::clone(&router_wake),
            params: FetchParams {
                max_wait: config.fetch_max_wait,
                min_bytes: config.fetch_min_bytes,
                max_bytes: config.fetch_max_bytes,
                max_records,
                batch_size: config.max_poll_records as i32,
                request_timeout: config.request_timeout,
                buffered_batches: config.fetch_buffer_batches,
            },
            lock_timeout_ms: AtomicU64::new(0),
            fetch_paused_until: Mutex::new(None),
        });
        let (subscription, subscription_rx) = watch::channel(Vec::new());
        let (assignment_tx, assignment_rx) = watch::channel(None);
        let (leave_tx, leave_rx) = oneshot::channel();
        let fatal = Arc::new(Mutex::new(None));
        let epoch = Arc::new(Mutex::new(0));
        // Background tasks log in the span of whoever made the member (a task's).
        let heartbeat = tokio::spawn(
            membership::run(
                MemberState::new(member_id.clone()),
                MembershipLink {
                    group: config.group_id.clone(),
                    cluster: Arc::clone(&cluster),
                    subscription: subscription_rx.clone(),
                    assignment: assignment_tx,
                    epoch: Arc::clone(&epoch),
                    fatal: Arc::clone(&fatal),
                    leave: leave_rx,
                    request_timeout: config.request_timeout,
                },
            )
            .in_current_span(),
        );
        let brokers = Arc::new(Mutex::new(HashMap::new()));
        let fetch = Arc::clone(&ctx);
        let router = tokio::spawn(
            route(Router {
                ctx,
                brokers: Arc::clone(&brokers),
                assignment: assignment_rx.clone(),
                subscription: subscription_rx,
                wake: router_wake,
                refresh_every: config.metadata_max_age,
            })
            .in_current_span(),
        );
        Ok(ShareConsumer {
            config,
            cluster,
            member_id,
            ledger,
            brokers,
            deliveries,
            buffer: Fetched::default(),
            app_ready,
            subscription,
            fatal,
            epoch,
            leave: Some(leave_tx),
            heartbeat,
            router,
            assignment: assignment_rx,
            fetch,
        })
    }

    /// The acquisition lock duration the brokers reported last (ShareFetch's
    /// `AcquisitionLockTimeoutMs`); `None` before the first response that said.
    pub fn acquisition_lock_timeout(&self) -> Option<Duration> {
        match self.fetch.lock_timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Sends no ShareFetch before `until` (`None`: fetch again as usual). For an application
    /// whose target is down: records acquired now would only wait out their locks and come
    /// back with a higher delivery count. Acknowledgements still go out (as
    /// ShareAcknowledge); records already buffered stay buffered.
    pub fn pause_fetching(&self, until: Option<Instant>) {
        *locked(&self.fetch.fetch_paused_until) = until;
        // A broker task waiting for the pause to end looks again at its next tick.
        self.app_ready.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether the brokers can extend the acquisition locks of records this consumer holds
    /// (ShareAcknowledge `RENEW`, KIP-1222, ShareFetch/ShareAcknowledge v2 in Kafka 4.2).
    /// This client speaks v1 of the share APIs (kafka-protocol 0.18 has no v2), so it says
    /// why not; an application must then finish with a record before its lock deadline.
    pub fn lock_renewal(&self) -> LockRenewal {
        LockRenewal::Unavailable {
            reason: "the share APIs are spoken at v1 (ShareAcknowledge RENEW, KIP-1222, needs v2)",
        }
    }

    /// How many partitions the group assigned to this member (0 before the first assignment).
    pub fn assigned_partitions(&self) -> usize {
        self.assignment.borrow().as_deref().map_or(0, |a| {
            a.iter().map(|(_, partitions)| partitions.len()).sum()
        })
    }

    /// This member's id (a Kafka Uuid string, generated by us and kept for our lifetime).
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The member epoch from the latest successful heartbeat (0 before joining).
    pub fn member_epoch(&self) -> i32 {
        *locked(&self.epoch)
    }

    /// Join the group (or change the subscription) for these topics.
    pub fn subscribe<S: AsRef<str>>(&mut self, topics: &[S]) {
        let mut topics: Vec<String> = topics.iter().map(|t| t.as_ref().to_string()).collect();
        topics.sort();
        topics.dedup();
        self.subscription.send_replace(topics);
    }

    /// Records acquired for this member, at most `max_poll_records`; empty after `timeout`.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ShareRecord>, ShareError> {
        // A broker the egress policy refused is never reached: fail now, naming it, rather
        // than fetch from the others while heartbeats to it retry forever.
        if let Some(refused) = self.cluster.egress_refusal() {
            return Err(ShareError::Connection(refused));
        }
        if let Some(ShareError::Fatal {
            group,
            code,
            name,
            message,
        }) = &*locked(&self.fatal)
        {
            return Err(ShareError::Fatal {
                group: group.clone(),
                code: *code,
                name: name.clone(),
                message: message.clone(),
            });
        }
        self.app_ready.send_modify(|n| *n = n.wrapping_add(1));
        let max = self.config.max_poll_records;
        if self.buffer.len() < max {
            if self.buffer.is_empty() {
                let deadline = Instant::now() + timeout;
                match tokio::time::timeout_at(deadline.into(), self.deliveries.recv()).await {
                    Ok(Some(d)) => self.take(d)?,
                    Ok(None) => return Err(ShareError::Closed),
                    Err(_) => return Ok(Vec::new()),
                }
            }
            while self.buffer.len() < max {
                match self.deliveries.try_recv() {
                    Ok(d) => self.take(d)?,
                    Err(_) => break,
                }
            }
        }
        Ok(self.buffer.take(max))
    }

    /// Takes the records fetched for this member that `poll` has not handed out yet (the
    /// buffer and what the fetch tasks delivered since). The application will never see
    /// them; [`close`](Self::close) has the broker release them, which spends a delivery
    /// (and archives those on their last). For the caller to account for them first.
    pub fn take_unpolled(&mut self) -> Vec<ShareRecord> {
        while let Ok(delivery) = self.deliveries.try_recv() {
            if let Delivery::Records(records) = delivery {
                self.buffer.push(records);
            }
        }
        self.buffer.take_all()
    }

    fn take(&mut self, delivery: Delivery) -> Result<(), ShareError> {
        match delivery {
            Delivery::Records(records) => {
                self.buffer.push(records);
                Ok(())
            }
            Delivery::Error(e) => Err(e),
        }
    }

    /// Settle a held record. Sent with the next request to the record's leader.
    pub fn acknowledge(
        &self,
        record: &ShareRecord,
        kind: AcknowledgeType,
    ) -> Result<(), ShareError> {
        self.acknowledge_offset(&record.topic, record.partition, record.offset, kind)
    }

    /// Settle a held record named by topic, partition and offset.
    pub fn acknowledge_offset(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        kind: AcknowledgeType,
    ) -> Result<(), ShareError> {
        lock_ledger(&self.ledger)
            .acknowledge(topic, partition, offset, kind)
            .map(|_| ())
    }

    /// Settle many held records, each with its own decision, under one lock (not one per
    /// record). Unlike [`acknowledge_all`](Self::acknowledge_all) a record that cannot be
    /// acknowledged does not stop the rest: `outcome` hears every record's result, by its
    /// position in `acks`.
    pub fn acknowledge_each<'a>(
        &self,
        acks: impl IntoIterator<Item = (&'a str, i32, i64, AcknowledgeType)>,
        outcome: impl FnMut(usize, Result<(), ShareError>),
    ) {
        acknowledge_each(&self.ledger, acks, outcome)
    }

    /// Settle many held records with one lock; stops at the first record not held.
    pub fn acknowledge_all<'a>(
        &self,
        records: impl IntoIterator<Item = &'a ShareRecord>,
        kind: AcknowledgeType,
    ) -> Result<(), ShareError> {
        let mut ledger = lock_ledger(&self.ledger);
        for r in records {
            ledger.acknowledge(&r.topic, r.partition, r.offset, kind)?;
        }
        Ok(())
    }

    /// The group, member id and member epoch a producer transaction presents with this
    /// consumer's acknowledgements (KIP-1289), so that the broker can fence a stale member.
    pub fn share_group_metadata(&self) -> ShareGroupMetadata {
        ShareGroupMetadata {
            group_id: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            member_epoch: self.member_epoch(),
        }
    }

    /// Settle a held record through a producer transaction instead of ShareFetch or
    /// ShareAcknowledge (KIP-1289): the acknowledgement waits for
    /// [`ShareConsumer::acknowledgements_for_transaction`] and is never sent the normal way.
    /// Only ACCEPT and REJECT are allowed; a RELEASE goes through
    /// [`ShareConsumer::acknowledge`].
    ///
    /// The Java draft diverts acks already made with `acknowledge`; here the choice is made
    /// per acknowledgement because the fetch tasks send pending acks in the background, so an
    /// ack made the normal way may already be on the wire when the transaction asks for it.
    pub fn acknowledge_for_transaction(
        &self,
        record: &ShareRecord,
        kind: AcknowledgeType,
    ) -> Result<(), ShareError> {
        lock_ledger(&self.ledger).acknowledge_for_transaction(
            &record.topic,
            record.partition,
            record.offset,
            kind,
        )
    }

    /// [`ShareConsumer::acknowledge_for_transaction`] for many records under one lock; stops
    /// at the first that cannot be acknowledged (the ones before it stay staged).
    pub fn acknowledge_all_for_transaction<'a>(
        &self,
        records: impl IntoIterator<Item = &'a ShareRecord>,
        kind: AcknowledgeType,
    ) -> Result<(), ShareError> {
        let mut ledger = lock_ledger(&self.ledger);
        for r in records {
            ledger.acknowledge_for_transaction(&r.topic, r.partition, r.offset, kind)?;
        }
        Ok(())
    }

    /// Take every acknowledgement made with [`ShareConsumer::acknowledge_for_transaction`]
    /// since the last call, as acknowledgement batches per topic id and partition. They now
    /// belong to the caller's transaction; report its end with
    /// [`ShareConsumer::finish_transaction`]. Empty when nothing was staged.
    pub fn acknowledgements_for_transaction(
        &self,
    ) -> Result<TransactionAcknowledgements, ShareError> {
        let mut ledger = lock_ledger(&self.ledger);
        // Resolve every topic id first, so that a failure takes nothing.
        let mut ids = HashMap::new();
        for topic in ledger.staged_topics() {
            let id = self
                .cluster
                .topic(&topic)
                .map(|meta| meta.id)
                .filter(|id| !id.is_nil())
                .ok_or_else(|| ShareError::UnknownTopicId {
                    topic: topic.to_string(),
                })?;
            ids.insert(topic, id);
        }
        let partitions = ledger
            .take_for_transaction()
            .into_iter()
            .map(|(topic, partition, batches)| PartitionAcknowledgements {
                topic_id: ids[&topic],
                topic,
                partition,
                batches: batches
                    .into_iter()
                    .map(|b| AcknowledgementBatch {
                        first_offset: b.first,
                        last_offset: b.last,
                        types: b.types,
                    })
                    .collect(),
            })
            .collect();
        Ok(TransactionAcknowledgements { partitions })
    }

    /// Withdraw the acknowledgements staged with
    /// [`ShareConsumer::acknowledge_for_transaction`] and not taken yet, because the
    /// transaction they were meant for was aborted: their records are RELEASEd the normal way
    /// and come back.
    pub fn release_transaction_acknowledgements(&self) {
        lock_ledger(&self.ledger).release_staged();
    }

    /// Tell the consumer how the transaction that took `acks` ended. Committed, or aborted
    /// after the broker staged them: the records are settled by the broker and forgotten
    /// here. Aborted before the broker staged them: the broker still holds them for us, so
    /// they are RELEASEd the normal way (with the next request to their leader) and come
    /// back with a higher delivery count.
    pub fn finish_transaction(
        &self,
        acks: &TransactionAcknowledgements,
        outcome: TransactionOutcome,
    ) {
        let mut ledger = lock_ledger(&self.ledger);
        for p in &acks.partitions {
            let batches: Vec<AckBatch> = p
                .batches
                .iter()
                .map(|b| AckBatch {
                    first: b.first_offset,
                    last: b.last_offset,
                    types: b.types.clone(),
                })
                .collect();
            ledger.finish_transaction(&p.topic, p.partition, &batches, outcome);
        }
    }

    /// Send every acknowledgement made so far (ShareAcknowledge to each leader that has some)
    /// and report, per partition, the outcome of every acknowledgement completed since the
    /// previous call — including those that rode on fetches and those that failed locally.
    pub async fn commit_sync(&mut self, timeout: Duration) -> Result<CommitResult, ShareError> {
        let waits: Vec<_> = {
            // A broker without unconfirmed acks has nothing to commit; flushing it anyway would
            // wait for its fetch in flight (up to fetch_max_wait) for nothing.
            // (The two locks are taken one after the other, never together.)
            let ids: Vec<i32> = locked(&self.brokers).keys().copied().collect();
            let due: Vec<i32> = {
                let ledger = lock_ledger(&self.ledger);
                ids.into_iter()
                    .filter(|id| ledger.awaits_confirmation(*id))
                    .collect()
            };
            let brokers = locked(&self.brokers);
            brokers
                .iter()
                .filter(|(id, _)| due.contains(id))
                .filter_map(|(_, h)| {
                    let (tx, rx) = oneshot::channel();
                    h.commands.send(Command::Flush(tx)).ok().map(|_| rx)
                })
                .collect()
        };
        // After the flush requests, so that a woken broker task sees the flush first and the
        // acks go out as ShareAcknowledge rather than riding on a new fetch.
        self.app_ready.send_modify(|n| *n = n.wrapping_add(1));
        let timed_out = tokio::time::timeout(timeout, futures::future::join_all(waits))
            .await
            .is_err();
        let mut ledger = lock_ledger(&self.ledger);
        let mut results = ledger.take_results();
        if timed_out {
            for (topic, partition) in ledger.pending_partitions() {
                results
                    .entry((topic.clone(), partition))
                    .or_insert(Err(AckError::Timeout {
                        topic,
                        partition,
                        after: timeout,
                    }));
            }
        }
        Ok(results)
    }

    /// Send pending acknowledgements while closing every share session (ShareAcknowledge with
    /// epoch -1), then leave the group (heartbeat epoch -1). Returns the outcome of the
    /// acknowledgements not yet reported. Unacknowledged records are released by the broker.
    pub async fn close(mut self) -> Result<CommitResult, ShareError> {
        self.router.abort();
        let timeout = self.config.request_timeout;
        let waits: Vec<_> = {
            let brokers = locked(&self.brokers);
            brokers
                .values()
                .filter_map(|h| {
                    let (tx, rx) = oneshot::channel();
                    h.commands.send(Command::Close(tx)).ok().map(|_| rx)
                })
                .collect()
        };
        if tokio::time::timeout(timeout, futures::future::join_all(waits))
            .await
            .is_err()
        {
            debug!("closing share sessions timed out");
        }
        if let Some(leave) = self.leave.take() {
            let (tx, rx) = oneshot::channel();
            if leave.send(tx).is_ok() {
                let _ = tokio::time::timeout(timeout, rx).await;
            }
        }
        let results = lock_ledger(&self.ledger).take_results();
        Ok(results)
    }
}

impl Drop for ShareConsumer {
    fn drop(&mut self) {
        self.router.abort();
        self.heartbeat.abort();
        for h in locked(&self.brokers).values() {
            h.task.abort();
        }
    }
}

impl ShareSource for ShareConsumer {
    async fn poll(&mut self, timeout: Duration) -> Result<Vec<ShareRecord>, ShareError> {
        ShareConsumer::poll(self, timeout).await
    }

    fn acknowledge(&self, record: &ShareRecord, kind: AcknowledgeType) -> Result<(), ShareError> {
        ShareConsumer::acknowledge(self, record, kind)
    }

    async fn commit_sync(&mut self, timeout: Duration) -> Result<CommitResult, ShareError> {
        ShareConsumer::commit_sync(self, timeout).await
    }

    async fn close(self) -> Result<CommitResult, ShareError> {
        ShareConsumer::close(self).await
    }
}

/// Maps the assignment (topic ids → partitions) onto leaders and tells each broker task which
/// partitions to fetch.
struct Router {
    ctx: Arc<FetchContext>,
    brokers: Arc<Mutex<HashMap<i32, BrokerHandle>>>,
    assignment: watch::Receiver<Option<Arc<Assignment>>>,
    subscription: watch::Receiver<Vec<String>>,
    wake: Arc<Notify>,
    refresh_every: Duration,
}

/// Least time between two metadata refreshes triggered by fetch errors.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(200);

async fn route(mut r: Router) {
    let mut last_refresh = Instant::now();
    let mut need_refresh = true;
    loop {
        if need_refresh {
            let wait = MIN_REFRESH_GAP.saturating_sub(last_refresh.elapsed());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let topics = r.subscription.borrow().clone();
            if let Err(e) = r.ctx.cluster.refresh_metadata(&topics).await {
                debug!(%e, "metadata refresh failed");
            }
            last_refresh = Instant::now();
        }
        let assignment = r.assignment.borrow_and_update().clone();
        let complete = distribute(&r, assignment.as_deref());
        // Unknown topic ids or leaderless partitions: look again soon.
        need_refresh = !complete;
        let next = if complete {
            r.refresh_every
        } else {
            MIN_REFRESH_GAP
        };
        tokio::select! {
            changed = r.assignment.changed() => if changed.is_err() { return },
            changed = r.subscription.changed() => {
                if changed.is_err() { return }
                need_refresh = true;
            }
            _ = r.wake.notified() => need_refresh = true,
            _ = tokio::time::sleep(next) => need_refresh = true,
        }
    }
}

/// Give every broker task its wanted partitions. Returns false if some could not be placed.
fn distribute(r: &Router, assignment: Option<&Assignment>) -> bool {
    let cluster = &r.ctx.cluster;
    let mut wanted: HashMap<i32, BTreeSet<Tp>> = HashMap::new();
    let mut complete = true;
    for (id, partitions) in assignment.into_iter().flatten() {
        let Some(name) = cluster.topic_name(id) else {
            complete = false;
            continue;
        };
        let Some(meta) = cluster.topic(&name) else {
            complete = false;
            continue;
        };
        for &p in partitions {
            match meta.leaders.get(&p) {
                Some(&leader) if leader >= 0 => {
                    wanted.entry(leader).or_default().insert(Tp {
                        topic: Arc::clone(&name),
                        id: *id,
                        partition: p,
                    });
                }
                _ => complete = false,
            }
        }
    }
    let mut brokers = locked(&r.brokers);
    for &id in wanted.keys() {
        brokers
            .entry(id)
            .or_insert_with(|| spawn_broker(id, Arc::clone(&r.ctx)));
    }
    for (id, handle) in brokers.iter() {
        let set = Arc::new(wanted.remove(id).unwrap_or_default());
        handle.wanted.send_if_modified(|old| {
            if **old == *set {
                false
            } else {
                *old = Arc::clone(&set);
                true
            }
        });
    }
    complete
}
