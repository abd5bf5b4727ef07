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

/// A producer that must fail: returns what librdkafka reported (errors and the delivery error).
async fn failure_through(config: &ClientConfig, topic: &str) -> String {
    let errors = Errors::default();
    let producer: FutureProducer<Errors> = config
        .clone()
        .set("message.timeout.ms", "8000")
        .create_with_context(errors.clone())
        .expect("producer");
    let delivery = producer
        .send(
            FutureRecord::to(topic).key("k").payload("v"),
            Duration::from_secs(8),
        )
        .await;
    let delivery = match delivery {
        Ok(_) => panic!("a record was delivered; client errors: {}", errors.text()),
        Err((e, _)) => e.to_string(),
    };
    format!("{delivery}\n{}", errors.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_proxy_serves_rdkafka_that_trusts_the_test_ca_and_refuses_one_that_does_not() {
    let broker = DevBroker::try_start(2, &[("tls", 2)]).expect("dev broker");
    let proxy = KafkaProxy::start(&broker.bootstrap(), ProxyOptions::new(ProxySecurity::Ssl))
        .expect("proxy starts");
    let pki = proxy.pki().expect("TLS proxies have certificates");
    let config = client_config(&proxy, None);
    let seen = brokers_seen(&config);
    assert_eq!(
        seen.iter().map(|(_, p)| *p).collect::<BTreeSet<_>>(),
        proxy_ports(&proxy)
    );
    produce_through(&config, "tls", 100).await.unwrap();
    consume_through(&config, "tls", "tls-group", 100).await;

    let mut untrusted = config.clone();
    untrusted.set(
        "ssl.ca.location",
        pki.untrusted_ca_path.display().to_string(),
    );
    let why = failure_through(&untrusted, "tls").await;
    assert!(
        why.to_lowercase().contains("certificate verify failed"),
        "{why}"
    );

    let mut plaintext = config.clone();
    plaintext.set("security.protocol", "plaintext");
    failure_through(&plaintext, "tls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_admits_only_clients_with_a_certificate_from_the_test_ca() {
    let broker = DevBroker::try_start(1, &[("mtls", 1)]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Ssl).with_client_certificate_required(),
    )
    .expect("proxy starts");
    let pki = proxy.pki().unwrap();
    let config = client_config(&proxy, None);
    failure_through(&config, "mtls").await;

    let mut foreign = config.clone();
    foreign
        .set(
            "ssl.certificate.location",
            pki.untrusted_client_cert_path.display().to_string(),
        )
        .set(
            "ssl.key.location",
            pki.untrusted_client_key_path.display().to_string(),
        );
    failure_through(&foreign, "mtls").await;

    let mut with_cert = config.clone();
    with_cert
        .set(
            "ssl.certificate.location",
            pki.client_cert_path.display().to_string(),
        )
        .set(
            "ssl.key.location",
            pki.client_key_path.display().to_string(),
        );
    produce_through(&with_cert, "mtls", 20).await.unwrap();
    consume_through(&with_cert, "mtls", "mtls-group", 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_delivers_with_plain_and_both_scram_mechanisms_and_refuses_a_wrong_password() {
    let broker = DevBroker::try_start(2, &[("sasl", 2)]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::SaslSsl).with_user("alice", "alice-secret"),
    )
    .expect("proxy starts");
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let config = client_config(&proxy, Some((mechanism, "alice", "alice-secret")));
        produce_through(&config, "sasl", 50)
            .await
            .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        let group = format!("sasl-{mechanism}");
        consume_through(&config, "sasl", &group, 50).await;

        let wrong = client_config(&proxy, Some((mechanism, "alice", "not-her-password")));
        let why = failure_through(&wrong, "sasl").await;
        assert!(why.contains("Authentication failed"), "{mechanism}: {why}");
        // The password never shows in what the client reports.
        assert!(!why.contains("not-her-password"), "{why}");
    }
}

/// A client with a fixed OAUTHBEARER token (librdkafka asks its context for tokens).
struct BearerContext {
    token: String,
    errors: Errors,
}

impl ClientContext for BearerContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.error(error, reason);
    }

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        Ok(rdkafka::client::OAuthToken {
            token: self.token.clone(),
            principal_name: "app".into(),
            lifetime_ms: (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis() as i64)
                + 60_000,
        })
    }
}

