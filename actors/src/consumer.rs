//! ConsumerActor: owns the task's Kafka consumer. It polls while the task has credits (fewer
//! than `task.inflight.batches` batches in flight), and applies and commits the verdicts that
//! come back with each credit — so the consumer is only ever used from here, one call at a time.
//!
//! A batch counts as done only once its acknowledgements (share mode) or offsets (classic mode)
//! are committed; until then its bytes count against the tenant's in-flight bytes budget, and
//! while that budget is full no new poll starts. On [`Drain`] it stops polling, waits for the
//! batches in flight, commits, leaves the group, passes [`Finish`] down the pipeline and
//! reports the task's final event.
//!
//! Share mode: a batch whose records the sink stage gave up still failing (its target is down)
//! comes back with a time before which nothing new is fetched (`pause_fetch_until`): the pause
//! is set on the share consumer before the releases are committed, and no poll starts before
//! it ends, so no record spends a delivery waiting out its lock meanwhile
//! ([`crate::lock_retry`]).
//!
//! Nothing waits for a lock to expire when the task already knows a batch is lost: each batch
//! carries a [`BatchAck`], and one dropped unsettled anywhere in the pipeline (a panic, a
//! failed `put`, a failing task) comes back as [`Unsettled`]; the consumer keeps every batch's
//! record coordinates until it is committed, releases the records of such a batch at once
//! (share mode; classic mode reads them again and commits no offset past them), and fails the
//! task. A stop (graceful or after a failure) that is not done within
//! `task.shutdown.graceful.timeout.ms` releases whatever is still in flight the same way.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use spillway_core::{
    Ack, BatchAck, BatchOwner, Disposition, RawRecord, RecordCoordinates, Topic, TopicPartition,
};
use tracing::{error, info, warn, Instrument, Span};

use crate::converter::ConverterActor;
use crate::error::RuntimeError;
use crate::lock_retry::{LockFacts, TargetHealth};
use crate::messages::{
    Acknowledged, CloseGate, Drain, Failing, Finish, Reporter, Settled, SourceBatch, TaskEvent,
    TaskFailure, Unsettled,
};
use crate::metrics::{BatchMeta, CommitOutcome};
use crate::panic_guard::guard_future;
use crate::source::{Polled, RecordSource};
use crate::status::TaskCounters;
use crate::telemetry::{BatchStage, BatchTrace, TaskIdentity};
use crate::tenancy::{record_bytes, Debt, InflightBytes, InflightHold, Throttle};

/// Connects the task's source (on the task's own thread, so its background work lives there).
pub type SourceFactory = Box<
    dyn FnOnce() -> LocalBoxFuture<'static, Result<Box<dyn RecordSource>, RuntimeError>> + Send,
>;

pub struct ConsumerActor {
    factory: Option<SourceFactory>,
    source: Option<Box<dyn RecordSource>>,
    converter: Addr<ConverterActor>,
    task: u32,
    generation: u64,
    max_inflight: usize,
    poll_timeout: Duration,
    commit_timeout: Duration,
    delivery_attempt_limit: u16,
    counters: Arc<TaskCounters>,
    reporter: Reporter,
    /// Per batch in flight, what its commit's metrics need (record timestamps, locks).
    batch_meta: HashMap<u64, BatchMeta>,
    identity: Arc<TaskIdentity>,
    next_seq: u64,
    /// Batches between poll and commit, with their records (to release them should the batch
    /// be lost). Removed once the batch's verdicts are committed.
    batches: HashMap<u64, InFlight>,
    /// Where the batches' `BatchAck`s report a drop: this actor.
    owner: Arc<dyn BatchOwner>,
    /// Verdicts returned (or releases decided here) and not yet acknowledged and committed.
    settled: Vec<Settlement>,
    /// A poll, commit or close is running (it holds the source).
    busy: bool,
    draining: bool,
    failure: Option<String>,
    /// The tasks stopping with this one: its consumer closes once they have all committed.
    close_together: Option<Arc<CloseGate>>,
    /// The failure is for good: the task stays FAILED instead of being restarted.
    failure_for_good: bool,
    /// What the sink stage's retries need to know of the locks (lock duration, commit time).
    lock_facts: LockFacts,
    /// Share mode: the target is failing; no poll (and no fetch) before this instant.
    fetch_paused_until: Option<Instant>,
    /// A wake-up is scheduled for the end of the fetch pause.
    pause_wakeup: bool,
    /// The connector's successful puts, and their count when the pause began: a success of
    /// another task ends the pause early.
    target_health: TargetHealth,
    successes_at_pause: u64,
    /// Shared with the converter and sink stages: set once the task is going to fail.
    failing: Failing,
    /// `task.shutdown.graceful.timeout.ms`: how long a stop may take.
    shutdown_timeout: Duration,
    /// The stop's deadline is scheduled (on the first drain or failure).
    stop_scheduled: bool,
    /// A commit failed while the task was failing: close without committing again.
    commits_broken: bool,
    progressed: bool,
    finished: bool,
    /// The tenant's records/s and bytes/s budget, when it has one.
    throttle: Option<Arc<Throttle>>,
    /// What the polls so far cost and the budget has not paid yet.
    debt: Debt,
    /// A wake-up is scheduled for when the budget can pay the debt.
    throttled: bool,
    /// The tenant's in-flight bytes budget, shared with its other tasks.
    inflight_bytes: Option<Arc<InflightBytes>>,
    /// Per batch in flight, its bytes in that budget: released when the batch is committed,
    /// or when the actor is dropped (stop, kill, failure).
    held: HashMap<u64, InflightHold>,
    /// A re-check is scheduled for when the in-flight bytes budget may have room again.
    awaiting_room: bool,
    /// A poll made while batches were in flight came back empty: the next one waits for a
    /// batch to settle (or for `poll_timeout`), so that polling does not spin.
    parked: bool,
    /// When the source was last polled (or kept alive).
    last_poll: Instant,
    /// Records released without verdicts on their last allowed delivery.
    archived_on_release: ArchivedOnRelease,
}

