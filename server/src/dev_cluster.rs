//! `spillway dev-cluster`: the dev broker plus N workers in distributed mode, so a user can
//! see a cluster work (create a connector through one worker, watch its tasks spread, kill a
//! worker and watch them move). The dev broker stands behind the test-kit proxy, whose admin
//! emulation creates the workers' compacted config and status topics as Kafka would.
//!
//! Each worker is a `spillway worker` process of this binary with its properties and log in a
//! folder of its own; the command prints the bootstrap list and every worker's REST URL and
//! runs until SIGTERM or Ctrl-C, then stops the workers gracefully (SIGTERM) and the broker.
//!
//! `spillway demo --cluster` ([`demo`]) tells the failover story on its own: three workers, a
//! share-group file sink spread over them, a worker SIGKILLed while records flow, its tasks
//! running on the survivors, and a check that every record arrived.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use spillway_tests::ProxiedDevBroker;

use crate::dev_broker::TopicSpec;

/// How long a worker may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Group timings of the dev cluster: quick to notice a dead worker and move its tasks, for
/// watching it happen.
struct Timings {
    session_ms: u64,
    heartbeat_ms: u64,
    delay_ms: u64,
}

const DEV_CLUSTER_TIMINGS: Timings = Timings {
    session_ms: 6000,
    heartbeat_ms: 1000,
    delay_ms: 10_000,
};

/// The cluster demo's: the failover within about ten seconds.
const DEMO_TIMINGS: Timings = Timings {
    session_ms: 4000,
    heartbeat_ms: 500,
    delay_ms: 3000,
};

