//! The dead-letter stage, the last before the commit: [`DeadLetterActor`] writes a batch's
//! dead letters (records that failed conversion, a transform or `put`) to
//! `errors.deadletterqueue.topic.name` and waits for the broker to confirm them — a REJECT must
//! never come before its dead letter is safe — then hands the verdicts back to the
//! ConsumerActor as [`Settled`], the credit for the next batch, which acknowledges (share mode)
//! or commits offsets (classic mode). A dead letter that cannot be written turns its record's
//! verdict into RELEASE and fails the task: the broker keeps the record instead of it being
//! thrown away.

use std::sync::Arc;

use actix::prelude::*;
use async_trait::async_trait;
use bytes::Bytes;
use spillway_core::dead_letter::ERROR_HEADER_PREFIX;
use spillway_core::{Ack, DeadLetterRecord, Disposition};
use spillway_kafka::producer::{IdempotentProducer, OutRecord};
use tracing::Instrument;

use crate::consumer::ConsumerActor;
use crate::messages::{Settled, Verdicts};
use crate::status::TaskCounters;
use crate::telemetry::BatchStage;

/// Why Spillway dead-lettered a record when Connect has no header for it (share mode: the
/// record was still failing on its last allowed delivery). Written whether or not
/// `errors.deadletterqueue.context.headers.enable` is set: it is the only trace of why the
/// record left the share group.
pub const REASON_HEADER: &str = "reason";

/// `letter` with `__connect.errors.reason` set to `reason`.
pub fn with_reason(mut letter: DeadLetterRecord, reason: &str) -> DeadLetterRecord {
    let name = format!("{ERROR_HEADER_PREFIX}{REASON_HEADER}");
    letter.headers.retain(|(k, _)| *k != name);
    letter
        .headers
        .push((name, Some(Bytes::copy_from_slice(reason.as_bytes()))));
    letter
}

/// Where dead letters go. Shared by a connector's tasks.
#[async_trait]
pub trait DeadLetterWriter: Send + Sync {
    /// Writes every record; one result per record, in order, once all are confirmed.
    async fn write(&self, records: Vec<DeadLetterRecord>) -> Vec<Result<(), String>>;
}

/// Dead letters through an idempotent producer.
pub struct ProducerDeadLetters {
    producer: IdempotentProducer,
}

impl ProducerDeadLetters {
    pub fn shared(producer: IdempotentProducer) -> Arc<dyn DeadLetterWriter> {
        Arc::new(ProducerDeadLetters { producer })
    }
}

#[async_trait]
impl DeadLetterWriter for ProducerDeadLetters {
    async fn write(&self, records: Vec<DeadLetterRecord>) -> Vec<Result<(), String>> {
        let out: Vec<OutRecord> = records
            .into_iter()
            .map(|r| OutRecord {
                topic: r.topic,
                partition: None,
                key: r.key,
                value: r.value,
                headers: r.headers,
                timestamp: r.timestamp,
            })
            .collect();
        self.producer
            .send_all(&out)
            .await
            .into_iter()
            .map(|r| r.map(|_| ()).map_err(|e| e.to_string()))
            .collect()
    }
}

pub struct DeadLetterActor {
    consumer: Addr<ConsumerActor>,
    dead_letters: Option<Arc<dyn DeadLetterWriter>>,
    counters: Arc<TaskCounters>,
}

impl DeadLetterActor {
    pub fn new(
        consumer: Addr<ConsumerActor>,
        dead_letters: Option<Arc<dyn DeadLetterWriter>>,
        counters: Arc<TaskCounters>,
    ) -> Self {
        DeadLetterActor {
            consumer,
            dead_letters,
            counters,
        }
    }
}

impl Actor for DeadLetterActor {
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

impl Handler<Verdicts> for DeadLetterActor {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_header_is_connects_prefix_and_replaces_an_older_reason() {
        let letter = DeadLetterRecord {
            topic: "dlq".into(),
            key: None,
            value: None,
            headers: vec![(
                "__connect.errors.reason".into(),
                Some(Bytes::from_static(b"old")),
            )],
            timestamp: None,
        };
        let letter = with_reason(letter, "still failing on its last allowed delivery");
        assert_eq!(
            letter.headers,
            vec![(
                "__connect.errors.reason".to_owned(),
                Some(Bytes::from_static(
                    b"still failing on its last allowed delivery"
                ))
            )]
        );
    }
}
