//! ConsumerActor: the first stage of a task's pipeline. It connects the task's Kafka client and
//! polls it while the task has credits (fewer than `task.inflight.batches` batches between poll
//! and commit), its tenant's budgets have room and no fetch pause holds; each poll goes down the
//! pipeline as one [`SourceBatch`], announced first to the acker ([`BatchPolled`]), which
//! commits it in the end and gives the credit back ([`Committed`]).
//!
//! - [`poll`]: polling, the budgets and the fetch pause;
//! - [`stop`]: on [`Drain`] or a failure no new poll starts; once the acker has committed what
//!   is in flight (or released it at the stop's deadline) the consumer leaves the group and
//!   closes, [`Finish`] goes down the pipeline and the task's final event is reported.
//!
//! What the actor may do next is its [`Phase`] plus whether its client is free ([`SourceSlot`]):
//! [`ConsumerActor::step`] reads both. The client is shared with the acker
//! ([`SharedSource`]); they take turns on it, one call at a time.
//!
//! A batch counts as done only once its acknowledgements (share mode) or offsets (classic mode)
//! are committed; until then its bytes count against the tenant's in-flight bytes budget, and
//! while that budget is full no new poll starts.
//!
//! Share mode: a batch whose records the sink stage gave up still failing (its target is down)
//! comes back with a time before which nothing new is fetched: the acker sets the pause on the
//! share consumer before it commits the releases, and the consumer starts no poll before the
//! pause ends ([`Phase::FetchPaused`]), so no record spends a delivery waiting out its lock
//! meanwhile ([`crate::lock_retry`]).

mod poll;
mod stop;

use stop::ArchivedOnRelease;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use spillway_core::{BatchAck, BatchOwner, RecordCoordinates};
use tracing::{error, info, warn};

use crate::acker::{last_deliveries, AckerActor, BatchRecords, SharedSource};
use crate::converter::ConverterActor;
use crate::error::RuntimeError;
use crate::lock_retry::{LockFacts, TargetHealth};
use crate::messages::{
    Archived, BatchHeld, BatchPolled, CloseGate, Committed, Drain, Failing, Finish, FlushHeld,
    ReleaseInFlight, Reporter, SourceBatch, Stopping, TaskEvent, TaskFailure,
};
use crate::panic_guard::guard_future;
use crate::source::{Polled, RecordSource};
use crate::status::TaskCounters;
use crate::telemetry::{BatchTrace, TaskIdentity};
use crate::tenancy::{record_bytes, Debt, InflightBytes, InflightHold, Throttle};

/// Connects the task's source (on the task's own thread, so its background work lives there).
pub type SourceFactory = Box<
    dyn FnOnce() -> LocalBoxFuture<'static, Result<Box<dyn RecordSource>, RuntimeError>> + Send,
>;

pub struct ConsumerActor {
    factory: Option<SourceFactory>,
    /// The Kafka client, shared with the acker (which commits through it).
    client: SharedSource,
    source: SourceSlot,
    phase: Phase,
    converter: Addr<ConverterActor>,
    acker: Addr<AckerActor>,
    task: u32,
    generation: u64,
    max_inflight: usize,
    poll_timeout: Duration,
    delivery_attempt_limit: u16,
    counters: Arc<TaskCounters>,
    reporter: Reporter,
    identity: Arc<TaskIdentity>,
    next_seq: u64,
    /// Batches between poll and commit (their credits), each with its bytes in the tenant's
    /// in-flight budget when it has one: given back when the acker reports the batch
    /// committed, or when the actor is dropped (stop, kill, failure).
    in_flight: HashMap<u64, Option<InflightHold>>,
    /// Those of them the sink stage holds, put, for its flush interval ([`BatchHeld`]): no
    /// credit or bytes, only their commit to wait for.
    held: HashSet<u64>,
    /// Where the batches' `BatchAck`s report a drop: the acker.
    owner: Arc<dyn BatchOwner>,
    /// The tasks stopping with this one: its consumer closes once they have all committed.
    close_together: Option<Arc<CloseGate>>,
    /// What the sink stage's retries need to know of the locks (lock duration).
    lock_facts: LockFacts,
    /// The connector's successful puts: a success of another task ends a fetch pause early.
    target_health: TargetHealth,
    /// Shared with the converter and sink stages: set once the task is going to fail.
    failing: Failing,
    /// `task.shutdown.graceful.timeout.ms`: how long a stop may take.
    shutdown_timeout: Duration,
    /// The stop's deadline is scheduled (on the first drain or failure).
    stop_scheduled: bool,
    /// A commit failed: close without waiting for the batches in flight.
    commits_broken: bool,
    /// A fetch pause ended: the next poll resumes fetching first.
    resume_fetching: bool,
    /// Classic mode: how long the consumer may go without a poll ([`RecordSource::keep_alive_after`]).
    keep_alive_after: Option<Duration>,
    /// The tenant's records/s and bytes/s budget, when it has one.
    throttle: Option<Arc<Throttle>>,
    /// What the polls so far cost and the budget has not paid yet.
    debt: Debt,
    /// A wake-up is scheduled for when the budget can pay the debt.
    throttled: bool,
    /// The tenant's in-flight bytes budget, shared with its other tasks.
    inflight_bytes: Option<Arc<InflightBytes>>,
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

    /// Draining or failing: wait for the acker's commits of what is in flight, then close.
    fn stopping(&self) -> bool {
        matches!(self, Phase::Draining | Phase::Failing { .. })
    }
}

