//! KIP-1302 test plan 5.2 (3): a task killed mid-processing leaves its records acquired; the
//! broker makes them available again (acquisition lock expiry, or at once when it sees the
//! connection close) and the surviving tasks deliver them.

mod runtime_support;

use std::time::{Duration, Instant};

use runtime_support::{config, coordinates, probe, share_broker, wait_until, worker};
use spillway_actors::State;
use spillway_tests::{numbered_records, produce, DeliveryReport};

const LOCK_MS: i32 = 1_500;
const SESSION_MS: i32 = 2_000;

#[tokio::test(flavor = "multi_thread")]
async fn records_of_a_killed_task_are_redelivered_to_the_survivors() {
    let broker = share_broker(1, LOCK_MS, SESSION_MS);
    broker.create_topic("work", 6);
    let produced = produce(
        &broker.bootstrap(),
        "work",
        numbered_records(1_800, 32, 6),
        "none",
    )
    .await;
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "failover"),
            ("connector.class", "probe"),
            ("probe.id", "failover"),
            ("probe.put.delay.ms", "50"),
            ("topics", "work"),
            ("tasks.max", "3"),
            ("consumer.override.group.protocol", "share"),
            ("consumer.override.max.poll.records", "30"),
        ]))
        .await
        .expect("connector starts");
    let probe = probe("failover");
    wait_until(Duration::from_secs(20), "task 0 processing", || {
        probe.per_task().get(&0).copied().unwrap_or(0) >= 30
    })
    .await;
    let before_kill: Vec<_> = probe.received();
    worker
        .kill_task("failover", 0)
        .await
        .expect("task 0 exists");
    let killed_at = Instant::now();
    let status = worker.status("failover").expect("registered");
    assert_eq!(status.tasks[0].state, State::Failed);

    wait_until(Duration::from_secs(30), "every record", || {
        probe.distinct() >= 1_800
    })
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());

    // The partitions task 0 had were finished by tasks 1 and 2.
    let task0_partitions: std::collections::BTreeSet<i32> = before_kill
        .iter()
        .filter(|r| r.task == 0)
        .map(|r| r.partition)
        .collect();
    let after: Vec<_> = probe
        .received()
        .into_iter()
        .filter(|r| r.at > killed_at)
        .collect();
    assert!(
        after.iter().all(|r| r.task != 0),
        "the killed task delivered nothing more"
    );
    let taken_over: Vec<_> = after
        .iter()
        .filter(|r| task0_partitions.contains(&r.partition))
        .collect();
    assert!(
        !taken_over.is_empty(),
        "survivors took over partitions {task0_partitions:?}"
    );
    // Each record task 0 held comes back once its lock is gone: the first takeover delivery
    // happens within the lock duration plus the dev broker's session timeout (the mock
    // reassigns a dead member's partitions only when its session expires).
    let first = taken_over.iter().map(|r| r.at).min().expect("non-empty");
    let bound = Duration::from_millis((LOCK_MS + SESSION_MS) as u64 + 3_000);
    assert!(
        first.duration_since(killed_at) < bound,
        "first redelivery after {:?}",
        first.duration_since(killed_at)
    );
    worker.shutdown().await;
}
