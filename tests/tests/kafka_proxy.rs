//! The test-kit Kafka proxy (`spillway_tests::kafka_proxy`) with real clients: rdkafka
//! (librdkafka) producers and classic consumers, the project's native share consumer, and the
//! Python confluent-kafka wheel.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Message};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_tests::kafka_proxy::{KafkaProxy, ProxyOptions, ProxySecurity, SaslMechanism};
use spillway_tests::DevBroker;

const METADATA: i16 = 3;

/// Records every error librdkafka reports, so a test can assert on why a client failed.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<String>>>);

impl ClientContext for Errors {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0.lock().unwrap().push(format!("{error}: {reason}"));
    }
}
impl ConsumerContext for Errors {}

impl Errors {
    fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

/// Client settings for `proxy`: its bootstrap, security protocol, CA and SASL credentials.
fn client_config(proxy: &KafkaProxy, sasl: Option<(&str, &str, &str)>) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", proxy.bootstrap())
        .set("security.protocol", proxy.security().name())
        .set("socket.timeout.ms", "10000");
    if let Some(pki) = proxy.pki() {
        config.set("ssl.ca.location", pki.ca_path.display().to_string());
    }
    if let Some((mechanism, user, password)) = sasl {
        config
            .set("sasl.mechanism", mechanism)
            .set("sasl.username", user)
            .set("sasl.password", password);
    }
    config
}

/// Produces `n` numbered records and returns the first failure, if any.
async fn produce_through(config: &ClientConfig, topic: &str, n: usize) -> Result<(), String> {
    let errors = Errors::default();
    let producer: FutureProducer<Errors> = config
        .clone()
        .set("message.timeout.ms", "20000")
        .set("linger.ms", "5")
        .create_with_context(errors.clone())
        .map_err(|e| format!("cannot create the producer: {e}"))?;
    for i in 0..n {
        let key = format!("k{i}");
        let value = format!("v{i}");
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(&value),
                Duration::from_secs(20),
            )
            .await
            .map_err(|(e, _)| {
                format!(
                    "record {i} not delivered: {e}; client errors: {}",
                    errors.text()
                )
            })?;
    }
    Ok(())
}

/// Reads until `n` distinct records arrived with a classic consumer group (or 60 s passed).
async fn consume_through(
    config: &ClientConfig,
    topic: &str,
    group: &str,
    n: usize,
) -> BTreeSet<String> {
    let consumer: StreamConsumer<Errors> = config
        .clone()
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create_with_context(Errors::default())
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    while seen.len() < n && Instant::now() < deadline {
        if let Ok(Ok(message)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await
        {
            seen.insert(
                String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            );
        }
    }
    assert_eq!(
        seen.len(),
        n,
        "the consumer read {} of {n} records; client errors: {}",
        seen.len(),
        consumer.context().text()
    );
    seen
}

/// The brokers a client learns through `config`: (host, port) of each.
fn brokers_seen(config: &ClientConfig) -> Vec<(String, u16)> {
    let consumer: StreamConsumer = config.create().expect("client");
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(20))
        .expect("metadata through the proxy");
    metadata
        .brokers()
        .iter()
        .map(|b| (b.host().to_string(), b.port() as u16))
        .collect()
}

fn upstream_ports(broker: &DevBroker) -> BTreeSet<u16> {
    broker
        .bootstrap()
        .split(',')
        .map(|a| a.rsplit(':').next().unwrap().parse().unwrap())
        .collect()
}

fn proxy_ports(proxy: &KafkaProxy) -> BTreeSet<u16> {
    proxy
        .bootstrap()
        .split(',')
        .map(|a| a.rsplit(':').next().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_proxy_carries_rdkafka_producer_and_classic_consumer_and_names_only_its_ports() {
    let broker = DevBroker::try_start(2, &[("through", 4)]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    assert_eq!(
        proxy.bootstrap().split(',').count(),
        2,
        "one listener per broker"
    );
    let config = client_config(&proxy, None);

    let seen = brokers_seen(&config);
    let ports: BTreeSet<u16> = seen.iter().map(|(_, p)| *p).collect();
    assert_eq!(ports, proxy_ports(&proxy), "metadata names {seen:?}");
    assert!(ports.is_disjoint(&upstream_ports(&broker)), "{seen:?}");
    assert!(seen.iter().all(|(h, _)| h == "127.0.0.1"), "{seen:?}");
    assert!(proxy.request_count(METADATA) >= 1);

    produce_through(&config, "through", 200).await.unwrap();
    consume_through(&config, "through", "through-group", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_share_consumer_reads_everything_through_the_proxy() {
    let broker = DevBroker::try_start(2, &[("shared", 3)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    produce_through(&client_config(&proxy, None), "shared", 300)
        .await
        .unwrap();

    let mut config = ShareConsumerConfig::new(&proxy.bootstrap(), "share-through-proxy");
    config.request_timeout = Duration::from_secs(5);
    let mut consumer = ShareConsumer::connect(config)
        .await
        .expect("share consumer");
    consumer.subscribe(&["shared"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    while seen.len() < 300 && Instant::now() < deadline {
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .expect("poll");
        consumer
            .acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("acknowledge");
        for r in &records {
            seen.insert((r.partition, r.offset));
        }
        consumer
            .commit_sync(Duration::from_secs(5))
            .await
            .expect("commit");
    }
    assert_eq!(seen.len(), 300, "share consumer read {} of 300", seen.len());
    assert!(
        proxy.request_count(78) >= 1,
        "ShareFetch went through the proxy"
    );
    consumer.close().await.expect("close");
}

#[test]
fn a_sasl_listener_without_users_is_refused_with_a_named_error() {
    let err = ProxyOptions::new(ProxySecurity::SaslSsl).with_mechanisms(&[SaslMechanism::Plain]);
    let broker = DevBroker::start(1);
    let err = KafkaProxy::start(&broker.bootstrap(), err)
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least one user"), "{err}");
}