/// Longest a poll waits while batches are in flight. The consumer is busy while it polls, so
/// a batch that settles meanwhile is committed only after the poll returns; and a share
/// source fetches more from a broker only once that broker's records are acknowledged
/// (`fetch_buffer_batches`), which its commit does.
const POLL_WHILE_IN_FLIGHT: Duration = Duration::from_millis(2);

/// How often a task paused between deliveries looks for another task's success.
const PAUSE_CHECK: Duration = Duration::from_millis(200);

/// How often a task whose tenant's in-flight bytes budget is full looks again: another task
/// of the tenant may commit meanwhile, and only this task's own commits wake it.
const INFLIGHT_RECHECK: Duration = Duration::from_millis(20);

/// How often a task whose source needs keep-alive polls ([`RecordSource::keep_alive_after`])
/// checks for one: a quarter of that time, within these limits.
const KEEP_ALIVE_CHECK_MIN: Duration = Duration::from_millis(25);
const KEEP_ALIVE_CHECK_MAX: Duration = Duration::from_secs(1);

/// What a ConsumerActor needs to run.
pub struct ConsumerSetup {
    pub factory: SourceFactory,
    pub converter: Addr<ConverterActor>,
    pub task: u32,
    pub generation: u64,
    pub max_inflight: usize,
    pub poll_timeout: Duration,
    pub commit_timeout: Duration,
    /// Share mode: the broker's delivery attempt limit, to tell releases it archives.
    pub delivery_attempt_limit: u16,
    /// `task.shutdown.graceful.timeout.ms`.
    pub shutdown_timeout: Duration,
    pub counters: Arc<TaskCounters>,
    pub reporter: Reporter,
    pub throttle: Option<Arc<Throttle>>,
    pub inflight_bytes: Option<Arc<InflightBytes>>,
    pub identity: Arc<TaskIdentity>,
    pub failing: Failing,
    /// This actor's address as its batches' owner ([`ConsumerActor::batch_owner`]).
    pub owner: Arc<dyn BatchOwner>,
    /// Shared with the sink stage: the lock duration and commit time it retries within.
    pub lock_facts: LockFacts,
    /// Shared by the connector's tasks.
    pub target_health: TargetHealth,
}

/// A batch's verdicts as the consumer applies and commits them.
struct Settlement {
    seq: u64,
    acks: Vec<Ack>,
    fail_task: Option<String>,
    fail_for_good: bool,
    trace: BatchTrace,
    start_offsets: BTreeMap<TopicPartition, i64>,
    pause_fetch_until: Option<Instant>,
}

/// One batch between poll and commit.
struct InFlight {
    records: BatchRecords,
    /// Its verdicts (or releases) wait in `settled`: a later report on it is stale.
    queued: bool,
    /// Share mode: its records on their last allowed delivery, named for the log and the
    /// task's trace should the batch be released without verdicts (the broker archives them).
    last_deliveries: Vec<String>,
}

/// Records of `records` on their last allowed delivery, as `topic-partition@offset (delivery
/// n of limit)`; none in classic mode (no delivery counts) or without a limit.
fn last_deliveries(records: &[RawRecord], limit: u16) -> Vec<String> {
    if limit == 0 {
        return Vec::new();
    }
    records
        .iter()
        .filter_map(|r| {
            let count = r.delivery_count.filter(|c| *c >= limit)?;
            Some(format!(
                "{}-{}@{} (delivery {count} of {limit})",
                r.topic, r.partition, r.offset
            ))
        })
        .collect()
}

