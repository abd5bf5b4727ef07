//! KIP-1302 test plan 5.2 (1) and (4): a share-group sink delivers every record, and a sink
//! with retriable failures still receives every record at least once (retried within the
//! records' locks).

mod runtime_support;

use std::collections::BTreeSet;
use std::time::Duration;

use runtime_support::{
    assert_nothing_archived, config, coordinates, probe, share_broker, wait_until, worker,
};
use spillway_actors::State;
use spillway_tests::{numbered_records, produce, DeliveryReport};

#[tokio::test(flavor = "multi_thread")]
async fn a_share_group_file_sink_delivers_every_record() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("orders", 4);
    let produced = produce(
        &broker.bootstrap(),
        "orders",
        numbered_records(2_000, 64, 4),
        "lz4",
    )
    .await;
    let dir = std::env::temp_dir().join(format!("spillway-runtime-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("orders.txt");
    let _ = std::fs::remove_file(&file);
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "orders-to-file"),
            (
                "connector.class",
                "org.apache.kafka.connect.file.FileStreamSinkConnector",
            ),
            ("topics", "orders"),
            ("tasks.max", "2"),
            ("value.converter", "string"),
            ("file", file.to_str().expect("utf-8 path")),
            ("consumer.override.group.protocol", "share"),
        ]))
        .await
        .expect("connector starts");
    let status = worker.status("orders-to-file").expect("registered");
    assert_eq!(
        status.group_protocol,
        "share (from consumer.override.group.protocol)"
    );
    assert_eq!(status.group_id, "connect-share-orders-to-file");

    let read_numbers = || -> BTreeSet<u64> {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix('v')?.split(':').next()?.parse().ok())
            .collect()
    };
    wait_until(
        Duration::from_secs(30),
        "all 2000 lines in the file",
        || read_numbers().len() == 2_000,
    )
    .await;
    assert_eq!(read_numbers(), (0..2_000).collect::<BTreeSet<u64>>());
    wait_until(Duration::from_secs(10), "the last batch committed", || {
        worker
            .status("orders-to-file")
            .is_some_and(|s| s.totals().accepted >= 2_000)
    })
    .await;
    let status = worker.status("orders-to-file").expect("registered");
    assert!(
        status.tasks.iter().all(|t| t.state == State::Running),
        "{status:?}"
    );
    let totals = status.totals();
    assert!(totals.accepted >= 2_000, "{totals:?}");
    assert_eq!(totals.rejected, 0);
    assert_eq!(produced.len(), 2_000);
    assert_eq!(
        broker
            .share_member_ids("connect-share-orders-to-file")
            .len(),
        2
    );
    assert_nothing_archived(&worker, "orders-to-file");
    worker.shutdown().await;
    assert!(
        broker
            .share_member_ids("connect-share-orders-to-file")
            .is_empty(),
        "a graceful stop leaves the share group"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sink_with_retriable_failures_receives_every_record_at_least_once() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("flaky", 4);
    let produced = produce(
        &broker.bootstrap(),
        "flaky",
        numbered_records(1_000, 32, 4),
        "none",
    )
    .await;
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "flaky-sink"),
            ("connector.class", "probe"),
            ("probe.id", "flaky"),
            ("probe.fail.every", "5"),
            ("topics", "flaky"),
            ("tasks.max", "2"),
            ("consumer.override.group.protocol", "share"),
        ]))
        .await
        .expect("connector starts");
    let probe = probe("flaky");
    wait_until(
        Duration::from_secs(30),
        "every record at least once",
        || probe.distinct() >= 1_000,
    )
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    let totals = worker.status("flaky-sink").expect("registered").totals();
    assert_eq!(
        totals.released, 0,
        "every 5th record failed once and was put again within its lock, not released: {totals:?}"
    );
    assert!(
        totals.put >= 1_200,
        "failed records are put again: {totals:?}"
    );
    assert_nothing_archived(&worker, "flaky-sink");
    worker.shutdown().await;
}
