//! `spillway dev-cluster`: the dev broker plus N workers in distributed mode, so a user can
//! see a cluster work (create a connector through one worker, watch its tasks spread, kill a
//! worker and watch them move). The dev broker stands behind the test-kit proxy, whose admin
//! emulation creates the workers' compacted config and status topics as Kafka would.
//!
//! Each worker is a `spillway worker` process of this binary with its properties and log in a
//! folder of its own; the command prints the bootstrap list and every worker's REST URL and
//! runs until SIGTERM or Ctrl-C, then stops the workers gracefully (SIGTERM) and the broker.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use spillway_tests::ProxiedDevBroker;

use crate::dev_broker::TopicSpec;

/// How long a worker may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The properties of a dev-cluster worker at `bootstrap` listening on `rest_port`.
fn worker_properties(bootstrap: &str, rest_port: u16) -> String {
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
        // Quick to notice a dead worker and move its tasks, for watching it happen.
        ("session.timeout.ms", "6000".to_owned()),
        ("heartbeat.interval.ms", "1000".to_owned()),
        ("scheduled.rebalance.max.delay.ms", "10000".to_owned()),
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

fn start_worker(dir: &std::path::Path, bootstrap: &str, rest_port: u16) -> Result<WorkerChild> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let properties = dir.join("worker.properties");
    std::fs::write(&properties, worker_properties(bootstrap, rest_port))
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
        match start_worker(&root.join(format!("worker-{i}")), &bootstrap, port) {
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
