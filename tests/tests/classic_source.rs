//! `ClassicSource` (rdkafka) against the dev broker: what `keep_alive` leaves behind when the
//! group moves partitions while they are paused; records read a poll's worth at a time from a
//! queue of their own, with the group's rebalances still served between them.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use spillway_kafka::classic::{
    ClassicConfig, ClassicPoll, ClassicRecord, ClassicSource, RebalanceEvent,
};
use spillway_tests::{numbered_records, produce, DevBroker, TestRecord};

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
    let source = subscribed(&bootstrap, "seek-back", "again", 10);
    let deadline = Instant::now() + Duration::from_secs(30);
    read_n(&source, 10, deadline).await;
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

/// A source of group `group` subscribed to `topic`, polling up to `max` records at a time.
fn subscribed(bootstrap: &str, group: &str, topic: &str, max: usize) -> ClassicSource {
    let mut config = ClassicConfig::new(bootstrap, group);
    config.max_poll_records = max;
    let source = ClassicSource::connect(config).expect("consumer");
    source.subscribe(&[topic.to_owned()]).expect("subscribe");
    source
}

/// The first `n` records the next polls return.
async fn read_n(source: &ClassicSource, n: usize, deadline: Instant) -> Vec<ClassicRecord> {
    let mut read = Vec::new();
    while read.len() < n {
        read.extend(source.poll(POLL).await.expect("poll").records);
        assert!(Instant::now() < deadline, "only {} of {n} read", read.len());
    }
    read
}

/// Records come with their headers unless the reader turns them off for the next polls (a
/// reader that looks at none); turned on again, they come back.
#[tokio::test(flavor = "current_thread")]
async fn headers_are_read_unless_turned_off() {
    let broker = DevBroker::start(1);
    broker.create_topic("headed", 1);
    let bootstrap = broker.bootstrap();
    let records = numbered_records(10, 16, 1)
        .into_iter()
        .map(|mut r| {
            r.headers = vec![
                ("h".to_owned(), Some(b"v".to_vec())),
                ("empty".to_owned(), None),
            ];
            r
        })
        .collect();
    produce(&bootstrap, "headed", records, "none").await;
    let source = subscribed(&bootstrap, "headers", "headed", 10);
    let deadline = Instant::now() + Duration::from_secs(30);
    let expected = vec![
        ("h".to_owned(), Some(bytes::Bytes::from_static(b"v"))),
        ("empty".to_owned(), None),
    ];
    for r in read_n(&source, 10, deadline).await {
        assert_eq!(r.headers, expected, "read by default: {r:?}");
    }
    source.read_headers(false);
    source.seek_back("headed", 0, 0);
    for r in read_n(&source, 10, deadline).await {
        assert!(r.headers.is_empty(), "left unread: {r:?}");
        assert!(
            r.value.is_some() && r.key.is_some(),
            "the rest is read: {r:?}"
        );
    }
    source.read_headers(true);
    source.seek_back("headed", 0, 0);
    for r in read_n(&source, 10, deadline).await {
        assert_eq!(r.headers, expected, "read again once turned on: {r:?}");
    }
}

/// A poll's keys and values are copied out of librdkafka's messages into one buffer the
/// records share: null and empty parts stay apart, large and small ones keep their bytes,
/// and the records outlive the source (and its messages).
#[tokio::test(flavor = "current_thread")]
async fn keys_and_values_are_read_as_produced_null_empty_and_large_alike() {
    let broker = DevBroker::start(1);
    broker.create_topic("parts", 1);
    let bootstrap = broker.bootstrap();
    let part = |i: usize| -> Option<Vec<u8>> {
        match i % 5 {
            0 => None,
            1 => Some(Vec::new()),
            2 => Some(vec![b'a' + (i % 26) as u8; 200_000]),
            _ => Some(format!("part-{i}").into_bytes()),
        }
    };
    let records: Vec<TestRecord> = (0..40)
        .map(|i| TestRecord {
            partition: Some(0),
            key: part(i),
            value: part(i / 5 + i),
            ..TestRecord::default()
        })
        .collect();
    produce(&bootstrap, "parts", records.clone(), "none").await;
    let source = subscribed(&bootstrap, "parts", "parts", 40);
    let deadline = Instant::now() + Duration::from_secs(30);
    let read = read_n(&source, records.len(), deadline).await;
    drop(source);
    for (i, (r, sent)) in read.iter().zip(&records).enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(r.key.as_deref(), sent.key.as_deref(), "key of record {i}");
        assert_eq!(
            r.value.as_deref(),
            sent.value.as_deref(),
            "value of record {i}"
        );
    }
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

