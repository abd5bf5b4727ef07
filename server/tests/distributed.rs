//! Distributed mode with real worker processes on the dev broker (behind the test-kit proxy,
//! whose admin emulation creates the compacted config and status topics): connectors created
//! through one worker are seen and controlled through the others, tenants and their tokens hold
//! on every worker, a SIGKILLed worker's tasks run on the survivors within the configured delay
//! plus a few seconds and no record is lost (share and classic mode), a new worker takes a
//! share, and a restart of every worker keeps every connector and tenant.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use spillway_tests::{numbered_range, numbered_records, produce, ProxiedDevBroker};
use support::eos::{assert_exactly_once, read_output, Source};
use support::process::WorkerProcess;
use support::Client;

const ADMIN_TOKEN: &str = "distributed-admin-token-0123456789";
const WAIT: Duration = Duration::from_secs(90);
/// Records before the workers start; as many more are produced while one is killed.
const RECORDS: u64 = 20_000;
const BATCH: u64 = 1_000;
/// `scheduled.rebalance.max.delay.ms` of the test cluster.
const DELAY: Duration = Duration::from_secs(3);
/// `session.timeout.ms` of the test cluster.
const SESSION: Duration = Duration::from_secs(4);

fn worker_properties(bootstrap: &str) -> Vec<(&'static str, String)> {
    vec![
        ("bootstrap.servers", bootstrap.to_owned()),
        ("rest.host.name", "127.0.0.1".into()),
        ("rest.port", "0".into()),
        ("rest.auth.enabled", "true".into()),
        ("rest.admin.token", ADMIN_TOKEN.into()),
        ("group.id", "spillway-cluster".into()),
        ("config.storage.topic", "spillway-configs".into()),
        ("config.storage.replication.factor", "1".into()),
        ("status.storage.topic", "spillway-status".into()),
        ("status.storage.replication.factor", "1".into()),
        ("status.storage.partitions", "2".into()),
        ("session.timeout.ms", SESSION.as_millis().to_string()),
        ("heartbeat.interval.ms", "500".into()),
        ("rebalance.timeout.ms", "20000".into()),
        (
            "scheduled.rebalance.max.delay.ms",
            DELAY.as_millis().to_string(),
        ),
        ("task.restart.backoff.ms", "100".into()),
        ("task.poll.timeout.ms", "100".into()),
    ]
}

struct Worker {
    process: WorkerProcess,
    api: Client,
    id: String,
}

fn start_worker(bootstrap: &str, dir: &Path) -> Worker {
    std::fs::create_dir_all(dir).expect("worker dir");
    let owned = worker_properties(bootstrap);
    let properties: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let process = WorkerProcess::start(&properties, dir, "info");
    let api = Client::new(&process.base).with_token(ADMIN_TOKEN);
    let id = process
        .base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    Worker { process, api, id }
}

fn sink(name: &str, file: &Path, protocol: &str) -> Json {
    json!({"name": name, "config": {
        "connector.class": "file",
        "topics": "orders",
        "tasks.max": "3",
        "file": file.display().to_string(),
        "consumer.override.group.id": format!("{name}-group"),
        "consumer.override.group.protocol": protocol,
        "consumer.override.auto.offset.reset": "earliest",
    }})
}

