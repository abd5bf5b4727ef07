//! A worker killed with SIGKILL comes back from its state store: every connector in its
//! target state, and no record lost (the file sink's output holds every produced record).

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use spillway_tests::{numbered_records, produce, DevBroker};
use support::{broker, Client};

const WAIT: Duration = Duration::from_secs(60);
/// Records produced before the first start: enough that the kill comes part way through.
const FIRST: u64 = 50_000;

/// The `spillway worker` process; killed when dropped.
struct WorkerProcess {
    child: Child,
    api: Client,
}

impl WorkerProcess {
    fn start(broker: &DevBroker, state_dir: &Path, properties: &Path) -> WorkerProcess {
        let lines: Vec<String> = support::worker_config(broker, state_dir)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        std::fs::write(properties, lines.join("\n") + "\n").expect("worker properties");
        let mut child = Command::new(env!("CARGO_BIN_EXE_spillway"))
            .arg("worker")
            .arg(properties)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the spillway binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the worker prints its address");
        let address = line
            .trim()
            .strip_prefix("REST API listening on ")
            .unwrap_or_else(|| panic!("unexpected first line '{line}'"))
            .to_owned();
        WorkerProcess {
            child,
            api: Client::new(&address),
        }
    }

    /// SIGTERM, then waits for a clean exit.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM to {pid} failed");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                start.elapsed() < WAIT,
                "the worker did not stop within {WAIT:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill_9(mut self) {
        // Child::kill sends SIGKILL: no graceful stop, no flush beyond what already returned.
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn all_tasks_failed(status: &Json) -> bool {
    status["tasks"].as_array().is_some_and(|tasks| {
        !tasks.is_empty()
            && tasks
                .iter()
                .all(|t| t["state"] == "FAILED" && t["trace"].is_string())
    })
}

fn state(body: &Json) -> String {
    body["connector"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_restores_every_connector_in_its_target_state_and_loses_no_record() {
    let broker = broker();
    broker.create_topic("orders", 2);
    let dir = tempfile::tempdir().expect("temp dir");
    let state_dir = dir.path().join("state");
    let properties = dir.path().join("worker.properties");
    let out = dir.path().join("orders.txt");
    produce(
        &broker.bootstrap(),
        "orders",
        numbered_records(FIRST, 32, 2),
        "none",
    )
    .await;

    let worker = WorkerProcess::start(&broker, &state_dir, &properties);
    let api = worker.api.clone();
    api.wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    let sink = |name: &str, file: &Path| {
        json!({"name": name, "config": {
            "connector.class": "file", "topics": "orders", "tasks.max": "2",
            "file": file.display().to_string(), "consumer.override.group.id": format!("{name}-group"),
            "consumer.override.group.protocol": "share",
        }})
    };
    // A connector whose cluster does not answer fails alone (its tasks FAILED with the reason).
    // On the restart its share group check waits for that cluster, keeping the worker
    // 'starting' meanwhile.
    let mut unreachable = sink("unreachable", &dir.path().join("unreachable.txt"));
    unreachable["config"]["consumer.override.bootstrap.servers"] = json!("127.0.0.1:1");
    assert_eq!(api.post("/connectors", unreachable).await.status, 201);
    api.wait_for("/connectors/unreachable/status", WAIT, all_tasks_failed)
        .await;
    assert_eq!(
        api.post("/connectors", sink("files", &out)).await.status,
        201
    );
    let mut paused = sink("paused", &dir.path().join("paused.txt"));
    paused["initial_state"] = json!("PAUSED");
    assert_eq!(api.post("/connectors", paused).await.status, 201);
    let mut stopped = sink("stopped", &dir.path().join("stopped.txt"));
    stopped["initial_state"] = json!("STOPPED");
    assert_eq!(api.post("/connectors", stopped).await.status, 201);
    assert_eq!(
        api.post(
            "/connectors",
            sink("halted", &dir.path().join("halted.txt"))
        )
        .await
        .status,
        201
    );
    assert_eq!(api.put_empty("/connectors/halted/stop").await.status, 204);
    let patched = api
        .patch("/connectors/files/config", json!({"file.fsync": "true"}))
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);

    // A connector created just before the kill is there after it: the answer came after the write.
    assert_eq!(
        api.post("/connectors", sink("last", &dir.path().join("last.txt")))
            .await
            .status,
        201
    );
    // Kill while the file sink is part way through.
    wait_until("the first records in the output", || {
        !lines_of(&out).is_empty()
    })
    .await;
    eprintln!(
        "killing the worker with {} of {FIRST} records written",
        lines_of(&out).len()
    );
    worker.kill_9();
    produce(
        &broker.bootstrap(),
        "orders",
        (FIRST..FIRST + 1000)
            .map(|n| spillway_tests::TestRecord {
                partition: Some((n % 2) as i32),
                ..spillway_tests::TestRecord::numbered(n, 32)
            })
            .collect(),
        "none",
    )
    .await;

    let worker = WorkerProcess::start(&broker, &state_dir, &properties);
    let api = worker.api.clone();
    let starting = api.get("/health").await;
    assert_eq!(
        (starting.status, starting.body["status"].as_str()),
        (503, Some("starting")),
        "{}",
        starting.text
    );
    api.wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    api.wait_for("/connectors/unreachable/status", WAIT, all_tasks_failed)
        .await;
    assert_eq!(
        api.get("/connectors").await.body,
        json!([
            "files",
            "halted",
            "last",
            "paused",
            "stopped",
            "unreachable"
        ])
    );
    api.wait_for("/connectors/files/status", WAIT, |s| state(s) == "RUNNING")
        .await;
    assert_eq!(
        api.get("/connectors/files/config").await.body["file.fsync"],
        "true"
    );
    assert_eq!(
        state(&api.get("/connectors/paused/status").await.body),
        "PAUSED"
    );
    let stopped = api.get("/connectors/stopped/status").await.body;
    assert_eq!(
        (state(&stopped), stopped["tasks"].clone()),
        ("STOPPED".to_owned(), json!([]))
    );
    assert_eq!(
        state(&api.get("/connectors/halted/status").await.body),
        "STOPPED"
    );
    api.wait_for("/connectors/last/status", WAIT, |s| state(s) == "RUNNING")
        .await;

    let expected: BTreeSet<String> = (0..FIRST + 1000).map(|n| format!("v{n}")).collect();
    wait_until("every record in the output", || {
        lines_of(&out).is_superset(&expected)
    })
    .await;
    assert!(
        lines_of(&dir.path().join("paused.txt")).is_empty(),
        "a paused connector wrote records"
    );
    assert!(
        lines_of(&dir.path().join("stopped.txt")).is_empty(),
        "a stopped connector wrote records"
    );
    // A graceful stop keeps every target state.
    let status = worker.terminate();
    assert!(
        status.success(),
        "the worker exited with {status} after SIGTERM"
    );
    let worker = WorkerProcess::start(&broker, &state_dir, &properties);
    worker
        .api
        .wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    assert_eq!(
        state(&worker.api.get("/connectors/paused/status").await.body),
        "PAUSED"
    );
    worker
        .api
        .wait_for("/connectors/files/status", WAIT, |s| state(s) == "RUNNING")
        .await;
}
