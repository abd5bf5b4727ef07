//! Issue 15 item 7: broker faults lose nothing. A share connector and a classic connector drain
//! one topic into files while the chaos driver bounces brokers, moves partition leaders and
//! group coordinators, injects retriable errors into ShareFetch, ShareAcknowledge,
//! ShareGroupHeartbeat, Produce and FindCoordinator, and cuts every client connection (the
//! connectors reach the dev broker through the test-kit proxy). More records are produced while
//! it runs. Every record must reach both files, no task may ever show FAILED, and the
//! duplicates (allowed: at-least-once) are counted and printed.
//!
//! This is the short form for CI; `bench/src/bin/chaos_soak.rs` runs the same for 20 minutes and
//! watches the worker's memory.

mod runtime_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime_support::{config, share_broker, wait_until};
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_tests::chaos::{Chaos, ChaosTarget, FaultKind, FileTally};
use spillway_tests::{
    numbered_range, numbered_records, KafkaProxy, ProxyOptions, ProxySecurity, TestProducer,
};

const TOPIC: &str = "chaos";
const PARTITIONS: i32 = 6;
const BEFORE: u64 = 3_000;
/// How long faults are injected while records keep coming.
const CHAOS_FOR: Duration = Duration::from_secs(15);
const BATCH: u64 = 40;
const LOCK_MS: i32 = 3_000;
const SESSION_MS: i32 = 6_000;

#[tokio::test(flavor = "multi_thread")]
async fn broker_faults_lose_no_record_and_fail_no_task() {
    let broker = Arc::new(share_broker(3, LOCK_MS, SESSION_MS));
    broker.create_topic(TOPIC, PARTITIONS);
    let producer = TestProducer::new(&broker.bootstrap(), "none");
    producer
        .send(TOPIC, numbered_records(BEFORE, 32, PARTITIONS))
        .await;
    let proxy = Arc::new(
        KafkaProxy::start(
            &broker.bootstrap(),
            ProxyOptions::new(ProxySecurity::Plaintext),
        )
        .expect("proxy starts"),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let worker = Worker::start(
        config(&[
            ("bootstrap.servers", &proxy.bootstrap()),
            ("task.restart.backoff.ms", "200"),
            ("task.poll.timeout.ms", "100"),
        ]),
        ConnectorRegistry::builtin(),
    )
    .expect("worker starts");
    let share_file = dir.path().join("share.txt");
    let classic_file = dir.path().join("classic.txt");
    for (name, file, protocol, tasks) in [
        ("chaos-share", &share_file, "share", "2"),
        // One task: classic mode with 2+ tasks duplicates on rebalance (docs/runtime.md).
        ("chaos-classic", &classic_file, "classic", "1"),
    ] {
        worker
            .start_connector(config(&[
                ("name", name),
                ("connector.class", "file"),
                ("file", file.to_str().expect("utf-8 path")),
                ("topics", TOPIC),
                ("tasks.max", tasks),
                ("consumer.override.group.protocol", protocol),
                ("consumer.override.max.poll.records", "50"),
            ]))
            .await
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
    }
    let groups: Vec<String> = ["chaos-share", "chaos-classic"]
        .iter()
        .map(|name| worker.status(name).expect("registered").group_id)
        .collect();
    wait_until(Duration::from_secs(60), "both connectors writing", || {
        [&share_file, &classic_file]
            .iter()
            .all(|f| FileTally::read(f).is_ok_and(|t| t.lines > 0))
    })
    .await;

    let mut chaos = Chaos::start(
        ChaosTarget {
            broker: broker.clone(),
            proxy: Some(proxy.clone()),
            topic: TOPIC.to_owned(),
            partitions: PARTITIONS,
            groups,
            down_for: Duration::from_secs(2),
        },
        Duration::from_millis(700),
        0x5eed,
    );
    // A steady stream while the faults hit, so they meet records in flight.
    let feeding = {
        let producer = TestProducer::new(&broker.bootstrap(), "none");
        tokio::spawn(async move {
            let mut next_record = BEFORE;
            let end = Instant::now() + CHAOS_FOR;
            while Instant::now() < end {
                let records = numbered_range(next_record, BATCH, PARTITIONS);
                producer.send(TOPIC, records).await;
                next_record += BATCH;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            next_record
        })
    };
    let mut failures = Vec::new();
    watch_for_failures(&worker, &mut failures, CHAOS_FOR).await;
    let total = feeding.await.expect("producer task");
    chaos.stop();
    let log = chaos.log();
    let counts = chaos.counts();
    for kind in [
        FaultKind::BrokerBounce,
        FaultKind::LeaderMove,
        FaultKind::CoordinatorMove,
        FaultKind::RetriableErrors,
        FaultKind::ConnectionKill,
    ] {
        assert!(
            counts.get(&kind).copied().unwrap_or(0) > 0,
            "the chaos driver never injected {kind:?}: {log:#?}"
        );
    }

    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        watch_for_failures(&worker, &mut failures, Duration::from_millis(500)).await;
        let done = [&share_file, &classic_file]
            .iter()
            .all(|f| FileTally::read(f).is_ok_and(|t| t.distinct() >= total));
        if done || Instant::now() > deadline {
            break;
        }
    }
    for (name, file) in [
        ("chaos-share", &share_file),
        ("chaos-classic", &classic_file),
    ] {
        let tally = FileTally::read(file).expect("readable output");
        let missing = tally.missing(total);
        println!(
            "{name}: {} of {total} records, {} duplicates, {} lines",
            tally.distinct(),
            tally.duplicates(),
            tally.lines
        );
        assert!(
            missing.is_empty(),
            "{name} lost {} records after chaos (first: {:?}); faults: {log:#?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
        assert_eq!(tally.foreign, 0, "{name} wrote lines that are no record");
    }
    println!("faults injected: {counts:?}");
    assert!(
        failures.is_empty(),
        "a retriable fault failed a task: {failures:#?}; faults: {log:#?}"
    );
    worker.shutdown().await;
}

/// Watches every task's state for `period`, noting each FAILED one with its trace.
async fn watch_for_failures(worker: &Worker, failures: &mut Vec<String>, period: Duration) {
    let end = Instant::now() + period;
    while Instant::now() < end {
        for status in worker.statuses() {
            for (i, task) in status.tasks.iter().enumerate() {
                if task.state == State::Failed {
                    let seen = format!(
                        "{} task {i}: {}",
                        status.name,
                        task.trace.as_deref().unwrap_or("no trace")
                    );
                    if !failures.contains(&seen) {
                        failures.push(seen);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
