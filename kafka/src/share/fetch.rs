//! One task per broker: ShareFetch and ShareAcknowledge on that broker's share session.
//!
//! The task owns the session, so requests to a broker are strictly one at a time (their epochs
//! form one sequence, brief §4.1) while different brokers run concurrently. It fetches again once
//! the application has acknowledged what this broker gave it (or all but
//! `fetch_buffer_batches - 1` fetches' worth), and piggybacks those acknowledgements on that
//! fetch (brief §4.6). Responses become
//! [`ShareRecord`]s here: only acquired offsets are delivered, acquired offsets without a
//! deliverable record are acknowledged as GAP, and records we already hold are not delivered
//! twice (brief §4.5).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch as AckReqBatch,
};
use kafka_protocol::messages::share_fetch_request::{
    AcknowledgementBatch as FetchAckBatch, FetchPartition, FetchTopic, ForgottenTopic,
};
use kafka_protocol::messages::share_fetch_response::AcquiredRecords;
use kafka_protocol::messages::{
    GroupId, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest,
    ShareFetchResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, error, warn, Instrument};
use uuid::Uuid;

use super::ack::{encode_batches, Acquire, Ledger, Owner, SentAcks, GAP};
use super::session::{reset_for_error, Plan, Reset, ShareSession, CLOSE_EPOCH};
use super::{AckError, ShareError, ShareRecord, Tp};
use crate::backoff::Backoff;
use crate::cluster::Cluster;
use crate::connection::ConnectionError;
use crate::copies::{Copies, COPY_CHUNK};
use crate::error_name;

const SHARE_FETCH_KEY: i16 = 78;
const SHARE_ACKNOWLEDGE_KEY: i16 = 79;
/// kafka-protocol 0.18 has only v1 of the share APIs (brief §1); v0 has another layout.
const SHARE_API_VERSION: i16 = 1;
/// How often an idle task checks for acknowledgements to send on their own.
const ACK_TICK: Duration = Duration::from_millis(50);
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// Lock duration assumed before the broker has told us its own (Kafka's default).
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const FENCED_LEADER_EPOCH: i16 = 74;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;
/// librdkafka's answer for a partition we sent acks for that the response leaves out (§4.6).
const INVALID_RECORD_STATE: i16 = 121;

/// Fetch settings sent with every ShareFetch.
#[derive(Debug, Clone)]
pub(crate) struct FetchParams {
    pub max_wait: Duration,
    pub min_bytes: i32,
    pub max_bytes: i32,
    pub max_records: i32,
    pub batch_size: i32,
    pub request_timeout: Duration,
    /// How many fetches' worth of records one broker task may leave unacknowledged in the
    /// application's hands when it fetches again: 1 = fetch once everything it delivered is
    /// acknowledged (so the acks ride on that fetch).
    pub buffered_batches: usize,
}

/// What the broker tasks of one consumer share.
pub(crate) struct FetchContext {
    pub cluster: Arc<Cluster>,
    pub group_id: GroupId,
    pub member_id: StrBytes,
    pub ledger: Arc<Mutex<Ledger>>,
    pub deliveries: mpsc::UnboundedSender<Delivery>,
    /// Bumped by the application side at `poll` and `commit_sync`: acknowledgements may have
    /// been made, so a broker task waiting for them looks again.
    pub app_ready: watch::Sender<u64>,
    /// Wakes the consumer's router: leaders moved or metadata looks stale.
    pub router: Arc<Notify>,
    pub params: FetchParams,
    /// The acquisition lock duration the brokers reported last (`AcquisitionLockTimeoutMs`),
    /// in ms; 0 until a ShareFetch response said.
    pub lock_timeout_ms: AtomicU64,
    /// The application asked for no new records before this instant (its target is down and
    /// records acquired now would only wait out their locks): no ShareFetch is sent until
    /// then; acknowledgements still go out on their own.
    pub fetch_paused_until: Mutex<Option<Instant>>,
}

impl FetchContext {
    fn fetch_paused(&self) -> bool {
        let paused = *self
            .fetch_paused_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        paused.is_some_and(|until| Instant::now() < until)
    }
}

/// What a broker task hands to `poll`.
pub(crate) enum Delivery {
    Records(Vec<ShareRecord>),
    Error(ShareError),
}

pub(crate) enum Command {
    /// Send all pending acknowledgements now, then answer.
    Flush(oneshot::Sender<()>),
    /// Send pending acknowledgements with epoch -1 (closing the session), answer, and stop.
    Close(oneshot::Sender<()>),
}

/// The consumer's grip on one broker task.
pub(crate) struct BrokerHandle {
    pub commands: mpsc::UnboundedSender<Command>,
    pub wanted: watch::Sender<Arc<BTreeSet<Tp>>>,
    pub task: JoinHandle<()>,
}

