//! Acknowledging, the pipeline's last stage: the verdicts that come back with each credit
//! ([`Settled`]) are acknowledged (share mode: ACCEPT, RELEASE, REJECT) or their offsets
//! committed (classic mode), in one commit for every batch settled meanwhile; a batch lost on
//! the way ([`Unsettled`]) has its records released at once.

use super::*;

/// A batch's verdicts as the consumer applies and commits them.
pub(super) struct Settlement {
    pub(super) seq: u64,
    pub(super) acks: Vec<Ack>,
    pub(super) fail_task: Option<String>,
    pub(super) fail_for_good: bool,
    pub(super) trace: BatchTrace,
    pub(super) start_offsets: BTreeMap<TopicPartition, i64>,
    pub(super) pause_fetch_until: Option<Instant>,
}

/// One batch between poll and commit.
pub(super) struct InFlight {
    pub(super) records: BatchRecords,
    /// Its verdicts (or releases) wait in `settled`: a later report on it is stale.
    pub(super) queued: bool,
    /// Share mode: its records on their last allowed delivery, named for the log and the
    /// task's trace should the batch be released without verdicts (the broker archives them).
    pub(super) last_deliveries: Vec<String>,
}

/// A batch's record coordinates, compactly (a topic name per topic, not per record).
#[derive(Default)]
pub(super) struct BatchRecords {
    pub(super) topics: Vec<Topic>,
    pub(super) records: Vec<(u32, i32, i64)>,
}

impl BatchRecords {
    pub(super) fn of(records: &[RawRecord]) -> Self {
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
    pub(super) fn releases(&self) -> Vec<Ack> {
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

impl ConsumerActor {
    /// Queues a RELEASE of every record of batch `seq`, released because `why`; returns how
    /// many records that is, or `None` when the batch is not in flight any more or its
    /// verdicts are queued already. Records on their last allowed delivery are named in the
    /// log now and in the task's final trace: the broker archives them.
    pub(super) fn release_batch(&mut self, seq: u64, why: &str) -> Option<usize> {
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

    pub(super) fn commit_step(&mut self, ctx: &mut Context<Self>) {
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
            if self.phase.running() {
                source.pause_fetching(Some(until));
                let wakeup_scheduled = matches!(
                    self.phase,
                    Phase::FetchPaused {
                        wakeup_scheduled: true,
                        ..
                    }
                );
                self.phase = Phase::FetchPaused {
                    until,
                    successes_at_pause: self.target_health.successes(),
                    wakeup_scheduled,
                };
            }
        }
        let start_offsets: BTreeMap<TopicPartition, i64> = batches
            .iter()
            .flat_map(|b| b.start_offsets.iter().map(|(tp, o)| (tp.clone(), *o)))
            .collect();
        let credits = batches.len();
        let counters = Arc::clone(&self.counters);
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
            act.source = SourceSlot::Idle(source);
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
}
