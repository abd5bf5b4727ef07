//! `delivery.guarantee=exactly_once` on the dev broker: the kafka sink's transactions, the
//! share-mode ledger and the classic-mode offsets-in-transaction. Output is always checked
//! through a read_committed share group (the dev broker's classic Fetch ignores
//! read_committed), by the source coordinates every output record carries as headers.

mod runtime_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::TopicPartitionList;
use runtime_support::{config, share_broker, wait_until, worker};
use spillway_connectors::kafka::{
    KafkaSinkTask, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
use spillway_core::{Assignment, ConfigMap, RecordCoordinates, SinkRecord, SinkTask, Value};
use spillway_eos::ledger_reader::LedgerReader;
use spillway_eos::writer::{ExactlyOnceWriter, GroupOffsets, LedgerSettings, WriterSettings};
use spillway_kafka::producer::OutRecord;
use spillway_tests::{produce, read_committed, DevBroker, TestRecord};

type Source = (String, i32, i64);

/// Reads `topic` through a read_committed share group until `expected` records came (or
/// `limit` passed, then a little longer to catch extras) and returns the source coordinates
/// of every record read, duplicates included.
async fn read_committed_sources(
    broker: &DevBroker,
    topic: &str,
    group: &str,
    expected: usize,
    limit: Duration,
) -> Vec<Source> {
    read_committed(broker, topic, group, expected, limit)
        .await
        .iter()
        .map(|r| {
            let header = |name: &str| {
                let value = r
                    .headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| v.clone())
                    .unwrap_or_else(|| {
                        panic!(
                            "output record {}-{}@{} lacks header {name}",
                            r.topic, r.partition, r.offset
                        )
                    });
                String::from_utf8(value.to_vec()).expect("utf-8 header")
            };
            (
                header(SOURCE_TOPIC_HEADER),
                header(SOURCE_PARTITION_HEADER).parse().expect("partition"),
                header(SOURCE_OFFSET_HEADER).parse().expect("offset"),
            )
        })
        .collect()
}

/// Every source record exactly once, and nothing else.
fn assert_exactly_once(sources: &[Source], expected: &BTreeSet<Source>) {
    let mut counts: BTreeMap<&Source, usize> = BTreeMap::new();
    for s in sources {
        *counts.entry(s).or_default() += 1;
    }
    let duplicated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    let missing: Vec<_> = expected
        .iter()
        .filter(|s| !counts.contains_key(s))
        .take(5)
        .collect();
    let extra: Vec<_> = counts
        .keys()
        .filter(|s| !expected.contains(*s))
        .take(5)
        .collect();
    assert!(
        duplicated.is_empty() && missing.is_empty() && extra.is_empty(),
        "{} records read for {} expected; duplicated (first 5): {duplicated:?}; missing: {missing:?}; extra: {extra:?}",
        sources.len(),
        expected.len()
    );
}

/// Reads `out.src` through the read_committed share group `group` and checks that it holds
/// every record of `expected` once, and nothing else.
async fn assert_output_exactly_once(broker: &DevBroker, group: &str, expected: &BTreeSet<Source>) {
    let read = read_committed_sources(
        broker,
        "out.src",
        group,
        expected.len(),
        Duration::from_secs(20),
    )
    .await;
    assert_exactly_once(&read, expected);
}

/// Records read with read_uncommitted by a classic consumer (the dev broker's classic Fetch
/// never filters): what was written, committed or not.
fn count_written(broker: &DevBroker, topic: &str, partitions: i32) -> usize {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", format!("raw-{topic}"))
        .set("isolation.level", "read_uncommitted")
        .create()
        .expect("raw reader");
    let mut count = 0;
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .expect("watermarks");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(low))
            .expect("offset");
        consumer.assign(&tpl).expect("assigned");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut position = low;
        while position < high && Instant::now() < deadline {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                position = m.offset() + 1;
                count += 1;
            }
        }
    }
    count
}

fn sources_of(produced: &[spillway_tests::Produced]) -> BTreeSet<Source> {
    produced
        .iter()
        .map(|p| (p.topic.clone(), p.partition, p.offset))
        .collect()
}

