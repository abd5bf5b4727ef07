//! What an idle task costs the worker: threads, file descriptors and resident memory per task,
//! measured on this process while a worker runs connectors of `--tasks` tasks in all (at most
//! 64 a connector, the default `tasks.max.per.connector`) on an empty topic (share mode by
//! default). The weights by which the worker counts a task against its open-file and thread
//! limits (`SHARE_TASK_WEIGHT`, `CLASSIC_TASK_WEIGHT` in actors/src/limits.rs) come from these
//! figures (docs/tenants.md).
//!
//! Goal (share mode, 2,000 tasks by default): the tasks share the worker's thread pool (at most
//! 0.01 thread per task) and the whole process stays within 4,096 file descriptors, the
//! kernel's default hard limit that the worker raises its soft limit to. Exits non-zero when
//! it misses. Classic mode prints its figures against the same goal: a librdkafka consumer per
//! task cannot meet it (docs/tenants.md says why).
//!
//! `cargo run -p spillway-bench --bin idle_tasks -- [--tasks N] [--mode share|classic]
//! [--sink http|file]`

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::config_map;
use spillway_tests::DevBroker;

#[derive(Parser)]
struct Args {
    /// Tasks in all.
    #[arg(long, default_value_t = 2000)]
    tasks: usize,
    /// The sink: `http` holds no descriptor while idle (the runtime's cost alone); `file`
    /// opens its file once per task.
    #[arg(long, default_value = "http")]
    sink: String,
    /// share or classic.
    #[arg(long, default_value = "share")]
    mode: String,
    /// How long the tasks idle before the measurement.
    #[arg(long, default_value_t = 5)]
    settle_seconds: u64,
}

/// Tasks per connector: the default `tasks.max.per.connector`.
const TASKS_PER_CONNECTOR: usize = 64;
/// The most threads an idle task may add (the pool's are shared).
const GOAL_THREADS_PER_TASK: f64 = 0.01;
/// The kernel's default hard open-file limit (INR_OPEN_MAX).
const GOAL_FDS: usize = 4096;

/// Threads, open file descriptors and resident KiB of this process.
fn footprint() -> (usize, usize, u64) {
    let count = |dir: &str| std::fs::read_dir(dir).map_or(0, |d| d.count());
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (count("/proc/self/task"), count("/proc/self/fd"), rss_kib)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let broker = DevBroker::start(1);
    broker.create_topic("idle", 1);
    let dir = std::env::temp_dir().join(format!("spillway-idle-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let worker = Worker::start(
        config_map(&[
            ("bootstrap.servers", &broker.bootstrap()),
            ("tasks.max.per.worker", &args.tasks.max(1).to_string()),
        ]),
        ConnectorRegistry::builtin(),
    )?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = footprint();
    let mut names = Vec::new();
    let mut left = args.tasks;
    while left > 0 {
        let tasks = left.min(TASKS_PER_CONNECTOR);
        left -= tasks;
        let name = format!("idle-{}", names.len());
        let file = dir.join(format!("{name}.txt")).display().to_string();
        let tasks_text = tasks.to_string();
        let mut config = config_map(&[
            ("name", &name),
            ("topics", "idle"),
            ("tasks.max", &tasks_text),
            ("consumer.override.group.protocol", &args.mode),
        ]);
        match args.sink.as_str() {
            "file" => {
                config.insert("connector.class".into(), "file".into());
                config.insert("file".into(), file);
            }
            "http" => {
                config.insert("connector.class".into(), "http".into());
                // Never called: the topic stays empty.
                config.insert("http.url".into(), "http://127.0.0.1:9/idle".into());
            }
            other => bail!("--sink {other}: expected http or file"),
        }
        worker.start_connector(config).await?;
        names.push((name, tasks));
    }
    let started = Instant::now();
    loop {
        let running: usize = names
            .iter()
            .map(|(name, _)| {
                worker.status(name).map_or(0, |s| {
                    s.tasks.iter().filter(|t| t.state == State::Running).count()
                })
            })
            .sum();
        if running == args.tasks {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("only {running} of {} tasks are running", args.tasks);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let start_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
    let after = footprint();
    let per = |a: usize, b: usize| (a.saturating_sub(b)) as f64 / args.tasks as f64;
    println!(
        "{} idle {} tasks ({} sink, {} connectors, {} pool threads, running after {start_secs:.1} s): \
         threads {} -> {} ({:.3}/task), fds {} -> {} ({:.2}/task), RSS {} -> {} KiB ({:.0} KiB/task)",
        args.tasks,
        args.mode,
        args.sink,
        names.len(),
        worker.task_pool().threads(),
        before.0,
        after.0,
        per(after.0, before.0),
        before.1,
        after.1,
        per(after.1, before.1),
        before.2,
        after.2,
        per(after.2 as usize, before.2 as usize),
    );
    let threads_per_task = per(after.0, before.0);
    let mut missed = Vec::new();
    if threads_per_task > GOAL_THREADS_PER_TASK {
        missed.push(format!(
            "{threads_per_task:.3} threads per task (goal at most {GOAL_THREADS_PER_TASK})"
        ));
    }
    if after.1 > GOAL_FDS {
        missed.push(format!(
            "{} file descriptors in the process (goal at most {GOAL_FDS})",
            after.1
        ));
    }
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    if missed.is_empty() {
        println!(
            "goal met: threads per task <= {GOAL_THREADS_PER_TASK}, process fds <= {GOAL_FDS}"
        );
        Ok(())
    } else {
        bail!("goal missed: {}", missed.join("; "))
    }
}
