//! AckerActor: the last stage of a batch. It writes the batch's dead letters and waits for the
//! broker to confirm them (a REJECT must not come before its dead letter is safe), then sends
//! the verdicts back to the ConsumerActor as [`Settled`] — the credit for the next batch.
//! A dead letter that cannot be written turns its record's verdict into RELEASE and fails the
//! task: the record is kept by the broker instead of being thrown away.

use std::sync::Arc;

use actix::prelude::*;
use spillway_core::{Ack, Disposition};
use tracing::Instrument;

use crate::consumer::ConsumerActor;
use crate::dead_letter::DeadLetterWriter;
use crate::messages::{Settled, Verdicts};
use crate::status::TaskCounters;
use crate::telemetry::BatchStage;

pub struct AckerActor {
    consumer: Addr<ConsumerActor>,
    dead_letters: Option<Arc<dyn DeadLetterWriter>>,
    counters: Arc<TaskCounters>,
}

impl AckerActor {
    pub fn new(
        consumer: Addr<ConsumerActor>,
        dead_letters: Option<Arc<dyn DeadLetterWriter>>,
        counters: Arc<TaskCounters>,
    ) -> Self {
        AckerActor {
            consumer,
            dead_letters,
            counters,
        }
    }
}

impl Actor for AckerActor {
    type Context = Context<Self>;
}

fn settle(verdicts: Verdicts) -> Settled {
    Settled {
        ack: verdicts.ack,
        acks: verdicts
            .verdicts
            .into_iter()
            .map(|v| Ack {
                record: v.record,
                disposition: v.disposition,
                implicit: false,
            })
            .collect(),
        fail_task: verdicts.fail_task,
        fail_for_good: verdicts.fail_for_good,
        trace: verdicts.trace,
        start_offsets: verdicts.start_offsets,
        pause_fetch_until: verdicts.pause_fetch_until,
    }
}

impl Handler<Verdicts> for AckerActor {
    type Result = ();

    fn handle(&mut self, mut batch: Verdicts, ctx: &mut Context<Self>) {
        let span = batch.trace.span(BatchStage::Ack);
        let letters: Vec<(usize, spillway_core::DeadLetterRecord)> = batch
            .verdicts
            .iter_mut()
            .enumerate()
            .filter_map(|(i, v)| v.dead_letter.take().map(|d| (i, *d)))
            .collect();
        let writer = match (&self.dead_letters, letters.is_empty()) {
            (Some(w), false) => Arc::clone(w),
            _ => {
                let _entered = span.enter();
                self.consumer.do_send(settle(batch));
                return;
            }
        };
        let (positions, records): (Vec<usize>, Vec<_>) = letters.into_iter().unzip();
        let topics: Vec<String> = records.iter().map(|r| r.topic.clone()).collect();
        let requests = records.len();
        let fut = async move { writer.write(records).await }.instrument(span.clone());
        // `wait`: batches settle in order, each after its dead letters are confirmed.
        ctx.wait(fut.into_actor(self).map(move |results, act, _ctx| {
            let mut written = 0;
            for ((i, result), topic) in positions.into_iter().zip(results).zip(topics) {
                match result {
                    Ok(()) => written += 1,
                    Err(reason) => {
                        let v = &mut batch.verdicts[i];
                        let error = crate::error::RuntimeError::DeadLetter {
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
            act.consumer.do_send(settle(batch));
        }));
    }
}