/// Records released without verdicts on their last allowed delivery, and why: the broker
/// archives them, so the task's final status names them.
#[derive(Default)]
struct ArchivedOnRelease {
    records: Vec<String>,
    reason: Option<String>,
}

impl ArchivedOnRelease {
    /// The sentence for the task's trace; `None` when there were none.
    fn describe(&self) -> Option<String> {
        const LISTED: usize = 10;
        if self.records.is_empty() {
            return None;
        }
        let mut listed = self.records[..self.records.len().min(LISTED)].join(", ");
        if self.records.len() > LISTED {
            listed.push_str(&format!(" and {} more", self.records.len() - LISTED));
        }
        Some(format!(
            "{} record(s) on their last allowed delivery (group.share.delivery.count.limit) were \
             released without a verdict ({}); the broker archives them instead of delivering \
             them again, so they were neither written nor dead-lettered: {listed}",
            self.records.len(),
            self.reason.as_deref().unwrap_or("the batch was lost")
        ))
    }
}

/// A batch's record coordinates, compactly (a topic name per topic, not per record).
#[derive(Default)]
struct BatchRecords {
    topics: Vec<Topic>,
    records: Vec<(u32, i32, i64)>,
}

impl BatchRecords {
    fn of(records: &[RawRecord]) -> Self {
        let mut out = BatchRecords {
            topics: Vec::new(),
            records: Vec::with_capacity(records.len()),
        };
        for r in records {
            let topic = match out.topics.iter().position(|t| *t == r.topic) {
                Some(i) => i,
                None => {
                    out.topics.push(r.topic.clone());
                    out.topics.len() - 1
                }
            };
            out.records.push((topic as u32, r.partition, r.offset));
        }
        out
    }

    /// A RELEASE of every record, marked as released because the batch was lost.
    fn releases(&self) -> Vec<Ack> {
        self.records
            .iter()
            .map(|(topic, partition, offset)| Ack {
                record: RecordCoordinates::new(
                    self.topics[*topic as usize].clone(),
                    *partition,
                    *offset,
                ),
                disposition: Disposition::Release,
                implicit: true,
            })
            .collect()
    }
}

/// Tells the consumer of a batch dropped unsettled (a `BatchAck`'s drop, on any thread).
struct ConsumerOwner(Addr<ConsumerActor>);

impl ConsumerActor {
    /// The owner of the batches the actor at `addr` polls.
    pub fn batch_owner(addr: Addr<ConsumerActor>) -> Arc<dyn BatchOwner> {
        Arc::new(ConsumerOwner(addr))
    }
}

impl BatchOwner for ConsumerOwner {
    fn unsettled(&self, batch: u64, reason: String) {
        self.0.do_send(Unsettled { seq: batch, reason });
    }
}

impl ConsumerActor {
    pub fn new(s: ConsumerSetup) -> Self {
        s.counters.metrics.task_starting();
        ConsumerActor {
            factory: Some(s.factory),
            source: None,
            converter: s.converter,
            task: s.task,
            generation: s.generation,
            max_inflight: s.max_inflight.max(1),
            poll_timeout: s.poll_timeout,
            commit_timeout: s.commit_timeout,
            delivery_attempt_limit: s.delivery_attempt_limit,
            counters: s.counters,
            reporter: s.reporter,
            batch_meta: HashMap::new(),
            identity: s.identity,
            next_seq: 0,
            batches: HashMap::new(),
            owner: s.owner,
            settled: Vec::new(),
            busy: false,
            draining: false,
            failure: None,
            close_together: None,
            failure_for_good: false,
            lock_facts: s.lock_facts,
            fetch_paused_until: None,
            pause_wakeup: false,
            target_health: s.target_health,
            successes_at_pause: 0,
            failing: s.failing,
            shutdown_timeout: s.shutdown_timeout,
            stop_scheduled: false,
            commits_broken: false,
            progressed: false,
            finished: false,
            throttle: s.throttle,
            debt: Debt::default(),
            throttled: false,
            inflight_bytes: s.inflight_bytes,
            held: HashMap::new(),
            awaiting_room: false,
            parked: false,
            last_poll: Instant::now(),
            archived_on_release: ArchivedOnRelease::default(),
        }
    }

    /// The task cannot go on: stop polling, release what is in flight (the stages drop the
    /// batches they still get), commit, leave the group, then report `Failed` with the first
    /// failure's trace.
    fn fail(&mut self, ctx: &mut Context<Self>, trace: String) {
        self.fail_as(ctx, trace, false);
    }