fn small_records(n: i64, partitions: i32) -> Vec<TestRecord> {
    (0..n)
        .map(|i| TestRecord {
            partition: Some((i % partitions as i64) as i32),
            key: Some(format!("k{i}").into_bytes()),
            value: Some(format!("v{i}").into_bytes()),
            headers: Vec::new(),
            timestamp: None,
        })
        .collect()
}

/// The sink task's configuration for exactly-once against `broker`.
fn eos_task_config(
    broker: &DevBroker,
    name: &str,
    task: u32,
    cache: &std::path::Path,
) -> ConfigMap {
    config(&[
        ("name", name),
        ("connector.class", "kafka"),
        ("task.id", &task.to_string()),
        ("source.bootstrap.servers", &broker.bootstrap()),
        ("topic.rename.format", "out.${topic}"),
        ("delivery.guarantee", "exactly_once"),
        ("delivery.ledger.topic", "ledger"),
        (
            "delivery.ledger.cache.dir",
            &cache.join(format!("{name}-{task}")).to_string_lossy(),
        ),
        ("delivery.transaction.step.timeout.ms", "10000"),
    ])
}

fn sink_record(partition: i32, offset: i64, delivery_count: u16, lock: Duration) -> SinkRecord {
    let mut r = SinkRecord::new(
        "src",
        partition,
        offset,
        Value::Bytes(Bytes::from(format!("v{offset}"))),
    );
    r.delivery_count = Some(delivery_count);
    r.lock_deadline = Some(Instant::now() + lock);
    r
}

async fn started_share_task(config: &ConfigMap) -> KafkaSinkTask {
    let mut task = KafkaSinkTask::default();
    task.start(config).await.expect("task starts");
    task.open(&Assignment::SharedTopics(vec!["src".into()]))
        .await
        .expect("task opens (ledger rebuilt)");
    task
}

fn eos_broker() -> DevBroker {
    let broker = share_broker(1, 15_000, 10_000);
    broker.create_topic("src", 3);
    broker.create_topic("out.src", 3);
    broker.create_topic("ledger", 3);
    broker
}

/// Two instances of one task (same connector and task id, so the same transactional id): the
/// zombie wrote a batch and has not committed when its successor starts and gets the same
/// records again. Only the successor's transaction commits them. On Kafka the successor's
/// `init_transactions` fences the zombie and aborts its transaction; the dev broker hands the
/// successor a new producer id without fencing (docs/exactly-once.md), and there the successor
/// aborts the transaction its predecessor left open in the ledger itself.
#[tokio::test(flavor = "multi_thread")]
async fn of_two_instances_of_a_task_only_one_commits_the_records() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let config = eos_task_config(&broker, "mirror", 0, cache.path());
    let mut zombie = started_share_task(&config).await;
    let first: Vec<SinkRecord> = (0..10)
        .map(|o| sink_record(0, o, 1, Duration::from_secs(60)))
        .collect();
    let outcomes = zombie.put(&first).await.expect("zombie writes");
    assert!(outcomes.iter().all(|o| o.is_ok()));

    let mut successor = started_share_task(&config).await;
    let zombie_commit = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let result = zombie.flush(&BTreeMap::new()).await;
        (zombie, result)
    });
    // The zombie's records, delivered again to the successor.
    let again: Vec<SinkRecord> = (0..10)
        .map(|o| sink_record(0, o, 2, Duration::from_secs(60)))
        .collect();
    let outcomes = successor.put(&again).await.expect("successor puts");
    assert!(outcomes.iter().all(|o| o.is_ok()));
    successor
        .flush(&BTreeMap::new())
        .await
        .expect("the successor commits");
    let (_zombie, zombie_result) = zombie_commit.await.expect("joined");
    let successor_wrote = successor
        .exactly_once_stats()
        .expect("exactly-once")
        .records_committed;
    // The successor aborted the zombie's open transaction when it started, so it wrote the
    // records itself. Kafka also fences the zombie's producer: its commit fails for good. The
    // dev broker does not fence; there the zombie's claim check finds the successor's committed
    // ledger entries and it aborts instead of committing (retriable: the records are released).
    assert_eq!(successor_wrote, 10, "the successor wrote every record");
    let err = zombie_result.expect_err("the zombie does not commit");
    assert!(
        !err.is_retriable() || err.message().contains("written by another task first"),
        "fenced, or stopped by its claim check: {err}"
    );
    successor.stop().await.expect("stops");

    let expected: BTreeSet<Source> = (0..10).map(|o| ("src".to_owned(), 0, o)).collect();
    assert_output_exactly_once(&broker, "zombie-reader", &expected).await;
}

