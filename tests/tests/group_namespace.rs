//! Group ids under Kafka's one namespace (issue 14, item 6), through the test-kit proxy's
//! emulation of it (the dev broker keeps share and consumer groups apart, Kafka 4.2 does not):
//! KIP-1302's rollback (share → remove the share setting → classic) and the way back lose no
//! record and the status stays honest; a group id held by a group of the other type is refused
//! both ways before the connector starts; and a classic or KIP-848 join the broker refuses
//! fails the task with the reason instead of showing RUNNING.

mod runtime_support;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use runtime_support::{config, coordinates, probe, share_broker, wait_until, worker_on};
use spillway_actors::{RuntimeError, State};
use spillway_core::ConfigMap;
use spillway_tests::kafka_proxy::{GroupType, KafkaProxy, ProxyOptions, ProxySecurity};
use spillway_tests::{numbered_records, produce, DeliveryReport, DevBroker};

const FIND_COORDINATOR: i16 = 10;

/// What the worker logged (WARN and above) in this test binary.
fn captured_logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Capture(logs))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        logs
    })
}

struct Capture(&'static Mutex<Vec<u8>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> String {
    String::from_utf8_lossy(&captured_logs().lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

fn namespace_proxy(broker: &DevBroker) -> KafkaProxy {
    KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_one_group_namespace(),
    )
    .expect("proxy starts")
}

fn probe_config(name: &str, topic: &str, share: bool, group: Option<&str>) -> ConfigMap {
    let mut c = config(&[
        ("name", name),
        ("connector.class", "probe"),
        ("probe.id", name),
        ("topics", topic),
        // Classic mode with 2+ tasks has a known duplicate-on-rebalance defect (runtime.md).
        ("tasks.max", "1"),
    ]);
    if share {
        c.insert("consumer.override.group.protocol".into(), "share".into());
    }
    if let Some(group) = group {
        c.insert("consumer.override.group.id".into(), group.into());
    }
    c
}

fn all_running(worker: &spillway_actors::Worker, name: &str) -> bool {
    worker.status(name).is_some_and(|s| {
        s.state == State::Running
            && !s.tasks.is_empty()
            && s.tasks.iter().all(|t| t.state == State::Running)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn rolling_back_to_a_consumer_group_and_migrating_again_loses_nothing_under_one_namespace() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("ledger", 2);
    let proxy = namespace_proxy(&broker);
    let mut produced = produce(
        &broker.bootstrap(),
        "ledger",
        numbered_records(300, 32, 2),
        "none",
    )
    .await;
    let worker = worker_on(&proxy.bootstrap());
    let p = probe("kip");

    // 1. A share connector: its group is connect-share-<name>.
    worker
        .start_connector(probe_config("kip", "ledger", true, None))
        .await
        .expect("starts in share mode");
    assert_eq!(
        worker.status("kip").expect("known").group_id,
        "connect-share-kip"
    );
    wait_until(Duration::from_secs(30), "share mode delivers", || {
        p.distinct() >= 300
    })
    .await;
    assert!(all_running(&worker, "kip"));
    let groups = proxy.groups().expect("namespace emulated");
    assert_eq!(
        groups.group_type("connect-share-kip"),
        Some(GroupType::Share)
    );

    // 2. KIP-1302 rollback: the share setting is removed; the consumer group is connect-<name>,
    // which the share group (kept by Kafka) does not hold.
    worker
        .reconfigure_connector(probe_config("kip", "ledger", false, None))
        .await
        .expect("rolls back");
    let status = worker.status("kip").expect("known");
    assert_eq!(status.group_protocol, "classic (default)");
    assert_eq!(status.group_id, "connect-kip");
    produced.extend(
        produce(
            &broker.bootstrap(),
            "ledger",
            numbered_records(300, 32, 2),
            "none",
        )
        .await,
    );
    wait_until(Duration::from_secs(45), "classic mode delivers", || {
        p.distinct() >= 600
    })
    .await;
    assert!(all_running(&worker, "kip"), "{:?}", worker.status("kip"));
    assert_eq!(groups.group_type("connect-kip"), Some(GroupType::Classic));
    assert_eq!(
        groups.group_type("connect-share-kip"),
        Some(GroupType::Share),
        "Kafka keeps the share group"
    );

    // 3. Migrating again: the share group takes up where it left off.
    worker
        .reconfigure_connector(probe_config("kip", "ledger", true, None))
        .await
        .expect("migrates to share mode again");
    assert_eq!(
        worker.status("kip").expect("known").group_id,
        "connect-share-kip"
    );
    produced.extend(
        produce(
            &broker.bootstrap(),
            "ledger",
            numbered_records(300, 32, 2),
            "none",
        )
        .await,
    );
    wait_until(Duration::from_secs(45), "share mode delivers again", || {
        p.distinct() >= 900
    })
    .await;
    assert!(all_running(&worker, "kip"), "{:?}", worker.status("kip"));
    let report = DeliveryReport::compare(coordinates(&produced), p.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    for task in worker.status("kip").expect("known").tasks {
        assert!(
            task.trace.is_none(),
            "task {} failed: {:?}",
            task.id,
            task.trace
        );
    }
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_id_held_by_the_other_type_of_group_is_refused_both_ways_before_starting() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("orders", 1);
    let proxy = namespace_proxy(&broker);
    let produced = produce(
        &broker.bootstrap(),
        "orders",
        numbered_records(50, 32, 1),
        "none",
    )
    .await;
    let worker = worker_on(&proxy.bootstrap());

    // A classic connector holds "billing" (members, committed offsets).
    let classic = probe("classic-side");
    worker
        .start_connector(probe_config(
            "classic-side",
            "orders",
            false,
            Some("billing"),
        ))
        .await
        .expect("classic starts");
    wait_until(Duration::from_secs(30), "classic delivers", || {
        classic.distinct() >= 50
    })
    .await;
    // A share connector may not take it.
    let err = worker
        .start_connector(probe_config("share-side", "orders", true, Some("billing")))
        .await
        .expect_err("a consumer group holds the id");
    assert!(matches!(err, RuntimeError::GroupIdConflict { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("'billing' is held by a classic consumer group"),
        "{text}"
    );
    assert!(text.contains("it has members now"), "{text}");
    assert!(text.contains("consumer.override.group.id"), "{text}");
    assert!(worker.status("share-side").is_none(), "nothing started");

    // A share connector holds "queue"; a classic connector may not take it, even once the
    // share group is empty (Kafka keeps it until it is deleted).
    let share = probe("queue-side");
    worker
        .start_connector(probe_config("queue-side", "orders", true, Some("queue")))
        .await
        .expect("share starts");
    wait_until(Duration::from_secs(30), "share delivers", || {
        share.distinct() >= 50
    })
    .await;
    worker.stop_connector("queue-side").await.expect("stops");
    let groups = proxy.groups().expect("namespace emulated");
    wait_until(Duration::from_secs(10), "the share member left", || {
        groups.members("queue") == 0
    })
    .await;
    let err = worker
        .start_connector(probe_config("rolled-back", "orders", false, Some("queue")))
        .await
        .expect_err("a share group holds the id");
    let text = err.to_string();
    assert!(text.contains("'queue' is held by a share group"), "{text}");
    assert!(text.contains("in state Empty"), "{text}");
    assert!(
        text.contains("kafka-share-groups.sh --delete --group queue"),
        "{text}"
    );
    // Deleted, the id is free again.
    groups
        .delete_group("queue")
        .expect("an empty share group can be deleted");
    let rolled = probe("rolled-back");
    worker
        .start_connector(probe_config("rolled-back", "orders", false, Some("queue")))
        .await
        .expect("the id is free");
    wait_until(
        Duration::from_secs(30),
        "the classic connector delivers",
        || rolled.distinct() >= 50,
    )
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), rolled.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    worker.shutdown().await;
}

/// A share connector holds `group` on `topic`; then a connector of `config` asks for the same
/// group while the check before its start cannot reach the coordinator in time (a slow or
/// unreachable cluster), so it starts and meets the refusal itself. Returns its failed task's
/// trace once every task of it is FAILED; nothing was read.
async fn refused_after_an_unchecked_start(
    topic: &str,
    holder: &str,
    group: &str,
    mut config: ConfigMap,
) -> (spillway_actors::Worker, String) {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic(topic, 1);
    let proxy = namespace_proxy(&broker);
    produce(
        &broker.bootstrap(),
        topic,
        numbered_records(20, 32, 1),
        "none",
    )
    .await;
    let worker = worker_on(&proxy.bootstrap());
    let share = probe(holder);
    worker
        .start_connector(probe_config(holder, topic, true, Some(group)))
        .await
        .expect("share starts");
    wait_until(Duration::from_secs(30), "share delivers", || {
        share.distinct() >= 20
    })
    .await;
    worker.stop_connector(holder).await.expect("stops");

    proxy
        .faults()
        .delay_responses(FIND_COORDINATOR, Duration::from_secs(7));
    let name = config.get("name").cloned().expect("a name");
    config.insert("task.restart.max.attempts".into(), "1".into());
    worker
        .start_connector(config)
        .await
        .expect("starts unchecked");
    proxy
        .faults()
        .delay_responses(FIND_COORDINATOR, Duration::ZERO);
    wait_until(Duration::from_secs(60), "the task fails", || {
        worker.status(&name).is_some_and(|s| {
            !s.tasks.is_empty() && s.tasks.iter().all(|t| t.state == State::Failed)
        })
    })
    .await;
    let status = worker.status(&name).expect("known");
    let trace = status.tasks[0].trace.clone().unwrap_or_default();
    assert_eq!(probe(&name).distinct(), 0, "nothing was read");
    (worker, trace)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_classic_join_the_broker_refuses_fails_the_task_with_the_reason() {
    let classic = probe_config("late", "events", false, Some("contested"));
    let (worker, trace) =
        refused_after_an_unchecked_start("events", "holder", "contested", classic).await;
    assert!(trace.contains("INCONSISTENT_GROUP_PROTOCOL"), "{trace}");
    assert!(trace.contains("'contested'"), "{trace}");
    assert!(
        trace.contains("kafka-share-groups.sh --delete --group contested"),
        "{trace}"
    );
    // It stays FAILED: no restart brings it back to RUNNING while the share group holds the id.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(worker
        .status("late")
        .is_some_and(|s| s.tasks.iter().all(|t| t.state == State::Failed)));
    worker.shutdown().await;
}

/// A KIP-848 (`consumer` protocol) member refused by the coordinator: librdkafka retries the
/// refused ConsumerGroupHeartbeat (GROUP_ID_NOT_FOUND) without telling the application, so the
/// task watches its join and fails with the reason once the cluster says a share group holds
/// the id.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_protocol_join_the_broker_refuses_fails_the_task_with_the_reason() {
    let mut consumer = probe_config("modern", "payments", false, Some("settled"));
    consumer.insert("consumer.override.group.protocol".into(), "consumer".into());
    let (worker, trace) =
        refused_after_an_unchecked_start("payments", "keeper", "settled", consumer).await;
    assert!(trace.contains("KIP-848"), "{trace}");
    assert!(
        trace.contains("'settled' is held by a share group"),
        "{trace}"
    );
    assert!(
        trace.contains("kafka-share-groups.sh --delete --group settled"),
        "{trace}"
    );
    worker.shutdown().await;
}

/// The join watch never fails a KIP-848 member the coordinator let in: with more tasks than
/// partitions one member has no partition for good, and the check keeps finding its id free.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_protocol_member_left_without_partitions_keeps_running() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("single", 1);
    let proxy = namespace_proxy(&broker);
    let produced = produce(
        &broker.bootstrap(),
        "single",
        numbered_records(30, 32, 1),
        "none",
    )
    .await;
    let worker = worker_on(&proxy.bootstrap());
    let p = probe("spare");
    let mut consumer = probe_config("spare", "single", false, None);
    consumer.insert("consumer.override.group.protocol".into(), "consumer".into());
    consumer.insert("tasks.max".into(), "2".into());
    worker.start_connector(consumer).await.expect("starts");
    wait_until(
        Duration::from_secs(30),
        "the member with the partition reads",
        || p.distinct() >= 30,
    )
    .await;
    // Past the first check (3 s) and the next (every 10 s) of the member without a partition.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let status = worker.status("spare").expect("known");
    assert_eq!(status.tasks.len(), 2);
    assert!(all_running(&worker, "spare"), "{status:?}");
    let report = DeliveryReport::compare(coordinates(&produced), p.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_share_heartbeat_the_broker_refuses_fails_the_task_with_the_reason() {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("audit", 1);
    let proxy = namespace_proxy(&broker);
    produce(
        &broker.bootstrap(),
        "audit",
        numbered_records(20, 32, 1),
        "none",
    )
    .await;
    let worker = worker_on(&proxy.bootstrap());
    let classic = probe("ledger");
    worker
        .start_connector(probe_config(
            "ledger",
            "audit",
            false,
            Some("audit-readers"),
        ))
        .await
        .expect("classic starts");
    wait_until(Duration::from_secs(30), "classic delivers", || {
        classic.distinct() >= 20
    })
    .await;

    // The check cannot reach the coordinator in time; the share consumer meets the refusal.
    proxy
        .faults()
        .delay_responses(FIND_COORDINATOR, Duration::from_secs(7));
    let mut share = probe_config("queue", "audit", true, Some("audit-readers"));
    share.insert("task.restart.max.attempts".into(), "1".into());
    worker
        .start_connector(share)
        .await
        .expect("starts unchecked");
    proxy
        .faults()
        .delay_responses(FIND_COORDINATOR, Duration::ZERO);
    wait_until(Duration::from_secs(60), "the share task fails", || {
        worker.status("queue").is_some_and(|s| {
            !s.tasks.is_empty() && s.tasks.iter().all(|t| t.state == State::Failed)
        })
    })
    .await;
    let status = worker.status("queue").expect("known");
    let trace = status.tasks[0].trace.clone().unwrap_or_default();
    assert!(
        trace.contains("Group audit-readers is not a share group."),
        "{trace}"
    );
    assert!(trace.contains("one namespace for group ids"), "{trace}");
    assert_eq!(probe("queue").distinct(), 0, "nothing was read");
    assert!(
        all_running(&worker, "ledger"),
        "the consumer group's connector is unharmed"
    );
    worker.shutdown().await;
}

/// A share connector from before share mode had its own default id ran on `connect-<name>`;
/// moved to the default `connect-share-<name>`, it starts a new share group, and the log says
/// how to keep the old one.
#[tokio::test(flavor = "multi_thread")]
async fn a_share_connector_that_ran_on_the_consumer_default_id_is_told_how_to_keep_that_group() {
    captured_logs();
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("trail", 1);
    let proxy = namespace_proxy(&broker);
    produce(
        &broker.bootstrap(),
        "trail",
        numbered_records(20, 32, 1),
        "none",
    )
    .await;
    let worker = worker_on(&proxy.bootstrap());
    let p = probe("trail-sink");
    worker
        .start_connector(probe_config(
            "trail-sink",
            "trail",
            true,
            Some("connect-trail-sink"),
        ))
        .await
        .expect("starts on the former default id");
    wait_until(Duration::from_secs(30), "share delivers", || {
        p.distinct() >= 20
    })
    .await;
    assert!(!logs().contains("share group 'connect-trail-sink' exists"));
    worker
        .reconfigure_connector(probe_config("trail-sink", "trail", true, None))
        .await
        .expect("moves to the share default");
    assert_eq!(
        worker.status("trail-sink").expect("known").group_id,
        "connect-share-trail-sink"
    );
    let text = logs();
    assert!(
        text.contains("share group 'connect-trail-sink' exists")
            && text.contains("set consumer.override.group.id=connect-trail-sink"),
        "{text}"
    );
    worker.shutdown().await;
}
