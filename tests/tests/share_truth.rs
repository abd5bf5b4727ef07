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

/// Produces `n` records `{prefix}{i}` to partition `partition` of `topic`, straight to the
/// broker (so the proxy's request counts are the share consumer's alone).
async fn produce(broker: &DevBroker, topic: &str, partition: i32, prefix: &str, n: usize) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
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
    // The broker forgets the member when the leave arrives; the consumer drops its assignment
    // when the answer does, a moment later.
    wait_until("the assignment dropped", Duration::from_secs(5), || {
        c.assigned_partitions() == 0
    })
    .await;
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
    // Shorter than the client's own default interval (5 s): the heartbeat after the join must
    // already follow the coordinator's 2 s.
    let before = proxy.request_count(SHARE_GROUP_HEARTBEAT);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let beats = proxy.request_count(SHARE_GROUP_HEARTBEAT) - before;
    assert_eq!(c.assigned_partitions(), 0);
    assert!(
        (1..=2).contains(&beats),
        "{beats} heartbeats in 3.5 s at a 2 s interval"
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
        produce(&broker, "fo", 0, &prefix, 10).await;
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
    produce(&broker, "au", 0, "a", 5).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_share_fetch_closes_its_connection_and_refreshes_metadata_at_once() {
    const METADATA: i16 = 3;
    let broker = DevBroker::try_start(1, &[("to", 1)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    // Records of the lost answer must come back because the connection that opened the share
    // session closed (Kafka releases them then), not because their lock ran out.
    broker.set_share_record_lock_duration(30_000);
    let proxy = proxy(&broker, false);
    let mut config = ShareConsumerConfig::new(&proxy.bootstrap(), "to-group");
    config.request_timeout = Duration::from_secs(2);
    // No periodic refresh inside the test's window: only the timeout may cause one.
    config.metadata_max_age = Duration::from_secs(120);
    let mut c = ShareConsumer::connect(config)
        .await
        .expect("share consumer");
    c.subscribe(&["to"]);
    // Steady state first: joined, assigned, fetching.
    produce(&broker, "to", 0, "a", 10).await;
    let first = (0..10).map(|n| format!("a{n}")).collect();
    drain(&mut c, &first, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metadata_before = proxy.request_count(METADATA);
    proxy.faults().drop_responses(SHARE_FETCH, 1);
    produce(&broker, "to", 0, "b", 10).await;
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.faults().dropped(SHARE_FETCH) == 0 {
        assert!(
            Instant::now() < deadline,
            "no ShareFetch answer was dropped"
        );
        let records = c.poll(Duration::from_millis(20)).await.expect("poll");
        c.acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("acknowledge");
        seen.extend(records.iter().map(|r| r.offset));
    }
    let dropped_at = Instant::now();
    // request timeout 2 s + fetch max wait 0.5 s, then a refresh at once.
    wait_until(
        "a metadata refresh after the ShareFetch timeout",
        Duration::from_secs(6),
        || proxy.request_count(METADATA) > metadata_before,
    )
    .await;
    let want: BTreeSet<String> = (0..10)
        .map(|n| format!("b{n}"))
        .filter(|v| !seen.contains(&(10 + v[1..].parse::<i64>().unwrap_or(0))))
        .collect();
    drain(&mut c, &want, Duration::from_secs(15)).await;
    assert!(
        dropped_at.elapsed() < Duration::from_secs(25),
        "records came back only after their lock ran out"
    );
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dialling_a_broker_that_never_answers_gives_up_in_seconds_not_the_request_timeout() {
    use spillway_kafka::security::SecuritySettings;
    use spillway_tests::kafka_proxy::TestPki;
    // A listener that accepts and then says nothing: the TLS handshake never completes, as
    // with a hung broker or a black-holing load balancer.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listener");
    let addr = listener.local_addr().expect("addr").to_string();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let pki = TestPki::generate().expect("test pki");
    let keys = [
        ("security.protocol".to_string(), "SSL".to_string()),
        (
            "ssl.ca.location".to_string(),
            pki.ca_path.display().to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let mut config = ShareConsumerConfig::new(&addr, "dial-group");
    config.security = SecuritySettings::from_config(&keys)
        .expect("settings")
        .client_security()
        .expect("security");
    // request.timeout.ms stays at its 30 s default; the dial has its own, shorter limit.
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), ShareConsumer::connect(config))
        .await
        .expect("connect gave up within 20 s");
    let error = result.err().expect("nothing answers there").to_string();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}: {error}",
        started.elapsed()
    );
    assert!(error.contains(&addr), "{error}");
    silent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retriable_share_acknowledge_errors_are_retried_within_the_commit_deadline() {
    const SHARE_ACKNOWLEDGE: i16 = 79;
    let broker = DevBroker::try_start(1, &[("ak", 1)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    let proxy = proxy(&broker, false);
    produce(&broker, "ak", 0, "k", 5).await;
    let mut c = consumer(&proxy, "ak-group", &["ak"]).await;
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while records.len() < 5 {
        assert!(Instant::now() < deadline, "got {} of 5", records.len());
        records.extend(c.poll(Duration::from_millis(200)).await.expect("poll"));
    }
    // The broker refuses (and does not apply) the next two acknowledgements of ak-0, as Kafka
    // does while its share coordinator moves.
    broker.push_partition_request_errors("ak", 0, SHARE_ACKNOWLEDGE, &[15, 15]);
    c.acknowledge_all(&records, AcknowledgeType::Accept)
        .expect("acknowledge");
    let result = c
        .commit_sync(Duration::from_secs(10))
        .await
        .expect("commit");
    assert_eq!(
        result.get(&("ak".to_string(), 0)),
        Some(&Ok(())),
        "{result:?}"
    );
    assert!(proxy.request_count(SHARE_ACKNOWLEDGE) >= 3);
    // Applied: nothing comes back.
    let later = c.poll(Duration::from_secs(2)).await.expect("poll");
    assert!(later.is_empty(), "{later:?}");
    c.close().await.expect("close");
}

/// INVALID_SHARE_SESSION_EPOCH leaves Kafka's session and the member's records as they were
/// (`SharePartitionManager.newContext` / `acknowledgeSessionUpdate` throw before touching
/// either), and the epoch-0 reopen that follows only replaces the session. So acknowledgements
/// refused that way are applied on the reopened session, and nothing is redelivered. The proxy
/// answers the error itself (the dev broker never sees the request) and, in its Kafka
/// share-session mode, keeps the dev broker's session across the reopen, which the mock would
/// otherwise treat as a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_refused_with_an_epoch_error_are_applied_on_the_reopened_session() {
    const SHARE_ACKNOWLEDGE: i16 = 79;
    const INVALID_SHARE_SESSION_EPOCH: i16 = 123;
    let broker = DevBroker::try_start(1, &[("re", 1)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    // No lock runs out within the test: whatever comes back was released.
    broker.set_share_record_lock_duration(60_000);
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_kafka_share_sessions(),
    )
    .expect("proxy starts");
    // Produced before the consumer connects: the producer's connection closing later would end
    // every share session on the dev broker.
    produce(&broker, "re", 0, "r", 10).await;
    let mut c = consumer(&proxy, "re-group", &["re"]).await;
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while records.len() < 10 {
        assert!(Instant::now() < deadline, "got {} of 10", records.len());
        records.extend(c.poll(Duration::from_millis(200)).await.expect("poll"));
    }
    let (first, second) = records.split_at(5);

    // Acks on a ShareAcknowledge (commit_sync's flush), refused at the top level.
    proxy
        .faults()
        .inject_error(SHARE_ACKNOWLEDGE, INVALID_SHARE_SESSION_EPOCH, 1)
        .expect("fault");
    c.acknowledge_all(first, AcknowledgeType::Accept)
        .expect("acknowledge");
    let result = c
        .commit_sync(Duration::from_secs(10))
        .await
        .expect("commit");
    assert_eq!(
        result.get(&("re".to_string(), 0)),
        Some(&Ok(())),
        "{result:?}"
    );
    assert_eq!(proxy.share_sessions_continued(), 1, "one epoch-0 reopen");

    // Acks riding on a ShareFetch, refused the same way. The consumer fetches again only once
    // it holds nothing unacknowledged, so the refused fetch is the one carrying them.
    proxy
        .faults()
        .inject_error(SHARE_FETCH, INVALID_SHARE_SESSION_EPOCH, 1)
        .expect("fault");
    let fetches = proxy.request_count(SHARE_FETCH);
    c.acknowledge_all(second, AcknowledgeType::Accept)
        .expect("acknowledge");
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let again = c.poll(Duration::from_millis(200)).await.expect("poll");
        assert!(again.is_empty(), "redelivered: {again:?}");
    }
    assert!(proxy.request_count(SHARE_FETCH) >= fetches + 2);
    assert_eq!(proxy.share_sessions_continued(), 2, "a second reopen");
    let result = c
        .commit_sync(Duration::from_secs(10))
        .await
        .expect("commit");
    assert_eq!(
        result.get(&("re".to_string(), 0)),
        Some(&Ok(())),
        "{result:?}"
    );

    // Everything was applied: nothing comes back, and the session goes on delivering.
    let later = c.poll(Duration::from_secs(2)).await.expect("poll");
    assert!(later.is_empty(), "redelivered: {later:?}");
    c.close().await.expect("close");
}
