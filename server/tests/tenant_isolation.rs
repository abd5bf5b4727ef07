//! Tenant isolation and worker hardening (issue 19): one tenant cannot crash, brick or escape the
//! worker. Each test is one attack from the issue, done over REST as a hostile tenant would:
//! a task count or name that cannot start, paths out of the tenant's directory, client
//! overrides naming other clusters or code, sinks aimed at the worker's own network,
//! exactly-once state shared with another tenant, and values that pass validate but fail start.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_storage::{ConnectorKey, ConnectorRecord, SledStore, StateStore, TargetState};
use spillway_tests::{numbered_records, produce};
use support::{broker, start_worker_with, Client};

const WAIT: Duration = Duration::from_secs(60);
const ADMIN_TOKEN: &str = "admin-token-for-the-isolation-tests";

fn auth() -> Vec<(&'static str, &'static str)> {
    vec![
        ("rest.auth.enabled", "true"),
        ("rest.admin.token", ADMIN_TOKEN),
    ]
}

/// Creates a tenant with `body` as the admin; returns a client with its token.
async fn tenant(anonymous: &Client, body: Json) -> Client {
    let created = anonymous
        .with_token(ADMIN_TOKEN)
        .post("/tenants", body)
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    anonymous.with_token(created.body["token"].as_str().expect("a token"))
}

/// A paused file sink: enough to be stored and counted, nothing runs.
/// Tenant `acme`, trusted with every client override (policy `All`).
async fn acme_under_all(anonymous: &Client) -> Client {
    tenant(
        anonymous,
        json!({"name": "acme", "client.config.override.policy": "All"}),
    )
    .await
}

fn file_sink(name: &str, file: &str, tasks: u64) -> Json {
    json!({"name": name, "initial_state": "PAUSED", "config": {
        "connector.class": "file", "topics": "t", "file": file, "tasks.max": tasks.to_string(),
        "consumer.override.group.protocol": "share"}})
}

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts a worker on `state`, retrying while sled still holds the lock of a store closed in
/// this process a moment ago (it releases it from a background thread).
async fn start_on(
    broker: &spillway_tests::DevBroker,
    state: &Path,
    extra: &[(&str, &str)],
) -> (spillway::worker_cmd::RunningWorker, Client) {
    let mut properties = support::worker_config(broker, state);
    properties.extend(support::config(extra));
    let start = Instant::now();
    let worker = loop {
        match spillway::worker_cmd::RunningWorker::start(properties.clone(), support::registry())
            .await
        {
            Ok(worker) => break worker,
            Err(e) if format!("{e:#}").contains("lock") && start.elapsed() < WAIT => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the worker does not start: {e:#}"),
        }
    };
    let client = Client::new(&format!("http://{}", worker.address()));
    client
        .wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    (worker, client)
}

/// Finding 1 and 6: `tasks.max=2147483647` made the worker allocate 51 GB of task
/// configurations (2^31 copies of the config, 24 bytes each) and abort — at create, at every
/// restart, and on `GET /connectors?expand=status` of a PAUSED one; a 600,000-character name
/// crashed it at every restart. Stored by an older version, such connectors now come back
/// FAILED (or PAUSED, with the tasks the worker would give them) and the worker serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_configs_that_cannot_start_become_failed_and_never_take_the_worker_down() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let long_name = "n".repeat(600_000);
    {
        std::fs::create_dir_all(&state).expect("state dir");
        let store = SledStore::open(&state).expect("the store opens");
        let sink = |name: &str, tasks: &str| {
            support::config(&[
                ("name", name),
                ("connector.class", "file"),
                ("topics", "t"),
                ("tasks.max", tasks),
                ("file", &dir.path().join("out.txt").display().to_string()),
                ("consumer.override.group.protocol", "share"),
            ])
        };
        for (name, tasks, target) in [
            ("huge", "2147483647", TargetState::Running),
            ("huge-paused", "2147483647", TargetState::Paused),
            (long_name.as_str(), "1", TargetState::Running),
        ] {
            store
                .put_connector(
                    &ConnectorKey::new("default", name),
                    &ConnectorRecord::new(sink(name, tasks), target),
                )
                .expect("stored");
        }
    }
    // An explicit worker limit: the default follows the machine's open-file limit.
    let (worker, client) = start_on(&broker, &state, &[("tasks.max.per.worker", "200")]).await;

    let all = client.get("/connectors?expand=status").await;
    assert_eq!(all.status, 200, "{}", &all.text[..all.text.len().min(500)]);
    let huge = &all.body["huge"]["status"];
    assert_eq!(huge["connector"]["state"], "FAILED", "{huge}");
    let trace = huge["connector"]["trace"].as_str().expect("a trace");
    assert!(
        trace.contains("tasks.max.per.connector") && trace.contains("2147483647"),
        "{trace}"
    );
    let paused = &all.body["huge-paused"]["status"];
    assert_eq!(paused["connector"]["state"], "PAUSED");
    assert_eq!(
        paused["tasks"].as_array().map(Vec::len),
        Some(64),
        "a PAUSED connector shows the tasks the worker would run: tasks.max.per.connector"
    );
    let long = &all.body[long_name.as_str()]["status"];
    assert_eq!(long["connector"]["state"], "FAILED");
    assert!(
        long["connector"]["trace"]
            .as_str()
            .is_some_and(|t| t.contains("at most 128 bytes")),
        "{}",
        &long.to_string()[..300.min(long.to_string().len())]
    );
    assert_eq!(
        client.get("/connectors/huge-paused/status").await.status,
        200
    );
    assert_eq!(client.get("/connectors/huge-paused").await.status, 200);
    assert_eq!(
        client.get("/connectors/huge-paused/tasks").await.status,
        200
    );
    assert_eq!(client.get("/health").await.body["status"], "healthy");
    // The FAILED ones count what they could run (64 each), not 2^31: others are still created.
    let out = dir.path().join("new.txt").display().to_string();
    let created = client.post("/connectors", file_sink("new", &out, 2)).await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(client.delete("/connectors/huge").await.status, 204);
    worker.stop().await;
}

