//! The KIP-1289 flow against the dev broker, which (like every released broker) does not
//! implement TxnShareAcknowledge: the flow must fail cleanly, abort the transaction so that no
//! output is visible, and leave the source records to be delivered again.
#![cfg(feature = "kip-1289")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::producer::FutureRecord;
use spillway_eos::kip1289::producer_identity::producer_identity_at;
use spillway_eos::kip1289::{Kip1289Error, Kip1289Producer, Kip1289Settings};
use spillway_kafka::cluster::Cluster;
use spillway_kafka::share::{
    AcknowledgeType, ShareConsumer, ShareConsumerConfig, ShareError, ShareRecord,
};
use spillway_tests::{numbered_records, produce, DevBroker};

const T: Duration = Duration::from_secs(5);

fn settings() -> Kip1289Settings {
    Kip1289Settings {
        request_timeout: T,
        ..Kip1289Settings::default()
    }
}

async fn consumer(broker: &DevBroker, group: &str, topic: &str) -> ShareConsumer {
    let mut config = ShareConsumerConfig::new(&broker.bootstrap(), group);
    config.request_timeout = T;
    config.metadata_max_age = Duration::from_secs(1);
    let mut c = ShareConsumer::connect(config)
        .await
        .unwrap_or_else(|e| panic!("share consumer cannot connect: {e}"));
    c.subscribe(&[topic]);
    c
}

/// Poll until `want` distinct records arrived or `limit` passed.
async fn poll_records(c: &mut ShareConsumer, want: usize, limit: Duration) -> Vec<ShareRecord> {
    let deadline = Instant::now() + limit;
    let mut out: Vec<ShareRecord> = Vec::new();
    while out.len() < want && Instant::now() < deadline {
        out.extend(
            c.poll(Duration::from_millis(200))
                .await
                .unwrap_or_else(|e| panic!("poll failed: {e}")),
        );
    }
    out
}

/// Poll a read_committed share consumer for `limit`. The dev broker writes its transaction
/// markers with a zero CRC, which the share consumer rejects as corrupt (and never delivers):
/// those offsets are returned apart.
async fn poll_committed(c: &mut ShareConsumer, limit: Duration) -> (Vec<ShareRecord>, Vec<i64>) {
    let deadline = Instant::now() + limit;
    let mut records = Vec::new();
    let mut markers = Vec::new();
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)).await {
            Ok(batch) => {
                c.acknowledge_all(&batch, AcknowledgeType::Accept).unwrap();
                records.extend(batch);
            }
            Err(ShareError::CorruptRecords { first, last, .. }) => markers.extend(first..=last),
            Err(e) => panic!("poll failed: {e}"),
        }
    }
    (records, markers)
}

async fn producer(broker: &DevBroker, transactional_id: &str) -> Kip1289Producer {
    let mut config = ClientConfig::new();
    config.set("transaction.timeout.ms", "30000");
    Kip1289Producer::create(&broker.bootstrap(), transactional_id, settings(), config)
        .await
        .unwrap_or_else(|e| panic!("transactional producer: {e}"))
}