pub(crate) fn lock_ledger(ledger: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    // Ledger methods leave it consistent at every return; a panic elsewhere cannot tear it.
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn spawn_broker(broker: i32, ctx: Arc<FetchContext>) -> BrokerHandle {
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let (wanted, wanted_rx) = watch::channel(Arc::new(BTreeSet::new()));
    let app_ready = ctx.app_ready.subscribe();
    let task = BrokerTask {
        broker,
        ctx,
        session: ShareSession::new(),
        commands: commands_rx,
        wanted: wanted_rx,
        app_ready,
        app_asked: false,
        last_fetch: None,
        flush_waiters: Vec::new(),
        closing: None,
        retry: Backoff::new(RETRY_MIN, RETRY_MAX),
        lock_timeout: DEFAULT_LOCK_TIMEOUT,
        forget_blocked_since: None,
        ack_retry_at: None,
    };
    BrokerHandle {
        commands,
        wanted,
        task: tokio::spawn(task.run().in_current_span()),
    }
}

struct BrokerTask {
    broker: i32,
    ctx: Arc<FetchContext>,
    session: ShareSession,
    commands: mpsc::UnboundedReceiver<Command>,
    wanted: watch::Receiver<Arc<BTreeSet<Tp>>>,
    app_ready: watch::Receiver<u64>,
    /// The application polled or committed since our last fetch.
    app_asked: bool,
    /// When the last fetch that delivered records came back: once a lock duration has passed,
    /// the broker has released whatever of it is still unacknowledged.
    last_fetch: Option<Instant>,
    flush_waiters: Vec<oneshot::Sender<()>>,
    closing: Option<oneshot::Sender<()>>,
    retry: Backoff,
    /// The acquisition lock duration the broker reported last (`AcquisitionLockTimeoutMs`).
    lock_timeout: Duration,
    /// Since when a partition that left the assignment is kept in the session because the
    /// application still holds unsettled records of it (see [`BrokerTask::must_defer_forget`]).
    forget_blocked_since: Option<Instant>,
    /// Acks were refused with a retriable error: the ack tick resends them from then on.
    ack_retry_at: Option<Instant>,
}

/// Why the loop woke up while waiting.
enum Wake {
    Again,
    AckTick,
    Stop,
}

impl BrokerTask {
    async fn run(mut self) {
        loop {
            while let Ok(cmd) = self.commands.try_recv() {
                self.take_command(cmd);
            }
            if let Some(reply) = self.closing.take() {
                self.close().await;
                let _ = reply.send(());
                for w in self.flush_waiters.drain(..) {
                    let _ = w.send(());
                }
                return;
            }
            if !self.flush_waiters.is_empty() {
                if self.acks_await_reopen() && !self.ctx.fetch_paused() {
                    let wanted = Arc::clone(&self.wanted.borrow());
                    self.reopen_for_acks(&wanted).await;
                }
                self.send_acks(self.session.epoch()).await;
                // Retriable refusals, and acks waiting for their session to reopen, go out
                // again while a commit_sync still waits (its deadline drops the waiter); then
                // the ack tick takes over.
                self.flush_waiters.retain(|w| !w.is_closed());
                let unsent = self.ack_retry_at.is_some() || self.acks_await_reopen();
                if unsent && !self.flush_waiters.is_empty() {
                    self.backoff().await;
                    continue;
                }
                for w in self.flush_waiters.drain(..) {
                    let _ = w.send(());
                }
                continue;
            }
            let wanted = Arc::clone(&self.wanted.borrow_and_update());
            // Acks kept across a reopen go out as soon as a session is open again, whatever
            // the application still holds.
            if self.acks_await_reopen() && !self.ctx.fetch_paused() {
                self.reopen_for_acks(&wanted).await;
                continue;
            }
            let idle = wanted.is_empty() && self.session.partitions().is_empty();
            // Forgetting a partition releases what we still hold of it (§4.2, §8.6 #12), so
            // the acks the application is about to make would fail. Hold the next fetch
            // (acks still go out as ShareAcknowledge on the tick) until they are made.
            let defer = self.must_defer_forget(&wanted);
            if !idle && !defer && self.may_fetch() {
                self.fetch(&wanted).await;
                continue;
            }
            match self.wait().await {
                Wake::Stop => return,
                Wake::Again => {}
                Wake::AckTick => {
                    let pending = lock_ledger(&self.ctx.ledger)
                        .has_pending(self.broker, self.session.generation());
                    let due = self.ack_retry_at.is_none_or(|at| Instant::now() >= at);
                    if pending && due && self.session.is_open() {
                        self.send_acks(self.session.epoch()).await;
                    }
                }
            }
        }
    }

    /// Whether this broker may be asked for more records: the application has acknowledged
    /// what it gave us, down to `buffered_batches - 1` fetches' worth. Fetching while we hold
    /// unacknowledged records of a broker costs that broker work for nothing: the dev broker
    /// re-sends them in every response and walks their lock states for every offset it
    /// writes back (brief §8.6 #14, #32). Records whose locks have run out no longer count.
    fn may_fetch(&self) -> bool {
        if self.ctx.fetch_paused() {
            return false;
        }
        // Only for an application that asks for more: a member that stopped polling must
        // not keep acquiring records it will never process.
        if self.app_asked
            && self
                .last_fetch
                .is_some_and(|at| at.elapsed() >= self.lock_timeout)
        {
            return true;
        }
        let p = &self.ctx.params;
        let allowed = (p.buffered_batches.max(1) - 1).saturating_mul(p.max_records.max(1) as usize);
        lock_ledger(&self.ctx.ledger).unsettled_held(self.broker) <= allowed
    }

    /// Whether the next fetch must wait because it would forget (drop from the session) a
    /// partition of which the application still holds unsettled records: forgetting releases
    /// them on the broker, so their acknowledgements could no longer be applied. An assignment
    /// change therefore takes effect once those records are settled (their acks ride on the
    /// request that forgets the partition), or at the latest after one lock duration, when the
    /// broker has released them anyway. Other partitions of this broker wait meanwhile, which
    /// also keeps the forgotten partitions from acquiring new records.
    fn must_defer_forget(&mut self, wanted: &BTreeSet<Tp>) -> bool {
        let blocked = self.session.is_open() && {
            let ledger = lock_ledger(&self.ctx.ledger);
            let generation = self.session.generation();
            self.session
                .partitions()
                .difference(wanted)
                .any(|tp| ledger.holds_unsettled(self.broker, generation, &tp.topic, tp.partition))
        };
        if !blocked {
            self.forget_blocked_since = None;
            return false;
        }
        let since = *self.forget_blocked_since.get_or_insert_with(Instant::now);
        if since.elapsed() < self.lock_timeout {
            return true;
        }
        debug!(
            broker = self.broker,
            "forgetting partitions with unsettled records after one lock duration"
        );
        false
    }

    fn take_command(&mut self, cmd: Command) {
        match cmd {
            Command::Flush(reply) => self.flush_waiters.push(reply),
            Command::Close(reply) => self.closing = Some(reply),
        }
    }

    /// Wait for a command, a change of wanted partitions, the application's next `poll` or
    /// `commit_sync`, or the ack tick.
    async fn wait(&mut self) -> Wake {
        // Commands first: a flush or close is served before the next fetch, so commit_sync's
        // acks go out as ShareAcknowledge.
        tokio::select! {
            biased;
            cmd = self.commands.recv() => match cmd {
                Some(cmd) => { self.take_command(cmd); Wake::Again }
                None => Wake::Stop,
            },
            changed = self.wanted.changed() => match changed {
                Ok(()) => Wake::Again,
                Err(_) => Wake::Stop,
            },
            changed = self.app_ready.changed() => match changed {
                Ok(()) => { self.app_asked = true; Wake::Again }
                Err(_) => Wake::Stop,
            },
            _ = tokio::time::sleep(ACK_TICK) => Wake::AckTick,
        }
    }

    async fn backoff(&mut self) {
        let wait = self.retry.next_wait();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            cmd = self.commands.recv() => if let Some(cmd) = cmd { self.take_command(cmd) },
        }
    }

    /// A request failed and the session must be opened again at epoch 0. `cause` says whether
    /// the broker released what we held through it ([`reset_for_error`]): then unsent and
    /// in-flight acks fail; otherwise they wait for the reopened session (an epoch-0 ShareFetch
    /// may not carry acks, so they follow at epoch 1).
    fn end_session(&mut self, sent: &SentAcks, cause: Reset, reason: String) {
        settle_after_reset(
            &mut lock_ledger(&self.ctx.ledger),
            self.broker,
            sent,
            cause,
            &reason,
        );
        if cause == Reset::Kept {
            debug!(broker = self.broker, %reason, "reopening the share session; held records and their acks are kept");
            self.ack_retry_at = Some(Instant::now() + self.retry.next_wait());
        }
        self.session.end(cause);
    }

    /// Whether acks made through the current generation wait for a session to carry them (it
    /// was reopened after an error that left our records with us).
    fn acks_await_reopen(&self) -> bool {
        !self.session.is_open()
            && lock_ledger(&self.ctx.ledger).has_pending(self.broker, self.session.generation())
    }

    /// Open the session again (a ShareFetch at epoch 0 for what we fetch), so acks kept across
    /// a reopen can follow. With nothing left to fetch from this broker no session can be
    /// opened: those acks fail and the records come back once their locks run out.
    async fn reopen_for_acks(&mut self, wanted: &BTreeSet<Tp>) {
        if !wanted.is_empty() {
            self.fetch(wanted).await;
            return;
        }
        let broker = self.broker;
        lock_ledger(&self.ctx.ledger).invalidate(broker, None, |topic, partition| {
            AckError::SessionLost {
                broker,
                topic: topic.to_string(),
                partition,
                reason: "no partition is fetched from this broker any more, so no share session can be opened to carry the acknowledgements".into(),
            }
        });
        self.session.reset();
    }

    /// Topic name → id for everything this session knows or is about to know.
    fn topic_ids(&self, plan: &Plan) -> HashMap<Arc<str>, Uuid> {
        self.session
            .partitions()
            .iter()
            .chain(plan.adds.iter())
            .chain(plan.forgets.iter())
            .map(|tp| (Arc::clone(&tp.topic), tp.id))
            .collect()
    }

    async fn fetch(&mut self, wanted: &BTreeSet<Tp>) {
        self.app_asked = false;
        let plan = self.session.plan(wanted);
        if plan.epoch == 0 && plan.adds.is_empty() {
            return;
        }
        // Never piggyback at epoch 0: the broker refuses acks on a session open (§4.1).
        let sent = if self.session.is_open() {
            lock_ledger(&self.ctx.ledger).take_pending(self.broker, self.session.generation())
        } else {
            Vec::new()
        };
        let ids = self.topic_ids(&plan);
        let request = self.fetch_request(&plan, &sent, &ids);
        let p = &self.ctx.params;
        let timeout = p.request_timeout + p.max_wait;
        let result = match self.ctx.cluster.broker(self.broker).await {
            Ok(conn) => match conn.pick(SHARE_FETCH_KEY, SHARE_API_VERSION, SHARE_API_VERSION) {
                Ok(v) => conn
                    .request(&request, v, timeout)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => {
                    // A broker without ShareFetch v1 (share groups off, or 4.0 early access).
                    let reason = e.to_string();
                    let _ = self.ctx.deliveries.send(Delivery::Error(e.into()));
                    Err(reason)
                }
            },
            Err(e) => Err(e.to_string()),
        };
        let response = match result {
            Ok(r) => r,
            Err(reason) => {
                debug!(broker = self.broker, %reason, "ShareFetch failed");
                // The broker may be gone or no longer lead: look again at once (Java requests a
                // metadata update on every disconnect).
                self.ctx.router.notify_one();
                // Our connection failed or timed out and was closed: on Kafka the close of the
                // connection that created the session releases its records.
                self.end_session(
                    &sent,
                    Reset::Released,
                    format!("ShareFetch failed: {reason}"),
                );
                self.backoff().await;
                return;
            }
        };
        if response.error_code != 0 {
            let code = response.error_code;
            debug!(broker = self.broker, code, "ShareFetch top-level error");
            // The dev broker does not advance its epoch on a top-level error and a real one may
            // not either; reopening is the safe path (brief §4.1 recommendation). The broker
            // refused the request before looking at its acks, so they were not applied.
            self.end_session(
                &sent,
                reset_for_error(code),
                format!("ShareFetch failed with error {code} ({})", error_name(code)),
            );
            match classify(code) {
                FetchFault::Retry => self.ctx.router.notify_one(),
                FetchFault::NotAuthorized => {
                    let _ =
                        self.ctx
                            .deliveries
                            .send(Delivery::Error(self.not_authorized(
                                wanted.iter().next().map_or("*", |tp| &*tp.topic),
                                code,
                            )));
                }
                FetchFault::Fatal => {
                    let _ = self
                        .ctx
                        .deliveries
                        .send(Delivery::Error(ShareError::Partition {
                            broker: self.broker,
                            topic: "*".into(),
                            partition: -1,
                            code,
                            name: error_name(code),
                        }));
                }
            }
            self.backoff().await;
            return;
        }
        self.session.succeeded(&plan);
        let received = Instant::now();
        if response.acquisition_lock_timeout_ms > 0 {
            self.lock_timeout = Duration::from_millis(response.acquisition_lock_timeout_ms as u64);
            self.ctx.lock_timeout_ms.store(
                response.acquisition_lock_timeout_ms as u64,
                Ordering::Relaxed,
            );
        }
        // A response without AcquisitionLockTimeoutMs keeps the last one reported (at first the
        // broker default), so a record's deadline is never "already passed" for lack of a field.
        let lock_deadline = received + self.lock_timeout;
        let owner = Owner {
            broker: self.broker,
            generation: self.session.generation(),
        };
        let (records, errors, retriable) =
            self.absorb_fetch(&plan, &sent, &ids, response, owner, lock_deadline);
        for e in errors {
            let _ = self.ctx.deliveries.send(Delivery::Error(e));
        }
        let delivered = !records.is_empty();
        if delivered {
            self.last_fetch = Some(received);
            let _ = self.ctx.deliveries.send(Delivery::Records(records));
        }
        if retriable && !delivered {
            // Partitions in failover answer at once; asking again at once would spin.
            self.backoff().await;
        } else {
            self.retry.reset();
        }
    }

    /// The error for a refused authorization, naming the ACL the principal lacks.
    fn not_authorized(&self, topic: &str, code: i16) -> ShareError {
        let group = self.ctx.group_id.0.to_string();
        let acl = if code == ResponseError::GroupAuthorizationFailed.code() {
            format!("READ on Group:{group}")
        } else {
            format!("READ on Topic:{topic} (and READ on Group:{group})")
        };
        ShareError::NotAuthorized {
            broker: self.broker,
            group,
            topic: topic.to_string(),
            code,
            name: error_name(code),
            acl,
        }
    }

    fn fetch_request(
        &self,
        plan: &Plan,
        sent: &SentAcks,
        ids: &HashMap<Arc<str>, Uuid>,
    ) -> ShareFetchRequest {
        let mut topics: BTreeMap<Uuid, Vec<FetchPartition>> = BTreeMap::new();
        for tp in &plan.adds {
            let mut p = FetchPartition::default();
            p.partition_index = tp.partition;
            topics.entry(tp.id).or_default().push(p);
        }
        for (topic, partition, acks) in sent {
            let Some(id) = ids.get(topic) else { continue };
            let batches = encode_batches(acks)
                .into_iter()
                .map(|b| {
                    let mut out = FetchAckBatch::default();
                    out.first_offset = b.first;
                    out.last_offset = b.last;
                    out.acknowledge_types = b.types;
                    out
                })
                .collect();
            let list = topics.entry(*id).or_default();
            match list.iter_mut().find(|p| p.partition_index == *partition) {
                Some(p) => p.acknowledgement_batches = batches,
                None => {
                    let mut p = FetchPartition::default();
                    p.partition_index = *partition;
                    p.acknowledgement_batches = batches;
                    list.push(p);
                }
            }
        }
        let mut forgotten: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
        for tp in &plan.forgets {
            forgotten.entry(tp.id).or_default().push(tp.partition);
        }
        let p = &self.ctx.params;
        let mut request = ShareFetchRequest::default();
        request.group_id = Some(self.ctx.group_id.clone());
        request.member_id = Some(self.ctx.member_id.clone());
        request.share_session_epoch = plan.epoch;
        request.max_wait_ms = p.max_wait.as_millis().min(i32::MAX as u128) as i32;
        request.min_bytes = p.min_bytes;
        request.max_bytes = p.max_bytes;
        request.max_records = p.max_records;
        request.batch_size = p.batch_size;
        request.topics = topics
            .into_iter()
            .map(|(id, partitions)| {
                let mut t = FetchTopic::default();
                t.topic_id = id;
                t.partitions = partitions;
                t
            })
            .collect();
        request.forgotten_topics_data = forgotten
            .into_iter()
            .map(|(id, partitions)| {
                let mut t = ForgottenTopic::default();
                t.topic_id = id;
                t.partitions = partitions;
                t
            })
            .collect();
        request
    }

    /// Apply a successful ShareFetch response: ack results first (a released record can come
    /// back in the same response), then forgotten partitions, then partition data.
    fn absorb_fetch(
        &mut self,
        plan: &Plan,
        sent: &SentAcks,
        ids: &HashMap<Arc<str>, Uuid>,
        response: ShareFetchResponse,
        owner: Owner,
        lock_deadline: Instant,
    ) -> (Vec<ShareRecord>, Vec<ShareError>, bool) {
        let broker = self.broker;
        let mut names: HashMap<Uuid, Arc<str>> =
            ids.iter().map(|(n, id)| (*id, Arc::clone(n))).collect();
        let mut ack_codes: HashMap<(Uuid, i32), i16> = HashMap::new();
        for t in &response.responses {
            for p in &t.partitions {
                ack_codes.insert((t.topic_id, p.partition_index), p.acknowledge_error_code);
            }
        }
        let mut ledger = lock_ledger(&self.ctx.ledger);
        for (topic, partition, acks) in sent {
            let code = ids
                .get(topic)
                .and_then(|id| ack_codes.get(&(*id, *partition)).copied())
                .unwrap_or(INVALID_RECORD_STATE);
            ledger.complete(
                topic,
                *partition,
                acks,
                ack_result(broker, topic, *partition, code),
            );
        }
        for tp in &plan.forgets {
            // Forgetting releases whatever we still held there (§4.2).
            ledger.invalidate(broker, Some((&tp.topic, tp.partition)), |t, p| {
                AckError::SessionLost {
                    broker,
                    topic: t.to_string(),
                    partition: p,
                    reason: "the partition left this broker's session".into(),
                }
            });
        }
        // Room for as many records as we asked for, when any were acquired: the consumer
        // hands this list to the application as it is and appends later deliveries to it up
        // to `max.poll.records`, so neither growing it nor joining lists copies a record.
        let any_acquired = response
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .any(|p| p.error_code == 0 && !p.acquired_records.is_empty());
        let asked = usize::try_from(self.ctx.params.max_records).unwrap_or(0);
        let mut records = Vec::with_capacity(if any_acquired { asked } else { 0 });
        let mut errors = Vec::new();
        let mut retriable = false;
        let endpoints: HashMap<i32, String> = response
            .node_endpoints
            .iter()
            .map(|e| (e.node_id.0, format!("{}:{}", e.host.as_str(), e.port)))
            .collect();
        for t in response.responses {
            let Some(topic) = names.get_mut(&t.topic_id).map(|n| Arc::clone(n)) else {
                warn!(broker, topic_id = %t.topic_id, "ShareFetch response names a topic id we did not ask for");
                continue;
            };
            for p in t.partitions {
                match p.error_code {
                    0 => {
                        let outcome = absorb_partition(
                            &mut ledger,
                            &topic,
                            p.partition_index,
                            owner,
                            &p.acquired_records,
                            p.records.unwrap_or_default(),
                            lock_deadline,
                            &mut records,
                        );
                        if let Err(e) = outcome {
                            errors.push(e);
                        }
                    }
                    NOT_LEADER_OR_FOLLOWER | FENCED_LEADER_EPOCH => {
                        let (leader, leader_epoch) =
                            (p.current_leader.leader_id, p.current_leader.leader_epoch);
                        // Acks for records acquired here must not go to the new leader (§4.7).
                        ledger.invalidate(broker, Some((&topic, p.partition_index)), |t, p| {
                            AckError::LeaderMoved {
                                from: broker,
                                topic: t.to_string(),
                                partition: p,
                            }
                        });
                        if leader >= 0 {
                            self.ctx.cluster.set_leader(
                                &topic,
                                p.partition_index,
                                leader,
                                leader_epoch,
                                endpoints.get(&leader).cloned(),
                            );
                        }
                        self.ctx.router.notify_one();
                    }
                    code => match classify(code) {
                        // Share-state loading, coordinator failover, unknown topic/partition,
                        // storage or leader-epoch trouble: retried after a backoff and a
                        // metadata refresh, as Kafka's clients do (brief, Share sessions).
                        FetchFault::Retry => {
                            debug!(broker, %topic, partition = p.partition_index, code, name = %error_name(code), "partition not fetchable now; retrying");
                            retriable = true;
                            self.ctx.router.notify_one();
                        }
                        FetchFault::NotAuthorized => {
                            errors.push(self.not_authorized(&topic, code));
                        }
                        FetchFault::Fatal => errors.push(ShareError::Partition {
                            broker,
                            topic: topic.to_string(),
                            partition: p.partition_index,
                            code,
                            name: error_name(code),
                        }),
                    },
                }
            }
        }
        (records, errors, retriable)
    }

    /// ShareAcknowledge of everything pending, at `epoch` (-1 closes the session).
    async fn send_acks(&mut self, epoch: i32) {
        if !self.session.is_open() {
            return;
        }
        let sent =
            lock_ledger(&self.ctx.ledger).take_pending(self.broker, self.session.generation());
        if sent.is_empty() && epoch != CLOSE_EPOCH {
            return;
        }
        let ids = self.topic_ids(&Plan::default());
        let mut topics: BTreeMap<Uuid, Vec<AcknowledgePartition>> = BTreeMap::new();
        for (topic, partition, acks) in &sent {
            let Some(id) = ids.get(topic) else { continue };
            let mut p = AcknowledgePartition::default();
            p.partition_index = *partition;
            p.acknowledgement_batches = encode_batches(acks)
                .into_iter()
                .map(|b| {
                    let mut out = AckReqBatch::default();
                    out.first_offset = b.first;
                    out.last_offset = b.last;
                    out.acknowledge_types = b.types;
                    out
                })
                .collect();
            topics.entry(*id).or_default().push(p);
        }
        let mut request = ShareAcknowledgeRequest::default();
        request.group_id = Some(self.ctx.group_id.clone());
        request.member_id = Some(self.ctx.member_id.clone());
        request.share_session_epoch = epoch;
        request.topics = topics
            .into_iter()
            .map(|(id, partitions)| {
                let mut t = AcknowledgeTopic::default();
                t.topic_id = id;
                t.partitions = partitions;
                t
            })
            .collect();
        let timeout = self.ctx.params.request_timeout;
        let result: Result<ShareAcknowledgeResponse, String> =
            match self.ctx.cluster.broker(self.broker).await {
                Ok(conn) => {
                    match conn.pick(SHARE_ACKNOWLEDGE_KEY, SHARE_API_VERSION, SHARE_API_VERSION) {
                        Ok(v) => conn
                            .request(&request, v, timeout)
                            .await
                            .map_err(|e: ConnectionError| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
                Err(e) => Err(e.to_string()),
            };
        let response = match result {
            Ok(r) if r.error_code == 0 => r,
            Ok(r) => {
                let code = r.error_code;
                self.end_session(
                    &sent,
                    reset_for_error(code),
                    format!(
                        "ShareAcknowledge failed with error {code} ({})",
                        error_name(code)
                    ),
                );
                return;
            }
            Err(reason) => {
                self.ctx.router.notify_one();
                self.end_session(
                    &sent,
                    Reset::Released,
                    format!("ShareAcknowledge failed: {reason}"),
                );
                return;
            }
        };
        let broker = self.broker;
        let mut codes: HashMap<(Uuid, i32), (i16, (i32, i32))> = HashMap::new();
        for t in &response.responses {
            for p in &t.partitions {
                codes.insert(
                    (t.topic_id, p.partition_index),
                    (
                        p.error_code,
                        (p.current_leader.leader_id, p.current_leader.leader_epoch),
                    ),
                );
            }
        }
        let endpoints: HashMap<i32, String> = response
            .node_endpoints
            .iter()
            .map(|e| (e.node_id.0, format!("{}:{}", e.host.as_str(), e.port)))
            .collect();
        let mut moved = Vec::new();
        let mut retry_acks = false;
        {
            let mut ledger = lock_ledger(&self.ctx.ledger);
            for (topic, partition, acks) in &sent {
                let (code, leader) = ids
                    .get(topic)
                    .and_then(|id| codes.get(&(*id, *partition)).copied())
                    .unwrap_or((INVALID_RECORD_STATE, (-1, -1)));
                if ack_retriable(code) && epoch != CLOSE_EPOCH {
                    // Retried (flush: until commit_sync's deadline; else on the ack tick after
                    // a backoff), as Java's share consumer does.
                    debug!(broker, %topic, partition, code, name = %error_name(code), "acknowledgement not applied; retrying");
                    ledger.requeue(topic, *partition, acks);
                    retry_acks = true;
                    continue;
                }
                ledger.complete(
                    topic,
                    *partition,
                    acks,
                    ack_result(broker, topic, *partition, code),
                );
                if matches!(code, NOT_LEADER_OR_FOLLOWER | FENCED_LEADER_EPOCH) {
                    moved.push((Arc::clone(topic), *partition, leader));
                }
            }
        }
        for (topic, partition, (leader, leader_epoch)) in moved {
            if leader >= 0 {
                self.ctx.cluster.set_leader(
                    &topic,
                    partition,
                    leader,
                    leader_epoch,
                    endpoints.get(&leader).cloned(),
                );
            }
            self.ctx.router.notify_one();
        }
        if epoch == CLOSE_EPOCH {
            self.session.reset();
        } else {
            self.session.acked();
        }
        if retry_acks {
            self.ack_retry_at = Some(Instant::now() + self.retry.next_wait());
        } else {
            self.ack_retry_at = None;
            self.retry.reset();
        }
    }

    /// Flush acks and close the session (epoch -1); the broker releases what we still hold.
    async fn close(&mut self) {
        if self.session.is_open() {
            self.send_acks(CLOSE_EPOCH).await;
        }
        let broker = self.broker;
        // Whatever is still held was released by the close (or by the lost session).
        lock_ledger(&self.ctx.ledger).invalidate(broker, None, |topic, partition| {
            AckError::SessionLost {
                broker,
                topic: topic.to_string(),
                partition,
                reason: "the consumer closed its session first".into(),
            }
        });
        self.session.reset();
    }
}

/// Settle the acks a failed request carried, and what we hold through the broker's session,
/// once the session has to be reopened for `cause`.
fn settle_after_reset(
    ledger: &mut Ledger,
    broker: i32,
    sent: &SentAcks,
    cause: Reset,
    reason: &str,
) {
    let lost = |topic: &str, partition: i32| AckError::SessionLost {
        broker,
        topic: topic.to_string(),
        partition,
        reason: reason.to_string(),
    };
    match cause {
        Reset::Released => {
            for (topic, partition, acks) in sent {
                ledger.complete(topic, *partition, acks, Err(lost(topic, *partition)));
            }
            ledger.invalidate(broker, None, lost);
        }
        // Not applied (refused at the top level) and still ours: send them again.
        Reset::Kept => {
            for (topic, partition, acks) in sent {
                ledger.requeue(topic, *partition, acks);
            }
        }
    }
}

/// What a ShareFetch error code asks of the fetch loop.
#[derive(Debug, PartialEq, Eq)]
enum FetchFault {
    Retry,
    NotAuthorized,
    Fatal,
}

fn classify(code: i16) -> FetchFault {
    use ResponseError::*;
    match ResponseError::try_from_code(code) {
        Some(TopicAuthorizationFailed | GroupAuthorizationFailed) => FetchFault::NotAuthorized,
        // What a real broker answers while its share coordinator moves or the state persister
        // loads (rolling restarts): not marked retriable in the protocol, retried by Kafka's
        // share consumer all the same.
        Some(GroupIdNotFound | UnknownServerError) => FetchFault::Retry,
        Some(e) if e.is_retriable() => FetchFault::Retry,
        _ => FetchFault::Fatal,
    }
}

/// Per-partition ShareAcknowledge errors after which the same acks may go out again: the
/// broker applied none of them (leader moves are handled apart: the records are gone).
fn ack_retriable(code: i16) -> bool {
    use ResponseError::*;
    match ResponseError::try_from_code(code) {
        Some(NotLeaderOrFollower | FencedLeaderEpoch) | None => false,
        Some(e) => e.is_retriable(),
    }
}

fn ack_result(broker: i32, topic: &str, partition: i32, code: i16) -> Result<(), AckError> {
    if code == 0 {
        Ok(())
    } else {
        Err(AckError::Refused {
            broker,
            topic: topic.to_string(),
            partition,
            code,
            name: error_name(code),
        })
    }
}

/// Turn one partition's acquired ranges and record bytes into deliveries and automatic acks.
///
/// - A record outside every acquired range is not ours: dropped.
/// - A record inside a range is delivered, unless we already hold it (mock re-send) or it is a
///   control record (then GAP).
/// - An acquired offset that no record covers is acknowledged as GAP.
/// - An undecodable batch is skipped and the error returned, naming the partition and offsets:
///   on a CRC failure its acquired offsets are REJECTed (as Java does); otherwise (old magic,
///   unknown codec, odd header) RELEASEd, never archived silently.
#[allow(clippy::too_many_arguments)]
pub(crate) fn absorb_partition(
    ledger: &mut Ledger,
    topic: &Arc<str>,
    partition: i32,
    owner: Owner,
    acquired: &[AcquiredRecords],
    mut bytes: Bytes,
    lock_deadline: Instant,
    out: &mut Vec<ShareRecord>,
) -> Result<(), ShareError> {
    if acquired.is_empty() {
        return Ok(());
    }
    let mut ranges: Vec<(i64, i64, i16)> = acquired
        .iter()
        .filter(|r| r.first_offset <= r.last_offset)
        .map(|r| (r.first_offset, r.last_offset, r.delivery_count))
        .collect();
    ranges.sort_unstable();
    if ranges.is_empty() {
        return Ok(());
    }
    let last_acquired = ranges.iter().map(|r| r.1).max().unwrap_or(i64::MIN);
    // One partition: claimed once, not per record.
    let part = ledger.claim(topic, partition, owner);
    let find = |offset: i64| -> Option<i16> {
        let i = ranges.partition_point(|r| r.1 < offset);
        ranges.get(i).filter(|r| r.0 <= offset).map(|r| r.2)
    };
    // Offsets a record (or a corrupt batch) accounted for; the rest become GAP.
    let mut covered: Vec<i64> = Vec::new();
    let mut corrupt: Option<ShareError> = None;
    let mut copies = Copies::new(COPY_CHUNK);
    while bytes.len() >= 12 {
        let base = i64::from_be_bytes(bytes[0..8].try_into().unwrap_or([0; 8]));
        let len = i32::from_be_bytes(bytes[8..12].try_into().unwrap_or([0; 4]));
        if len < 0 {
            corrupt.get_or_insert(ShareError::CorruptRecords {
                topic: topic.to_string(),
                partition,
                offset: base,
                first: base,
                last: i64::MAX,
                reason: format!("negative batch length {len}"),
                outcome: "left to their lock timeout",
            });
            break;
        }
        let total = 12usize.saturating_add(len as usize);
        if bytes.len() < total {
            // A partial batch at the end is normal: the broker cuts at MaxBytes.
            break;
        }
        let mut batch = bytes.split_to(total);
        // A fetch carries every stored batch around the acquired offsets whole (and the dev
        // broker re-sends held records): an uncompressed batch is read in place, and only its
        // acquired records are taken out of it.
        if let Some(records) =
            acquired_in_place(&batch, last_acquired, |offset| find(offset).is_some())
        {
            for r in records {
                let Some(delivery_count) = find(r.offset) else {
                    continue;
                };
                covered.push(r.offset);
                if part.acquire(r.offset, delivery_count) == Acquire::Duplicate {
                    continue;
                }
                let field = |range: Option<Range<usize>>, copies: &mut Copies| {
                    range.map(|range| copies.copy(&batch[range]))
                };
                let (key, value) = copies.copy_pair(
                    r.key.map(|range| &batch[range]),
                    r.value.map(|range| &batch[range]),
                );
                let headers = r
                    .headers
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            String::from_utf8_lossy(&batch[k]).into_owned(),
                            field(v, &mut copies),
                        )
                    })
                    .collect();
                out.push(ShareRecord {
                    topic: Arc::clone(topic),
                    partition,
                    offset: r.offset,
                    key,
                    value,
                    headers,
                    timestamp: r.timestamp,
                    delivery_count,
                    lock_deadline,
                });
            }
            continue;
        }
        let raw = batch.clone();
        let control_batch = is_control_batch(&batch);
        let last_delta = if total >= 27 {
            i32::from_be_bytes(batch[23..27].try_into().unwrap_or([0; 4])) as i64
        } else {
            0
        };
        match RecordBatchDecoder::decode(&mut batch) {
            Ok(set) => {
                for record in set.records {
                    let Some(delivery_count) = find(record.offset) else {
                        continue;
                    };
                    covered.push(record.offset);
                    if record.control {
                        part.auto_ack(record.offset, delivery_count, GAP);
                        continue;
                    }
                    if part.acquire(record.offset, delivery_count) == Acquire::Duplicate {
                        continue;
                    }
                    // Copied out of the response: a slice would keep the whole response
                    // alive, and it carries every stored batch that overlaps the acquired
                    // offsets (the records of other members too), so what we hold would
                    // grow with the producer's batch size rather than with what we acquired.
                    // The copies share chunks: one allocation per chunk, not per copy.
                    let (key, value) =
                        copies.copy_pair(record.key.as_deref(), record.value.as_deref());
                    out.push(ShareRecord {
                        topic: Arc::clone(topic),
                        partition,
                        offset: record.offset,
                        key,
                        value,
                        headers: record
                            .headers
                            .into_iter()
                            .map(|(k, v)| (k.as_str().to_string(), v.map(|b| copies.copy(&b))))
                            .collect(),
                        timestamp: record.timestamp,
                        delivery_count,
                        lock_deadline,
                    });
                }
            }
            Err(_) if control_batch => {
                // Transaction markers carry no data. The dev broker writes them with a zero
                // CRC, so they fail the check; their acquired offsets are gaps either way.
                let last = base.saturating_add(last_delta.max(0));
                for &(f, l, dc) in &ranges {
                    for offset in f.max(base)..=l.min(last) {
                        covered.push(offset);
                        part.auto_ack(offset, dc, GAP);
                    }
                }
            }
            Err(e) => {
                // Only a failed checksum proves the bytes bad for everyone: REJECT (archive)
                // then, as Java does. A batch we merely cannot decode (old magic, unknown
                // codec, odd header) may be fine for another client: RELEASE it, loudly.
                let crc_failed = crc_mismatch(&raw);
                let (ack, outcome) = if crc_failed {
                    (REJECT, "rejected (CRC check failed)")
                } else {
                    (RELEASE, "released for redelivery")
                };
                let last = base.saturating_add(last_delta.max(0));
                let mut first_hit = None;
                let mut last_hit = None;
                for &(f, l, dc) in &ranges {
                    let (lo, hi) = (f.max(base), l.min(last));
                    for offset in lo..=hi {
                        covered.push(offset);
                        part.auto_ack(offset, dc, ack);
                        first_hit.get_or_insert(offset);
                        last_hit = Some(offset);
                    }
                }
                if let (Some(first), Some(last)) = (first_hit, last_hit) {
                    error!(%topic, partition, first, last, reason = %e, outcome, "undecodable record batch");
                    corrupt.get_or_insert(ShareError::CorruptRecords {
                        topic: topic.to_string(),
                        partition,
                        offset: base,
                        first,
                        last,
                        reason: e.to_string(),
                        outcome,
                    });
                }
            }
        }
    }
    covered.sort_unstable();
    covered.dedup();
    let mut seen = covered.iter().peekable();
    for &(first, last, dc) in &ranges {
        for offset in first..=last {
            while seen.peek().is_some_and(|o| **o < offset) {
                seen.next();
            }
            if seen.peek() == Some(&&offset) {
                continue;
            }
            part.auto_ack(offset, dc, GAP);
        }
    }
    match corrupt {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One record of a batch read in place: where its fields are in the batch.
#[derive(Debug, PartialEq)]
struct InPlace {
    offset: i64,
    timestamp: i64,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
    /// Header keys (valid UTF-8) and values; a repeated key keeps its first place and takes
    /// the later value, as the decoder's map does.
    headers: Vec<(Range<usize>, Option<Range<usize>>)>,
}

/// A zigzag varint (Kafka's varint and varlong) at `*pos` in `buf`.
fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut raw: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        raw |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((raw >> 1) as i64 ^ -((raw & 1) as i64));
        }
    }
    None
}

