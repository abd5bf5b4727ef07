//! The record's way through a task before `put`: convert the key and value, then run the
//! transform chain. Each raw record comes out ready for the sink, filtered by a transform
//! (which counts as handled), or failed with the stage that failed it — what the runtime needs
//! to apply `errors.tolerance` and write a dead letter.

use crate::config::ConfigMap;
use crate::convert::RecordConverter;
use crate::error::{ConfigError, ConnectError, ConvertError, Stage};
use crate::record::{RawRecord, SinkRecord};
use crate::transforms::TransformChain;

/// What became of one raw record.
// `Ready` is the common case: boxing it to shrink the rare variants would cost an
// allocation per record.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Processed {
    /// Converted and transformed: give it to `put`.
    Ready(SinkRecord),
    /// A transform dropped it: acknowledge it as handled.
    Filtered,
    /// Conversion or a transform failed; `stage` says which.
    Failed { stage: Stage, error: ConnectError },
}

/// Converters and transforms of one connector.
#[derive(Debug)]
pub struct RecordPipeline {
    converter: RecordConverter,
    transforms: TransformChain,
}

impl RecordPipeline {
    pub fn new(converter: RecordConverter, transforms: TransformChain) -> Self {
        RecordPipeline {
            converter,
            transforms,
        }
    }

    /// Built from the connector's configuration and the worker's (for converter defaults).
    pub fn from_config(connector: &ConfigMap, worker: &ConfigMap) -> Result<Self, ConfigError> {
        Ok(RecordPipeline::new(
            RecordConverter::from_config(connector, worker)?,
            TransformChain::from_config(connector)?,
        ))
    }

    /// Whether the records pass through transforms (which may read their headers).
    pub fn transforms(&self) -> bool {
        !self.transforms.is_empty()
    }

    /// [`process`](Self::process) with a ready record pushed onto `ready`; what is not ready
    /// comes back. Without transforms the record goes from the converter into the list, not
    /// through a `Processed` first (a move of the whole record fewer, per record).
    #[inline]
    pub fn process_into(&self, raw: &RawRecord, ready: &mut Vec<SinkRecord>) -> Option<Processed> {
        if self.transforms.is_empty() {
            return self
                .converter
                .convert_into(raw, ready)
                .err()
                .map(conversion_failed);
        }
        match self.process(raw) {
            Processed::Ready(record) => {
                ready.push(record);
                None
            }
            other => Some(other),
        }
    }

    /// [`process_into`](Self::process_into) when nothing reads the raw record's key and value
    /// after this (no dead letter queue, no error log with the record): without transforms
    /// they move into the sink record, and `raw` keeps neither.
    #[inline]
    pub fn process_owned_into(
        &self,
        raw: &mut RawRecord,
        ready: &mut Vec<SinkRecord>,
    ) -> Option<Processed> {
        if self.transforms.is_empty() {
            return self
                .converter
                .convert_owned_into(raw, ready)
                .err()
                .map(conversion_failed);
        }
        self.process_into(raw, ready)
    }

    /// Takes `raw` by reference so the caller keeps the original bytes for a dead letter.
    pub fn process(&self, raw: &RawRecord) -> Processed {
        let record = match self.converter.convert(raw) {
            // No transforms: the record goes straight out, wrapped where it was built (each
            // pass through the chain moves it twice).
            Ok(record) if self.transforms.is_empty() => return Processed::Ready(record),
            Ok(record) => record,
            Err(e) => return conversion_failed(e),
        };
        match self.transforms.apply(record) {
            Ok(Some(record)) => Processed::Ready(record),
            Ok(None) => Processed::Filtered,
            Err(e) => Processed::Failed {
                stage: Stage::Transformation,
                error: e.into(),
            },
        }
    }
}

/// A record the key or value converter refused, with the stage that refused it.
fn conversion_failed(e: ConvertError) -> Processed {
    Processed::Failed {
        stage: e.stage(),
        error: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;
    use bytes::Bytes;

    fn pipeline() -> RecordPipeline {
        let connector: ConfigMap = [
            ("value.converter", "json"),
            ("value.converter.schemas.enable", "false"),
            ("transforms", "skipTest,ts"),
            ("transforms.skipTest.type", "Filter"),
            ("transforms.skipTest.predicate", "isTest"),
            ("predicates", "isTest"),
            ("predicates.isTest.type", "TopicNameMatches"),
            ("predicates.isTest.pattern", "test-.*"),
            ("transforms.ts.type", "InsertField$Value"),
            ("transforms.ts.offset.field", "offset"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        RecordPipeline::from_config(&connector, &ConfigMap::new()).expect("valid")
    }

    fn raw(topic: &str, value: &'static [u8]) -> RawRecord {
        let mut r = RawRecord::new(topic, 0, 5);
        r.value = Some(Bytes::from_static(value));
        r
    }

    #[test]
    fn good_records_come_out_converted_and_transformed() {
        let Processed::Ready(record) = pipeline().process(&raw("orders", br#"{"a":1}"#)) else {
            panic!("expected a ready record")
        };
        assert_eq!(
            record.value,
            Value::string_map([("a", Value::Int64(1)), ("offset", Value::Int64(5))])
        );
    }

    #[test]
    fn filtered_records_are_reported_as_filtered() {
        assert!(matches!(
            pipeline().process(&raw("test-orders", b"{}")),
            Processed::Filtered
        ));
    }

    #[test]
    fn failures_carry_their_stage() {
        let Processed::Failed { stage, .. } = pipeline().process(&raw("orders", b"{oops")) else {
            panic!("expected a conversion failure")
        };
        assert_eq!(stage, Stage::ValueConverter);
        let Processed::Failed { stage, error } = pipeline().process(&raw("orders", b"[1]")) else {
            panic!("expected a transform failure")
        };
        assert_eq!(stage, Stage::Transformation);
        assert!(!error.is_retriable());
    }

    #[test]
    fn ready_records_are_pushed_and_the_others_come_back_with_or_without_transforms() {
        let with_transforms = pipeline();
        let without = RecordPipeline::from_config(
            &[
                ("value.converter", "json"),
                ("value.converter.schemas.enable", "false"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
            &ConfigMap::new(),
        )
        .expect("valid");
        let mut ready = Vec::new();
        assert!(with_transforms
            .process_into(&raw("orders", br#"{"a":1}"#), &mut ready)
            .is_none());
        assert!(matches!(
            with_transforms.process_into(&raw("test-orders", b"{}"), &mut ready),
            Some(Processed::Filtered)
        ));
        assert!(without
            .process_into(&raw("test-orders", br#"{"b":2}"#), &mut ready)
            .is_none());
        let Some(Processed::Failed { stage, .. }) =
            without.process_into(&raw("orders", b"{oops"), &mut ready)
        else {
            panic!("expected a conversion failure")
        };
        assert_eq!(stage, Stage::ValueConverter);
        // Only the two ready records, in order, each as `process` makes it.
        let values: Vec<_> = ready.iter().map(|r| r.value.clone()).collect();
        assert_eq!(
            values,
            [
                Value::string_map([("a", Value::Int64(1)), ("offset", Value::Int64(5))]),
                Value::string_map([("b", Value::Int64(2))]),
            ]
        );
        assert_eq!(ready[1].topic.as_str(), "test-orders");
    }
}
