//! Kafka Connect's `/admin/loggers` API changes what the worker logs while it runs, and every
//! line a task logs names its tenant, connector and task. The logging of this test binary is
//! Spillway's own, set up in-process with the output captured.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;
use spillway::telemetry::{self, LogFormat, TelemetryConfig};
use support::{broker, start_worker};
use tracing_subscriber::fmt::MakeWriter;

/// Log output kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let telemetry = telemetry::init_with_writer(
            TelemetryConfig {
                log_format: LogFormat::Text,
                log_filter: "info".to_owned(),
                traces: None,
            },
            captured.clone(),
        )
        .expect("logging starts");
        // Lives as long as the process: nothing to flush without traces.
        std::mem::forget(telemetry);
        captured
    })
}

async fn wait_for_log(what: &str, check: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check(&captured().text()) {
        assert!(
            Instant::now() < deadline,
            "no log line with {what}:\n{}",
            captured().text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_levels_change_at_runtime_and_task_lines_carry_their_context() {
    let captured = captured();
    let broker = broker();
    broker.create_topic("orders", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let created = api
        .post(
            "/connectors",
            json!({
                "name": "files",
                "config": {
                    "connector.class": "FileStreamSink",
                    "topics": "orders",
                    "file": dir.path().join("out.txt").display().to_string(),
                }
            }),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);

    // A line from inside the task names tenant, connector and task.
    wait_for_log("the task's context", |text| {
        text.lines().any(|l| {
            l.contains("task{tenant=default connector=files task=0}") && l.contains("task started")
        })
    })
    .await;

    // Loggers exist once they logged; root is INFO from the start-up levels.
    let all = api.get("/admin/loggers").await;
    assert_eq!(all.status, 200, "{}", all.text);
    assert_eq!(
        all.body["root"],
        json!({"level": "INFO", "last_modified": null})
    );
    assert_eq!(
        all.body["spillway_actors::consumer"]["level"], "INFO",
        "{}",
        all.text
    );
    let consumer = api.get("/admin/loggers/spillway_actors.consumer").await;
    assert_eq!(
        consumer.body,
        json!({"level": "INFO", "last_modified": null}),
        "dotted names are module paths"
    );

    // A logger exists once it logged (at a level that was on).
    tracing::info!(target: "spillway_actors::sink", "probe zero at INFO");
    tracing::debug!(target: "spillway_actors::sink", "probe one at DEBUG");
    let changed = api
        .put("/admin/loggers/spillway_actors", json!({"level": "debug"}))
        .await;
    assert_eq!(changed.status, 200, "{}", changed.text);
    let changed: Vec<String> = serde_json::from_value(changed.body).expect("a list of names");
    for name in [
        "spillway_actors",
        "spillway_actors::consumer",
        "spillway_actors::sink",
    ] {
        assert!(changed.iter().any(|c| c == name), "{name} in {changed:?}");
    }
    assert!(
        changed.iter().all(|c| c.starts_with("spillway_actors")),
        "only loggers below spillway_actors change: {changed:?}"
    );
    let mut sorted = changed.clone();
    sorted.sort();
    assert_eq!(changed, sorted);
    tracing::debug!(target: "spillway_actors::sink", "probe two at DEBUG");
    tracing::debug!(target: "spillway_kafka::share", "probe three at DEBUG");
    let sink = api.get("/admin/loggers/spillway_actors::sink").await;
    assert_eq!(sink.body["level"], "DEBUG");
    let modified = sink.body["last_modified"].as_i64().expect("a timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now - modified).abs() < 60_000,
        "{modified} is about now ({now})"
    );

    // Cluster scope answers 204 and applies to this worker, the whole cluster.
    let cluster = api
        .put(
            "/admin/loggers/root?scope=cluster",
            json!({"level": "WARN"}),
        )
        .await;
    assert_eq!(cluster.status, 204, "{}", cluster.text);
    tracing::info!(target: "spillway_actors::sink", "probe four at INFO");
    tracing::warn!(target: "spillway_actors::sink", "probe five at WARN");
    assert_eq!(
        api.get("/admin/loggers/spillway_actors").await.body["level"],
        "WARN"
    );

    let text = captured.text();
    assert!(text.contains("probe zero"), "{text}");
    assert!(!text.contains("probe one"), "DEBUG was off:\n{text}");
    assert!(
        text.contains("probe two"),
        "DEBUG was on for spillway_actors:\n{text}"
    );
    assert!(
        !text.contains("probe three"),
        "other loggers stayed at INFO:\n{text}"
    );
    assert!(
        !text.contains("probe four"),
        "INFO was off after WARN:\n{text}"
    );
    assert!(text.contains("probe five"), "{text}");

    // Bad requests name what is wrong.
    let bad = api
        .put("/admin/loggers/root", json!({"level": "LOUD"}))
        .await;
    let message = bad.assert_error(400);
    assert!(
        message.contains("'LOUD'") && message.contains("OFF, ERROR, WARN, INFO, DEBUG, TRACE"),
        "{message}"
    );
    assert!(api
        .put("/admin/loggers/root", json!({}))
        .await
        .assert_error(400)
        .contains("level"));
    assert!(api
        .put("/admin/loggers/root?scope=galaxy", json!({"level": "INFO"}))
        .await
        .assert_error(400)
        .contains("galaxy"));
    assert!(api
        .put("/admin/loggers/a=b", json!({"level": "INFO"}))
        .await
        .assert_error(400)
        .contains("a=b"));
    assert!(api
        .get("/admin/loggers/no.such.logger")
        .await
        .assert_error(404)
        .contains("no.such.logger"));
    assert_eq!(
        api.get("/admin/loggers/root").await.body["level"],
        "WARN",
        "refused requests changed nothing"
    );
    worker.stop().await;
}
