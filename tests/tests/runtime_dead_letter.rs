//! Malformed JSON records land in the dead letter queue with Connect's `__connect.errors.*`
//! context headers; the other records are delivered.

mod runtime_support;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use runtime_support::{assert_nothing_archived, config, probe, share_broker, wait_until, worker};
use spillway_tests::{produce, TestRecord};

#[tokio::test(flavor = "multi_thread")]
async fn malformed_json_goes_to_the_dead_letter_queue_with_context_headers() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("payments", 2);
    broker.create_topic("payments-dlq", 1);
    let records: Vec<TestRecord> = (0..200)
        .map(|i| TestRecord {
            partition: Some(i % 2),
            value: Some(if i % 20 == 7 {
                format!("{{broken {i}").into_bytes()
            } else {
                format!("{{\"n\":{i}}}").into_bytes()
            }),
            ..TestRecord::default()
        })
        .collect();
    let produced = produce(&broker.bootstrap(), "payments", records, "none").await;
    let bad: BTreeMap<(i32, i64), usize> = produced
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 20 == 7)
        .map(|(i, p)| ((p.partition, p.offset), i))
        .collect();
    assert_eq!(bad.len(), 10);
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "payments"),
            ("connector.class", "probe"),
            ("probe.id", "payments"),
            ("topics", "payments"),
            ("tasks.max", "2"),
            ("consumer.override.group.protocol", "share"),
            (
                "value.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            ("value.converter.schemas.enable", "false"),
            ("errors.tolerance", "all"),
            ("errors.log.enable", "true"),
            ("errors.deadletterqueue.topic.name", "payments-dlq"),
            ("errors.deadletterqueue.context.headers.enable", "true"),
        ]))
        .await
        .expect("connector starts");
    let p = probe("payments");
    wait_until(Duration::from_secs(30), "the 190 good records", || {
        p.distinct() >= 190
    })
    .await;
    wait_until(Duration::from_secs(10), "10 dead letters", || {
        worker
            .status("payments")
            .is_some_and(|s| s.totals().dead_lettered >= 10 && s.totals().rejected >= 10)
    })
    .await;
    assert!(p
        .coordinates()
        .iter()
        .all(|(_, partition, offset)| !bad.contains_key(&(*partition, *offset))));

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "dlq-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("dlq reader");
    consumer.subscribe(&["payments-dlq"]).expect("subscribes");
    let mut letters = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while letters.len() < 10 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let headers: BTreeMap<String, String> = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            letters.push((m.payload().map(<[u8]>::to_vec), headers));
        }
    }
    assert_eq!(letters.len(), 10, "one dead letter per malformed record");
    for (value, headers) in &letters {
        let value = String::from_utf8(value.clone().expect("original value kept")).expect("utf-8");
        assert!(value.starts_with("{broken"), "{value}");
        assert_eq!(headers["__connect.errors.topic"], "payments");
        assert_eq!(headers["__connect.errors.stage"], "VALUE_CONVERTER");
        assert_eq!(headers["__connect.errors.connector.name"], "payments");
        assert_eq!(
            headers["__connect.errors.exception.class.name"],
            "ConvertError"
        );
        let at = (
            headers["__connect.errors.partition"]
                .parse()
                .expect("partition"),
            headers["__connect.errors.offset"].parse().expect("offset"),
        );
        assert!(bad.contains_key(&at), "{at:?} was not a malformed record");
    }
    assert_nothing_archived(&worker, "payments");
    worker.shutdown().await;
}
