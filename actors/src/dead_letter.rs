//! Writing dead letters: records that failed conversion, a transform or `put` go to
//! `errors.deadletterqueue.topic.name`, confirmed by the broker before their source record is
//! rejected (so a REJECT never loses a record that was meant to be kept).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use spillway_core::dead_letter::ERROR_HEADER_PREFIX;
use spillway_core::DeadLetterRecord;
use spillway_kafka::producer::{IdempotentProducer, OutRecord};

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
                topic: r.topic.into(),
                partition: None,
                key: r.key,
                value: r.value,
                headers: r
                    .headers
                    .into_iter()
                    .map(|(name, value)| (name.into(), value))
                    .collect(),
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
