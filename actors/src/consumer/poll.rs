//! Polling, the pipeline's first stage: a poll starts when the task has a credit, its
//! tenant's budgets have room and no fetch pause holds; what it brings goes down the pipeline
//! as one batch.

use super::*;

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
            self.resume_fetching = true;
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
        if self.source != SourceSlot::Idle {
            return;
        }
        self.source = SourceSlot::InUse;
        let in_flight = !self.in_flight.is_empty();
        let timeout = if in_flight {
            self.poll_timeout.min(POLL_WHILE_IN_FLIGHT)
        } else {
            self.poll_timeout
        };
        let resume = std::mem::take(&mut self.resume_fetching);
        let started = SystemTime::now();
        self.last_poll = Instant::now();
        let client = std::rc::Rc::clone(&self.client);
        let fut = async move {
            let mut guard = client.lock().await;
            let Some(source) = guard.as_mut() else {
                return (
                    Err(RuntimeError::Source("the consumer is closed".into())),
                    None,
                    None,
                );
            };
            if resume {
                source.pause_fetching(None);
            }
            let result = guard_future(source.poll(timeout))
                .await
                .unwrap_or_else(|panic| {
                    Err(RuntimeError::Source(format!("the consumer's poll {panic}")))
                });
            (result, source.lock_duration(), source.partition_count())
        };
        ctx.spawn(fut.into_actor(self).map(
            move |(result, lock_duration, partitions), act, ctx| {
                act.lock_facts.set_lock_duration(lock_duration);
                if let Some(n) = partitions {
                    act.counters
                        .metrics
                        .partitions
                        .store(n as u64, Ordering::Relaxed);
                }
                act.source = SourceSlot::Idle;
                match result {
                    Err(e) => act.fail_now(ctx, e),
                    Ok(polled) => {
                        // Nothing came while batches are in flight: wait for a commit (its credit
                        // unparks) rather than spin. In flight now, not when the poll started:
                        // a commit that landed during the poll (it was queued behind another
                        // on the client) unparks nothing, and the task would sit out a whole
                        // `poll_timeout` with records waiting.
                        if !act.in_flight.is_empty()
                            && polled.records.is_empty()
                            && polled.changes.is_empty()
                        {
                            act.park(ctx);
                        }
                        act.dispatch(polled, started);
                        act.step(ctx);
                    }
                }
            },
        ));
    }

    /// Sends what a poll brought down the pipeline as one batch (taking a credit), after
    /// telling the acker of it.
    pub(super) fn dispatch(&mut self, mut polled: Polled, started: SystemTime) {
        if !polled.records.is_empty() || !polled.changes.is_empty() {
            TaskCounters::add(&self.counters.read, polled.records.len());
            // Counted only for a budget that needs it: a pass over the records otherwise.
            let bytes: u64 = if self.throttle.is_some() || self.inflight_bytes.is_some() {
                polled.records.iter().map(record_bytes).sum()
            } else {
                0
            };
            if self.throttle.is_some() {
                self.debt.records += polled.records.len() as u64;
                self.debt.bytes += bytes;
            }
            self.next_seq += 1;
            let seq = self.next_seq;
            let ack = BatchAck::new(seq, Arc::clone(&self.owner));
            let hold = self
                .inflight_bytes
                .as_ref()
                .map(|budget| budget.hold(bytes));
            self.in_flight.insert(seq, hold);
            let deadlines = std::mem::take(&mut polled.lock_deadlines);
            // Before the batch itself: the acker must know the batch to release it.
            self.acker.do_send(BatchPolled {
                seq,
                records: BatchRecords::of(&polled.records),
                last_deliveries: last_deliveries(&polled.records, self.delivery_attempt_limit),
                meta: self.counters.metrics.polled(&polled.records, deadlines),
            });
            let trace = BatchTrace::new(&self.identity, seq, &polled.records, started);
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
            .keep_alive_after
            .is_some_and(|after| self.last_poll.elapsed() >= after);
        if !due || self.source != SourceSlot::Idle {
            return;
        }
        self.source = SourceSlot::InUse;
        self.last_poll = Instant::now();
        let started = SystemTime::now();
        let client = std::rc::Rc::clone(&self.client);
        let fut = async move {
            match client.lock().await.as_mut() {
                Some(source) => source.keep_alive().await,
                None => Err(RuntimeError::Source("the consumer is closed".into())),
            }
        };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            act.source = SourceSlot::Idle;
            match result {
                Err(e) => act.fail_now(ctx, e),
                Ok(polled) => {
                    act.dispatch(polled, started);
                    act.step(ctx);
                }
            }
        }));
    }

    /// No poll until the acker reports a commit, or `poll_timeout` at the latest.
    pub(super) fn park(&mut self, ctx: &mut Context<Self>) {
        self.parked = true;
        // Batches the sink holds for its flush interval would wait for it, and this for them.
        self.converter.do_send(FlushHeld::default());
        ctx.run_later(self.poll_timeout, |act, ctx| {
            act.parked = false;
            act.step(ctx);
        });
    }
}