/// The properties of a dev-cluster worker at `bootstrap` listening on `rest_port`.
fn worker_properties(bootstrap: &str, rest_port: u16, timings: &Timings) -> String {
    [
        ("bootstrap.servers", bootstrap.to_owned()),
        ("rest.host.name", "127.0.0.1".to_owned()),
        ("rest.port", rest_port.to_string()),
        ("group.id", "spillway-dev-cluster".to_owned()),
        ("config.storage.topic", "spillway-dev-configs".to_owned()),
        ("config.storage.replication.factor", "1".to_owned()),
        ("status.storage.topic", "spillway-dev-status".to_owned()),
        ("status.storage.replication.factor", "1".to_owned()),
        ("status.storage.partitions", "1".to_owned()),
        ("session.timeout.ms", timings.session_ms.to_string()),
        ("heartbeat.interval.ms", timings.heartbeat_ms.to_string()),
        (
            "scheduled.rebalance.max.delay.ms",
            timings.delay_ms.to_string(),
        ),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={v}\n"))
    .collect()
}

struct WorkerChild {
    child: Child,
    url: String,
    log: PathBuf,
}

fn start_worker(
    dir: &std::path::Path,
    bootstrap: &str,
    rest_port: u16,
    timings: &Timings,
) -> Result<WorkerChild> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let properties = dir.join("worker.properties");
    std::fs::write(
        &properties,
        worker_properties(bootstrap, rest_port, timings),
    )
    .with_context(|| format!("cannot write {}", properties.display()))?;
    let log = dir.join("worker.log");
    let exe = std::env::current_exe().context("cannot find the spillway binary")?;
    let mut child = Command::new(exe)
        .arg("worker")
        .arg(&properties)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).context("cannot create the worker's log")?)
        .spawn()
        .context("cannot start a worker process")?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("the worker's output")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(url) = line.trim().strip_prefix("REST API listening on ") else {
        let _ = child.kill();
        bail!(
            "a worker did not start; its log {}:\n{}",
            log.display(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    Ok(WorkerChild {
        url: url.to_owned(),
        child,
        log,
    })
}

/// SIGTERM to every worker at once, then waits for each (killing one that takes too long).
fn stop_all(workers: Vec<WorkerChild>) {
    for worker in &workers {
        let _ = Command::new("kill")
            .args(["-TERM", &worker.child.id().to_string()])
            .status();
    }
    let start = Instant::now();
    for mut worker in workers {
        loop {
            if let Ok(Some(_)) = worker.child.try_wait() {
                break;
            }
            if start.elapsed() > STOP_TIMEOUT {
                eprintln!(
                    "dev cluster: worker {} did not stop in time; killing it",
                    worker.url
                );
                let _ = worker.child.kill();
                let _ = worker.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

pub async fn run(workers: u32, first_port: u16, topics: Vec<TopicSpec>) -> Result<()> {
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    let mut signals = spillway::signals::StopSignals::listen()?;
    let specs: Vec<(&str, i32)> = topics
        .iter()
        .map(|t| (t.name.as_str(), t.partitions))
        .collect();
    let cluster = ProxiedDevBroker::start(1, &specs)
        .map_err(anyhow::Error::msg)
        .context("starting the dev broker")?;
    cluster.broker().set_share_auto_offset_reset("earliest");
    let bootstrap = cluster.bootstrap();
    let root = std::env::temp_dir().join(format!("spillway-dev-cluster-{}", std::process::id()));
    println!("bootstrap={bootstrap}");
    let mut running = Vec::new();
    for i in 0..workers {
        let port = if first_port == 0 {
            0
        } else {
            first_port.saturating_add(i as u16)
        };
        match start_worker(
            &root.join(format!("worker-{i}")),
            &bootstrap,
            port,
            &DEV_CLUSTER_TIMINGS,
        ) {
            Ok(worker) => {
                println!("worker {i}: {} (log {})", worker.url, worker.log.display());
                running.push(worker);
            }
            Err(e) => {
                stop_all(running);
                return Err(e);
            }
        }
    }
    eprintln!(
        "dev cluster: {workers} worker(s) in group spillway-dev-cluster on {bootstrap}; create connectors through any worker's REST API. Ctrl-C or SIGTERM stops it."
    );
    let signal = signals.recv().await;
    eprintln!("dev cluster: {signal}; stopping the workers");
    tokio::task::spawn_blocking(move || stop_all(running))
        .await
        .context("stopping the workers")?;
    drop(cluster);
    Ok(())
}

/// What `spillway demo --cluster` runs.
pub struct ClusterDemo {
    pub workers: u32,
    pub records: u64,
    pub partitions: i32,
    pub tasks: usize,
    pub output_dir: PathBuf,
    pub timeout: Duration,
}

const DEMO_TOPIC: &str = "demo.orders";
const DEMO_CONNECTOR: &str = "orders-share";

/// The record numbers in the demo's output file (lines start `v<n>:`), and how many lines.
fn delivered(path: &std::path::Path) -> (std::collections::BTreeSet<u64>, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let numbers = text
        .lines()
        .filter_map(|l| l.strip_prefix('v')?.split(':').next()?.parse().ok())
        .collect();
    (numbers, text.lines().count())
}

/// Each task's state and worker id, from `GET /connectors/NAME/status` on `url`.
async fn task_placement(
    http: &reqwest::Client,
    url: &str,
) -> Option<std::collections::BTreeMap<u64, (String, String)>> {
    let status: serde_json::Value = http
        .get(format!("{url}/connectors/{DEMO_CONNECTOR}/status"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let tasks = status["tasks"].as_array()?;
    Some(
        tasks
            .iter()
            .map(|t| {
                let text = |k: &str| t[k].as_str().unwrap_or_default().to_owned();
                (
                    t["id"].as_u64().unwrap_or_default(),
                    (text("state"), text("worker_id")),
                )
            })
            .collect(),
    )
}

/// Waits until all `tasks` run on workers in `ids`; returns task → worker.
async fn wait_running(
    http: &reqwest::Client,
    url: &str,
    tasks: usize,
    ids: &[String],
    timeout: Duration,
) -> Result<std::collections::BTreeMap<u64, String>> {
    let start = Instant::now();
    loop {
        if let Some(placed) = task_placement(http, url).await {
            if placed.len() == tasks
                && placed
                    .values()
                    .all(|(state, worker)| state == "RUNNING" && ids.contains(worker))
            {
                return Ok(placed.into_iter().map(|(t, (_, w))| (t, w)).collect());
            }
            if start.elapsed() > timeout {
                bail!("the tasks did not all run on {ids:?} within {timeout:?}: {placed:?}");
            }
        } else if start.elapsed() > timeout {
            bail!("no status from {url} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn print_placement(what: &str, placed: &std::collections::BTreeMap<u64, String>, ids: &[String]) {
    println!("{what}:");
    for (i, id) in ids.iter().enumerate() {
        let tasks: Vec<String> = placed
            .iter()
            .filter(|(_, w)| *w == id)
            .map(|(t, _)| format!("task {t}"))
            .collect();
        if !tasks.is_empty() {
            println!("  worker {i} ({id}): {}", tasks.join(", "));
        }
    }
}

/// `spillway demo --cluster`: a dev broker, `workers` worker processes in one group, a
/// share-group file sink of `tasks` tasks created through the REST API, half the records
/// before and half while a worker running tasks is SIGKILLed; prints where the tasks ran
/// before and after, and fails when a record did not arrive.
pub async fn demo(options: ClusterDemo) -> Result<()> {
    let ClusterDemo {
        workers,
        records,
        partitions,
        tasks,
        output_dir,
        timeout,
    } = options;
    if workers < 2 {
        bail!("--workers must be at least 2 for the cluster demo: one of them is killed");
    }
    std::fs::create_dir_all(&output_dir)
        .with_context(|| format!("cannot create {}", output_dir.display()))?;
    let out = output_dir.join("orders-share.txt");
    let _ = std::fs::remove_file(&out);
    println!(
        "starting the dev broker and {workers} workers in one group (state in Kafka topics)..."
    );
    let cluster = tokio::task::spawn_blocking(move || {
        let cluster =
            ProxiedDevBroker::start(1, &[(DEMO_TOPIC, partitions)]).map_err(anyhow::Error::msg)?;
        let broker = cluster.broker();
        broker.set_share_auto_offset_reset("earliest");
        // A killed worker's share consumers are dropped after 3 s (Kafka's
        // share.session.timeout.ms, 45 s by default), their locked records after 2 s.
        broker.set_share_session_timeout(3000);
        broker.set_share_heartbeat_interval(300);
        broker.set_share_record_lock_duration(2000);
        Ok::<_, anyhow::Error>(cluster)
    })
    .await
    .context("the dev broker launcher panicked")??;
    let bootstrap = cluster.bootstrap();
    let root = std::env::temp_dir().join(format!("spillway-demo-cluster-{}", std::process::id()));
    let mut running: Vec<Option<WorkerChild>> = Vec::new();
    for i in 0..workers {
        match start_worker(
            &root.join(format!("worker-{i}")),
            &bootstrap,
            0,
            &DEMO_TIMINGS,
        ) {
            Ok(worker) => {
                println!("worker {i}: {} (log {})", worker.url, worker.log.display());
                running.push(Some(worker));
            }
            Err(e) => {
                stop_all(running.into_iter().flatten().collect());
                return Err(e);
            }
        }
    }
    let result = failover(
        &mut running,
        &bootstrap,
        records,
        partitions,
        tasks,
        &out,
        timeout,
    )
    .await;
    let survivors: Vec<WorkerChild> = running.into_iter().flatten().collect();
    tokio::task::spawn_blocking(move || stop_all(survivors))
        .await
        .context("stopping the workers")?;
    drop(cluster);
    result
}

async fn failover(
    workers: &mut [Option<WorkerChild>],
    bootstrap: &str,
    records: u64,
    partitions: i32,
    tasks: usize,
    out: &std::path::Path,
    timeout: Duration,
) -> Result<()> {
    let http = reqwest::Client::new();
    let urls: Vec<String> = workers
        .iter()
        .flatten()
        .map(|w| w.url.trim_end_matches('/').to_owned())
        .collect();
    let ids: Vec<String> = urls
        .iter()
        .map(|u| u.trim_start_matches("http://").to_owned())
        .collect();
    let first_half = records / 2;
    let all = spillway_tests::numbered_records(records, 100, partitions);
    let (early, late) = all.split_at(first_half as usize);
    // One producer for the whole run: on the dev broker a closing client connection ends every
    // share session on that broker (a divergence from Kafka).
    let producer = std::sync::Arc::new(spillway_tests::TestProducer::new(bootstrap, "lz4"));
    producer.send(DEMO_TOPIC, early.to_vec()).await;
    println!("produced {first_half} orders to {DEMO_TOPIC} ({partitions} partitions)");

    let body = serde_json::json!({"name": DEMO_CONNECTOR, "config": {
        "connector.class": "FileStreamSink",
        "topics": DEMO_TOPIC,
        "tasks.max": tasks.to_string(),
        "value.converter": "string",
        "file": out.display().to_string(),
        "consumer.override.group.protocol": "share",
    }});
    // Through the last worker: a worker that does not lead forwards the write to the leader;
    // 409 while the group is still forming.
    let start = Instant::now();
    loop {
        let answer = http
            .post(format!("{}/connectors", urls[urls.len() - 1]))
            .json(&body)
            .send()
            .await
            .context("POST /connectors")?;
        let status = answer.status().as_u16();
        if status == 201 {
            break;
        }
        let text = answer.text().await.unwrap_or_default();
        if status != 409 || start.elapsed() > timeout {
            bail!("creating the connector answered {status}: {text}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "created {DEMO_CONNECTOR} (share group, {tasks} tasks) through worker {}",
        urls.len() - 1
    );
    let before = wait_running(&http, &urls[0], tasks, &ids, timeout).await?;
    print_placement("before", &before, &ids);

    let late = late.to_vec();
    let late_producer = std::sync::Arc::clone(&producer);
    // In twenty batches over about five seconds, so that the kill comes while records flow.
    let producing = tokio::spawn(async move {
        for batch in late.chunks(late.len().div_ceil(20).max(1)) {
            late_producer.send(DEMO_TOPIC, batch.to_vec()).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    // Kill, mid-flow, a worker that runs tasks; the others are asked from then on.
    let start = Instant::now();
    while delivered(out).0.len() as u64 <= first_half && start.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let victim_id = before.values().last().context("no task placed")?.clone();
    let victim = ids
        .iter()
        .position(|id| *id == victim_id)
        .context("victim")?;
    let Some(mut dead) = workers[victim].take() else {
        bail!("worker {victim} is gone already");
    };
    let (written, _) = delivered(out);
    let _ = dead.child.kill();
    let _ = dead.child.wait();
    let killed = Instant::now();
    let its: Vec<String> = before
        .iter()
        .filter(|(_, w)| **w == victim_id)
        .map(|(t, _)| format!("task {t}"))
        .collect();
    println!(
        "SIGKILL worker {victim} ({victim_id}), which ran {}, with {} of {records} records written",
        its.join(", "),
        written.len()
    );
    let survivors: Vec<String> = ids.iter().filter(|id| **id != victim_id).cloned().collect();
    let asked = urls
        .iter()
        .zip(&ids)
        .find(|(_, id)| **id != victim_id)
        .map(|(u, _)| u.clone())
        .context("a survivor")?;
    let after = wait_running(&http, &asked, tasks, &survivors, timeout).await?;
    println!(
        "its tasks run on the survivors {:.1} s after the kill (session.timeout.ms {} + scheduled.rebalance.max.delay.ms {} + the rebalance)",
        killed.elapsed().as_secs_f64(),
        DEMO_TIMINGS.session_ms,
        DEMO_TIMINGS.delay_ms
    );
    print_placement("after", &after, &ids);
    producing.await.context("the producer task panicked")?;
    let start = Instant::now();
    while (delivered(out).0.len() as u64) < records && start.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (numbers, lines) = delivered(out);
    let missing = (0..records).filter(|n| !numbers.contains(n)).count();
    println!();
    println!(
        "summary: {} distinct of {records} records in {} ({missing} missing; {} delivered again after the kill, share-group at-least-once)",
        numbers.len(),
        out.display(),
        lines.saturating_sub(numbers.len())
    );
    drop(producer);
    if missing > 0 {
        bail!("{missing} records did not arrive");
    }
    println!("every record arrived although worker {victim} was killed");
    Ok(())
}
