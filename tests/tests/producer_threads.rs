//! The threads of Spillway's producers (kafka/src/producer.rs): they keep librdkafka's linger,
//! which gathers a put's records into few produce requests, and flush once a caller has queued
//! its records, so no caller waits the linger out (`Flusher`); and their polling thread sleeps
//! while librdkafka has nothing for it (`PollingThread`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use spillway_kafka::producer::{IdempotentProducer, OutRecord};
use spillway_tests::DevBroker;

const PRODUCE: i16 = 0;
const PARTITIONS: i32 = 4;

fn records(topic: &str, n: usize) -> Vec<OutRecord> {
    (0..n)
        .map(|i| OutRecord {
            topic: topic.into(),
            partition: Some(i as i32 % PARTITIONS),
            key: Some(Bytes::from(format!("key-{i}"))),
            value: Some(Bytes::from(vec![b'v'; 100])),
            ..OutRecord::default()
        })
        .collect()
}

/// Under a linger far longer than the test, only the flush can send: each put must be confirmed
/// at once, its records in one produce request per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_goes_out_at_once_in_one_request_per_partition_under_a_long_linger() {
    let broker = DevBroker::try_start(1, &[("flushed", PARTITIONS)]).expect("a dev cluster");
    let linger = Duration::from_secs(10);
    let linger_ms = linger.as_millis().to_string();
    let producer =
        IdempotentProducer::new(&broker.bootstrap(), [("linger.ms", linger_ms.as_str())])
            .expect("producer");
    let put = |n| {
        let producer = &producer;
        async move {
            let started = Instant::now();
            let results = producer.send_all(&records("flushed", n)).await;
            let took = started.elapsed();
            assert_eq!(results.len(), n);
            for result in results {
                result.expect("written");
            }
            assert!(
                took < linger / 4,
                "a put of {n} records took {took:?}: it waited for linger.ms ({linger:?}) instead of being flushed"
            );
        }
    };
    // The first put also waits for the connection and the producer id, which may outlast one
    // flush slice: it must not wait out the linger either.
    put(10).await;
    let puts = 5;
    broker.start_request_tracking();
    for _ in 0..puts {
        put(500).await;
    }
    let produce_requests = broker.request_counts().get(&PRODUCE).copied().unwrap_or(0);
    // librdkafka makes one request per partition and batch: 20 when each put's flush alone
    // sends. A flush still running for the previous put (until its delivery reports are
    // freed) sends records queued meanwhile at once, in pieces (29 in a loaded CI run); one by
    // one would be 2,500.
    let at_most = puts * PARTITIONS as u64 * 4;
    assert!(
        produce_requests <= at_most,
        "{produce_requests} produce requests for {puts} puts of 500 records to {PARTITIONS} partitions (at most {at_most})"
    );
}

/// CPU time (user + system, in clock ticks) of this process's threads named `name` (as the
/// kernel keeps it: its first 15 bytes).
fn threads_cpu_ticks(name: &str) -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("a task").path();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        // After the name: state (field 3) ... utime (14), stime (15).
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        ticks +=
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    }
    ticks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_producers_polling_threads_sleep() {
    let broker = DevBroker::try_start(1, &[("idle", PARTITIONS)]).expect("a dev cluster");
    let mut producers = Vec::new();
    for _ in 0..4 {
        let producer = IdempotentProducer::new(&broker.bootstrap(), []).expect("producer");
        for result in producer.send_all(&records("idle", 10)).await {
            result.expect("written");
        }
        producers.push(producer);
    }
    let polling = "producer pollin";
    let before = threads_cpu_ticks(polling);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spent = threads_cpu_ticks(polling) - before;
    // rdkafka's own polling thread spun in the last millisecond of every 100 ms: about 1% of a
    // core each: 11 ticks here (0 to 2 with this thread).
    assert!(
        spent <= 2,
        "4 idle producers' polling threads spent {spent} clock ticks of CPU in 3 s"
    );
    drop(producers);
}