    /// Like [`fail`](Self::fail); `for_good`: a restart cannot help, the task stays FAILED.
    fn fail_as(&mut self, ctx: &mut Context<Self>, trace: String, for_good: bool) {
        if self.failure.is_none() {
            self.failure_for_good = for_good;
        }
        self.failing.set();
        if self.failure.is_none() {
            warn!(task = self.task, trace = %trace, "task failing; releasing its records in flight");
            self.failure = Some(trace);
        }
        self.schedule_stop_deadline(ctx);
        self.step(ctx);
    }

    /// The source failed (a poll or commit error, or a panic in it). A broker the egress
    /// policy refused stays refused: the task stays FAILED, no restart loop.
    fn fail_now(&mut self, ctx: &mut Context<Self>, error: RuntimeError) {
        let for_good = matches!(error, RuntimeError::Egress(_));
        self.fail_as(ctx, error.to_string(), for_good);
    }

    /// A stop that is not done by its deadline releases whatever is still in flight, a little
    /// before the connector cuts the task off, so that the releases can still be committed.
    fn schedule_stop_deadline(&mut self, ctx: &mut Context<Self>) {
        if self.stop_scheduled {
            return;
        }
        self.stop_scheduled = true;
        let reserve = (self.shutdown_timeout / 5).min(Duration::from_secs(1));
        ctx.run_later(self.shutdown_timeout - reserve, |act, ctx| {
            if act.finished {
                return;
            }
            let pending: Vec<u64> = act
                .batches
                .iter()
                .filter(|(_, b)| !b.queued)
                .map(|(seq, _)| *seq)
                .collect();
            if pending.is_empty() {
                return;
            }
            let mut released = 0;
            for seq in pending {
                released += act
                    .release_batch(
                        seq,
                        "the task did not stop within task.shutdown.graceful.timeout.ms",
                    )
                    .unwrap_or(0);
            }
            warn!(task = act.task, released, timeout_ms = act.shutdown_timeout.as_millis() as u64, "the task did not stop within task.shutdown.graceful.timeout.ms; releasing its records in flight");
            act.failing.set();
            act.step(ctx);
        });
    }

    /// Share mode: records fetched ahead that the stopping task never got are released by
    /// the close; those on their last allowed delivery are archived by the broker, so they are
    /// named (ERROR, the archived count, the task's final trace) like a lost batch's.
    fn name_unpolled_last_deliveries(&mut self, source: &mut dyn RecordSource) {
        let limit = self.delivery_attempt_limit;
        let unpolled = source.take_unpolled();
        if limit == 0 || unpolled.is_empty() {
            return;
        }
        let at_limit: Vec<String> = unpolled
            .iter()
            .filter(|(_, count)| *count >= limit)
            .map(|(c, count)| format!("{c} (delivery {count} of {limit})"))
            .collect();
        info!(
            task = self.task,
            records = unpolled.len(),
            "records fetched ahead and not handed to the task are released by the close"
        );
        if at_limit.is_empty() {
            return;
        }
        let why =
            "fetched ahead but not handed to the task before it stopped; the close releases them";
        error!(task = self.task, records = %at_limit.join(", "), reason = why, "releasing records on their last allowed delivery without a verdict: the broker archives them");
        TaskCounters::add(&self.counters.metrics.archived_by_limit, at_limit.len());
        self.archived_on_release.records.extend(at_limit);
        self.archived_on_release
            .reason
            .get_or_insert_with(|| why.to_owned());
    }

    /// Queues a RELEASE of every record of batch `seq`, released because `why`; returns how
    /// many records that is, or `None` when the batch is not in flight any more or its
    /// verdicts are queued already. Records on their last allowed delivery are named in the
    /// log now and in the task's final trace: the broker archives them.
    fn release_batch(&mut self, seq: u64, why: &str) -> Option<usize> {
        let batch = self.batches.get_mut(&seq)?;
        if batch.queued {
            return None;
        }
        batch.queued = true;
        if !batch.last_deliveries.is_empty() {
            error!(task = self.task, batch = seq, records = %batch.last_deliveries.join(", "), reason = %why, "releasing records on their last allowed delivery without a verdict: the broker archives them");
            self.archived_on_release
                .records
                .extend(batch.last_deliveries.iter().cloned());
            self.archived_on_release
                .reason
                .get_or_insert_with(|| why.to_owned());
        }
        let acks = batch.records.releases();
        let n = acks.len();
        self.settled.push(Settlement {
            seq,
            acks,
            fail_task: None,
            fail_for_good: false,
            trace: BatchTrace::default(),
            start_offsets: BTreeMap::new(),
            pause_fetch_until: None,
        });
        self.parked = false;
        Some(n)
    }

