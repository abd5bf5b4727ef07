//! The `kafka` sink replicates MirrorMaker-style: every record reaches the renamed topic with
//! its key, value, headers, timestamp and partition, plus headers naming its source record
//! unless `source.headers=false`.

mod runtime_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use runtime_support::{config, share_broker, wait_until, worker};
use spillway_tests::{produce, TestRecord};

type Copy = (
    i32,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(String, Option<Vec<u8>>)>,
    Option<i64>,
);

#[tokio::test(flavor = "multi_thread")]
async fn records_are_replicated_with_key_value_headers_timestamp_and_partition() {
    replicate(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_source_headers_copies_carry_their_own_headers_only() {
    replicate(Some("false")).await;
}

/// Replicates 300 records with `source.headers` as given (the default when `None`) and checks
/// every copy: headers are the record's own, then its source coordinates when they are on.
async fn replicate(source_headers: Option<&str>) {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("src", 3);
    broker.create_topic("mirror.src", 3);
    let records: Vec<TestRecord> = (0..300i64)
        .map(|i| TestRecord {
            partition: Some((i % 3) as i32),
            key: (i % 10 != 0).then(|| format!("k{i}").into_bytes()),
            value: (i % 25 != 0).then(|| format!("v{i}").into_bytes()),
            headers: vec![
                ("traceparent".into(), Some(format!("00-{i}").into_bytes())),
                ("empty".into(), None),
            ],
            timestamp: Some(1_700_000_000_000 + i),
        })
        .collect();
    produce(&broker.bootstrap(), "src", records.clone(), "none").await;
    let worker = worker(&broker);
    let mut keys = vec![
        ("name", "mirror"),
        ("connector.class", "kafka"),
        ("topics", "src"),
        ("tasks.max", "2"),
        ("topic.rename.format", "mirror.${topic}"),
        ("consumer.override.group.protocol", "share"),
    ];
    keys.extend(source_headers.map(|v| ("source.headers", v)));
    worker
        .start_connector(config(&keys))
        .await
        .expect("connector starts");
    wait_until(Duration::from_secs(30), "300 records replicated", || {
        worker
            .status("mirror")
            .is_some_and(|s| s.totals().accepted >= 300)
    })
    .await;
    worker.shutdown().await;

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "mirror-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("reader");
    consumer.subscribe(&["mirror.src"]).expect("subscribes");
    let mut copies: BTreeMap<i64, Copy> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while copies.len() < 300 && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let headers: Vec<(String, Option<Vec<u8>>)> = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default();
            let ts = m.timestamp().to_millis();
            let n = ts.expect("timestamp kept") - 1_700_000_000_000;
            copies.insert(
                n,
                (
                    m.partition(),
                    m.key().map(<[u8]>::to_vec),
                    m.payload().map(<[u8]>::to_vec),
                    headers,
                    ts,
                ),
            );
        }
    }
    assert_eq!(copies.len(), 300, "every record replicated");
    for (i, r) in records.iter().enumerate() {
        let copy = &copies[&(i as i64)];
        assert_eq!(
            copy.0,
            r.partition.expect("set"),
            "record {i}: partition kept"
        );
        assert_eq!(copy.1, r.key, "record {i}: key");
        assert_eq!(copy.2, r.value, "record {i}: value (tombstones stay null)");
        // Produced round-robin over 3 partitions, so record i is the (i/3)-th of partition i%3.
        let mut headers = r.headers.clone();
        let with_source = source_headers != Some("false");
        headers.extend(
            with_source
                .then_some([
                    ("spillway.source.topic".to_owned(), Some(b"src".to_vec())),
                    (
                        "spillway.source.partition".to_owned(),
                        Some(format!("{}", i % 3).into_bytes()),
                    ),
                    (
                        "spillway.source.offset".to_owned(),
                        Some(format!("{}", i / 3).into_bytes()),
                    ),
                ])
                .into_iter()
                .flatten(),
        );
        assert_eq!(
            copy.3, headers,
            "record {i}: headers, then the source coordinates"
        );
        assert_eq!(copy.4, r.timestamp, "record {i}: timestamp");
    }
}
