//! SinkActor: owns the connector's `SinkTask` and hands it one batch at a time (Connect's
//! lifecycle: `start` → `open` → `put`/`flush`… → `close` → `stop`), then turns each record's
//! fate into a verdict for the acker:
//!
//! - `put` succeeded (and the batch was flushed) → ACCEPT; a transform filtered it → ACCEPT.
//! - retriable error → share mode: put again after a jittered backoff while the records'
//!   acquisition locks leave room for another attempt and the commit ([`crate::lock_retry`]),
//!   then RELEASE, and the consumer fetches nothing new until the backoff's next attempt; on
//!   the record's last allowed delivery (`group.share.delivery.count.limit`) it is not released
//!   (the broker would archive it) but dead-lettered with a reason header, skipped with an
//!   error (`errors.tolerance=all`), or it fails the task for good, named in the trace
//!   (`errors.tolerance=none`). `errors.retry.timeout=0` allows no retry (one attempt, then
//!   RELEASE). Classic mode: Connect's retry — the record is put again after a backoff,
//!   within `errors.retry.timeout` (forever when it is -1, the default; not at all when 0),
//!   and counts as failed after that (`errors.tolerance` decides).
//! - task-level `put` error ([`SinkError::TaskLevel`]: the target refuses the configuration,
//!   or the task returned the wrong number of outcomes) → no retry, no verdict: the task fails
//!   and the whole batch is released (classic: nothing committed), whatever `errors.tolerance`
//!   says; the restart policy applies.
//! - conversion, transform or fatal `put` error → logged when `errors.log.enable`, written to the
//!   dead letter queue when one is set, then REJECT under `errors.tolerance=all`; under `none`
//!   the task fails after this batch is committed (the record is REJECTed when its dead letter
//!   was written, RELEASEd otherwise, so it is never lost — except on its last allowed
//!   delivery in share mode, where a RELEASE would archive it: it is REJECTed and the task
//!   fails for good, naming it).
//!
//! Share mode, lock sanity: a group lock not longer than what the sink task keeps free before
//! a lock runs out (`SinkTask::lock_margin`), or shorter than a batch's put, flush and commit
//! twice in a row, fails the task for good with both values and the settings to change.
//!
//! Each batch is flushed before its verdicts leave, so ACCEPT means the sink has the record.
//! Classic mode, a task with a [`flush_interval`](SinkTask::flush_interval) (a transaction per
//! several batches): batches put are held, verdicts and all, and flushed together with their
//! offsets merged ([`Held`]); nothing of them reaches the acker before that flush succeeds,
//! and if it fails they are released with the task's failure.
//!
//! Every call into the sink task is guarded: a panic fails the task (message and location in
//! its trace) and releases the batch at once. A `put`/`flush`/`open`/`close` error that fails
//! the task releases its batch the same way, through the batch's `BatchAck`.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use spillway_core::config::{ErrorHandling, ErrorTolerance, RetryTimeout};
use spillway_core::dead_letter::dead_letter_record;
use spillway_core::{
    Assignment, BatchAck, ConfigMap, ConnectError, ConsumerGroupMetadata, Disposition,
    ErrorContext, Processed, PutOutcome, RawRecord, SinkError, SinkRecord, SinkTask, Stage, Topic,
    TopicPartition,
};
use tracing::{error, warn, Instrument};

use crate::acker::AckerActor;
use crate::consumer::ConsumerActor;
use crate::dead_letter::with_reason;
use crate::lock_retry::{
    commit_margin, delivery_pause, lock_too_short, lock_too_short_for_batches, AfterFailure,
    GiveUpReason, LockExtension, LockFacts, RetryState, TargetHealth, Window,
};
use crate::messages::{
    Acknowledged, BatchHeld, Failing, Finish, FlushHeld, Outcomes, Ready, SinkBatch, TaskFailure,
    Verdict, Verdicts,
};
use crate::panic_guard::guard_future;
use crate::source::AssignmentChange;
use crate::status::TaskCounters;
use crate::telemetry::{BatchStage, BatchTrace};

/// Fixed facts of the task the sink stage needs for its verdicts.
pub struct SinkContext {
    pub connector: String,
    pub connector_class: String,
    pub task: u32,
    /// Share mode releases retriable failures; classic mode retries them.
    pub share: bool,
    pub errors: ErrorHandling,
    pub config: ConfigMap,
    pub counters: Arc<TaskCounters>,
    /// Set by the consumer once the task is going to fail.
    pub failing: Failing,
    /// Share mode: `group.share.delivery.count.limit`.
    pub delivery_attempt_limit: u16,
    /// Share mode: `share.retry.lock.margin.ms`.
    pub retry_lock_margin: Duration,
    /// Share mode: the lock duration and commit time, from the consumer.
    pub lock_facts: LockFacts,
    /// Shared by the connector's tasks: told of every successful put.
    pub target_health: TargetHealth,
    /// Classic mode, a task with a flush interval: at most this many batches in one flush
    /// (`TaskSettings::held_batches_max`).
    pub held_batches_max: usize,
}

