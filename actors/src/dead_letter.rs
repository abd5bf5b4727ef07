//! Writing dead letters: records that failed conversion, a transform or `put` go to
//! `errors.deadletterqueue.topic.name`, confirmed by the broker before their source record is
//! rejected (so a REJECT never loses a record that was meant to be kept).

use std::sync::Arc;

use async_trait::async_trait;
use spillway_core::DeadLetterRecord;
use spillway_kafka::producer::{IdempotentProducer, OutRecord};

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
