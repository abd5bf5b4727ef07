//! AckerActor: the last stage of a task's pipeline. It takes the sink stage's [`Outcomes`],
//! writes their dead letters and waits for the broker to confirm them (a REJECT must never
//! come before its dead letter is safe), then acknowledges every record (share mode: ACCEPT,
//! RELEASE, REJECT) or marks its offset (classic mode) and commits — one commit for every batch
//! settled meanwhile — and hands the batches' credits back to the ConsumerActor as
//! [`Committed`], so that it may poll again.
//!
//! The consumer polls and the acker commits through the same Kafka client ([`SharedSource`]):
//! one call at a time, since a share consumer's acknowledgements ride on its next fetch.
//!
//! Nothing waits for a lock to expire when the task already knows a batch is lost: every batch
//! polled is announced here ([`BatchPolled`]) with its record coordinates, and a batch dropped
//! unsettled anywhere in the pipeline (its [`BatchAck`] dropped: a panic, a failed `put`, a
//! failing task) comes back as [`Unsettled`]; its records are released at once (share mode;
//! classic mode reads them again and commits no offset past them) and the task fails. A stop
//! that is not done within `task.shutdown.graceful.timeout.ms` releases whatever is still in
//! flight the same way ([`ReleaseInFlight`]).
//!
//! A dead letter that cannot be written turns its record's verdict into RELEASE and fails the
//! task: the broker keeps the record instead of it being thrown away.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use spillway_core::{
    Ack, BatchOwner, DeadLetterRecord, Disposition, RawRecord, RecordCoordinates, Topic,
    TopicPartition,
};
use tracing::{error, warn, Instrument, Span};

use crate::consumer::ConsumerActor;
use crate::converter::ConverterActor;
use crate::dead_letter::DeadLetterWriter;
use crate::error::RuntimeError;
use crate::lock_retry::{LockFacts, TargetHealth};
use crate::messages::{
    Acknowledged, Archived, BatchPolled, Committed, Outcomes, ReleaseInFlight, Reporter, Stopping,
    TaskEvent, TaskFailure, Unsettled,
};
use crate::metrics::{BatchMeta, CommitOutcome};
use crate::panic_guard::guard_future;
use crate::source::RecordSource;
use crate::status::TaskCounters;
use crate::telemetry::{BatchStage, BatchTrace};

/// The task's Kafka client, shared by the consumer (poll, close) and the acker (commit) on the
/// task's thread; the lock makes them take turns. Empty until the consumer has connected it,
/// and again once it is closed.
pub type SharedSource = Rc<tokio::sync::Mutex<Option<Box<dyn RecordSource>>>>;

/// What an AckerActor needs to run.
pub struct AckerSetup {
    pub source: SharedSource,
    pub consumer: Addr<ConsumerActor>,
    pub converter: Addr<ConverterActor>,
    pub dead_letters: Option<Arc<dyn DeadLetterWriter>>,
    pub counters: Arc<TaskCounters>,
    pub task: u32,
    pub generation: u64,
    pub reporter: Reporter,
    pub commit_timeout: Duration,
    /// Share mode: the broker's delivery attempt limit, to tell releases it archives.
    pub delivery_attempt_limit: u16,
    /// Shared with the sink stage: the commit time its retries leave room for.
    pub lock_facts: LockFacts,
    /// Shared by the connector's tasks: a fetch pause ends early on another task's success.
    pub target_health: TargetHealth,
}

pub struct AckerActor {
    source: SharedSource,
    consumer: Addr<ConsumerActor>,
    converter: Addr<ConverterActor>,
    dead_letters: Option<Arc<dyn DeadLetterWriter>>,
    counters: Arc<TaskCounters>,
    task: u32,
    generation: u64,
    reporter: Reporter,
    commit_timeout: Duration,
    delivery_attempt_limit: u16,
    lock_facts: LockFacts,
    target_health: TargetHealth,
    /// Batches between poll and commit, with their records (to release them should the batch
    /// be lost). Removed once the batch's verdicts are committed.
    batches: HashMap<u64, InFlight>,
    /// Outcomes (or releases) not yet acknowledged and committed.
    settled: Vec<Settlement>,
    /// A commit is running.
    committing: bool,
    /// A commit failed: releases would fail the same way; the consumer closes without them.
    commits_broken: bool,
    /// The task is stopping: no fetch pause is set any more.
    stopping: bool,
    /// The task has committed a verdict since it started (reported once, as progress).
    progressed: bool,
}