fn values_in(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

async fn wait_until(what: &str, timeout: Duration, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `POST /connectors` through `api`, again while the cluster answers 409 (no leader known
/// yet, a rebalance); the first other answer.
async fn create_retrying(api: &Client, body: Json) -> support::Answer {
    let start = Instant::now();
    loop {
        let answer = api.post("/connectors", body.clone()).await;
        if answer.status != 409 {
            return answer;
        }
        assert!(start.elapsed() < WAIT, "still 409: {}", answer.text);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Which worker runs each task of the connector, when all of them run.
fn running_tasks(status: &Json) -> Option<BTreeMap<u64, String>> {
    let tasks = status["tasks"].as_array()?;
    if tasks.is_empty() || tasks.iter().any(|t| t["state"] != "RUNNING") {
        return None;
    }
    Some(
        tasks
            .iter()
            .map(|t| {
                (
                    t["id"].as_u64().unwrap_or_default(),
                    t["worker_id"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
    )
}

async fn placement(api: &Client, connector: &str) -> Option<BTreeMap<u64, String>> {
    let answer = api.get(&format!("/connectors/{connector}/status")).await;
    (answer.status == 200)
        .then(|| running_tasks(&answer.body))
        .flatten()
}

/// Waits until every task of `connector` runs on one of `workers`, and returns where.
async fn wait_placed(api: &Client, connector: &str, workers: &[&str]) -> BTreeMap<u64, String> {
    let start = Instant::now();
    loop {
        if let Some(placed) = placement(api, connector).await {
            if placed.values().all(|w| workers.contains(&w.as_str())) {
                return placed;
            }
        }
        assert!(
            start.elapsed() < WAIT,
            "the tasks of {connector} did not all run on {workers:?}; last status {}",
            api.get(&format!("/connectors/{connector}/status"))
                .await
                .text
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_workers_shares_connectors_survives_a_sigkill_and_keeps_its_state() {
    let cluster =
        ProxiedDevBroker::start(1, &[("orders", 6)]).expect("dev broker behind the proxy");
    let broker = cluster.broker();
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(2000);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(3000);
    let bootstrap = cluster.bootstrap();
    let dir = tempfile::tempdir().expect("temp dir");
    produce(
        &bootstrap,
        "orders",
        numbered_records(RECORDS, 32, 6),
        "none",
    )
    .await;

    let mut workers: Vec<Worker> = (0..3)
        .map(|i| start_worker(&bootstrap, &dir.path().join(format!("w{i}"))))
        .collect();
    let share_out = dir.path().join("share.txt");
    let classic_out = dir.path().join("classic.txt");

    // Created through the first worker (forwarded to the leader if it is not it); a write
    // before the first assignment gets 409, Connect's answer during a rebalance.
    let answer = create_retrying(&workers[0].api, sink("share-files", &share_out, "share")).await;
    assert_eq!(answer.status, 201, "{}", answer.text);
    let answer = create_retrying(
        &workers[0].api,
        sink("classic-files", &classic_out, "classic"),
    )
    .await;
    assert_eq!(answer.status, 201, "{}", answer.text);

    // Every worker lists them; the tasks are spread over the workers.
    for w in &workers {
        w.api
            .wait_for("/connectors", WAIT, |b| {
                b == &json!(["classic-files", "share-files"])
            })
            .await;
    }
    let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    let share = wait_placed(&workers[2].api, "share-files", &all).await;
    let classic = wait_placed(&workers[1].api, "classic-files", &all).await;
    let used: BTreeSet<&String> = share.values().chain(classic.values()).collect();
    assert!(
        used.len() >= 2,
        "six tasks on three workers all ran on {used:?}"
    );

    // A tenant created through one worker is known, with its token, to the others.
    let created = workers[1]
        .api
        .post(
            "/tenants",
            json!({"name": "acme", "quotas": {"connectors": 1}}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let token = created.body["token"].as_str().expect("token").to_owned();
    let acme = Client::new(&workers[2].process.base).with_token(&token);
    let start = Instant::now();
    while acme.get("/tenants/acme/connectors").await.status != 200 {
        assert!(
            start.elapsed() < WAIT,
            "the tenant's token does not work on another worker"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The tenant's quota holds cluster-wide: the leader counts the connectors created through
    // every worker.
    let tenant_sink = |name: &str| {
        json!({"name": name, "initial_state": "PAUSED", "config": {
            "connector.class": "file", "topics": "orders",
            "file": format!("{name}.txt"),
            "consumer.override.group.protocol": "share",
        }})
    };
    let first = acme
        .post("/tenants/acme/connectors", tenant_sink("first"))
        .await;
    assert_eq!(first.status, 201, "{}", first.text);
    let second = Client::new(&workers[0].process.base)
        .with_token(&token)
        .post("/tenants/acme/connectors", tenant_sink("second"))
        .await;
    assert!(
        second.assert_error(403).contains("quota connectors=1"),
        "{}",
        second.text
    );

    // Paused through one worker, seen paused through another; resumed.
    let paused = workers[2]
        .api
        .put_empty("/connectors/classic-files/pause")
        .await;
    assert!(
        paused.status == 202 || paused.status == 204,
        "{}",
        paused.text
    );
    workers[0]
        .api
        .wait_for("/connectors/classic-files/status", WAIT, |s| {
            s["connector"]["state"] == "PAUSED"
        })
        .await;
    let resumed = workers[1]
        .api
        .put_empty("/connectors/classic-files/resume")
        .await;
    assert!(
        resumed.status == 202 || resumed.status == 204,
        "{}",
        resumed.text
    );

    // SIGKILL a worker that runs tasks while records keep coming.
    let producing = tokio::spawn({
        let bootstrap = bootstrap.clone();
        async move {
            for first in (RECORDS..2 * RECORDS).step_by(BATCH as usize) {
                produce(
                    &bootstrap,
                    "orders",
                    numbered_range(first, BATCH, 6),
                    "none",
                )
                .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let victim = share
        .values()
        .chain(classic.values())
        .next()
        .expect("a task")
        .clone();
    wait_until(
        "records produced during the drain in both outputs",
        WAIT,
        || {
            let first_late = format!("v{}", RECORDS + BATCH);
            values_in(&share_out).contains(&first_late)
                && values_in(&classic_out).contains(&first_late)
        },
    )
    .await;
    assert!(
        !producing.is_finished(),
        "the kill must come while records are still produced"
    );
    let index = workers.iter().position(|w| w.id == victim).expect("victim");
    let mut dead = workers.remove(index);
    dead.process.kill_9();
    let killed_at = Instant::now();
    eprintln!(
        "killed {victim} with {} share and {} classic records written",
        values_in(&share_out).len(),
        values_in(&classic_out).len()
    );
    let survivors: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let alive: Vec<&str> = survivors.iter().map(String::as_str).collect();
    wait_placed(&workers[0].api, "share-files", &alive).await;
    wait_placed(&workers[0].api, "classic-files", &alive).await;
    let moved_in = killed_at.elapsed();
    eprintln!("the killed worker's tasks ran on the survivors {moved_in:?} after the kill");
    assert!(
        moved_in < SESSION + DELAY + Duration::from_secs(15),
        "tasks moved only after {moved_in:?}"
    );
    producing.await.expect("the producer");
    let expected: BTreeSet<String> = (0..2 * RECORDS).map(|n| format!("v{n}")).collect();
    wait_until("every record in both outputs", WAIT, || {
        values_in(&share_out).is_superset(&expected)
            && values_in(&classic_out).is_superset(&expected)
    })
    .await;

    // A new worker joins and takes a share of the tasks; the others keep theirs (a task
    // either stays where it ran or moves to the newcomer, never between old workers).
    let before = (
        wait_placed(&workers[0].api, "share-files", &alive).await,
        wait_placed(&workers[0].api, "classic-files", &alive).await,
    );
    let newcomer = start_worker(&bootstrap, &dir.path().join("w3"));
    let start = Instant::now();
    loop {
        let share = placement(&workers[0].api, "share-files").await;
        let classic = placement(&workers[0].api, "classic-files").await;
        for (now, then) in [(&share, &before.0), (&classic, &before.1)] {
            for (task, worker) in now.iter().flatten() {
                assert!(
                    *worker == then[task] || *worker == newcomer.id,
                    "task {task} moved from {} to {worker}, not to the newcomer",
                    then[task]
                );
            }
        }
        let placed: Vec<String> = share
            .into_iter()
            .chain(classic)
            .flat_map(|p| p.into_values())
            .collect();
        if placed.contains(&newcomer.id) {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the new worker {} took no task; tasks on {placed:?}",
            newcomer.id
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    workers.push(newcomer);

    // Every worker stops (SIGTERM); three new ones have every connector and the tenant.
    for w in workers.drain(..) {
        let (status, log) = w.process.stop_with_status();
        assert!(
            status.success(),
            "a worker exited with {status}; log:\n{log}"
        );
    }
    let workers: Vec<Worker> = (4..7)
        .map(|i| start_worker(&bootstrap, &dir.path().join(format!("w{i}"))))
        .collect();
    for w in &workers {
        w.api
            .wait_for("/connectors", WAIT, |b| {
                b == &json!(["classic-files", "share-files"])
            })
            .await;
    }
    let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    wait_placed(&workers[1].api, "share-files", &all).await;
    wait_placed(&workers[2].api, "classic-files", &all).await;
    let acme = Client::new(&workers[0].process.base).with_token(&token);
    let listed = acme.get("/tenants/acme/connectors").await;
    assert_eq!((listed.status, listed.body), (200, json!(["first"])));
}

/// Kafka's `connect_distributed_test.test_bounce`, with an exactly-once kafka sink: while
/// records keep coming, each of three workers in turn is stopped (SIGTERM) and replaced; the
/// output, read as a read_committed consumer would, holds every source record exactly once.
/// Share mode: the ledger decides what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restarts_deliver_an_exactly_once_share_flow_exactly_once() {
    rolling_restarts("share").await;
}

/// Classic mode: offsets and ledger checkpoints in the transaction; a moved task's producer
/// (same transactional id) fences its predecessor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restarts_deliver_an_exactly_once_classic_flow_exactly_once() {
    rolling_restarts("classic").await;
}

async fn rolling_restarts(protocol: &str) {
    const PARTITIONS: i32 = 4;
    const TOTAL: u64 = 12_000;
    let cluster = ProxiedDevBroker::start(
        1,
        &[
            ("src", PARTITIONS),
            ("out.src", PARTITIONS),
            ("ledger", PARTITIONS),
        ],
    )
    .expect("dev broker behind the proxy");
    let broker = cluster.broker();
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(10_000);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(3000);
    broker.set_share_isolation_level(true);
    broker.set_share_max_delivery_attempts(20);
    let bootstrap = cluster.bootstrap();
    let dir = tempfile::tempdir().expect("temp dir");
    produce(
        &bootstrap,
        "src",
        numbered_range(0, TOTAL / 2, PARTITIONS),
        "none",
    )
    .await;

    let mut workers: Vec<Worker> = (0..3)
        .map(|i| start_worker(&bootstrap, &dir.path().join(format!("w{i}"))))
        .collect();
    let mut connector = json!({"name": "copy", "config": {
        "connector.class": "kafka",
        "topics": "src",
        "tasks.max": "2",
        "consumer.override.group.protocol": protocol,
        "topic.rename.format": "out.${topic}",
        "delivery.guarantee": "exactly_once",
        "delivery.ledger.topic": "ledger",
    }});
    if protocol == "classic" {
        // A moved task's new member joins after the old one's session ended.
        connector["config"]["consumer.override.session.timeout.ms"] = json!("6000");
        connector["config"]["consumer.override.heartbeat.interval.ms"] = json!("1000");
    }
    let answer = create_retrying(&workers[1].api, connector).await;
    assert_eq!(answer.status, 201, "{}", answer.text);
    let producing = tokio::spawn({
        let bootstrap = bootstrap.clone();
        async move {
            for first in (TOTAL / 2..TOTAL).step_by(500) {
                produce(
                    &bootstrap,
                    "src",
                    numbered_range(first, 500, PARTITIONS),
                    "none",
                )
                .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    for round in 0..3 {
        let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
        let all: Vec<&str> = ids.iter().map(String::as_str).collect();
        wait_placed(&workers[0].api, "copy", &all).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leaving = workers.remove(0);
        let (status, log) = leaving.process.stop_with_status();
        assert!(
            status.success(),
            "round {round}: exit {status}; log:\n{log}"
        );
        workers.push(start_worker(
            &bootstrap,
            &dir.path().join(format!("w{}", round + 3)),
        ));
    }
    producing.await.expect("the producer");
    let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    wait_placed(&workers[0].api, "copy", &all).await;

    let produced: BTreeSet<Source> = (0..TOTAL)
        .map(|n| {
            let partition = (n % PARTITIONS as u64) as i32;
            ("src".to_owned(), partition, (n / PARTITIONS as u64) as i64)
        })
        .collect();
    let found = read_output(
        &bootstrap,
        "out.src",
        produced.len(),
        Duration::from_secs(240),
    )
    .await;
    assert_exactly_once(
        &format!("{protocol}, 3 rolling restarts"),
        &produced,
        &found,
    );
}

/// `spillway dev-cluster`: the dev broker and two workers; a connector created through one
/// worker is listed by the other; SIGTERM stops everything with exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_starts_workers_that_form_one_cluster() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["dev-cluster", "--workers", "2", "--topic", "orders:2"])
        .current_dir(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spillway dev-cluster starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = || lines.next().expect("a line").expect("readable");
    let bootstrap = next();
    assert!(bootstrap.starts_with("bootstrap="), "{bootstrap}");
    let urls: Vec<String> = (0..2)
        .map(|i| {
            let line = next();
            let prefix = format!("worker {i}: ");
            line.strip_prefix(&prefix)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| panic!("unexpected line '{line}'"))
                .to_owned()
        })
        .collect();
    let first = Client::new(&urls[1]);
    let body = json!({"name": "orders-out", "config": {
        "connector.class": "file", "topics": "orders", "tasks.max": "2",
        "file": dir.path().join("out.txt").display().to_string(),
        "consumer.override.group.protocol": "share",
    }});
    let answer = create_retrying(&first, body).await;
    assert_eq!(answer.status, 201, "{}", answer.text);
    Client::new(&urls[0])
        .wait_for("/connectors", WAIT, |b| b == &json!(["orders-out"]))
        .await;
    let pid = child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        assert!(
            start.elapsed() < WAIT,
            "dev-cluster did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "dev-cluster exited with {status}");
}
