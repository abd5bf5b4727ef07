//! SinkActor: owns the connector's `SinkTask` and hands it one batch at a time (Connect's
//! lifecycle: `start` → `open` → `put`/`flush`… → `close` → `stop`), then turns each record's
//! fate into a verdict for the acker:
//!
//! - `put` succeeded (and the batch was flushed) → ACCEPT; a transform filtered it → ACCEPT.
//! - retriable error → share mode: RELEASE, the broker redelivers it (KIP-1302); classic mode:
//!   Connect's retry — the record is put again after a backoff, within `errors.retry.timeout`
//!   (forever when it is -1 or unset), and counts as failed after that.
//! - conversion, transform or fatal `put` error → logged when `errors.log.enable`, written to the
//!   dead letter queue when one is set, then REJECT under `errors.tolerance=all`; under `none`
//!   the task fails after this batch is committed (the record is REJECTed when its dead letter
//!   was written, RELEASEd otherwise, so it is never lost).
//!
//! Each batch is flushed before its verdicts leave, so ACCEPT means the sink has the record.
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
    Assignment, ConfigMap, ConnectError, ConsumerGroupMetadata, Disposition, ErrorContext,
    Processed, PutOutcome, RawRecord, SinkError, SinkRecord, SinkTask, Stage, TopicPartition,
};
use tracing::{error, warn, Instrument};

use crate::acker::AckerActor;
use crate::consumer::ConsumerActor;
use crate::messages::{
    Acknowledged, Entry, Failing, Finish, SinkBatch, TaskFailure, Verdict, Verdicts,
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
}

/// A batch as `run_batch` works on it (its `BatchAck` stays with the handler, which settles
/// or releases it whatever `run_batch` comes to).
struct PutBatch {
    changes: Vec<AssignmentChange>,
    entries: Vec<Entry>,
    trace: BatchTrace,
    group: Option<ConsumerGroupMetadata>,
}

/// What `run_batch` decided.
struct Decided {
    verdicts: Vec<Verdict>,
    fail_task: Option<String>,
    trace: BatchTrace,
    start_offsets: BTreeMap<TopicPartition, i64>,
    changes: Vec<AssignmentChange>,
}

impl SinkActor {
    pub fn new(
        task: Box<dyn SinkTask>,
        acker: Addr<AckerActor>,
        consumer: Addr<ConsumerActor>,
        ctx: SinkContext,
    ) -> Self {
        SinkActor {
            task: Some(task),
            acker,
            consumer,
            ctx: Rc::new(ctx),
            open: Vec::new(),
            failed: None,
        }
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
                Ok(Ok(())) => act.task = Some(task),
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
            entries,
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
        let sink_ctx = Rc::clone(&self.ctx);
        let work = PutBatch {
            changes,
            entries,
            trace,
            group,
        };
        let fut = async move {
            let result = guard_future(run_batch(task.as_mut(), work, &sink_ctx)).await;
            (task, result)
        };
        ctx.wait(fut.into_actor(self).map(move |(task, result), act, _ctx| {
            match result {
                Ok(Ok(decided)) => {
                    act.task = Some(task);
                    for change in decided.changes {
                        match change {
                            AssignmentChange::Opened(a) => act.open.push(a),
                            AssignmentChange::Closed(a) => act.open.retain(|o| *o != a),
                        }
                    }
                    act.acker.do_send(Verdicts {
                        ack,
                        verdicts: decided.verdicts,
                        fail_task: decided.fail_task,
                        trace: decided.trace,
                        start_offsets: decided.start_offsets,
                    });
                }
                Ok(Err(trace)) => {
                    act.task = Some(task);
                    act.failed = Some(trace.clone());
                    // The batch's records are released and the task fails with `trace`.
                    ack.release(trace);
                }
                Err(panic) => {
                    // Never called again, not even `close`/`stop`: its state is unknown.
                    drop(task);
                    let trace = format!("the sink task {panic}");
                    act.failed = Some(trace.clone());
                    ack.release(trace);
                }
            }
        }));
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

impl Handler<Finish> for SinkActor {
    type Result = ResponseActFuture<Self, Option<String>>;

    /// Closes what is open and stops the sink task; a panic there is the answer (a failure).
    fn handle(&mut self, _msg: Finish, _ctx: &mut Context<Self>) -> Self::Result {
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
            // The task's last work on its thread.
            crate::telemetry::leave_thread_span();
            ctx.stop();
            outcome
        }))
    }
}

/// Connect's initial retry backoff.
const FIRST_BACKOFF: Duration = Duration::from_millis(300);

