//! `spillway standalone` serves Kafka Connect's REST API, as Connect's standalone worker does:
//! the connectors of its files are listed and controlled over HTTP (status, pause, resume,
//! restart, config changes, new connectors, delete); REST changes last until the process stops.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_tests::{numbered_records, produce};
use support::process::WorkerProcess;
use support::{broker, Client};

const WAIT: Duration = Duration::from_secs(30);

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

async fn wait_for_lines(path: &Path, n: usize) {
    let start = Instant::now();
    while lines_in(path) < n {
        assert!(
            start.elapsed() < WAIT,
            "only {} of {n} lines in {}",
            lines_in(path),
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state_of(body: &serde_json::Value) -> &str {
    body["connector"]["state"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_serves_the_rest_api_for_its_file_connectors() {
    let broker = broker();
    broker.create_topic("standalone-rest", 2);
    produce(
        &broker.bootstrap(),
        "standalone-rest",
        numbered_records(100, 16, 2),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out.txt");
    let bootstrap = broker.bootstrap();
    let worker = [
        ("bootstrap.servers", bootstrap.as_str()),
        ("rest.port", "0"),
        ("task.poll.timeout.ms", "100"),
        ("task.restart.backoff.ms", "100"),
    ];
    let out_path = out.display().to_string();
    let connector = [
        ("name", "file-sink"),
        ("connector.class", "FileStreamSink"),
        ("tasks.max", "2"),
        ("topics", "standalone-rest"),
        ("file", out_path.as_str()),
        ("consumer.override.group.protocol", "share"),
    ];
    let process = WorkerProcess::standalone(&worker, &[&connector], dir.path(), "info");
    let client = Client::new(&process.base);

    // The file's connector is listed, runs, and delivers.
    let listed = client.get("/connectors").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert_eq!(listed.body, json!(["file-sink"]));
    client
        .wait_for("/connectors/file-sink/status", WAIT, |b| {
            state_of(b) == "RUNNING"
                && b["tasks"]
                    .as_array()
                    .is_some_and(|t| t.len() == 2 && t.iter().all(|t| t["state"] == "RUNNING"))
        })
        .await;
    let config = client.get("/connectors/file-sink/config").await;
    assert_eq!(config.body["topics"], "standalone-rest", "{}", config.text);
    wait_for_lines(&out, 100).await;

    // Paused, it delivers nothing; resumed, the rest arrives.
    assert_eq!(
        client.put_empty("/connectors/file-sink/pause").await.status,
        202
    );
    client
        .wait_for("/connectors/file-sink/status", WAIT, |b| {
            state_of(b) == "PAUSED"
        })
        .await;
    produce(
        &broker.bootstrap(),
        "standalone-rest",
        numbered_records(50, 16, 2),
        "none",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lines_in(&out), 100, "a paused connector delivered");
    assert_eq!(
        client
            .put_empty("/connectors/file-sink/resume")
            .await
            .status,
        202
    );
    wait_for_lines(&out, 150).await;

    // Config changes and restarts act on the running connector.
    let mut changed = config.body.clone();
    changed["tasks.max"] = json!("1");
    let put = client.put("/connectors/file-sink/config", changed).await;
    assert_eq!(put.status, 200, "{}", put.text);
    client
        .wait_for("/connectors/file-sink/status", WAIT, |b| {
            state_of(b) == "RUNNING" && b["tasks"].as_array().is_some_and(|t| t.len() == 1)
        })
        .await;
    let restart = client.post_empty("/connectors/file-sink/restart").await;
    assert!(matches!(restart.status, 202 | 204), "{}", restart.text);

    // A connector created over REST runs beside the file's, and can be deleted.
    let second = dir.path().join("second.txt");
    let created = client
        .post(
            "/connectors",
            json!({"name": "rest-made", "config": {
                "connector.class": "FileStreamSink",
                "topics": "standalone-rest",
                "file": second.display().to_string(),
                "consumer.override.group.protocol": "share",
            }}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    wait_for_lines(&second, 150).await;
    assert_eq!(client.delete("/connectors/rest-made").await.status, 204);
    assert_eq!(client.get("/connectors").await.body, json!(["file-sink"]));

    // SIGTERM stops it cleanly; the next start knows only its files' connectors.
    let (status, log) = process.stop_with_status();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    let again = WorkerProcess::standalone(&worker, &[&connector], dir.path(), "info");
    let client = Client::new(&again.base);
    client
        .wait_for("/connectors", WAIT, |b| *b == json!(["file-sink"]))
        .await;
    drop(again);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connector_file_without_a_name_is_refused_naming_the_key() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let worker = dir.path().join("worker.properties");
    std::fs::write(
        &worker,
        format!("bootstrap.servers={}\nrest.port=0\n", broker.bootstrap()),
    )
    .expect("worker file");
    let connector = dir.path().join("nameless.properties");
    std::fs::write(
        &connector,
        "connector.class=FileStreamSink\ntopics=t\nfile=out.txt\n",
    )
    .expect("connector file");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .arg("standalone")
        .arg(&worker)
        .arg(&connector)
        .current_dir(dir.path())
        .output()
        .expect("spillway runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("nameless.properties") && stderr.contains("name="),
        "{stderr}"
    );
}