/// A task that stalls (or dies) between its writes and its commit leaves a transaction open.
/// Its successor (same transactional id) aborts it on start, so read_committed readers of the
/// output are not held up behind it and its records are written once, by the successor.
#[tokio::test(flavor = "multi_thread")]
async fn a_predecessors_open_transaction_is_aborted_when_the_task_restarts() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let config = eos_task_config(&broker, "mirror", 0, cache.path());
    let mut stalled = started_share_task(&config).await;
    let first: Vec<SinkRecord> = (0..10)
        .map(|o| sink_record(1, o, 1, Duration::from_secs(60)))
        .collect();
    assert!(stalled
        .put(&first)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    // Never commits, never aborts: its producer stays connected with the transaction open.
    std::mem::forget(stalled);

    let mut successor = started_share_task(&config).await;
    let again: Vec<SinkRecord> = (0..20)
        .map(|o| sink_record(1, o, if o < 10 { 2 } else { 1 }, Duration::from_secs(60)))
        .collect();
    assert!(successor
        .put(&again)
        .await
        .expect("no lookup waits: the open transaction was aborted")
        .iter()
        .all(|o| o.is_ok()));
    successor.flush(&BTreeMap::new()).await.expect("commits");
    let stats = successor.exactly_once_stats().expect("exactly-once");
    assert_eq!((stats.ledger_hits, stats.records_committed), (0, 20));
    successor.stop().await.expect("stops");

    let expected: BTreeSet<Source> = (0..20).map(|o| ("src".to_owned(), 1, o)).collect();
    assert_output_exactly_once(&broker, "restart-reader", &expected).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_past_the_lock_margin_is_aborted_not_committed() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let mut config = eos_task_config(&broker, "mirror", 0, cache.path());
    config.insert("delivery.lock.margin.ms".into(), "1000".into());
    let mut task = started_share_task(&config).await;
    // Locks that run out 1.5 s from now; the batch is held past the margin before commit.
    let late: Vec<SinkRecord> = (0..5)
        .map(|o| sink_record(1, o, 1, Duration::from_millis(1500)))
        .collect();
    assert!(task
        .put(&late)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let err = task
        .flush(&BTreeMap::new())
        .await
        .expect_err("too close to the lock deadline");
    assert!(
        err.is_retriable(),
        "the records are released, not failed: {err}"
    );
    assert!(err.message().contains("acquisition locks"), "{err}");
    let stats = task.exactly_once_stats().expect("exactly-once");
    assert_eq!(
        (stats.lock_guard_aborts, stats.committed_transactions),
        (1, 0)
    );

    // Delivered again (as the runtime's RELEASE makes happen) with a fresh lock: committed once.
    let again: Vec<SinkRecord> = (0..5)
        .map(|o| sink_record(1, o, 2, Duration::from_secs(60)))
        .collect();
    assert!(task
        .put(&again)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    task.flush(&BTreeMap::new()).await.expect("commits in time");
    task.stop().await.expect("stops");

    let expected: BTreeSet<Source> = (0..5).map(|o| ("src".to_owned(), 1, o)).collect();
    assert_output_exactly_once(&broker, "lock-reader", &expected).await;
    assert_eq!(
        count_written(&broker, "out.src", 3),
        10,
        "the aborted attempt was written too"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivered_record_in_the_ledger_is_accepted_without_writing_it_again() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let mut first = started_share_task(&eos_task_config(&broker, "mirror", 0, cache.path())).await;
    let batch: Vec<SinkRecord> = (0..6)
        .map(|o| sink_record(2, o, 1, Duration::from_secs(60)))
        .collect();
    assert!(first
        .put(&batch)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    first.flush(&BTreeMap::new()).await.expect("commits");
    // The task dies before its ACCEPTs are committed: the records come again, to another task.
    drop(first);

    let mut second = started_share_task(&eos_task_config(&broker, "mirror", 1, cache.path())).await;
    let mut redelivered: Vec<SinkRecord> = (0..6)
        .map(|o| sink_record(2, o, 2, Duration::from_secs(60)))
        .collect();
    // One record the first task never wrote, delivered a second time too.
    redelivered.push(sink_record(2, 6, 2, Duration::from_secs(60)));
    assert!(second
        .put(&redelivered)
        .await
        .expect("puts")
        .iter()
        .all(|o| o.is_ok()));
    second.flush(&BTreeMap::new()).await.expect("commits");
    let stats = second.exactly_once_stats().expect("exactly-once");
    assert_eq!((stats.ledger_lookups, stats.ledger_hits), (7, 6));
    assert_eq!(
        stats.records_committed, 1,
        "only the new record was written"
    );

    // The ACCEPTs are durable now: the ledger entries go in the next transaction.
    let acknowledged: Vec<RecordCoordinates> = (0..7)
        .map(|o| RecordCoordinates::new("src", 2, o))
        .collect();
    second.acknowledged(&acknowledged).await;
    second
        .stop()
        .await
        .expect("stops (writing the due tombstones)");
    let mut ledger = LedgerReader::open(
        &broker.bootstrap(),
        "ledger",
        &cache.path().join("check"),
        "check",
        &spillway_kafka::security::ClientSecurity::plaintext(),
    )
    .await
    .expect("ledger opens");
    let present = ledger
        .contains(&acknowledged, Instant::now() + Duration::from_secs(5))
        .await
        .expect("looked up");
    assert_eq!(
        present,
        vec![false; 7],
        "every acknowledged entry was tombstoned"
    );

    let expected: BTreeSet<Source> = (0..7).map(|o| ("src".to_owned(), 2, o)).collect();
    assert_output_exactly_once(&broker, "ledger-reader", &expected).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_lookup_waits_for_another_tasks_open_transaction() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let mut writer = started_share_task(&eos_task_config(&broker, "mirror", 0, cache.path())).await;
    let mut checker =
        started_share_task(&eos_task_config(&broker, "mirror", 1, cache.path())).await;
    let committed: Vec<SinkRecord> = (0..3)
        .map(|o| sink_record(0, o, 1, Duration::from_secs(60)))
        .collect();
    let aborted: Vec<SinkRecord> = (3..6)
        .map(|o| sink_record(0, o, 1, Duration::from_secs(60)))
        .collect();

    // Open transaction that will commit 600 ms after the lookup began.
    assert!(writer
        .put(&committed)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    let committing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        writer.flush(&BTreeMap::new()).await.expect("commits");
        writer
    });
    let again: Vec<SinkRecord> = (0..3)
        .map(|o| sink_record(0, o, 2, Duration::from_secs(60)))
        .collect();
    let started = Instant::now();
    assert!(checker
        .put(&again)
        .await
        .expect("puts")
        .iter()
        .all(|o| o.is_ok()));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the lookup waited for the commit"
    );
    assert_eq!(checker.exactly_once_stats().expect("eos").ledger_hits, 3);
    checker
        .flush(&BTreeMap::new())
        .await
        .expect("nothing to commit");

    // Open transaction that aborts: the lookup waits, then finds nothing and writes.
    let mut writer = committing.await.expect("joined");
    assert!(writer
        .put(&aborted)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    let aborting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        // Stopping without a flush aborts the open transaction.
        writer.stop().await.expect("stops");
    });
    let again: Vec<SinkRecord> = (3..6)
        .map(|o| sink_record(0, o, 2, Duration::from_secs(60)))
        .collect();
    assert!(checker
        .put(&again)
        .await
        .expect("puts")
        .iter()
        .all(|o| o.is_ok()));
    assert_eq!(
        checker.exactly_once_stats().expect("eos").ledger_hits,
        3,
        "no new hits"
    );
    checker.flush(&BTreeMap::new()).await.expect("commits");
    aborting.await.expect("joined");
    checker.stop().await.expect("stops");

    let expected: BTreeSet<Source> = (0..6).map(|o| ("src".to_owned(), 0, o)).collect();
    assert_output_exactly_once(&broker, "pending-reader", &expected).await;
}

/// A task's hold on records can end before their lock deadline without the task seeing it:
/// the broker releases them when the task's share session goes (on Kafka when the connection
/// that opened it closes; on the dev broker when any connection to that broker closes). Here the
/// records went to a second task, whose ledger lookup found nothing, and it committed them; the
/// first task, still holding the batch it read before, must not commit it too.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_hold_ended_unseen_does_not_commit_records_another_task_wrote_first() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let mut first = started_share_task(&eos_task_config(&broker, "mirror", 0, cache.path())).await;
    let mut second = started_share_task(&eos_task_config(&broker, "mirror", 1, cache.path())).await;

    let again: Vec<SinkRecord> = (0..5)
        .map(|o| sink_record(2, o, 2, Duration::from_secs(60)))
        .collect();
    assert!(second
        .put(&again)
        .await
        .expect("puts")
        .iter()
        .all(|o| o.is_ok()));
    second.flush(&BTreeMap::new()).await.expect("commits");

    // The first task's batch: read on the first delivery, so never looked up.
    let held: Vec<SinkRecord> = (0..7)
        .map(|o| sink_record(2, o, 1, Duration::from_secs(60)))
        .collect();
    assert!(first
        .put(&held)
        .await
        .expect("writes")
        .iter()
        .all(|o| o.is_ok()));
    let err = first
        .flush(&BTreeMap::new())
        .await
        .expect_err("another task wrote five of these records first");
    assert!(err.is_retriable(), "the batch is released: {err}");
    assert!(
        err.message().contains("written by another task first"),
        "{err}"
    );
    let stats = first.exactly_once_stats().expect("exactly-once");
    assert_eq!(
        (stats.claim_conflicts, stats.committed_transactions),
        (5, 0)
    );

    // Released and delivered again: five are found in the ledger, two are written.
    let redelivered: Vec<SinkRecord> = (0..7)
        .map(|o| sink_record(2, o, 2, Duration::from_secs(60)))
        .collect();
    assert!(first
        .put(&redelivered)
        .await
        .expect("puts")
        .iter()
        .all(|o| o.is_ok()));
    first.flush(&BTreeMap::new()).await.expect("commits");
    let stats = first.exactly_once_stats().expect("exactly-once");
    assert_eq!((stats.ledger_hits, stats.records_committed), (5, 2));
    first.stop().await.expect("stops");
    second.stop().await.expect("stops");

    let expected: BTreeSet<Source> = (0..7).map(|o| ("src".to_owned(), 2, o)).collect();
    assert_output_exactly_once(&broker, "unseen-reader", &expected).await;
}

