//! Distributed mode with real worker processes on the dev broker (behind the test-kit proxy,
//! whose admin emulation creates the compacted config and status topics): connectors created
//! through one worker are seen and controlled through the others, tenants and their tokens hold
//! on every worker, a SIGKILLed worker's tasks run on the survivors within the configured delay
//! plus a few seconds and no record is lost (share and classic mode), a new worker takes a
//! share, and a restart of every worker keeps every connector and tenant.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
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
    start_worker_with(bootstrap, dir, &[])
}

/// A worker with `extra` properties beside (or instead of) the test cluster's.
fn start_worker_with(bootstrap: &str, dir: &Path, extra: &[(&str, &str)]) -> Worker {
    std::fs::create_dir_all(dir).expect("worker dir");
    let owned = worker_properties(bootstrap);
    let mut properties: Vec<(&str, &str)> = owned
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    properties.extend_from_slice(extra);
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

    // SIGKILL a worker that runs tasks while records keep coming: the producer sends a quarter
    // of the late records, then waits for the kill before it sends the rest, so the kill lands
    // mid-stream however slowly the machine drains.
    let killed = Arc::new(tokio::sync::Notify::new());
    let producing = tokio::spawn({
        let bootstrap = bootstrap.clone();
        let killed = Arc::clone(&killed);
        async move {
            for first in (RECORDS..2 * RECORDS).step_by(BATCH as usize) {
                if first == RECORDS + RECORDS / 4 {
                    killed.notified().await;
                }
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
    let index = workers.iter().position(|w| w.id == victim).expect("victim");
    let mut dead = workers.remove(index);
    dead.process.kill_9();
    let killed_at = Instant::now();
    killed.notify_one();
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

/// Each task's state and worker, whatever the state.
async fn task_states(api: &Client, connector: &str) -> Vec<(String, String, String)> {
    let answer = api.get(&format!("/connectors/{connector}/status")).await;
    answer.body["tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .map(|t| {
                    (
                        t["state"].as_str().unwrap_or_default().to_owned(),
                        t["worker_id"].as_str().unwrap_or_default().to_owned(),
                        t["trace"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn file_sink_with_tasks(name: &str, file: &Path, tasks: u32) -> Json {
    let mut body = sink(name, file, "share");
    body["config"]["tasks.max"] = json!(tasks.to_string());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_cap_counts_per_worker_and_tasks_that_fit_nowhere_wait_for_room() {
    let cluster =
        ProxiedDevBroker::start(1, &[("orders", 6)]).expect("dev broker behind the proxy");
    cluster.broker().set_share_auto_offset_reset("earliest");
    let bootstrap = cluster.bootstrap();
    let dir = tempfile::tempdir().expect("temp dir");
    let cap = [("tasks.max.per.worker", "2")];
    let mut workers: Vec<Worker> = (0..2)
        .map(|i| start_worker_with(&bootstrap, &dir.path().join(format!("w{i}")), &cap))
        .collect();

    // Three tasks: beyond one worker's cap, within the cluster's (2 + 2). Until the second
    // worker has joined, the cluster has one worker's capacity and says so.
    let start = Instant::now();
    let created = loop {
        let answer = create_retrying(
            &workers[0].api,
            file_sink_with_tasks("capped", &dir.path().join("capped.txt"), 3),
        )
        .await;
        if answer.status == 400 && answer.text.contains("1 live worker:") && start.elapsed() < WAIT
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        break answer;
    };
    assert_eq!(created.status, 201, "{}", created.text);
    let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    let placed = wait_placed(&workers[1].api, "capped", &all).await;
    let mut per_worker: BTreeMap<&str, usize> = BTreeMap::new();
    for worker in placed.values() {
        *per_worker.entry(worker.as_str()).or_default() += 1;
    }
    assert!(
        per_worker.len() == 2 && per_worker.values().all(|n| *n <= 2),
        "three tasks on two workers of cap 2: {placed:?}"
    );

    // Two more would make five on a capacity of four: refused, naming the limit and figures.
    let refused = create_retrying(
        &workers[1].api,
        file_sink_with_tasks("one-too-many", &dir.path().join("more.txt"), 2),
    )
    .await;
    let message = refused.assert_error(400);
    assert!(
        message.contains("tasks.max.per.worker summed over its 2 live workers: 2 + 2")
            && message.contains("at most 4 tasks")
            && message.contains("other connectors have 3")
            && message.contains("take it to 5"),
        "{message}"
    );

    // SIGKILL one: the survivor takes what fits (up to its cap), the task that fits nowhere
    // is reported UNASSIGNED with why, not dropped.
    let mut dead = workers.remove(0);
    dead.process.kill_9();
    let survivor = workers[0].id.clone();
    let start = Instant::now();
    loop {
        let tasks = task_states(&workers[0].api, "capped").await;
        let running_here = tasks
            .iter()
            .filter(|(state, worker, _)| state == "RUNNING" && *worker == survivor)
            .count();
        let waiting: Vec<&(String, String, String)> = tasks
            .iter()
            .filter(|(state, _, trace)| {
                state == "UNASSIGNED"
                    && trace.contains("no worker has room")
                    && trace.contains("tasks.max.per.worker")
            })
            .collect();
        if tasks.len() == 3 && running_here == 2 && waiting.len() == 1 {
            eprintln!(
                "after the kill: 2 tasks on {survivor}, one waiting ({}) after {:?}",
                waiting[0].2,
                start.elapsed()
            );
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "expected two tasks on the survivor and one reported waiting: {tasks:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Capacity returns: a new worker takes the waiting task; the survivor keeps its two.
    workers.push(start_worker_with(&bootstrap, &dir.path().join("w2"), &cap));
    let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    let placed = wait_placed(&workers[0].api, "capped", &all).await;
    let on_survivor = placed.values().filter(|w| **w == survivor).count();
    assert_eq!(on_survivor, 2, "{placed:?}");
    for w in workers {
        w.process.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_stopped_workers_tasks_never_show_running_on_it() {
    let cluster =
        ProxiedDevBroker::start(1, &[("orders", 6)]).expect("dev broker behind the proxy");
    cluster.broker().set_share_auto_offset_reset("earliest");
    let bootstrap = cluster.bootstrap();
    let dir = tempfile::tempdir().expect("temp dir");
    // A longer hold than the other tests': the reads below must come after the reader's view
    // refreshed (every second; slower on a loaded machine) and before the work moves.
    let hold = [("scheduled.rebalance.max.delay.ms", "8000")];
    let mut workers: Vec<Worker> = (0..2)
        .map(|i| start_worker_with(&bootstrap, &dir.path().join(format!("w{i}")), &hold))
        .collect();
    let ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let all: Vec<&str> = ids.iter().map(String::as_str).collect();
    // Created once both workers are in the group, so that the tasks are spread.
    let answer = create_retrying(
        &workers[0].api,
        file_sink_with_tasks("spread", &dir.path().join("out.txt"), 4),
    )
    .await;
    assert_eq!(answer.status, 201, "{}", answer.text);
    let start = Instant::now();
    let placed = loop {
        let placed = wait_placed(&workers[1].api, "spread", &all).await;
        let used: BTreeSet<&String> = placed.values().collect();
        if used.len() == 2 {
            break placed;
        }
        assert!(start.elapsed() < WAIT, "never spread: {placed:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // SIGTERM the first; read the status from the other before its tasks can have moved
    // (the departed worker's work is held for the delay after the rebalance that follows).
    let stopped = workers.remove(0);
    let stopped_id = stopped.id.clone();
    let its_tasks: Vec<u64> = placed
        .iter()
        .filter(|(_, w)| **w == stopped_id)
        .map(|(t, _)| *t)
        .collect();
    let (status, _) = tokio::task::spawn_blocking(move || stopped.process.stop_with_status())
        .await
        .expect("stopped");
    assert!(status.success(), "{status}");
    let exited = Instant::now();
    let api = &workers[0].api;
    let mut last = Vec::new();
    // Three refreshes of the reader's view (every second), well within the hold.
    while exited.elapsed() < Duration::from_millis(5_000) {
        last = task_states(api, "spread").await;
        let connector = api.get("/connectors/spread/status").await.body;
        if exited.elapsed() > Duration::from_millis(3_000) {
            for (state, worker, _) in &last {
                assert!(
                    !(state == "RUNNING" && *worker == stopped_id),
                    "a task shows RUNNING on the stopped worker {stopped_id}: {last:?}"
                );
            }
            assert!(
                !(connector["connector"]["state"] == "RUNNING"
                    && connector["connector"]["worker_id"] == stopped_id.as_str()),
                "the connector shows RUNNING on the stopped worker: {connector}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for task in &its_tasks {
        let (state, worker, _) = &last[*task as usize];
        assert!(
            (state == "UNASSIGNED" && *worker == stopped_id)
                || (state == "RUNNING" && *worker == workers[0].id),
            "task {task}: {state} on {worker}"
        );
    }
    eprintln!("tasks {its_tasks:?} of {stopped_id} after its SIGTERM: {last:?}");
    for w in workers {
        w.process.stop();
    }
}

/// `spillway demo --cluster`: the failover story on its own — placement before and after a
/// worker is SIGKILLed, and every record delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_demo_kills_a_worker_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
                .args([
                    "demo",
                    "--cluster",
                    "--records",
                    "4000",
                    "--timeout-secs",
                    "90",
                ])
                .arg("--output-dir")
                .arg(&dir)
                .env("RUST_LOG", "warn")
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("spillway demo --cluster runs")
        }
    })
    .await
    .expect("ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(output.status.success(), "{}: {stdout}", output.status);
    let before = stdout.find("before:").expect("placement before");
    let killed = stdout.find("SIGKILL worker").expect("a worker killed");
    let after = stdout.find("after:").expect("placement after");
    assert!(before < killed && killed < after, "{stdout}");
    // The victim runs nothing afterwards.
    let victim = stdout[killed..]
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(id, _)| id.to_owned())
        .expect("the victim's id");
    let placement_after = &stdout[after
        ..stdout[after..]
            .find("summary")
            .map_or(stdout.len(), |i| after + i)];
    assert!(!placement_after.contains(&victim), "{stdout}");
    assert!(
        stdout.contains("4000 distinct of 4000 records") && stdout.contains("0 missing"),
        "{stdout}"
    );
}

/// A CA of this test, and a certificate for 127.0.0.1 signed by it (the workers' listener
/// certificate, also presented as their client certificate), all PEM.
fn test_pki() -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("worker key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = params.signed_by(&key, &issuer).expect("worker cert");
    (
        ca.pem(),
        format!("{}{}{}", key.serialize_pem(), cert.pem(), ca.pem()),
    )
}

/// Two workers on https with mutual TLS (a CA of the test's own, unknown to the system): a
/// write sent to the worker that does not lead is forwarded to the leader, which trusts it
/// because it presents its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_forwarded_to_an_https_leader_with_the_workers_own_trust() {
    let cluster =
        ProxiedDevBroker::start(1, &[("orders", 2)]).expect("dev broker behind the proxy");
    let bootstrap = cluster.bootstrap();
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, identity) = test_pki();
    let keystore = dir.path().join("worker.pem");
    std::fs::write(&keystore, &identity).expect("keystore");
    let truststore = dir.path().join("ca.pem");
    std::fs::write(&truststore, &ca).expect("truststore");
    let (keystore, truststore) = (
        keystore.display().to_string(),
        truststore.display().to_string(),
    );
    let tls = [
        ("listeners", "https://127.0.0.1:0"),
        ("listeners.https.ssl.keystore.type", "PEM"),
        ("listeners.https.ssl.keystore.location", keystore.as_str()),
        ("listeners.https.ssl.truststore.type", "PEM"),
        (
            "listeners.https.ssl.truststore.location",
            truststore.as_str(),
        ),
        ("listeners.https.ssl.client.auth", "required"),
    ];
    let workers: Vec<WorkerProcess> = (0..2)
        .map(|i| {
            let dir = dir.path().join(format!("w{i}"));
            std::fs::create_dir_all(&dir).expect("worker dir");
            let owned = worker_properties(&bootstrap);
            let mut properties: Vec<(&str, &str)> = owned
                .iter()
                .filter(|(k, _)| *k != "rest.host.name" && *k != "rest.port")
                .map(|(k, v)| (*k, v.as_str()))
                .collect();
            properties.extend_from_slice(&tls);
            WorkerProcess::start(&properties, &dir, "info,spillway::rest::forward=debug")
        })
        .collect();
    assert!(workers.iter().all(|w| w.base.starts_with("https://")));
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(Duration::from_secs(60))
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca"))
        .identity(reqwest::Identity::from_pem(identity.as_bytes()).expect("identity"))
        .build()
        .expect("client");
    // One connector through each worker: the one through the worker that does not lead is
    // forwarded. 409 while the group forms (and, without the workers' trust, for every
    // forwarded write: the leader's certificate is not trusted).
    let mut last = String::new();
    for (i, worker) in workers.iter().enumerate() {
        let body = json!({"name": format!("via-{i}"), "initial_state": "PAUSED", "config": {
            "connector.class": "file", "topics": "orders", "tasks.max": "1",
            "file": dir.path().join(format!("out-{i}.txt")).display().to_string(),
            "consumer.override.group.protocol": "share",
        }});
        let start = Instant::now();
        loop {
            let answer = client
                .post(format!("{}/connectors", worker.base.trim_end_matches('/')))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body)
                .send()
                .await
                .expect("an https answer");
            let status = answer.status().as_u16();
            last = answer.text().await.unwrap_or_default();
            if status == 201 {
                break;
            }
            assert!(
                status == 409 && start.elapsed() < Duration::from_secs(45),
                "creating through worker {i}: {status} {last}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let forwarded = workers
        .iter()
        .filter(|w| w.log().contains("forwarding"))
        .count();
    assert_eq!(
        forwarded, 1,
        "one write went through the other worker; {last}"
    );
    // Both are the cluster's: listed by either worker once it has read the config topic.
    let start = Instant::now();
    loop {
        let listed: Json = client
            .get(format!(
                "{}/connectors",
                workers[0].base.trim_end_matches('/')
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answer")
            .json()
            .await
            .expect("json");
        if listed == json!(["via-0", "via-1"]) {
            break;
        }
        assert!(start.elapsed() < WAIT, "{listed}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for w in workers {
        w.stop();
    }
}
