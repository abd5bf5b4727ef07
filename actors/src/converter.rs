//! ConverterActor: runs the connector's converters and transforms (core's `RecordPipeline`)
//! over each batch. Failures are not decided here: they travel with the batch so the sink
//! stage applies `errors.tolerance` to conversion and `put` failures alike. A panic in a
//! converter, transform or predicate is not a record error but a bug: its batch is released
//! and the task fails with the panic's message and location.

use actix::prelude::*;
use spillway_core::RecordPipeline;

use crate::messages::{Acknowledged, Failing, Finish, FlushHeld, Ready, SinkBatch, SourceBatch};
use crate::panic_guard::guard;
use crate::sink::SinkActor;
use crate::telemetry::BatchStage;

pub struct ConverterActor {
    pipeline: RecordPipeline,
    sink: Addr<SinkActor>,
    failing: Failing,
}

impl ConverterActor {
    pub fn new(pipeline: RecordPipeline, sink: Addr<SinkActor>, failing: Failing) -> Self {
        ConverterActor {
            pipeline,
            sink,
            failing,
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
            records,
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
            // The raw records stay in their list, which moves on whole with the batch.
            guard(move || {
                let mut not_ready = Vec::new();
                let mut ready = Ready {
                    indices: Vec::with_capacity(records.len()),
                    records: Vec::with_capacity(records.len()),
                };
                for (i, raw) in records.iter().enumerate() {
                    match pipeline.process_into(raw, &mut ready.records) {
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