/// The writer's view of the race in the test above when both transactions are open at once:
/// the redelivery's lookup comes before the first holder's entries, and its entries after them.
/// The entry first in the ledger's log commits; the later one aborts while the first is open,
/// and commits when the first aborted.
#[tokio::test(flavor = "multi_thread")]
async fn of_two_open_transactions_writing_a_record_only_the_first_in_the_ledger_commits() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let writer = |task: u32| {
        let bootstrap = broker.bootstrap();
        let cache = cache.path().join(format!("writer-{task}"));
        async move {
            let mut writer = ExactlyOnceWriter::start(&WriterSettings {
                bootstrap,
                transactional_id: format!("claims-{task}"),
                producer_overrides: Vec::new(),
                step_timeout: Duration::from_secs(10),
                group_offsets: GroupOffsets::InTransaction,
            })
            .await
            .expect("writer starts");
            writer
                .open_share(LedgerSettings {
                    topic: "ledger".into(),
                    cache_dir: cache,
                    lock_margin: Duration::from_secs(1),
                })
                .await
                .expect("ledger opens");
            writer
        }
    };
    let mut holder = writer(0).await;
    let mut redelivery = writer(1).await;
    let deadline = Some(Instant::now() + Duration::from_secs(60));
    let sources = |range: std::ops::Range<i64>| -> Vec<(RecordCoordinates, Option<Instant>)> {
        range
            .map(|o| (RecordCoordinates::new("src", 0, o), deadline))
            .collect()
    };
    let output = |sources: &[(RecordCoordinates, Option<Instant>)]| -> Vec<OutRecord> {
        sources
            .iter()
            .map(|(c, _)| OutRecord {
                topic: "out.src".into(),
                partition: Some(c.partition),
                value: Some(Bytes::from(format!("v{}", c.offset))),
                headers: vec![
                    (SOURCE_TOPIC_HEADER.into(), Some(Bytes::from("src"))),
                    (
                        SOURCE_PARTITION_HEADER.into(),
                        Some(Bytes::from(c.partition.to_string())),
                    ),
                    (
                        SOURCE_OFFSET_HEADER.into(),
                        Some(Bytes::from(c.offset.to_string())),
                    ),
                ],
                ..OutRecord::default()
            })
            .collect()
    };
    let looked_up = |sources: &[(RecordCoordinates, Option<Instant>)]| {
        sources
            .iter()
            .map(|(c, d)| (c.clone(), Some(2), *d))
            .collect::<Vec<_>>()
    };

    // The first holder's entries come first: it commits, the redelivery does not.
    let first = sources(0..4);
    let found = redelivery
        .already_written(&looked_up(&first))
        .await
        .expect("looks up");
    assert!(found.iter().all(|f| !f), "nothing in the ledger yet");
    assert!(holder
        .write(&output(&first), &first)
        .await
        .iter()
        .all(|r| r.is_ok()));
    assert!(redelivery
        .write(&output(&first), &first)
        .await
        .iter()
        .all(|r| r.is_ok()));
    let err = redelivery
        .commit(&BTreeMap::new())
        .await
        .expect_err("its entries came second");
    assert!(err.is_retriable(), "{err}");
    assert_eq!(redelivery.stats().claim_conflicts, 4);
    holder
        .commit(&BTreeMap::new())
        .await
        .expect("first: commits");

    // The first holder's entries come first but it aborts: the later writer commits.
    let second = sources(4..8);
    redelivery
        .already_written(&looked_up(&second))
        .await
        .expect("looks up");
    assert!(holder
        .write(&output(&second), &second)
        .await
        .iter()
        .all(|r| r.is_ok()));
    assert!(redelivery
        .write(&output(&second), &second)
        .await
        .iter()
        .all(|r| r.is_ok()));
    holder.abort().await.expect("aborts");
    redelivery
        .commit(&BTreeMap::new())
        .await
        .expect("the earlier entries were aborted: commits");
    assert_eq!(redelivery.stats().claim_conflicts, 4, "no new conflicts");

    let expected: BTreeSet<Source> = (0..8).map(|o| ("src".to_owned(), 0, o)).collect();
    assert_output_exactly_once(&broker, "claims-reader", &expected).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn share_mode_survives_an_aborted_transaction_and_writes_every_record_once() {
    let broker = eos_broker();
    let produced = produce(&broker.bootstrap(), "src", small_records(300, 3), "none").await;
    // The first produce to out.src-0 fails for good: that transaction aborts, and its records
    // are put again within their locks (share-mode retries, docs/runtime.md).
    broker.push_partition_request_errors("out.src", 0, 0, &[10]);
    let cache = tempfile::tempdir().expect("tempdir");
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "mirror"),
            ("connector.class", "kafka"),
            ("topics", "src"),
            ("tasks.max", "2"),
            ("topic.rename.format", "out.${topic}"),
            ("consumer.override.group.protocol", "share"),
            ("delivery.guarantee", "exactly_once"),
            ("delivery.ledger.topic", "ledger"),
            ("delivery.ledger.cache.dir", &cache.path().to_string_lossy()),
        ]))
        .await
        .expect("connector starts");
    wait_until(Duration::from_secs(60), "300 records accepted", || {
        worker
            .status("mirror")
            .is_some_and(|s| s.totals().accepted >= 300)
    })
    .await;
    let totals = worker.status("mirror").expect("status").totals();
    worker.shutdown().await;
    assert!(
        totals.put > 300,
        "the aborted batch was put again: {totals:?}"
    );
    assert_eq!(totals.archived_by_limit, 0, "{totals:?}");

    let read = read_committed_sources(
        &broker,
        "out.src",
        "abort-reader",
        300,
        Duration::from_secs(30),
    )
    .await;
    assert_exactly_once(&read, &sources_of(&produced));
    assert!(
        count_written(&broker, "out.src", 3) > 300,
        "the aborted attempt reached the log"
    );
}

