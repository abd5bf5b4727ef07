//! Idle CPU: what a worker's connector tasks cost in CPU while their topic has nothing to read,
//! against as many librdkafka C consumers in the same mode, idle too (issue 18). `idle_tasks`
//! measures the same tasks' threads, descriptors and memory.
//!
//! `cargo run --release -p spillway-bench --bin idle_cpu -- [--mode classic|share] [--tasks 10]`
//!
//! A worker (a child process, as `spillway worker` runs) starts `--tasks` file-sink connectors
//! of one task each, each in a group of its own, on an empty one-partition topic; the C side is
//! `--tasks` processes of `bench/c/librdkafka_reference.c`, each its own group. Each contender
//! runs on a fresh dev cluster, the order alternating over `--rounds`. After `--settle-seconds`
//! (every group joined), the CPU time and thread switches of all their threads are read over
//! `--seconds` from `/proc/PID/task/*/` (`schedstat`'s run time, in nanoseconds, and the
//! switch counts of `status`). It prints, per task and second, CPU milliseconds and switches for
//! both and their ratio. A figure with no goal in issue 18: it reports and does not gate.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use spillway_actors::Worker;
use spillway_bench::c_reference::{max, median, min, CReference};
use spillway_bench::{child_command, start_broker};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::config_map;

const TOPIC: &str = "idle";

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Mode {
    /// Consumer groups (rdkafka in the worker, `rd_kafka_consumer_poll` in C).
    Classic,
    /// Share groups (Spillway's share client, `rd_kafka_share_poll` in C).
    Share,
}

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    #[arg(long, value_enum, default_value_t = Mode::Classic)]
    mode: Mode,
    /// Connector tasks in the worker, and C consumers.
    #[arg(long, default_value_t = 10)]
    tasks: usize,
    /// Rounds, each contender on a fresh cluster, the order alternating.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// How long every group gets to settle before the reading starts.
    #[arg(long, default_value_t = 8)]
    settle_seconds: u64,
    /// How long the reading lasts.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

#[derive(Subcommand)]
enum Role {
    /// Internal: a worker with `tasks` idle connectors; prints `ready`, stops at end of input.
    Worker {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        tasks: usize,
        #[arg(long, value_enum)]
        mode: Mode,
    },
}

fn main() -> Result<()> {
    // As the worker does (`spillway` main).
    spillway_actors::allocator::use_jemalloc();
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    if let Some(Role::Worker {
        bootstrap,
        tasks,
        mode,
    }) = &args.role
    {
        return runtime.block_on(worker(bootstrap, *tasks, *mode));
    }
    let reference = CReference::build()?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let c_first = round % 2 == 0;
        for c_turn in [c_first, !c_first] {
            let broker = start_broker(1, TOPIC, 1, None)?;
            let bootstrap = broker.bootstrap();
            let mut processes = if c_turn {
                eprintln!("round {}: {} idle C consumers...", round + 1, args.tasks);
                (0..args.tasks)
                    .map(|i| c_consumer(&reference, args.mode, &bootstrap, i))
                    .collect::<Result<Vec<_>>>()?
            } else {
                eprintln!(
                    "round {}: a worker with {} idle tasks...",
                    round + 1,
                    args.tasks
                );
                vec![worker_process(&args, &bootstrap)?]
            };
            let reading = read_idle(&mut processes, &args);
            for child in &mut processes {
                stop(child);
            }
            let reading = reading?;
            let per_task = reading.per_task_second(args.tasks, args.seconds);
            eprintln!(
                "  {:.3} ms CPU and {:.1} switches per task-second",
                per_task.0, per_task.1
            );
            if c_turn { &mut theirs } else { &mut ours }.push(per_task);
        }
    }
    let line = |name: &str, rounds: &[(f64, f64)]| {
        let cpu: Vec<f64> = rounds.iter().map(|r| r.0).collect();
        let switches: Vec<f64> = rounds.iter().map(|r| r.1).collect();
        println!(
            "  {name:<26}: {:.3} ms CPU per task-second (rounds {:.3}-{:.3}), {:.1} switches (rounds {:.1}-{:.1})",
            median(&cpu),
            min(&cpu),
            max(&cpu),
            median(&switches),
            min(&switches),
            max(&switches)
        );
        (median(&cpu), median(&switches))
    };
    println!(
        "idle {:?} tasks: {} tasks on an empty topic, {} s read after {} s to settle; {} round(s), median (spread)",
        args.mode, args.tasks, args.seconds, args.settle_seconds, args.rounds
    );
    let c = line("C consumers (librdkafka 2.16)", &theirs);
    let worker = line("worker's tasks", &ours);
    println!(
        "  ratio (worker / C): CPU {:.2}, thread switches {:.2}",
        worker.0 / c.0.max(1e-9),
        worker.1 / c.1.max(1e-9)
    );
    Ok(())
}

/// One idle C consumer of group `idle-c-<i>`: it waits for records that never come.
fn c_consumer(reference: &CReference, mode: Mode, bootstrap: &str, i: usize) -> Result<Child> {
    let group = format!("idle-c-{i}");
    let mut command = reference.command();
    match mode {
        Mode::Classic => command.args(["classic", bootstrap, &group, TOPIC, "1000000000", "1000"]),
        Mode::Share => command.args([
            "share",
            bootstrap,
            &group,
            TOPIC,
            "1000000000",
            "1000",
            "500",
        ]),
    };
    command
        .stdout(Stdio::null())
        .spawn()
        .context("starting the C reference")
}