/// Finding 1 (bounds): `tasks.max` beyond the worker's per-connector or per-worker limit is
/// refused with 400 naming the limit, a new tenant gets a default task quota (403 beyond it),
/// and names and values too long for Kafka are refused before anything is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_counts_names_and_values_beyond_the_limits_are_refused_naming_them() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut extra = auth();
    extra.push(("tasks.max.per.worker", "50"));
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &extra).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let out = dir.path().join("out.txt").display().to_string();

    let refused = admin
        .post("/connectors", file_sink("huge", &out, 2_147_483_647))
        .await;
    let message = refused.assert_error(400);
    assert!(message.contains("tasks.max.per.connector"), "{message}");
    let refused = admin.post("/connectors", file_sink("many", &out, 65)).await;
    assert!(refused
        .assert_error(400)
        .contains("at most 64 tasks per connector"));

    assert_eq!(
        admin
            .post("/connectors", file_sink("a", &out, 40))
            .await
            .status,
        201
    );
    let refused = admin.post("/connectors", file_sink("b", &out, 11)).await;
    let message = refused.assert_error(400);
    assert!(
        message.contains("tasks.max.per.worker") && message.contains("at most 50"),
        "{message}"
    );
    // A STOPPED connector runs no tasks: room for another, and its resume is refused.
    assert_eq!(admin.put_empty("/connectors/a/stop").await.status, 204);
    assert_eq!(
        admin
            .post("/connectors", file_sink("b", &out, 11))
            .await
            .status,
        201
    );
    let resumed = admin.put_empty("/connectors/a/resume").await;
    assert!(resumed.assert_error(400).contains("tasks.max.per.worker"));

    // A tenant created without a tasks quota gets the worker's default (32).
    let acme = tenant(&anonymous, json!({"name": "acme"})).await;
    let details = admin.get("/tenants/acme").await;
    assert_eq!(details.body["quotas"]["tasks"], 32, "{}", details.text);
    assert_eq!(
        acme.post("/connectors", file_sink("x", "x.txt", 20))
            .await
            .status,
        201
    );
    let over = acme.post("/connectors", file_sink("y", "y.txt", 13)).await;
    assert!(over.assert_error(403).contains("quota tasks=32"));

    for name in ["n".repeat(129), "n".repeat(66_000)] {
        let refused = admin.post("/connectors", file_sink(&name, &out, 1)).await;
        let message = refused.assert_error(400);
        assert!(message.contains("at most 128 bytes"), "{}", &message[..200]);
        assert!(message.len() < 2000, "the message does not echo the name");
    }
    let mut big = file_sink("big", &out, 1);
    big["config"]["topics"] = json!("t".repeat(40_000));
    assert!(admin
        .post("/connectors", big)
        .await
        .assert_error(400)
        .contains("at most 32767 bytes"));
    let names = admin.get("/connectors").await;
    assert_eq!(names.body, json!(["a", "b"]), "nothing else was stored");
    worker.stop().await;
}

