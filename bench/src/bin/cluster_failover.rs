//! Distributed mode at scale (issue 16 item 8): `--workers` worker processes (3) run
//! `--connectors` share-mode file-sink connectors (50, `--tasks` tasks each) on one topic while
//! records arrive at `--rate` per second; the worker running the most tasks is SIGKILLed. It
//! measures the time from the kill until every task runs on a survivor, and the records
//! delivered per second (summed over every connector) before, during and after; then checks
//! that every connector's output holds every record produced.
//!
//! Goals (exit non-zero when missed): every task runs again within `session.timeout.ms` +
//! `scheduled.rebalance.max.delay.ms` + 15 s; no record lost; the rate after the failover at
//! least 80 % of the rate before (two workers carry what three did).
//!
//! Each worker is this program run again with `--worker-process FILE` (the `spillway worker`
//! code, `spillway::worker_cmd::run`), so the bench needs no other binary.
//!
//! `cargo run --release -p spillway-bench --bin cluster_failover -- [--connectors 50]
//! [--workers 3] [--tasks 2] [--rate 50] [--window-seconds 15] [--keep-dir --worker-log info]`

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value as Json};
use spillway_tests::{numbered_range, ProxiedDevBroker, TestProducer};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(long, default_value_t = 50)]
    connectors: usize,
    /// Tasks per connector.
    #[arg(long, default_value_t = 2)]
    tasks: usize,
    /// Records produced per second (every connector reads them all).
    #[arg(long, default_value_t = 50)]
    rate: u64,
    /// Length of the before and after windows.
    #[arg(long, default_value_t = 15)]
    window_seconds: u64,
    /// Keep the workers' folders (properties, logs at `--worker-log`) and print where.
    #[arg(long)]
    keep_dir: bool,
    /// The workers' log filter (RUST_LOG).
    #[arg(long, default_value = "warn")]
    worker_log: String,
    /// Run as one worker process with these properties (internal).
    #[arg(long, hide = true)]
    worker_process: Option<PathBuf>,
}

const PARTITIONS: i32 = 6;
const SESSION: Duration = Duration::from_secs(6);
const DELAY: Duration = Duration::from_secs(5);
const FAILOVER_MARGIN: Duration = Duration::from_secs(15);
const AFTER_RATE_GOAL: f64 = 0.8;
const WAIT: Duration = Duration::from_secs(180);

struct WorkerChild {
    child: Child,
    base: String,
    id: String,
}

impl Drop for WorkerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_worker(bootstrap: &str, dir: &Path, log: &str) -> Result<WorkerChild> {
    std::fs::create_dir_all(dir)?;
    let properties = dir.join("worker.properties");
    let lines = [
        ("bootstrap.servers", bootstrap.to_owned()),
        ("rest.host.name", "127.0.0.1".into()),
        ("rest.port", "0".into()),
        ("group.id", "failover-bench".into()),
        ("config.storage.topic", "bench-configs".into()),
        ("config.storage.replication.factor", "1".into()),
        ("status.storage.topic", "bench-status".into()),
        ("status.storage.replication.factor", "1".into()),
        ("status.storage.partitions", "3".into()),
        ("session.timeout.ms", SESSION.as_millis().to_string()),
        ("heartbeat.interval.ms", "1000".into()),
        (
            "scheduled.rebalance.max.delay.ms",
            DELAY.as_millis().to_string(),
        ),
        ("task.poll.timeout.ms", "100".into()),
    ];
    let text: String = lines.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(&properties, text)?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--worker-process")
        .arg(&properties)
        .current_dir(dir)
        .env("RUST_LOG", log)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("worker.log"))?)
        .spawn()
        .context("starting a worker process")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let Some(base) = line.trim().strip_prefix("REST API listening on ") else {
        bail!(
            "a worker did not start: '{line}' (log in {})",
            dir.display()
        );
    };
    Ok(WorkerChild {
        id: base.trim_start_matches("http://").to_owned(),
        base: base.to_owned(),
        child,
    })
}

/// Lines of each output file, counted as they grow.
struct Outputs {
    files: Vec<PathBuf>,
    read: Vec<(u64, u64)>,
}