fn worker_process(args: &Args, bootstrap: &str) -> Result<Child> {
    let mode = match args.mode {
        Mode::Classic => "classic",
        Mode::Share => "share",
    };
    let mut child = child_command(&[
        "worker".into(),
        "--bootstrap".into(),
        bootstrap.into(),
        "--tasks".into(),
        args.tasks.to_string(),
        "--mode".into(),
        mode.into(),
    ])?
    .into_std();
    let mut child = child
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the worker")?;
    // Started once it says so: every connector created.
    let mut said = String::new();
    let mut stdout = child.stdout.take().context("the worker's stdout")?;
    let mut byte = [0u8; 1];
    while !said.ends_with("ready\n") {
        if stdout.read(&mut byte)? == 0 {
            bail!("the worker ended before its connectors started: {said}");
        }
        said.push(byte[0] as char);
    }
    Ok(child)
}

/// Ends a contender: the worker at the end of its input, a C consumer by a signal.
fn stop(child: &mut Child) {
    if child.stdin.take().is_some() {
        // Dropped: the worker sees the end of its input and shuts down.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

async fn worker(bootstrap: &str, tasks: usize, mode: Mode) -> Result<()> {
    let worker = Worker::start(
        config_map(&[("bootstrap.servers", bootstrap)]),
        ConnectorRegistry::builtin(),
    )?;
    let files = tempfile::tempdir()?;
    for i in 0..tasks {
        let name = format!("idle-{i}");
        let file = files.path().join(&name);
        let mut connector = config_map(&[
            ("name", &name),
            ("connector.class", "FileStreamSink"),
            ("topics", TOPIC),
            ("tasks.max", "1"),
            ("value.converter", "string"),
            ("file", &file.to_string_lossy()),
        ]);
        if mode == Mode::Share {
            connector.insert("consumer.override.group.protocol".into(), "share".into());
        }
        worker.start_connector(connector).await?;
    }
    println!("ready");
    // Idle until the parent closes our input.
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await??;
    worker.shutdown().await;
    Ok(())
}

/// CPU time and thread switches of a set of processes over a window.
struct Reading {
    cpu: Duration,
    switches: u64,
}

impl Reading {
    /// Milliseconds of CPU and switches per task and second.
    fn per_task_second(&self, tasks: usize, seconds: u64) -> (f64, f64) {
        let task_seconds = (tasks as u64 * seconds).max(1) as f64;
        (
            self.cpu.as_secs_f64() * 1e3 / task_seconds,
            self.switches as f64 / task_seconds,
        )
    }
}

/// Waits `settle_seconds`, then reads every thread of `processes` over `seconds`, every
/// 100 ms (reading `/proc` wakes none of them): a thread born meanwhile counts from zero, and
/// one that ends (a blocking pool's thread idling out) with what it had at its last reading.
fn read_idle(processes: &mut [Child], args: &Args) -> Result<Reading> {
    const EVERY: Duration = Duration::from_millis(100);
    std::thread::sleep(Duration::from_secs(args.settle_seconds));
    let first = threads_now(processes)?;
    let mut last = first.clone();
    let end = std::time::Instant::now() + Duration::from_secs(args.seconds);
    while std::time::Instant::now() < end {
        std::thread::sleep(EVERY.min(end.saturating_duration_since(std::time::Instant::now())));
        last.extend(threads_now(processes)?);
    }
    let mut reading = Reading {
        cpu: Duration::ZERO,
        switches: 0,
    };
    for (tid, (cpu, switches)) in &last {
        let (cpu_before, switches_before) = first.get(tid).copied().unwrap_or_default();
        reading.cpu += cpu.saturating_sub(cpu_before);
        reading.switches += switches.saturating_sub(switches_before);
    }
    Ok(reading)
}

/// Each thread's CPU time and switches so far, by (pid, tid).
type Threads = BTreeMap<(u32, u32), (Duration, u64)>;

fn threads_now(processes: &mut [Child]) -> Result<Threads> {
    let mut threads = Threads::new();
    for child in processes {
        if let Some(status) = child.try_wait()? {
            bail!("a contender ended while idle: {status}");
        }
        let pid = child.id();
        let tasks = Path::new("/proc").join(pid.to_string()).join("task");
        for entry in std::fs::read_dir(&tasks)? {
            let entry = entry?;
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            // A thread that ends while it is read is left out of this reading.
            let (Ok(schedstat), Ok(status)) = (
                std::fs::read_to_string(entry.path().join("schedstat")),
                std::fs::read_to_string(entry.path().join("status")),
            ) else {
                continue;
            };
            let cpu = run_time(&schedstat).context("schedstat")?;
            threads.insert((pid, tid), (cpu, switches(&status)));
        }
    }
    Ok(threads)
}

/// A thread's time on a CPU: the first field of `/proc/.../schedstat`, in nanoseconds.
fn run_time(schedstat: &str) -> Option<Duration> {
    let nanos = schedstat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// A thread's switches, voluntary and not, from `/proc/.../status`.
fn switches(status: &str) -> u64 {
    status
        .lines()
        .filter(|l| {
            l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches")
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_threads_run_time_and_switches_are_read_from_proc() {
        assert_eq!(
            run_time("123456789 4000 17\n"),
            Some(Duration::from_nanos(123_456_789))
        );
        assert_eq!(run_time(""), None);
        let status =
            "Name:\trdk:main\nvoluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t2\n";
        assert_eq!(switches(status), 42);
    }

    #[test]
    fn this_process_threads_are_read() {
        let me = Command::new("sleep").arg("5").spawn().expect("sleep");
        let mut processes = [me];
        let threads = threads_now(&mut processes).expect("read");
        stop(&mut processes[0]);
        assert_eq!(threads.len(), 1, "sleep has one thread: {threads:?}");
    }
}
