//! ConverterActor: runs the connector's converters and transforms (core's `RecordPipeline`)
//! over each batch. Failures are not decided here: they travel with the batch so the sink
//! stage applies `errors.tolerance` to conversion and `put` failures alike.

use actix::prelude::*;
use spillway_core::RecordPipeline;

use crate::messages::{Acknowledged, Entry, Finish, SinkBatch, SourceBatch};
use crate::sink::SinkActor;
use crate::telemetry::BatchStage;

pub struct ConverterActor {
    pipeline: RecordPipeline,
    sink: Addr<SinkActor>,
}

impl ConverterActor {
    pub fn new(pipeline: RecordPipeline, sink: Addr<SinkActor>) -> Self {
        ConverterActor { pipeline, sink }
    }
}

impl Actor for ConverterActor {
    type Context = Context<Self>;
}

impl Handler<SourceBatch> for ConverterActor {
    type Result = ();

    fn handle(&mut self, batch: SourceBatch, _ctx: &mut Context<Self>) {
        let span = batch.trace.span(BatchStage::Convert);
        let _entered = span.enter();
        let entries = batch
            .records
            .into_iter()
            .map(|raw| Entry {
                processed: self.pipeline.process(&raw),
                raw,
            })
            .collect();
        self.sink.do_send(SinkBatch {
            seq: batch.seq,
            changes: batch.changes,
            entries,
            trace: batch.trace,
            group: batch.group,
        });
    }
}

impl Handler<Finish> for ConverterActor {
    type Result = ();

    fn handle(&mut self, msg: Finish, _ctx: &mut Context<Self>) {
        self.sink.do_send(msg);
    }
}

impl Handler<Acknowledged> for ConverterActor {
    type Result = ();

    fn handle(&mut self, msg: Acknowledged, _ctx: &mut Context<Self>) {
        self.sink.do_send(msg);
    }
}