/// The classic-mode exactly-once connector of these tests.
fn classic_eos_connector() -> ConfigMap {
    config(&[
        ("name", "mirror"),
        ("connector.class", "kafka"),
        ("topics", "src"),
        ("tasks.max", "1"),
        ("topic.rename.format", "out.${topic}"),
        ("delivery.guarantee", "exactly_once"),
        ("delivery.ledger.topic", "ledger"),
    ])
}

/// Classic mode: the consumer's offsets go into the transaction (TxnOffsetCommit). This
/// checks the transaction side: a group-fencing error on the offsets (ILLEGAL_GENERATION, what a
/// member that lost its partitions gets) aborts the whole transaction, the task restarts and
/// reads the records again, and the output holds each record once.
#[tokio::test(flavor = "multi_thread")]
async fn classic_mode_aborts_the_transaction_when_its_offsets_are_fenced() {
    let broker = eos_broker();
    let produced = produce(&broker.bootstrap(), "src", small_records(300, 3), "none").await;
    const TXN_OFFSET_COMMIT: i16 = 28;
    const ILLEGAL_GENERATION: i16 = 22;
    broker.push_request_errors(TXN_OFFSET_COMMIT, &[ILLEGAL_GENERATION]);
    let worker = worker(&broker);
    worker
        .start_connector(classic_eos_connector())
        .await
        .expect("connector starts");
    wait_until(Duration::from_secs(60), "300 records accepted", || {
        worker
            .status("mirror")
            .is_some_and(|s| s.totals().accepted >= 300)
    })
    .await;
    let totals = worker.status("mirror").expect("status").totals();
    worker.shutdown().await;
    assert!(
        totals.read > 300,
        "the fenced transaction's records were read again: {totals:?}"
    );

    let read = read_committed_sources(
        &broker,
        "out.src",
        "classic-reader",
        300,
        Duration::from_secs(30),
    )
    .await;
    assert_exactly_once(&read, &sources_of(&produced));
    assert!(
        count_written(&broker, "out.src", 3) > 300,
        "the aborted attempt reached the log"
    );
}

