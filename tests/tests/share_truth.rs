//! The native share consumer behaving as Apache Kafka 4.1/4.2's clients do where Kafka's broker
//! is stricter than the dev broker (issue 13 item 3; brief `kafka-4x-behaviour.md`). Each test
//! goes through the test-kit proxy, whose faults and Kafka 4.2 coordinator mode play the broker
//! behaviour the dev broker lacks.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_tests::kafka_proxy::{KafkaProxy, ProxyOptions, ProxySecurity};
use spillway_tests::DevBroker;

const SHARE_GROUP_HEARTBEAT: i16 = 76;
const SHARE_FETCH: i16 = 78;

fn proxy(broker: &DevBroker, kafka42: bool) -> KafkaProxy {
    let mut options = ProxyOptions::new(ProxySecurity::Plaintext);
    if kafka42 {
        options = options.with_kafka42_coordinator();
    }
    KafkaProxy::start(&broker.bootstrap(), options).expect("proxy starts")
}

/// Produces `n` records `{prefix}{i}` to partition `partition` of `topic` through the proxy.
async fn produce(proxy: &KafkaProxy, topic: &str, partition: i32, prefix: &str, n: usize) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", proxy.bootstrap())
        .set("message.timeout.ms", "20000")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for i in 0..n {
        let value = format!("{prefix}{i}");
        producer
            .send(
                FutureRecord::<(), _>::to(topic)
                    .partition(partition)
                    .payload(&value),
                Duration::from_secs(20),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("record delivered");
    }
}

async fn consumer(proxy: &KafkaProxy, group: &str, topics: &[&str]) -> ShareConsumer {
    let mut config = ShareConsumerConfig::new(&proxy.bootstrap(), group);
    config.request_timeout = Duration::from_secs(2);
    let mut consumer = ShareConsumer::connect(config)
        .await
        .expect("share consumer");
    consumer.subscribe(topics);
    consumer
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls, accepts and commits until `want` distinct values arrived; every poll must succeed.
async fn drain(consumer: &mut ShareConsumer, want: &BTreeSet<String>, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut seen = BTreeSet::new();
    while !want.is_subset(&seen) && Instant::now() < deadline {
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .unwrap_or_else(|e| panic!("poll failed: {e}"));
        consumer
            .acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("acknowledge");
        for r in &records {
            seen.insert(
                String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned(),
            );
        }
        let _ = consumer.commit_sync(Duration::from_secs(5)).await;
    }
    let missing: Vec<_> = want.difference(&seen).collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_heartbeat_response_that_carried_a_new_assignment_is_recovered_by_a_full_heartbeat()
{
    let broker = DevBroker::try_start(1, &[("hb", 2)]).expect("dev broker");
    broker.set_share_heartbeat_interval(300);
    let proxy = proxy(&broker, true);
    let c = consumer(&proxy, "hb-group", &["hb"]).await;
    wait_until("first assignment", Duration::from_secs(20), || {
        c.assigned_partitions() == 2
    })
    .await;
    let member = c.member_id().to_string();
    broker.share_target_assignment("hb-group", &[(member.clone(), vec![("hb".into(), 0)])]);
    wait_until(
        "assignment shrinks to hb-0",
        Duration::from_secs(20),
        || c.assigned_partitions() == 1,
    )
    .await;
    // The next two heartbeat answers are lost; whichever carries the new assignment, the
    // Kafka 4.2 coordinator does not repeat it to a non-full heartbeat afterwards.
    proxy.faults().drop_responses(SHARE_GROUP_HEARTBEAT, 2);
    broker.share_target_assignment(
        "hb-group",
        &[(member, vec![("hb".into(), 0), ("hb".into(), 1)])],
    );
    wait_until(
        "two heartbeat answers dropped",
        Duration::from_secs(30),
        || proxy.faults().dropped(SHARE_GROUP_HEARTBEAT) == 2,
    )
    .await;
    wait_until(
        "the member picks up the assignment whose answer was lost",
        Duration::from_secs(15),
        || c.assigned_partitions() == 2,
    )
    .await;
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_subscription_leaves_the_group() {
    let broker = DevBroker::try_start(1, &[("lv", 1)]).expect("dev broker");
    broker.set_share_heartbeat_interval(300);
    let proxy = proxy(&broker, true);
    let mut c = consumer(&proxy, "lv-group", &["lv"]).await;
    wait_until("joined", Duration::from_secs(20), || {
        broker.share_member_ids("lv-group").len() == 1
    })
    .await;
    c.subscribe::<&str>(&[]);
    wait_until("left with epoch -1", Duration::from_secs(10), || {
        broker.share_member_ids("lv-group").is_empty()
    })
    .await;
    assert_eq!(c.assigned_partitions(), 0);
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinators_heartbeat_interval_holds_while_nothing_is_assigned() {
    let broker = DevBroker::try_start(1, &[("iv", 1)]).expect("dev broker");
    broker.set_share_heartbeat_interval(2_000);
    let proxy = proxy(&broker, true);
    // A topic that does not exist: the member joins and gets nothing assigned.
    let c = consumer(&proxy, "iv-group", &["iv-absent"]).await;
    wait_until("joined", Duration::from_secs(20), || {
        broker.share_member_ids("iv-group").len() == 1
    })
    .await;
    let before = proxy.request_count(SHARE_GROUP_HEARTBEAT);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let beats = proxy.request_count(SHARE_GROUP_HEARTBEAT) - before;
    assert_eq!(c.assigned_partitions(), 0);
    assert!(
        (1..=4).contains(&beats),
        "{beats} heartbeats in 5 s at a 2 s interval"
    );
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_fetch_partition_errors_of_a_coordinator_failover_are_retried_and_nothing_is_lost() {
    use kafka_protocol::error::ResponseError::*;
    let broker = DevBroker::try_start(1, &[("fo", 1)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    // Records a faulted answer acquired come back after one lock duration.
    broker.set_share_record_lock_duration(1_000);
    let proxy = proxy(&broker, false);
    let mut c = consumer(&proxy, "fo-group", &["fo"]).await;
    let codes = [
        CoordinatorNotAvailable,
        GroupIdNotFound,
        UnknownServerError,
        NotLeaderOrFollower,
        UnknownTopicOrPartition,
        CoordinatorLoadInProgress,
        KafkaStorageError,
    ];
    for (round, code) in codes.iter().enumerate() {
        let prefix = format!("{code:?}-");
        proxy
            .faults()
            .inject_partition_error(SHARE_FETCH, "fo", 0, code.code(), 3)
            .expect("fault");
        produce(&proxy, "fo", 0, &prefix, 10).await;
        let want = (0..10).map(|n| format!("{prefix}{n}")).collect();
        drain(&mut c, &want, Duration::from_secs(40)).await;
        assert!(round < codes.len());
    }
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_authorization_error_fails_the_consumer_naming_the_acl() {
    let broker = DevBroker::try_start(1, &[("au", 1)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    let proxy = proxy(&broker, false);
    proxy
        .faults()
        .inject_partition_error(SHARE_FETCH, "au", 0, 29, 1_000)
        .expect("fault");
    produce(&proxy, "au", 0, "a", 5).await;
    let mut c = consumer(&proxy, "au-group", &["au"]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        assert!(Instant::now() < deadline, "no error within 20 s");
        match c.poll(Duration::from_millis(200)).await {
            Err(e) => break e.to_string(),
            Ok(records) => assert!(records.is_empty(), "records through a refused topic"),
        }
    };
    assert!(
        error.contains("READ on Topic:au") && error.contains("Group:au-group"),
        "{error}"
    );
    c.close().await.expect("close");
}