async fn bearer_delivers(proxy: &KafkaProxy, token: String) -> Result<(), String> {
    let errors = Errors::default();
    let mut config = client_config(proxy, None);
    config
        .set("sasl.mechanism", "OAUTHBEARER")
        .set("message.timeout.ms", "8000");
    let producer: FutureProducer<BearerContext> = config
        .create_with_context(BearerContext {
            token,
            errors: errors.clone(),
        })
        .map_err(|e| e.to_string())?;
    producer
        .send(
            FutureRecord::to("oauth").key("k").payload("v"),
            Duration::from_secs(8),
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| format!("{e}\n{}", errors.text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_accepts_tokens_of_its_issuer_only() {
    let broker = DevBroker::try_start(1, &[("oauth", 1)]).expect("dev broker");
    let issuer = spillway_tests::TokenIssuer::start("app", "app-secret", Duration::from_secs(300));
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::SaslSsl)
            .with_mechanisms(&[])
            .with_token_issuer(issuer.clone()),
    )
    .expect("proxy starts");
    bearer_delivers(&proxy, issuer.issue(Some("kafka")))
        .await
        .expect("a token of the issuer is accepted");
    let stranger =
        spillway_tests::TokenIssuer::start("app", "app-secret", Duration::from_secs(300));
    let why = bearer_delivers(&proxy, stranger.issue(None))
        .await
        .unwrap_err();
    assert!(
        why.contains("Authentication failed") || why.contains("signature"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_listener_closes_connections_that_skip_authentication_as_kafka_does() {
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest, RequestHeader};
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame<T: Encodable + HeaderVersion>(key: i16, version: i16, body: &T) -> Vec<u8> {
        let mut header = RequestHeader::default();
        header.request_api_key = key;
        header.request_api_version = version;
        header.correlation_id = 9;
        let mut buf = bytes::BytesMut::new();
        header.encode(&mut buf, T::header_version(version)).unwrap();
        body.encode(&mut buf, version).unwrap();
        let mut out = (buf.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&buf);
        out
    }

    let broker = DevBroker::try_start(1, &[]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::SaslPlaintext).with_user("alice", "alice-secret"),
    )
    .expect("proxy starts");
    let mut socket = tokio::net::TcpStream::connect(proxy.bootstrap())
        .await
        .unwrap();
    // ApiVersions is answered before authentication, and advertises the SASL APIs.
    socket
        .write_all(&frame(18, 2, &ApiVersionsRequest::default()))
        .await
        .unwrap();
    let mut len = [0u8; 4];
    socket.read_exact(&mut len).await.unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    socket.read_exact(&mut body).await.unwrap();
    let mut bytes = bytes::Bytes::from(body);
    let _header = kafka_protocol::messages::ResponseHeader::decode(&mut bytes, 0).unwrap();
    let versions = kafka_protocol::messages::ApiVersionsResponse::decode(&mut bytes, 2).unwrap();
    let advertised = |key: i16| {
        versions
            .api_keys
            .iter()
            .find(|k| k.api_key == key)
            .map(|k| (k.min_version, k.max_version))
    };
    assert_eq!(advertised(17), Some((0, 1)));
    assert_eq!(advertised(36), Some((0, 2)));
    // Anything else before SaslHandshake: the connection closes without an answer.
    socket
        .write_all(&frame(METADATA, 4, &MetadataRequest::default()))
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut rest))
        .await
        .expect("the proxy closes the connection");
    assert!(read.is_ok() && rest.is_empty(), "{read:?} {rest:?}");
    assert_eq!(proxy.request_count(METADATA), 1);
}