/// What the sink stage keeps from batch to batch to retry within the locks.
struct Retries {
    state: RetryState,
    /// How long the last attempt (put, and flush when it succeeded) took.
    last_attempt: Duration,
    /// Batches in a row whose put, flush and commit took the lock's whole duration.
    slow_batches: u32,
    /// A retry was cut short by a lock that cannot be extended: said once per task.
    told_no_extension: bool,
    /// The connector's successful puts when this task last gave records up: more since then
    /// means the target is back, and the next batch need not wait for the backoff.
    successes_at_give_up: u64,
}

pub struct SinkActor {
    task: Option<Box<dyn SinkTask>>,
    acker: Addr<AckerActor>,
    /// Where a failure outside a batch goes (a batch's failure travels in its `BatchAck`).
    consumer: Addr<ConsumerActor>,
    ctx: Rc<SinkContext>,
    /// What is open, to close on stop.
    open: Vec<Assignment>,
    /// Why the sink task cannot take batches any more (it failed to start, failed or
    /// panicked); the batches that still arrive are released.
    failed: Option<String>,
    /// With the task while a batch runs (moved into its future and back).
    retries: Option<Retries>,
    /// Classic mode: the task's `flush_interval`, asked after `start`.
    flush_interval: Option<Duration>,
    held: Held,
    /// The task is stopping: no batch is held any more.
    stopping: bool,
}

/// Classic mode, a task with a flush interval: batches put and not flushed yet, in order.
#[derive(Default)]
struct Held {
    batches: Vec<(BatchAck, Decided)>,
    /// Per partition, the offset after the last record written in them.
    offsets: BTreeMap<TopicPartition, i64>,
    /// When the first of them was put.
    since: Option<Instant>,
    /// Bumped whenever they leave: a timer armed for earlier ones finds it changed.
    generation: u64,
}

impl Held {
    /// Takes the held batches out (flushed, or to be released).
    fn take(&mut self) -> Vec<(BatchAck, Decided)> {
        self.offsets.clear();
        self.since = None;
        self.generation += 1;
        std::mem::take(&mut self.batches)
    }
}

/// What `run_batch` flushes (classic mode, a task with a flush interval).
#[derive(Default)]
struct FlushPlan {
    /// The merged offsets of the batches held before this one (empty when none are).
    held: BTreeMap<TopicPartition, i64>,
    /// This batch may be held rather than flushed.
    defer: bool,
}

/// Adds `more` to `offsets`, keeping the later offset of a partition in both.
fn merge_offsets(offsets: &mut BTreeMap<TopicPartition, i64>, more: BTreeMap<TopicPartition, i64>) {
    for (tp, next) in more {
        let at = offsets.entry(tp).or_insert(next);
        *at = (*at).max(next);
    }
}

/// A batch as `run_batch` works on it (its `BatchAck` stays with the handler, which settles
/// or releases it whatever `run_batch` comes to).
struct PutBatch {
    changes: Vec<AssignmentChange>,
    raws: Vec<RawRecord>,
    not_ready: Vec<(usize, Processed)>,
    ready: Ready,
    trace: BatchTrace,
    group: Option<ConsumerGroupMetadata>,
}

/// What `run_batch` decided.
struct Decided {
    verdicts: Verdicts,
    fail_task: Option<String>,
    fail_for_good: bool,
    pause_fetch_until: Option<Instant>,
    trace: BatchTrace,
    start_offsets: BTreeMap<TopicPartition, i64>,
    changes: Vec<AssignmentChange>,
    /// Per partition, the offset after the last record written (kept while the batch is held).
    offsets: BTreeMap<TopicPartition, i64>,
    /// The batches held before this one were flushed: their verdicts may go.
    held_flushed: bool,
    /// This batch was held back from its flush ([`FlushPlan::defer`]): it waits with them.
    deferred: bool,
}

impl SinkActor {
    pub fn new(
        task: Box<dyn SinkTask>,
        acker: Addr<AckerActor>,
        consumer: Addr<ConsumerActor>,
        ctx: SinkContext,
    ) -> Self {
        let retries = Retries {
            state: RetryState::new(ctx.errors.retry_delay_max),
            last_attempt: Duration::ZERO,
            slow_batches: 0,
            told_no_extension: false,
            successes_at_give_up: 0,
        };
        SinkActor {
            task: Some(task),
            acker,
            consumer,
            ctx: Rc::new(ctx),
            open: Vec::new(),
            failed: None,
            retries: Some(retries),
            flush_interval: None,
            held: Held::default(),
            stopping: false,
        }
    }

    /// Sends the held batches' verdicts to the acker, in order: their flush succeeded.
    fn send_held(&mut self) {
        for (ack, decided) in self.held.take() {
            self.send_outcomes(ack, decided);
        }
    }

    /// Releases the held batches (never flushed): the task fails with `trace`.
    fn release_held(&mut self, trace: &str) {
        for (ack, _) in self.held.take() {
            ack.release(trace.to_owned());
        }
    }

    fn send_outcomes(&self, ack: BatchAck, decided: Decided) {
        self.acker.do_send(Outcomes {
            ack,
            verdicts: decided.verdicts,
            fail_task: decided.fail_task,
            fail_for_good: decided.fail_for_good,
            trace: decided.trace,
            start_offsets: decided.start_offsets,
            pause_fetch_until: decided.pause_fetch_until,
        });
    }

