//! ConsumerActor: owns the task's Kafka consumer. It polls while the task has credits (fewer
//! than `task.inflight.batches` batches in flight), and applies and commits the verdicts that
//! come back with each credit — so the consumer is only ever used from here, one call at a time.
//!
//! A batch counts as done only once its acknowledgements (share mode) or offsets (classic mode)
//! are committed. On [`Drain`] it stops polling, waits for the batches in flight, commits,
//! leaves the group and passes [`Finish`] down the pipeline.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use spillway_core::{Ack, Disposition, RecordCoordinates};
use tracing::warn;

use crate::converter::ConverterActor;
use crate::error::RuntimeError;
use crate::messages::{Acknowledged, Drain, Finish, Reporter, Settled, SourceBatch, TaskEvent};
use crate::source::RecordSource;
use crate::status::TaskCounters;

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
    counters: Arc<TaskCounters>,
    reporter: Reporter,
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
}

/// What a ConsumerActor needs to run.
pub struct ConsumerSetup {
    pub factory: SourceFactory,
    pub converter: Addr<ConverterActor>,
    pub task: u32,
    pub generation: u64,
    pub max_inflight: usize,
    pub poll_timeout: Duration,
    pub commit_timeout: Duration,
    pub counters: Arc<TaskCounters>,
    pub reporter: Reporter,
}

impl ConsumerActor {
    pub fn new(s: ConsumerSetup) -> Self {
        ConsumerActor {
            factory: Some(s.factory),
            source: None,
            converter: s.converter,
            task: s.task,
            generation: s.generation,
            max_inflight: s.max_inflight.max(1),
            poll_timeout: s.poll_timeout,
            commit_timeout: s.commit_timeout,
            counters: s.counters,
            reporter: s.reporter,
            next_seq: 0,
            in_flight: 0,
            settled: Vec::new(),
            busy: false,
            draining: false,
            failure: None,
            progressed: false,
            finished: false,
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
        } else if self.in_flight < self.max_inflight {
            self.poll_step(ctx);
        }
    }

    fn poll_step(&mut self, ctx: &mut Context<Self>) {
        let Some(mut source) = self.source.take() else {
            return;
        };
        self.busy = true;
        let timeout = self.poll_timeout;
        let fut = async move {
            let result = source.poll(timeout).await;
            (source, result)
        };
        ctx.spawn(fut.into_actor(self).map(|(source, result), act, ctx| {
            act.source = Some(source);
            act.busy = false;
            match result {
                Err(e) => act.fail_now(ctx, e.to_string()),
                Ok(polled) => {
                    if !polled.records.is_empty() || !polled.changes.is_empty() {
                        TaskCounters::add(&act.counters.read, polled.records.len());
                        act.in_flight += 1;
                        act.next_seq += 1;
                        act.converter.do_send(SourceBatch {
                            seq: act.next_seq,
                            changes: polled.changes,
                            records: polled.records,
                            group: polled.group,
                        });
                    }
                    act.step(ctx);
                }
            }
        }));
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
        let credits = batches.len();
        let counters = Arc::clone(&self.counters);
        self.busy = true;
        let timeout = self.commit_timeout;
        let fut = async move {
            let result = match source.settle(&acks) {
                Ok(()) => source.commit(timeout).await,
                Err(e) => Err(e),
            };
            (source, acks, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(source, acks, result), act, ctx| {
            act.source = Some(source);
            act.busy = false;
            act.in_flight = act.in_flight.saturating_sub(credits);
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
                    act.source = Some(source);
                    act.step(ctx);
                }
                Err(e) => act.fail_now(ctx, e.to_string()),
            }
        }));
    }
}

impl Handler<Settled> for ConsumerActor {
    type Result = ();

    fn handle(&mut self, msg: Settled, ctx: &mut Context<Self>) {
        self.settled.push(msg);
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
