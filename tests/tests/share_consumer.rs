//! The native share consumer (`spillway_kafka::share`) against the dev broker: issue 2's
//! "Tests against the dev broker", 1 to 8.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig, ShareRecord};
use spillway_tests::{
    numbered_records, produce, Coordinates, DeliveryReport, DevBroker, Produced,
    ReferenceShareConsumer, TestRecord,
};

const SHARE_FETCH: i16 = 78;
const SHARE_ACKNOWLEDGE: i16 = 79;
const SHARE_GROUP_HEARTBEAT: i16 = 76;

/// A dev broker whose share groups start at the earliest offset and heartbeat quickly.
fn share_broker(brokers: u32) -> DevBroker {
    let broker = DevBroker::start(brokers);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    broker
}

async fn consumer(broker: &DevBroker, group: &str, topics: &[&str]) -> ShareConsumer {
    let mut config = ShareConsumerConfig::new(&broker.bootstrap(), group);
    config.request_timeout = Duration::from_secs(5);
    config.metadata_max_age = Duration::from_secs(1);
    let mut c = ShareConsumer::connect(config)
        .await
        .unwrap_or_else(|e| panic!("share consumer cannot connect: {e}"));
    c.subscribe(topics);
    c
}

fn coordinates(r: &ShareRecord) -> Coordinates {
    (r.topic.to_string(), r.partition, r.offset)
}

fn expected(produced: &[Produced]) -> Vec<Coordinates> {
    produced
        .iter()
        .map(|p| (p.topic.clone(), p.partition, p.offset))
        .collect()
}

/// Poll, ACCEPT everything and commit after every poll, until `want` distinct records arrived
/// or `limit` passed. Returns every delivery, duplicates included.
async fn drain(c: &mut ShareConsumer, want: usize, limit: Duration) -> Vec<ShareRecord> {
    let deadline = Instant::now() + limit;
    let mut all = Vec::new();
    let mut distinct = BTreeSet::new();
    while distinct.len() < want && Instant::now() < deadline {
        let records = c
            .poll(Duration::from_millis(200))
            .await
            .unwrap_or_else(|e| panic!("poll failed: {e}"));
        c.acknowledge_all(&records, AcknowledgeType::Accept)
            .unwrap_or_else(|e| panic!("acknowledge failed: {e}"));
        for r in &records {
            distinct.insert(coordinates(r));
        }
        all.extend(records);
        c.commit_sync(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("commit_sync failed: {e}"));
    }
    all
}

