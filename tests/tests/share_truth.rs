//! The native share consumer behaving as Apache Kafka 4.1/4.2's clients do where Kafka's broker
//! is stricter than the dev broker (issue 13 item 3; brief `kafka-4x-behaviour.md`). Each test
//! goes through the test-kit proxy, whose faults and Kafka 4.2 coordinator mode play the broker
//! behaviour the dev broker lacks.

use std::time::{Duration, Instant};

use spillway_kafka::share::{ShareConsumer, ShareConsumerConfig};
use spillway_tests::kafka_proxy::{KafkaProxy, ProxyOptions, ProxySecurity};
use spillway_tests::DevBroker;

const SHARE_GROUP_HEARTBEAT: i16 = 76;

fn proxy(broker: &DevBroker, kafka42: bool) -> KafkaProxy {
    let mut options = ProxyOptions::new(ProxySecurity::Plaintext);
    if kafka42 {
        options = options.with_kafka42_coordinator();
    }
    KafkaProxy::start(&broker.bootstrap(), options).expect("proxy starts")
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
