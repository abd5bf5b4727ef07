//! The REST findings of issue 19 as tests, each failing on the code before the fix:
//! authorization on the matched route (every spelling of every protected route), `/metrics`
//! per tenant, bodies that must be JSON (a cross-site `text/plain` POST), 405 with `Allow`,
//! duplicate JSON keys, secrets inside URLs, header lists and `pass`-named keys, no secret in
//! the logs at TRACE, a loopback default without authentication, HTTPS with mutual TLS, and
//! a dead runtime shown by `/health` while DELETE still works.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value as Json};
use spillway::rest::{endpoints, Access};
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance};
use spillway_core::{ConfigError, ConfigMap, SinkConnector, SinkTask};
use support::process::WorkerProcess;
use support::{broker, start_worker, start_worker_with, Client};

const WAIT: Duration = Duration::from_secs(60);
const ADMIN_TOKEN: &str = "admin-token-for-the-security-tests";

fn auth() -> [(&'static str, &'static str); 2] {
    [
        ("rest.auth.enabled", "true"),
        ("rest.admin.token", ADMIN_TOKEN),
    ]
}

async fn tenant(admin: &Client, name: &str) -> String {
    let created = admin.post("/tenants", json!({ "name": name })).await;
    assert_eq!(created.status, 201, "{}", created.text);
    created.body["token"].as_str().expect("a token").to_owned()
}

/// `path` spelled in ways a router may take for the same route, or that a check on the raw
/// path may miss: each literal segment's first letter percent-encoded, the whole first segment
/// encoded, doubled slashes, a trailing slash, and changes of case.
fn spellings(path: &str) -> Vec<String> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let encode_first = |s: &str| match s.chars().next() {
        Some(c) if c.is_ascii_alphabetic() => format!("%{:02X}{}", c as u32, &s[1..]),
        _ => s.to_owned(),
    };
    let encoded_first: Vec<String> = segments.iter().map(|s| encode_first(s)).collect();
    let mut whole_first = segments.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    whole_first[0] = segments[0]
        .bytes()
        .map(|b| format!("%{b:02x}"))
        .collect::<String>();
    let mut out = vec![
        path.to_owned(),
        format!("/{}", encoded_first.join("/")),
        format!("/{}", whole_first.join("/")),
        format!("/{path}"),
        path.replacen('/', "//", 2),
        format!("{path}/"),
        path.to_ascii_uppercase(),
    ];
    let mut capitalised = segments.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    capitalised[0] = {
        let mut c = capitalised[0].chars();
        c.next()
            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
            .unwrap_or_default()
    };
    out.push(format!("/{}", capitalised.join("/")));
    out.dedup();
    out
}