/// The future's answer if it has one the first time it is polled.
fn at_once<F: Future>(future: F) -> Option<F::Output> {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// Records librdkafka already fetched are taken by the poll itself, in one call, on the
/// caller's thread: no hand-off to tokio's blocking pool and back (issue 18). Only a poll that
/// must wait, seek, resume or serve the group's events goes to a blocking thread.
#[tokio::test(flavor = "current_thread")]
async fn records_already_fetched_are_taken_at_once_without_a_blocking_thread() {
    let broker = DevBroker::start(1);
    broker.create_topic("ready", 1);
    let bootstrap = broker.bootstrap();
    produce(&bootstrap, "ready", numbered_records(100, 16, 1), "none").await;
    let mut config = ClassicConfig::new(&bootstrap, "ready");
    config.max_poll_records = 10;
    let source = ClassicSource::connect(config).expect("consumer");
    source.subscribe(&["ready".to_owned()]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut read = Vec::new();
    while read.is_empty() {
        read.extend(source.poll(POLL).await.expect("poll").records);
        assert!(Instant::now() < deadline, "nothing read");
    }
    // librdkafka fetched the rest of the partition meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let polled = at_once(source.poll(POLL))
        .expect("records were waiting, yet the poll did not answer at once")
        .expect("poll");
    assert_eq!(polled.records.len(), 10, "a full poll of max.poll.records");
    let next = read.last().map_or(0, |r| r.offset + 1);
    let offsets: Vec<i64> = polled.records.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        (next..next + 10).collect::<Vec<_>>(),
        "in order, none skipped"
    );
    assert!(polled
        .records
        .iter()
        .all(|r| r.topic == "ready" && r.value.is_some()));
}

/// A member whose poll waits for records while another member joins: the poll ends at the
/// revocation (an event on the consumer queue wakes the wait on the message queue), and the
/// new owner of a partition reads on from what was committed: the asynchronous commit of
/// offsets 0..20 (its answer served by a poll of the message queue) or the revocation's of
/// 0..30 (the dev broker refuses a commit during a rebalance: REBALANCE_IN_PROGRESS), never
/// past a record still in flight, never before the last commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_rebalance_during_a_waiting_poll_hands_the_partitions_on_from_the_processed_records() {
    let broker = DevBroker::start(1);
    broker.create_topic("moving", 2);
    let bootstrap = broker.bootstrap();
    produce(&bootstrap, "moving", numbered_records(80, 16, 2), "none").await;
    let source =
        ClassicSource::connect(ClassicConfig::new(&bootstrap, "moving")).expect("consumer");
    source.subscribe(&["moving".to_owned()]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut records = Vec::new();
    while records.len() < 80 {
        records.extend(source.poll(POLL).await.expect("poll").records);
        assert!(
            Instant::now() < deadline,
            "only {} of 80 read",
            records.len()
        );
    }
    let done = |below: i64| {
        source.mark_done_all(
            records
                .iter()
                .filter(|r| r.offset < below)
                .map(|r| (r.topic.as_str(), r.partition, r.offset)),
        )
    };
    done(20);
    let committed = source.commit().await.expect("commit");
    assert_eq!(
        committed,
        vec![
            (("moving".to_owned(), 0), 20),
            (("moving".to_owned(), 1), 20)
        ]
    );
    // Its answer is served by a poll; then 20..30 are processed too, 30..40 in flight.
    source.poll(POLL).await.expect("poll");
    done(30);

    let joining = tokio::spawn(async move {
        let other =
            ClassicSource::connect(ClassicConfig::new(&bootstrap, "moving")).expect("consumer");
        other.subscribe(&["moving".to_owned()]).expect("subscribe");
        let mut first: BTreeMap<i32, i64> = BTreeMap::new();
        while first.is_empty() {
            for r in other.poll(POLL).await.expect("poll").records {
                first.entry(r.partition).or_insert(r.offset);
            }
            assert!(Instant::now() < deadline, "the joining member read nothing");
        }
        other.close().await.expect("close");
        first
    });

    // Nothing left to read: this poll waits, until the group takes the partitions back.
    let started = Instant::now();
    let polled = source.poll(Duration::from_secs(40)).await.expect("poll");
    let waited = started.elapsed();
    assert!(
        revoked(&polled, "moving"),
        "the poll ended without the revocation: {:?}",
        polled.events
    );
    assert!(
        waited < Duration::from_secs(20),
        "the revocation waited {waited:?} for the poll's timeout"
    );
    // Serving the group until the new member has read.
    let mut kept: Vec<i32> = Vec::new();
    let mut reread: BTreeMap<i32, i64> = BTreeMap::new();
    while !joining.is_finished() {
        let polled = source.poll(POLL).await.expect("poll");
        for event in &polled.events {
            if let RebalanceEvent::Assigned(list) = event {
                kept = list.iter().map(|(_, p)| *p).collect();
            }
        }
        for r in &polled.records {
            assert!(
                kept.contains(&r.partition),
                "a record of partition {} was handed out after it was revoked",
                r.partition
            );
            reread.entry(r.partition).or_insert(r.offset);
        }
        assert!(Instant::now() < deadline, "the new member never read");
    }
    let first = joining.await.expect("the joining member");
    assert_eq!(kept.len(), 1, "two members share two partitions: {kept:?}");
    assert_eq!(
        first.len(),
        1,
        "the new member owns one partition: {first:?}"
    );
    assert!(
        !kept.contains(first.keys().next().expect("one")),
        "one owner each"
    );
    for (partition, offset) in first.iter().chain(reread.iter()) {
        assert!(
            (20..=30).contains(offset),
            "partition {partition} was read again from {offset}: before the last commit (20) \
             or past a record in flight (30)"
        );
    }
}

/// A poll with nothing to read waits in the caller's runtime, woken by librdkafka's socket,
/// not on a blocking thread: handing each idle 200 ms wait to tokio's blocking pool and back
/// cost five thread switches against the C consumer's one (issue 18). Here the runtime's only
/// blocking thread is busy for 8 s, so a poll that needed it would answer after that: an idle
/// poll must still end on its timeout, and a waiting one as soon as a record is produced.
#[test]
fn an_idle_poll_waits_in_the_runtime_and_wakes_when_a_record_arrives() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .expect("runtime");
    let broker = DevBroker::start(1);
    broker.create_topic("idle", 1);
    let bootstrap = broker.bootstrap();
    runtime.block_on(async {
        produce(&bootstrap, "idle", numbered_records(3, 16, 1), "none").await;
        let source = subscribed(&bootstrap, "idle", "idle", 10);
        let deadline = Instant::now() + Duration::from_secs(30);
        read_n(&source, 3, deadline).await;
        // Every rebalance event served: what follows is the idle poll's own wait.
        while !source.poll(POLL).await.expect("poll").events.is_empty() {
            assert!(Instant::now() < deadline, "the group never settled");
        }

        let busy = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_secs(8)));
        let started = Instant::now();
        let polled = source.poll(POLL).await.expect("poll");
        let idle_took = started.elapsed();
        assert!(polled.records.is_empty() && polled.events.is_empty());
        assert!(
            idle_took < Duration::from_secs(2),
            "an idle poll of {POLL:?} took {idle_took:?}: it waited for a blocking thread"
        );

        let producing = {
            let bootstrap = bootstrap.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("producer's runtime")
                    .block_on(produce(
                        &bootstrap,
                        "idle",
                        numbered_records(1, 16, 1),
                        "none",
                    ))
            })
        };
        let started = Instant::now();
        let polled = source.poll(Duration::from_secs(30)).await.expect("poll");
        let woke_after = started.elapsed();
        assert_eq!(
            polled.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
            vec![3],
            "the record produced during the wait"
        );
        assert!(
            woke_after < Duration::from_secs(5),
            "the record arrived 300 ms into the wait, the poll answered after {woke_after:?}"
        );
        producing.join().expect("producer");
        busy.await.expect("the busy blocking task");
    });
}