/// Runs tools/kafka_roundtrip.py (the confluent-kafka wheel): produce `n`, read them back.
fn python_round_trip(conf: serde_json::Value, topic: &str, n: usize) -> Result<String, String> {
    let python = spillway_tests::python::venv_python().expect("python venv");
    let script = spillway_tests::python::tools_dir().join("kafka_roundtrip.py");
    let output = std::process::Command::new(python)
        .arg(script)
        .arg(conf.to_string())
        .arg(topic)
        .arg(n.to_string())
        .output()
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[test]
fn python_confluent_kafka_round_trips_over_tls_with_ssl_ca_location() {
    let broker = DevBroker::try_start(2, &[("py-tls", 2)]).expect("dev broker");
    let proxy = KafkaProxy::start(&broker.bootstrap(), ProxyOptions::new(ProxySecurity::Ssl))
        .expect("proxy starts");
    let pki = proxy.pki().unwrap();
    let conf = serde_json::json!({
        "bootstrap.servers": proxy.bootstrap(),
        "security.protocol": "SSL",
        "ssl.ca.location": pki.ca_path.display().to_string(),
    });
    let out = python_round_trip(conf, "py-tls", 50).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("consumed 50"), "{out}");

    let untrusted = serde_json::json!({
        "bootstrap.servers": proxy.bootstrap(),
        "security.protocol": "SSL",
        "ssl.ca.location": pki.untrusted_ca_path.display().to_string(),
        "message.timeout.ms": 5000,
    });
    let err = python_round_trip(untrusted, "py-tls", 1).unwrap_err();
    assert!(err.contains("produce failed"), "{err}");
}

/// A bare Kafka protocol client, for fault tests that must see exactly what comes back.
struct Raw {
    socket: tokio::net::TcpStream,
    correlation: i32,
}

impl Raw {
    async fn connect(address: &str) -> Raw {
        Raw {
            socket: tokio::net::TcpStream::connect(address).await.unwrap(),
            correlation: 0,
        }
    }

    async fn send<T>(&mut self, api_key: i16, version: i16, body: &T) -> i32
    where
        T: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion,
    {
        use kafka_protocol::protocol::Encodable;
        use tokio::io::AsyncWriteExt;
        self.correlation += 1;
        let mut header = kafka_protocol::messages::RequestHeader::default();
        header.request_api_key = api_key;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(kafka_protocol::protocol::StrBytes::from_static_str("raw"));
        let mut buf = bytes::BytesMut::new();
        header.encode(&mut buf, T::header_version(version)).unwrap();
        body.encode(&mut buf, version).unwrap();
        let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&buf);
        self.socket.write_all(&frame).await.unwrap();
        self.correlation
    }

    /// The next response as `T` with its correlation id, or `None` if none came `within`.
    async fn recv<T>(&mut self, version: i16, within: Duration) -> Option<(i32, T)>
    where
        T: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
    {
        use kafka_protocol::protocol::Decodable;
        use tokio::io::AsyncReadExt;
        let read = async {
            let mut len = [0u8; 4];
            self.socket.read_exact(&mut len).await.ok()?;
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            self.socket.read_exact(&mut body).await.ok()?;
            Some(bytes::Bytes::from(body))
        };
        let mut frame = tokio::time::timeout(within, read).await.ok()??;
        let header = kafka_protocol::messages::ResponseHeader::decode(
            &mut frame,
            T::header_version(version),
        )
        .unwrap();
        Some((
            header.correlation_id,
            T::decode(&mut frame, version).unwrap(),
        ))
    }
}