/// Classic mode across a restart: the dev broker answers TxnOffsetCommit without storing the
/// offsets (docs/exactly-once.md), so a restarted worker's consumer starts again from the
/// beginning of every partition. The checkpoints each transaction wrote to the ledger are what
/// it resumes from: the output holds every record once, the first run's included.
#[tokio::test(flavor = "multi_thread")]
async fn classic_mode_resumes_from_its_checkpoints_after_a_restart() {
    resumes_from_checkpoints(classic_eos_connector()).await;
}

/// The same with `transaction.boundary=interval`: a transaction's later batches have their
/// checkpoints written by its commit, and the restart starts after them too.
#[tokio::test(flavor = "multi_thread")]
async fn classic_mode_with_an_interval_boundary_resumes_from_its_checkpoints() {
    let mut connector = classic_eos_connector();
    connector.extend(config(&[
        ("transaction.boundary", "interval"),
        ("consumer.override.max.poll.records", "100"),
    ]));
    resumes_from_checkpoints(connector).await;
}

async fn resumes_from_checkpoints(connector: ConfigMap) {
    let broker = eos_broker();
    let mut produced = produce(&broker.bootstrap(), "src", small_records(300, 3), "none").await;
    let first = worker(&broker);
    first
        .start_connector(connector.clone())
        .await
        .expect("connector starts");
    wait_until(
        Duration::from_secs(60),
        "the first 300 records accepted",
        || {
            first
                .status("mirror")
                .is_some_and(|s| s.totals().accepted >= 300)
        },
    )
    .await;
    first.shutdown().await;

    produced.extend(produce(&broker.bootstrap(), "src", small_records(300, 3), "none").await);
    let second = worker(&broker);
    second
        .start_connector(connector.clone())
        .await
        .expect("connector starts again");
    wait_until(
        Duration::from_secs(60),
        "the next 300 records accepted",
        || {
            second
                .status("mirror")
                .is_some_and(|s| s.totals().accepted >= 300)
        },
    )
    .await;
    second.shutdown().await;
    let read = read_committed_sources(
        &broker,
        "out.src",
        "restart-reader",
        600,
        Duration::from_secs(30),
    )
    .await;
    assert_exactly_once(&read, &sources_of(&produced));
    assert_eq!(
        count_written(&broker, "out.src", 3),
        600,
        "the records before the checkpoints were not written again, not even in aborted transactions"
    );
}