    /// Holds a batch put but not flushed; the first one arms the interval's timer.
    fn hold(&mut self, ack: BatchAck, mut decided: Decided, ctx: &mut Context<Self>) {
        // Its records are written and dropped: its credit lets the consumer poll past it.
        self.consumer.do_send(BatchHeld { seq: ack.batch() });
        merge_offsets(&mut self.held.offsets, std::mem::take(&mut decided.offsets));
        self.held.batches.push((ack, decided));
        if self.held.since.is_none() {
            self.held.since = Some(Instant::now());
            let generation = self.held.generation;
            if let Some(interval) = self.flush_interval {
                ctx.run_later(interval, move |act, ctx| {
                    if act.held.generation == generation {
                        act.flush_held(ctx);
                    }
                });
            }
        }
    }

    /// Flushes the held batches now (the interval passed, or the task is stopping), then
    /// sends their verdicts; a failed flush releases them and fails the task.
    fn flush_held(&mut self, ctx: &mut Context<Self>) {
        if self.held.batches.is_empty() || self.failed.is_some() {
            return;
        }
        let Some(mut task) = self.task.take() else {
            return;
        };
        let offsets = self.held.offsets.clone();
        let fut = async move {
            let result = guard_future(task.flush(&offsets)).await;
            (task, result)
        };
        ctx.wait(fut.into_actor(self).map(|(task, result), act, _ctx| {
            let trace = match result {
                Ok(Ok(())) => {
                    act.task = Some(task);
                    act.send_held();
                    return;
                }
                Ok(Err(e)) => {
                    act.task = Some(task);
                    format!("the sink task failed to flush: {e}")
                }
                Err(panic) => format!("the sink task's flush {panic}"),
            };
            act.failed = Some(trace.clone());
            act.release_held(&trace);
        }));
    }

    /// The sink task failed outside a batch: the consumer stops the task.
    fn fail(&mut self, trace: String) {
        if self.failed.is_none() {
            self.failed = Some(trace.clone());
            self.consumer.do_send(TaskFailure(trace));
        }
    }
}

impl Actor for SinkActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(mut task) = self.task.take() else {
            return;
        };
        let config = self.ctx.config.clone();
        let fut = async move {
            let result = guard_future(task.start(&config)).await;
            (task, result)
        };
        ctx.wait(fut.into_actor(self).map(|(task, result), act, _ctx| {
            act.ctx
                .counters
                .metrics
                .task_started(matches!(result, Ok(Ok(()))));
            match result {
                Ok(Ok(())) => {
                    // Share mode flushes every batch: the records' locks run while they wait.
                    act.flush_interval = task.flush_interval().filter(|_| !act.ctx.share);
                    act.task = Some(task);
                }
                Ok(Err(e)) => {
                    act.task = Some(task);
                    act.fail(format!("the sink task failed to start: {e}"));
                }
                // A panicked task is never called again; dropping it frees what it holds.
                Err(panic) => act.fail(format!("the sink task's start {panic}")),
            }
        }));
    }
}

impl Handler<SinkBatch> for SinkActor {
    type Result = ();

    fn handle(&mut self, batch: SinkBatch, ctx: &mut Context<Self>) {
        let SinkBatch {
            ack,
            changes,
            raws,
            not_ready,
            ready,
            trace,
            group,
        } = batch;
        if let Some(why) = &self.failed {
            ack.release(format!("the sink task cannot take records: {why}"));
            return;
        }
        if self.ctx.failing.is_set() {
            ack.release("the task is failing: the batch was released before put");
            return;
        }
        let Some(mut task) = self.task.take() else {
            ack.release("the sink task is gone");
            return;
        };
        let mut retries = self.retries.take().unwrap_or_else(|| Retries {
            state: RetryState::new(self.ctx.errors.retry_delay_max),
            last_attempt: Duration::ZERO,
            slow_batches: 0,
            told_no_extension: false,
            successes_at_give_up: 0,
        });
        let sink_ctx = Rc::clone(&self.ctx);
        // Held while the interval runs, up to a bound on what a flush covers.
        let defer = self.flush_interval.is_some_and(|interval| {
            !self.stopping
                && self.held.batches.len() + 1 < self.ctx.held_batches_max
                && self
                    .held
                    .since
                    .is_none_or(|since| since.elapsed() < interval)
        });
        let plan = FlushPlan {
            held: self.held.offsets.clone(),
            defer,
        };
        let work = PutBatch {
            changes,
            raws,
            not_ready,
            ready,
            trace,
            group,
        };
        let fut = async move {
            let result = guard_future(run_batch(
                task.as_mut(),
                work,
                &sink_ctx,
                &mut retries,
                plan,
            ))
            .await;
            (task, retries, result)
        };
        ctx.wait(
            fut.into_actor(self)
                .map(move |(task, retries, result), act, ctx| {
                    act.retries = Some(retries);
                    match result {
                        Ok(Ok(mut decided)) => {
                            act.task = Some(task);
                            if let Some(trace) = &decided.fail_task {
                                // Connect stops a task at its first failure: batches that
                                // arrive before the consumer knows are released, not put.
                                act.failed.get_or_insert_with(|| trace.clone());
                            }
                            for change in std::mem::take(&mut decided.changes) {
                                match change {
                                    AssignmentChange::Opened(a) => act.open.push(a),
                                    AssignmentChange::Closed(a) => act.open.retain(|o| *o != a),
                                }
                            }
                            if decided.held_flushed {
                                act.send_held();
                            } else if let Some(trace) = &decided.fail_task {
                                // Not flushed: what they wrote is not durable.
                                act.release_held(trace);
                            }
                            if decided.deferred {
                                act.hold(ack, decided, ctx);
                            } else {
                                act.send_outcomes(ack, decided);
                            }
                        }
                        Ok(Err(trace)) => {
                            act.task = Some(task);
                            act.failed = Some(trace.clone());
                            // The batch's records are released and the task fails with `trace`,
                            // with those of the batches held unflushed.
                            act.release_held(&trace);
                            ack.release(trace);
                        }
                        Err(panic) => {
                            // Never called again, not even `close`/`stop`: its state is unknown.
                            drop(task);
                            let trace = format!("the sink task {panic}");
                            act.failed = Some(trace.clone());
                            act.release_held(&trace);
                            ack.release(trace);
                        }
                    }
                }),
        );
    }
}