    /// Does the next thing: commit returned credits, else close when stopping, else poll.
    fn step(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.finished {
            return;
        }
        let stopping = self.draining || self.failure.is_some();
        if self.source.is_none() {
            // Never connected (its connection failed): nothing to commit or close.
            if stopping {
                self.finish(ctx);
            }
            return;
        }
        if !self.settled.is_empty() && !self.commits_broken {
            self.commit_step(ctx);
        } else if stopping {
            if self.batches.is_empty() || self.commits_broken {
                self.close_step(ctx);
            }
        } else if self.batches.len() < self.max_inflight
            && !self.parked
            && !self.fetch_paused(ctx)
            && !self.inflight_bytes_full(ctx)
            && !self.over_budget(ctx)
        {
            self.poll_step(ctx);
        }
    }

    /// True while the sink stage asked for a pause of fetching (its target is failing); then
    /// a wake-up is scheduled for its end.
    fn fetch_paused(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(until) = self.fetch_paused_until else {
            return false;
        };
        let now = Instant::now();
        let target_back = self.target_health.successes() != self.successes_at_pause;
        if now >= until || target_back {
            if target_back && now < until {
                info!(
                    task = self.task,
                    "another task's put succeeded: the target is back, fetching again"
                );
            }
            self.fetch_paused_until = None;
            if let Some(source) = self.source.as_mut() {
                source.pause_fetching(None);
            }
            return false;
        }
        if !self.pause_wakeup {
            self.pause_wakeup = true;
            // Looks again at least every PAUSE_CHECK for another task's success.
            ctx.run_later((until - now).min(PAUSE_CHECK), |act, ctx| {
                act.pause_wakeup = false;
                act.step(ctx);
            });
        }
        true
    }

    /// True while the tenant's budget has not paid for the records already polled; then a
    /// wake-up is scheduled for when it can. Commits go on meanwhile: only polling waits.
    fn over_budget(&mut self, ctx: &mut Context<Self>) -> bool {
        if self.throttled {
            return true;
        }
        let Some(throttle) = &self.throttle else {
            return false;
        };
        match throttle.pay(&mut self.debt) {
            None => false,
            Some(wait) => {
                self.throttled = true;
                ctx.run_later(wait, |act, ctx| {
                    act.throttled = false;
                    act.step(ctx);
                });
                true
            }
        }
    }

    /// True while the tenant's tasks hold at least its `inflight.bytes` in flight; then a
    /// re-check is scheduled. Commits go on meanwhile (each one re-checks too): only polling
    /// waits, so records are held back at the broker, never dropped.
    fn inflight_bytes_full(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(budget) = &self.inflight_bytes else {
            return false;
        };
        if budget.has_room() {
            return false;
        }
        if !self.awaiting_room {
            self.awaiting_room = true;
            ctx.run_later(INFLIGHT_RECHECK, |act, ctx| {
                act.awaiting_room = false;
                act.step(ctx);
            });
        }
        true
    }

    fn poll_step(&mut self, ctx: &mut Context<Self>) {
        let Some(mut source) = self.source.take() else {
            return;
        };
        self.busy = true;
        let in_flight = !self.batches.is_empty();
        let timeout = if in_flight {
            self.poll_timeout.min(POLL_WHILE_IN_FLIGHT)
        } else {
            self.poll_timeout
        };
        let started = SystemTime::now();
        self.last_poll = Instant::now();
        let fut = async move {
            let result = guard_future(source.poll(timeout)).await;
            (source, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(source, result), act, ctx| {
            let result = result.unwrap_or_else(|panic| {
                Err(RuntimeError::Source(format!("the consumer's poll {panic}")))
            });
            act.lock_facts.set_lock_duration(source.lock_duration());
            if let Some(n) = source.partition_count() {
                act.counters
                    .metrics
                    .partitions
                    .store(n as u64, Ordering::Relaxed);
            }
            act.source = Some(source);
            act.busy = false;
            match result {
                Err(e) => act.fail_now(ctx, e),
                Ok(polled) => {
                    // A batch that settled during this poll is committed next, and its
                    // commit lets the poll after it go ahead: no need to park then.
                    if in_flight
                        && act.settled.is_empty()
                        && polled.records.is_empty()
                        && polled.changes.is_empty()
                    {
                        act.park(ctx);
                    }
                    act.dispatch(polled, started);
                    act.step(ctx);
                }
            }
        }));
    }