/// Opens/closes what changed, puts the ready records (retrying in classic mode), flushes, and
/// decides every record's verdict. `Err` is a failure of the task itself.
async fn run_batch(
    task: &mut dyn SinkTask,
    batch: PutBatch,
    ctx: &SinkContext,
) -> Result<Decided, String> {
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
    let ready: Vec<(usize, SinkRecord)> = batch
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match &e.processed {
            Processed::Ready(r) => Some((i, r.clone())),
            _ => None,
        })
        .collect();
    let mut outcomes: BTreeMap<usize, PutOutcome> = BTreeMap::new();
    let put_span = batch.trace.span(BatchStage::Put);
    if !ready.is_empty() {
        put_with_retries(task, ready, ctx, &mut outcomes)
            .instrument(put_span.clone())
            .await;
        let mut offsets: BTreeMap<TopicPartition, i64> = BTreeMap::new();
        for (i, outcome) in &outcomes {
            if outcome.is_ok() {
                let c = &batch.entries[*i].raw;
                let next = offsets
                    .entry(TopicPartition::new(c.topic.clone(), c.partition))
                    .or_insert(0);
                *next = (*next).max(c.offset + 1);
            }
        }
        if !offsets.is_empty() {
            if let Err(e) = task.flush(&offsets).instrument(put_span.clone()).await {
                if !(e.is_retriable() && ctx.share) {
                    return Err(format!("the sink task failed to flush: {e}"));
                }
                // Not durable: give the records back rather than accept them.
                warn!(task = ctx.task, error = %e, "flush failed; releasing the batch");
                for outcome in outcomes.values_mut() {
                    if outcome.is_ok() {
                        *outcome = PutOutcome::Retriable(e.clone());
                    }
                }
            }
        }
    }
    let mut fail_task = None;
    let mut verdicts = Vec::with_capacity(batch.entries.len());
    for (i, entry) in batch.entries.into_iter().enumerate() {
        let record = entry.raw.coordinates();
        let failure = match (entry.processed, outcomes.remove(&i)) {
            (Processed::Filtered, _) => {
                TaskCounters::add(&ctx.counters.filtered, 1);
                None
            }
            (Processed::Failed { stage, error }, _) => {
                ctx.counters.metrics.conversion_failed();
                Some((stage, error))
            }
            (Processed::Ready(_), Some(PutOutcome::Ok)) => None,
            (Processed::Ready(_), Some(PutOutcome::Retriable(e))) if ctx.share => {
                ctx.counters.metrics.retried(1);
                ctx.counters.metrics.logged(ctx.errors.log_enable);
                if ctx.errors.log_enable {
                    warn!(connector = %ctx.connector, task = ctx.task, record = %record, error = %e, "retriable put error; releasing the record");
                }
                verdicts.push(Verdict {
                    record,
                    disposition: Disposition::Release,
                    dead_letter: None,
                });
                continue;
            }
            (Processed::Ready(_), Some(PutOutcome::Retriable(e) | PutOutcome::Fatal(e))) => {
                Some((Stage::TaskPut, ConnectError::Sink(e)))
            }
            (Processed::Ready(_), None) => Some((
                Stage::TaskPut,
                ConnectError::Sink(SinkError::fatal("put returned no outcome")),
            )),
        };
        let Some((stage, error)) = failure else {
            verdicts.push(Verdict {
                record,
                disposition: Disposition::Accept,
                dead_letter: None,
            });
            continue;
        };
        let (verdict, fatal) = failed_verdict(ctx, entry.raw, stage, &error);
        verdicts.push(verdict);
        if fatal && fail_task.is_none() {
            fail_task = Some(format!(
                "{} failed at stage {} and errors.tolerance is none: {error}",
                record,
                stage.as_str()
            ));
        }
    }
    Ok(Decided {
        verdicts,
        fail_task,
        trace: batch.trace,
        start_offsets,
        changes: batch.changes,
    })
}

/// Puts `ready`; in classic mode retriable records are put again after a growing backoff
/// until they succeed or `errors.retry.timeout` runs out.
async fn put_with_retries(
    task: &mut dyn SinkTask,
    mut ready: Vec<(usize, SinkRecord)>,
    ctx: &SinkContext,
    outcomes: &mut BTreeMap<usize, PutOutcome>,
) {
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    loop {
        let records: Vec<SinkRecord> = ready.iter().map(|(_, r)| r.clone()).collect();
        TaskCounters::add(&ctx.counters.put, records.len());
        let put_started = Instant::now();
        let result = PutOutcome::expand(task.put(&records).await, records.len());
        let failed = result.iter().filter(|o| !o.is_ok()).count();
        ctx.counters.metrics.put_done(put_started.elapsed(), failed);
        let mut retry = Vec::new();
        for ((i, record), outcome) in ready.into_iter().zip(result) {
            if matches!(outcome, PutOutcome::Retriable(_)) && !ctx.share {
                retry.push((i, record));
            }
            outcomes.insert(i, outcome);
        }
        let budget_left = match ctx.errors.retry_timeout {
            RetryTimeout::Forever | RetryTimeout::Never => true,
            RetryTimeout::For(limit) => started.elapsed() + backoff <= limit,
        };
        if retry.is_empty() || !budget_left {
            return;
        }
        ctx.counters.metrics.retried(retry.len());
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(ctx.errors.retry_delay_max.max(FIRST_BACKOFF));
        ready = retry;
    }
}

/// The verdict for a record that failed, and whether it fails the task.
fn failed_verdict(
    ctx: &SinkContext,
    raw: RawRecord,
    stage: Stage,
    error: &ConnectError,
) -> (Verdict, bool) {
    let record = raw.coordinates();
    if ctx.errors.log_enable {
        if ctx.errors.log_include_messages {
            error!(connector = %ctx.connector, task = ctx.task, record = %record, stage = stage.as_str(), key = ?raw.key, value = ?raw.value, headers = ?raw.headers, error = %error, "record failed");
        } else {
            error!(connector = %ctx.connector, task = ctx.task, record = %record, stage = stage.as_str(), error = %error, "record failed");
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
        dead_letter_record(&raw, &dlq.topic, dlq.context_headers.then_some(&context))
    });
    let fatal = ctx.errors.tolerance == ErrorTolerance::None;
    ctx.counters
        .metrics
        .record_error(!fatal, ctx.errors.log_enable);
    let disposition = if fatal && dead_letter.is_none() {
        // The task fails; the record stays available rather than being thrown away.
        Disposition::Release
    } else {
        Disposition::Reject {
            reason: format!("{}: {error}", stage.as_str()),
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