impl Handler<Acknowledged> for SinkActor {
    type Result = ();

    fn handle(&mut self, msg: Acknowledged, ctx: &mut Context<Self>) {
        if self.failed.is_some() {
            return;
        }
        let Some(mut task) = self.task.take() else {
            return;
        };
        let fut = async move {
            let result = guard_future(task.acknowledged(&msg.records)).await;
            (task, result)
        };
        ctx.wait(
            fut.into_actor(self)
                .map(|(task, result), act, _ctx| match result {
                    Ok(()) => act.task = Some(task),
                    Err(panic) => act.fail(format!("the sink task's acknowledged {panic}")),
                }),
        );
    }
}

impl Handler<FlushHeld> for SinkActor {
    type Result = ();

    fn handle(&mut self, msg: FlushHeld, ctx: &mut Context<Self>) {
        // Batches still on their way are flushed one by one from now on.
        self.stopping |= msg.stopping;
        self.flush_held(ctx);
    }
}

impl Handler<Finish> for SinkActor {
    type Result = ResponseActFuture<Self, Option<String>>;

    /// Closes what is open and stops the sink task; a panic there is the answer (a failure).
    fn handle(&mut self, _msg: Finish, _ctx: &mut Context<Self>) -> Self::Result {
        // Still held: the consumer closed without their commit (a stop past its deadline); the
        // broker or the group's offsets give their records again.
        let held = self.held.take();
        if !held.is_empty() {
            warn!(task = self.ctx.task, batches = held.len(), "the task stopped before its held batches were flushed; their records are read again");
            for (ack, _) in held {
                ack.settle();
            }
        }
        let task = self.task.take();
        let open = std::mem::take(&mut self.open);
        let task_id = self.ctx.task;
        let fut = async move {
            // A task that panicked is gone already; one that failed still closes and stops.
            let mut task = task?;
            let stopped = guard_future(async {
                for assignment in &open {
                    if let Err(e) = task.close(assignment).await {
                        warn!(task = task_id, error = %e, "closing the sink task's assignment failed");
                    }
                }
                task.stop().await
            })
            .await;
            match stopped {
                Ok(Ok(())) => None,
                Ok(Err(e)) => {
                    warn!(task = task_id, error = %e, "stopping the sink task failed");
                    None
                }
                Err(panic) => Some(format!("the sink task's close or stop {panic}")),
            }
        };
        Box::pin(fut.into_actor(self).map(|outcome, _act, ctx| {
            ctx.stop();
            outcome
        }))
    }
}

/// Connect's initial retry backoff (classic mode; share mode's is [`RetryState`]'s).
const FIRST_BACKOFF: Duration = Duration::from_millis(300);

/// Share mode: batches in a row whose put, flush and commit outlast the lock before the task
/// fails (one slow batch may be a pause of the process; two are the batch size).
const SLOW_BATCHES_TO_FAIL: u32 = 2;