/// A length-prefixed field at `*pos` (length -1: null); its range in `buf`.
fn read_field(buf: &[u8], pos: &mut usize) -> Option<Option<Range<usize>>> {
    let len = read_varint(buf, pos)?;
    if len == -1 {
        return Some(None);
    }
    let start = *pos;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    if end > buf.len() {
        return None;
    }
    *pos = end;
    Some(Some(start..end))
}

/// The records of `batch` (a whole v2 record batch, header included) that `wanted` picks, read
/// in place: every other record is skipped by its length, not decoded, and the walk stops past
/// offset `last` (offsets grow within a batch). `None` when the batch
/// is not one this reads (another magic, compressed, a control batch, a failed CRC, a malformed
/// record): the decoder then takes it, and reports what is wrong with it. Like the decoder, a
/// record's timestamp is the batch's base timestamp plus its delta.
fn acquired_in_place(
    batch: &[u8],
    last: i64,
    wanted: impl Fn(i64) -> bool,
) -> Option<Vec<InPlace>> {
    const HEADER: usize = 61;
    if batch.len() < HEADER || batch[16] != 2 {
        return None;
    }
    let be_i64 = |at: usize| i64::from_be_bytes(batch[at..at + 8].try_into().unwrap_or([0; 8]));
    let attributes = u16::from_be_bytes([batch[21], batch[22]]);
    // Compression (bits 0-2) or a control batch (bit 5).
    if attributes & 0x7 != 0 || attributes & 0x20 != 0 {
        return None;
    }
    if crc_mismatch(batch) {
        return None;
    }
    let base = be_i64(0);
    let base_timestamp = be_i64(27);
    let count = i32::from_be_bytes([batch[57], batch[58], batch[59], batch[60]]);
    let mut records = Vec::new();
    let mut pos = HEADER;
    for _ in 0..u32::try_from(count).ok()? {
        let size = usize::try_from(read_varint(batch, &mut pos)?).ok()?;
        let end = pos.checked_add(size)?;
        if end > batch.len() {
            return None;
        }
        let record = &batch[..end];
        // Past the record's attributes (one byte).
        let mut at = pos + 1;
        let timestamp_delta = read_varint(record, &mut at)?;
        let offset_delta = i32::try_from(read_varint(record, &mut at)?).ok()?;
        let offset = base + i64::from(offset_delta);
        if offset > last {
            break;
        }
        if wanted(offset) {
            let key = read_field(record, &mut at)?;
            let value = read_field(record, &mut at)?;
            let header_count = usize::try_from(read_varint(record, &mut at)?).ok()?;
            let mut headers: Vec<(Range<usize>, Option<Range<usize>>)> = Vec::new();
            for _ in 0..header_count {
                let name = read_field(record, &mut at)??;
                std::str::from_utf8(&batch[name.clone()]).ok()?;
                let value = read_field(record, &mut at)?;
                match headers
                    .iter_mut()
                    .find(|(n, _)| batch[n.clone()] == batch[name.clone()])
                {
                    Some(known) => known.1 = value,
                    None => headers.push((name, value)),
                }
            }
            records.push(InPlace {
                offset,
                timestamp: base_timestamp.wrapping_add(timestamp_delta),
                key,
                value,
                headers,
            });
        }
        pos = end;
    }
    Some(records)
}