impl Outputs {
    fn new(files: Vec<PathBuf>) -> Outputs {
        let read = vec![(0, 0); files.len()];
        Outputs { files, read }
    }

    /// Lines written to every file so far, summed.
    fn lines(&mut self) -> u64 {
        for (file, (offset, lines)) in self.files.iter().zip(self.read.iter_mut()) {
            let Ok(mut f) = std::fs::File::open(file) else {
                continue;
            };
            if f.seek(SeekFrom::Start(*offset)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            if f.read_to_end(&mut bytes).is_ok() {
                // Count complete lines only; a partly written line is read again next time.
                let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                *lines += bytes[..complete].iter().filter(|b| **b == b'\n').count() as u64;
                *offset += complete as u64;
            }
        }
        self.read.iter().map(|(_, l)| l).sum()
    }
}

fn values_in(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

async fn get(client: &reqwest::Client, url: &str) -> Option<Json> {
    let answer = client.get(url).send().await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    answer.json().await.ok()
}

/// Which worker runs each task of every connector; `None` until every task runs.
async fn placement(
    client: &reqwest::Client,
    base: &str,
    connectors: usize,
    tasks: usize,
) -> Option<BTreeMap<(usize, u64), String>> {
    let mut placed = BTreeMap::new();
    for c in 0..connectors {
        let status = get(client, &format!("{base}/connectors/sink-{c}/status")).await?;
        let listed = status["tasks"].as_array()?;
        if listed.len() != tasks || listed.iter().any(|t| t["state"] != "RUNNING") {
            return None;
        }
        for t in listed {
            placed.insert((c, t["id"].as_u64()?), t["worker_id"].as_str()?.to_owned());
        }
    }
    Some(placed)
}

async fn measure_rate(outputs: &mut Outputs, window: Duration) -> f64 {
    let start = (Instant::now(), outputs.lines());
    tokio::time::sleep(window).await;
    let delivered = outputs.lines() - start.1;
    delivered as f64 / start.0.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(properties) = args.worker_process {
        // Logs to standard error as `spillway worker` writes them (RUST_LOG).
        let mut config = spillway::telemetry::TelemetryConfig::from_env()?;
        config.traces = None;
        let mut telemetry = spillway::telemetry::init(config)?;
        let result = spillway::worker_cmd::run(properties).await;
        telemetry.shutdown();
        return result;
    }
    let cluster =
        ProxiedDevBroker::start(1, &[("load", PARTITIONS)]).map_err(anyhow::Error::msg)?;
    let broker = cluster.broker();
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(3000);
    // The killed worker's share consumers keep their partitions until the share group drops
    // them (Kafka's share.session.timeout.ms, 45 s by default): the same 6 s as the workers'
    // session here, so that the rate after the failover measures the survivors.
    broker.set_share_session_timeout(SESSION.as_millis() as i32);
    broker.set_share_heartbeat_interval(1000);
    broker.set_share_max_delivery_attempts(20);
    let bootstrap = cluster.bootstrap();
    let dir = tempfile::tempdir()?;
    if args.keep_dir {
        println!("workers' folders under {}", dir.path().display());
    }
    let mut workers = Vec::new();
    for i in 0..args.workers {
        workers.push(start_worker(
            &bootstrap,
            &dir.path().join(format!("w{i}")),
            &args.worker_log,
        )?);
    }
    let client = reqwest::Client::new();
    let files: Vec<PathBuf> = (0..args.connectors)
        .map(|c| dir.path().join(format!("out-{c}.txt")))
        .collect();
    let started = Instant::now();
    for (c, file) in files.iter().enumerate() {
        let body = json!({"name": format!("sink-{c}"), "config": {
            "connector.class": "file", "topics": "load", "tasks.max": args.tasks.to_string(),
            "file": file.display().to_string(),
            "consumer.override.group.protocol": "share",
        }});
        loop {
            let answer = client
                .post(format!("{}/connectors", workers[c % workers.len()].base))
                .json(&body)
                .send()
                .await?;
            match answer.status().as_u16() {
                201 => break,
                409 if started.elapsed() < WAIT => {
                    tokio::time::sleep(Duration::from_millis(250)).await
                }
                status => bail!("creating sink-{c}: {status} {}", answer.text().await?),
            }
        }
    }
    let created = started.elapsed();
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producing = tokio::spawn({
        let bootstrap = bootstrap.clone();
        let rate = args.rate;
        let stop = Arc::clone(&stop_producing);
        async move {
            let producer = TestProducer::new(&bootstrap, "none");
            let mut next = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let per_tick = (rate / 10).max(1);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                producer
                    .send("load", numbered_range(next, per_tick, PARTITIONS))
                    .await;
                next += per_tick;
            }
            next
        }
    });
    let base = workers[0].base.clone();
    let mut placed = None;
    while placed.is_none() {
        if started.elapsed() > WAIT {
            bail!("the connectors' tasks did not all start within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        placed = placement(&client, &base, args.connectors, args.tasks).await;
    }
    let placed = placed.expect("placed");
    let all_running = started.elapsed();
    let mut outputs = Outputs::new(files.clone());
    let window = Duration::from_secs(args.window_seconds);
    let before = measure_rate(&mut outputs, window).await;

    // The worker running the most tasks dies.
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    for w in placed.values() {
        *load.entry(w.as_str()).or_default() += 1;
    }
    let victim = load
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(w, _)| w.to_string())
        .context("no task placed")?;
    let index = workers
        .iter()
        .position(|w| w.id == victim)
        .context("victim")?;
    let mut dead = workers.remove(index);
    let killed = (Instant::now(), outputs.lines());
    dead.child.kill()?;
    let _ = dead.child.wait();
    let survivors: BTreeSet<String> = workers.iter().map(|w| w.id.clone()).collect();
    let base = workers[0].base.clone();
    let failover = loop {
        if killed.0.elapsed() > WAIT {
            bail!("the tasks did not all run on the survivors within {WAIT:?}");
        }
        if let Some(now) = placement(&client, &base, args.connectors, args.tasks).await {
            if now.values().all(|w| survivors.contains(w)) {
                break killed.0.elapsed();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let during = (outputs.lines() - killed.1) as f64 / failover.as_secs_f64();
    let after = measure_rate(&mut outputs, window).await;
    stop_producing.store(true, Ordering::Relaxed);
    // Every record produced, in every connector's output.
    let produced = producing.await?;
    let expected: BTreeSet<String> = (0..produced).map(|n| format!("v{n}")).collect();
    let drained = Instant::now();
    let mut missing = usize::MAX;
    while drained.elapsed() < WAIT {
        missing = files
            .iter()
            .map(|f| expected.difference(&values_in(f)).count())
            .sum();
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    if args.keep_dir {
        let _ = dir.keep();
    }
    let goal_failover = SESSION + DELAY + FAILOVER_MARGIN;
    println!(
        "{} workers, {} connectors x {} tasks, {} records/s produced (each connector reads all)",
        args.workers, args.connectors, args.tasks, args.rate
    );
    println!(
        "  created in {:.1} s; every task running {:.1} s after the first create",
        created.as_secs_f64(),
        all_running.as_secs_f64()
    );
    println!(
        "  SIGKILL of {victim} ({} tasks): every task running on the survivors after {:.1} s (goal <= {:.0} s: session {} s + delay {} s + {} s)",
        load[victim.as_str()],
        failover.as_secs_f64(),
        goal_failover.as_secs_f64(),
        SESSION.as_secs(),
        DELAY.as_secs(),
        FAILOVER_MARGIN.as_secs()
    );
    println!(
        "  delivered records/s (all connectors): before {before:.0}, during {during:.0}, after {after:.0} (after/before {:.2}, goal >= {AFTER_RATE_GOAL})",
        after / before.max(1.0)
    );
    println!(
        "  ({} records/s produced x {} connectors arrive in all when the connectors keep up)",
        args.rate, args.connectors
    );
    println!("  records produced {produced}; missing from the outputs: {missing}");
    let mut missed = Vec::new();
    if failover > goal_failover {
        missed.push("failover time");
    }
    if missing != 0 {
        missed.push("records lost");
    }
    if after < AFTER_RATE_GOAL * before {
        missed.push("rate after the failover");
    }
    if !missed.is_empty() {
        bail!("goals missed: {}", missed.join(", "));
    }
    Ok(())
}