/// Whether the task's source is connected and free: the consumer makes one call on it at a
/// time (a poll, a keep-alive poll or the close; the acker's commits take turns with them
/// through the [`SharedSource`]'s lock).
#[derive(Clone, Copy, PartialEq, Eq)]
enum SourceSlot {
    /// Its factory is connecting it.
    Connecting,
    /// Connected, and no call of the consumer's is running.
    Idle,
    /// A poll or the close is running.
    InUse,
    /// Its connection failed, or it is closed.
    Absent,
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
    /// Where the connected client goes, shared with the acker.
    pub client: SharedSource,
    pub converter: Addr<ConverterActor>,
    pub acker: Addr<AckerActor>,
    pub task: u32,
    pub generation: u64,
    pub max_inflight: usize,
    pub poll_timeout: Duration,
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
    /// The acker's address as the batches' owner ([`AckerActor::batch_owner`]).
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
            client: s.client,
            source: SourceSlot::Connecting,
            phase: Phase::Running,
            converter: s.converter,
            acker: s.acker,
            task: s.task,
            generation: s.generation,
            max_inflight: s.max_inflight.max(1),
            poll_timeout: s.poll_timeout,
            delivery_attempt_limit: s.delivery_attempt_limit,
            counters: s.counters,
            reporter: s.reporter,
            identity: s.identity,
            next_seq: 0,
            in_flight: HashMap::new(),
            held: HashSet::new(),
            owner: s.owner,
            close_together: None,
            lock_facts: s.lock_facts,
            target_health: s.target_health,
            failing: s.failing,
            shutdown_timeout: s.shutdown_timeout,
            stop_scheduled: false,
            commits_broken: false,
            resume_fetching: false,
            keep_alive_after: None,
            throttle: s.throttle,
            debt: Debt::default(),
            throttled: false,
            inflight_bytes: s.inflight_bytes,
            awaiting_room: false,
            parked: false,
            last_poll: Instant::now(),
            archived_on_release: ArchivedOnRelease::default(),
        }
    }

    /// Does the next thing: close when stopping and nothing is in flight, else poll.
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
            SourceSlot::Idle => {}
        }
        if stopping {
            if self.in_flight.is_empty() || self.commits_broken {
                self.close_step(ctx);
            }
        } else if self.in_flight.len() - self.held.len() < self.max_inflight
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
        let client = std::rc::Rc::clone(&self.client);
        let connect = async move {
            let source = factory().await?;
            let facts = (source.lock_extension(), source.keep_alive_after());
            *client.lock().await = Some(source);
            Ok::<_, RuntimeError>(facts)
        };
        ctx.spawn(connect.into_actor(self).map(|result, act, ctx| {
            act.source = SourceSlot::Absent;
            match result {
                Ok((extension, keep_alive_after)) => {
                    act.lock_facts.set_extension(extension);
                    info!(
                        generation = act.generation,
                        "task started: its consumer is connected"
                    );
                    // Only a source that needs keep-alive polls gets a timer for them.
                    if let Some(after) = keep_alive_after {
                        let every = (after / 4).clamp(KEEP_ALIVE_CHECK_MIN, KEEP_ALIVE_CHECK_MAX);
                        ctx.run_interval(every, |act, ctx| act.keep_alive_if_idle(ctx));
                    }
                    act.keep_alive_after = keep_alive_after;
                    act.source = SourceSlot::Idle;
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
        self.in_flight.clear();
        self.held.clear();
    }
}

impl Handler<BatchHeld> for ConsumerActor {
    type Result = ();

    /// The sink stage holds a batch it put: its credit and bytes come back (its commit, and
    /// the stop's wait for it, stay).
    fn handle(&mut self, msg: BatchHeld, ctx: &mut Context<Self>) {
        // Already committed (or given up on): nothing is left of it.
        let Some(bytes) = self.in_flight.get_mut(&msg.seq) else {
            return;
        };
        *bytes = None;
        self.held.insert(msg.seq);
        self.step(ctx);
    }
}

impl Handler<Committed> for ConsumerActor {
    type Result = ();

    /// The acker committed (or gave up on) batches: their credits come back.
    fn handle(&mut self, msg: Committed, ctx: &mut Context<Self>) {
        for seq in &msg.seqs {
            self.in_flight.remove(seq);
            self.held.remove(seq);
        }
        self.parked = false;
        if let Err(e) = msg.result {
            // Releases would fail the same way: close without waiting for them.
            self.commits_broken = true;
            return self.fail_now(ctx, e);
        }
        if let Some((until, successes_at_pause)) = msg.pause {
            if self.phase.running() {
                let wakeup_scheduled = matches!(
                    self.phase,
                    Phase::FetchPaused {
                        wakeup_scheduled: true,
                        ..
                    }
                );
                self.phase = Phase::FetchPaused {
                    until,
                    successes_at_pause,
                    wakeup_scheduled,
                };
            }
        }
        match msg.failure {
            // errors.tolerance=none: this batch is committed; the task fails now.
            Some((trace, for_good)) => self.fail_as(ctx, trace, for_good),
            None => self.step(ctx),
        }
    }
}

impl Handler<Archived> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: Archived, _ctx: &mut Context<Self>) {
        self.archived_on_release.records.extend(msg.records);
        self.archived_on_release.reason.get_or_insert(msg.reason);
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
            self.acker.do_send(Stopping);
        }
        if msg.together.is_some() {
            self.close_together = msg.together;
        }
        self.schedule_stop_deadline(ctx);
        self.step(ctx);
    }
}
