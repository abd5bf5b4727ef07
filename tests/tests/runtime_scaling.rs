//! KIP-1302 test plan 5.2 (2): scale a share-group sink from 2 to 6 tasks while records flow;
//! nothing is lost and every one of the 6 tasks receives records. Then back down to 2.
//!
//! The dev broker gives each partition to one member (share-protocol brief §8.5), so the topic
//! has 12 partitions: after scaling, each of the 6 members owns two.

mod runtime_support;

use std::time::Duration;

use runtime_support::{config, coordinates, probe, share_broker, wait_until, worker};
use spillway_tests::{numbered_range, numbered_records, produce, DeliveryReport};

#[tokio::test(flavor = "multi_thread")]
async fn scaling_from_two_to_six_tasks_and_back_loses_nothing_and_uses_every_task() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("events", 12);
    let bootstrap = broker.bootstrap();
    let mut produced = produce(
        &bootstrap,
        "events",
        numbered_records(1_200, 32, 12),
        "none",
    )
    .await;
    let worker = worker(&broker);
    let mut connector = config(&[
        ("name", "elastic"),
        ("connector.class", "probe"),
        ("probe.id", "elastic"),
        ("probe.put.delay.ms", "20"),
        ("topics", "events"),
        ("tasks.max", "2"),
        ("consumer.override.group.protocol", "share"),
        ("consumer.override.max.poll.records", "50"),
    ]);
    worker
        .start_connector(connector.clone())
        .await
        .expect("connector starts");
    let probe = probe("elastic");
    wait_until(Duration::from_secs(20), "the first records", || {
        probe.distinct() > 100
    })
    .await;

    connector.insert("tasks.max".into(), "6".into());
    worker
        .reconfigure_connector(connector)
        .await
        .expect("scales to 6 tasks");
    assert_eq!(worker.status("elastic").expect("registered").tasks.len(), 6);
    wait_until(Duration::from_secs(20), "six share-group members", || {
        broker.share_member_ids("connect-share-elastic").len() == 6
    })
    .await;
    // The earlier members learn that they gave partitions away on their next heartbeat, and
    // the dev broker lets a member fetch a partition it no longer owns until then (brief §8.6
    // item 18). So records keep coming, in rounds, until every member has had some.
    let mut rounds = 0;
    loop {
        rounds += 1;
        let round = numbered_records(600, 32, 12);
        produced.extend(produce(&bootstrap, "events", round, "none").await);
        let expected = produced.len();
        wait_until(Duration::from_secs(30), "the round delivered", || {
            probe.distinct() >= expected
        })
        .await;
        if probe.per_task().len() == 6 || rounds == 8 {
            break;
        }
    }
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    let per_task = probe.per_task();
    assert_eq!(
        per_task.keys().copied().collect::<Vec<_>>(),
        (0..6).collect::<Vec<u32>>(),
        "every task received records: {per_task:?}"
    );

    // And back down to 2: the retired tasks finish what they hold and leave the group.
    worker
        .set_task_count("elastic", 2)
        .await
        .expect("scales to 2 tasks");
    wait_until(Duration::from_secs(20), "two tasks and two members", || {
        worker.status("elastic").is_some_and(|s| s.tasks.len() == 2)
            && broker.share_member_ids("connect-share-elastic").len() == 2
    })
    .await;
    produced.extend(produce(&bootstrap, "events", numbered_records(600, 32, 12), "none").await);
    let expected = produced.len();
    wait_until(
        Duration::from_secs(30),
        "every record after scaling down",
        || probe.distinct() >= expected,
    )
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    worker.shutdown().await;
}

/// Distributed mode runs some of a connector's tasks on each worker: a worker assigned task 1
/// of three runs that one alone; given tasks 0 and 2 instead, task 1 drains and leaves while 0
/// and 2 start and consume.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_runs_only_the_tasks_assigned_to_it_and_follows_a_new_assignment() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("shared", 6);
    let bootstrap = broker.bootstrap();
    let mut produced = produce(&bootstrap, "shared", numbered_records(600, 32, 6), "none").await;
    let worker = worker(&broker);
    let connector = config(&[
        ("name", "partial"),
        ("connector.class", "probe"),
        ("probe.id", "partial"),
        ("topics", "shared"),
        ("tasks.max", "3"),
        ("consumer.override.group.protocol", "share"),
    ]);
    worker
        .assign_tasks("partial", Some([1].into()))
        .await
        .expect("an assignment before the start is kept");
    worker
        .start_connector(connector)
        .await
        .expect("connector starts");
    let ids = |worker: &spillway_actors::Worker| -> Vec<u32> {
        worker
            .status("partial")
            .map(|s| s.tasks.iter().map(|t| t.id).collect())
            .unwrap_or_default()
    };
    assert_eq!(ids(&worker), vec![1], "only the assigned task runs");
    let probe = probe("partial");
    wait_until(
        Duration::from_secs(20),
        "task 1 delivers every record",
        || probe.distinct() >= produced.len(),
    )
    .await;
    assert_eq!(
        probe.per_task().keys().copied().collect::<Vec<_>>(),
        vec![1]
    );

    worker
        .assign_tasks("partial", Some([0, 2].into()))
        .await
        .expect("new assignment");
    wait_until(Duration::from_secs(20), "task 1 drained and gone", || {
        worker.tasks_stopped("partial", &[1].into())
    })
    .await;
    assert_eq!(ids(&worker), vec![0, 2]);
    produced.extend(produce(&bootstrap, "shared", numbered_range(600, 600, 6), "none").await);
    let expected = produced.len();
    wait_until(
        Duration::from_secs(30),
        "tasks 0 and 2 deliver the rest",
        || probe.distinct() >= expected,
    )
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    let late: Vec<u32> = probe
        .per_task()
        .keys()
        .copied()
        .filter(|t| *t != 1)
        .collect();
    assert!(!late.is_empty(), "tasks 0 and 2 received records");
    worker.shutdown().await;
}