/// Finding 2: a tenant's file sink wrote any file the worker could (`/...`, `../`, another
/// tenant's output, `<state.dir>/conf`), and `delivery.ledger.cache.dir` opened sled anywhere.
/// With authentication on, a tenant's paths resolve inside `<tenant.files.dir>/<tenant>`; the
/// admin's `default` tenant keeps Connect's FileStreamSink behaviour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_paths_stay_inside_its_directory() {
    let broker = broker();
    broker.create_topic("files", 1);
    produce(
        &broker.bootstrap(),
        "files",
        numbered_records(20, 8, 1),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let (worker, anonymous) = start_worker_with(&broker, &state, &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let acme = tenant(&anonymous, json!({"name": "acme"})).await;
    let root = state.join("tenant-files").join("acme");
    std::fs::create_dir_all(&root).expect("tenant dir");
    std::fs::create_dir_all(dir.path().join("outside")).expect("outside");
    std::os::unix::fs::symlink(dir.path().join("outside"), root.join("escape")).expect("link");

    let sink = |file: &str| {
        json!({"name": "out", "config": {"connector.class": "file", "topics": "files",
               "file": file, "consumer.override.group.protocol": "share"}})
    };
    for (file, says) in [
        ("/etc/spillway-owned".to_owned(), "relative path"),
        ("../globex/out.txt".to_owned(), "'..'"),
        (state.join("conf").display().to_string(), "relative path"),
        ("escape/out.txt".to_owned(), "symbolic link"),
    ] {
        let refused = acme.post("/connectors", sink(&file)).await;
        let message = refused.assert_error(400);
        assert!(
            message.contains("file") && message.contains(says),
            "{file}: {message}"
        );
    }
    let validated = acme
        .put(
            "/connector-plugins/kafka/config/validate",
            json!({"name": "k", "connector.class": "kafka", "topics": "files",
                   "delivery.guarantee": "exactly_once",
                   "delivery.ledger.cache.dir": dir.path().join("cache").display().to_string()}),
        )
        .await;
    assert_eq!(validated.body["error_count"], 1, "{}", validated.text);
    assert!(validated.text.contains("delivery.ledger.cache.dir"));

    assert_eq!(
        acme.post("/connectors", sink("out/acme.txt")).await.status,
        201
    );
    let written = root.join("out").join("acme.txt");
    wait_until("the tenant's records in its directory", || {
        lines_in(&written) == 20
    })
    .await;
    assert!(
        std::fs::read_dir(dir.path().join("outside"))
            .expect("outside")
            .next()
            .is_none(),
        "nothing was written through the link"
    );

    // The admin (default tenant) writes where it says, as Connect's FileStreamSink.
    let admin_out = dir.path().join("admin.txt");
    let body = json!({"name": "admin-out", "config": {"connector.class": "file",
        "topics": "files", "file": admin_out.display().to_string(),
        "consumer.override.group.protocol": "share"}});
    assert_eq!(admin.post("/connectors", body).await.status, 201);
    wait_until("the admin's records", || lines_in(&admin_out) == 20).await;
    worker.stop().await;
}

/// Finding 4: `Restricted` let through librdkafka's names for bootstrap servers, the kafka
/// sink's target cluster and code-loading keys. It is now an allow-list of tuning keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_tenants_may_override_tuning_keys_only() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let acme = tenant(&anonymous, json!({"name": "acme"})).await;
    let base = |extra: (&str, &str)| {
        let mut config = json!({"connector.class": "kafka", "topics": "t",
            "consumer.override.group.protocol": "classic"});
        config[extra.0] = json!(extra.1);
        json!({"name": "k", "initial_state": "PAUSED", "config": config})
    };
    for key in [
        "consumer.override.metadata.broker.list",
        "producer.override.metadata.broker.list",
        "admin.override.bootstrap.servers",
        "consumer.override.plugin.library.paths",
        "producer.override.plugin.library.paths",
        "consumer.override.interceptor.classes",
        "consumer.override.ssl.ca.location",
        "consumer.override.sasl.kerberos.kinit.cmd",
        "consumer.override.client.dns.lookup",
        "consumer.override.debug",
        "target.bootstrap.servers",
    ] {
        let refused = acme
            .post("/connectors", base((key, "evil.example:9092")))
            .await;
        let message = refused.assert_error(400);
        assert!(message.contains(key), "{key}: {message}");
    }
    let tuned = acme
        .post(
            "/connectors",
            base(("consumer.override.fetch.wait.max.ms", "200")),
        )
        .await;
    assert_eq!(tuned.status, 201, "{}", tuned.text);
    worker.stop().await;
}

