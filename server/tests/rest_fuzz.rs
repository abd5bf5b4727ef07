//! A bounded schema-driven fuzz run of the REST API: `schemathesis` (from PyPI, in a venv of
//! its own under `tools/.venv-fuzz`, created on first use) generates requests from
//! `/openapi.json` — valid and invalid bodies, parameters and methods — against a
//! `spillway worker` process, with authentication off, and on with the admin's and a tenant's
//! token. No request may get a server error (5xx), and the worker must be healthy after.

mod support;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use support::process::WorkerProcess;
use support::{broker, Client};

/// The pinned fuzzer.
const SCHEMATHESIS_PIN: &str = "schemathesis==4.32.5";
/// Test cases per operation and phase: small enough for the three runs to take about two
/// minutes on a loaded machine.
const MAX_EXAMPLES: &str = "8";
const ADMIN_TOKEN: &str = "admin-token-for-the-fuzz-run-0123";
const WAIT: Duration = Duration::from_secs(60);

fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tools")
}

/// The venv's `schemathesis`, creating the venv first if needed (under a file lock, ready
/// once its marker exists, as `tools/.venv` is made for the dev broker).
fn schemathesis() -> PathBuf {
    let venv = tools_dir().join(".venv-fuzz");
    let program = venv.join("bin").join("schemathesis");
    let marker = venv.join(".spillway-ready");
    if fs::read_to_string(&marker).is_ok_and(|pin| pin == SCHEMATHESIS_PIN) {
        return program;
    }
    let lock_path = tools_dir().join(".venv-fuzz.lock");
    let lock = File::create(&lock_path).expect("lock file");
    lock.lock().expect("venv lock");
    if fs::read_to_string(&marker).is_ok_and(|pin| pin == SCHEMATHESIS_PIN) {
        return program;
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    run(Command::new(&python)
        .args(["-m", "venv", "--clear"])
        .arg(&venv));
    run(Command::new(venv.join("bin").join("python")).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        SCHEMATHESIS_PIN,
    ]));
    fs::write(&marker, SCHEMATHESIS_PIN).expect("marker written");
    program
}

fn run(command: &mut Command) {
    let output = command.output().expect("the command starts");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One fuzz run against `base` with `token`; panics with schemathesis' report on a failure.
fn fuzz(base: &str, token: Option<&str>, dir: &Path, label: &str) {
    let mut command = Command::new(schemathesis());
    command
        .arg("run")
        .arg(format!("{base}/openapi.json"))
        .args(["--url", base])
        .args(["--checks", "not_a_server_error"])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--seed", "19"])
        .args(["--workers", "1"])
        .args(["--request-timeout", "60"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--suppress-health-check", "all"])
        .arg("--no-shrink")
        .args(["--report", "junit"])
        .arg("--report-junit-path")
        .arg(dir.join(format!("{label}.xml")))
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .current_dir(dir);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let started = Instant::now();
    let output = command.output().expect("schemathesis starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "fuzz run '{label}' took {:?}; summary:\n{}",
        started.elapsed(),
        stdout
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        output.status.success(),
        "fuzz run '{label}' found server errors (or could not run):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("passed") || stdout.contains("Passed"),
        "fuzz run '{label}' ran no test:\n{stdout}"
    );
}

/// Creates `orders`, the connector name the document's examples use, so that requests about
/// a connector reach a real one (a classic file sink writing into the worker's directory).
async fn orders(api: &Client, path: &str) {
    let created = api
        .post(
            path,
            json!({"name": "orders", "config": {
                "connector.class": "file",
                "topics": "fuzzed",
                "file": "orders.txt",
                "consumer.override.group.protocol": "classic",
            }}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
}

async fn healthy(api: &Client) {
    api.wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_with_authentication_off_and_on() {
    let program = schemathesis();
    assert!(program.exists(), "{}", program.display());
    let broker = broker();
    broker.create_topic("fuzzed", 1);
    let bootstrap = broker.bootstrap();

    let off = tempfile::tempdir().expect("temp dir");
    let state = off.path().join("state").display().to_string();
    let worker = WorkerProcess::start(
        &[
            ("bootstrap.servers", &bootstrap),
            ("rest.port", "0"),
            ("state.dir", &state),
        ],
        off.path(),
        "warn",
    );
    let api = Client::new(&worker.base);
    healthy(&api).await;
    orders(&api, "/connectors").await;
    fuzz(&worker.base, None, off.path(), "auth-off");
    healthy(&api).await;
    let log = worker.stop();
    assert!(!log.contains("panicked"), "the worker panicked:\n{log}");

    let on = tempfile::tempdir().expect("temp dir");
    let state = on.path().join("state").display().to_string();
    let worker = WorkerProcess::start(
        &[
            ("bootstrap.servers", &bootstrap),
            ("rest.port", "0"),
            ("state.dir", &state),
            ("rest.auth.enabled", "true"),
            ("rest.admin.token", ADMIN_TOKEN),
        ],
        on.path(),
        "warn",
    );
    let anonymous = Client::new(&worker.base);
    healthy(&anonymous).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    // `acme` is the tenant of the document's examples.
    let created = admin.post("/tenants", json!({"name": "acme"})).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let tenant_token = created.body["token"].as_str().expect("a token").to_owned();
    orders(&admin, "/connectors").await;
    orders(&admin, "/tenants/acme/connectors").await;
    // The tenant's run first: the admin's may delete the tenant or rotate its token.
    fuzz(
        &worker.base,
        Some(&tenant_token),
        on.path(),
        "auth-on-tenant",
    );
    fuzz(&worker.base, Some(ADMIN_TOKEN), on.path(), "auth-on-admin");
    healthy(&anonymous).await;
    let log = worker.stop();
    assert!(!log.contains("panicked"), "the worker panicked:\n{log}");
}