/// A batch's verdicts as the acker applies and commits them.
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
    /// What its commit's metrics need (record timestamps, locks).
    meta: Option<BatchMeta>,
    /// Its verdicts (or releases) wait in `settled`: a later report on it is stale.
    queued: bool,
    /// Share mode: its records on their last allowed delivery, named for the log and the
    /// task's trace should the batch be released without verdicts (the broker archives them).
    last_deliveries: Vec<String>,
}

/// A batch's record coordinates, compactly: runs of consecutive offsets of one partition,
/// in the batch's order, with a topic name per topic. A poll's records come a partition at a
/// time in offset order, so a batch of hundreds is a few runs: one comparison per record, not
/// a search of the topics and an entry per record (issue 18).
#[derive(Default)]
pub struct BatchRecords {
    topics: Vec<Topic>,
    /// (index in `topics`, partition, first offset, records).
    runs: Vec<(u32, i32, i64, u32)>,
}

impl BatchRecords {
    pub fn of(records: &[RawRecord]) -> Self {
        let mut out = BatchRecords::default();
        for r in records {
            if let Some((topic, partition, first, n)) = out.runs.last_mut() {
                if *partition == r.partition
                    && r.offset == *first + i64::from(*n)
                    && *n < u32::MAX
                    && out.topics[*topic as usize] == r.topic
                {
                    *n += 1;
                    continue;
                }
            }
            let topic = match out.topics.iter().position(|t| *t == r.topic) {
                Some(i) => i,
                None => {
                    out.topics.push(r.topic.clone());
                    out.topics.len() - 1
                }
            };
            out.runs.push((topic as u32, r.partition, r.offset, 1));
        }
        out
    }

    /// A RELEASE of every record, marked as released because the batch was lost.
    fn releases(&self) -> Vec<Ack> {
        self.runs
            .iter()
            .flat_map(|&(topic, partition, first, n)| {
                (first..first + i64::from(n)).map(move |offset| Ack {
                    record: RecordCoordinates::new(
                        self.topics[topic as usize].clone(),
                        partition,
                        offset,
                    ),
                    disposition: Disposition::Release,
                    implicit: true,
                })
            })
            .collect()
    }
}