/// Finding 8: a tenant's HTTP sink created a connector on a co-located worker's REST API.
/// Tenant sinks may not reach loopback, link-local or private addresses (host names resolved
/// at validation) unless the worker's `tenant.egress.allow` names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_sinks_reach_internal_addresses_only_when_the_worker_allows_them() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let acme = acme_under_all(&anonymous).await;
    let rest = format!("http://{}/connectors", worker.address());
    let targets = [
        ("http", "http.url", rest.clone()),
        ("http", "http.url", "http://localhost:8083/".to_owned()),
        (
            "http",
            "http.url",
            "http://169.254.169.254/latest".to_owned(),
        ),
        ("http", "http.url", "http://10.0.0.5/".to_owned()),
        (
            "postgres",
            "connection.url",
            "postgres://127.0.0.1:5432/shop".to_owned(),
        ),
        ("kafka", "target.bootstrap.servers", broker.bootstrap()),
    ];
    let validate = |client: &Client, (plugin, key, value): &(&str, &str, String)| {
        let client = client.clone();
        let mut config = json!({"name": "s", "connector.class": plugin, "topics": "t"});
        config[*key] = json!(value);
        let path = format!("/connector-plugins/{plugin}/config/validate");
        async move { client.put(&path, config).await }
    };
    for target in &targets {
        let answer = validate(&acme, target).await;
        assert_eq!(answer.body["error_count"], 1, "{target:?}: {}", answer.text);
        assert!(
            answer.text.contains(target.1) && answer.text.contains("tenant.egress.allow"),
            "{target:?}: {}",
            answer.text
        );
    }
    let refused = acme
        .post(
            "/connectors",
            json!({"name": "h", "config": {"connector.class": "http", "topics": "t",
                   "http.url": rest}}),
        )
        .await;
    assert!(refused.assert_error(400).contains("loopback"));
    // The admin's connectors are not policed.
    let admin = anonymous.with_token(ADMIN_TOKEN);
    assert_eq!(validate(&admin, &targets[0]).await.body["error_count"], 0);
    worker.stop().await;

    // A worker that lists loopback and 10/8 lets tenants reach them.
    let mut extra = auth();
    extra.push(("tenant.egress.allow", "127.0.0.0/8, ::1, 10.0.0.0/8"));
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state2"), &extra).await;
    let acme = acme_under_all(&anonymous).await;
    for target in targets.iter().filter(|t| !t.2.contains("169.254")) {
        let answer = validate(&acme, target).await;
        assert_eq!(answer.body["error_count"], 0, "{target:?}: {}", answer.text);
    }
    worker.stop().await;
}

/// Names under `.rebind.test` resolve as a tenant's rebinding DNS server would answer them:
/// 127.0.0.2 (which the tests' workers allow) until the test rebinds the name, 127.0.0.1
/// after. Installed once for the test binary; every other name goes to the system.
struct Rebinding {
    rebound: std::sync::Mutex<BTreeSet<String>>,
}

impl spillway_core::egress::Resolve for Rebinding {
    fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<std::net::IpAddr>> {
        if !host.ends_with(".rebind.test") {
            return spillway_core::egress::SystemResolver.resolve(host, port);
        }
        let rebound = self.rebound.lock().expect("not poisoned").contains(host);
        Ok(vec![if rebound { "127.0.0.1" } else { "127.0.0.2" }
            .parse()
            .expect("an address")])
    }
}

fn rebinding() -> std::sync::Arc<Rebinding> {
    static REBINDING: std::sync::OnceLock<std::sync::Arc<Rebinding>> = std::sync::OnceLock::new();
    REBINDING
        .get_or_init(|| {
            let resolver = std::sync::Arc::new(Rebinding {
                rebound: Default::default(),
            });
            spillway_core::egress::set_resolver(resolver.clone());
            resolver
        })
        .clone()
}

impl Rebinding {
    fn rebind(&self, host: &str) {
        self.rebound
            .lock()
            .expect("not poisoned")
            .insert(host.to_owned());
    }
}