fn value_of(r: &ShareRecord) -> &[u8] {
    r.value.as_deref().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_produced_record_is_delivered_exactly_once_with_payload_intact() {
    let broker = share_broker(1);
    broker.create_topic("t", 4);
    let records = numbered_records(2_000, 100, 4);
    let produced = produce(&broker.bootstrap(), "t", records.clone(), "none").await;
    let mut c = consumer(&broker, "g1", &["t"]).await;
    let got = drain(&mut c, produced.len(), Duration::from_secs(60)).await;
    let report = DeliveryReport::compare(expected(&produced), got.iter().map(coordinates));
    assert!(report.exactly_once(), "{}", report.summary());
    // Payloads: the record produced at (partition, offset) is the one delivered there.
    let by_place: BTreeMap<(i32, i64), &TestRecord> = produced
        .iter()
        .zip(records.iter())
        .map(|(p, r)| ((p.partition, p.offset), r))
        .collect();
    for r in &got {
        let sent = by_place[&(r.partition, r.offset)];
        assert_eq!(r.key.as_deref(), sent.key.as_deref(), "key at {r:?}");
        assert_eq!(Some(value_of(r)), sent.value.as_deref(), "value at {r:?}");
        assert_eq!(r.delivery_count, 1);
        assert!(r.timestamp > 0);
    }
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_records_come_back_with_delivery_count_two_and_rejected_ones_never_do() {
    let broker = share_broker(1);
    broker.create_topic("t", 1);
    produce(
        &broker.bootstrap(),
        "t",
        numbered_records(10, 20, 1),
        "none",
    )
    .await;
    let mut c = consumer(&broker, "g2", &["t"]).await;
    let first = drain_without_ack(&mut c, 10, Duration::from_secs(30)).await;
    assert_eq!(first.len(), 10, "first delivery: {first:?}");
    for r in &first {
        let kind = match r.offset {
            0 => AcknowledgeType::Release,
            1 => AcknowledgeType::Reject,
            _ => AcknowledgeType::Accept,
        };
        c.acknowledge(r, kind).expect("acknowledge a held record");
    }
    let results = c.commit_sync(Duration::from_secs(5)).await.expect("commit");
    assert!(
        results.values().all(|r| r.is_ok()),
        "commit results: {results:?}"
    );
    // Offset 0 comes back with delivery count 2; offset 1 never does.
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut again = Vec::new();
    while Instant::now() < deadline {
        let records = c.poll(Duration::from_millis(200)).await.expect("poll");
        c.acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("ack");
        again.extend(records.iter().map(|r| (r.offset, r.delivery_count)));
    }
    assert_eq!(again, vec![(0, 2)]);
    c.close().await.expect("close");
}

/// Poll until `want` records arrived, acknowledging none.
async fn drain_without_ack(
    c: &mut ShareConsumer,
    want: usize,
    limit: Duration,
) -> Vec<ShareRecord> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        got.extend(c.poll(Duration::from_millis(200)).await.expect("poll"));
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_member_that_stops_acknowledging_go_to_another_member_after_the_lock() {
    let broker = share_broker(1);
    broker.set_share_record_lock_duration(2_000);
    broker.create_topic("t", 1);
    produce(
        &broker.bootstrap(),
        "t",
        numbered_records(20, 20, 1),
        "none",
    )
    .await;
    let mut stalled = consumer(&broker, "g3", &["t"]).await;
    let held = drain_without_ack(&mut stalled, 20, Duration::from_secs(30)).await;
    assert_eq!(held.len(), 20);
    let stalled_at = Instant::now();
    // A second member shares the partition (manual assignment, as on Apache Kafka); the first
    // one stays in the group but never acknowledges or polls again.
    let mut other = consumer(&broker, "g3", &["t"]).await;
    wait_for_members(&broker, "g3", 2).await;
    broker.share_target_assignment(
        "g3",
        &[
            (stalled.member_id().to_string(), vec![("t".into(), 0)]),
            (other.member_id().to_string(), vec![("t".into(), 0)]),
        ],
    );
    let got = drain(&mut other, 20, Duration::from_secs(30)).await;
    let offsets: BTreeSet<i64> = got.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..20).collect::<BTreeSet<i64>>());
    assert!(got.iter().all(|r| r.delivery_count == 2), "{got:?}");
    assert!(stalled_at.elapsed() >= Duration::from_millis(1_500));
    other.close().await.expect("close");
    stalled.close().await.expect("close");
}