fn broker() -> DevBroker {
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    // Locks far longer than the test waits: a record that comes back was released.
    broker.set_share_record_lock_duration(60_000);
    // Aborted output must stay invisible to the checking consumer.
    broker.set_share_isolation_level(true);
    broker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_broker_support_the_transaction_aborts_and_the_records_come_back() {
    let broker = broker();
    broker.create_topic("src", 1);
    broker.create_topic("out", 1);
    produce(
        &broker.bootstrap(),
        "src",
        numbered_records(10, 40, 1),
        "none",
    )
    .await;
    // The producer starts before the share consumer: librdkafka may close a start-up
    // connection (its bootstrap one) once it knows the cluster, and the dev broker then drops
    // every share session on that broker (brief §8.6 #9).
    let producer = producer(&broker, "kip1289-task-0").await;
    let mut source = consumer(&broker, "replicator", "src").await;
    let records = poll_records(&mut source, 10, Duration::from_secs(20)).await;
    assert_eq!(records.len(), 10);

    let mut txn = producer.begin().await.unwrap();
    for r in &records {
        txn.send(FutureRecord::<[u8], [u8]>::to("out").payload(r.value.as_deref().unwrap()))
            .await
            .unwrap();
        source
            .acknowledge_for_transaction(r, AcknowledgeType::Accept)
            .unwrap();
    }
    let err = txn.commit(&source).await.unwrap_err();
    let Kip1289Error::Aborted {
        cause,
        abort_failure,
    } = &err
    else {
        panic!("expected an aborted transaction, got: {err}");
    };
    assert!(abort_failure.is_empty(), "the abort worked: {err}");
    assert!(
        matches!(**cause, Kip1289Error::NotSupported { api_key: 93, .. }),
        "the dev broker does not advertise api key 93: {err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("transaction was aborted") && msg.contains("no released broker implements"),
        "{msg}"
    );

    // The acks were withdrawn (released), so the records come back well before the 60 s lock.
    let again = poll_records(&mut source, 10, Duration::from_secs(15)).await;
    let counts: BTreeMap<i64, i16> = again.iter().map(|r| (r.offset, r.delivery_count)).collect();
    assert_eq!(
        counts,
        (0..10).map(|o| (o, 2)).collect::<BTreeMap<i64, i16>>(),
        "every source record is delivered again"
    );

    // Acknowledgements staged for a transaction that produces nothing have no output to be
    // atomic with: they are committed the normal way and the records stay settled.
    source
        .acknowledge_all_for_transaction(&again, AcknowledgeType::Accept)
        .unwrap();
    let empty = producer.begin().await.unwrap();
    let report = empty.commit(&source).await.unwrap();
    assert_eq!(
        (report.records_produced, report.records_acknowledged),
        (0, 10)
    );
    let results = source.commit_sync(T).await.unwrap();
    assert_eq!(results.get(&("src".to_string(), 0)), Some(&Ok(())));
    let late = poll_records(&mut source, 1, Duration::from_secs(2)).await;
    assert!(late.is_empty(), "accepted records stay settled: {late:?}");

    // (The source's acknowledgements are all confirmed before the checking consumer connects:
    // the dev broker drops every share session on a broker when any connection to it closes,
    // brief §8.6 #9.)
    // A transaction with output but no acknowledgements commits as usual: the checking
    // consumer must see its record and none of the aborted ones.
    let mut marker = producer.begin().await.unwrap();
    marker
        .send(FutureRecord::<[u8], [u8]>::to("out").payload(b"committed"))
        .await
        .unwrap();
    let report = marker.commit(&source).await.unwrap();
    assert_eq!(
        (report.records_produced, report.records_acknowledged),
        (1, 0)
    );
    let mut check = consumer(&broker, "check", "out").await;
    let (seen, markers) = poll_committed(&mut check, Duration::from_secs(4)).await;
    let values: Vec<&[u8]> = seen.iter().map(|r| r.value.as_deref().unwrap()).collect();
    assert_eq!(
        values,
        vec![b"committed".as_slice()],
        "aborted output is invisible"
    );
    // out-0: 0..=9 aborted data, 10 the abort marker, 11 the committed record, 12 its marker.
    assert_eq!(seen[0].offset, 11);
    assert!(
        markers.iter().all(|o| [10, 12].contains(o)),
        "only transaction markers failed to decode: {markers:?}"
    );

    check.close().await.unwrap();
    source.close().await.unwrap();
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_identity_is_read_from_the_transactions_first_record() {
    let broker = broker();
    broker.create_topic("out", 2);
    let cluster = Cluster::connect(&broker.bootstrap(), "test", T)
        .await
        .unwrap();
    let source = consumer(&broker, "unused", "out").await;
    let mut identities = Vec::new();
    let a = producer(&broker, "a").await;
    let b = producer(&broker, "b").await;
    for producer in [&a, &a, &b] {
        let mut txn = producer.begin().await.unwrap();
        let (partition, offset) = txn
            .send(
                FutureRecord::<[u8], [u8]>::to("out")
                    .payload(b"x")
                    .partition(1),
            )
            .await
            .unwrap();
        let identity = producer_identity_at(&cluster, "out", partition, offset, T)
            .await
            .unwrap();
        txn.commit(&source).await.unwrap();
        identities.push(identity);
    }
    assert!(
        identities.iter().all(|i| i.producer_id >= 0),
        "{identities:?}"
    );
    // Two transactions of one producer: one producer id (KIP-890 brokers bump the epoch per
    // transaction, older ones keep it). Another transactional id: another producer id.
    assert_eq!(identities[0].producer_id, identities[1].producer_id);
    assert!(identities[1].producer_epoch >= identities[0].producer_epoch);
    assert_ne!(identities[0].producer_id, identities[2].producer_id);

    // A record written without a transaction has no transactional identity.
    let plain = produce(
        &broker.bootstrap(),
        "out",
        numbered_records(1, 10, 1),
        "none",
    )
    .await;
    let err = producer_identity_at(&cluster, "out", 0, plain[0].offset, T)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("not written by a transactional producer"),
        "{err}"
    );
}
