//! The long form of `tests/tests/runtime_chaos.rs` (issue 15 item 7): a share connector and a
//! classic connector drain a steady stream into files for `--minutes` (default 20) while the
//! chaos driver bounces brokers, moves leaders and coordinators, injects retriable errors and
//! cuts connections. It samples this process's RSS (the worker runs in it; the dev broker is a
//! process of its own) and, after the stream stops and drains, checks its goals: every record in
//! both files, no task ever FAILED, and memory flat — the median RSS of the last quarter of the
//! run at most `--max-growth` above the median of the early window (after a warm-up fifth), the
//! reference measured in the same run. Exits non-zero when a goal is missed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use spillway_actors::{State, Worker};
use spillway_bench::{mib, rss_bytes};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::config_map as config;
use spillway_tests::chaos::{Chaos, ChaosTarget, FileTally};
use spillway_tests::{
    numbered_range, DevBroker, KafkaProxy, ProxyOptions, ProxySecurity, TestProducer,
};

#[derive(Parser)]
struct Args {
    /// How long records stream in while faults are injected.
    #[arg(long, default_value_t = 20.0)]
    minutes: f64,
    /// Records produced per 200 ms.
    #[arg(long, default_value_t = 200)]
    batch: u64,
    /// Seconds between faults.
    #[arg(long, default_value_t = 3.0)]
    fault_every: f64,
    /// Allowed RSS growth of the late window over the early one, as a fraction.
    #[arg(long, default_value_t = 0.10)]
    max_growth: f64,
}

const TOPIC: &str = "soak";
const PARTITIONS: i32 = 6;

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let run_for = Duration::from_secs_f64(args.minutes * 60.0);
    let broker = Arc::new(DevBroker::start(3));
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(5_000);
    broker.set_share_heartbeat_interval(500);
    broker.set_share_session_timeout(10_000);
    broker.create_topic(TOPIC, PARTITIONS);
    let proxy = Arc::new(KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )?);
    let dir = tempfile::tempdir()?;
    let worker = Worker::start(
        config(&[
            ("bootstrap.servers", &proxy.bootstrap()),
            ("task.restart.backoff.ms", "200"),
        ]),
        ConnectorRegistry::builtin(),
    )?;
    let files = [dir.path().join("share.txt"), dir.path().join("classic.txt")];
    let names = ["soak-share", "soak-classic"];
    for (name, file, protocol, tasks) in [
        (names[0], &files[0], "share", "2"),
        // One task: classic mode with 2+ tasks duplicates on rebalance (docs/runtime.md).
        (names[1], &files[1], "classic", "1"),
    ] {
        worker
            .start_connector(config(&[
                ("name", name),
                ("connector.class", "file"),
                ("file", file.to_str().expect("utf-8 path")),
                ("topics", TOPIC),
                ("tasks.max", tasks),
                ("consumer.override.group.protocol", protocol),
            ]))
            .await?;
    }
    let groups = names
        .iter()
        .filter_map(|n| worker.status(n).map(|s| s.group_id))
        .collect();
    let mut chaos = Chaos::start(
        ChaosTarget {
            broker: broker.clone(),
            proxy: Some(proxy.clone()),
            topic: TOPIC.to_owned(),
            partitions: PARTITIONS,
            groups,
            down_for: Duration::from_secs(2),
        },
        Duration::from_secs_f64(args.fault_every),
        0x50a6,
    );
    let feeding = {
        let producer = TestProducer::new(&broker.bootstrap(), "none");
        let batch = args.batch;
        tokio::spawn(async move {
            let mut next = 0u64;
            let end = Instant::now() + run_for;
            while Instant::now() < end {
                let records = numbered_range(next, batch, PARTITIONS);
                producer.send(TOPIC, records).await;
                next += batch;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            next
        })
    };

    let started = Instant::now();
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut next_sample = Duration::ZERO;
    while !feeding.is_finished() {
        let at = started.elapsed();
        if at >= next_sample {
            let rss = rss_bytes().unwrap_or(0);
            samples.push((at, rss));
            println!("t={:>5.0}s rss={:.1} MiB", at.as_secs_f64(), mib(rss));
            next_sample += Duration::from_secs(10);
        }
        note_failures(&worker, &mut failures);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let total = feeding.await?;
    chaos.stop();
    println!("stream over: {total} records; faults: {:?}", chaos.counts());

    let drain_deadline = Instant::now() + Duration::from_secs(300);
    let tallies = loop {
        note_failures(&worker, &mut failures);
        let tallies: Vec<FileTally> = files
            .iter()
            .map(|f| FileTally::read(f))
            .collect::<std::io::Result<_>>()?;
        if tallies.iter().all(|t| t.distinct() >= total) || Instant::now() > drain_deadline {
            break tallies;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    worker.shutdown().await;

    let mut missed = Vec::new();
    for (name, tally) in names.iter().zip(&tallies) {
        println!(
            "{name}: {} of {total} records, {} duplicates ({:.3}%)",
            tally.distinct(),
            tally.duplicates(),
            100.0 * tally.duplicates() as f64 / total.max(1) as f64
        );
        let missing = tally.missing(total);
        if !missing.is_empty() {
            missed.push(format!("{name} lost {} records", missing.len()));
        }
    }
    let (early, late) = rss_windows(&samples);
    let growth = late as f64 / early.max(1) as f64 - 1.0;
    println!(
        "rss: early window median {:.1} MiB, last quarter median {:.1} MiB, ratio {:.3} (goal ≤ {:.3})",
        mib(early),
        mib(late),
        1.0 + growth,
        1.0 + args.max_growth
    );
    if growth > args.max_growth {
        missed.push(format!(
            "memory grew {:.1}% (allowed {:.1}%)",
            growth * 100.0,
            args.max_growth * 100.0
        ));
    }
    if !failures.is_empty() {
        missed.push(format!("tasks failed: {failures:?}"));
    }
    if !missed.is_empty() {
        bail!("soak missed its goals: {}", missed.join("; "));
    }
    println!("soak: goals met");
    Ok(())
}

fn note_failures(worker: &Worker, failures: &mut Vec<String>) {
    for status in worker.statuses() {
        for (i, task) in status.tasks.iter().enumerate() {
            if task.state == State::Failed {
                let seen = format!(
                    "{} task {i}: {}",
                    status.name,
                    task.trace.as_deref().unwrap_or("no trace")
                );
                if !failures.contains(&seen) {
                    failures.push(seen);
                }
            }
        }
    }
}

/// Median RSS of the early window (from a fifth to 45% of the run: after warm-up) and of the
/// last quarter.
fn rss_windows(samples: &[(Duration, u64)]) -> (u64, u64) {
    let end = samples.last().map_or(Duration::ZERO, |s| s.0);
    let window = |from: f64, to: f64| {
        let mut values: Vec<u64> = samples
            .iter()
            .filter(|(at, _)| *at >= end.mul_f64(from) && *at <= end.mul_f64(to))
            .map(|(_, rss)| *rss)
            .collect();
        values.sort_unstable();
        values.get(values.len() / 2).copied().unwrap_or(0)
    };
    (window(0.2, 0.45), window(0.75, 1.0))
}
