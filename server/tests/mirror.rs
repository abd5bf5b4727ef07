//! `spillway mirror` on two dev clusters, each behind an admin-emulating proxy (the mock has no
//! CreateTopics/DescribeConfigs): topics matched by regex are copied to `A.<topic>` with the
//! source's partition count, every record once with key, value, headers and timestamp, in source
//! order per partition; a topic created while running is picked up, and one that gains
//! partitions grows its remote topic (the proxies' partition growth stands in for Kafka's
//! CreatePartitions); heartbeats are written and replicated as MM2's; two-way mirroring makes
//! no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::TopicPartitionList;
use spillway::metrics::Telemetry;
use spillway::mirror::heartbeat::Heartbeat;
use spillway::mirror::{MirrorConfig, SharedProgress};
use spillway_core::config::parse_properties;
use spillway_kafka::admin::{AdminClient, AlterOp, ConfigResource, ConfigSource};
use spillway_kafka::security::ClientSecurity;
use spillway_tests::kafka_proxy::AdminOperation;
use spillway_tests::{
    ProxiedDevBroker, ProxyOptions, ProxySecurity, SaslMechanism, TestProducer, TestRecord,
};
use tokio::sync::oneshot;

mod support;

/// One copied record: partition, offset, key, value, headers, timestamp.
#[derive(Debug, Clone, PartialEq)]
struct Copy {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
}

fn metadata_client(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirror-test-reader")
        .set("enable.auto.commit", "false")
        // The end of a partition is seen, not counted: a transaction's marker takes an offset
        // no reader is given.
        .set("enable.partition.eof", "true")
        .create()
        .expect("reader")
}

/// Topic → partitions on a cluster.
fn topics(bootstrap: &str) -> BTreeMap<String, i32> {
    let client = metadata_client(bootstrap);
    let metadata = client
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
        .collect()
}