/// Records of `records` on their last allowed delivery, as `topic-partition@offset (delivery
/// n of limit)`; none in classic mode (no delivery counts) or without a limit.
pub fn last_deliveries(records: &[RawRecord], limit: u16) -> Vec<String> {
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

/// Tells the acker of a batch dropped unsettled (a `BatchAck`'s drop, on any thread).
struct AckerOwner(Addr<AckerActor>);

impl BatchOwner for AckerOwner {
    fn unsettled(&self, batch: u64, reason: String) {
        self.0.do_send(Unsettled { seq: batch, reason });
    }
}

impl AckerActor {
    pub fn new(s: AckerSetup) -> Self {
        AckerActor {
            source: s.source,
            consumer: s.consumer,
            converter: s.converter,
            dead_letters: s.dead_letters,
            counters: s.counters,
            task: s.task,
            generation: s.generation,
            reporter: s.reporter,
            commit_timeout: s.commit_timeout,
            delivery_attempt_limit: s.delivery_attempt_limit,
            lock_facts: s.lock_facts,
            target_health: s.target_health,
            batches: HashMap::new(),
            settled: Vec::new(),
            committing: false,
            commits_broken: false,
            stopping: false,
            progressed: false,
        }
    }

    /// The owner of the batches whose verdicts the acker at `addr` commits.
    pub fn batch_owner(addr: Addr<AckerActor>) -> Arc<dyn BatchOwner> {
        Arc::new(AckerOwner(addr))
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
            self.consumer.do_send(Archived {
                records: batch.last_deliveries.clone(),
                reason: why.to_owned(),
            });
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
        Some(n)
    }

    /// Acknowledges and commits every batch settled so far, in one commit; one at a time.
    fn commit_step(&mut self, ctx: &mut Context<Self>) {
        if self.committing || self.settled.is_empty() {
            return;
        }
        if self.commits_broken {
            // The consumer closes without them; the close gives their records back.
            let records: usize = self.settled.iter().map(|b| b.acks.len()).sum();
            warn!(
                task = self.task,
                records,
                "verdicts not committed after a failed commit; the broker redelivers their records"
            );
            self.settled.clear();
            return;
        }
        self.committing = true;
        let mut batches = std::mem::take(&mut self.settled);
        // The verdicts move out of their batches into one list (no copy per record); each
        // batch's share of it is found again by its length.
        let ack_counts: Vec<usize> = batches.iter().map(|b| b.acks.len()).collect();
        let acks: Vec<Ack> = match batches.as_mut_slice() {
            // One batch (the usual case): its list is taken as it is, not copied.
            [only] => std::mem::take(&mut only.acks),
            _ => {
                let mut acks = Vec::with_capacity(ack_counts.iter().sum());
                for b in &mut batches {
                    acks.append(&mut b.acks);
                }
                acks
            }
        };
        let failure = batches
            .iter()
            .find_map(|b| b.fail_task.clone().map(|trace| (trace, b.fail_for_good)));
        // The target is failing: no new records until its next attempt (set on the consumer
        // before the commit, whose acknowledgement would otherwise be followed by a fetch at
        // once); a stopping task fetches nothing anyway.
        let pause = batches
            .iter()
            .filter_map(|b| b.pause_fetch_until)
            .max()
            .filter(|_| !self.stopping)
            .map(|until| (until, self.target_health.successes()));
        let start_offsets: BTreeMap<TopicPartition, i64> = batches
            .iter()
            .flat_map(|b| b.start_offsets.iter().map(|(tp, o)| (tp.clone(), *o)))
            .collect();
        let credits = batches.len();
        let counters = Arc::clone(&self.counters);
        let timeout = self.commit_timeout;
        let metas: Vec<Option<BatchMeta>> = batches
            .iter()
            .map(|b| self.batches.get_mut(&b.seq).and_then(|f| f.meta.take()))
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
        let source = Rc::clone(&self.source);
        let fut = async move {
            let started = Instant::now();
            let mut guard = source.lock().await;
            let result = match guard.as_mut() {
                // Closed by a stop that could not wait: the close gave the records back.
                None => Ok(None),
                Some(source) => {
                    if let Some((until, _)) = pause {
                        source.pause_fetching(Some(until));
                    }
                    guard_future(async {
                        match source
                            .start_from(&start_offsets)
                            .and_then(|()| source.settle(&acks))
                        {
                            Ok(()) => source.commit(timeout).await.map(Some),
                            Err(e) => Err(e),
                        }
                    })
                    .await
                    .unwrap_or_else(|panic| {
                        Err(RuntimeError::Source(format!(
                            "the consumer's commit {panic}"
                        )))
                    })
                }
            };
            drop(guard);
            (acks, result, started, started.elapsed())
        }
        .instrument(current);
        let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
        ctx.spawn(fut.into_actor(self).map(move |(acks, result, started, elapsed), act, ctx| {
            drop(spans);
            act.committing = false;
            act.lock_facts.set_commit_time(elapsed);
            // Done with, committed or not (what was not is redelivered by the broker).
            for seq in &seqs {
                act.batches.remove(seq);
            }
            let mut committed = match result {
                Err(e) => {
                    let queued: usize = act.settled.iter().map(|b| b.acks.len()).sum();
                    warn!(task = act.task, records = acks.len() + queued, error = %e, "commit failed; the broker redelivers the records whose verdicts it held");
                    act.commits_broken = true;
                    act.settled.clear();
                    act.consumer.do_send(Committed {
                        seqs,
                        result: Err(e),
                        pause: None,
                        failure: None,
                    });
                    return;
                }
                Ok(None) => {
                    warn!(task = act.task, records = acks.len(), "verdicts not committed: the consumer closed first; the broker redelivers their records");
                    act.consumer.do_send(Committed {
                        seqs,
                        result: Ok(()),
                        pause: None,
                        failure: None,
                    });
                    return;
                }
                Ok(Some(committed)) => committed,
            };
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
                    all_applied: committed.failures.is_empty() && committed.unapplied.is_empty(),
                    unapplied: &committed.unapplied,
                    expired: &committed.expired,
                    delivery_attempt_limit: act.delivery_attempt_limit,
                },
            );
            if committed.failures.is_empty() {
                TaskCounters::add(&counters.committed_batches, credits);
            }
            // Releases are no progress (of a lost batch, or of one a task-level error gave
            // back): a task failing on every batch must still run out of restarts, with its
            // backoff growing.
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
            act.consumer.do_send(Committed {
                seqs,
                result: Ok(()),
                pause,
                // errors.tolerance=none: this batch is committed; the task fails now.
                failure,
            });
            act.commit_step(ctx);
        }));
    }

    /// Queues a batch's verdicts for the next commit.
    fn settle(&mut self, batch: Outcomes, ctx: &mut Context<Self>) {
        let seq = batch.ack.settle();
        match self.batches.get_mut(&seq) {
            // Released meanwhile (the stop's deadline): the releases stand.
            None => return,
            Some(in_flight) if in_flight.queued => return,
            Some(in_flight) => in_flight.queued = true,
        }
        self.settled.push(Settlement {
            seq,
            acks: batch.verdicts.acks,
            fail_task: batch.fail_task,
            fail_for_good: batch.fail_for_good,
            trace: batch.trace,
            start_offsets: batch.start_offsets,
            pause_fetch_until: batch.pause_fetch_until,
        });
        self.commit_step(ctx);
    }
}

