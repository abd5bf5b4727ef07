//! Acknowledgements diverted into a producer transaction (KIP-1289 path of issue 6) against the
//! dev broker: once taken for a transaction they never go out in ShareFetch/ShareAcknowledge,
//! so, with no KIP-1289 broker to apply them, the records come back after their lock expires.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spillway_kafka::share::{
    AcknowledgeType, ShareConsumer, ShareConsumerConfig, ShareRecord, TransactionOutcome,
};
use spillway_tests::{numbered_records, produce, DevBroker};

const LOCK: Duration = Duration::from_millis(2_000);

async fn consumer(broker: &DevBroker, group: &str, topic: &str) -> ShareConsumer {
    let mut config = ShareConsumerConfig::new(&broker.bootstrap(), group);
    config.request_timeout = Duration::from_secs(5);
    config.metadata_max_age = Duration::from_secs(1);
    let mut c = ShareConsumer::connect(config)
        .await
        .unwrap_or_else(|e| panic!("share consumer cannot connect: {e}"));
    c.subscribe(&[topic]);
    c
}

/// Poll until `want` records arrived or `limit` passed; returns offset → delivery count.
async fn poll_until(
    c: &mut ShareConsumer,
    want: usize,
    limit: Duration,
    mut each: impl FnMut(&ShareConsumer, &[ShareRecord]),
) -> BTreeMap<i64, i16> {
    let deadline = Instant::now() + limit;
    let mut seen = BTreeMap::new();
    while seen.len() < want && Instant::now() < deadline {
        let records = c
            .poll(Duration::from_millis(200))
            .await
            .unwrap_or_else(|e| panic!("poll failed: {e}"));
        each(c, &records);
        for r in &records {
            seen.insert(r.offset, r.delivery_count);
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_taken_for_a_transaction_are_never_sent_so_the_records_come_back() {
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    broker.set_share_record_lock_duration(LOCK.as_millis() as i32);
    broker.create_topic("src", 1);
    produce(
        &broker.bootstrap(),
        "src",
        numbered_records(10, 50, 1),
        "none",
    )
    .await;
    let mut c = consumer(&broker, "txn-acks", "src").await;

    // First delivery: offsets 0..5 go to a transaction, 5..10 are accepted the normal way.
    let first = poll_until(&mut c, 10, Duration::from_secs(20), |c, records| {
        for r in records {
            if r.offset < 5 {
                c.acknowledge_for_transaction(r, AcknowledgeType::Accept)
                    .unwrap_or_else(|e| panic!("{e}"));
            } else {
                c.acknowledge(r, AcknowledgeType::Accept)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    })
    .await;
    assert_eq!(first.len(), 10, "first delivery: {first:?}");
    assert!(first.values().all(|&count| count == 1), "{first:?}");

    let taken = c.acknowledgements_for_transaction().unwrap();
    assert_eq!(taken.partitions.len(), 1);
    let p = &taken.partitions[0];
    assert_eq!((&*p.topic, p.partition), ("src", 0));
    assert!(!p.topic_id.is_nil(), "the topic is named by its id");
    assert_eq!(p.batches.len(), 1);
    assert_eq!(
        (
            p.batches[0].first_offset,
            p.batches[0].last_offset,
            &p.batches[0].types
        ),
        (0, 4, &vec![1i8])
    );
    assert!(
        c.acknowledgements_for_transaction().unwrap().is_empty(),
        "taken once"
    );
    let meta = c.share_group_metadata();
    assert_eq!(meta.group_id, "txn-acks");
    assert_eq!(meta.member_id, c.member_id());
    assert!(meta.member_epoch > 0, "joined: {meta:?}");

    // The normal acks go out; the diverted ones must not.
    let results = c.commit_sync(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        results.get(&("src".to_string(), 0)),
        Some(&Ok(())),
        "{results:?}"
    );

    // No broker staged the diverted ACCEPTs, so once the lock runs out exactly 0..5 come back.
    let again = poll_until(&mut c, 5, LOCK * 4, |c, records| {
        c.acknowledge_all(records, AcknowledgeType::Accept)
            .unwrap_or_else(|e| panic!("{e}"));
    })
    .await;
    c.commit_sync(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        again,
        (0..5).map(|o| (o, 2)).collect::<BTreeMap<i64, i16>>(),
        "only the records whose acks went to the transaction are redelivered"
    );

    // Finishing the (long since expired) transaction afterwards must not touch the new
    // deliveries, which were accepted the normal way.
    c.finish_transaction(
        &taken,
        TransactionOutcome::Aborted {
            staged_on_broker: false,
        },
    );
    let quiet = poll_until(&mut c, 1, LOCK * 2, |_, _| {}).await;
    assert!(quiet.is_empty(), "nothing else comes back: {quiet:?}");
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_releases_its_records_at_once() {
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    // Long locks: a record that comes back quickly was released, not expired.
    broker.set_share_record_lock_duration(60_000);
    broker.create_topic("src", 1);
    produce(
        &broker.bootstrap(),
        "src",
        numbered_records(4, 50, 1),
        "none",
    )
    .await;
    let mut c = consumer(&broker, "txn-abort", "src").await;
    let first = poll_until(&mut c, 4, Duration::from_secs(20), |c, records| {
        c.acknowledge_all_for_transaction(records, AcknowledgeType::Reject)
            .unwrap_or_else(|e| panic!("{e}"));
    })
    .await;
    assert_eq!(first.len(), 4);
    let taken = c.acknowledgements_for_transaction().unwrap();
    assert_eq!(taken.record_count(), 4);
    c.finish_transaction(
        &taken,
        TransactionOutcome::Aborted {
            staged_on_broker: false,
        },
    );
    let results = c.commit_sync(Duration::from_secs(5)).await.unwrap();
    assert_eq!(results.get(&("src".to_string(), 0)), Some(&Ok(())));
    let again = poll_until(&mut c, 4, Duration::from_secs(10), |c, records| {
        c.acknowledge_all(records, AcknowledgeType::Accept)
            .unwrap_or_else(|e| panic!("{e}"));
    })
    .await;
    assert_eq!(
        again,
        (0..4).map(|o| (o, 2)).collect::<BTreeMap<i64, i16>>(),
        "released, so delivered again well before the 60 s lock"
    );
    c.commit_sync(Duration::from_secs(5)).await.unwrap();
    c.close().await.unwrap();
}
