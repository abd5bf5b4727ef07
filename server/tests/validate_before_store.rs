//! Config checked once, before it is stored (issue 14, item 7): every refusal the worker makes
//! when it starts a connector is reported by `PUT /connector-plugins/{class}/config/validate`
//! (Connect's shape: `error_count` and the errors on the key) and refused by `POST
//! /connectors` and `PUT /connectors/{name}/config` with a 400 `{error_code, message}` naming
//! the key, so a stored configuration always starts. Group id collisions are asked of the
//! cluster (through the test-kit proxy's emulation of Kafka's one group namespace) and of the
//! other stored connectors.

mod support;

use std::time::Duration;

use serde_json::{json, Value as Json};
use spillway_tests::kafka_proxy::{KafkaProxy, ProxyOptions, ProxySecurity};
use spillway_tests::{numbered_records, produce};
use support::{broker, start_worker, start_worker_with, Client};

/// A file sink reading `topics`, with `extra` keys.
fn file_sink(dir: &std::path::Path, name: &str, extra: &[(&str, &str)]) -> Json {
    let mut config = serde_json::Map::new();
    config.insert("connector.class".into(), json!("file"));
    config.insert("name".into(), json!(name));
    config.insert("topics".into(), json!("orders"));
    config.insert(
        "file".into(),
        json!(dir.join(format!("{name}.txt")).display().to_string()),
    );
    for (k, v) in extra {
        config.insert((*k).into(), json!(v));
    }
    Json::Object(config)
}