    /// Sends what a poll brought down the pipeline as one batch (taking a credit).
    fn dispatch(&mut self, mut polled: Polled, started: SystemTime) {
        if !polled.records.is_empty() || !polled.changes.is_empty() {
            TaskCounters::add(&self.counters.read, polled.records.len());
            let bytes: u64 = polled.records.iter().map(record_bytes).sum();
            if self.throttle.is_some() {
                self.debt.records += polled.records.len() as u64;
                self.debt.bytes += bytes;
            }
            self.next_seq += 1;
            let ack = BatchAck::new(self.next_seq, Arc::clone(&self.owner));
            self.batches.insert(
                self.next_seq,
                InFlight {
                    records: BatchRecords::of(&polled.records),
                    queued: false,
                    last_deliveries: last_deliveries(&polled.records, self.delivery_attempt_limit),
                },
            );
            if let Some(budget) = &self.inflight_bytes {
                self.held.insert(self.next_seq, budget.hold(bytes));
            }
            let deadlines = std::mem::take(&mut polled.lock_deadlines);
            let meta = self.counters.metrics.polled(&polled.records, deadlines);
            self.batch_meta.insert(self.next_seq, meta);
            let trace = BatchTrace::new(&self.identity, self.next_seq, &polled.records, started);
            self.converter.do_send(SourceBatch {
                ack,
                changes: polled.changes,
                records: polled.records,
                trace,
                group: polled.group,
            });
        }
    }

    /// Classic mode: while the task cannot take records (every batch it may hold is in
    /// flight, behind a put being retried, or its tenant's budget is spent), the consumer must
    /// still poll within librdkafka's `max.poll.interval.ms` or it is dropped from the group
    /// and its partitions move. After the source's `keep_alive_after` without a poll, serve
    /// the group with its partitions paused, as Connect does.
    fn keep_alive_if_idle(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.finished || self.draining || self.failure.is_some() {
            return;
        }
        let due = self
            .source
            .as_ref()
            .and_then(|source| source.keep_alive_after())
            .is_some_and(|after| self.last_poll.elapsed() >= after);
        if !due {
            return;
        }
        let Some(mut source) = self.source.take() else {
            return;
        };
        self.busy = true;
        self.last_poll = Instant::now();
        let started = SystemTime::now();
        let fut = async move {
            let result = source.keep_alive().await;
            (source, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(source, result), act, ctx| {
            act.source = Some(source);
            act.busy = false;
            match result {
                Err(e) => act.fail_now(ctx, e),
                Ok(polled) => {
                    act.dispatch(polled, started);
                    act.step(ctx);
                }
            }
        }));
    }

    /// No poll until a batch settles, or `poll_timeout` at the latest.
    fn park(&mut self, ctx: &mut Context<Self>) {
        self.parked = true;
        ctx.run_later(self.poll_timeout, |act, ctx| {
            act.parked = false;
            act.step(ctx);
        });
    }

