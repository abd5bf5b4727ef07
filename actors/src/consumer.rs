//! ConsumerActor: owns the task's Kafka consumer. It polls while the task has credits (fewer
//! than `task.inflight.batches` batches in flight), and applies and commits the verdicts that
//! come back with each credit — so the consumer is only ever used from here, one call at a time.
//!
//! A batch counts as done only once its acknowledgements (share mode) or offsets (classic mode)
//! are committed; until then its bytes count against the tenant's in-flight bytes budget, and
//! while that budget is full no new poll starts. On [`Drain`] it stops polling, waits for the
//! batches in flight, commits, leaves the group and passes [`Finish`] down the pipeline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use spillway_core::{Ack, Disposition, RecordCoordinates, TopicPartition};
use tracing::{info, warn, Instrument, Span};

use crate::converter::ConverterActor;
use crate::error::RuntimeError;
use crate::messages::{Acknowledged, Drain, Finish, Reporter, Settled, SourceBatch, TaskEvent};
use crate::metrics::{BatchMeta, CommitOutcome};
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
    in_flight: usize,
    /// Credits returned and not yet acknowledged and committed.
    settled: Vec<Settled>,
    /// A poll, commit or close is running (it holds the source).
    busy: bool,
    draining: bool,
    failure: Option<String>,
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
}

/// Longest a poll waits while batches are in flight. The consumer is busy while it polls, so
/// a batch that settles meanwhile is committed only after the poll returns; and a share
/// source fetches more from a broker only once that broker's records are acknowledged
/// (`fetch_buffer_batches`), which its commit does.
const POLL_WHILE_IN_FLIGHT: Duration = Duration::from_millis(2);

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
    pub counters: Arc<TaskCounters>,
    pub reporter: Reporter,
    pub throttle: Option<Arc<Throttle>>,
    pub inflight_bytes: Option<Arc<InflightBytes>>,
    pub identity: Arc<TaskIdentity>,
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
            in_flight: 0,
            settled: Vec::new(),
            busy: false,
            draining: false,
            failure: None,
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
        }
    }

    /// The source cannot go on: report and stop (the connector tears the task down).
    fn fail_now(&mut self, ctx: &mut Context<Self>, error: String) {
        (self.reporter)(TaskEvent::Failed {
            task: self.task,
            generation: self.generation,
            trace: error,
        });
        self.finished = true;
        ctx.stop();
    }

    /// Does the next thing: commit returned credits, else close when draining, else poll.
    fn step(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.finished || self.source.is_none() {
            return;
        }
        if !self.settled.is_empty() {
            self.commit_step(ctx);
        } else if self.draining || self.failure.is_some() {
            if self.in_flight == 0 {
                self.close_step(ctx);
            }
        } else if self.in_flight < self.max_inflight
            && !self.parked
            && !self.inflight_bytes_full(ctx)
            && !self.over_budget(ctx)
        {
            self.poll_step(ctx);
        }
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
        let in_flight = self.in_flight > 0;
        let timeout = if in_flight {
            self.poll_timeout.min(POLL_WHILE_IN_FLIGHT)
        } else {
            self.poll_timeout
        };
        let started = SystemTime::now();
        self.last_poll = Instant::now();
        let fut = async move {
            let result = source.poll(timeout).await;
            (source, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(source, result), act, ctx| {
            if let Some(n) = source.partition_count() {
                act.counters
                    .metrics
                    .partitions
                    .store(n as u64, Ordering::Relaxed);
            }
            act.source = Some(source);
            act.busy = false;
            match result {
                Err(e) => act.fail_now(ctx, e.to_string()),
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
            self.in_flight += 1;
            self.next_seq += 1;
            if let Some(budget) = &self.inflight_bytes {
                self.held.insert(self.next_seq, budget.hold(bytes));
            }
            let deadlines = std::mem::take(&mut polled.lock_deadlines);
            let meta = self.counters.metrics.polled(&polled.records, deadlines);
            self.batch_meta.insert(self.next_seq, meta);
            let trace = BatchTrace::new(&self.identity, self.next_seq, &polled.records, started);
            self.converter.do_send(SourceBatch {
                seq: self.next_seq,
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
                Err(e) => act.fail_now(ctx, e.to_string()),
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
        let batches = std::mem::take(&mut self.settled);
        let acks: Vec<Ack> = batches
            .iter()
            .flat_map(|b| b.acks.iter().cloned())
            .collect();
        let failure = batches.iter().find_map(|b| b.fail_task.clone());
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
            let result = match source
                .start_from(&start_offsets)
                .and_then(|()| source.settle(&acks))
            {
                Ok(()) => source.commit(timeout).await,
                Err(e) => Err(e),
            };
            (source, acks, result, started, started.elapsed())
        }
        .instrument(current);
        let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
        ctx.spawn(fut.into_actor(self).map(move |(source, acks, result, started, elapsed), act, ctx| {
            drop(spans);
            act.source = Some(source);
            act.busy = false;
            act.parked = false;
            act.in_flight = act.in_flight.saturating_sub(credits);
            // Done with, committed or not (what was not is redelivered by the broker).
            for seq in &seqs {
                act.held.remove(seq);
            }
            match result {
                Err(e) => return act.fail_now(ctx, e.to_string()),
                Ok(committed) => {
                    for failure in &committed.failures {
                        warn!(task = act.task, failure = %failure, "commit not applied; records will be redelivered");
                    }
                    TaskCounters::add(&counters.ack_failures, committed.unapplied.len());
                    if !committed.accepted.is_empty() {
                        // Behind every batch already sent, on the same path, to the sink task.
                        act.converter.do_send(Acknowledged {
                            records: committed.accepted.clone(),
                        });
                    }
                    count(&counters, &acks, &committed.unapplied);
                    let per_batch: Vec<(&[Ack], Option<BatchMeta>)> = batches
                        .iter()
                        .map(|b| b.acks.as_slice())
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
                    if !act.progressed && !acks.is_empty() && committed.failures.is_empty() {
                        act.progressed = true;
                        (act.reporter)(TaskEvent::Progress {
                            task: act.task,
                            generation: act.generation,
                        });
                    }
                }
            }
            if act.failure.is_none() {
                act.failure = failure;
            }
            act.step(ctx);
        }));
    }

    fn close_step(&mut self, ctx: &mut Context<Self>) {
        let Some(source) = self.source.take() else {
            return;
        };
        self.busy = true;
        let fut = async move { source.close().await };
        ctx.spawn(fut.into_actor(self).map(|result, act, _ctx| {
            act.busy = false;
            act.finished = true;
            if let Err(e) = result {
                warn!(task = act.task, error = %e, "closing the consumer failed");
            }
            act.converter.do_send(Finish {
                failure: act.failure.clone(),
            });
        }));
    }
}

/// Counts the verdicts that took effect.
fn count(counters: &TaskCounters, acks: &[Ack], unapplied: &[RecordCoordinates]) {
    let unapplied: HashSet<&RecordCoordinates> = unapplied.iter().collect();
    for ack in acks.iter().filter(|a| !unapplied.contains(&a.record)) {
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
                Err(e) => act.fail_now(ctx, e.to_string()),
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
        self.settled.push(msg);
        self.parked = false;
        self.step(ctx);
    }
}

impl Handler<Drain> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, _msg: Drain, ctx: &mut Context<Self>) {
        self.draining = true;
        if self.source.is_none() && !self.busy && !self.finished {
            // Never connected: nothing to close.
            self.finished = true;
            self.converter.do_send(Finish { failure: None });
            return;
        }
        self.step(ctx);
    }
}
