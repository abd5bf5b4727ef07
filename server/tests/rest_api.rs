//! Every endpoint of the Connect-compatible REST API, with its error paths, against a worker
//! serving in this process on a dev broker.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value as Json};
use support::{broker, start_worker};

const WAIT: Duration = Duration::from_secs(30);

fn file_sink(name: &str, topic: &str, file: &std::path::Path) -> Json {
    json!({
        "name": name,
        "config": {
            "connector.class": "FileStreamSink",
            "topics": topic,
            "file": file.display().to_string(),
        }
    })
}

fn state(body: &Json) -> &str {
    body["connector"]["state"].as_str().unwrap_or_default()
}

fn task_states(body: &Json) -> Vec<String> {
    body["tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .map(|t| t["state"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_goes_through_its_whole_life_over_connects_api() {
    let broker = broker();
    broker.create_topic("orders", 2);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let out = dir.path().join("out.txt");

    let root = api.get("/").await;
    assert_eq!(root.status, 200);
    assert_eq!(root.body["version"], env!("CARGO_PKG_VERSION"));
    assert!(root.body.get("kafka_cluster_id").is_some(), "{}", root.text);
    let health = api.get("/health").await;
    assert_eq!(
        (health.status, health.body["status"].as_str()),
        (200, Some("healthy"))
    );
    assert_eq!(api.get("/connectors").await.body, json!([]));

    // Create; a second create of the same name is a conflict.
    let created = api
        .post("/connectors", file_sink("files", "orders", &out))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.body["name"], "files");
    assert_eq!(created.body["type"], "sink");
    assert_eq!(created.body["config"]["topics"], "orders");
    assert_eq!(created.body["config"]["name"], "files");
    let again = api
        .post("/connectors", file_sink("files", "orders", &out))
        .await;
    assert!(again.assert_error(409).contains("files"));

    let status = api
        .wait_for("/connectors/files/status", WAIT, |s| {
            state(s) == "RUNNING" && task_states(s) == ["RUNNING"]
        })
        .await;
    assert_eq!(status["type"], "sink");
    assert_eq!(
        status["connector"]["worker_id"],
        format!("127.0.0.1:{}", worker.address().port())
    );
    assert_eq!(status["tasks"][0]["id"], 0);
    let info = api.get("/connectors/files").await;
    assert_eq!(info.status, 200);
    assert_eq!(
        info.body["tasks"],
        json!([{"connector": "files", "task": 0}])
    );
    assert_eq!(api.get("/connectors").await.body, json!(["files"]));
    let expanded = api.get("/connectors?expand=status&expand=info").await;
    assert_eq!(state(&expanded.body["files"]["status"]), "RUNNING");
    assert_eq!(expanded.body["files"]["info"]["name"], "files");
    let only_info = api.get("/connectors?expand=info").await;
    assert!(
        only_info.body["files"].get("status").is_none(),
        "{}",
        only_info.text
    );

    // Tasks and their status.
    let tasks = api.get("/connectors/files/tasks").await;
    assert_eq!(
        tasks.body[0]["id"],
        json!({"connector": "files", "task": 0})
    );
    assert_eq!(tasks.body[0]["config"]["task.id"], "0");
    assert_eq!(
        api.get("/connectors/files/tasks/0/status").await.body["state"],
        "RUNNING"
    );
    api.get("/connectors/files/tasks/7/status")
        .await
        .assert_error(404);
    api.get("/connectors/files/tasks/x/status")
        .await
        .assert_error(404);

    // Configuration: GET, PATCH (null removes), PUT (200 update, 201 create, name mismatch 400).
    let config = api.get("/connectors/files/config").await;
    assert_eq!(config.body["file"], out.display().to_string());
    let patched = api
        .patch(
            "/connectors/files/config",
            json!({"errors.log.enable": "true", "tasks.max": 2}),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    assert_eq!(patched.body["config"]["errors.log.enable"], "true");
    api.wait_for("/connectors/files/status", WAIT, |s| {
        task_states(s) == ["RUNNING", "RUNNING"]
    })
    .await;
    let removed = api
        .patch(
            "/connectors/files/config",
            json!({"errors.log.enable": null, "tasks.max": "1"}),
        )
        .await;
    assert_eq!(removed.status, 200, "{}", removed.text);
    let config = api.get("/connectors/files/config").await;
    assert!(
        config.body.get("errors.log.enable").is_none(),
        "{}",
        config.text
    );
    assert_eq!(config.body["tasks.max"], "1");
    let mut whole = file_sink("files", "orders", &out)["config"].clone();
    whole["file.fsync"] = json!("true");
    let updated = api.put("/connectors/files/config", whole.clone()).await;
    assert_eq!(updated.status, 200, "{}", updated.text);
    assert_eq!(updated.body["config"]["file.fsync"], "true");
    whole["name"] = json!("other");
    api.put("/connectors/files/config", whole.clone())
        .await
        .assert_error(400);
    let created = api.put("/connectors/other/config", whole.clone()).await;
    assert_eq!(created.status, 201, "{}", created.text);
    api.patch("/connectors/missing/config", json!({"a": "b"}))
        .await
        .assert_error(404);

    // Pause, resume, stop.
    assert_eq!(api.put_empty("/connectors/files/pause").await.status, 202);
    let paused = api.get("/connectors/files/status").await;
    assert_eq!(state(&paused.body), "PAUSED");
    assert_eq!(task_states(&paused.body), ["PAUSED"]);
    assert_eq!(api.put_empty("/connectors/files/resume").await.status, 202);
    api.wait_for("/connectors/files/status", WAIT, |s| {
        state(s) == "RUNNING" && task_states(s) == ["RUNNING"]
    })
    .await;
    assert_eq!(api.put_empty("/connectors/files/stop").await.status, 204);
    assert_eq!(
        api.put_empty("/connectors/files/stop").await.status,
        204,
        "stop is idempotent"
    );
    let stopped = api.get("/connectors/files/status").await;
    assert_eq!(state(&stopped.body), "STOPPED");
    assert_eq!(stopped.body["tasks"], json!([]));
    assert_eq!(api.get("/connectors/files").await.body["tasks"], json!([]));
    assert_eq!(api.get("/connectors/files/tasks").await.body, json!([]));
    assert_eq!(api.put_empty("/connectors/files/resume").await.status, 202);
    api.wait_for("/connectors/files/status", WAIT, |s| state(s) == "RUNNING")
        .await;

    // Restarts.
    assert_eq!(
        api.post_empty("/connectors/files/restart").await.status,
        204
    );
    let restarting = api
        .post_empty("/connectors/files/restart?includeTasks=true")
        .await;
    assert_eq!(restarting.status, 202, "{}", restarting.text);
    assert_eq!(state(&restarting.body), "RESTARTING");
    api.wait_for("/connectors/files/status", WAIT, |s| {
        state(s) == "RUNNING" && task_states(s) == ["RUNNING"]
    })
    .await;
    let nothing_failed = api
        .post_empty("/connectors/files/restart?includeTasks=true&onlyFailed=true")
        .await;
    assert_eq!(nothing_failed.status, 202);
    assert_eq!(
        state(&nothing_failed.body),
        "RUNNING",
        "nothing failed, nothing restarts"
    );
    api.post_empty("/connectors/files/restart?includeTasks=perhaps")
        .await
        .assert_error(400);
    assert_eq!(
        api.post_empty("/connectors/files/tasks/0/restart")
            .await
            .status,
        204
    );
    api.post_empty("/connectors/files/tasks/5/restart")
        .await
        .assert_error(404);

    // Topics and offsets.
    assert_eq!(
        api.get("/connectors/files/topics").await.body,
        json!({"files": {"topics": ["orders"]}})
    );
    let offsets = api.get("/connectors/files/offsets").await;
    assert_eq!(offsets.status, 200, "{}", offsets.text);
    assert_eq!(
        offsets.body,
        json!({"offsets": []}),
        "classic mode, nothing consumed yet"
    );
    let shared = api
        .patch(
            "/connectors/other/config",
            json!({"consumer.override.group.protocol": "share"}),
        )
        .await;
    assert_eq!(shared.status, 200, "{}", shared.text);
    let offsets = api.get("/connectors/other/offsets").await;
    assert_eq!(offsets.status, 200, "{}", offsets.text);
    assert_eq!(offsets.body["offsets"], json!([]));
    let message = offsets.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("share group 'connect-share-other'"),
        "{}",
        offsets.text
    );

    // Delete.
    assert_eq!(api.delete("/connectors/files").await.status, 204);
    let message = api
        .get("/connectors/files")
        .await
        .assert_error(404)
        .to_owned();
    assert!(message.contains("files"), "{message}");
    api.delete("/connectors/files").await.assert_error(404);
    for path in ["/config", "/status", "/tasks", "/topics", "/offsets"] {
        api.get(&format!("/connectors/files{path}"))
            .await
            .assert_error(404);
    }
    for path in ["/pause", "/resume", "/stop"] {
        api.put_empty(&format!("/connectors/files{path}"))
            .await
            .assert_error(404);
    }
    api.post_empty("/connectors/files/restart")
        .await
        .assert_error(404);
    assert_eq!(api.get("/connectors").await.body, json!(["other"]));
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_connector_shows_its_committed_offsets_and_a_failed_task_can_be_restarted() {
    let broker = broker();
    broker.create_topic("ledger", 1);
    spillway_tests::produce(
        &broker.bootstrap(),
        "ledger",
        spillway_tests::numbered_records(20, 16, 1),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let mut classic = file_sink("ledger-files", "ledger", &dir.path().join("ledger.txt"));
    classic["config"]["consumer.override.group.protocol"] = json!("classic");
    classic["config"]["consumer.override.auto.offset.reset"] = json!("earliest");
    assert_eq!(api.post("/connectors", classic).await.status, 201);
    let offsets = api
        .wait_for(
            "/connectors/ledger-files/offsets",
            Duration::from_secs(60),
            |o| o["offsets"].as_array().is_some_and(|a| !a.is_empty()),
        )
        .await;
    assert_eq!(
        offsets["offsets"][0]["partition"],
        json!({"kafka_topic": "ledger", "kafka_partition": 0})
    );
    assert!(
        offsets["offsets"][0]["offset"]["kafka_offset"]
            .as_i64()
            .is_some(),
        "{offsets}"
    );

    // A file in a missing directory fails the task (restarts are off in the tests' worker).
    let broken = file_sink("broken", "ledger", &dir.path().join("no/such/dir/out.txt"));
    assert_eq!(api.post("/connectors", broken).await.status, 201);
    let failed = api
        .wait_for("/connectors/broken/status", WAIT, |s| {
            task_states(s) == ["FAILED"]
        })
        .await;
    assert!(
        failed["tasks"][0]["trace"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{failed}"
    );
    let task = api.get("/connectors/broken/tasks/0/status").await;
    assert_eq!(task.body["state"], "FAILED");
    let restarting = api
        .post_empty("/connectors/broken/restart?includeTasks=true&onlyFailed=true")
        .await;
    assert_eq!(restarting.status, 202, "{}", restarting.text);
    assert_eq!(task_states(&restarting.body), ["RESTARTING"]);
    api.wait_for("/connectors/broken/status", WAIT, |s| {
        task_states(s) == ["FAILED"]
    })
    .await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_4xx_answers_in_connects_error_shape() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;

    let not_json = api
        .send(Method::POST, "/connectors", Some("{\"name\": ".into()))
        .await;
    assert!(not_json.assert_error(400).contains("not valid JSON"));
    let empty = api.send(Method::POST, "/connectors", None).await;
    assert!(empty.assert_error(400).contains("empty"));
    let huge = json!({"name": "big", "config": {"connector.class": "file", "topics": "t", "pad": "x".repeat(2 * 1024 * 1024)}});
    assert!(api
        .post("/connectors", huge)
        .await
        .assert_error(413)
        .contains("rest.max.body.bytes"));
    assert!(api
        .post("/connectors", json!({"name": "x"}))
        .await
        .assert_error(400)
        .contains("config"));
    assert!(api
        .post("/connectors", json!({"config": {"topics": "t"}}))
        .await
        .assert_error(400)
        .contains("name"));
    let nested = api
        .post(
            "/connectors",
            json!({"name": "n", "config": {"topics": {"a": 1}}}),
        )
        .await;
    assert!(nested.assert_error(400).contains("topics"));
    let bad_state = api
        .post("/connectors", json!({"name": "s", "config": {"connector.class": "file", "topics": "t"}, "initial_state": "ASLEEP"}))
        .await;
    assert!(bad_state.assert_error(400).contains("ASLEEP"));

    // Invalid configurations: 400 naming every bad key; nothing is created.
    let unknown_class = api
        .post(
            "/connectors",
            json!({"name": "u", "config": {"connector.class": "s3", "topics": "t"}}),
        )
        .await;
    let message = unknown_class.assert_error(400);
    assert!(
        message.contains("connector.class") && message.contains("s3"),
        "{message}"
    );
    let several = api
        .post("/connectors", json!({"name": "v", "config": {"connector.class": "file", "tasks.max": "zero", "task.inflight.batches": "0"}}))
        .await;
    let message = several.assert_error(400);
    for key in ["tasks.max", "topics", "task.inflight.batches"] {
        assert!(message.contains(key), "{key} missing from: {message}");
    }
    assert_eq!(api.get("/connectors").await.body, json!([]));
    let put_invalid = api
        .put("/connectors/v/config", json!({"connector.class": "file"}))
        .await;
    assert!(put_invalid.assert_error(400).contains("topics"));
    let patch_not_object = api.patch("/connectors/v/config", json!(["a"])).await;
    patch_not_object.assert_error(400);

    // Plugins and validation.
    let plugins = api.get("/connector-plugins").await;
    let classes: BTreeSet<&str> = plugins
        .body
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|p| p["class"].as_str())
        .collect();
    assert!(
        classes.contains("file") && classes.contains("kafka"),
        "{}",
        plugins.text
    );
    assert_eq!(plugins.body[0]["type"], "sink");
    let keys = api.get("/connector-plugins/file/config").await;
    assert!(
        keys.body
            .as_array()
            .expect("keys")
            .iter()
            .any(|k| k["name"] == "file"),
        "{}",
        keys.text
    );
    api.get("/connector-plugins/s3/config")
        .await
        .assert_error(404);
    let report = api
        .put(
            "/connector-plugins/file/config/validate",
            json!({"topics": "t"}),
        )
        .await;
    assert_eq!(report.status, 200, "{}", report.text);
    assert_eq!(report.body["name"], "file");
    assert_eq!(
        report.body["error_count"], 1,
        "only the name is missing: {}",
        report.text
    );
    let name_entry = report.body["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .find(|c| c["value"]["name"] == "name")
        .cloned();
    assert!(
        name_entry.is_some_and(|c| !c["value"]["errors"].as_array().expect("errors").is_empty())
    );
    let valid = api
        .put(
            "/connector-plugins/file/config/validate",
            json!({"name": "ok", "topics": "t"}),
        )
        .await;
    assert_eq!(valid.body["error_count"], 0, "{}", valid.text);
    api.put(
        "/connector-plugins/file/config/validate",
        json!({"connector.class": "kafka", "topics": "t"}),
    )
    .await
    .assert_error(400);
    api.put(
        "/connector-plugins/s3/config/validate",
        json!({"topics": "t"}),
    )
    .await
    .assert_error(404);

    // Loggers, unknown paths, wrong methods.
    let loggers = api.get("/admin/loggers").await;
    assert!(
        loggers.body["root"]["level"].is_string(),
        "{}",
        loggers.text
    );
    assert!(api.get("/admin/loggers/root").await.body["level"].is_string());
    api.get("/admin/loggers/no.such.logger")
        .await
        .assert_error(404);
    api.get("/no/such/path").await.assert_error(404);
    api.delete("/connectors").await.assert_error(405);
    api.send(Method::PATCH, "/connectors/x/status", None)
        .await
        .assert_error(405);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_any_response() {
    let broker = broker();
    broker.create_topic("vaulted", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let secrets = [
        "pa55-w0rd-declared",
        "sk-live-by-name-123",
        "jaas-secret-456",
    ];
    let config = json!({
        "connector.class": "vault",
        "topics": "vaulted",
        "vault.password": secrets[0],
        "http.api.key": secrets[1],
        "vault.client.secret": secrets[2],
    });
    let mut seen = Vec::new();
    let created = api
        .post("/connectors", json!({"name": "vault", "config": config}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.body["config"]["vault.password"], "[hidden]");
    assert_eq!(created.body["config"]["http.api.key"], "[hidden]");
    seen.push(created.text);
    for path in [
        "/connectors/vault",
        "/connectors/vault/config",
        "/connectors/vault/tasks",
        "/connectors/vault/status",
        "/connectors?expand=info&expand=status",
    ] {
        seen.push(api.get(path).await.text);
    }
    // Sending back what GET showed keeps the stored secret (the worker still starts).
    let shown = api.get("/connectors/vault/config").await.body;
    let put = api.put("/connectors/vault/config", shown).await;
    assert_eq!(put.status, 200, "{}", put.text);
    seen.push(put.text);
    seen.push(
        api.patch("/connectors/vault/config", json!({"tasks.max": "1"}))
            .await
            .text,
    );
    // An invalid value of a secret-named key is not echoed in the error.
    let bad = api
        .patch(
            "/connectors/vault/config",
            json!({"vault.token.ttl": "sk-ttl-not-a-number"}),
        )
        .await;
    bad.assert_error(400);
    assert!(!bad.text.contains("sk-ttl-not-a-number"), "{}", bad.text);
    let report = api
        .put("/connector-plugins/vault/config/validate", config.clone())
        .await;
    assert_eq!(report.status, 200);
    seen.push(report.text);
    for text in &seen {
        for secret in secrets {
            assert!(!text.contains(secret), "'{secret}' shown in: {text}");
        }
    }
    api.wait_for("/connectors/vault/status", WAIT, |s| state(s) == "RUNNING")
        .await;
    worker.stop().await;
}

/// The paths of `/openapi.json` with their methods, as `METHOD path`.
fn documented(doc: &Json) -> BTreeSet<String> {
    doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .expect("operations")
                .keys()
                .map(move |m| format!("{} {path}", m.to_uppercase()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_exactly_the_routes_the_server_answers() {
    let doc: Json = serde_json::from_str(spillway::rest::OPENAPI).expect("the document is JSON");
    let routes: BTreeSet<String> = spillway::rest::endpoints()
        .iter()
        .map(|e| format!("{} {}", e.method, e.path))
        .collect();
    let documented = documented(&doc);
    assert_eq!(
        routes.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "routes missing from openapi.json"
    );
    assert_eq!(
        documented.difference(&routes).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented paths the server does not have"
    );
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            for (code, response) in op["responses"].as_object().expect("responses") {
                assert!(
                    response["description"].is_string(),
                    "{method} {path} {code} has no description"
                );
            }
        }
    }

    // The served document is the same, and every documented operation reaches a handler
    // (no "no resource" 404, no 405) on a real server.
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    assert_eq!(api.get("/openapi.json").await.body, doc);
    for entry in &documented {
        let (method, path) = entry.split_once(' ').expect("METHOD path");
        let concrete = path
            .replace("{name}", "nope")
            .replace("{task}", "0")
            .replace("{plugin}", "file")
            .replace("{tenant}", "default");
        let body = matches!(method, "POST" | "PUT" | "PATCH").then(|| "{}".to_owned());
        let answer = api
            .send(
                Method::from_bytes(method.as_bytes()).expect("method"),
                &concrete,
                body,
            )
            .await;
        assert_ne!(answer.status, 405, "{entry}: {}", answer.text);
        assert!(answer.status < 500, "{entry}: {}", answer.text);
        assert!(
            !answer.text.contains("no resource at"),
            "{entry}: {}",
            answer.text
        );
        let documented_codes: Vec<&String> = doc["paths"][path][method.to_lowercase()]["responses"]
            .as_object()
            .expect("responses")
            .keys()
            .collect();
        assert!(
            documented_codes
                .iter()
                .any(|c| c.as_str() == answer.status.to_string()),
            "{entry} answered {} which is not documented ({documented_codes:?}): {}",
            answer.status,
            answer.text
        );
    }
    worker.stop().await;
}
