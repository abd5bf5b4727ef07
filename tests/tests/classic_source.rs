//! `ClassicSource` (rdkafka) against the dev broker: what `keep_alive` leaves behind when the
//! group moves partitions while they are paused.

use std::time::{Duration, Instant};

use spillway_kafka::classic::{ClassicConfig, ClassicPoll, ClassicSource, RebalanceEvent};
use spillway_tests::{numbered_records, produce, DevBroker};

const POLL: Duration = Duration::from_millis(200);

fn revoked(polled: &ClassicPoll, topic: &str) -> bool {
    polled.events.iter().any(|event| match event {
        RebalanceEvent::Revoked(list) => list.iter().any(|(t, _)| t == topic),
        RebalanceEvent::Assigned(_) => false,
    })
}

/// librdkafka keeps an application's pause on a partition across a revocation. A partition
/// that `keep_alive` paused, that the group then took away and later gave back, must be read
/// again: found in CI, where a classic exactly-once task stopped reading one partition for good
/// after a rebalance (the poll that resumed "the assignment" ran while it was not assigned).
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_paused_by_keep_alive_is_read_again_once_assigned_again() {
    let broker = DevBroker::start(1);
    broker.create_topic("paused", 1);
    broker.create_topic("elsewhere", 1);
    let bootstrap = broker.bootstrap();
    produce(&bootstrap, "paused", numbered_records(20, 16, 1), "none").await;
    let mut config = ClassicConfig::new(&bootstrap, "keep-alive");
    config.max_poll_records = 5;
    let source = ClassicSource::connect(config).expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(30);

    source.subscribe(&["paused".to_owned()]).expect("subscribe");
    while source.poll(POLL).await.expect("poll").records.is_empty() {
        assert!(Instant::now() < deadline, "no record of 'paused' read");
    }
    // The task cannot take records: its partition is paused. Then the group takes the
    // partition away (here: a new subscription) while it is paused.
    source.keep_alive().await.expect("keep alive");
    source
        .subscribe(&["elsewhere".to_owned()])
        .expect("subscribe");
    while !revoked(&source.keep_alive().await.expect("keep alive"), "paused") {
        assert!(Instant::now() < deadline, "'paused' was never revoked");
    }
    // Records can be taken again (this poll resumes what was paused), and the partition
    // comes back.
    source.poll(POLL).await.expect("poll");
    source.subscribe(&["paused".to_owned()]).expect("subscribe");
    loop {
        let polled = source.poll(POLL).await.expect("poll");
        if polled.records.iter().any(|r| r.topic == "paused") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "'paused' was assigned again but nothing was read from it: it stayed paused"
        );
    }
}

/// A record given back is read again from its offset. The seek, which waits for librdkafka's
/// fetcher (up to 5 s), is not made on the caller's thread (a pool thread other tasks share):
/// it waits, asked for, until the next poll makes it on a blocking thread before reading.
#[tokio::test(flavor = "current_thread")]
async fn a_record_given_back_is_read_again_and_the_seek_is_made_by_the_next_poll() {
    let broker = DevBroker::start(1);
    broker.create_topic("again", 1);
    let bootstrap = broker.bootstrap();
    produce(&bootstrap, "again", numbered_records(10, 16, 1), "none").await;
    let mut config = ClassicConfig::new(&bootstrap, "seek-back");
    config.max_poll_records = 10;
    let source = ClassicSource::connect(config).expect("consumer");
    source.subscribe(&["again".to_owned()]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut read = Vec::new();
    while read.len() < 10 {
        read.extend(source.poll(POLL).await.expect("poll").records);
        assert!(Instant::now() < deadline, "only {} of 10 read", read.len());
    }
    source.seek_back("again", 0, 3);
    assert_eq!(
        source.pending_seeks(),
        vec![(("again".to_owned(), 0), 3)],
        "asked for, not made on this thread"
    );
    let mut again = Vec::new();
    while again.is_empty() {
        again = source.poll(POLL).await.expect("poll").records;
        assert!(Instant::now() < deadline, "nothing read again");
    }
    assert!(source.pending_seeks().is_empty(), "the poll made the seek");
    assert_eq!(again[0].offset, 3, "read again from the record given back");
}

/// Dropping a source (a killed task's) does not wait for the consumer to close: closing leaves
/// the group and waits for the broker, which must not hold up the pool thread the task shared
/// with others. Here the broker answers after 2 s.
#[tokio::test(flavor = "current_thread")]
async fn dropping_a_source_does_not_wait_for_its_consumer_to_close() {
    let broker = DevBroker::start(1);
    broker.create_topic("closing", 1);
    let bootstrap = broker.bootstrap();
    produce(&bootstrap, "closing", numbered_records(5, 16, 1), "none").await;
    let source =
        ClassicSource::connect(ClassicConfig::new(&bootstrap, "closing")).expect("consumer");
    source
        .subscribe(&["closing".to_owned()])
        .expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(30);
    while source.poll(POLL).await.expect("poll").records.is_empty() {
        assert!(Instant::now() < deadline, "nothing read");
    }
    broker.broker_rtt(1, 2000);
    let started = Instant::now();
    drop(source);
    let took = started.elapsed();
    broker.broker_rtt(1, 0);
    assert!(
        took < Duration::from_millis(500),
        "dropping the source held its thread for {took:?}"
    );
}
