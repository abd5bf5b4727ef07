//! Polling, the pipeline's first stage: a poll starts when the task has a credit, its
//! tenant's budgets have room and no fetch pause holds; what it brings goes down the pipeline
//! as one batch.

use super::*;

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

impl ConsumerActor {
    /// True while the sink stage asked for a pause of fetching (its target is failing); then
    /// a wake-up is scheduled for its end.
    pub(super) fn fetch_paused(&mut self, ctx: &mut Context<Self>) -> bool {
        let Phase::FetchPaused {
            until,
            successes_at_pause,
            wakeup_scheduled,
        } = &mut self.phase
        else {
            return false;
        };
        let until = *until;
        let now = Instant::now();
        let target_back = self.target_health.successes() != *successes_at_pause;
        if now >= until || target_back {
            if target_back && now < until {
                info!(
                    task = self.task,
                    "another task's put succeeded: the target is back, fetching again"
                );
            }
            self.phase = Phase::Running;
            if let Some(source) = self.source.idle_mut() {
                source.pause_fetching(None);
            }
            return false;
        }
        if !*wakeup_scheduled {
            *wakeup_scheduled = true;
            // Looks again at least every PAUSE_CHECK for another task's success.
            ctx.run_later((until - now).min(PAUSE_CHECK), |act, ctx| {
                if let Phase::FetchPaused {
                    wakeup_scheduled, ..
                } = &mut act.phase
                {
                    *wakeup_scheduled = false;
                }
                act.step(ctx);
            });
        }
        true
    }

    /// True while the tenant's budget has not paid for the records already polled; then a
    /// wake-up is scheduled for when it can. Commits go on meanwhile: only polling waits.
    pub(super) fn over_budget(&mut self, ctx: &mut Context<Self>) -> bool {
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
    pub(super) fn inflight_bytes_full(&mut self, ctx: &mut Context<Self>) -> bool {
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

    pub(super) fn poll_step(&mut self, ctx: &mut Context<Self>) {
        let Some(mut source) = self.source.take() else {
            return;
        };
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
            act.source = SourceSlot::Idle(source);
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
    pub(super) fn dispatch(&mut self, mut polled: Polled, started: SystemTime) {
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
    pub(super) fn keep_alive_if_idle(&mut self, ctx: &mut Context<Self>) {
        if !self.phase.running() {
            return;
        }
        let due = self
            .source
            .idle_mut()
            .and_then(|source| source.keep_alive_after())
            .is_some_and(|after| self.last_poll.elapsed() >= after);
        if !due {
            return;
        }
        let Some(mut source) = self.source.take() else {
            return;
        };
        self.last_poll = Instant::now();
        let started = SystemTime::now();
        let fut = async move {
            let result = source.keep_alive().await;
            (source, result)
        };
        ctx.spawn(fut.into_actor(self).map(move |(source, result), act, ctx| {
            act.source = SourceSlot::Idle(source);
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
    pub(super) fn park(&mut self, ctx: &mut Context<Self>) {
        self.parked = true;
        ctx.run_later(self.poll_timeout, |act, ctx| {
            act.parked = false;
            act.step(ctx);
        });
    }
}
