//! ConsumerActor: the first and the last stage of a task's pipeline, because it owns the
//! task's Kafka consumer and only it touches it (a share consumer's acknowledgements ride on its
//! next fetch, a classic consumer commits what it polled):
//!
//! - [`poll`]: polls while the task has credits (fewer than `task.inflight.batches` batches in
//!   flight), its tenant's budgets allow and no fetch pause holds, and sends each poll down the
//!   pipeline as one [`SourceBatch`];
//! - [`acknowledge`]: the verdicts that come back with each credit ([`Settled`]) are
//!   acknowledged (share mode) or their offsets committed (classic mode); a batch lost on the way
//!   ([`Unsettled`]) is released at once;
//! - [`stop`]: on [`Drain`] or a failure, no new poll; what is in flight is committed or
//!   released, the consumer leaves the group, [`Finish`] goes down the pipeline and the task's
//!   final event is reported.
//!
//! What the actor may do next is its [`Phase`] plus whether its source is free
//! ([`SourceSlot`]): [`ConsumerActor::step`] reads both.
//!
//! A batch counts as done only once its acknowledgements (share mode) or offsets (classic mode)
//! are committed; until then its bytes count against the tenant's in-flight bytes budget, and
//! while that budget is full no new poll starts.
//!
//! Share mode: a batch whose records the sink stage gave up still failing (its target is down)
//! comes back with a time before which nothing new is fetched (`pause_fetch_until`): the pause
//! is set on the share consumer before the releases are committed, and no poll starts before
//! it ends ([`Phase::FetchPaused`]), so no record spends a delivery waiting out its lock
//! meanwhile ([`crate::lock_retry`]).
//!
//! Nothing waits for a lock to expire when the task already knows a batch is lost: each batch
//! carries a [`BatchAck`], and one dropped unsettled anywhere in the pipeline (a panic, a
//! failed `put`, a failing task) comes back as [`Unsettled`]; the consumer keeps every batch's
//! record coordinates until it is committed, releases the records of such a batch at once
//! (share mode; classic mode reads them again and commits no offset past them), and fails the
//! task. A stop (graceful or after a failure) that is not done within
//! `task.shutdown.graceful.timeout.ms` releases whatever is still in flight the same way.

mod acknowledge;
mod poll;
mod stop;

use acknowledge::{BatchRecords, InFlight, Settlement};
use stop::ArchivedOnRelease;

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
    source: SourceSlot,
    phase: Phase,
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
    /// The tasks stopping with this one: its consumer closes once they have all committed.
    close_together: Option<Arc<CloseGate>>,
    /// What the sink stage's retries need to know of the locks (lock duration, commit time).
    lock_facts: LockFacts,
    /// The connector's successful puts: a success of another task ends a fetch pause early.
    target_health: TargetHealth,
    /// Shared with the converter and sink stages: set once the task is going to fail.
    failing: Failing,
    /// `task.shutdown.graceful.timeout.ms`: how long a stop may take.
    shutdown_timeout: Duration,
    /// The stop's deadline is scheduled (on the first drain or failure).
    stop_scheduled: bool,
    /// A commit failed while the task was failing: close without committing again.
    commits_broken: bool,
    progressed: bool,
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

/// Where the task is in its life; [`ConsumerActor::step`] reads it to choose what to do next.
enum Phase {
    /// Polling while credits, the tenant's budgets and the pipeline allow.
    Running,
    /// Share mode, still running: the sink stage's target is failing, so nothing is fetched
    /// before `until`, unless another task of the connector succeeds first (its successful puts
    /// no longer number `successes_at_pause`).
    FetchPaused {
        until: Instant,
        successes_at_pause: u64,
        /// A wake-up is scheduled to look again.
        wakeup_scheduled: bool,
    },
    /// A stop was asked: no new poll; the batches in flight are committed as they come back,
    /// then the consumer leaves the group and the task reports STOPPED.
    Draining,
    /// The task cannot go on: it stops as when draining (the stages drop what they still get,
    /// which releases it) and reports FAILED with `trace`; `for_good`: no restart.
    Failing { trace: String, for_good: bool },
    /// The consumer is closed or never connected; the sink task is being closed down the
    /// pipeline and the final event follows. A failure reported meanwhile still counts.
    Finishing { failure: Option<(String, bool)> },
}

impl Phase {
    /// Polling may go on (perhaps after a pause).
    fn running(&self) -> bool {
        matches!(self, Phase::Running | Phase::FetchPaused { .. })
    }

    /// Draining or failing: commit what comes back, then close.
    fn stopping(&self) -> bool {
        matches!(self, Phase::Draining | Phase::Failing { .. })
    }
}

/// The task's source and whether a call on it is running: the consumer is used from one place,
/// one call at a time.
enum SourceSlot {
    /// Its factory is connecting it.
    Connecting,
    /// Connected and free for the next poll, commit or close.
    Idle(Box<dyn RecordSource>),
    /// A poll, commit or close holds it.
    InUse,
    /// Its connection failed, or it is closed.
    Absent,
}

impl SourceSlot {
    /// The source, for a call that gives it back with [`SourceSlot::Idle`]; `None` when it is
    /// not free.
    fn take(&mut self) -> Option<Box<dyn RecordSource>> {
        match std::mem::replace(self, SourceSlot::InUse) {
            SourceSlot::Idle(source) => Some(source),
            other => {
                *self = other;
                None
            }
        }
    }

    fn idle_mut(&mut self) -> Option<&mut Box<dyn RecordSource>> {
        match self {
            SourceSlot::Idle(source) => Some(source),
            _ => None,
        }
    }
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

impl ConsumerActor {
    pub fn new(s: ConsumerSetup) -> Self {
        s.counters.metrics.task_starting();
        ConsumerActor {
            factory: Some(s.factory),
            source: SourceSlot::Connecting,
            phase: Phase::Running,
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
            close_together: None,
            lock_facts: s.lock_facts,
            target_health: s.target_health,
            failing: s.failing,
            shutdown_timeout: s.shutdown_timeout,
            stop_scheduled: false,
            commits_broken: false,
            progressed: false,
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

    /// Does the next thing: commit returned credits, else close when stopping, else poll.
    pub(super) fn step(&mut self, ctx: &mut Context<Self>) {
        if matches!(self.phase, Phase::Finishing { .. }) {
            return;
        }
        let stopping = self.phase.stopping();
        match self.source {
            SourceSlot::Connecting | SourceSlot::InUse => return,
            SourceSlot::Absent => {
                // Never connected (its connection failed): nothing to commit or close.
                if stopping {
                    self.finish(ctx);
                }
                return;
            }
            SourceSlot::Idle(_) => {}
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
}

impl Actor for ConsumerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(factory) = self.factory.take() else {
            return;
        };
        ctx.spawn(factory().into_actor(self).map(|result, act, ctx| {
            act.source = SourceSlot::Absent;
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
                    act.source = SourceSlot::Idle(source);
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

impl Handler<TaskFailure> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: TaskFailure, ctx: &mut Context<Self>) {
        self.fail(ctx, msg.0);
    }
}

impl Handler<Drain> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) {
        if self.phase.running() {
            self.phase = Phase::Draining;
        }
        if msg.together.is_some() {
            self.close_together = msg.together;
        }
        self.schedule_stop_deadline(ctx);
        self.step(ctx);
    }
}