/// Opens/closes what changed, puts the ready records (retrying them), flushes, and decides
/// every record's verdict. `Err` is a failure of the task itself.
async fn run_batch(
    task: &mut dyn SinkTask,
    mut batch: PutBatch,
    ctx: &SinkContext,
    retries: &mut Retries,
    mut plan: FlushPlan,
) -> Result<Decided, String> {
    if ctx.share {
        if let Some(refused) = lock_refusal(task, ctx) {
            return Ok(give_back(batch, refused));
        }
    }
    let mut held_flushed = false;
    if !plan.held.is_empty() && !batch.changes.is_empty() {
        // What the held batches wrote becomes durable before partitions change hands.
        let held = std::mem::take(&mut plan.held);
        task.flush(&held)
            .await
            .map_err(|e| format!("the sink task failed to flush: {e}"))?;
        held_flushed = true;
    }
    let mut start_offsets = BTreeMap::new();
    for change in &batch.changes {
        match change {
            AssignmentChange::Opened(a) => {
                task.open(a)
                    .await
                    .map_err(|e| format!("the sink task failed to open {a:?}: {e}"))?;
                start_offsets.extend(task.start_offsets());
            }
            AssignmentChange::Closed(a) => task
                .close(a)
                .await
                .map_err(|e| format!("the sink task failed to close {a:?}: {e}"))?,
        }
    }
    if let Some(group) = &batch.group {
        task.consumer_group(group);
    }
    // The ready records move from the batch into `put` as one list; the entries that are
    // not in `not_ready` were theirs.
    let ready = std::mem::take(&mut batch.ready);
    // Indexed by entry: the put's outcome of each ready record.
    let mut outcomes: Vec<Option<PutOutcome>> = Vec::new();
    outcomes.resize_with(batch.raws.len(), || None);
    let put_span = batch.trace.span(BatchStage::Put);
    let mut batch_offsets = BTreeMap::new();
    let mut pause_fetch_until = None;
    let mut slow_batch = None;
    if !ready.records.is_empty() {
        pause_fetch_until = put_with_retries(task, ready, ctx, retries, &mut outcomes)
            .instrument(put_span.clone())
            .await;
        if let Some(error) = outcomes
            .iter()
            .flatten()
            .find_map(PutOutcome::task_level)
            .cloned()
        {
            return Ok(task_level_failure(ctx, batch, start_offsets, &error));
        }
        // Per partition, the offset after the last record written; a batch spans few
        // partitions, so a short list beats a map keyed by an owned topic per record.
        let mut next_offsets: Vec<(&Topic, i32, i64)> = Vec::new();
        for (i, outcome) in outcomes.iter().enumerate() {
            if outcome.as_ref().is_some_and(PutOutcome::is_ok) {
                let c = &batch.raws[i];
                match next_offsets
                    .iter_mut()
                    // Topics compared as shared names: the same topic's are one pointer.
                    .find(|(t, p, _)| *p == c.partition && **t == c.topic)
                {
                    Some((_, _, next)) => *next = (*next).max(c.offset + 1),
                    None => next_offsets.push((&c.topic, c.partition, c.offset + 1)),
                }
            }
        }
        let offsets: BTreeMap<TopicPartition, i64> = next_offsets
            .into_iter()
            .map(|(t, p, next)| (TopicPartition::new(t.as_str(), p), next))
            .collect();
        if plan.defer {
            batch_offsets = offsets;
        } else if !offsets.is_empty() {
            // The batches held before this one (classic mode) are flushed with it.
            let mut offsets = offsets;
            merge_offsets(&mut offsets, std::mem::take(&mut plan.held));
            let flush_started = Instant::now();
            match task.flush(&offsets).instrument(put_span.clone()).await {
                Ok(()) => {
                    held_flushed = true;
                    if ctx.share && pause_fetch_until.is_none() {
                        retries.last_attempt += flush_started.elapsed();
                        slow_batch = slow_batch_check(task, ctx, retries);
                    }
                }
                Err(e) => {
                    if !(e.is_retriable() && ctx.share) {
                        return Err(format!("the sink task failed to flush: {e}"));
                    }
                    // Not durable: give the records back rather than accept them.
                    warn!(task = ctx.task, error = %e, "flush failed; releasing the batch");
                    for outcome in outcomes.iter_mut().flatten() {
                        if outcome.is_ok() {
                            *outcome = PutOutcome::Retriable(e.clone());
                        }
                    }
                }
            }
        }
    }
    let mut fail_task = None;
    let mut fail_for_good = false;
    let mut verdicts = Verdicts::with_capacity(batch.raws.len());
    // Entries are visited in place, and the next not-ready one is looked at where it lies:
    // moving entries (a few hundred bytes each) per record only to read an index or
    // coordinates cost a copy per record (a peekable iterator did so too).
    let mut not_ready = std::mem::take(&mut batch.not_ready).into_iter();
    let mut next_not_ready = not_ready.next();
    for (i, raw) in batch.raws.iter_mut().enumerate() {
        let record = raw.coordinates();
        let last_delivery = ctx.share && is_last_delivery(raw, ctx.delivery_attempt_limit);
        // A ready record went into the put: its outcome is what counts.
        let processed = if next_not_ready.as_ref().is_some_and(|(at, _)| *at == i) {
            std::mem::replace(&mut next_not_ready, not_ready.next()).map(|(_, p)| p)
        } else {
            None
        };
        // Matched in place, not as a pair: a pair of these enums is a copy per record.
        let failure = match processed {
            Some(Processed::Filtered) => {
                TaskCounters::add(&ctx.counters.filtered, 1);
                None
            }
            Some(Processed::Failed { stage, error }) => {
                ctx.counters.metrics.conversion_failed();
                Some((stage, error))
            }
            None | Some(Processed::Ready(_)) if matches!(outcomes[i], Some(PutOutcome::Ok)) => None,
            None | Some(Processed::Ready(_)) => match outcomes[i].take() {
                Some(PutOutcome::Ok) => None,
                Some(PutOutcome::Retriable(e)) if ctx.share && !last_delivery => {
                    ctx.counters.metrics.retried(1);
                    ctx.counters.metrics.logged(ctx.errors.log_enable);
                    if ctx.errors.log_enable {
                        warn!(connector = %ctx.connector, task = ctx.task, record = %record, error = %e, "retriable put error; releasing the record");
                    }
                    verdicts.ack(record, Disposition::Release);
                    continue;
                }
                Some(
                    PutOutcome::Retriable(e) | PutOutcome::Fatal(e) | PutOutcome::TaskLevel(e),
                ) => Some((Stage::TaskPut, ConnectError::Sink(e))),
                None => Some((
                    Stage::TaskPut,
                    ConnectError::Sink(SinkError::fatal("put returned no outcome")),
                )),
            },
        };
        let Some((stage, error)) = failure else {
            verdicts.ack(record, Disposition::Accept);
            continue;
        };
        let limit = last_delivery.then(|| LastDelivery {
            count: raw.delivery_count.unwrap_or(1),
            limit: ctx.delivery_attempt_limit,
        });
        // The raw record goes to the verdict (its dead letter); the batch keeps a placeholder.
        let placeholder = RawRecord::new(record.topic.clone(), record.partition, record.offset);
        let raw = std::mem::replace(raw, placeholder);
        let (verdict, fatal) = failed_verdict(ctx, raw, stage, &error, limit);
        verdicts.push(verdict);
        if fatal && fail_task.is_none() {
            fail_task = Some(match limit {
                Some(limit) => {
                    fail_for_good = true;
                    format!(
                        "{record} failed at stage {} on its last allowed delivery ({limit}) and errors.tolerance is none: {error}. It was rejected rather than released, which would only have had the broker archive it; the task stays FAILED (a restart would not see the record again). Fix the cause, then write the record again, or set errors.tolerance=all with errors.deadletterqueue.topic.name to keep such records",
                        stage.as_str()
                    )
                }
                None => format!(
                    "{} failed at stage {} and errors.tolerance is none: {error}",
                    record,
                    stage.as_str()
                ),
            });
        }
    }
    if fail_task.is_none() {
        if let Some(message) = slow_batch {
            fail_task = Some(message);
            fail_for_good = true;
        }
    }
    // Held batches (classic mode) are flushed now when this batch cannot join them: it had
    // nothing to flush, or the task fails after it.
    let deferred = plan.defer && fail_task.is_none();
    let mut to_flush = std::mem::take(&mut plan.held);
    if plan.defer && !deferred {
        merge_offsets(&mut to_flush, std::mem::take(&mut batch_offsets));
    }
    if !deferred {
        if !to_flush.is_empty() {
            task.flush(&to_flush)
                .instrument(put_span)
                .await
                .map_err(|e| format!("the sink task failed to flush: {e}"))?;
        }
        // Whatever was held is flushed now, or had nothing to flush (filtered records): its
        // verdicts go before this batch's.
        held_flushed = true;
    }
    Ok(Decided {
        verdicts,
        fail_task,
        fail_for_good,
        pause_fetch_until,
        trace: batch.trace,
        start_offsets,
        changes: batch.changes,
        offsets: batch_offsets,
        held_flushed,
        deferred,
    })
}