/// Whether a record batch (v2 header: attributes at bytes 21..23) is a control batch.
fn is_control_batch(batch: &[u8]) -> bool {
    const CONTROL: u16 = 0x20;
    batch
        .get(21..23)
        .is_some_and(|a| u16::from_be_bytes([a[0], a[1]]) & CONTROL != 0)
}

/// Whether a v2 record batch's CRC-32C (over attributes..end, stored at bytes 17..21) is wrong.
/// Older magics carry another checksum layout: never counted as a CRC failure here.
fn crc_mismatch(batch: &[u8]) -> bool {
    const MAGIC: usize = 16;
    if batch.len() < 21 || batch[MAGIC] != 2 {
        return false;
    }
    let stored = u32::from_be_bytes([batch[17], batch[18], batch[19], batch[20]]);
    crc32c::crc32c(&batch[21..]) != stored
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::AcknowledgeType;
    use bytes::BytesMut;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    const OWNER: Owner = Owner {
        broker: 1,
        generation: 1,
    };

    fn record(offset: i64, control: bool) -> Record {
        let mut headers = kafka_protocol::indexmap::IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from_static(b"v")),
        );
        Record {
            transactional: false,
            control,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: -1,
            timestamp: 1_000 + offset,
            key: None,
            value: Some(Bytes::from(format!("v{offset}"))),
            headers,
        }
    }

    fn batch(offsets: &[i64], compression: Compression) -> Bytes {
        let records: Vec<Record> = offsets.iter().map(|o| record(*o, false)).collect();
        encoded(&records, compression)
    }

    /// `records` as one v2 record batch.
    fn encoded(records: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn acquired(first: i64, last: i64, dc: i16) -> AcquiredRecords {
        let mut a = AcquiredRecords::default();
        a.first_offset = first;
        a.last_offset = last;
        a.delivery_count = dc;
        a
    }

    fn absorb(
        ledger: &mut Ledger,
        ranges: &[AcquiredRecords],
        bytes: Bytes,
    ) -> (Vec<ShareRecord>, Result<(), ShareError>) {
        let topic: Arc<str> = Arc::from("t");
        let mut out = Vec::new();
        let r = absorb_partition(
            ledger,
            &topic,
            0,
            OWNER,
            ranges,
            bytes,
            Instant::now(),
            &mut out,
        );
        (out, r)
    }

    fn pending(ledger: &mut Ledger) -> BTreeMap<i64, i8> {
        ledger
            .take_pending(1, 1)
            .into_iter()
            .flat_map(|(_, _, m)| m)
            .collect()
    }

    /// Records with and without keys, values and headers (a repeated header name, a null
    /// header value), in one uncompressed batch.
    fn varied_batch(compression: Compression) -> Bytes {
        let records: Vec<Record> = (0..40i64)
            .map(|i| {
                let mut r = record(100 + i, false);
                // Consecutive sequences: one batch.
                r.sequence = i as i32;
                r.timestamp = 1_700_000_000_000 + i * 37;
                r.key = (i % 3 != 0).then(|| Bytes::from(format!("key-{i}")));
                r.value =
                    (i % 7 != 0).then(|| Bytes::from(vec![b'a' + (i % 26) as u8; i as usize * 50]));
                r.headers.clear();
                for h in 0..(i % 4) {
                    r.headers.insert(
                        StrBytes::from_string(format!("h{h}")),
                        (h != 1).then(|| Bytes::from(format!("x{i}-{h}"))),
                    );
                }
                r
            })
            .collect();
        encoded(&records, compression)
    }

    /// The whole batches in `bytes`, as `absorb_partition` cuts them.
    fn batches(mut bytes: Bytes) -> Vec<Bytes> {
        let mut out = Vec::new();
        while bytes.len() >= 12 {
            let len = i32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize;
            out.push(bytes.split_to(12 + len));
        }
        out
    }

    #[test]
    fn a_batch_read_in_place_gives_what_the_decoder_gives() {
        let wanted = |offset: i64| (105..=120).contains(&offset) || offset == 139;
        let (mut compared, mut all) = (0, 0);
        let stored = batches(varied_batch(Compression::None));
        assert_eq!(stored.len(), 1);
        for bytes in stored {
            let decoded = RecordBatchDecoder::decode(&mut bytes.clone())
                .unwrap()
                .records;
            let read = acquired_in_place(&bytes, 139, wanted).expect("an uncompressed batch");
            let expected: Vec<&Record> = decoded.iter().filter(|r| wanted(r.offset)).collect();
            assert_eq!(read.len(), expected.len());
            let slice = |r: &Option<Range<usize>>| r.clone().map(|r| bytes.slice(r));
            for (got, want) in read.iter().zip(expected) {
                assert_eq!(got.offset, want.offset);
                assert_eq!(got.timestamp, want.timestamp);
                assert_eq!(slice(&got.key), want.key);
                assert_eq!(slice(&got.value), want.value);
                let headers: Vec<(String, Option<Bytes>)> = got
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            String::from_utf8(bytes[k.clone()].to_vec()).unwrap(),
                            slice(v),
                        )
                    })
                    .collect();
                let want_headers: Vec<(String, Option<Bytes>)> = want
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect();
                assert_eq!(headers, want_headers);
                compared += 1;
            }
            all += acquired_in_place(&bytes, i64::MAX, |_| true).unwrap().len();
            assert!(decoded.len() <= all);
        }
        assert_eq!(compared, 17);
        assert_eq!(all, 40);
        // The walk stops past the last acquired offset.
        let bytes = varied_batch(Compression::None);
        let read = acquired_in_place(&bytes, 110, |_| true).unwrap();
        assert_eq!(read.first().map(|r| r.offset), Some(100));
        assert_eq!(read.last().map(|r| r.offset), Some(110));
    }

    #[test]
    fn a_repeated_header_name_keeps_its_place_and_takes_the_last_value() {
        // The encoder's map cannot repeat a name: write the record by hand.
        let mut r = record(0, false);
        r.headers.clear();
        let mut bytes = encoded(&[r], Compression::None).to_vec();
        // The record: headers a=1, b=2, a=3.
        // Attributes 0, timestamp delta 0, offset delta 0, key null (-1 is zigzag 1), value
        // "v0" (2 is zigzag 4), then the headers (name and value lengths 1: zigzag 2).
        let mut record_body: Vec<u8> = vec![0, 0, 0, 1, 4, b'v', b'0', 6];
        for (k, v) in [(b'a', b'1'), (b'b', b'2'), (b'a', b'3')] {
            record_body.extend_from_slice(&[2, k, 2, v]);
        }
        bytes.truncate(61);
        bytes.push((record_body.len() as u8) << 1);
        bytes.extend_from_slice(&record_body);
        let length = (bytes.len() - 12) as i32;
        bytes[8..12].copy_from_slice(&length.to_be_bytes());
        let crc = crc32c::crc32c(&bytes[21..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        let bytes = Bytes::from(bytes);
        let decoded = RecordBatchDecoder::decode(&mut bytes.clone())
            .unwrap()
            .records;
        let read = acquired_in_place(&bytes, i64::MAX, |_| true).unwrap();
        let names: Vec<&[u8]> = read[0]
            .headers
            .iter()
            .map(|(k, _)| &bytes[k.clone()])
            .collect();
        let values: Vec<Option<&[u8]>> = read[0]
            .headers
            .iter()
            .map(|(_, v)| v.clone().map(|v| &bytes[v]))
            .collect();
        assert_eq!(names, [b"a".as_slice(), b"b".as_slice()]);
        assert_eq!(values, [Some(b"3".as_slice()), Some(b"2".as_slice())]);
        let decoder: Vec<(String, Option<Bytes>)> = decoded[0]
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        assert_eq!(
            decoder,
            [
                ("a".to_string(), Some(Bytes::from_static(b"3"))),
                ("b".to_string(), Some(Bytes::from_static(b"2")))
            ]
        );
        assert_eq!(
            read[0].value.clone().map(|v| bytes.slice(v)),
            decoded[0].value
        );
        assert_eq!(read[0].key, None);
    }

    #[test]
    fn batches_not_read_in_place_are_left_to_the_decoder() {
        assert!(acquired_in_place(&varied_batch(Compression::Gzip), i64::MAX, |_| true).is_none());
        let control = {
            let records = [record(5, true)];
            encoded(&records, Compression::None)
        };
        assert!(
            acquired_in_place(&control, i64::MAX, |_| true).is_none(),
            "control"
        );
        let one = || batches(varied_batch(Compression::None)).pop().unwrap();
        assert!(acquired_in_place(&one(), i64::MAX, |_| true).is_some());
        let mut corrupt = one().to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert!(
            acquired_in_place(&corrupt, i64::MAX, |_| true).is_none(),
            "CRC"
        );
        // A record cut short (CRC made to match): malformed.
        let mut short = one().to_vec();
        short.truncate(short.len() - 3);
        let crc = crc32c::crc32c(&short[21..]);
        short[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(
            acquired_in_place(&short, i64::MAX, |_| true).is_none(),
            "truncated"
        );
        assert!(
            acquired_in_place(&short[..40], i64::MAX, |_| true).is_none(),
            "no header"
        );
    }

    #[test]
    fn only_offsets_inside_acquired_ranges_are_delivered() {
        let mut ledger = Ledger::default();
        let (out, r) = absorb(
            &mut ledger,
            &[acquired(11, 12, 1)],
            batch(&[10, 11, 12, 13], Compression::None),
        );
        r.unwrap();
        let offsets: Vec<i64> = out.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![11, 12]);
        assert_eq!(out[0].value.as_deref(), Some(&b"v11"[..]));
        assert_eq!(
            out[0].headers,
            vec![("h".to_string(), Some(Bytes::from_static(b"v")))]
        );
        assert_eq!(out[0].timestamp, 1_011);
        assert!(pending(&mut ledger).is_empty());
    }

    #[test]
    fn acquired_offsets_without_a_record_are_acknowledged_as_gap() {
        let mut ledger = Ledger::default();
        let (out, r) = absorb(
            &mut ledger,
            &[acquired(5, 9, 1)],
            batch(&[5, 7], Compression::None),
        );
        r.unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            pending(&mut ledger),
            [(6, GAP), (8, GAP), (9, GAP)].into_iter().collect()
        );
    }

    #[test]
    fn records_resent_while_held_are_not_delivered_twice() {
        let mut ledger = Ledger::default();
        let bytes = batch(&[0, 1, 2], Compression::None);
        let (first, _) = absorb(&mut ledger, &[acquired(0, 2, 1)], bytes.clone());
        assert_eq!(first.len(), 3);
        ledger
            .acknowledge("t", 0, 1, AcknowledgeType::Accept)
            .unwrap();
        let (again, _) = absorb(&mut ledger, &[acquired(0, 2, 1)], bytes);
        assert!(again.is_empty());
        assert_eq!(pending(&mut ledger), [(1, 1)].into_iter().collect());
    }

    #[test]
    fn compressed_batches_decode_with_every_codec() {
        for c in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let mut ledger = Ledger::default();
            let (out, r) = absorb(&mut ledger, &[acquired(0, 2, 1)], batch(&[0, 1, 2], c));
            r.unwrap();
            assert_eq!(out.len(), 3, "{c:?}");
        }
    }

    #[test]
    fn a_trailing_partial_batch_is_ignored_and_its_offsets_become_gaps_only_if_acquired() {
        let mut ledger = Ledger::default();
        let mut bytes = BytesMut::from(&batch(&[0, 1], Compression::None)[..]);
        let second = batch(&[2, 3], Compression::None);
        bytes.extend_from_slice(&second[..second.len() - 5]);
        let (out, r) = absorb(&mut ledger, &[acquired(0, 1, 1)], bytes.freeze());
        r.unwrap();
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn a_corrupt_batch_inside_an_acquired_range_is_a_named_error_and_its_records_are_rejected() {
        let mut ledger = Ledger::default();
        // The encoder writes one batch per record here; the last one gets a broken CRC.
        let mut bytes = BytesMut::from(&batch(&[0, 1, 2], Compression::None)[..]);
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        let (out, r) = absorb(&mut ledger, &[acquired(0, 2, 1)], bytes.freeze());
        let offsets: Vec<i64> = out.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![0, 1]);
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("t-0")
                && msg.contains("2..=2")
                && msg.contains("Cyclic redundancy")
                && msg.contains("rejected (CRC check failed)"),
            "{msg}"
        );
        assert_eq!(pending(&mut ledger), [(2, REJECT)].into_iter().collect());
    }

    #[test]
    fn an_undecodable_batch_with_a_good_crc_is_released_loudly_not_rejected() {
        let mut ledger = Ledger::default();
        let mut bytes = BytesMut::from(&batch(&[0], Compression::None)[..]);
        // An unknown codec (7), with the CRC made right again: readable by nobody here, but
        // not corrupt.
        bytes[22] |= 0x07;
        let crc = crc32c::crc32c(&bytes[21..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(!crc_mismatch(&bytes));
        let (out, r) = absorb(&mut ledger, &[acquired(0, 0, 1)], bytes.freeze());
        assert!(out.is_empty());
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains("t-0") && msg.contains("released"), "{msg}");
        assert_eq!(pending(&mut ledger), [(0, RELEASE)].into_iter().collect());
    }

    #[test]
    fn a_control_batch_with_a_zero_crc_is_a_gap_not_an_error() {
        // The dev broker writes transaction markers with CRC 0.
        let mut ledger = Ledger::default();
        let mut buf = BytesMut::from(&encoded(&[record(4, true)], Compression::None)[..]);
        buf[17..21].copy_from_slice(&[0, 0, 0, 0]);
        let (out, r) = absorb(&mut ledger, &[acquired(4, 4, 1)], buf.freeze());
        r.expect("not corrupt: a marker");
        assert!(out.is_empty());
        assert_eq!(pending(&mut ledger), [(4, GAP)].into_iter().collect());
    }

    #[test]
    fn control_records_are_acknowledged_as_gap_not_delivered() {
        let mut ledger = Ledger::default();
        let buf = encoded(&[record(4, true)], Compression::None);
        let (out, r) = absorb(&mut ledger, &[acquired(4, 4, 1)], buf);
        r.unwrap();
        assert!(out.is_empty());
        assert_eq!(pending(&mut ledger), [(4, GAP)].into_iter().collect());
    }

    #[test]
    fn garbage_bytes_never_panic() {
        for len in 0..64usize {
            let mut ledger = Ledger::default();
            let bytes = Bytes::from((0..len).map(|i| (i * 37 % 251) as u8).collect::<Vec<_>>());
            let _ = absorb(&mut ledger, &[acquired(0, 3, 1)], bytes);
        }
    }

    fn held_and_partly_acked() -> (Ledger, SentAcks) {
        let mut ledger = Ledger::default();
        let topic: Arc<str> = Arc::from("t");
        for offset in 0..3 {
            ledger.acquire(&topic, 0, OWNER, offset, 1);
        }
        for offset in 0..2 {
            ledger
                .acknowledge("t", 0, offset, AcknowledgeType::Accept)
                .expect("held");
        }
        let sent = ledger.take_pending(1, 1);
        assert_eq!(sent.len(), 1);
        (ledger, sent)
    }

    #[test]
    fn acks_refused_by_an_epoch_error_wait_for_the_reopened_session_and_nothing_is_lost() {
        let (mut ledger, sent) = held_and_partly_acked();
        settle_after_reset(
            &mut ledger,
            1,
            &sent,
            reset_for_error(123),
            "ShareAcknowledge failed with error 123",
        );
        assert!(
            ledger.take_results().is_empty(),
            "no failure reported for acks the broker can still apply"
        );
        // Same generation: the reopened session sends them.
        assert!(ledger.has_pending(1, 1));
        assert_eq!(pending(&mut ledger), [(0, 1), (1, 1)].into_iter().collect());
        // The record not yet acknowledged is still ours.
        assert!(ledger.holds_unsettled(1, 1, "t", 0));
        ledger
            .acknowledge("t", 0, 2, AcknowledgeType::Accept)
            .expect("still held");
        assert_eq!(pending(&mut ledger), [(2, 1)].into_iter().collect());
        assert!(ledger.take_results().is_empty());
    }

    #[test]
    fn a_session_the_broker_no_longer_has_fails_its_acks_and_what_it_held() {
        for cause in [reset_for_error(122), Reset::Released] {
            let (mut ledger, sent) = held_and_partly_acked();
            settle_after_reset(&mut ledger, 1, &sent, cause, "gone");
            let results = ledger.take_results();
            assert!(
                matches!(
                    results.get(&("t".to_string(), 0)),
                    Some(Err(AckError::SessionLost { .. }))
                ),
                "{results:?}"
            );
            assert!(!ledger.holds_unsettled(1, 1, "t", 0));
            // Acknowledging what the broker released is reported, not applied.
            ledger
                .acknowledge("t", 0, 2, AcknowledgeType::Accept)
                .expect("known as lost");
            assert!(pending(&mut ledger).is_empty());
            assert!(matches!(
                ledger.take_results().get(&("t".to_string(), 0)),
                Some(Err(AckError::SessionLost { .. }))
            ));
        }
    }
}