/// A body the route's handler would accept if it ever ran.
fn body_for(path: &str, method: &Method) -> Option<String> {
    if !matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        return None;
    }
    Some(
        if path.starts_with("/admin/loggers") {
            json!({"level": "TRACE"})
        } else if path == "/tenants" {
            json!({"name": "intruder"})
        } else if path.starts_with("/tenants/{tenant}") && !path.contains("/connectors") {
            json!({"quotas": {"connectors": 1000}})
        } else {
            json!({"connector.class": "file", "topics": "t", "file": "/tmp/x", "name": "x"})
        }
        .to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_every_protected_route_is_authorized_as_the_route_it_reaches() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let acme = anonymous.with_token(&tenant(&admin, "acme").await);
    tenant(&admin, "globex").await;
    let root_before = admin.get("/admin/loggers/root").await.body["level"].clone();

    // The finding: a tenant reached /admin by percent-encoding it.
    let encoded = acme
        .put("/%61dmin/loggers/root", json!({"level": "TRACE"}))
        .await;
    encoded.assert_error(403);

    let protected: Vec<_> = endpoints()
        .into_iter()
        .filter(|e| e.access != Access::Public)
        .collect();
    assert!(
        protected.len() > 40,
        "the route list is derived from endpoints()"
    );
    let mut checked = 0;
    for endpoint in &protected {
        // A tenant names another tenant in `{tenant}`; every other parameter is arbitrary.
        let concrete = endpoint
            .path
            .replace("{tenant}", "globex")
            .replace("{name}", "root")
            .replace("{task}", "0")
            .replace("{plugin}", "file");
        let method = Method::from_bytes(endpoint.method.as_str().as_bytes()).expect("a method");
        let body = body_for(&endpoint.path, &method);
        let tenant_may = endpoint.access == Access::Caller && !endpoint.path.contains("{tenant}");
        for path in spellings(&concrete) {
            let what = format!("{} {path} (route {})", endpoint.method, endpoint.path);
            let answer = anonymous.send(method.clone(), &path, body.clone()).await;
            assert!(
                matches!(answer.status, 401 | 404),
                "{what} without a token answered {}: {}",
                answer.status,
                answer.text
            );
            if tenant_may {
                continue;
            }
            let answer = acme.send(method.clone(), &path, body.clone()).await;
            assert!(
                matches!(answer.status, 403 | 404),
                "{what} with tenant acme's token answered {}: {}",
                answer.status,
                answer.text
            );
            if path == concrete && endpoint.access == Access::Admin {
                answer.assert_error(403);
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} refusals checked");
    assert_eq!(
        admin.get("/admin/loggers/root").await.body["level"],
        root_before,
        "no spelling changed the root logger"
    );
    let tenants = admin.get("/tenants").await.text;
    assert!(!tenants.contains("intruder"), "{tenants}");
    worker.stop().await;
}

/// A share-mode file sink.
fn file_sink(name: &str, topic: &str, file: &Path) -> Json {
    json!({"name": name, "config": {
        "connector.class": "file",
        "topics": topic,
        "file": file.display().to_string(),
        "consumer.override.group.protocol": "share",
    }})
}

/// The sample lines of Prometheus text (comments left out).
fn samples(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_scrapes_only_its_own_metrics_and_the_admin_scrapes_all() {
    let broker = broker();
    broker.create_topic("metered", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let acme = anonymous.with_token(&tenant(&admin, "acme").await);
    let globex = anonymous.with_token(&tenant(&admin, "globex").await);
    for (client, name) in [(&acme, "acme-orders"), (&globex, "globex-ledger")] {
        // A tenant's file sink writes inside its own directory: a relative path.
        let out = std::path::PathBuf::from(format!("{name}.txt"));
        let created = client
            .post("/connectors", file_sink(name, "metered", &out))
            .await;
        assert_eq!(created.status, 201, "{}", created.text);
    }
    let start = Instant::now();
    let everything = loop {
        let text = admin.get("/metrics").await.text;
        if text.contains("connector=\"acme-orders\"")
            && text.contains("connector=\"globex-ledger\"")
        {
            break text;
        }
        assert!(
            start.elapsed() < WAIT,
            "no series of both connectors: {text}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(everything.contains("tenant=\"globex\""));

    let own = acme.get("/metrics").await;
    assert_eq!(own.status, 200, "{}", own.text);
    assert!(
        own.text.contains("connector=\"acme-orders\""),
        "{}",
        own.text
    );
    for leaked in ["globex", "tenant=\"default\""] {
        assert!(
            !own.text.contains(leaked),
            "acme sees {leaked}: {}",
            own.text
        );
    }
    let lines = samples(&own.text);
    assert!(!lines.is_empty());
    for line in lines {
        assert!(line.contains("tenant=\"acme\""), "not acme's: {line}");
    }
    anonymous.get("/metrics").await.assert_error(401);
    worker.stop().await;
}

/// Sends `body` to `path` with `content_type` (none when `None`) and no token.
async fn send_typed(
    base: &str,
    method: Method,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, Json, reqwest::header::HeaderMap) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .timeout(Duration::from_secs(60))
        .body(body.to_owned());
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or(Json::String(text));
    (status, body, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_must_be_json_methods_are_listed_and_duplicate_keys_are_refused() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let base = format!("http://{}", worker.address());
    let create = json!({"name": "csrf", "config": {
        "connector.class": "file", "topics": "t",
        "file": dir.path().join("csrf.txt").display().to_string(),
    }})
    .to_string();

    // What a cross-site form or fetch can send without a CORS preflight, and a body without
    // any type: all 415 in Connect's shape, nothing created.
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let (status, body, _) =
            send_typed(&base, Method::POST, "/connectors", content_type, &create).await;
        assert_eq!(status, 415, "{content_type:?}: {body}");
        assert_eq!(body["error_code"], 415, "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("application/json")),
            "{body}"
        );
    }
    assert_eq!(api.get("/connectors").await.body, json!([]));
    let (status, body, _) = send_typed(
        &base,
        Method::PUT,
        "/connectors/csrf/pause",
        Some("text/plain"),
        "x",
    )
    .await;
    assert_eq!(status, 415, "{body}");
    let (status, body, _) = send_typed(
        &base,
        Method::POST,
        "/connectors",
        Some("application/json; charset=utf-8"),
        &create,
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // A page of another site cannot act even where no body (so no 415) is involved; a
    // same-origin one can.
    let mut request = reqwest::Client::new()
        .post(format!("{base}/connectors/csrf/restart"))
        .header("origin", "http://evil.example");
    let refused = request.send().await.expect("an answer");
    assert_eq!(refused.status(), 403);
    let body: Json = refused.json().await.expect("json");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("cross-origin")),
        "{body}"
    );
    request = reqwest::Client::new()
        .post(format!("{base}/connectors/csrf/restart"))
        .header("origin", base.as_str());
    assert_eq!(request.send().await.expect("an answer").status(), 204);

    // A known path with a method it does not have: 405 naming the methods it has.
    for (method, path, allow) in [
        (Method::DELETE, "/connectors", "GET, POST"),
        (Method::PATCH, "/connectors/csrf/status", "GET"),
        (Method::POST, "/admin/loggers/root", "GET, PUT"),
    ] {
        let (status, body, headers) = send_typed(&base, method.clone(), path, None, "").await;
        assert_eq!(status, 405, "{method} {path}: {body}");
        assert_eq!(body["error_code"], 405, "{body}");
        assert_eq!(
            headers.get("allow").and_then(|v| v.to_str().ok()),
            Some(allow),
            "{method} {path}"
        );
    }

    // The same key twice: which one was meant is ambiguous, so it is refused naming it.
    let doubled = r#"{"connector.class": "file", "topics": "t", "file": "/tmp/a", "topics": "u"}"#;
    for (method, path) in [
        (Method::PUT, "/connectors/csrf/config"),
        (Method::PUT, "/connector-plugins/file/config/validate"),
    ] {
        let (status, body, _) =
            send_typed(&base, method, path, Some("application/json"), doubled).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("duplicate key 'topics'")),
            "{body}"
        );
    }
    let nested = r#"{"name": "twice", "config": {"connector.class": "file", "topics": "t", "file": "/tmp/b", "file": "/etc/x"}}"#;
    let (status, body, _) = send_typed(
        &base,
        Method::POST,
        "/connectors",
        Some("application/json"),
        nested,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"]
        .as_str()
        .is_some_and(|m| m.contains("'file'")));
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_inside_urls_header_lists_and_pass_keys_are_never_shown() {
    let broker = broker();
    broker.create_topic("vaulted", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let (worker, api) = start_worker(&broker, &state).await;
    let secrets = [
        "db-pass-s3cret-1",
        "url-pw-s3cret-2",
        "Bearer hdr-s3cret-3",
        "param-s3cret-4",
        "key-hdr-s3cret-5",
    ];
    let url = format!("postgres://app:{}@db.internal:5432/x", secrets[1]);
    let headers = format!(
        "Authorization: {}|X-Tenant:acme|X-Api-Key:{}",
        secrets[2], secrets[4]
    );
    let config = json!({
        "connector.class": "vault",
        "topics": "vaulted",
        "vault.password": "declared-password",
        "db.pass": secrets[0],
        "connection.url": url,
        "http.headers": headers,
        "jdbc.url": format!("jdbc:postgresql://db/x?user=app&password={}", secrets[3]),
    });
    let mut seen = Vec::new();
    let created = api
        .post("/connectors", json!({"name": "vault", "config": config}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let shown = &created.body["config"];
    assert_eq!(shown["db.pass"], "[hidden]");
    assert_eq!(
        shown["connection.url"],
        "postgres://app:****@db.internal:5432/x"
    );
    assert_eq!(
        shown["http.headers"],
        "Authorization:****|X-Tenant:acme|X-Api-Key:****"
    );
    assert_eq!(
        shown["jdbc.url"],
        "jdbc:postgresql://db/x?user=app&password=****"
    );
    seen.push(created.text);
    for path in [
        "/connectors/vault",
        "/connectors/vault/config",
        "/connectors/vault/tasks",
        "/connectors/vault/status",
        "/connectors?expand=info&expand=status",
    ] {
        let answer = api.get(path).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text);
        seen.push(answer.text);
    }
    let report = api
        .put("/connector-plugins/vault/config/validate", config.clone())
        .await;
    assert_eq!(report.status, 200, "{}", report.text);
    seen.push(report.text);
    // A bad value next to the secrets: the error names the key, not the secrets.
    let bad = api
        .patch(
            "/connectors/vault/config",
            json!({"vault.token.ttl": format!("not-a-number {}", url)}),
        )
        .await;
    bad.assert_error(400);
    seen.push(bad.text);
    // What GET shows, sent back, keeps the stored secrets.
    let shown = api.get("/connectors/vault/config").await.body;
    let put = api.put("/connectors/vault/config", shown).await;
    assert_eq!(put.status, 200, "{}", put.text);
    seen.push(put.text);
    for text in &seen {
        for secret in secrets {
            assert!(!text.contains(secret), "'{secret}' shown in: {text}");
        }
    }
    worker.stop().await;

    let store = open_store(&state).await;
    let stored = spillway_storage::StateStore::connector(
        &store,
        &spillway_storage::ConnectorKey::new("default", "vault"),
    )
    .expect("readable")
    .expect("stored");
    assert_eq!(
        stored.config["connection.url"], url,
        "the round trip kept the URL's password"
    );
    assert_eq!(stored.config["http.headers"], headers);
    assert_eq!(stored.config["db.pass"], secrets[0]);
}

/// Opens the state store of a stopped worker (sled lets its lock go shortly after).
async fn open_store(state: &Path) -> spillway_storage::SledStore {
    let start = Instant::now();
    loop {
        match spillway_storage::SledStore::open(state) {
            Ok(store) => return store,
            Err(e) if start.elapsed() < WAIT => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot open the state store: {e}"),
        }
    }
}

/// How sled's `Debug` shows bytes: `[115, 51, ...]`.
fn as_debug_bytes(secret: &str) -> String {
    secret
        .bytes()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_level_prints_a_stored_configurations_secrets() {
    let broker = broker();
    broker.create_topic("logged", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state").display().to_string();
    let bootstrap = broker.bootstrap();
    let worker = WorkerProcess::start(
        &[
            ("bootstrap.servers", &bootstrap),
            ("rest.port", "0"),
            ("state.dir", &state),
        ],
        dir.path(),
        "trace",
    );
    let api = Client::new(&worker.base);
    api.wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    let secrets = ["log-pass-s3cret-1", "log-url-s3cret-2", "log-hdr-s3cret-3"];
    let out = dir.path().join("out.txt").display().to_string();
    let config = json!({
        "connector.class": "file",
        "topics": "logged",
        "file": out,
        "db.pass": secrets[0],
        "connection.url": format!("https://svc:{}@example.internal/", secrets[1]),
        "http.headers": format!("Authorization:Bearer {}", secrets[2]),
    });
    let level = api
        .put("/admin/loggers/root", json!({"level": "TRACE"}))
        .await;
    assert_eq!(level.status, 200, "{}", level.text);
    let created = api
        .post("/connectors", json!({"name": "logged", "config": config}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    api.wait_for("/connectors/logged/status", WAIT, |s| {
        s["connector"]["state"] == "RUNNING"
    })
    .await;
    let shown = api.get("/connectors/logged/config").await.body;
    assert_eq!(
        api.put("/connectors/logged/config", shown).await.status,
        200
    );
    assert_eq!(api.put_empty("/connectors/logged/pause").await.status, 202);
    assert_eq!(api.put_empty("/connectors/logged/resume").await.status, 202);
    assert_eq!(api.delete("/connectors/logged").await.status, 204);
    let log = worker.stop();
    assert!(
        log.contains("TRACE") && log.contains("configuration written"),
        "the log ran at TRACE: {}",
        &log[..log.len().min(2000)]
    );
    for secret in secrets {
        assert!(!log.contains(secret), "'{secret}' in the log");
        assert!(
            !log.contains(&as_debug_bytes(secret)),
            "'{secret}' in the log as bytes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_authentication_the_worker_listens_on_loopback_and_says_so() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state").display().to_string();
    let bootstrap = broker.bootstrap();
    let worker = WorkerProcess::start(
        &[
            ("bootstrap.servers", &bootstrap),
            ("rest.port", "0"),
            ("state.dir", &state),
        ],
        dir.path(),
        "info",
    );
    assert!(
        worker.base.starts_with("http://127.0.0.1:"),
        "{}",
        worker.base
    );
    let log = worker.stop();
    assert!(log.contains("loopback only"), "{log}");
    assert!(log.contains("rest.auth.enabled=false"), "{log}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all as PEM.
struct Pki {
    ca: String,
    server_chain: String,
    server_key: String,
    client_identity: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let mut server_params =
        CertificateParams::new(vec!["localhost".to_owned()]).expect("server params");
    server_params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let server = server_params
        .signed_by(&server_key, &issuer)
        .expect("server cert");
    let client_key = KeyPair::generate().expect("client key");
    let client = CertificateParams::new(vec!["client".to_owned()])
        .expect("client params")
        .signed_by(&client_key, &issuer)
        .expect("client cert");
    Pki {
        ca: ca.pem(),
        server_chain: format!("{}{}", server.pem(), ca.pem()),
        server_key: server_key.serialize_pem(),
        client_identity: format!("{}{}", client_key.serialize_pem(), client.pem()),
    }
}

fn https_client(ca: &str, identity: Option<&str>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(Duration::from_secs(30))
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca"));
    if let Some(identity) = identity {
        builder =
            builder.identity(reqwest::Identity::from_pem(identity.as_bytes()).expect("identity"));
    }
    builder.build().expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_port_serves_https_from_pem_and_requires_client_certificates_when_asked() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = pki();
    let keystore = dir.path().join("rest.pem");
    std::fs::write(&keystore, format!("{}{}", pki.server_key, pki.server_chain)).expect("pem");
    let truststore = dir.path().join("ca.pem");
    std::fs::write(&truststore, &pki.ca).expect("ca");
    let (keystore, truststore) = (
        keystore.display().to_string(),
        truststore.display().to_string(),
    );

    // Mutual TLS: a client without a certificate of the truststore's CA gets no answer.
    let mut properties = support::worker_config(&broker, &dir.path().join("state"));
    properties.extend(support::config(&[
        ("listeners", "https://127.0.0.1:0"),
        ("listeners.https.ssl.keystore.type", "PEM"),
        ("listeners.https.ssl.keystore.location", &keystore),
        ("listeners.https.ssl.truststore.type", "PEM"),
        ("listeners.https.ssl.truststore.location", &truststore),
        ("listeners.https.ssl.client.auth", "required"),
    ]));
    let worker = spillway::worker_cmd::RunningWorker::start(properties, support::registry())
        .await
        .expect("an https worker starts");
    assert_eq!(worker.listening()[0].0, spillway::worker_cmd::Scheme::Https);
    let url = format!("https://127.0.0.1:{}/", worker.address().port());
    let trusted = https_client(&pki.ca, Some(&pki.client_identity));
    let answer = trusted.get(&url).send().await.expect("a TLS answer");
    assert_eq!(answer.status(), 200);
    let body: Json = answer.json().await.expect("json");
    assert!(body["version"].is_string(), "{body}");
    assert!(
        https_client(&pki.ca, None).get(&url).send().await.is_err(),
        "a client without a certificate was answered"
    );
    assert!(
        !reqwest::Client::new()
            .get(format!("http://127.0.0.1:{}/", worker.address().port()))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()),
        "plain http was answered on the https port"
    );
    worker.stop().await;

    // PEM given inline (Kafka's ssl.keystore.certificate.chain / ssl.keystore.key), no client
    // certificates asked.
    let mut properties = support::worker_config(&broker, &dir.path().join("state2"));
    properties.extend(support::config(&[
        ("listeners", "https://127.0.0.1:0"),
        ("listeners.https.ssl.keystore.type", "PEM"),
        (
            "listeners.https.ssl.keystore.certificate.chain",
            &pki.server_chain,
        ),
        ("listeners.https.ssl.keystore.key", &pki.server_key),
    ]));
    let worker = spillway::worker_cmd::RunningWorker::start(properties, support::registry())
        .await
        .expect("an https worker starts");
    let url = format!("https://127.0.0.1:{}/health", worker.address().port());
    let start = Instant::now();
    loop {
        let answer = https_client(&pki.ca, None)
            .get(&url)
            .send()
            .await
            .expect("a TLS answer");
        if answer.status() == 200 {
            break;
        }
        assert!(start.elapsed() < WAIT, "not healthy: {}", answer.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.stop().await;

    // What cannot work is refused at start naming the key.
    for (extra, named) in [
        (
            vec![("listeners.https.ssl.keystore.type", "JKS")],
            "listeners.https.ssl.keystore.type",
        ),
        (vec![], "ssl.keystore.location"),
        (
            vec![
                ("listeners.https.ssl.keystore.location", keystore.as_str()),
                ("listeners.https.ssl.client.auth", "required"),
            ],
            "truststore",
        ),
    ] {
        let mut properties = support::worker_config(&broker, &dir.path().join("state3"));
        properties.extend(support::config(&[("listeners", "https://127.0.0.1:0")]));
        properties.extend(support::config(&extra));
        let err = spillway::worker_cmd::RunningWorker::start(properties, support::registry())
            .await
            .err()
            .expect("refused");
        assert!(format!("{err:#}").contains(named), "{err:#}");
    }
    // Refused before the state store was opened: nothing is left locked for the next start.
    assert!(
        !dir.path().join("state3").exists(),
        "a start refused for its REST settings opened its state store"
    );
}

/// A sink whose connector panics while splitting into tasks (as a plugin hitting an exhausted
/// resource would). The runtime's guard catches it: the connector fails, the runtime goes on.
#[derive(Default)]
struct PanickingConnector;

impl SinkConnector for PanickingConnector {
    fn version(&self) -> &str {
        "1.0"
    }

    fn config_def(&self) -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new("note", ConfigType::String, Importance::Low, "Unused.").default(""),
        )
    }

    fn start(&mut self, _config: &ConfigMap) -> Result<(), ConfigError> {
        Ok(())
    }

    fn task_configs(&self, _max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        panic!("cannot spawn a task thread: Too many open files (simulated)")
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(spillway_connectors::file::FileSinkTask::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_connector_fails_alone_and_can_be_deleted_while_health_stays_green() {
    let broker = broker();
    broker.create_topic("doomed", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let properties = support::worker_config(&broker, &dir.path().join("state"));
    let registry = support::registry().with(&["panicking"], || Box::new(PanickingConnector));
    let worker = spillway::worker_cmd::RunningWorker::start(properties, registry)
        .await
        .expect("the worker starts");
    let api = Client::new(&format!("http://{}", worker.address()));
    api.wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    let created = api
        .post(
            "/connectors",
            json!({"name": "doomed", "config": {"connector.class": "panicking", "topics": "doomed"}}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);

    let status = api
        .wait_for("/connectors/doomed/status", WAIT, |s| {
            s["connector"]["state"] == "FAILED"
        })
        .await;
    let trace = status["connector"]["trace"].as_str().unwrap_or_default();
    assert!(
        trace.contains("Too many open files (simulated)") && trace.contains("panicked at"),
        "the connector's trace names the panic and where: {trace}"
    );
    // A panic a guard caught is one connector's failure, not a broken runtime.
    let health = api.get("/health").await;
    assert_eq!(health.status, 200, "{}", health.text);
    assert_eq!(health.body["status"], "healthy", "{}", health.text);

    let deleted = api.delete("/connectors/doomed").await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert_eq!(api.get("/connectors").await.body, json!([]));
    // The name can be used again, by a connector that runs.
    let out = dir.path().join("after.txt");
    let again = api
        .post("/connectors", file_sink("doomed", "doomed", &out))
        .await;
    assert_eq!(again.status, 201, "{}", again.text);
    api.wait_for("/connectors/doomed/status", WAIT, |s| {
        s["connector"]["state"] == "RUNNING"
    })
    .await;
    worker.stop().await;
}