/// Waits until task 0 of `connector` is FAILED with a trace holding every one of `parts`.
async fn wait_for_failed_task(client: &Client, connector: &str, parts: &[&str]) -> String {
    let status = client
        .wait_for(&format!("/connectors/{connector}/status"), WAIT, |s| {
            let task = &s["tasks"][0];
            let trace = task["trace"].as_str().unwrap_or_default();
            task["state"] == "FAILED" && parts.iter().all(|p| trace.contains(p))
        })
        .await;
    status["tasks"][0]["trace"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// DNS rebinding: a tenant's host name resolved to an address the worker allows when the
/// connector was validated and created, and to loopback when the sink connected (the HTTP
/// sink aimed at the worker's own REST API, as in finding 8). The sink connects to the address
/// the egress policy judges at connection time, so the connection is refused and the task
/// FAILS naming the host, the address and `tenant.egress.allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_sinks_host_rebound_to_loopback_after_validation_is_refused_at_connect() {
    let rebinding = rebinding();
    let broker = broker();
    broker.create_topic("rebind-http", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut extra = auth();
    extra.push(("tenant.egress.allow", "127.0.0.2/32"));
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &extra).await;
    let acme = tenant(&anonymous, json!({"name": "acme"})).await;
    let host = "http.rebind.test";
    let url = format!("http://{host}:{}/connectors", worker.address().port());
    let created = acme
        .post(
            "/connectors",
            json!({"name": "h", "config": {"connector.class": "http", "topics": "rebind-http",
                   "http.url": url, "retry.max.attempts": "1"}}),
        )
        .await;
    assert_eq!(
        created.status, 201,
        "allowed at validation: {}",
        created.text
    );
    rebinding.rebind(host);
    produce(
        &broker.bootstrap(),
        "rebind-http",
        numbered_records(1, 8, 1),
        "none",
    )
    .await;
    let trace = wait_for_failed_task(&acme, "h", &[host, "127.0.0.1", "tenant.egress.allow"]).await;
    assert!(trace.contains("loopback"), "{trace}");
    worker.stop().await;
}

/// DNS rebinding for the PostgreSQL sink: the name allowed at validation resolves to loopback
/// when the task starts; the pool is pinned to the judged address, so the task FAILS at start
/// naming the host, the address and `tenant.egress.allow` instead of connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_sinks_host_rebound_to_loopback_after_validation_is_refused_at_connect() {
    let rebinding = rebinding();
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut extra = auth();
    extra.push(("tenant.egress.allow", "127.0.0.2/32"));
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &extra).await;
    let acme = tenant(&anonymous, json!({"name": "acme"})).await;
    let host = "pg.rebind.test";
    let created = acme
        .post(
            "/connectors",
            json!({"name": "pg", "config": {"connector.class": "postgres", "topics": "t",
                   "connection.url": format!("postgres://postgres@{host}:5432/postgres"),
                   "consumer.override.group.protocol": "share"}}),
        )
        .await;
    assert_eq!(
        created.status, 201,
        "allowed at validation: {}",
        created.text
    );
    // The task starts with the name at 127.0.0.2, where nothing listens.
    wait_for_failed_task(&acme, "pg", &[host, "cannot connect"]).await;
    rebinding.rebind(host);
    // Restarting the task alone (not the connector, whose start checks would refuse the name
    // before any task runs) makes the task resolve and connect again.
    let restarted = acme.post_empty("/connectors/pg/tasks/0/restart").await;
    assert!(restarted.status < 300, "{}", restarted.text);
    wait_for_failed_task(&acme, "pg", &[host, "127.0.0.1", "tenant.egress.allow"]).await;
    worker.stop().await;
}

/// Forwards every connection to `127.0.0.2:<port>` to `upstream`, unchanged: a cluster at an
/// address the worker allows whose Metadata advertises brokers at one it does not.
async fn forward_from_127_0_0_2(upstream: String) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("127.0.0.2 is a loopback address on Linux");
    let port = listener.local_addr().expect("bound").port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    port
}