/// Every record of `topic` from the beginning to the end it has now (the dev broker's classic
/// fetch includes aborted transactions' records: see [`read_committed`]).
fn read_all(bootstrap: &str, topic: &str) -> Vec<Copy> {
    let client = metadata_client(bootstrap);
    let partitions = topics(bootstrap).get(topic).copied().unwrap_or(0);
    let mut out = Vec::new();
    for p in 0..partitions {
        let (low, high) = client
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        if high <= low {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(low))
            .expect("offset");
        client.assign(&tpl).expect("assign");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut next = low;
        let mut at_end = false;
        while !at_end && Instant::now() < deadline {
            match client.poll(Duration::from_millis(200)) {
                Some(Err(KafkaError::PartitionEOF(_))) => at_end = true,
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    out.push(Copy {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        headers: m
                            .headers()
                            .map(|hs| {
                                hs.iter()
                                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        timestamp: m.timestamp().to_millis(),
                    });
                }
                _ => {}
            }
        }
        assert!(at_end, "{topic}/{p}: read to {next} of {high}");
    }
    out
}

/// Records for `topic` over `partitions`: numbered, with a header and a timestamp that encode
/// the number, so each copy can be matched to its source.
fn records(topic: &str, n: u64, partitions: i32) -> Vec<TestRecord> {
    (0..n)
        .map(|i| TestRecord {
            partition: Some((i % partitions as u64) as i32),
            key: Some(format!("{topic}-k{i}").into_bytes()),
            value: Some(format!("{topic}-v{i}").into_bytes()),
            headers: vec![("trace".into(), Some(format!("h{i}").into_bytes()))],
            timestamp: Some(1_700_000_000_000 + i as i64),
        })
        .collect()
}

/// Checks that `copies` hold each of `sent` once, intact, on its partition; returns the number
/// of the record each copy is of.
fn assert_copied_once(topic: &str, sent: &[TestRecord], copies: &[Copy]) -> Vec<i64> {
    assert_eq!(
        copies.len(),
        sent.len(),
        "{topic}: every record once (no loss, no duplicate)"
    );
    let mut seen = BTreeSet::new();
    copies
        .iter()
        .map(|copy| {
            let n = copy.timestamp.expect("timestamp kept") - 1_700_000_000_000;
            assert!(seen.insert(n), "{topic} #{n}: copied twice");
            let source = &sent[n as usize];
            assert_eq!(
                Some(copy.partition),
                source.partition,
                "{topic} #{n}: partition"
            );
            assert_eq!(copy.key, source.key, "{topic} #{n}: key");
            assert_eq!(copy.value, source.value, "{topic} #{n}: value");
            // MM2's copies: the record's own headers, no `spillway.source.*` by default.
            assert_eq!(copy.headers, source.headers, "{topic} #{n}: headers");
            n
        })
        .collect()
}

/// The first copy of each record (by the number its timestamp encodes), in target order, and
/// how many later copies were left out.
fn first_copies(copies: Vec<Copy>) -> (Vec<Copy>, usize) {
    let total = copies.len();
    let mut seen = BTreeSet::new();
    let first: Vec<Copy> = copies
        .into_iter()
        .filter(|c| seen.insert(c.timestamp))
        .collect();
    let again = total - first.len();
    (first, again)
}

/// As [`assert_copied_once`], and in source order per partition (classic mode).
fn assert_copied_once_in_order(topic: &str, sent: &[TestRecord], copies: &[Copy]) {
    let numbers = assert_copied_once(topic, sent, copies);
    let mut last_per_partition: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    for (copy, n) in copies.iter().zip(numbers) {
        // A later source record of the partition has a later target offset.
        if let Some(&(last_n, last_offset)) = last_per_partition.get(&copy.partition) {
            assert!(
                n > last_n && copy.offset > last_offset,
                "{topic}: #{n} after #{last_n} on partition {}",
                copy.partition
            );
        }
        last_per_partition.insert(copy.partition, (n, copy.offset));
    }
}

async fn admin(cluster: &ProxiedDevBroker) -> AdminClient {
    AdminClient::connect(
        &cluster.bootstrap(),
        "mirror-test",
        Duration::from_secs(10),
        ClientSecurity::plaintext(),
    )
    .await
    .expect("admin client")
}

async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn config(text: &str) -> MirrorConfig {
    MirrorConfig::parse(&parse_properties(text).expect("properties").to_map()).expect("valid")
}

/// One metrics pipeline for the test process: the kafka sink's MM2 metrics go through the
/// global provider, which both tests share.
fn telemetry() -> Arc<Telemetry> {
    static TELEMETRY: OnceLock<Arc<Telemetry>> = OnceLock::new();
    Arc::clone(TELEMETRY.get_or_init(|| {
        let telemetry = Telemetry::build(false).expect("metrics pipeline");
        telemetry.install_global();
        Arc::new(telemetry)
    }))
}

/// The Prometheus text a running mirror serves at `metrics`.
async fn metrics_text(metrics: SocketAddr) -> String {
    reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// Runs `config` in the background; returns the flows' progress, the metrics address and the
/// stop switch.
async fn start(
    config: MirrorConfig,
) -> (
    BTreeMap<String, SharedProgress>,
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let (progress_tx, progress_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(spillway::mirror::run_until(
        config,
        telemetry(),
        Some("127.0.0.1:0".parse().expect("address")),
        move |started| {
            let flows = started.flows.into_iter().collect::<BTreeMap<_, _>>();
            let _ = progress_tx.send((flows, started.metrics.expect("metrics served")));
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let (progress, metrics) = tokio::time::timeout(Duration::from_secs(60), progress_rx)
        .await
        .expect("flows start in time")
        .expect("flows started");
    (progress, metrics, stop_tx, task)
}

fn replicated(progress: &SharedProgress) -> BTreeMap<String, i32> {
    progress.lock().unwrap().replicated.clone()
}

fn clusters(a: &ProxiedDevBroker, b: &ProxiedDevBroker) -> String {
    format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
         replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\nemit.heartbeats.interval.seconds = 1\n",
        a.bootstrap(),
        b.bootstrap()
    )
}

/// Cluster A with `topic` (2 partitions) holding `n` numbered records, and an empty cluster B
/// whose proxy has `b_options`; returns both and the records.
async fn two_clusters(
    topic: &str,
    n: u64,
    b_options: ProxyOptions,
) -> (ProxiedDevBroker, ProxiedDevBroker, Vec<TestRecord>) {
    let a = ProxiedDevBroker::start(1, &[(topic, 2)]).expect("cluster A");
    let b = ProxiedDevBroker::start_with(1, &[], b_options).expect("cluster B");
    let sent = records(topic, n, 2);
    TestProducer::new(&a.broker().bootstrap(), "none")
        .send(topic, sent.clone())
        .await;
    (a, b, sent)
}

fn plaintext() -> ProxyOptions {
    ProxyOptions::new(ProxySecurity::Plaintext)
}

/// Runs `config` until B holds at least `copies` records of `remote` (committed or not), a
/// little longer (a duplicate would arrive, an open transaction end), then stops it; returns
/// the flows' progress.
async fn copy_until(
    config: MirrorConfig,
    b: &ProxiedDevBroker,
    remote: &str,
    copies: usize,
) -> BTreeMap<String, SharedProgress> {
    let (progress, _metrics, stop, task) = start(config).await;
    let target = b.broker().bootstrap();
    wait_for(&format!("{remote} copied"), Duration::from_secs(90), || {
        topics(&target).contains_key(remote) && read_all(&target, remote).len() >= copies
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_flows(stop, task).await;
    progress
}

/// Stops what [`start`] runs and checks it ended cleanly.
async fn stop_flows(stop: oneshot::Sender<()>, task: tokio::task::JoinHandle<anyhow::Result<()>>) {
    let _ = stop.send(());
    task.await.expect("joins").expect("stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matched_topics_are_copied_once_in_order_and_new_topics_are_picked_up() {
    let a = ProxiedDevBroker::start(1, &[("orders", 3), ("payments", 2), ("other", 1)])
        .expect("cluster A");
    let b = ProxiedDevBroker::start(1, &[]).expect("cluster B");
    let producer = TestProducer::new(&a.broker().bootstrap(), "none");
    let orders = records("orders", 300, 3);
    let payments = records("payments", 120, 2);
    producer.send("orders", orders.clone()).await;
    producer.send("payments", payments.clone()).await;
    producer.send("other", records("other", 10, 1)).await;

    // A config set on the source topic is copied; one MM2 never copies is not.
    let a_admin = admin(&a).await;
    a_admin
        .incremental_alter_configs(
            &ConfigResource::Topic("orders".into()),
            &[
                ("retention.ms", AlterOp::Set("123456".into())),
                ("min.insync.replicas", AlterOp::Set("1".into())),
            ],
        )
        .await
        .expect("source topic config set");

    let text = format!(
        "{}A->B.enabled = true\nA->B.topics = orders, payments, late-.*\n",
        clusters(&a, &b)
    );
    let (progress, metrics, stop, task) = start(config(&text)).await;
    let ab = progress["A->B"].clone();
    wait_for(
        "orders and payments replicated",
        Duration::from_secs(60),
        || {
            let r = replicated(&ab);
            r.contains_key("orders") && r.contains_key("payments")
        },
    )
    .await;

    // A topic created while running is found at the next refresh.
    a.broker().create_topic("late-events", 2);
    let late = records("late-events", 40, 2);
    producer.send("late-events", late.clone()).await;
    wait_for("late-events replicated", Duration::from_secs(60), || {
        replicated(&ab).contains_key("late-events")
    })
    .await;
    let target = b.broker().bootstrap();
    for (topic, sent) in [
        ("orders", &orders),
        ("payments", &payments),
        ("late-events", &late),
    ] {
        let remote = format!("A.{topic}");
        wait_for(
            &format!("{remote} complete"),
            Duration::from_secs(90),
            || {
                let have = topics(&target);
                have.contains_key(&remote) && read_all(&target, &remote).len() >= sent.len()
            },
        )
        .await;
    }
    // Heartbeats of A->B reach B; those of B->A reach A and come back as A.heartbeats.
    wait_for("heartbeats", Duration::from_secs(30), || {
        topics(&target).contains_key("A.heartbeats")
            && !read_all(&target, "A.heartbeats").is_empty()
    })
    .await;
    // Let anything that would be a duplicate arrive before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = metrics_text(metrics).await;
    let series = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| {
                l.contains("topic=\"A.orders\"")
                    && l.contains("source=\"A\"")
                    && l.contains("target=\"B\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // The other test copies 50 records of its own A.orders through the same process metrics.
    assert!(
        series("kafka_connect_mirror_source_connector_record_count") >= 300.0,
        "MM2's record-count per target topic-partition:\n{text}"
    );
    assert!(series("kafka_connect_mirror_source_connector_byte_count") >= 300.0 * 10.0);
    // MM2's age and latency sensors: the last value, and min, max and average over 30-60 s.
    for name in ["record_age_ms", "replication_latency_ms"] {
        let of = |stat: &str| {
            let name = format!("kafka_connect_mirror_source_connector_{name}{stat}");
            let values: Vec<f64> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("topic=\"A.orders\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect();
            assert!(
                !values.is_empty() && values.iter().all(|v| *v >= 0.0),
                "{name} per target topic-partition:\n{text}"
            );
            values.into_iter().sum::<f64>()
        };
        let (min, avg, max) = (of("_min"), of("_avg"), of("_max"));
        assert!(
            min <= avg && avg <= max,
            "{name}: min {min}, avg {avg}, max {max}"
        );
        of("");
    }
    stop_flows(stop, task).await;

    let on_b = topics(&target);
    assert_eq!(on_b.get("A.orders"), Some(&3), "partition count copied");
    assert_eq!(on_b.get("A.payments"), Some(&2));
    assert_eq!(on_b.get("A.late-events"), Some(&2));
    assert!(!on_b.contains_key("A.other"), "not matched by A->B.topics");
    assert!(!on_b.contains_key("other"));
    assert_copied_once_in_order("orders", &orders, &read_all(&target, "A.orders"));
    assert_copied_once_in_order("payments", &payments, &read_all(&target, "A.payments"));
    assert_copied_once_in_order("late-events", &late, &read_all(&target, "A.late-events"));

    let copied = admin(&b)
        .await
        .describe_configs(&ConfigResource::Topic("A.orders".into()), &[])
        .await
        .expect("target topic configs");
    let retention = copied.get("retention.ms").expect("retention.ms");
    assert_eq!(
        (retention.value.as_deref(), retention.source),
        (Some("123456"), ConfigSource::Topic),
        "the source topic's own config is copied"
    );
    assert_ne!(
        copied.get("min.insync.replicas").map(|e| e.source),
        Some(ConfigSource::Topic),
        "min.insync.replicas is never copied (MM2's exclusions)"
    );

    let beats = read_all(&target, "heartbeats");
    assert!(!beats.is_empty(), "A->B writes heartbeats to B");
    for beat in &beats {
        let hb = Heartbeat::decode(
            beat.key.as_deref().expect("key"),
            beat.value.as_deref().expect("value"),
        )
        .expect("MM2's heartbeat format");
        assert_eq!(
            (
                hb.source_cluster_alias.as_str(),
                hb.target_cluster_alias.as_str()
            ),
            ("A", "B")
        );
        assert_eq!(Some(hb.timestamp), beat.timestamp);
    }
    let returned = read_all(&target, "A.heartbeats");
    let hb = Heartbeat::decode(
        returned[0].key.as_deref().expect("key"),
        returned[0].value.as_deref().expect("value"),
    )
    .expect("decodes");
    assert_eq!(
        (
            hb.source_cluster_alias.as_str(),
            hb.target_cluster_alias.as_str()
        ),
        ("B", "A"),
        "B->A only emits heartbeats (into A), and A->B replicates them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_way_mirroring_sends_no_topic_back_to_where_it_came_from() {
    let a = ProxiedDevBroker::start(1, &[("orders", 2)]).expect("cluster A");
    let b = ProxiedDevBroker::start(1, &[("payments", 2)]).expect("cluster B");
    let orders = records("orders", 50, 2);
    let payments = records("payments", 30, 2);
    TestProducer::new(&a.broker().bootstrap(), "none")
        .send("orders", orders.clone())
        .await;
    TestProducer::new(&b.broker().bootstrap(), "none")
        .send("payments", payments.clone())
        .await;
    let text = format!(
        "{}A->B.enabled = true\nB->A.enabled = true\n",
        clusters(&a, &b)
    );
    let (progress, _metrics, stop, task) = start(config(&text)).await;
    let (on_a, on_b) = (a.broker().bootstrap(), b.broker().bootstrap());
    wait_for("both ways copied", Duration::from_secs(90), || {
        topics(&on_b).contains_key("A.orders")
            && topics(&on_a).contains_key("B.payments")
            && read_all(&on_b, "A.orders").len() >= orders.len()
            && read_all(&on_a, "B.payments").len() >= payments.len()
    })
    .await;
    // Several refreshes pass: a cycle would show up as B.A.orders or A.B.payments.
    let refreshed = |flow: &str| progress[flow].lock().unwrap().replicated.clone();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop_flows(stop, task).await;

    let (a_topics, b_topics) = (topics(&on_a), topics(&on_b));
    assert!(!b_topics.contains_key("B.A.orders") && !a_topics.contains_key("A.B.payments"));
    assert!(!a_topics.contains_key("B.A.orders") && !b_topics.contains_key("A.B.payments"));
    assert!(
        !refreshed("B->A").contains_key("A.orders"),
        "A.orders never sent back to A"
    );
    assert!(!refreshed("A->B").contains_key("B.payments"));
    assert!(!refreshed("A->B").contains_key("B.heartbeats"));
    assert_copied_once_in_order("orders", &orders, &read_all(&on_b, "A.orders"));
    assert_copied_once_in_order("payments", &payments, &read_all(&on_a, "B.payments"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_topic_that_gains_partitions_grows_its_remote_topic_and_is_copied_once_in_order() {
    source_topic_grows(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_flow_copies_a_source_topic_that_gains_partitions_once_in_order() {
    source_topic_grows(true).await;
}

/// A flow runs while its source topic grows from 2 to 4 partitions (the dev broker's proxies
/// stand in for Kafka's CreatePartitions): the remote topic grows to 4 and every record
/// arrives once, in order per partition, without the copying task failing.
async fn source_topic_grows(exactly_once: bool) {
    // Both proxies let topics gain partitions as on Kafka (the dev broker cannot): every client
    // here, the mirror included, goes through them and sees only the partitions that exist.
    let growth = || plaintext().with_partition_growth();
    let a = ProxiedDevBroker::start_with(1, &[("orders", 2)], growth()).expect("cluster A");
    let b = ProxiedDevBroker::start_with(1, &[], growth()).expect("cluster B");
    let (source, target) = (a.bootstrap(), b.bootstrap());
    let mut sent = records("orders", 100, 2);
    TestProducer::new(&source, "none")
        .send("orders", sent.clone())
        .await;
    // The source consumer looks for new partitions every second (librdkafka's default is
    // 5 minutes); the producer writing to B keeps its default.
    let text = format!(
        "{}A->B.enabled = true\nA->B.topics = orders\nemit.checkpoints.enabled = false\n\
         A->B.consumer.topic.metadata.refresh.interval.ms = 1000\n{}",
        clusters(&a, &b),
        if exactly_once {
            "B.exactly.once.source.support = enabled\n"
        } else {
            ""
        }
    );
    let (progress, _metrics, stop, task) = start(config(&text)).await;
    let ab = progress["A->B"].clone();
    wait_for(
        "A.orders with 2 partitions and the first records",
        Duration::from_secs(90),
        || {
            topics(&target).get("A.orders") == Some(&2)
                && read_all(&target, "A.orders").len() >= sent.len()
        },
    )
    .await;

    // kafka-topics --alter --partitions 4, through A's CreatePartitions.
    admin(&a)
        .await
        .create_partitions("orders", 4)
        .await
        .expect("orders grows to 4 partitions");
    assert_eq!(topics(&source).get("orders"), Some(&4));
    // Records 100..200 over the four partitions (a new producer knows the new ones).
    let later: Vec<TestRecord> = records("orders", 200, 4).split_off(100);
    assert!(later.iter().any(|r| r.partition == Some(3)));
    TestProducer::new(&source, "none")
        .send("orders", later.clone())
        .await;
    sent.extend(later);
    wait_for(
        "A.orders grown to 4 partitions with every record",
        Duration::from_secs(90),
        || {
            topics(&target).get("A.orders") == Some(&4)
                && read_all(&target, "A.orders").len() >= sent.len()
        },
    )
    .await;
    // Let anything that would be a duplicate arrive before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The growth is routine: the copying task went on (a failed task restarts, and its
    // consumer leaves A's group on the way).
    const LEAVE_GROUP: i16 = 13;
    assert_eq!(
        a.proxy().request_count(LEAVE_GROUP),
        0,
        "the task copying orders never failed"
    );
    stop_flows(stop, task).await;

    assert_eq!(replicated(&ab).get("orders"), Some(&4));
    let copies = if exactly_once {
        // Only committed transactions count (the dev broker's classic fetch shows aborted ones).
        read_committed(b.broker(), "A.orders", "committed-orders", sent.len()).await
    } else {
        read_all(&target, "A.orders")
    };
    let copies = if exactly_once {
        copies
    } else {
        // At least once, the growth's rebalance (librdkafka's eager protocol) may come while a
        // batch is in flight: its records are read again from the last commit and copied twice
        // (docs/runtime.md, "Known: classic duplicates when a second task joins"). Each record's
        // first copy must still be there, intact and in order; later copies are counted.
        let (first, again) = first_copies(copies);
        if again > 0 {
            eprintln!("orders: {again} record(s) copied again at the rebalance (at least once)");
        }
        first
    };
    assert_copied_once_in_order("orders", &sent, &copies);
    for p in 0..4 {
        assert_eq!(
            copies.iter().filter(|c| c.partition == p).count(),
            sent.iter().filter(|r| r.partition == Some(p)).count(),
            "partition {p} of A.orders holds its source partition's records"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_mode_flow_copies_every_record_once_to_its_own_partition() {
    let (a, b, clicks) = two_clusters("clicks", 200, plaintext()).await;
    let text = format!(
        "{}A->B.enabled = true\nA->B.topics = clicks\nA->B.consumer.group.protocol = share\n\
         emit.heartbeats.enabled = false\n",
        clusters(&a, &b)
    );
    let progress = copy_until(config(&text), &b, "A.clicks", clicks.len()).await;
    assert_eq!(
        progress.len(),
        1,
        "heartbeats off: only the enabled flow runs"
    );
    let target = b.broker().bootstrap();

    // Share mode keeps each record's partition, not their order.
    assert_copied_once("clicks", &clicks, &read_all(&target, "A.clicks"));
    assert!(
        !topics(&target).contains_key("heartbeats"),
        "heartbeats off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_whose_remote_topic_cannot_be_created_waits_named_and_is_copied_once_allowed() {
    let denied = plaintext().with_denied_operation(AdminOperation::Create);
    let (a, b, orders) = two_clusters("orders", 60, denied).await;
    let text = format!(
        "{}A->B.enabled = true\nA->B.topics = orders\nemit.heartbeats.enabled = false\n\
         emit.checkpoints.enabled = false\n",
        clusters(&a, &b)
    );
    let (progress, _metrics, stop, task) = start(config(&text)).await;
    let ab = progress["A->B"].clone();
    wait_for("the refusal reported", Duration::from_secs(30), || {
        ab.lock()
            .unwrap()
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("orders") && e.contains("CREATE"))
    })
    .await;
    let target = b.broker().bootstrap();
    assert!(
        replicated(&ab).is_empty(),
        "nothing copied without its remote topic"
    );
    assert!(!topics(&target).contains_key("A.orders"));

    b.admin().allow(AdminOperation::Create);
    wait_for("A.orders complete", Duration::from_secs(60), || {
        topics(&target).contains_key("A.orders")
            && read_all(&target, "A.orders").len() >= orders.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_flows(stop, task).await;
    assert_copied_once_in_order("orders", &orders, &read_all(&target, "A.orders"));
    assert_eq!(ab.lock().unwrap().last_error, None, "the problem cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_target_is_reached_with_its_own_cluster_security() {
    let sasl = ProxyOptions::new(ProxySecurity::SaslPlaintext)
        .with_mechanisms(&[SaslMechanism::ScramSha512])
        .with_user("mirror", "s3cret");
    let (a, b, orders) = two_clusters("orders", 40, sasl).await;
    let text = format!(
        "{}A->B.enabled = true\nA->B.topics = orders\n\
         B.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = SCRAM-SHA-512\n\
         B.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required \
         username=\"mirror\" password=\"s3cret\";\n",
        clusters(&a, &b)
    );
    let (progress, _metrics, stop, task) = start(config(&text)).await;
    let target = b.broker().bootstrap();
    wait_for(
        "A.orders complete and heartbeats",
        Duration::from_secs(60),
        || {
            topics(&target).contains_key("A.orders")
                && read_all(&target, "A.orders").len() >= orders.len()
                && progress["A->B"].lock().unwrap().heartbeats > 0
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_flows(stop, task).await;
    assert_copied_once_in_order("orders", &orders, &read_all(&target, "A.orders"));
    assert!(
        !read_all(&target, "heartbeats").is_empty(),
        "heartbeats through SASL"
    );
}

/// Kafka's EndTxn API key.
const END_TXN: i16 = 26;

/// The consumer group an `A->B` flow reads A with (Connect's `connect-<connector>`).
const AB_GROUP: &str = "connect-mirror-A-B";

/// An exactly-once flow copying `orders` from A to B, without heartbeats, with `extra` keys.
fn exactly_once_flow(a: &ProxiedDevBroker, b: &ProxiedDevBroker, extra: &str) -> MirrorConfig {
    config(&exactly_once_flow_text(a, b, extra))
}

fn exactly_once_flow_text(a: &ProxiedDevBroker, b: &ProxiedDevBroker, extra: &str) -> String {
    format!(
        "{}A->B.enabled = true\nA->B.topics = orders\nemit.heartbeats.enabled = false\n\
         B.exactly.once.source.support = enabled\n{extra}",
        clusters(a, b)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_flow_copies_through_transactions() {
    let (a, b, orders) = two_clusters("orders", 80, plaintext()).await;
    let progress = copy_until(exactly_once_flow(&a, &b, ""), &b, "A.orders", orders.len()).await;
    assert_eq!(progress["A->B"].lock().unwrap().last_error, None);

    // Only committed transactions count: the dev broker's classic fetch would also show
    // aborted ones (under load: 120 copies of 80), its read_committed share fetch does not.
    let committed = read_committed(b.broker(), "A.orders", "committed-orders", orders.len()).await;
    assert_copied_once_in_order("orders", &orders, &committed);
    // The flow's ledger (docs/exactly-once.md) holds its committed resume points on B.
    let ledger = read_committed(b.broker(), "__spillway_eos_ledger.mirror-A-B", "ledger", 1).await;
    assert!(!ledger.is_empty(), "no committed ledger record on B");
    // The source group's position is committed on A, after the transactions on B.
    assert_eq!(
        committed_offsets(&a.broker().bootstrap(), AB_GROUP, "orders", 2),
        BTreeMap::from([(0, 40), (1, 40)]),
        "the flow's group offsets on the source cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_flow_restarted_without_its_source_offsets_copies_each_record_once() {
    let (a, b, first) = two_clusters("orders", 40, plaintext()).await;
    copy_until(exactly_once_flow(&a, &b, ""), &b, "A.orders", first.len()).await;

    // The flow comes back with none of its source offsets (a crash after the target's
    // transactions committed and before the source commits; here another group, which has
    // none): it reads A from the start again, and only its ledger on B says what is copied.
    let orders = records("orders", 80, 2);
    TestProducer::new(&a.broker().bootstrap(), "none")
        .send("orders", orders[first.len()..].to_vec())
        .await;
    let group = "mirror-restarted";
    let restarted = exactly_once_flow(&a, &b, &format!("A->B.consumer.group.id = {group}\n"));
    let progress = copy_until(restarted, &b, "A.orders", orders.len()).await;
    assert_eq!(progress["A->B"].lock().unwrap().last_error, None);

    let committed = read_committed(b.broker(), "A.orders", "committed-orders", orders.len()).await;
    assert_copied_once_in_order("orders", &orders, &committed);
    assert_eq!(
        committed_offsets(&a.broker().bootstrap(), group, "orders", 2),
        BTreeMap::from([(0, 40), (1, 40)]),
        "the source offsets are committed on A again"
    );
}

/// `spillway mirror` on a properties file, in a process of its own; SIGKILLed when dropped.
struct MirrorProcess(std::process::Child);

impl MirrorProcess {
    fn start(properties: &std::path::Path) -> MirrorProcess {
        MirrorProcess(
            std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
                .arg("mirror")
                .arg(properties)
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .expect("spillway mirror starts"),
        )
    }
}

impl Drop for MirrorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_flow_killed_three_times_mid_copy_copies_each_record_once() {
    let (a, b, orders) = two_clusters("orders", 3000, plaintext()).await;
    // Every transaction ends 30 ms late: the copy of the 1,300 records left after the last
    // kill takes at least 2 s, longer than the committed offsets take to read (a consumer
    // of its own each time) and the poll between reads. Without it a fast flow (CI: after
    // interned topic names) finished the copy between two reads, before the kill.
    b.proxy()
        .faults()
        .delay_responses(END_TXN, Duration::from_millis(30));
    // Small batches: many transactions, so each kill lands between two of them or inside one
    // (with the flow's offset syncs in them). A short session, so a restarted member need not
    // wait long for the killed one to go.
    let text = exactly_once_flow_text(
        &a,
        &b,
        "A->B.consumer.max.poll.records = 20\nA->B.consumer.session.timeout.ms = 6000\n\
         A->B.consumer.heartbeat.interval.ms = 1000\n",
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let properties = dir.path().join("mm2.properties");
    std::fs::write(&properties, text).expect("properties written");
    let source = a.broker().bootstrap();
    let committed_on_a = || -> i64 {
        committed_offsets(&source, AB_GROUP, "orders", 2)
            .values()
            .sum()
    };

    // SIGKILL after each of these many source offsets are committed, then a run to the end.
    for kill_after in [100, 900, 1700] {
        let running = MirrorProcess::start(&properties);
        wait_for(
            &format!("{kill_after} source offsets committed"),
            Duration::from_secs(120),
            || committed_on_a() >= kill_after,
        )
        .await;
        drop(running);
        let killed_at = committed_on_a();
        assert!(
            killed_at < orders.len() as i64,
            "the kill came after the whole copy ({killed_at})"
        );
    }
    let _last = MirrorProcess::start(&properties);
    wait_for("the rest committed", Duration::from_secs(120), || {
        committed_on_a() == orders.len() as i64
    })
    .await;
    let committed = read_committed(b.broker(), "A.orders", "committed-orders", orders.len()).await;
    assert_copied_once_in_order("orders", &orders, &committed);
}

/// Every committed record of `topic` on `broker` (read by the new share group `group`, see
/// [`spillway_tests::read_committed`]), sorted by partition and offset.
async fn read_committed(
    broker: &spillway_tests::DevBroker,
    topic: &str,
    group: &str,
    expected: usize,
) -> Vec<Copy> {
    let mut out: Vec<Copy> =
        spillway_tests::read_committed(broker, topic, group, expected, Duration::from_secs(30))
            .await
            .into_iter()
            .map(|r| Copy {
                partition: r.partition,
                offset: r.offset,
                key: r.key.map(|b| b.to_vec()),
                value: r.value.map(|b| b.to_vec()),
                headers: r
                    .headers
                    .into_iter()
                    .map(|(k, v)| (k, v.map(|b| b.to_vec())))
                    .collect(),
                timestamp: Some(r.timestamp),
            })
            .collect();
    out.sort_by_key(|c| (c.partition, c.offset));
    out
}

/// Commits `offsets` (partition → next offset) for `group` on `topic`, as a consumer would.
fn commit(bootstrap: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in offsets {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(o))
            .expect("offset");
    }
    consumer
        .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
        .expect("commit");
}

fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let Ok(done) = consumer.committed_offsets(tpl, Duration::from_secs(10)) else {
        return BTreeMap::new();
    };
    done.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// MM2's `offset-syncs.topic.location`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Syncs {
    /// Not set: MM2's default, the source.
    OnTheSource,
    OnTheTarget,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_fails_over_to_the_target_with_offset_syncs_on_the_source_by_default() {
    group_fails_over_without_skipping(false, Syncs::OnTheSource).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_fails_over_to_the_target_with_offset_syncs_on_the_target() {
    group_fails_over_without_skipping(false, Syncs::OnTheTarget).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_fails_over_from_an_exactly_once_flow_with_syncs_on_the_source() {
    // A transaction on B cannot hold records for A: the syncs are sent to A once the
    // transaction holding their copies committed.
    group_fails_over_without_skipping(true, Syncs::OnTheSource).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_fails_over_from_an_exactly_once_flow_with_syncs_on_the_target() {
    // The offset syncs ride in the copies' transactions: before, exactly-once flows wrote none,
    // so nothing was ever synced for the group.
    group_fails_over_without_skipping(true, Syncs::OnTheTarget).await;
}

/// A group that consumed part of `orders` on A resumes on B at the translated offsets: no record
/// skipped, at most `offset.lag.max` re-read, then everything in order. The offset syncs are
/// on the cluster `syncs` says, and the offsets committed on B are their translation.
async fn group_fails_over_without_skipping(exactly_once: bool, syncs: Syncs) {
    // The proxies answer ListGroups and DescribeGroups as Kafka does (the mock has neither).
    let groups = || ProxyOptions::new(ProxySecurity::Plaintext).with_one_group_namespace();
    let a = ProxiedDevBroker::start_with(1, &[("orders", 2)], groups()).expect("cluster A");
    let b = ProxiedDevBroker::start_with(1, &[], groups()).expect("cluster B");
    let orders = records("orders", 200, 2);
    TestProducer::new(&a.broker().bootstrap(), "none")
        .send("orders", orders.clone())
        .await;
    // The group consumed part of each partition on A.
    // Partition 0 stops exactly at a sync (every 10 offsets), partition 1 just past one.
    let upstream = [(0, 70i64), (1, 31i64)];
    // Through A's proxy, which learns groups from the requests it forwards.
    commit(&a.bootstrap(), "billing", "orders", &upstream);
    let lag_max = 10;
    // The copies name their source offsets (`source.headers.enabled`, off by default), so the
    // check below can tell which source record a consumer on B resumes at.
    let text = format!(
        "{}A->B.enabled = true\nA->B.topics = orders\nemit.heartbeats.enabled = false\n\
         groups = billing\nemit.checkpoints.interval.seconds = 1\n\
         sync.group.offsets.enabled = true\nsync.group.offsets.interval.seconds = 1\n\
         offset.lag.max = {lag_max}\nA->B.source.headers.enabled = true\n{}{}",
        clusters(&a, &b),
        if exactly_once {
            "B.exactly.once.source.support = enabled\n"
        } else {
            ""
        },
        match syncs {
            Syncs::OnTheSource => "",
            Syncs::OnTheTarget => "offset-syncs.topic.location = target\n",
        }
    );
    let (progress, metrics, stop, task) = start(config(&text)).await;
    let ab = progress["A->B"].clone();
    let target = b.broker().bootstrap();
    wait_for("offsets synced on B", Duration::from_secs(90), || {
        committed_offsets(&target, "billing", "A.orders", 2).len() == 2
    })
    .await;
    // MM2's checkpoint-latency-ms, per group and target partition.
    let latency = "kafka_connect_mirror_checkpoint_connector_checkpoint_latency_ms_count{";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics_text(metrics).await;
        let measured = text.lines().any(|l| {
            l.starts_with(latency)
                && l.contains("group=\"billing\"")
                && l.contains("topic=\"A.orders\"")
                && l.contains("source=\"A\"")
        });
        if measured {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint-latency-ms for group billing:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop_flows(stop, task).await;
    assert!(
        ab.lock().unwrap().checkpoints > 0,
        "{:?}",
        ab.lock().unwrap()
    );

    let copies = if exactly_once {
        read_committed(b.broker(), "A.orders", "committed-orders", orders.len()).await
    } else {
        read_all(&target, "A.orders")
    };
    let on_b = committed_offsets(&target, "billing", "A.orders", 2);
    let source_offset = |c: &Copy| -> i64 {
        let (_, v) = c
            .headers
            .iter()
            .find(|(k, _)| k == "spillway.source.offset")
            .expect("source offset header");
        std::str::from_utf8(v.as_deref().expect("value"))
            .expect("text")
            .parse()
            .expect("number")
    };
    for (partition, upstream) in upstream {
        let resume = on_b[&partition];
        // What a consumer of the group on B reads: every copy at or after its committed offset.
        let reread: Vec<i64> = copies
            .iter()
            .filter(|c| c.partition == partition && c.offset >= resume)
            .map(source_offset)
            .collect();
        let first = *reread.iter().min().expect("records left to read");
        assert!(
            first <= upstream,
            "partition {partition}: resumes at source offset {first}, after the committed {upstream}: a record would be skipped"
        );
        assert!(
            upstream - first <= lag_max,
            "partition {partition}: re-reads {} records, more than offset.lag.max",
            upstream - first
        );
        let expected: Vec<i64> = (first..100).collect();
        assert_eq!(
            reread, expected,
            "partition {partition}: everything after, in order"
        );
    }
    let checkpoints = read_all(&target, "A.checkpoints.internal");
    assert!(!checkpoints.is_empty(), "checkpoints written on B");
    let key = checkpoints[0].key.as_deref().expect("key");
    assert_eq!(&key[..9], &[0, 7, b'b', b'i', b'l', b'l', b'i', b'n', b'g']);

    // MM2's names: the syncs topic is named after the cluster it is not on.
    let source = a.broker().bootstrap();
    let ((on, topic), (off, absent)) = match syncs {
        Syncs::OnTheSource => (
            (&source, "mm2-offset-syncs.B.internal"),
            (&target, "mm2-offset-syncs.A.internal"),
        ),
        Syncs::OnTheTarget => (
            (&target, "mm2-offset-syncs.A.internal"),
            (&source, "mm2-offset-syncs.B.internal"),
        ),
    };
    for cluster in [&source, &target] {
        let names = topics(cluster);
        assert!(
            !names.contains_key(absent) && (cluster == on || !names.contains_key(topic)),
            "offset syncs topics on {cluster}: {names:?}"
        );
    }
    assert_ne!(on, off);
    let mut by_partition: BTreeMap<i32, BTreeMap<i64, i64>> = BTreeMap::new();
    for record in read_all(on, topic) {
        let ((synced_topic, partition), sync) = spillway_connectors::kafka_offset_syncs::decode(
            record.key.as_deref().unwrap_or_default(),
            record.value.as_deref().unwrap_or_default(),
        )
        .expect("an offset sync in MM2's layout");
        assert_eq!(synced_topic, "orders", "syncs name the source topic");
        by_partition
            .entry(partition)
            .or_default()
            .insert(sync.upstream, sync.downstream);
    }
    // The offsets on B are the translation of these syncs: latest sync (u, d) with u <= U,
    // d when U == u, else d + 1.
    for (partition, upstream) in upstream {
        let (&u, &d) = by_partition
            .get(&partition)
            .and_then(|s| s.range(..=upstream).next_back())
            .unwrap_or_else(|| panic!("partition {partition}: no sync at or below {upstream}"));
        assert_eq!(
            on_b[&partition],
            if u == upstream { d } else { d + 1 },
            "partition {partition}: translated with the syncs on {on}: {by_partition:?}"
        );
    }
}

/// MM2's connectors created on a REST worker (in Connect's way: the worker on the target
/// cluster) with MM2's key names: the source connector copies the topic to its remote name once,
/// the heartbeat connector writes heartbeats, status and plugins answer as Connect's, a config
/// missing a key is refused naming it, the offsets API says where a flow's positions are, and
/// delete stops the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mm2_connectors_created_through_rest_copy_and_beat_under_mm2_key_names() {
    // The proxies answer ListGroups and DescribeGroups as Kafka does (the mock has neither).
    let groups = || plaintext().with_one_group_namespace();
    let a = ProxiedDevBroker::start_with(1, &[("orders", 2)], groups()).expect("cluster A");
    let b = ProxiedDevBroker::start_with(1, &[], groups()).expect("cluster B");
    let sent = records("orders", 200, 2);
    TestProducer::new(&a.broker().bootstrap(), "none")
        .send("orders", sent.clone())
        .await;
    let state = tempfile::tempdir().expect("state dir");
    let (worker, client) = support::start_worker(b.broker(), state.path()).await;
    let mm2 = |class: &str, name: &str| {
        serde_json::json!({
            "name": name,
            "config": {
                "connector.class": format!("org.apache.kafka.connect.mirror.{class}"),
                "source.cluster.alias": "A",
                "target.cluster.alias": "B",
                "source.cluster.bootstrap.servers": a.bootstrap(),
                "target.cluster.bootstrap.servers": b.bootstrap(),
                "topics": "orders",
                "replication.factor": "1",
                "heartbeats.topic.replication.factor": "1",
                "offset-syncs.topic.replication.factor": "1",
                "checkpoints.topic.replication.factor": "1",
                "refresh.topics.interval.seconds": "1",
                "emit.heartbeats.interval.seconds": "1",
                "tasks.max": "1",
            }
        })
    };

    let mut incomplete = mm2("MirrorSourceConnector", "incomplete");
    incomplete["config"]
        .as_object_mut()
        .expect("object")
        .remove("source.cluster.bootstrap.servers");
    let refused = client.post("/connectors", incomplete).await;
    let message = refused.assert_error(400);
    assert!(
        message.contains("source.cluster.bootstrap.servers"),
        "{message}"
    );

    let created = client
        .post("/connectors", mm2("MirrorSourceConnector", "a-to-b"))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let target = b.broker().bootstrap();
    wait_for("A.orders copied", Duration::from_secs(90), || {
        read_all(&target, "A.orders").len() >= sent.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_copied_once_in_order("orders", &sent, &read_all(&target, "A.orders"));
    let status = client.get("/connectors/a-to-b/status").await;
    assert_eq!(
        status.body["connector"]["state"], "RUNNING",
        "{}",
        status.text
    );
    assert_eq!(
        status.body["tasks"][0]["state"], "RUNNING",
        "{}",
        status.text
    );
    assert_eq!(status.body["type"], "source", "{}", status.text);
    let offsets = client.get("/connectors/a-to-b/offsets").await;
    assert!(
        offsets.assert_error(400).contains("kafka-consumer-groups"),
        "{}",
        offsets.text
    );
    // Offset syncs: MM2's default location, the source cluster.
    let source = a.broker().bootstrap();
    wait_for("offset syncs on A", Duration::from_secs(30), || {
        !read_all(&source, "mm2-offset-syncs.B.internal").is_empty()
    })
    .await;

    let beating = client
        .post(
            "/connectors",
            mm2("MirrorHeartbeatConnector", "a-to-b-heartbeats"),
        )
        .await;
    assert_eq!(beating.status, 201, "{}", beating.text);
    wait_for("heartbeats on B", Duration::from_secs(30), || {
        read_all(&target, "heartbeats")
            .iter()
            .filter_map(|c| Heartbeat::decode(c.key.as_deref()?, c.value.as_deref()?).ok())
            .any(|h| h.source_cluster_alias == "A" && h.target_cluster_alias == "B")
    })
    .await;

    // The checkpoint connector alone translates a group's offsets on A (through the source
    // connector's offset syncs) and commits them on B.
    // Through A's proxy, which learns groups from the requests it forwards.
    commit(&a.bootstrap(), "app-1", "orders", &[(0, 60), (1, 40)]);
    let mut checkpoints = mm2("MirrorCheckpointConnector", "a-to-b-checkpoints");
    for (k, v) in [
        ("groups", "app-.*"),
        ("emit.checkpoints.interval.seconds", "1"),
        ("sync.group.offsets.enabled", "true"),
        ("sync.group.offsets.interval.seconds", "1"),
    ] {
        checkpoints["config"][k] = v.into();
    }
    let checkpointing = client.post("/connectors", checkpoints).await;
    assert_eq!(checkpointing.status, 201, "{}", checkpointing.text);
    wait_for(
        "app-1's offsets translated onto B",
        Duration::from_secs(60),
        || {
            let on_b = committed_offsets(&target, "app-1", "A.orders", 2);
            on_b.len() == 2 && on_b.values().all(|o| *o > 0)
        },
    )
    .await;
    let translated = committed_offsets(&target, "app-1", "A.orders", 2);
    // Never past what the group consumed on A (MM2's translation is conservative).
    assert!(
        translated[&0] <= 60 && translated[&1] <= 40,
        "{translated:?}"
    );

    let plugins = client.get("/connector-plugins").await;
    let mirror_plugins: Vec<(String, String)> = plugins
        .body
        .as_array()
        .expect("plugins")
        .iter()
        .filter(|p| p["class"].as_str().is_some_and(|c| c.contains(".mirror.")))
        .map(|p| {
            (
                p["class"].as_str().unwrap_or_default().to_owned(),
                p["type"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(mirror_plugins.len(), 3, "{}", plugins.text);
    assert!(mirror_plugins.iter().all(|(_, kind)| kind == "source"));

    // Deleted: the copy stops; what A gets next stays on A.
    assert_eq!(client.delete("/connectors/a-to-b").await.status, 204);
    let more = records("orders", 20, 2);
    TestProducer::new(&a.broker().bootstrap(), "none")
        .send("orders", more)
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(read_all(&target, "A.orders").len(), sent.len());
    drop(client);
    worker.stop().await;
}