/// A task-level `put` error ([`SinkError::TaskLevel`]): the records are fine, so every record
/// of the batch is released (classic: no offset is committed past it) whatever
/// `errors.tolerance` says, and the task fails under the restart policy. Share mode, a record
/// on its last allowed delivery would only be archived by the broker if released: it is
/// dead-lettered when a DLQ is set (REJECTed otherwise, logged), and the task fails for good
/// naming it, since a restart would spend another delivery of every record it fetches.
fn task_level_failure(
    ctx: &SinkContext,
    batch: PutBatch,
    start_offsets: BTreeMap<TopicPartition, i64>,
    error: &SinkError,
) -> Decided {
    ctx.counters.metrics.logged(true);
    error!(connector = %ctx.connector, task = ctx.task, error = %error, "the sink task cannot write to its target (not the records' fault); the task fails and its batch is released");
    let mut at_limit = Vec::new();
    let cause = ConnectError::Sink(error.clone());
    let verdicts = batch
        .raws
        .into_iter()
        .map(|raw| {
            if ctx.share && is_last_delivery(&raw, ctx.delivery_attempt_limit) {
                at_limit.push(raw.coordinates());
                let limit = LastDelivery {
                    count: raw.delivery_count.unwrap_or(1),
                    limit: ctx.delivery_attempt_limit,
                };
                failed_verdict(ctx, raw, Stage::TaskPut, &cause, Some(limit)).0
            } else {
                Verdict {
                    record: raw.coordinates(),
                    disposition: Disposition::Release,
                    dead_letter: None,
                }
            }
        })
        .collect();
    let mut trace = format!(
        "the sink task failed with a task-level error, which errors.tolerance does not cover (the records are not at fault: none was rejected, the batch was released): {}",
        error.message()
    );
    if let Some(first) = at_limit.first() {
        trace.push_str(&format!(
            ". {} record(s), first {first}, were on their last allowed delivery (group.share.delivery.count.limit={}): dead-lettered when errors.deadletterqueue.topic.name is set, else rejected; the task stays FAILED so that no more deliveries are spent: fix the target's configuration, then restart the task",
            at_limit.len(),
            ctx.delivery_attempt_limit
        ));
    }
    Decided {
        verdicts,
        fail_task: Some(trace),
        fail_for_good: !at_limit.is_empty(),
        pause_fetch_until: None,
        trace: batch.trace,
        start_offsets,
        changes: batch.changes,
        offsets: BTreeMap::new(),
        // Batches held unflushed are released with it (read again after the restart).
        held_flushed: false,
        deferred: false,
    }
}