async fn wait_for_members(broker: &DevBroker, group: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while broker.share_member_ids(group).len() < n {
        assert!(
            Instant::now() < deadline,
            "group {group} never had {n} members"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_released_more_often_than_the_delivery_limit_is_archived() {
    let broker = share_broker(1);
    broker.set_share_max_delivery_attempts(2);
    broker.create_topic("t", 1);
    produce(&broker.bootstrap(), "t", numbered_records(1, 20, 1), "none").await;
    let mut c = consumer(&broker, "g4", &["t"]).await;
    let mut counts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        for r in c.poll(Duration::from_millis(200)).await.expect("poll") {
            counts.push(r.delivery_count);
            c.acknowledge(&r, AcknowledgeType::Release)
                .expect("release");
        }
        c.commit_sync(Duration::from_secs(5)).await.expect("commit");
        if counts.len() >= 2 {
            break;
        }
    }
    assert_eq!(counts, vec![1, 2]);
    // Released at the limit: archived, never delivered again.
    let later = drain_without_ack(&mut c, 1, Duration::from_secs(3)).await;
    assert!(later.is_empty(), "archived record came back: {later:?}");
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_consumer_and_librdkafkas_share_one_group_without_loss_or_double_delivery() {
    let broker = share_broker(1);
    broker.create_topic("t", 4);
    let reference = ReferenceShareConsumer::start(&broker.bootstrap(), "g5", &["t"]);
    assert!(
        reference.wait_ready(Duration::from_secs(30)),
        "reference consumer never started"
    );
    let mut ours = consumer(&broker, "g5", &["t"]).await;
    wait_for_members(&broker, "g5", 2).await;
    // Let the assignment settle (the dev broker gives each partition to one member) before
    // there is anything to fetch, so no partition changes hands mid-way.
    for _ in 0..10 {
        let _ = ours.poll(Duration::from_millis(200)).await.expect("poll");
    }
    let produced = produce(
        &broker.bootstrap(),
        "t",
        numbered_records(2_000, 50, 4),
        "none",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut mine = Vec::new();
    loop {
        let got = drain(&mut ours, usize::MAX, Duration::from_millis(500)).await;
        mine.extend(got.iter().map(|r| (coordinates(r), r.delivery_count)));
        let distinct: BTreeSet<Coordinates> = mine
            .iter()
            .map(|(c, _)| c.clone())
            .chain(
                reference
                    .records()
                    .into_iter()
                    .map(|r| (r.topic, r.partition, r.offset)),
            )
            .collect();
        if distinct.len() >= produced.len() || Instant::now() > deadline {
            break;
        }
    }
    // Give the reference a moment to report its last records.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let theirs: Vec<Coordinates> = reference
        .records()
        .into_iter()
        .map(|r| (r.topic, r.partition, r.offset))
        .collect();
    assert!(
        !mine.is_empty() && !theirs.is_empty(),
        "both members must get records: ours {}, theirs {}",
        mine.len(),
        theirs.len()
    );
    // The dev broker destroys every share session on a broker when any connection to it closes
    // (brief §8.6 #9), which librdkafka's bootstrap connection does; our records held at that
    // moment come back to us as genuine redeliveries (higher delivery count). What must never
    // happen is one record going to both members, or the same delivery twice.
    let mut seen_deliveries = BTreeSet::new();
    for d in &mine {
        assert!(seen_deliveries.insert(d.clone()), "delivered twice: {d:?}");
    }
    let mine: Vec<Coordinates> = mine.into_iter().map(|(c, _)| c).collect();
    let ours_set: BTreeSet<&Coordinates> = mine.iter().collect();
    let both: Vec<&Coordinates> = theirs.iter().filter(|c| ours_set.contains(c)).collect();
    assert!(
        both.is_empty(),
        "delivered to both members: {} records, first {:?}",
        both.len(),
        both.first()
    );
    let per_partition = |v: &[Coordinates]| {
        let mut m: BTreeMap<i32, usize> = BTreeMap::new();
        for c in v {
            *m.entry(c.1).or_default() += 1;
        }
        m
    };
    let split = format!(
        "ours per partition {:?}, theirs {:?}",
        per_partition(&mine),
        per_partition(&theirs)
    );
    let report = DeliveryReport::compare(expected(&produced), mine.into_iter().chain(theirs));
    assert!(report.nothing_lost(), "{}; {split}", report.summary());
    ours.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_moves_and_a_broker_restart_during_consumption_lose_nothing() {
    let broker = share_broker(3);
    // Acks for records acquired through a moved leader fail; the records come back when their
    // locks run out.
    broker.set_share_record_lock_duration(3_000);
    broker.create_topic("t", 6);
    let produced = produce(
        &broker.bootstrap(),
        "t",
        numbered_records(3_000, 50, 6),
        "none",
    )
    .await;
    let mut c = consumer(&broker, "g6", &["t"]).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut delivered = Vec::new();
    let mut step = 0;
    while Instant::now() < deadline {
        let got = drain(&mut c, usize::MAX, Duration::from_millis(300)).await;
        delivered.extend(got.iter().map(coordinates));
        let distinct: BTreeSet<_> = delivered.iter().cloned().collect();
        if distinct.len() >= produced.len() && step == 3 {
            break;
        }
        match step {
            0 if distinct.len() >= 300 => {
                broker.set_partition_leader("t", 0, 2);
                broker.set_partition_leader("t", 1, 3);
                step = 1;
            }
            1 if distinct.len() >= 1_200 => {
                broker.broker_down(2);
                step = 2;
            }
            2 => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                broker.broker_up(2);
                step = 3;
            }
            _ => {}
        }
    }
    assert_eq!(step, 3, "the faults were not all injected");
    let report = DeliveryReport::compare(expected(&produced), delivered);
    assert!(report.nothing_lost(), "{}", report.summary());
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_session_leader_and_coordinator_errors_are_recovered_without_loss() {
    let broker = share_broker(1);
    broker.set_share_record_lock_duration(3_000);
    broker.create_topic("t", 2);
    let produced = produce(
        &broker.bootstrap(),
        "t",
        numbered_records(1_000, 50, 2),
        "none",
    )
    .await;
    let mut c = consumer(&broker, "g7", &["t"]).await;
    let mut delivered = Vec::new();
    // Some records first, so sessions and membership exist when the errors hit.
    let first = drain(&mut c, 100, Duration::from_secs(30)).await;
    delivered.extend(first.iter().map(coordinates));

    // A failed ShareAcknowledge is reported per partition, not dropped.
    let held = drain_without_ack(&mut c, 1, Duration::from_secs(10)).await;
    assert!(!held.is_empty(), "no records to acknowledge");
    delivered.extend(held.iter().map(coordinates));
    broker.push_request_errors(SHARE_ACKNOWLEDGE, &[122]);
    c.acknowledge_all(&held, AcknowledgeType::Accept)
        .expect("ack");
    let results = c.commit_sync(Duration::from_secs(5)).await.expect("commit");
    assert!(
        results.values().any(|r| r.is_err()),
        "the injected ShareAcknowledge failure was not reported: {results:?}"
    );

    broker.push_request_errors(SHARE_FETCH, &[122, 123]);
    broker.push_partition_request_errors("t", 0, SHARE_FETCH, &[6]);
    broker.push_request_errors(SHARE_GROUP_HEARTBEAT, &[15, 25]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let got = drain(&mut c, usize::MAX, Duration::from_millis(500)).await;
        delivered.extend(got.iter().map(coordinates));
        if delivered.iter().collect::<BTreeSet<_>>().len() >= produced.len() {
            break;
        }
    }
    let report = DeliveryReport::compare(expected(&produced), delivered);
    assert!(report.nothing_lost(), "{}", report.summary());
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_batches_and_records_with_headers_null_keys_and_null_values_arrive_intact() {
    let broker = share_broker(1);
    let mut sent: BTreeMap<(String, i32, i64), TestRecord> = BTreeMap::new();
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        broker.create_topic(codec, 1);
        let records: Vec<TestRecord> = (0..50u64)
            .map(|i| TestRecord {
                partition: Some(0),
                key: (i % 3 != 0).then(|| format!("k{i}").into_bytes()),
                value: (i % 5 != 0).then(|| format!("{codec}-{i}").repeat(10).into_bytes()),
                headers: vec![
                    ("trace".to_string(), Some(format!("h{i}").into_bytes())),
                    ("empty".to_string(), None),
                ],
                timestamp: None,
            })
            .collect();
        let produced = produce(&broker.bootstrap(), codec, records.clone(), codec).await;
        for (p, r) in produced.into_iter().zip(records) {
            sent.insert((p.topic, p.partition, p.offset), r);
        }
    }
    let mut c = consumer(&broker, "g8", &["gzip", "snappy", "lz4", "zstd"]).await;
    let got = drain(&mut c, sent.len(), Duration::from_secs(60)).await;
    let report = DeliveryReport::compare(sent.keys().cloned(), got.iter().map(coordinates));
    assert!(report.exactly_once(), "{}", report.summary());
    for r in &got {
        let s = &sent[&coordinates(r)];
        assert_eq!(r.key.as_deref(), s.key.as_deref(), "key of {r:?}");
        assert_eq!(r.value.as_deref(), s.value.as_deref(), "value of {r:?}");
        let headers: Vec<(String, Option<Vec<u8>>)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_ref().map(|b| b.to_vec())))
            .collect();
        assert_eq!(headers, s.headers, "headers of {r:?}");
    }
    c.close().await.expect("close");
}

/// The dev broker reassigns every partition whenever a member joins (brief §8.5): member A
/// holds records from partitions that move to B and C while A is still processing them. A's
/// acknowledgements for records it still holds must be applied (commit_sync says so), and no
/// record A accepted may be delivered again, to A or anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_of_held_records_survive_members_joining_and_reassignment() {
    let broker = share_broker(1);
    broker.create_topic("t", 6);
    let produced = produce(
        &broker.bootstrap(),
        "t",
        numbered_records(3_000, 50, 6),
        "none",
    )
    .await;
    let mut config = ShareConsumerConfig::new(&broker.bootstrap(), "g9");
    config.request_timeout = Duration::from_secs(5);
    config.metadata_max_age = Duration::from_secs(1);
    config.max_poll_records = 50;
    let mut a = ShareConsumer::connect(config).await.expect("connect");
    a.subscribe(&["t"]);
    wait_for_members(&broker, "g9", 1).await;
    // A holds one poll's worth of records (from all six partitions) and does not settle them yet.
    let held = drain_without_ack(&mut a, 1, Duration::from_secs(30)).await;
    assert!(!held.is_empty(), "member A got nothing");

    // B and C join one after the other; A's partitions are handed round (§8.5).
    let mut b = consumer(&broker, "g9", &["t"]).await;
    let mut c = consumer(&broker, "g9", &["t"]).await;
    wait_for_members(&broker, "g9", 3).await;
    // A keeps polling while it processes what it holds (a pipelined task does), so its
    // fetches go on while the new assignment reaches it (the dev broker fences A on the way,
    // §8.5, so that takes a few heartbeats).
    let mut held = held;
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        held.extend(a.poll(Duration::from_millis(200)).await.expect("poll"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A finishes processing what it holds and commits.
    a.acknowledge_all(&held, AcknowledgeType::Accept)
        .expect("A still holds what it was given");
    let results = a.commit_sync(Duration::from_secs(5)).await.expect("commit");
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    let held_partitions: BTreeSet<i32> = held.iter().map(|r| r.partition).collect();
    assert!(
        failed.is_empty(),
        "A held {} records on partitions {held_partitions:?}; acknowledgements failed: {failed:?}",
        held.len()
    );
    let accepted: BTreeSet<Coordinates> = held.iter().map(coordinates).collect();

    // Everyone drains the rest; nothing A accepted may come back.
    let mut later = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for m in [&mut a, &mut b, &mut c] {
            later.extend(drain(m, usize::MAX, Duration::from_millis(200)).await);
        }
        let distinct: BTreeSet<Coordinates> = later
            .iter()
            .map(coordinates)
            .chain(accepted.iter().cloned())
            .collect();
        if distinct.len() >= produced.len() {
            break;
        }
    }
    let again: Vec<&ShareRecord> = later
        .iter()
        .filter(|r| accepted.contains(&coordinates(r)))
        .collect();
    assert!(
        again.is_empty(),
        "{} of the {} records A accepted were delivered again, first {:?}",
        again.len(),
        accepted.len(),
        again
            .first()
            .map(|r| (r.partition, r.offset, r.delivery_count))
    );
    let report = DeliveryReport::compare(
        expected(&produced),
        later
            .iter()
            .map(coordinates)
            .chain(accepted.iter().cloned()),
    );
    assert!(report.nothing_lost(), "{}", report.summary());
    for m in [a, b, c] {
        m.close().await.expect("close");
    }
}

/// With `fetch_buffer_batches` = 1 (the default) a broker is asked for more records only once
/// the application has acknowledged what it gave: polling again while holding them sends no
/// ShareFetch (the dev broker would re-send the held records and walk their locks for every
/// offset it answers), and the acks then ride on the next fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_is_not_asked_for_more_while_its_records_are_unacknowledged() {
    let broker = share_broker(1);
    broker.create_topic("gated", 1);
    let bootstrap = broker.bootstrap();
    // Two produce calls: two stored batches, so the first fetch cannot take all 40 records.
    produce(&bootstrap, "gated", numbered_records(20, 20, 1), "none").await;
    produce(&bootstrap, "gated", numbered_records(20, 20, 1), "none").await;
    let mut config = ShareConsumerConfig::new(&bootstrap, "gated-group");
    config.max_poll_records = 10;
    let mut c = ShareConsumer::connect(config).await.expect("connect");
    c.subscribe(&["gated"]);
    let mut first = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while first.is_empty() && Instant::now() < deadline {
        first = c.poll(Duration::from_millis(200)).await.expect("poll");
    }
    assert_eq!(first.len(), 10, "{first:?}");
    broker.start_request_tracking();
    // Hand out the rest of what was fetched, without acknowledging anything.
    let mut held = first.clone();
    for _ in 0..5 {
        held.extend(c.poll(Duration::from_millis(100)).await.expect("poll"));
    }
    let fetches_while_holding = broker
        .request_counts()
        .get(&SHARE_FETCH)
        .copied()
        .unwrap_or(0);
    assert_eq!(
        fetches_while_holding,
        0,
        "fetched again while holding {} unacknowledged records",
        held.len()
    );
    c.acknowledge_all(&held, AcknowledgeType::Accept)
        .expect("acknowledge");
    let rest = drain(&mut c, 40 - held.len(), Duration::from_secs(30)).await;
    let mut offsets: Vec<i64> = held.iter().chain(&rest).map(|r| r.offset).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..40).collect::<Vec<i64>>());
    assert!(
        broker
            .request_counts()
            .get(&SHARE_FETCH)
            .copied()
            .unwrap_or(0)
            > 0,
        "acknowledging let the consumer fetch again"
    );
    c.close().await.expect("close");
}