/// The checkpoint a classic task finds when a partition is opened is the next offset its last
/// committed transaction wrote; an aborted transaction's checkpoint does not count, and records
/// below the checkpoint are accepted without being written again.
#[tokio::test(flavor = "multi_thread")]
async fn a_classic_task_starts_each_partition_at_its_last_committed_checkpoint() {
    let broker = eos_broker();
    let cache = tempfile::tempdir().expect("tempdir");
    let config = eos_task_config(&broker, "mirror", 0, cache.path());
    let partitions = vec![
        spillway_core::TopicPartition::new("src", 0),
        spillway_core::TopicPartition::new("src", 1),
    ];
    let classic = Assignment::Partitions(partitions.clone());
    let record = |partition: i32, offset: i64| {
        SinkRecord::new(
            "src",
            partition,
            offset,
            Value::Bytes(Bytes::from(format!("v{offset}"))),
        )
    };

    let mut task = KafkaSinkTask::default();
    task.start(&config).await.expect("task starts");
    task.open(&classic).await.expect("task opens");
    assert!(task.start_offsets().is_empty(), "no checkpoints yet");
    let batch: Vec<SinkRecord> = (0..5).map(|o| record(0, o)).collect();
    task.put(&batch).await.expect("put");
    task.flush(&BTreeMap::new()).await.expect("committed");
    // A later transaction that aborts: its checkpoint (offset 9) must not count.
    let batch: Vec<SinkRecord> = (5..9).map(|o| record(0, o)).collect();
    task.put(&batch).await.expect("put");
    task.stop()
        .await
        .expect("stops, aborting the open transaction");

    let mut successor = KafkaSinkTask::default();
    successor.start(&config).await.expect("successor starts");
    successor.open(&classic).await.expect("successor opens");
    assert_eq!(
        successor.start_offsets(),
        BTreeMap::from([(partitions[0].clone(), 5)]),
        "partition 0 resumes after its committed transaction; partition 1 has no checkpoint"
    );
    let again: Vec<SinkRecord> = (3..7).map(|o| record(0, o)).collect();
    let outcomes = successor.put(&again).await.expect("put");
    assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
    let stats = successor.exactly_once_stats().expect("exactly-once");
    assert_eq!(
        stats.checkpoint_skips, 2,
        "offsets 3 and 4 were written already"
    );
    successor.flush(&BTreeMap::new()).await.expect("committed");
    successor.stop().await.expect("stops");

    let read = read_committed_sources(
        &broker,
        "out.src",
        "checkpoint-reader",
        7,
        Duration::from_secs(20),
    )
    .await;
    let expected: BTreeSet<Source> = (0..7).map(|o| ("src".to_owned(), 0, o)).collect();
    assert_exactly_once(&read, &expected);
}