fn metadata_request() -> kafka_protocol::messages::MetadataRequest {
    let mut r = kafka_protocol::messages::MetadataRequest::default();
    r.topics = Some(Vec::new());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_delayed_responses_reach_the_client_as_a_timeout_and_a_wait() {
    use kafka_protocol::messages::MetadataResponse;
    let broker = DevBroker::try_start(1, &[]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    let mut raw = Raw::connect(&proxy.bootstrap()).await;

    proxy.faults().drop_responses(METADATA, 1);
    let first = raw.send(METADATA, 9, &metadata_request()).await;
    assert!(
        raw.recv::<MetadataResponse>(9, Duration::from_secs(2))
            .await
            .is_none(),
        "the response to request {first} was not dropped"
    );
    assert_eq!(proxy.faults().dropped(METADATA), 1);
    let second = raw.send(METADATA, 9, &metadata_request()).await;
    let (correlation, response) = raw
        .recv::<MetadataResponse>(9, Duration::from_secs(10))
        .await
        .expect("only the next response is dropped");
    assert_eq!(correlation, second);
    assert_eq!(response.brokers.len(), 1);

    proxy
        .faults()
        .delay_responses(METADATA, Duration::from_millis(1500));
    let started = Instant::now();
    raw.send(METADATA, 9, &metadata_request()).await;
    raw.recv::<MetadataResponse>(9, Duration::from_secs(10))
        .await
        .expect("a delayed response still comes");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    proxy.faults().delay_responses(METADATA, Duration::ZERO);
    let started = Instant::now();
    raw.send(METADATA, 9, &metadata_request()).await;
    raw.recv::<MetadataResponse>(9, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_top_level_errors_answer_the_next_requests_in_kafkas_shape() {
    use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
    use kafka_protocol::protocol::StrBytes;
    const FIND_COORDINATOR: i16 = 10;
    const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    let broker = DevBroker::try_start(1, &[]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    let mut raw = Raw::connect(&proxy.bootstrap()).await;
    proxy
        .faults()
        .inject_error(FIND_COORDINATOR, COORDINATOR_NOT_AVAILABLE, 2)
        .unwrap();

    let mut v3 = FindCoordinatorRequest::default();
    v3.key = StrBytes::from_static_str("g1");
    raw.send(FIND_COORDINATOR, 3, &v3).await;
    let (_, r) = raw
        .recv::<FindCoordinatorResponse>(3, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.error_code, COORDINATOR_NOT_AVAILABLE);

    let mut v4 = FindCoordinatorRequest::default();
    v4.coordinator_keys = vec![
        StrBytes::from_static_str("g1"),
        StrBytes::from_static_str("g2"),
    ];
    raw.send(FIND_COORDINATOR, 4, &v4).await;
    let (_, r) = raw
        .recv::<FindCoordinatorResponse>(4, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.coordinators.len(), 2);
    assert!(r
        .coordinators
        .iter()
        .all(|c| c.error_code == COORDINATOR_NOT_AVAILABLE));
    assert!(r.coordinators[0]
        .error_message
        .as_deref()
        .unwrap()
        .contains("test proxy"));

    // The count is used up: the broker answers again (the mock knows v0-3), with the proxy's
    // own port.
    raw.send(FIND_COORDINATOR, 3, &v3).await;
    let (_, r) = raw
        .recv::<FindCoordinatorResponse>(3, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.error_code, 0);
    assert_eq!(r.port, proxy.listener(r.node_id.0).unwrap().port() as i32);

    let refused = proxy
        .faults()
        .inject_error(3, 1, 1)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("api_key=3"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_partition_errors_replace_only_that_partitions_answer() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    const FETCH: i16 = 1;
    const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    let broker = DevBroker::try_start(1, &[("faulty", 2)]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    produce_through(&client_config(&proxy, None), "faulty", 10)
        .await
        .unwrap();
    proxy
        .faults()
        .inject_partition_error(FETCH, "faulty", 1, NOT_LEADER_OR_FOLLOWER, 1)
        .unwrap();
    let mut request = FetchRequest::default();
    request.replica_id = (-1).into();
    request.max_wait_ms = 100;
    request.max_bytes = 1 << 20;
    let mut topic = FetchTopic::default();
    topic.topic = TopicName(StrBytes::from_static_str("faulty"));
    for p in 0..2 {
        let mut part = FetchPartition::default();
        part.partition = p;
        part.partition_max_bytes = 1 << 20;
        topic.partitions.push(part);
    }
    request.topics.push(topic);
    let mut raw = Raw::connect(&proxy.bootstrap()).await;
    let codes = |r: &FetchResponse| -> Vec<i16> {
        r.responses[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .collect()
    };
    raw.send(FETCH, 12, &request).await;
    let (_, r) = raw
        .recv::<FetchResponse>(12, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(codes(&r), vec![0, NOT_LEADER_OR_FOLLOWER]);
    assert!(r.responses[0].partitions[1].records.is_none());
    raw.send(FETCH, 12, &request).await;
    let (_, r) = raw
        .recv::<FetchResponse>(12, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(codes(&r), vec![0, 0], "one response only");
    let refused = proxy
        .faults()
        .inject_partition_error(3, "faulty", 0, 1, 1)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("api_key=3"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_connections_hangs_up_on_every_client_now() {
    use tokio::io::AsyncReadExt;
    let broker = DevBroker::try_start(2, &[]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    let addresses: Vec<String> = proxy.bootstrap().split(',').map(String::from).collect();
    let mut clients = Vec::new();
    for address in &addresses {
        let mut raw = Raw::connect(address).await;
        raw.send(METADATA, 9, &metadata_request()).await;
        raw.recv::<kafka_protocol::messages::MetadataResponse>(9, Duration::from_secs(10))
            .await
            .expect("connected");
        clients.push(raw);
    }
    assert_eq!(proxy.faults().close_connections(), 2);
    for raw in &mut clients {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), raw.socket.read_to_end(&mut rest))
            .await
            .expect("closed at once");
        assert!(rest.is_empty(), "{read:?}");
    }
    // New connections are served as before.
    let mut again = Raw::connect(&addresses[0]).await;
    again.send(METADATA, 9, &metadata_request()).await;
    assert!(again
        .recv::<kafka_protocol::messages::MetadataResponse>(9, Duration::from_secs(10))
        .await
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_kafka42_mode_the_share_consumer_still_gets_its_assignment_and_every_record() {
    let broker = DevBroker::try_start(1, &[("k42", 2)]).expect("dev broker");
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_kafka42_coordinator(),
    )
    .expect("proxy starts");
    produce_through(&client_config(&proxy, None), "k42", 100)
        .await
        .unwrap();
    let mut config = ShareConsumerConfig::new(&proxy.bootstrap(), "k42-group");
    config.request_timeout = Duration::from_secs(5);
    let mut consumer = ShareConsumer::connect(config)
        .await
        .expect("share consumer");
    consumer.subscribe(&["k42"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    while seen.len() < 100 && Instant::now() < deadline {
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .expect("poll");
        consumer
            .acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("ack");
        seen.extend(records.iter().map(|r| (r.partition, r.offset)));
        consumer
            .commit_sync(Duration::from_secs(5))
            .await
            .expect("commit");
    }
    assert_eq!(seen.len(), 100);
    assert!(
        proxy.request_count(76) >= 1,
        "heartbeats went through the proxy"
    );
    assert_eq!(consumer.assigned_partitions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_handshake_v0_takes_bare_tokens_and_an_unknown_mechanism_is_refused_then_closed() {
    use kafka_protocol::messages::{MetadataResponse, SaslHandshakeRequest, SaslHandshakeResponse};
    use kafka_protocol::protocol::StrBytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SASL_HANDSHAKE: i16 = 17;
    let broker = DevBroker::try_start(1, &[]).expect("dev broker");
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::SaslPlaintext)
            .with_mechanisms(&[SaslMechanism::Plain])
            .with_user("alice", "alice-secret"),
    )
    .expect("proxy starts");

    // v0 handshake, then the PLAIN token without a Kafka header; the answer is a bare frame.
    let mut raw = Raw::connect(&proxy.bootstrap()).await;
    let mut handshake = SaslHandshakeRequest::default();
    handshake.mechanism = StrBytes::from_static_str("PLAIN");
    raw.send(SASL_HANDSHAKE, 0, &handshake).await;
    let (_, r) = raw
        .recv::<SaslHandshakeResponse>(0, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.error_code, 0);
    let token = b"\0alice\0alice-secret";
    let mut frame = (token.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(token);
    raw.socket.write_all(&frame).await.unwrap();
    let mut len = [0u8; 4];
    raw.socket.read_exact(&mut len).await.unwrap();
    assert_eq!(
        u32::from_be_bytes(len),
        0,
        "PLAIN ends with an empty server token"
    );
    raw.send(METADATA, 9, &metadata_request()).await;
    let (_, metadata) = raw
        .recv::<MetadataResponse>(9, Duration::from_secs(10))
        .await
        .expect("authenticated: requests pass");
    assert_eq!(metadata.brokers.len(), 1);

    // A mechanism the listener does not enable: UNSUPPORTED_SASL_MECHANISM naming the enabled
    // ones, then the connection closes.
    let mut raw = Raw::connect(&proxy.bootstrap()).await;
    handshake.mechanism = StrBytes::from_static_str("SCRAM-SHA-256");
    raw.send(SASL_HANDSHAKE, 1, &handshake).await;
    let (_, r) = raw
        .recv::<SaslHandshakeResponse>(1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.error_code, 33);
    assert_eq!(r.mechanisms, vec![StrBytes::from_static_str("PLAIN")]);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), raw.socket.read_to_end(&mut rest))
        .await
        .expect("closed")
        .unwrap();
    assert!(rest.is_empty());
}

/// Two heartbeats of one member (a full join, then a non-full one); returns whether each answer
/// carried the assignment.
async fn heartbeat_assignments(proxy: &KafkaProxy, group: &str) -> (bool, bool) {
    use kafka_protocol::messages::{
        GroupId, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    const SHARE_GROUP_HEARTBEAT: i16 = 76;
    let mut raw = Raw::connect(&proxy.bootstrap()).await;
    let member = StrBytes::from_string(uuid::Uuid::new_v4().to_string());
    let mut request = ShareGroupHeartbeatRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    request.member_id = member.clone();
    request.member_epoch = 0;
    request.subscribed_topic_names = Some(vec![TopicName(StrBytes::from_static_str("k42raw"))]);
    // The mock may answer the join before it has computed the assignment: repeat full
    // requests until one carries it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (first, epoch) = loop {
        raw.send(SHARE_GROUP_HEARTBEAT, 1, &request).await;
        let (_, r) = raw
            .recv::<ShareGroupHeartbeatResponse>(1, Duration::from_secs(10))
            .await
            .expect("heartbeat answer");
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
        request.member_epoch = r.member_epoch;
        if r.assignment
            .as_ref()
            .is_some_and(|a| !a.topic_partitions.is_empty())
        {
            break (true, r.member_epoch);
        }
        assert!(
            Instant::now() < deadline,
            "no assignment for a full heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    request.member_epoch = epoch;
    request.subscribed_topic_names = None;
    raw.send(SHARE_GROUP_HEARTBEAT, 1, &request).await;
    let (_, r) = raw
        .recv::<ShareGroupHeartbeatResponse>(1, Duration::from_secs(10))
        .await
        .expect("heartbeat answer");
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    (first, r.assignment.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka42_mode_leaves_the_assignment_out_of_a_repeated_non_full_heartbeat() {
    let broker = DevBroker::try_start(1, &[("k42raw", 2)]).expect("dev broker");
    let mock = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    assert_eq!(
        heartbeat_assignments(&mock, "as-the-mock").await,
        (true, true),
        "the dev broker repeats the assignment every time"
    );
    let kafka42 = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_kafka42_coordinator(),
    )
    .expect("proxy starts");
    assert_eq!(
        heartbeat_assignments(&kafka42, "as-kafka-4-2").await,
        (true, false),
        "Kafka 4.2 sends an unchanged assignment only to a full request"
    );
}
