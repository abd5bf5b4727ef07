//! What one `GET /metrics` costs the worker: the CPU of rendering its Prometheus text, by the
//! number of tasks it runs (issue 18). A scrape is a fixed cost, paid once per scrape interval
//! whatever the records, so it reports and does not gate.
//!
//! `cargo run --release -p spillway-bench --bin metrics_render -- [--tasks 1,10,100]
//! [--renders 50]`
//!
//! For each count it builds the worker's own metrics pipeline (`spillway::metrics::Telemetry`,
//! the Prometheus reader the REST port serves) over a status board with that many running
//! share tasks, one connector each, every instrument registered and every histogram holding a
//! value, as a worker's after its first batches. It renders the text `--renders` times and
//! prints the CPU time of a render (this thread's, from `getrusage`), per task, the series and
//! the bytes. Renders run back to back, so the caches are warm; a worker scraped every 15 s
//! renders from cold caches and pays more per render.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use spillway::metrics::Telemetry;
use spillway_actors::metrics::{register, task_labels, ConnectorLabels};
use spillway_actors::status::{StatusBoard, TaskCounters};
use spillway_actors::State;

#[derive(Parser)]
#[command(about = "CPU of one Prometheus render of the worker's metrics, by tasks")]
struct Args {
    /// Task counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    tasks: Vec<usize>,
    /// Renders per count.
    #[arg(long, default_value_t = 50)]
    renders: u32,
}

/// A worker's metrics with `tasks` running share tasks, one connector each.
struct Rendered {
    telemetry: Telemetry,
    _board: StatusBoard,
    _tasks: Vec<Arc<TaskCounters>>,
}

fn with_tasks(tasks: usize) -> Result<Rendered> {
    let telemetry = Telemetry::build(false)?;
    let board = StatusBoard::default();
    register(&telemetry.meter(), &board);
    let counters = (0..tasks)
        .map(|i| {
            let name = format!("sink-{i}");
            board.connector_started(&name, "share".into(), format!("connect-{name}"));
            let labels = ConnectorLabels {
                tenant: format!("tenant-{}", i % 10),
                connector: name.clone(),
                mode: "share",
                connector_class: "FileStreamSink".into(),
                connector_version: "1.0".into(),
            };
            board.set_labels(&name, labels.clone());
            let task = board.task_counters(&name, 0);
            task.metrics
                .bind(board.telemetry(), &task_labels(&labels, 0));
            task.metrics.put_done(Duration::from_millis(3), 0);
            board.set_task(&name, 0, State::Running, None);
            task
        })
        .collect();
    Ok(Rendered {
        telemetry,
        _board: board,
        _tasks: counters,
    })
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid rusage for getrusage to fill.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) } == 0;
    assert!(ok, "getrusage(RUSAGE_THREAD) failed");
    // SAFETY: filled by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// The samples of a Prometheus text: lines that are neither comments nor empty.
fn samples(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

fn main() -> Result<()> {
    let args = Args::parse();
    println!(
        "Prometheus render of the worker's metrics ({} renders each, warm caches)",
        args.renders
    );
    for &tasks in &args.tasks {
        let rendered = with_tasks(tasks)?;
        // The first render builds the exporter's families; it is not a scrape's cost.
        let text = rendered.telemetry.render()?;
        let started = thread_cpu();
        for _ in 0..args.renders {
            let text = rendered.telemetry.render()?;
            std::hint::black_box(text);
        }
        let per_render = (thread_cpu() - started) / args.renders.max(1);
        let families = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        println!(
            "  {tasks:>4} task(s): {:>8.3} ms CPU a render, {:>6.1} µs a task; \
             {families} families, {} samples, {} KiB",
            per_render.as_secs_f64() * 1e3,
            per_render.as_secs_f64() * 1e6 / tasks.max(1) as f64,
            samples(&text),
            text.len() / 1024
        );
        rendered.telemetry.shutdown();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_adds_the_same_series_to_the_render() {
        let rendered: Vec<String> = (1..=3)
            .map(|tasks| {
                let r = with_tasks(tasks).expect("metrics");
                r.telemetry.render().expect("renders")
            })
            .collect();
        assert!(
            rendered[2].contains("connector=\"sink-2\""),
            "{}",
            rendered[2]
        );
        let counts: Vec<usize> = rendered.iter().map(|t| samples(t)).collect();
        let per_task = counts[1] - counts[0];
        assert!(per_task > 50, "{counts:?}");
        assert_eq!(counts[2] - counts[1], per_task, "{counts:?}");
    }
}