/// `transaction.boundary=interval` (classic mode): one transaction holds several batches,
/// committed with their merged offsets and checkpoints, and the output still holds every
/// record once. Counted at the broker: fewer EndTxn requests than half the batches (at most
/// `task.inflight.batches` less one, three by default, share a transaction; the interval's
/// timer commits the last ones).
#[tokio::test(flavor = "multi_thread")]
async fn an_interval_boundary_commits_several_batches_per_transaction_exactly_once() {
    const END_TXN: i16 = 26;
    let broker = eos_broker();
    let produced = produce(&broker.bootstrap(), "src", small_records(1200, 3), "none").await;
    broker.start_request_tracking();
    let worker = worker(&broker);
    let mut connector = classic_eos_connector();
    connector.extend(config(&[
        ("transaction.boundary", "interval"),
        ("transaction.boundary.interval.ms", "500"),
        ("consumer.override.max.poll.records", "100"),
    ]));
    worker
        .start_connector(connector)
        .await
        .expect("connector starts");
    wait_until(Duration::from_secs(60), "1200 records committed", || {
        worker
            .status("mirror")
            .is_some_and(|s| s.totals().accepted >= 1200)
    })
    .await;
    let totals = worker.status("mirror").expect("status").totals();
    worker.shutdown().await;
    let transactions = broker.request_counts().get(&END_TXN).copied().unwrap_or(0);
    assert!(totals.committed_batches >= 12, "{totals:?}");
    assert!(
        transactions >= 1 && transactions * 2 <= totals.committed_batches,
        "{transactions} transactions for {} batches",
        totals.committed_batches
    );
    let read = read_committed_sources(
        &broker,
        "out.src",
        "interval-reader",
        1200,
        Duration::from_secs(30),
    )
    .await;
    assert_exactly_once(&read, &sources_of(&produced));
}