/// Counts the verdicts that took effect: one add per counter and batch, not per record.
fn count(counters: &TaskCounters, acks: &[Ack], unapplied: &[RecordCoordinates]) {
    let unapplied: HashSet<&RecordCoordinates> = unapplied.iter().collect();
    let (mut accepted, mut released, mut rejected, mut implicit) = (0, 0, 0, 0);
    for ack in acks
        .iter()
        .filter(|a| unapplied.is_empty() || !unapplied.contains(&a.record))
    {
        implicit += usize::from(ack.implicit);
        match ack.disposition {
            Disposition::Accept => accepted += 1,
            Disposition::Release => released += 1,
            Disposition::Reject { .. } => rejected += 1,
        }
    }
    for (counter, n) in [
        (&counters.metrics.released_unsettled, implicit),
        (&counters.accepted, accepted),
        (&counters.released, released),
        (&counters.rejected, rejected),
    ] {
        if n > 0 {
            TaskCounters::add(counter, n);
        }
    }
}

impl Actor for AckerActor {
    type Context = Context<Self>;
}

impl Handler<BatchPolled> for AckerActor {
    type Result = ();

    fn handle(&mut self, msg: BatchPolled, _ctx: &mut Context<Self>) {
        self.batches.insert(
            msg.seq,
            InFlight {
                records: msg.records,
                meta: Some(msg.meta),
                queued: false,
                last_deliveries: msg.last_deliveries,
            },
        );
    }
}

impl Handler<Outcomes> for AckerActor {
    type Result = ();

    fn handle(&mut self, mut batch: Outcomes, ctx: &mut Context<Self>) {
        let span = batch.trace.span(BatchStage::Ack);
        let letters: Vec<(usize, DeadLetterRecord)> =
            std::mem::take(&mut batch.verdicts.dead_letters)
                .into_iter()
                .map(|(i, letter)| (i, *letter))
                .collect();
        let writer = match (&self.dead_letters, letters.is_empty()) {
            (Some(w), false) => Arc::clone(w),
            _ => {
                let _entered = span.enter();
                return self.settle(batch, ctx);
            }
        };
        let (positions, records): (Vec<usize>, Vec<_>) = letters.into_iter().unzip();
        let topics: Vec<String> = records.iter().map(|r| r.topic.clone()).collect();
        let requests = records.len();
        let fut = async move { writer.write(records).await }.instrument(span.clone());
        // `wait`: batches settle in order, each after its dead letters are confirmed.
        ctx.wait(fut.into_actor(self).map(move |results, act, ctx| {
            let mut written = 0;
            for ((i, result), topic) in positions.into_iter().zip(results).zip(topics) {
                match result {
                    Ok(()) => written += 1,
                    Err(reason) => {
                        let v = &mut batch.verdicts.acks[i];
                        let error = RuntimeError::DeadLetter {
                            record: v.record.to_string(),
                            topic,
                            reason,
                        };
                        v.disposition = Disposition::Release;
                        if batch.fail_task.is_none() {
                            batch.fail_task = Some(error.to_string());
                        }
                    }
                }
            }
            TaskCounters::add(&act.counters.dead_lettered, written);
            act.counters
                .metrics
                .dead_letters_written(requests, requests - written);
            let _entered = span.enter();
            act.settle(batch, ctx);
        }));
    }
}