    fn commit_step(&mut self, ctx: &mut Context<Self>) {
        let Some(mut source) = self.source.take() else {
            return;
        };
        let mut batches = std::mem::take(&mut self.settled);
        // The verdicts move out of their batches into one list (no copy per record); each
        // batch's share of it is found again by its length.
        let ack_counts: Vec<usize> = batches.iter().map(|b| b.acks.len()).collect();
        let mut acks: Vec<Ack> = Vec::with_capacity(ack_counts.iter().sum());
        for b in &mut batches {
            acks.append(&mut b.acks);
        }
        let failure = batches
            .iter()
            .find_map(|b| b.fail_task.clone().map(|trace| (trace, b.fail_for_good)));
        // The target is failing: no new records until its next attempt (set before the
        // commit, whose acknowledgement would otherwise be followed by a fetch at once).
        if let Some(until) = batches.iter().filter_map(|b| b.pause_fetch_until).max() {
            if self.failure.is_none() && !self.draining {
                source.pause_fetching(Some(until));
                self.fetch_paused_until = Some(until);
                self.successes_at_pause = self.target_health.successes();
            }
        }
        let start_offsets: BTreeMap<TopicPartition, i64> = batches
            .iter()
            .flat_map(|b| b.start_offsets.iter().map(|(tp, o)| (tp.clone(), *o)))
            .collect();
        let credits = batches.len();
        let counters = Arc::clone(&self.counters);
        self.busy = true;
        let timeout = self.commit_timeout;
        let metas: Vec<Option<BatchMeta>> = batches
            .iter()
            .map(|b| self.batch_meta.remove(&b.seq))
            .collect();
        // One commit span per batch; they end together when the commit returns.
        let spans: Vec<Span> = batches
            .iter()
            .map(|b| b.trace.span(BatchStage::Commit))
            .collect();
        let current = match spans.as_slice() {
            [only] => only.clone(),
            _ => Span::none(),
        };
        let fut = async move {
            let started = Instant::now();
            let result = guard_future(async {
                match source
                    .start_from(&start_offsets)
                    .and_then(|()| source.settle(&acks))
                {
                    Ok(()) => source.commit(timeout).await,
                    Err(e) => Err(e),
                }
            })
            .await
            .unwrap_or_else(|panic| {
                Err(RuntimeError::Source(format!(
                    "the consumer's commit {panic}"
                )))
            });
            (source, acks, result, started, started.elapsed())
        }
        .instrument(current);
        let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
        ctx.spawn(fut.into_actor(self).map(move |(source, acks, result, started, elapsed), act, ctx| {
            drop(spans);
            act.source = Some(source);
            act.busy = false;
            act.parked = false;
            act.lock_facts.set_commit_time(elapsed);
            // Done with, committed or not (what was not is redelivered by the broker).
            for seq in &seqs {
                act.held.remove(seq);
                act.batches.remove(seq);
            }
            match result {
                Err(e) => {
                    // Releases would fail the same way: close without committing again.
                    act.commits_broken = true;
                    return act.fail_now(ctx, e);
                }
                Ok(mut committed) => {
                    for failure in &committed.failures {
                        warn!(task = act.task, failure = %failure, "commit not applied; records will be redelivered");
                    }
                    TaskCounters::add(&counters.ack_failures, committed.unapplied.len());
                    if !committed.accepted.is_empty() {
                        // Behind every batch already sent, on the same path, to the sink task.
                        act.converter.do_send(Acknowledged {
                            records: std::mem::take(&mut committed.accepted),
                        });
                    }
                    count(&counters, &acks, &committed.unapplied);
                    let mut rest = acks.as_slice();
                    let per_batch: Vec<(&[Ack], Option<BatchMeta>)> = ack_counts
                        .iter()
                        .map(|&n| {
                            let (batch, after) = rest.split_at(n);
                            rest = after;
                            batch
                        })
                        .zip(metas)
                        .collect();
                    counters.metrics.committed(
                        &per_batch,
                        &CommitOutcome {
                            started,
                            elapsed,
                            all_applied: committed.failures.is_empty()
                                && committed.unapplied.is_empty(),
                            unapplied: &committed.unapplied,
                            expired: &committed.expired,
                            delivery_attempt_limit: act.delivery_attempt_limit,
                        },
                    );
                    if committed.failures.is_empty() {
                        TaskCounters::add(&counters.committed_batches, credits);
                    }
                    // Releases are no progress (of a lost batch, or of one a task-level error
                    // gave back): a task failing on every batch must still run out of
                    // restarts, with its backoff growing.
                    if !act.progressed
                        && acks
                            .iter()
                            .any(|a| !a.implicit && a.disposition != Disposition::Release)
                        && committed.failures.is_empty()
                    {
                        act.progressed = true;
                        (act.reporter)(TaskEvent::Progress {
                            task: act.task,
                            generation: act.generation,
                        });
                    }
                }
            }
            match failure {
                // errors.tolerance=none: this batch is committed; the task fails now.
                Some((trace, for_good)) => act.fail_as(ctx, trace, for_good),
                None => act.step(ctx),
            }
        }));
    }

    /// Commits what is settled and leaves the group (bounded by the stop's time), then
    /// finishes the task.
    fn close_step(&mut self, ctx: &mut Context<Self>) {
        let Some(mut source) = self.source.take() else {
            return;
        };
        self.name_unpolled_last_deliveries(source.as_mut());
        self.busy = true;
        let limit = self.shutdown_timeout.max(MIN_STOP_WAIT);
        // Everything settled is committed by now; a failing task does not hold the others.
        let gate = self.close_together.take();
        let wait = limit / 2;
        let fut = async move {
            if let Some(gate) = gate {
                gate.arrive_and_wait(wait).await;
            }
            tokio::time::timeout(limit, guard_future(source.close())).await
        };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            act.busy = false;
            match result {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => warn!(task = act.task, error = %e, "closing the consumer failed"),
                Ok(Err(panic)) => warn!(task = act.task, "closing the consumer {panic}"),
                Err(_) => warn!(
                    task = act.task,
                    limit_ms = limit.as_millis() as u64,
                    "closing the consumer timed out"
                ),
            }
            act.finish(ctx);
        }));
    }

    /// Closes and stops the sink task down the pipeline, then reports the task's final event
    /// (`Failed` with the first failure's trace, else `Stopped`) and stops.
    fn finish(&mut self, ctx: &mut Context<Self>) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.busy = true;
        let limit = self.shutdown_timeout.max(MIN_STOP_WAIT);
        let finished = self.converter.send(Finish);
        let fut = async move { tokio::time::timeout(limit, finished).await };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            let closing_failure = match result {
                Ok(Ok(failure)) => failure,
                Ok(Err(_)) => Some("the task's pipeline stopped before it was finished".to_owned()),
                Err(_) => {
                    warn!(
                        task = act.task,
                        limit_ms = limit.as_millis() as u64,
                        "the sink task did not close and stop in time"
                    );
                    None
                }
            };
            let mut failure = act.failure.take().or(closing_failure);
            // Records the broker archives are named in a FAILED status, never let go silently
            // (a stop past its deadline fails the task for this alone).
            if let Some(archived) = act.archived_on_release.describe() {
                failure = Some(match failure {
                    Some(trace) => format!("{trace}. {archived}"),
                    None => archived,
                });
            }
            let event = match failure {
                Some(trace) => TaskEvent::Failed {
                    task: act.task,
                    generation: act.generation,
                    trace,
                    for_good: act.failure_for_good,
                },
                None => TaskEvent::Stopped {
                    task: act.task,
                    generation: act.generation,
                },
            };
            (act.reporter)(event);
            ctx.stop();
        }));
    }
}

