//! Issue 13 item 1: a file-sink connector reaches the dev broker through the test kit's Kafka
//! proxy over TLS, mutual TLS and SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER),
//! in share mode (Spillway's native client) and classic mode (librdkafka), from the same keys,
//! and delivers every record; refused credentials, an untrusted certificate and a listener of
//! the other kind end the task FAILED within 10 s with a message saying what to check, never
//! showing a secret.

mod runtime_support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use runtime_support::{config, share_broker, wait_until};
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_tests::kafka_proxy::{
    KafkaProxy, ProxyOptions, ProxySecurity, SaslMechanism, TokenIssuer,
};
use spillway_tests::{numbered_records, produce, DevBroker};

const RECORDS: u64 = 300;

/// Every log line of this test binary (all levels, librdkafka's included), to check that no
/// secret is ever logged.
fn captured_logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
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

/// Asserts that neither the logs so far nor `shown` (a status) hold any of `secrets`, and
/// that logging worked at all.
fn no_secret_in(shown: &str, secrets: &[&str]) {
    let logs = String::from_utf8_lossy(&captured_logs().lock().unwrap_or_else(|e| e.into_inner()))
        .into_owned();
    assert!(
        !logs.is_empty(),
        "nothing was logged: the capture is not working"
    );
    for secret in secrets {
        assert!(!logs.contains(secret), "a secret is in the logs");
        assert!(
            !shown.contains(secret),
            "a secret is in the status: {shown}"
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Share,
    Classic,
}

impl Mode {
    fn protocol(self) -> &'static str {
        match self {
            Mode::Share => "share",
            Mode::Classic => "classic",
        }
    }
}

struct Setup {
    broker: DevBroker,
    proxy: KafkaProxy,
    dir: tempfile::TempDir,
}

fn setup(options: ProxyOptions) -> Setup {
    captured_logs();
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("secured", 2);
    let proxy = KafkaProxy::start(&broker.bootstrap(), options).expect("proxy starts");
    Setup {
        broker,
        proxy,
        dir: tempfile::tempdir().expect("temp dir"),
    }
}

impl Setup {
    fn ca(&self) -> String {
        path(&self.proxy.pki().expect("TLS on").ca_path)
    }

    /// A worker on the proxy whose `consumer.*` keys are `worker_keys`.
    fn worker(&self, worker_keys: &[(&str, String)]) -> Worker {
        let bootstrap = self.proxy.bootstrap();
        let mut pairs: Vec<(String, String)> = vec![
            ("bootstrap.servers".into(), bootstrap),
            ("task.restart.backoff.ms".into(), "200".into()),
            ("task.poll.timeout.ms".into(), "100".into()),
        ];
        for (k, v) in worker_keys {
            pairs.push((format!("consumer.{k}"), v.clone()));
        }
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Worker::start(config(&refs), ConnectorRegistry::builtin()).expect("worker starts")
    }

    /// Starts a file sink on `secured` in `mode` with `overrides` as `consumer.override.*`.
    async fn start(
        &self,
        worker: &Worker,
        name: &str,
        mode: Mode,
        overrides: &[(&str, String)],
    ) -> PathBuf {
        let file = self.dir.path().join(format!("{name}.txt"));
        let mut pairs: Vec<(String, String)> = vec![
            ("name".into(), name.into()),
            (
                "connector.class".into(),
                "org.apache.kafka.connect.file.FileStreamSinkConnector".into(),
            ),
            ("topics".into(), "secured".into()),
            ("tasks.max".into(), "1".into()),
            ("value.converter".into(), "string".into()),
            ("file".into(), path(&file)),
            (
                "consumer.override.group.protocol".into(),
                mode.protocol().into(),
            ),
        ];
        for (k, v) in overrides {
            pairs.push((format!("consumer.override.{k}"), v.clone()));
        }
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        worker
            .start_connector(config(&refs))
            .await
            .expect("connector starts");
        file
    }
}

fn path(p: &std::path::Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

async fn produce_all(broker: &DevBroker) {
    let produced = produce(
        &broker.bootstrap(),
        "secured",
        numbered_records(RECORDS, 32, 2),
        "none",
    )
    .await;
    assert_eq!(produced.len() as u64, RECORDS);
}

/// Waits until the file holds every record.
async fn delivers_all(file: &PathBuf, worker: &Worker, name: &str) {
    let numbers = || -> BTreeSet<u64> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix('v')?.split(':').next()?.parse().ok())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while numbers().len() < RECORDS as usize {
        let status = worker.status(name).expect("registered");
        assert!(
            status.tasks.iter().all(|t| t.state != State::Failed),
            "a task failed: {status:?}"
        );
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {RECORDS} delivered; {status:?}",
            numbers().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(numbers(), (0..RECORDS).collect::<BTreeSet<u64>>());
}

/// Waits (10 s at most) for the task to be FAILED and returns its trace.
async fn fails_within_10s(worker: &Worker, name: &str) -> String {
    let started = Instant::now();
    let mut trace = None;
    wait_until(Duration::from_secs(10), "the task to be FAILED", || {
        let status = worker.status(name).expect("registered");
        trace = status
            .tasks
            .iter()
            .find(|t| t.state == State::Failed)
            .and_then(|t| t.trace.clone());
        trace.is_some()
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    trace.expect("failed")
}

fn sasl_options(security: ProxySecurity, mechanism: SaslMechanism) -> ProxyOptions {
    ProxyOptions::new(security)
        .with_mechanisms(&[mechanism])
        .with_user("alice", "alice-secret")
}

fn jaas(module: &str, user: &str, password: &str) -> String {
    format!(
        r#"org.apache.kafka.common.security.{module} required username="{user}" password="{password}";"#
    )
}

// --- delivery -------------------------------------------------------------------------------

async fn tls_delivers(mode: Mode) {
    let s = setup(ProxyOptions::new(ProxySecurity::Ssl));
    produce_all(&s.broker).await;
    // Java spelling at the worker.
    let worker = s.worker(&[
        ("security.protocol", "SSL".into()),
        ("ssl.truststore.type", "PEM".into()),
        ("ssl.truststore.location", s.ca()),
    ]);
    let file = s.start(&worker, "tls", mode, &[]).await;
    delivers_all(&file, &worker, "tls").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_delivers_every_record_in_share_mode() {
    tls_delivers(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_delivers_every_record_in_classic_mode() {
    tls_delivers(Mode::Classic).await;
}

async fn mtls_delivers(mode: Mode) {
    let s = setup(ProxyOptions::new(ProxySecurity::Ssl).with_client_certificate_required());
    produce_all(&s.broker).await;
    let pki = s.proxy.pki().expect("TLS");
    let worker = s.worker(&[]);
    // librdkafka spelling, on the connector.
    let file = s
        .start(
            &worker,
            "mtls",
            mode,
            &[
                ("security.protocol", "SSL".into()),
                ("ssl.ca.location", s.ca()),
                ("ssl.certificate.location", path(&pki.client_cert_path)),
                ("ssl.key.location", path(&pki.client_key_path)),
            ],
        )
        .await;
    delivers_all(&file, &worker, "mtls").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_delivers_every_record_in_share_mode() {
    mtls_delivers(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_delivers_every_record_in_classic_mode() {
    mtls_delivers(Mode::Classic).await;
}

async fn sasl_ssl_delivers(mode: Mode, mechanism: SaslMechanism) {
    let s = setup(sasl_options(ProxySecurity::SaslSsl, mechanism));
    produce_all(&s.broker).await;
    let module = match mechanism {
        SaslMechanism::Plain => "plain.PlainLoginModule",
        _ => "scram.ScramLoginModule",
    };
    let worker = s.worker(&[
        ("security.protocol", "SASL_SSL".into()),
        ("ssl.truststore.type", "PEM".into()),
        ("ssl.truststore.location", s.ca()),
        ("sasl.mechanism", mechanism.name().into()),
        ("sasl.jaas.config", jaas(module, "alice", "alice-secret")),
    ]);
    let file = s.start(&worker, "sasl", mode, &[]).await;
    delivers_all(&file, &worker, "sasl").await;
    no_secret_in(&format!("{:?}", worker.status("sasl")), &["alice-secret"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_plain_delivers_every_record_in_share_mode() {
    sasl_ssl_delivers(Mode::Share, SaslMechanism::Plain).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_plain_delivers_every_record_in_classic_mode() {
    sasl_ssl_delivers(Mode::Classic, SaslMechanism::Plain).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_scram_sha_256_delivers_every_record_in_share_mode() {
    sasl_ssl_delivers(Mode::Share, SaslMechanism::ScramSha256).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_scram_sha_256_delivers_every_record_in_classic_mode() {
    sasl_ssl_delivers(Mode::Classic, SaslMechanism::ScramSha256).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_scram_sha_512_delivers_every_record_in_share_mode() {
    sasl_ssl_delivers(Mode::Share, SaslMechanism::ScramSha512).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_scram_sha_512_delivers_every_record_in_classic_mode() {
    sasl_ssl_delivers(Mode::Classic, SaslMechanism::ScramSha512).await;
}

async fn oauthbearer_delivers(mode: Mode) {
    let issuer = TokenIssuer::start(
        "spillway-client",
        "client-secret-value",
        Duration::from_secs(3600),
    );
    let s = setup(
        ProxyOptions::new(ProxySecurity::SaslSsl)
            .with_mechanisms(&[SaslMechanism::OAuthBearer])
            .with_token_issuer(issuer.clone()),
    );
    produce_all(&s.broker).await;
    let worker = s.worker(&[]);
    let file = s
        .start(
            &worker,
            "oauth",
            mode,
            &[
                ("security.protocol", "SASL_SSL".into()),
                ("ssl.truststore.location", s.ca()),
                ("sasl.mechanism", "OAUTHBEARER".into()),
                ("sasl.oauthbearer.token.endpoint.url", issuer.token_endpoint_url()),
                (
                    "sasl.jaas.config",
                    r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="spillway-client" clientSecret="client-secret-value";"#.into(),
                ),
            ],
        )
        .await;
    delivers_all(&file, &worker, "oauth").await;
    assert!(issuer.tokens_issued() >= 1);
    no_secret_in(
        &format!("{:?}", worker.status("oauth")),
        &["client-secret-value"],
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_oauthbearer_delivers_every_record_in_share_mode() {
    oauthbearer_delivers(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_oauthbearer_delivers_every_record_in_classic_mode() {
    oauthbearer_delivers(Mode::Classic).await;
}

// --- failures -------------------------------------------------------------------------------

async fn wrong_password_fails(mode: Mode) {
    let s = setup(sasl_options(
        ProxySecurity::SaslSsl,
        SaslMechanism::ScramSha512,
    ));
    let worker = s.worker(&[]);
    s.start(
        &worker,
        "wrong",
        mode,
        &[
            ("security.protocol", "SASL_SSL".into()),
            ("ssl.ca.location", s.ca()),
            ("sasl.mechanism", "SCRAM-SHA-512".into()),
            (
                "sasl.jaas.config",
                jaas("scram.ScramLoginModule", "alice", "not-her-secret"),
            ),
        ],
    )
    .await;
    let trace = fails_within_10s(&worker, "wrong").await;
    assert!(
        trace.contains("SCRAM-SHA-512") && trace.contains("alice"),
        "{trace}"
    );
    assert!(trace.contains("password"), "{trace}");
    let shown = format!("{:?}", worker.status("wrong"));
    assert!(
        !shown.contains("not-her-secret") && !shown.contains("alice-secret"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_fails_the_task_naming_mechanism_and_user_in_share_mode() {
    wrong_password_fails(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_fails_the_task_naming_mechanism_and_user_in_classic_mode() {
    wrong_password_fails(Mode::Classic).await;
}

async fn untrusted_certificate_fails(mode: Mode) {
    let s = setup(ProxyOptions::new(ProxySecurity::Ssl));
    let untrusted = path(&s.proxy.pki().expect("TLS").untrusted_ca_path);
    let worker = s.worker(&[]);
    s.start(
        &worker,
        "untrusted",
        mode,
        &[
            ("security.protocol", "SSL".into()),
            ("ssl.truststore.location", untrusted),
        ],
    )
    .await;
    let trace = fails_within_10s(&worker, "untrusted").await;
    assert!(trace.contains("certificate"), "{trace}");
    assert!(
        trace.contains("ssl.truststore.location") || trace.contains("ssl.ca.location"),
        "{trace}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_certificate_fails_the_task_in_share_mode() {
    untrusted_certificate_fails(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_certificate_fails_the_task_in_classic_mode() {
    untrusted_certificate_fails(Mode::Classic).await;
}

async fn plaintext_to_tls_fails(mode: Mode) {
    let s = setup(ProxyOptions::new(ProxySecurity::Ssl));
    let worker = s.worker(&[]);
    s.start(&worker, "plain-to-tls", mode, &[]).await;
    let trace = fails_within_10s(&worker, "plain-to-tls").await;
    assert!(trace.contains("security.protocol"), "{trace}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_listener_reached_in_plaintext_fails_the_task_in_share_mode() {
    plaintext_to_tls_fails(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_listener_reached_in_plaintext_fails_the_task_in_classic_mode() {
    plaintext_to_tls_fails(Mode::Classic).await;
}

async fn tls_to_plaintext_fails(mode: Mode) {
    let s = setup(ProxyOptions::new(ProxySecurity::Plaintext));
    let ca = s.dir.path().join("ca.pem");
    // Any PEM CA: the handshake fails before a certificate is seen.
    let tls = KafkaProxy::start(&s.broker.bootstrap(), ProxyOptions::new(ProxySecurity::Ssl))
        .expect("proxy");
    std::fs::copy(&tls.pki().expect("TLS").ca_path, &ca).expect("copy CA");
    let worker = s.worker(&[]);
    s.start(
        &worker,
        "tls-to-plain",
        mode,
        &[
            ("security.protocol", "SSL".into()),
            ("ssl.ca.location", path(&ca)),
        ],
    )
    .await;
    let trace = fails_within_10s(&worker, "tls-to-plain").await;
    assert!(trace.contains("TLS") || trace.contains("SSL"), "{trace}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plaintext_listener_reached_with_tls_fails_the_task_in_share_mode() {
    tls_to_plaintext_fails(Mode::Share).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plaintext_listener_reached_with_tls_fails_the_task_in_classic_mode() {
    tls_to_plaintext_fails(Mode::Classic).await;
}