impl Handler<Unsettled> for AckerActor {
    type Result = ();

    /// A batch was lost in the pipeline: its records are released now, not when their locks
    /// run out, and the task fails with the reason.
    fn handle(&mut self, msg: Unsettled, ctx: &mut Context<Self>) {
        let Some(released) = self.release_batch(msg.seq, &msg.reason) else {
            return;
        };
        warn!(task = self.task, batch = msg.seq, records = released, reason = %msg.reason, "batch dropped before its verdicts were decided; releasing its records");
        self.consumer.do_send(TaskFailure(msg.reason));
        self.commit_step(ctx);
    }
}

impl Handler<ReleaseInFlight> for AckerActor {
    type Result = ();

    fn handle(&mut self, msg: ReleaseInFlight, ctx: &mut Context<Self>) {
        self.stopping = true;
        let pending: Vec<u64> = self
            .batches
            .iter()
            .filter(|(_, b)| !b.queued)
            .map(|(seq, _)| *seq)
            .collect();
        if pending.is_empty() {
            return;
        }
        let released: usize = pending
            .into_iter()
            .filter_map(|seq| self.release_batch(seq, msg.why))
            .sum();
        warn!(
            task = self.task,
            released,
            reason = msg.why,
            "releasing the records still in flight"
        );
        self.commit_step(ctx);
    }
}

impl Handler<Stopping> for AckerActor {
    type Result = ();

    fn handle(&mut self, _msg: Stopping, _ctx: &mut Context<Self>) {
        self.stopping = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_lost_batch_releases_each_of_its_records_in_order_whatever_their_runs() {
        // A small generator of its own: runs, gaps, repeats, partitions and topics mixed.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        for _ in 0..300 {
            let mut records = Vec::new();
            let mut offset = next(1_000) as i64;
            for _ in 0..next(60) {
                offset += match next(6) {
                    0 => 0,
                    1 => 2 + next(5) as i64,
                    2 => -(next(3) as i64),
                    _ => 1,
                };
                let topic = ["a", "b"][next(5).min(1) as usize];
                let partition = next(4).min(2) as i32;
                records.push(RawRecord::new(Topic::from(topic), partition, offset));
            }
            let expected: Vec<(String, i32, i64)> = records
                .iter()
                .map(|r| (r.topic.to_string(), r.partition, r.offset))
                .collect();
            let batch = BatchRecords::of(&records);
            assert!(batch.runs.len() <= records.len());
            let released: Vec<(String, i32, i64)> = batch
                .releases()
                .into_iter()
                .map(|a| {
                    assert!(a.implicit && matches!(a.disposition, Disposition::Release));
                    (
                        a.record.topic.to_string(),
                        a.record.partition,
                        a.record.offset,
                    )
                })
                .collect();
            assert_eq!(released, expected);
        }
        let consecutive: Vec<RawRecord> = (5..505).map(|o| RawRecord::new("t", 1, o)).collect();
        assert_eq!(BatchRecords::of(&consecutive).runs, vec![(0, 1, 5, 500)]);
    }

    fn ack(offset: i64, disposition: Disposition, implicit: bool) -> Ack {
        Ack {
            record: RecordCoordinates::new("t", 0, offset),
            disposition,
            implicit,
        }
    }

    #[test]
    fn only_the_verdicts_that_took_effect_are_counted() {
        let counters = TaskCounters::default();
        let acks = [
            ack(0, Disposition::Accept, false),
            ack(1, Disposition::Accept, false),
            ack(2, Disposition::Release, true),
            ack(
                3,
                Disposition::Reject {
                    reason: "bad".into(),
                },
                false,
            ),
            ack(4, Disposition::Accept, false),
        ];
        count(&counters, &acks, &[]);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(get(&counters.accepted), 3);
        assert_eq!(get(&counters.released), 1);
        assert_eq!(get(&counters.rejected), 1);
        assert_eq!(get(&counters.metrics.released_unsettled), 1);
        // The lock of offsets 1 and 2 ran out: their verdicts did not take effect.
        count(
            &counters,
            &acks,
            &[acks[1].record.clone(), acks[2].record.clone()],
        );
        assert_eq!(get(&counters.accepted), 5);
        assert_eq!(get(&counters.released), 1);
        assert_eq!(get(&counters.rejected), 2);
        assert_eq!(get(&counters.metrics.released_unsettled), 1);
    }
}
