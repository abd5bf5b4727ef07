//! Stopping: on [`Drain`] or a failure no new poll starts; the batches in flight are
//! committed as they come back (or released at the stop's deadline), the consumer leaves the
//! group, the sink task is closed down the pipeline and the task's final event is reported.

use super::*;

/// Records released without verdicts on their last allowed delivery, and why: the broker
/// archives them, so the task's final status names them.
#[derive(Default)]
pub(super) struct ArchivedOnRelease {
    pub(super) records: Vec<String>,
    pub(super) reason: Option<String>,
}

impl ArchivedOnRelease {
    /// The sentence for the task's trace; `None` when there were none.
    pub(super) fn describe(&self) -> Option<String> {
        const LISTED: usize = 10;
        if self.records.is_empty() {
            return None;
        }
        let mut listed = self.records[..self.records.len().min(LISTED)].join(", ");
        if self.records.len() > LISTED {
            listed.push_str(&format!(" and {} more", self.records.len() - LISTED));
        }
        Some(format!(
            "{} record(s) on their last allowed delivery (group.share.delivery.count.limit) were \
             released without a verdict ({}); the broker archives them instead of delivering \
             them again, so they were neither written nor dead-lettered: {listed}",
            self.records.len(),
            self.reason.as_deref().unwrap_or("the batch was lost")
        ))
    }
}

/// The least time a stop's close and finish steps get, however short the graceful timeout.
const MIN_STOP_WAIT: Duration = Duration::from_millis(500);

impl ConsumerActor {
    /// The task cannot go on: stop polling, release what is in flight (the stages drop the
    /// batches they still get), commit, leave the group, then report `Failed` with the first
    /// failure's trace.
    pub(super) fn fail(&mut self, ctx: &mut Context<Self>, trace: String) {
        self.fail_as(ctx, trace, false);
    }

    /// Like [`fail`](Self::fail); `for_good`: a restart cannot help, the task stays FAILED.
    pub(super) fn fail_as(&mut self, ctx: &mut Context<Self>, trace: String, for_good: bool) {
        self.failing.set();
        // The first failure is the one reported.
        match &mut self.phase {
            Phase::Failing { .. } | Phase::Finishing { failure: Some(_) } => {}
            Phase::Finishing { failure } => *failure = Some((trace, for_good)),
            Phase::Running | Phase::FetchPaused { .. } | Phase::Draining => {
                warn!(task = self.task, trace = %trace, "task failing; releasing its records in flight");
                self.phase = Phase::Failing { trace, for_good };
                self.acker.do_send(Stopping);
            }
        }
        self.schedule_stop_deadline(ctx);
        self.step(ctx);
    }

    /// The source failed (a poll or commit error, or a panic in it). A broker the egress
    /// policy refused stays refused: the task stays FAILED, no restart loop.
    pub(super) fn fail_now(&mut self, ctx: &mut Context<Self>, error: RuntimeError) {
        let for_good = matches!(error, RuntimeError::Egress(_));
        self.fail_as(ctx, error.to_string(), for_good);
    }

    /// A stop that is not done by its deadline releases whatever is still in flight, a little
    /// before the connector cuts the task off, so that the releases can still be committed.
    pub(super) fn schedule_stop_deadline(&mut self, ctx: &mut Context<Self>) {
        if self.stop_scheduled {
            return;
        }
        self.stop_scheduled = true;
        let reserve = (self.shutdown_timeout / 5).min(Duration::from_secs(1));
        ctx.run_later(self.shutdown_timeout - reserve, |act, ctx| {
            if matches!(act.phase, Phase::Finishing { .. }) {
                return;
            }
            if act.in_flight.is_empty() {
                return;
            }
            warn!(task = act.task, batches = act.in_flight.len(), timeout_ms = act.shutdown_timeout.as_millis() as u64, "the task did not stop within task.shutdown.graceful.timeout.ms; releasing its records in flight");
            act.acker.do_send(ReleaseInFlight {
                why: "the task did not stop within task.shutdown.graceful.timeout.ms",
            });
            act.failing.set();
            act.step(ctx);
        });
    }