/// Finding 8 for Kafka (share mode): a tenant under `All` names a cluster at an address the
/// worker allows (127.0.0.2), whose Metadata advertises its broker at 127.0.0.1 — the worker's
/// own machine, not in `tenant.egress.allow`. Validation sees only the bootstrap address; the
/// native client vets every broker it dials, so the task FAILS (no restart loop) naming the
/// advertised broker, its address and `tenant.egress.allow`. The admin's connector on the same
/// cluster, under no egress policy, copies its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_a_tenants_cluster_advertises_are_held_to_the_egress_policy() {
    let broker = broker();
    broker.create_topic("egress-kafka", 1);
    produce(
        &broker.bootstrap(),
        "egress-kafka",
        numbered_records(8, 16, 1),
        "none",
    )
    .await;
    let upstream = broker
        .bootstrap()
        .split(',')
        .next()
        .expect("a broker")
        .to_owned();
    let port = forward_from_127_0_0_2(upstream).await;
    let allowed_bootstrap = format!("127.0.0.2:{port}");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut extra = auth();
    extra.push(("tenant.egress.allow", "127.0.0.2/32"));
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &extra).await;
    let acme = acme_under_all(&anonymous).await;
    let config = |file: &str| {
        json!({"connector.class": "file", "topics": "egress-kafka", "file": file,
               "consumer.override.group.protocol": "share",
               "consumer.override.bootstrap.servers": allowed_bootstrap})
    };
    let started = Instant::now();
    let created = acme
        .post(
            "/connectors",
            json!({"name": "k", "config": config("out.txt")}),
        )
        .await;
    assert_eq!(
        created.status, 201,
        "the bootstrap address is allowed: {}",
        created.text
    );
    let trace = wait_for_failed_task(&acme, "k", &["127.0.0.1", "tenant.egress.allow"]).await;
    assert!(trace.contains("loopback"), "{trace}");
    eprintln!("refused and FAILED after {:?}", started.elapsed());
    let status = acme.get("/connectors/k/status").await;
    assert_eq!(
        status.body["tasks"][0]["state"], "FAILED",
        "{}",
        status.text
    );
    // Classic mode (librdkafka, which dials on its own): the advertised brokers are judged
    // through the native client before the consumer starts.
    let mut classic = config("classic.txt");
    classic["consumer.override.group.protocol"] = json!("classic");
    let created = acme
        .post("/connectors", json!({"name": "c", "config": classic}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let trace = wait_for_failed_task(&acme, "c", &["127.0.0.1", "tenant.egress.allow"]).await;
    assert!(trace.contains("loopback"), "{trace}");
    // The kafka sink's target and the dead letter queue producer (librdkafka) on a cluster the
    // tenant names: judged the same way before the task runs.
    let target = json!({"connector.class": "kafka", "topics": "egress-kafka",
                        "target.bootstrap.servers": allowed_bootstrap,
                        "consumer.override.group.protocol": "share"});
    let created = acme
        .post("/connectors", json!({"name": "t", "config": target}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let trace = wait_for_failed_task(&acme, "t", &["127.0.0.1", "tenant.egress.allow"]).await;
    assert!(trace.contains("target.bootstrap.servers"), "{trace}");
    let dead_letters = json!({"connector.class": "file", "topics": "egress-kafka",
                              "file": "dlq.txt", "consumer.override.group.protocol": "share",
                              "errors.tolerance": "all",
                              "errors.deadletterqueue.topic.name": "egress-dlq",
                              "producer.override.bootstrap.servers": allowed_bootstrap});
    let created = acme
        .post("/connectors", json!({"name": "d", "config": dead_letters}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let trace = wait_for_failed_task(&acme, "d", &["127.0.0.1", "tenant.egress.allow"]).await;
    assert!(trace.contains("loopback"), "{trace}");

    let admin = anonymous.with_token(ADMIN_TOKEN);
    let out = dir.path().join("admin-out.txt");
    let created = admin
        .post(
            "/connectors",
            json!({"name": "open", "config": config(out.to_str().expect("utf-8"))}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let start = Instant::now();
    while lines_in(&out) < 8 {
        if start.elapsed() > WAIT {
            let status = admin.get("/connectors/open/status").await;
            panic!(
                "the admin's connector copied {} records: {}",
                lines_in(&out),
                status.text
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop().await;
}

/// Finding 4 under policy `All`: a tenant trusted with cluster overrides still may not point
/// its consumer, dead letter queue producer or admin client at the worker's own network
/// (`consumer.override.bootstrap.servers`, librdkafka's `metadata.broker.list`): the egress
/// policy holds them on validate and create, as it does the kafka sink's target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_overrides_of_a_tenant_under_all_are_held_to_the_egress_policy() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let acme = acme_under_all(&anonymous).await;
    let out = "out.txt";
    for key in [
        "consumer.override.bootstrap.servers",
        "consumer.override.metadata.broker.list",
        "producer.override.bootstrap.servers",
        "producer.override.metadata.broker.list",
        "admin.override.bootstrap.servers",
    ] {
        let mut config = json!({"name": "o", "connector.class": "file", "topics": "t",
                                "file": out});
        config[key] = json!(broker.bootstrap());
        let answer = acme
            .put("/connector-plugins/file/config/validate", config.clone())
            .await;
        assert_eq!(answer.body["error_count"], 1, "{key}: {}", answer.text);
        assert!(
            answer.text.contains(key) && answer.text.contains("tenant.egress.allow"),
            "{key}: {}",
            answer.text
        );
        let created = acme
            .post("/connectors", json!({"name": "o", "config": config}))
            .await;
        assert!(created.assert_error(400).contains(key), "{}", created.text);
    }
    worker.stop().await;
}

/// The open-file and thread limits of this process: what the worker weighs tasks against.
fn process_limits() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("linux");
    let soft = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().next().map(str::to_owned))
            .map(|v| v.parse::<u64>().unwrap_or(u64::MAX))
            .expect("a limit")
    };
    let kernel_threads = std::fs::read_to_string("/proc/sys/kernel/threads-max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    (
        soft("Max open files"),
        soft("Max processes").min(kernel_threads),
    )
}

/// Issue 19, done when "a worker with 2,000 tasks stays within its limits": 2,000 share-mode
/// tasks (1 descriptor, no thread each) fit the default limits; classic tasks (a librdkafka
/// consumer each: 10 descriptors, 6 threads) are taken while the process's limits hold them and
/// the excess is refused with a 400 naming the limit, the weights and the figures. Paused
/// connectors: counted and stored, nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_tasks_are_weighed_by_mode_against_the_worker_limits() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    for i in 0..32 {
        let tasks = if i < 31 { 64 } else { 16 };
        let created = admin
            .post("/connectors", file_sink(&format!("s{i}"), "s.txt", tasks))
            .await;
        assert_eq!(created.status, 201, "share connector {i}: {}", created.text);
    }
    let over = admin
        .post("/connectors", file_sink("s-over", "s.txt", 1))
        .await;
    assert!(over.assert_error(400).contains("tasks.max.per.worker"));
    worker.stop().await;

    let (worker, anonymous) = start_on(&broker, &dir.path().join("classic"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let (open_files, threads) = process_limits();
    let holds = 2000
        .min(open_files.saturating_sub(256) / 10)
        .min(threads.saturating_sub(256) / 6);
    let mut accepted = 0;
    let mut refusal = None;
    for i in 0..32 {
        let mut classic = file_sink(&format!("c{i}"), "c.txt", 64);
        classic["config"]["consumer.override.group.protocol"] = json!("classic");
        let created = admin.post("/connectors", classic).await;
        if created.status == 201 {
            accepted += 64;
        } else {
            refusal = Some(created.assert_error(400).to_owned());
            break;
        }
    }
    let refusal = refusal.expect("2,048 tasks are more than tasks.max.per.worker");
    assert!(
        accepted <= holds && accepted + 64 > holds,
        "{accepted} classic tasks taken, the limits hold {holds}: {refusal}"
    );
    if holds < 2000 {
        assert!(
            refusal.contains("10 descriptors and 6 threads")
                && (refusal.contains("open-file limit") || refusal.contains("thread limit")),
            "{refusal}"
        );
    }
    let health = admin.get("/health").await;
    assert_eq!(health.body["status"], "healthy", "{}", health.text);
    worker.stop().await;
}

/// Finding 11: `consumer.override.max.poll.records=abc` passed validate and create, then failed
/// at start. Validate and create now read every client value as starting would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_and_create_read_client_values_as_start_would() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, client) = start_worker_with(&broker, &dir.path().join("state"), &[]).await;
    let out = dir.path().join("out.txt").display().to_string();
    for (mode, key, value) in [
        ("share", "consumer.override.max.poll.records", "abc"),
        ("classic", "consumer.override.max.poll.records", "abc"),
        ("classic", "consumer.override.fetch.wait.max.ms", "soon"),
        ("classic", "consumer.override.no.such.setting", "1"),
        ("share", "producer.override.linger.ms", "later"),
    ] {
        let config = json!({"name": "v", "connector.class": "file", "topics": "t",
            "file": out, "consumer.override.group.protocol": mode, key: value,
            "errors.tolerance": "all", "errors.deadletterqueue.topic.name": "dlq"});
        let validated = client
            .put("/connector-plugins/file/config/validate", config.clone())
            .await;
        assert_eq!(
            validated.body["error_count"], 1,
            "{key}: {}",
            validated.text
        );
        let entry = validated.body["configs"]
            .as_array()
            .expect("configs")
            .iter()
            .find(|c| c["value"]["name"] == key)
            .unwrap_or_else(|| panic!("{key} is reported: {}", validated.text));
        assert!(
            !entry["value"]["errors"]
                .as_array()
                .expect("errors")
                .is_empty(),
            "{entry}"
        );
        let refused = client
            .post("/connectors", json!({"name": "v", "config": config}))
            .await;
        assert!(refused.assert_error(400).contains(key));
    }
    worker.stop().await;
}

/// Reads `topic` through a read_committed share group until `expected` distinct source
/// offsets were seen (or the wait ends); returns them.
async fn committed_sources(
    broker: &spillway_tests::DevBroker,
    topic: &str,
    expected: usize,
) -> BTreeSet<i64> {
    let mut config = ShareConsumerConfig::new(&broker.bootstrap(), &format!("reader-{topic}"));
    config.max_poll_records = 500;
    let mut consumer = ShareConsumer::connect(config)
        .await
        .expect("the reader connects");
    consumer.subscribe(&[topic]);
    let mut found = BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while found.len() < expected && Instant::now() < deadline {
        let Ok(records) = consumer.poll(Duration::from_millis(300)).await else {
            continue;
        };
        for r in &records {
            let offset = r
                .headers
                .iter()
                .find(|(k, _)| k == "spillway.source.offset")
                .and_then(|(_, v)| v.as_ref())
                .and_then(|v| String::from_utf8_lossy(v).parse().ok())
                .expect("a source offset header");
            found.insert(offset);
        }
        let _ = consumer.acknowledge_all(&records, AcknowledgeType::Accept);
        if !records.is_empty() {
            let _ = consumer.commit_sync(Duration::from_secs(5)).await;
        }
    }
    let _ = consumer.close().await;
    found
}

/// Finding 5: the kafka sink derived its transactional id, ledger topic and cache directory
/// from a `tenant` key nothing set, so two tenants' exactly-once connectors named alike shared
/// them and the second copied 0 of 31 records while RUNNING. Now both copy everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_exactly_once_sinks_of_one_name_both_copy_every_record() {
    const RECORDS: usize = 31;
    let broker = broker();
    broker.set_share_isolation_level(true);
    broker.set_share_record_lock_duration(30_000);
    // Every ledger either version would use, so only shared state can make one copy fail.
    for topic in [
        "src",
        "acme-out.src",
        "globex-out.src",
        "__spillway_eos_ledger.copy",
        "acme.__spillway_eos_ledger.copy",
        "globex.__spillway_eos_ledger.copy",
    ] {
        broker.create_topic(topic, 1);
    }
    produce(
        &broker.bootstrap(),
        "src",
        numbered_records(RECORDS as u64, 8, 1),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let (worker, anonymous) = start_worker_with(&broker, &state, &auth()).await;
    // One after the other, as in the finding: the second starts while the first runs.
    let mut tenants = Vec::new();
    for name in ["acme", "globex"] {
        let client = tenant(&anonymous, json!({"name": name})).await;
        let created = client
            .post(
                "/connectors",
                json!({"name": "copy", "config": {"connector.class": "kafka", "topics": "src",
                    "topic.rename.format": format!("{name}-out.${{topic}}"),
                    "delivery.guarantee": "exactly_once",
                    // Classic mode: where a partition resumes is the checkpoint the ledger
                    // holds under the connector's key, which is where the tenants met.
                    "consumer.override.group.protocol": "classic"}}),
            )
            .await;
        assert_eq!(created.status, 201, "{}", created.text);
        let copied = committed_sources(&broker, &format!("{name}-out.src"), RECORDS).await;
        let status = client.get("/connectors/copy/status").await;
        assert_eq!(
            copied.len(),
            RECORDS,
            "tenant {name} copied {} of {RECORDS} records; status {}",
            copied.len(),
            status.text
        );
        tenants.push((name, client));
    }
    // Neither fenced the other: both still run, their tasks never restarted.
    for (name, client) in &tenants {
        let status = client.get("/connectors/copy/status").await;
        assert_eq!(
            status.body["tasks"][0]["state"], "RUNNING",
            "{name}: {}",
            status.text
        );
    }
    // Each tenant's ledger cache lives in its own directory.
    for (name, _) in &tenants {
        let cache: PathBuf = state.join("tenant-files").join(name).join(".spillway-eos");
        let entries: Vec<String> = std::fs::read_dir(&cache)
            .unwrap_or_else(|e| panic!("{}: {e}", cache.display()))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries, [format!("{name}.spillway-copy-0")]);
    }
    worker.stop().await;
}
