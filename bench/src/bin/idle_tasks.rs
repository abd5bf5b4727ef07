//! What an idle task costs the worker: threads, file descriptors and resident memory per task,
//! measured on this process while a worker runs one file-sink connector of `--tasks` tasks on
//! an empty topic (share mode by default). The worker's `tasks.max.per.worker` default is
//! chosen from these figures (docs/tenants.md).
//!
//! `cargo run -p spillway-bench --bin idle_tasks -- [--tasks N] [--mode share|classic]`

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::config_map;
use spillway_tests::DevBroker;

#[derive(Parser)]
struct Args {
    /// Tasks of the one connector.
    #[arg(long, default_value_t = 50)]
    tasks: usize,
    /// share or classic.
    #[arg(long, default_value = "share")]
    mode: String,
    /// How long the tasks idle before the measurement.
    #[arg(long, default_value_t = 5)]
    settle_seconds: u64,
}

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
    let tasks = args.tasks.to_string();
    let worker = Worker::start(
        config_map(&[
            ("bootstrap.servers", &broker.bootstrap()),
            ("tasks.max.per.connector", &tasks),
            ("tasks.max.per.worker", &tasks),
        ]),
        ConnectorRegistry::builtin(),
    )?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = footprint();
    let file = dir.join("out.txt").display().to_string();
    worker
        .start_connector(config_map(&[
            ("name", "idle"),
            ("connector.class", "file"),
            ("topics", "idle"),
            ("file", &file),
            ("tasks.max", &tasks),
            ("consumer.override.group.protocol", &args.mode),
        ]))
        .await?;
    let started = Instant::now();
    loop {
        let running = worker.status("idle").map_or(0, |s| {
            s.tasks.iter().filter(|t| t.state == State::Running).count()
        });
        if running == args.tasks {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("only {running} of {} tasks are running", args.tasks);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
    let after = footprint();
    let per = |a: usize, b: usize| (a.saturating_sub(b)) as f64 / args.tasks as f64;
    println!(
        "{} idle {} tasks: threads {} -> {} ({:.1}/task), fds {} -> {} ({:.1}/task), RSS {} -> {} KiB ({:.0} KiB/task)",
        args.tasks,
        args.mode,
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
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