/// A record's delivery at the limit: the broker archives it if it is released (or its lock
/// runs out) now.
#[derive(Debug, Clone, Copy)]
struct LastDelivery {
    count: u16,
    limit: u16,
}

impl std::fmt::Display for LastDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delivery {} of group.share.delivery.count.limit={}",
            self.count, self.limit
        )
    }
}

/// Whether `raw` is on its last allowed delivery (a share record without a delivery count
/// counts as a first delivery).
fn is_last_delivery(raw: &RawRecord, limit: u16) -> bool {
    raw.delivery_count.unwrap_or(1) >= limit
}

/// Share mode: the group's lock duration is not longer than what the sink task keeps free
/// before a lock runs out: the message that fails the task.
fn lock_refusal(task: &dyn SinkTask, ctx: &SinkContext) -> Option<String> {
    let lock = ctx.lock_facts.lock_duration()?;
    let (margin, setting) = task.lock_margin()?;
    lock_too_short(lock, margin, Some((margin, setting)))
}

/// Every record of `batch` released and the task failing for good with `message`: nothing
/// was put (the records' deliveries are below the limit, or the limit is what is reported).
fn give_back(batch: PutBatch, message: String) -> Decided {
    error!(trace = %message, "the share group's lock is too short for this connector; the task fails");
    let verdicts = batch
        .raws
        .iter()
        .map(|raw| Verdict {
            record: raw.coordinates(),
            disposition: Disposition::Release,
            dead_letter: None,
        })
        .collect();
    Decided {
        verdicts,
        fail_task: Some(message),
        fail_for_good: true,
        pause_fetch_until: None,
        trace: batch.trace,
        start_offsets: BTreeMap::new(),
        // Nothing was opened.
        changes: Vec::new(),
        offsets: BTreeMap::new(),
        held_flushed: false,
        deferred: false,
    }
}

/// Share mode, after a batch went through without a retry: counts it as slow when its put,
/// flush and the last commit took the lock's whole duration (less the task's margin); the
/// second slow batch in a row fails the task.
fn slow_batch_check(
    task: &dyn SinkTask,
    ctx: &SinkContext,
    retries: &mut Retries,
) -> Option<String> {
    let lock = ctx.lock_facts.lock_duration()?;
    match lock_too_short_for_batches(
        lock,
        retries.last_attempt,
        ctx.lock_facts.commit_time(),
        task.lock_margin(),
    ) {
        None => {
            retries.slow_batches = 0;
            None
        }
        Some(message) => {
            retries.slow_batches += 1;
            warn!(
                task = ctx.task,
                slow_batches = retries.slow_batches,
                "{message}"
            );
            (retries.slow_batches >= SLOW_BATCHES_TO_FAIL).then_some(message)
        }
    }
}