/// The least time a stop's close and finish steps get, however short the graceful timeout.
const MIN_STOP_WAIT: Duration = Duration::from_millis(500);

/// Counts the verdicts that took effect.
fn count(counters: &TaskCounters, acks: &[Ack], unapplied: &[RecordCoordinates]) {
    let unapplied: HashSet<&RecordCoordinates> = unapplied.iter().collect();
    for ack in acks.iter().filter(|a| !unapplied.contains(&a.record)) {
        if ack.implicit {
            TaskCounters::add(&counters.metrics.released_unsettled, 1);
        }
        let counter = match ack.disposition {
            Disposition::Accept => &counters.accepted,
            Disposition::Release => &counters.released,
            Disposition::Reject { .. } => &counters.rejected,
        };
        TaskCounters::add(counter, 1);
    }
}

impl Actor for ConsumerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(factory) = self.factory.take() else {
            return;
        };
        self.busy = true;
        ctx.spawn(factory().into_actor(self).map(|result, act, ctx| {
            act.busy = false;
            match result {
                Ok(source) => {
                    act.lock_facts.set_extension(source.lock_extension());
                    info!(
                        generation = act.generation,
                        "task started: its consumer is connected"
                    );
                    // Only a source that needs keep-alive polls gets a timer for them.
                    if let Some(after) = source.keep_alive_after() {
                        let every = (after / 4).clamp(KEEP_ALIVE_CHECK_MIN, KEEP_ALIVE_CHECK_MAX);
                        ctx.run_interval(every, |act, ctx| act.keep_alive_if_idle(ctx));
                    }
                    act.source = Some(source);
                    act.last_poll = Instant::now();
                    act.step(ctx);
                }
                Err(e) => act.fail_now(ctx, e),
            }
        }));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // A stopped task holds nothing in flight any more: give its bytes back now rather
        // than when the actor is dropped.
        self.held.clear();
    }
}

impl Handler<Settled> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: Settled, ctx: &mut Context<Self>) {
        let seq = msg.ack.settle();
        match self.batches.get_mut(&seq) {
            // Released meanwhile (the stop's deadline): the releases stand.
            None => return,
            Some(batch) if batch.queued => return,
            Some(batch) => batch.queued = true,
        }
        self.settled.push(Settlement {
            seq,
            acks: msg.acks,
            fail_task: msg.fail_task,
            fail_for_good: msg.fail_for_good,
            trace: msg.trace,
            start_offsets: msg.start_offsets,
            pause_fetch_until: msg.pause_fetch_until,
        });
        self.parked = false;
        self.step(ctx);
    }
}

impl Handler<Unsettled> for ConsumerActor {
    type Result = ();

    /// A batch was lost in the pipeline: its records are released now, not when their locks
    /// run out, and the task fails with the reason.
    fn handle(&mut self, msg: Unsettled, ctx: &mut Context<Self>) {
        let Some(released) = self.release_batch(msg.seq, &msg.reason) else {
            return;
        };
        warn!(task = self.task, batch = msg.seq, records = released, reason = %msg.reason, "batch dropped before its verdicts were decided; releasing its records");
        self.fail(ctx, msg.reason);
    }
}

impl Handler<TaskFailure> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: TaskFailure, ctx: &mut Context<Self>) {
        self.fail(ctx, msg.0);
    }
}

impl Handler<Drain> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) {
        self.draining = true;
        if msg.together.is_some() {
            self.close_together = msg.together;
        }
        self.schedule_stop_deadline(ctx);
        self.step(ctx);
    }
}
