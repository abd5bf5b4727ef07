//! A classic source's whole read path, librdkafka's side included, for instruction counts
//! under callgrind (bench/README.md, issue 18). librdkafka's in-process mock cluster holds
//! `records` 100-byte records over 4 partitions; `consume` then reads them back through a
//! `ClassicSource` in polls of 500 on a current-thread runtime, marks each poll done and
//! commits it, as a connector's source does:
//!
//! ```text
//! classic_poll_cost produce 100000   # the cluster and the records only
//! classic_poll_cost consume 100000   # the same, then read back
//! ```
//!
//! Instructions per record read: (consume - produce) / records.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use spillway_kafka::classic::{ClassicConfig, ClassicSource};

const TOPIC: &str = "cost";
const PARTITIONS: i32 = 4;

fn produce(bootstrap: &str, records: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .expect("a producer");
    let value = vec![b'x'; 100];
    for i in 0..records {
        let key = format!("key-{i:010}");
        let mut record = BaseRecord::to(TOPIC)
            .key(&key)
            .payload(&value)
            .partition((i % PARTITIONS as usize) as i32);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("producing record {i}: {e}"),
            }
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .expect("every record produced");
}

async fn consume(bootstrap: &str, records: usize) -> usize {
    let mut config = ClassicConfig::new(bootstrap, "cost");
    config.max_poll_records = 500;
    let source = ClassicSource::connect(config).expect("a consumer");
    source.subscribe(&[TOPIC.to_owned()]).expect("subscribe");
    let mut read = 0;
    while read < records {
        let polled = source.poll(Duration::from_millis(100)).await.expect("poll");
        source.mark_done_all(
            polled
                .records
                .iter()
                .map(|r| (r.topic.as_str(), r.partition, r.offset)),
        );
        source.commit().await.expect("commit");
        read += polled.records.len();
    }
    source.close().await.expect("close");
    read
}

fn main() {
    let mut args = std::env::args().skip(1);
    let part = args.next().unwrap_or_else(|| "consume".to_string());
    let records: usize = args
        .next()
        .map(|n| n.parse().expect("records: a number"))
        .unwrap_or(100_000);
    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster
        .create_topic(TOPIC, PARTITIONS, 1)
        .expect("the topic");
    let bootstrap = cluster.bootstrap_servers();
    produce(&bootstrap, records);
    match part.as_str() {
        "produce" => println!("produced {records} records"),
        "consume" => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let read = runtime.block_on(consume(&bootstrap, records));
            println!("read {read} of {records} records");
        }
        other => panic!("part: produce or consume, not {other}"),
    }
}