    /// Share mode: records fetched ahead that the stopping task never got are released by
    /// the close; those on their last allowed delivery are archived by the broker, so they are
    /// named (ERROR, the archived count, the task's final trace) like a lost batch's.
    fn name_unpolled_last_deliveries(&mut self, unpolled: Vec<(RecordCoordinates, u16)>) {
        let limit = self.delivery_attempt_limit;
        if limit == 0 || unpolled.is_empty() {
            return;
        }
        let at_limit: Vec<String> = unpolled
            .iter()
            .filter(|(_, count)| *count >= limit)
            .map(|(c, count)| format!("{c} (delivery {count} of {limit})"))
            .collect();
        info!(
            task = self.task,
            records = unpolled.len(),
            "records fetched ahead and not handed to the task are released by the close"
        );
        if at_limit.is_empty() {
            return;
        }
        let why =
            "fetched ahead but not handed to the task before it stopped; the close releases them";
        error!(task = self.task, records = %at_limit.join(", "), reason = why, "releasing records on their last allowed delivery without a verdict: the broker archives them");
        TaskCounters::add(&self.counters.metrics.archived_by_limit, at_limit.len());
        self.archived_on_release.records.extend(at_limit);
        self.archived_on_release
            .reason
            .get_or_insert_with(|| why.to_owned());
    }

    /// Commits what is settled and leaves the group (bounded by the stop's time), then
    /// finishes the task.
    pub(super) fn close_step(&mut self, ctx: &mut Context<Self>) {
        if self.source != SourceSlot::Idle {
            return;
        }
        self.source = SourceSlot::InUse;
        let limit = self.shutdown_timeout.max(MIN_STOP_WAIT);
        // Everything settled is committed by now; a failing task does not hold the others.
        let gate = self.close_together.take();
        let wait = limit / 2;
        let client = std::rc::Rc::clone(&self.client);
        let fut = async move {
            // Taken out: a commit the acker still tries finds the client closed.
            let taken = client.lock().await.take();
            let Some(mut source) = taken else {
                return (Vec::new(), Ok(Ok(Ok(()))));
            };
            let unpolled = source.take_unpolled();
            if let Some(gate) = gate {
                gate.arrive_and_wait(wait).await;
            }
            let closed = tokio::time::timeout(limit, guard_future(source.close())).await;
            (unpolled, closed)
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(move |(unpolled, result), act, ctx| {
                    act.name_unpolled_last_deliveries(unpolled);
                    act.source = SourceSlot::Absent;
                    match result {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Ok(Err(e))) => {
                            warn!(task = act.task, error = %e, "closing the consumer failed")
                        }
                        Ok(Err(panic)) => warn!(task = act.task, "closing the consumer {panic}"),
                        Err(_) => warn!(
                            task = act.task,
                            limit_ms = limit.as_millis() as u64,
                            "closing the consumer timed out"
                        ),
                    }
                    act.finish(ctx);
                }),
        );
    }

    /// Closes and stops the sink task down the pipeline, then reports the task's final event
    /// (`Failed` with the first failure's trace, else `Stopped`) and stops.
    pub(super) fn finish(&mut self, ctx: &mut Context<Self>) {
        let failure = match std::mem::replace(&mut self.phase, Phase::Finishing { failure: None }) {
            Phase::Finishing { failure } => {
                // Finishing already.
                self.phase = Phase::Finishing { failure };
                return;
            }
            Phase::Failing { trace, for_good } => Some((trace, for_good)),
            Phase::Running | Phase::FetchPaused { .. } | Phase::Draining => None,
        };
        self.phase = Phase::Finishing { failure };
        let limit = self.shutdown_timeout.max(MIN_STOP_WAIT);
        let finished = self.converter.send(Finish);
        let fut = async move { tokio::time::timeout(limit, finished).await };
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            let closing_failure = match result {
                Ok(Ok(failure)) => failure,
                Ok(Err(_)) => Some("the task's pipeline stopped before it was finished".to_owned()),
                Err(_) => {
                    warn!(
                        task = act.task,
                        limit_ms = limit.as_millis() as u64,
                        "the sink task did not close and stop in time"
                    );
                    None
                }
            };
            let (failure, for_good) = match &mut act.phase {
                Phase::Finishing { failure } => failure.take().unzip(),
                _ => (None, None),
            };
            let for_good = for_good.unwrap_or(false);
            let mut failure = failure.or(closing_failure);
            // Records the broker archives are named in a FAILED status, never let go silently
            // (a stop past its deadline fails the task for this alone).
            if let Some(archived) = act.archived_on_release.describe() {
                failure = Some(match failure {
                    Some(trace) => format!("{trace}. {archived}"),
                    None => archived,
                });
            }
            let event = match failure {
                Some(trace) => TaskEvent::Failed {
                    task: act.task,
                    generation: act.generation,
                    trace,
                    for_good,
                },
                None => TaskEvent::Stopped {
                    task: act.task,
                    generation: act.generation,
                },
            };
            (act.reporter)(event);
            ctx.stop();
        }));
    }
}
