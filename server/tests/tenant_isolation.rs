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
    let acme = tenant(
        &anonymous,
        json!({"name": "acme", "client.config.override.policy": "All"}),
    )
    .await;
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
    let acme = tenant(
        &anonymous,
        json!({"name": "acme", "client.config.override.policy": "All"}),
    )
    .await;
    for target in targets.iter().filter(|t| !t.2.contains("169.254")) {
        let answer = validate(&acme, target).await;
        assert_eq!(answer.body["error_count"], 0, "{target:?}: {}", answer.text);
    }
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
