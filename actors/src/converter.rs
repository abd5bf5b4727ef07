//! ConverterActor: runs the connector's converters and transforms (core's `RecordPipeline`)
//! over each batch. Failures are not decided here: they travel with the batch so the sink
//! stage applies `errors.tolerance` to conversion and `put` failures alike. A panic in a
//! converter, transform or predicate is not a record error but a bug: its batch is released
//! and the task fails with the panic's message and location.

use actix::prelude::*;
use spillway_core::config::ErrorHandling;
use spillway_core::RecordPipeline;

use crate::messages::{Acknowledged, Failing, Finish, FlushHeld, Ready, SinkBatch, SourceBatch};
use crate::panic_guard::guard;
use crate::sink::SinkActor;
use crate::telemetry::BatchStage;

pub struct ConverterActor {
    pipeline: RecordPipeline,
    sink: Addr<SinkActor>,
    failing: Failing,
    /// Whether anything reads a raw record's key and value after conversion ([`RawBytes`]).
    raw_bytes: RawBytes,
}

/// Whether a raw record's key and value are read after conversion: by a dead letter (the
/// original bytes) or an error log that includes the record. When they are not, they move
/// into the sink record instead of being shared with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawBytes {
    Kept,
    MovedOn,
}

impl RawBytes {
    /// From the connector's error handling: `errors.deadletterqueue.topic.name` and
    /// `errors.log.include.messages` read them.
    pub fn for_errors(errors: &ErrorHandling) -> RawBytes {
        if errors.dead_letter_queue.is_some() || errors.log_include_messages {
            RawBytes::Kept
        } else {
            RawBytes::MovedOn
        }
    }
}

impl ConverterActor {
    pub fn new(
        pipeline: RecordPipeline,
        sink: Addr<SinkActor>,
        failing: Failing,
        raw_bytes: RawBytes,
    ) -> Self {
        ConverterActor {
            pipeline,
            sink,
            failing,
            raw_bytes,
        }
    }
}

impl Actor for ConverterActor {
    type Context = Context<Self>;
}

impl Handler<SourceBatch> for ConverterActor {
    type Result = ();

    fn handle(&mut self, batch: SourceBatch, _ctx: &mut Context<Self>) {
        let SourceBatch {
            ack,
            changes,
            mut records,
            trace,
            group,
        } = batch;
        if self.failing.is_set() {
            ack.release("the task is failing: the batch was released before conversion");
            return;
        }
        let span = trace.span(BatchStage::Convert);
        let converted = {
            let _entered = span.enter();
            let pipeline = &self.pipeline;
            let raw_bytes = self.raw_bytes;
            // The raw records stay in their list, which moves on whole with the batch.
            guard(move || {
                let mut not_ready = Vec::new();
                let mut ready = Ready {
                    indices: Vec::with_capacity(records.len()),
                    records: Vec::with_capacity(records.len()),
                };
                for (i, raw) in records.iter_mut().enumerate() {
                    let processed = match raw_bytes {
                        RawBytes::Kept => pipeline.process_into(raw, &mut ready.records),
                        RawBytes::MovedOn => pipeline.process_owned_into(raw, &mut ready.records),
                    };
                    match processed {
                        None => ready.indices.push(i),
                        Some(other) => not_ready.push((i, other)),
                    }
                }
                (records, not_ready, ready)
            })
        };
        match converted {
            Ok((raws, not_ready, ready)) => self.sink.do_send(SinkBatch {
                ack,
                changes,
                raws,
                not_ready,
                ready,
                trace,
                group,
            }),
            Err(panic) => {
                self.failing.set();
                ack.release(format!("a converter or transform {panic}"));
            }
        }
    }
}

impl Handler<Finish> for ConverterActor {
    type Result = ResponseFuture<Option<String>>;

    fn handle(&mut self, msg: Finish, _ctx: &mut Context<Self>) -> Self::Result {
        let sink = self.sink.clone();
        Box::pin(async move {
            sink.send(msg)
                .await
                .unwrap_or_else(|_| Some("the sink stage stopped before the task".to_owned()))
        })
    }
}

/// Passed on behind the batches sent before it.
impl Handler<FlushHeld> for ConverterActor {
    type Result = ();

    fn handle(&mut self, msg: FlushHeld, _ctx: &mut Context<Self>) {
        self.sink.do_send(msg);
    }
}

impl Handler<Acknowledged> for ConverterActor {
    type Result = ();

    fn handle(&mut self, msg: Acknowledged, _ctx: &mut Context<Self>) {
        self.sink.do_send(msg);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spillway_core::config::{DeadLetterQueue, ErrorTolerance, RetryTimeout};

    use super::*;

    fn errors(dead_letter_queue: bool, log_include_messages: bool) -> ErrorHandling {
        ErrorHandling {
            tolerance: ErrorTolerance::All,
            retry_timeout: RetryTimeout::Infinite,
            retry_delay_max: Duration::from_secs(60),
            log_enable: true,
            log_include_messages,
            dead_letter_queue: dead_letter_queue.then(|| DeadLetterQueue {
                topic: "dlq".into(),
                replication_factor: 1,
                context_headers: true,
            }),
        }
    }

    #[test]
    fn raw_bytes_are_kept_for_a_dead_letter_queue_or_a_log_with_the_record_only() {
        assert_eq!(
            RawBytes::for_errors(&errors(false, false)),
            RawBytes::MovedOn
        );
        assert_eq!(RawBytes::for_errors(&errors(true, false)), RawBytes::Kept);
        assert_eq!(RawBytes::for_errors(&errors(false, true)), RawBytes::Kept);
        assert_eq!(RawBytes::for_errors(&errors(true, true)), RawBytes::Kept);
    }
}
