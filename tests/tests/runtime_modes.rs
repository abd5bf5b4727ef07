//! KIP-1302 test plan 5.2 (5) and the rollback of §4.3: share-group and consumer-group
//! connectors (classic and KIP-848 protocols) run side by side in one worker; removing `consumer.override.group.protocol`
//! moves a connector back to a consumer group; and a share group id that an existing consumer
//! group uses is refused, naming the id and the fix. Also: a classic task whose put is being
//! retried stays in its group (Connect pauses and keeps polling).

mod runtime_support;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use runtime_support::{config, coordinates, probe, share_broker, wait_until, worker};
use spillway_actors::RuntimeError;
use spillway_tests::{numbered_records, produce, DeliveryReport};

#[tokio::test(flavor = "multi_thread")]
async fn share_and_classic_connectors_run_side_by_side_in_one_worker() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("clicks", 4);
    let produced = produce(
        &broker.bootstrap(),
        "clicks",
        numbered_records(800, 32, 4),
        "none",
    )
    .await;
    let worker = worker(&broker);
    for (name, protocol) in [
        ("queue-side", Some("share")),
        ("group-side", None),
        ("kip848-side", Some("consumer")),
    ] {
        let mut c = config(&[
            ("name", name),
            ("connector.class", "probe"),
            ("probe.id", name),
            ("topics", "clicks"),
            ("tasks.max", "2"),
        ]);
        if let Some(p) = protocol {
            c.insert("consumer.override.group.protocol".into(), p.into());
        }
        worker.start_connector(c).await.expect("connector starts");
    }
    assert_eq!(
        worker
            .status("queue-side")
            .expect("registered")
            .group_protocol,
        "share (from consumer.override.group.protocol)"
    );
    assert_eq!(
        worker
            .status("group-side")
            .expect("registered")
            .group_protocol,
        "classic (default)"
    );
    assert_eq!(
        worker
            .status("kip848-side")
            .expect("registered")
            .group_protocol,
        "consumer (from consumer.override.group.protocol)"
    );
    for name in ["queue-side", "group-side", "kip848-side"] {
        let p = probe(name);
        wait_until(Duration::from_secs(30), name, || p.distinct() >= 800).await;
        let report = DeliveryReport::compare(coordinates(&produced), p.coordinates());
        assert!(report.nothing_lost(), "{name}: {}", report.summary());
    }
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_the_share_setting_rolls_back_to_a_consumer_group_and_its_id_is_refused_to_a_share_group(
) {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("ledger", 2);
    let bootstrap = broker.bootstrap();
    let mut produced = produce(&bootstrap, "ledger", numbered_records(300, 32, 2), "none").await;
    let worker = worker(&broker);
    let share = config(&[
        ("name", "rollback"),
        ("connector.class", "probe"),
        ("probe.id", "rollback"),
        ("topics", "ledger"),
        ("consumer.override.group.protocol", "share"),
    ]);
    worker
        .start_connector(share.clone())
        .await
        .expect("starts in share mode");
    let p = probe("rollback");
    wait_until(Duration::from_secs(20), "share mode delivers", || {
        p.distinct() >= 300
    })
    .await;

    let mut classic = share.clone();
    classic.remove("consumer.override.group.protocol");
    worker
        .reconfigure_connector(classic)
        .await
        .expect("rolls back");
    let status = worker.status("rollback").expect("registered");
    assert_eq!(status.group_protocol, "classic (default)");
    assert_eq!(status.group_id, "connect-rollback");
    produced.extend(produce(&bootstrap, "ledger", numbered_records(300, 32, 2), "none").await);
    // The consumer group starts from its own position (the beginning): everything arrives,
    // the records the share group handled included (KIP-1302 §4.3).
    wait_until(Duration::from_secs(30), "classic mode delivers", || {
        p.distinct() >= 600
    })
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), p.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    wait_until(Duration::from_secs(10), "offsets committed", || {
        committed(&bootstrap, "connect-rollback", "ledger", 2) >= 600
    })
    .await;

    // The consumer group now has committed offsets: its id cannot become a share group's (the
    // dev broker has no ListGroups; the committed offsets tell).
    let mut same_id = share.clone();
    same_id.insert(
        "consumer.override.group.id".into(),
        "connect-rollback".into(),
    );
    let err = worker
        .reconfigure_connector(same_id)
        .await
        .expect_err("the id is a consumer group's");
    assert!(matches!(err, RuntimeError::GroupIdConflict { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("'connect-rollback'"), "{text}");
    assert!(text.contains("consumer.override.group.id"), "{text}");
    assert!(
        worker.status("rollback").is_some(),
        "the classic connector keeps running"
    );

    // With the default ids, migrating again goes back to the share group connect-share-<name>.
    worker
        .reconfigure_connector(share)
        .await
        .expect("the share group's own id is accepted");
    assert_eq!(
        worker.status("rollback").expect("running").group_id,
        "connect-share-rollback"
    );
    worker.shutdown().await;
}

/// The sum of the offsets `group` committed on the partitions of `topic` (OffsetFetch).
fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("offset reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_range(topic, 0, partitions - 1);
    consumer
        .committed_offsets(tpl, Duration::from_secs(5))
        .map(|c| {
            c.elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// librdkafka drops a consumer-group member that does not poll within `max.poll.interval.ms`.
/// While a put is retried the task's batches in flight are all held up and it takes no
/// records, so, as Connect does, it keeps polling with its partitions paused: however long the
/// outage, the member keeps its partitions (no `close`, one `open`) and nothing is lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_classic_task_keeps_its_partitions_while_a_put_is_retried_past_max_poll_interval() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("outage", 1);
    let bootstrap = broker.bootstrap();
    let produced = produce(&bootstrap, "outage", numbered_records(100, 32, 1), "none").await;
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "outage"),
            ("connector.class", "probe"),
            ("probe.id", "outage"),
            ("topics", "outage"),
            // Every put fails for 7 s, more than twice the poll interval below.
            ("probe.fail.until.ms", "7000"),
            ("errors.retry.delay.max.ms", "500"),
            // Ten batches of ten: the four batches in flight are all behind the failing put.
            ("consumer.override.max.poll.records", "10"),
            ("consumer.override.session.timeout.ms", "3000"),
            ("consumer.override.heartbeat.interval.ms", "500"),
            ("consumer.override.max.poll.interval.ms", "3000"),
        ]))
        .await
        .expect("starts");
    let p = probe("outage");
    wait_until(
        Duration::from_secs(40),
        "every record arrives after the outage",
        || p.distinct() >= 100,
    )
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), p.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    let calls = p.assignment_calls();
    assert_eq!(
        calls.iter().map(|(call, _)| *call).collect::<Vec<_>>(),
        ["open"],
        "the partition was taken away during the outage: {calls:?}"
    );
    worker.shutdown().await;
}