/// The errors `validate` reports on `key`.
fn errors_on(report: &Json, key: &str) -> Vec<String> {
    report["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .filter(|c| c["value"]["name"] == key)
        .flat_map(|c| c["value"]["errors"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e.as_str().map(str::to_owned))
        .collect()
}

/// `config` is reported by validate on `key` (the error containing `says`) and refused by
/// create and by update, naming the key; nothing is stored.
async fn refused_everywhere(api: &Client, config: Json, key: &str, says: &str) {
    let name = config["name"].as_str().expect("a name").to_owned();
    let report = api
        .put("/connector-plugins/file/config/validate", config.clone())
        .await;
    assert_eq!(report.status, 200, "{}", report.text);
    assert!(
        report.body["error_count"].as_u64().unwrap_or(0) >= 1,
        "{}",
        report.text
    );
    let on_key = errors_on(&report.body, key);
    assert!(
        on_key.iter().any(|e| e.contains(says)),
        "validate reports {key} ({says}): {}",
        report.text
    );
    let created = api
        .post(
            "/connectors",
            json!({"name": name, "config": config.clone()}),
        )
        .await;
    let message = created.assert_error(400);
    assert!(message.contains(key) && message.contains(says), "{message}");
    api.get(&format!("/connectors/{name}"))
        .await
        .assert_error(404);
    let put = api
        .put(&format!("/connectors/{name}/config"), config.clone())
        .await;
    let message = put.assert_error(400);
    assert!(message.contains(key) && message.contains(says), "{message}");
    api.get(&format!("/connectors/{name}"))
        .await
        .assert_error(404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_time_refusal_is_reported_by_validate_and_refused_by_create_and_update() {
    let broker = broker();
    broker.create_topic("orders", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let out = dir.path();

    // Share mode subscribes to names: topics.regex is refused.
    let mut regex = file_sink(
        out,
        "by-pattern",
        &[("consumer.override.group.protocol", "share")],
    );
    regex.as_object_mut().expect("object").remove("topics");
    regex["topics.regex"] = json!("ord.*");
    refused_everywhere(&api, regex, "topics.regex", "list them in topics").await;

    // A consumer-only key in share mode names where the setting lives for a share group.
    refused_everywhere(
        &api,
        file_sink(
            out,
            "static",
            &[
                ("consumer.override.group.protocol", "share"),
                ("consumer.override.group.instance.id", "box-1"),
            ],
        ),
        "consumer.override.group.instance.id",
        "share groups have no static membership",
    )
    .await;

    // A share setting the share consumer cannot honour.
    refused_everywhere(
        &api,
        file_sink(
            out,
            "implicit",
            &[
                ("consumer.override.group.protocol", "share"),
                ("consumer.override.share.acknowledgement.mode", "implicit"),
            ],
        ),
        "consumer.override.share.acknowledgement.mode",
        "share mode takes only explicit",
    )
    .await;

    // A consumer setting the classic client refuses.
    refused_everywhere(
        &api,
        file_sink(
            out,
            "typo",
            &[("consumer.override.fetch.wait.max.mss", "10")],
        ),
        "consumer.override.fetch.wait.max.mss",
        "the Kafka client refuses it",
    )
    .await;

    // A security file the client cannot read (classic mode reads it when it starts too).
    refused_everywhere(
        &api,
        file_sink(
            out,
            "secured",
            &[
                ("consumer.override.security.protocol", "SSL"),
                ("consumer.override.ssl.ca.location", "/nonexistent/ca.pem"),
            ],
        ),
        "consumer.override.ssl.ca.location",
        "/nonexistent/ca.pem",
    )
    .await;

    // Another stored connector holds the id as the other type of group (checked without the
    // broker, so it holds while the cluster is away): refused both ways.
    let classic = api
        .post(
            "/connectors",
            json!({"name": "ledger", "config": file_sink(out, "ledger", &[("consumer.override.group.id", "shared")]), "initial_state": "STOPPED"}),
        )
        .await;
    assert_eq!(classic.status, 201, "{}", classic.text);
    refused_everywhere(
        &api,
        file_sink(
            out,
            "queue",
            &[
                ("consumer.override.group.protocol", "share"),
                ("consumer.override.group.id", "shared"),
            ],
        ),
        "consumer.override.group.id",
        "connector 'ledger' uses 'shared' as a consumer group id",
    )
    .await;

    // An update that would break a stored connector is refused and leaves it as it was.
    let update = api
        .put(
            "/connectors/ledger/config",
            file_sink(
                out,
                "ledger",
                &[
                    ("consumer.override.group.id", "shared"),
                    ("consumer.override.group.protocol", "share"),
                    ("consumer.override.isolation.level", "read_committed"),
                    ("consumer.override.group.instance.id", "box-1"),
                ],
            ),
        )
        .await;
    let message = update.assert_error(400);
    assert!(
        message.contains("consumer.override.group.instance.id"),
        "{message}"
    );
    let stored = api.get("/connectors/ledger/config").await;
    assert!(
        stored
            .body
            .get("consumer.override.group.protocol")
            .is_none(),
        "{}",
        stored.text
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_id_another_type_of_group_holds_on_the_cluster_is_refused_before_it_is_stored() {
    let broker = broker();
    broker.create_topic("orders", 1);
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_one_group_namespace(),
    )
    .expect("proxy starts");
    produce(
        &broker.bootstrap(),
        "orders",
        numbered_records(20, 8, 1),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let bootstrap = proxy.bootstrap();
    let (worker, api) = start_worker_with(
        &broker,
        &dir.path().join("state"),
        &[("bootstrap.servers", &bootstrap)],
    )
    .await;
    let out = dir.path();

    // A share connector runs on its default id connect-share-queue.
    let queue = api
        .post(
            "/connectors",
            json!({"name": "queue", "config": file_sink(out, "queue", &[("consumer.override.group.protocol", "share")])}),
        )
        .await;
    assert_eq!(queue.status, 201, "{}", queue.text);
    let groups = proxy.groups().expect("namespace emulated");
    let start = std::time::Instant::now();
    while groups.members("connect-share-queue") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the share connector never joined"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A classic connector on that id would be refused its JoinGroup by Kafka: not stored.
    // The cluster's address spelled another way keeps the check against the other stored
    // connectors out of it: only the cluster can tell (as for a group another worker runs).
    let respelled = bootstrap.replace("127.0.0.1", "localhost");
    let explicit = file_sink(
        out,
        "ledger",
        &[
            ("consumer.override.group.id", "connect-share-queue"),
            ("consumer.override.bootstrap.servers", &respelled),
        ],
    );
    let report = api
        .put("/connector-plugins/file/config/validate", explicit.clone())
        .await;
    assert_eq!(report.body["error_count"], 1, "{}", report.text);
    let on_key = errors_on(&report.body, "consumer.override.group.id");
    assert!(
        on_key.iter().any(
            |e| e.contains("'connect-share-queue' is held by a share group")
                && e.contains("it has members now")
        ),
        "{}",
        report.text
    );
    let created = api
        .post("/connectors", json!({"name": "ledger", "config": explicit}))
        .await;
    let message = created.assert_error(400);
    assert!(
        message.contains("consumer.override.group.id")
            && message.contains("kafka-share-groups.sh --delete --group connect-share-queue"),
        "{message}"
    );
    api.get("/connectors/ledger").await.assert_error(404);

    // The connector rolled back with its defaults takes connect-queue: accepted and running.
    let rolled = api
        .put("/connectors/queue/config", file_sink(out, "queue", &[]))
        .await;
    assert_eq!(rolled.status, 200, "{}", rolled.text);
    let status = api
        .wait_for("/connectors/queue/status", Duration::from_secs(30), |s| {
            s["tasks"][0]["state"] == "RUNNING"
        })
        .await;
    assert_eq!(status["connector"]["state"], "RUNNING", "{status}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_whose_cluster_cannot_be_asked_is_stored_and_checked_again_at_start() {
    let broker = broker();
    broker.create_topic("orders", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    // Nothing listens there: the group id cannot be checked, which is no reason to refuse.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("address");
    let config = file_sink(
        dir.path(),
        "away",
        &[
            ("consumer.override.group.protocol", "share"),
            (
                "consumer.override.bootstrap.servers",
                &unreachable.to_string(),
            ),
        ],
    );
    let started = std::time::Instant::now();
    let report = api
        .put("/connector-plugins/file/config/validate", config.clone())
        .await;
    assert_eq!(report.body["error_count"], 0, "{}", report.text);
    let created = api
        .post(
            "/connectors",
            json!({"name": "away", "config": config, "initial_state": "STOPPED"}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the check gives up quickly: {:?}",
        started.elapsed()
    );
    worker.stop().await;
}