/// Puts `ready`, retrying retriable failures. Classic mode: again after a growing backoff
/// until they succeed or `errors.retry.timeout` runs out. Share mode: within the records'
/// locks ([`crate::lock_retry`]); returns, when some were given up still failing, until when
/// the consumer should fetch nothing new.
async fn put_with_retries(
    task: &mut dyn SinkTask,
    mut ready: Ready,
    ctx: &SinkContext,
    retries: &mut Retries,
    outcomes: &mut [Option<PutOutcome>],
) -> Option<Instant> {
    let started = Instant::now();
    let task_margin = task.lock_margin().map_or(Duration::ZERO, |(m, _)| m);
    let margin = commit_margin(ctx.retry_lock_margin, ctx.lock_facts.commit_time()) + task_margin;
    let window = |records: &[SinkRecord], attempt: Duration| Window {
        now: Instant::now(),
        deadline: records.iter().filter_map(|r| r.lock_deadline).min(),
        attempt,
        margin,
        started,
        retry_timeout: ctx.errors.retry_timeout,
    };
    if ctx.share {
        if ctx.target_health.successes() != retries.successes_at_give_up {
            // Another task's put succeeded since: the target is back.
            retries.state.succeeded();
        }
        // The target failed lately: the first attempt waits for the backoff too, as far as
        // this batch's locks allow.
        let wait = retries
            .state
            .first_wait(&window(&ready.records, retries.last_attempt));
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
    let mut backoff = FIRST_BACKOFF;
    loop {
        let records = &ready.records;
        TaskCounters::add(&ctx.counters.put, records.len());
        let put_started = Instant::now();
        let result = PutOutcome::expand(task.put(records).await, records.len());
        retries.last_attempt = put_started.elapsed();
        let failed = result.iter().filter(|o| !o.is_ok()).count();
        ctx.counters.metrics.put_done(retries.last_attempt, failed);
        // A task-level error fails the task: no retry, the batch is released.
        let fails_task = result.iter().any(|o| o.task_level().is_some());
        let mut retry = Ready::default();
        let mut any_ok = false;
        if result.iter().any(|o| matches!(o, PutOutcome::Retriable(_))) {
            for ((i, record), outcome) in ready.indices.into_iter().zip(ready.records).zip(result) {
                any_ok |= outcome.is_ok();
                if matches!(outcome, PutOutcome::Retriable(_)) {
                    retry.indices.push(i);
                    retry.records.push(record);
                }
                outcomes[i] = Some(outcome);
            }
        } else {
            // Nothing to put again: the records are dropped where they lie, not moved out
            // one by one.
            for (i, outcome) in ready.indices.into_iter().zip(result) {
                any_ok |= outcome.is_ok();
                outcomes[i] = Some(outcome);
            }
        }
        if any_ok {
            retries.state.succeeded();
            ctx.target_health.succeeded();
        }
        if retry.records.is_empty() || fails_task {
            return None;
        }
        if ctx.share {
            match retries
                .state
                .after_failure(&window(&retry.records, retries.last_attempt))
            {
                AfterFailure::Retry(wait) => {
                    ctx.counters.metrics.retried(retry.records.len());
                    tokio::time::sleep(wait).await;
                }
                AfterFailure::GiveUp { resume, why } => {
                    let now = Instant::now();
                    let spent = retry
                        .records
                        .iter()
                        .filter_map(|r| r.delivery_count)
                        .max()
                        .unwrap_or(1);
                    let lock = ctx.lock_facts.lock_duration().unwrap_or_default();
                    let pause = delivery_pause(
                        lock,
                        spent,
                        resume.saturating_duration_since(now),
                        ctx.errors.retry_delay_max,
                    );
                    let resume = now + pause;
                    retries.state.hold_off_until(resume);
                    retries.successes_at_give_up = ctx.target_health.successes();
                    if why == GiveUpReason::LockDeadline && !retries.told_no_extension {
                        if let LockExtension::Unavailable(reason) = ctx.lock_facts.extension() {
                            retries.told_no_extension = true;
                            warn!(task = ctx.task, records = retry.records.len(), reason, "retries end at the records' lock deadline: their locks cannot be extended");
                        }
                    }
                    return Some(resume);
                }
            }
        } else {
            let budget_left = match ctx.errors.retry_timeout {
                RetryTimeout::Infinite => true,
                RetryTimeout::NoRetry => false,
                RetryTimeout::Within(limit) => started.elapsed() + backoff <= limit,
            };
            if !budget_left {
                return None;
            }
            ctx.counters.metrics.retried(retry.records.len());
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(ctx.errors.retry_delay_max.max(FIRST_BACKOFF));
        }
        ready = retry;
    }
}

/// The verdict for a record that failed, and whether it fails the task. `last`: share mode,
/// the record is on its last allowed delivery, so it is never released.
fn failed_verdict(
    ctx: &SinkContext,
    raw: RawRecord,
    stage: Stage,
    error: &ConnectError,
    last: Option<LastDelivery>,
) -> (Verdict, bool) {
    let record = raw.coordinates();
    let at_limit = last.map(|l| l.to_string()).unwrap_or_default();
    if ctx.errors.log_enable || last.is_some() {
        // Giving a record up at the delivery limit is always logged: the broker will not
        // deliver it again.
        if ctx.errors.log_include_messages {
            error!(connector = %ctx.connector, task = ctx.task, record = %record, stage = stage.as_str(), delivery_limit = %at_limit, key = ?raw.key, value = ?raw.value, headers = ?raw.headers, error = %error, "record failed");
        } else {
            error!(connector = %ctx.connector, task = ctx.task, record = %record, stage = stage.as_str(), delivery_limit = %at_limit, error = %error, "record failed");
        }
    }
    let executing = match stage {
        Stage::KeyConverter => "key.converter",
        Stage::ValueConverter => "value.converter",
        Stage::HeaderConverter => "header.converter",
        Stage::Transformation => "transforms",
        _ => ctx.connector_class.as_str(),
    };
    let dead_letter = ctx.errors.dead_letter_queue.as_ref().map(|dlq| {
        let context = ErrorContext {
            connector: &ctx.connector,
            task_id: ctx.task,
            stage,
            executing,
            error,
        };
        let letter = dead_letter_record(&raw, &dlq.topic, dlq.context_headers.then_some(&context));
        match last {
            Some(l) => with_reason(
                letter,
                &format!(
                    "still failing on its last allowed delivery ({l}): dead-lettered instead of being archived by the broker"
                ),
            ),
            None => letter,
        }
    });
    let dead_letter = dead_letter.map(Box::new);
    let fatal = ctx.errors.tolerance == ErrorTolerance::None;
    ctx.counters
        .metrics
        .record_error(!fatal, ctx.errors.log_enable || last.is_some());
    let disposition = if fatal && dead_letter.is_none() && last.is_none() {
        // The task fails; the record stays available rather than being thrown away.
        Disposition::Release
    } else {
        Disposition::Reject {
            reason: match last {
                Some(l) => format!(
                    "{}: {error} (on its last allowed delivery, {l})",
                    stage.as_str()
                ),
                None => format!("{}: {error}", stage.as_str()),
            },
        }
    };
    (
        Verdict {
            record,
            disposition,
            dead_letter,
        },
        fatal,
    )
}
