//! Test data: an rdkafka producer that writes records in large batches (the dev broker's share
//! path slows with the number of batches per partition, so tests produce few, big batches).

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// One record to produce. `partition: None` lets the producer's partitioner choose.
#[derive(Clone, Debug, Default)]
pub struct TestRecord {
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

impl TestRecord {
    /// A record with a key and a value of `size` bytes that starts with the key text, so that
    /// a consumer can tell which record it received from the value alone.
    pub fn numbered(n: u64, size: usize) -> TestRecord {
        let key = format!("k{n}");
        let mut value = format!("v{n}:").into_bytes();
        value.resize(size.max(value.len()), b'.');
        TestRecord {
            key: Some(key.into_bytes()),
            value: Some(value),
            ..TestRecord::default()
        }
    }
}

/// Where the broker stored a produced record.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Produced {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Produces `records` to `topic` with `compression` (none, gzip, snappy, lz4, zstd) and returns
/// where each landed, in input order. Panics on a delivery failure: a test cannot go on without
/// its data.
///
/// The producer is closed when this returns. On the dev broker a closing connection ends every
/// share session on that broker, so while share consumers run, produce with a [`TestProducer`]
/// that stays open instead.
pub async fn produce(
    bootstrap: &str,
    topic: &str,
    records: Vec<TestRecord>,
    compression: &str,
) -> Vec<Produced> {
    TestProducer::new(bootstrap, compression)
        .send(topic, records)
        .await
}

/// A bulk test-data producer that keeps its connections open between sends (see [`produce`]).
pub struct TestProducer {
    producer: FutureProducer,
}

impl TestProducer {
    /// Panics when the producer cannot be created: a test cannot go on without its data.
    /// Its batches are as large as the broker takes (1 MB), the fastest way to load data.
    pub fn new(bootstrap: &str, compression: &str) -> TestProducer {
        TestProducer::with_batch_bytes(bootstrap, compression, 4_000_000)
    }

    /// A producer whose batches (hence the broker's stored batches, which a fetch returns
    /// whole) hold at most `batch_bytes`.
    pub fn with_batch_bytes(
        bootstrap: &str,
        compression: &str,
        batch_bytes: usize,
    ) -> TestProducer {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("compression.type", compression)
            .set("linger.ms", "50")
            .set("batch.num.messages", "10000")
            .set("batch.size", batch_bytes.to_string())
            .set("queue.buffering.max.messages", "1000000")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "60000")
            .create()
            .unwrap_or_else(|e| panic!("cannot create the test producer for {bootstrap}: {e}"));
        TestProducer { producer }
    }

    /// Produces `records` to `topic` and returns where each landed, in input order, once all
    /// are confirmed. Panics on a delivery failure.
    pub async fn send(&self, topic: &str, records: Vec<TestRecord>) -> Vec<Produced> {
        let mut pending = Vec::with_capacity(records.len());
        for record in &records {
            let mut future_record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(p) = record.partition {
                future_record = future_record.partition(p);
            }
            if let Some(k) = &record.key {
                future_record = future_record.key(k.as_slice());
            }
            if let Some(v) = &record.value {
                future_record = future_record.payload(v.as_slice());
            }
            if let Some(ts) = record.timestamp {
                future_record = future_record.timestamp(ts);
            }
            if !record.headers.is_empty() {
                let mut headers = OwnedHeaders::new();
                for (name, value) in &record.headers {
                    headers = headers.insert(Header {
                        key: name,
                        value: value.as_deref(),
                    });
                }
                future_record = future_record.headers(headers);
            }
            let delivery = self
                .producer
                .send_result(future_record)
                .unwrap_or_else(|(e, _)| panic!("cannot enqueue a test record for {topic}: {e}"));
            pending.push(delivery);
        }
        let mut produced = Vec::with_capacity(pending.len());
        for delivery in pending {
            match delivery.await {
                Ok(Ok(d)) => produced.push(Produced {
                    topic: topic.to_string(),
                    partition: d.partition,
                    offset: d.offset,
                }),
                Ok(Err((e, _))) => panic!("a test record for {topic} was not delivered: {e}"),
                Err(_) => panic!("the test producer for {topic} was dropped before delivery"),
            }
        }
        rdkafka::producer::Producer::flush(&self.producer, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("flushing the test producer failed: {e}"));
        produced
    }
}

/// `n` numbered records of `size` bytes spread round-robin over `partitions` partitions.
pub fn numbered_records(n: u64, size: usize, partitions: i32) -> Vec<TestRecord> {
    numbered_range_sized(0, n, size, partitions)
}

/// Records `first..first + n` of [`numbered_records`] (32-byte values), so a stream can be
/// produced batch by batch without building the records before it.
pub fn numbered_range(first: u64, n: u64, partitions: i32) -> Vec<TestRecord> {
    numbered_range_sized(first, n, 32, partitions)
}

fn numbered_range_sized(first: u64, n: u64, size: usize, partitions: i32) -> Vec<TestRecord> {
    (first..first + n)
        .map(|i| TestRecord {
            partition: Some((i % partitions as u64) as i32),
            ..TestRecord::numbered(i, size)
        })
        .collect()
}
