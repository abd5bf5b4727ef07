//! Issue 6's benchmark: the kafka sink replicating the same data with
//! `delivery.guarantee=exactly_once` against `at_least_once`, measured in the same run, in share
//! mode (ledger) and in classic mode (offsets in the transaction).
//!
//! `cargo run --release -p spillway-bench --bin eos_replication -- [--records 100000]`
//!
//! Each run gets fresh topics (source, target, ledger) on one dev broker and its own worker
//! (`spillway_actors::Worker`, in this process). The rate is measured from the connector's
//! start to the moment every record is accepted (its verdict committed). Under exactly-once
//! every put batch is one transaction, so transactions = committed batches.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use spillway_actors::Worker;
use spillway_connectors::ConnectorRegistry;
use spillway_tests::{produce, DevBroker, TestRecord};

/// Issue 6's goal: exactly-once keeps at least this share of at-least-once's throughput.
const MIN_RATIO: f64 = 0.70;

#[derive(Parser)]
struct Args {
    /// Records replicated per run.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Partitions of the source, target and ledger topics.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Sink tasks per connector.
    #[arg(long, default_value_t = 2)]
    tasks: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
}

struct Measured {
    seconds: f64,
    records: u64,
    batches: u64,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }
}

use spillway_core::config::config_map as config;

async fn run(broker: &DevBroker, args: &Args, mode: &str, guarantee: &str) -> Result<Measured> {
    let run = format!("{mode}-{guarantee}");
    let source = format!("src-{run}");
    for topic in [
        source.clone(),
        format!("out.{source}"),
        format!("ledger-{run}"),
    ] {
        broker.create_topic(&topic, args.partitions);
    }
    let records: Vec<TestRecord> = (0..args.records)
        .map(|i| {
            let mut value = format!("v{i}:").into_bytes();
            value.resize(args.value_size.max(value.len()), b'.');
            TestRecord {
                partition: Some((i % args.partitions as u64) as i32),
                key: Some(format!("k{i}").into_bytes()),
                value: Some(value),
                ..TestRecord::default()
            }
        })
        .collect();
    produce(&broker.bootstrap(), &source, records, "none").await;
    let worker = Worker::start(
        config(&[
            ("bootstrap.servers", &broker.bootstrap()),
            ("task.poll.timeout.ms", "100"),
        ]),
        ConnectorRegistry::builtin(),
    )?;
    let cache = std::env::temp_dir().join(format!("eos-bench-{}-{run}", std::process::id()));
    let protocol = if mode == "share" { "share" } else { "classic" };
    let tasks = args.tasks.to_string();
    let ledger = format!("ledger-{run}");
    let started = Instant::now();
    worker
        .start_connector(config(&[
            ("name", &run),
            ("connector.class", "kafka"),
            ("topics", &source),
            ("tasks.max", &tasks),
            ("topic.rename.format", "out.${topic}"),
            ("consumer.override.group.protocol", protocol),
            ("delivery.guarantee", guarantee),
            ("delivery.ledger.topic", &ledger),
            ("delivery.ledger.cache.dir", &cache.to_string_lossy()),
        ]))
        .await?;
    let deadline = started + Duration::from_secs(600);
    let totals = loop {
        let totals = worker.status(&run).map(|s| s.totals()).unwrap_or_default();
        if totals.accepted >= args.records {
            break totals;
        }
        if Instant::now() > deadline {
            worker.shutdown().await;
            bail!(
                "{run}: only {} of {} records accepted in 600 s",
                totals.accepted,
                args.records
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(&cache);
    Ok(Measured {
        seconds,
        records: totals.accepted,
        batches: totals.committed_batches,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    println!(
        "{} records of {} bytes, {} partitions, {} tasks, one dev broker",
        args.records, args.value_size, args.partitions, args.tasks
    );
    println!(
        "{:<8} {:<14} {:>10} {:>12} {:>10} {:>12}",
        "mode", "guarantee", "seconds", "records/s", "txns/s", "records/txn"
    );
    let mut missed = Vec::new();
    for mode in ["share", "classic"] {
        let alo = run(&broker, &args, mode, "at_least_once").await?;
        let eos = run(&broker, &args, mode, "exactly_once").await?;
        println!(
            "{:<8} {:<14} {:>10.2} {:>12.0} {:>10} {:>12}",
            mode,
            "at_least_once",
            alo.seconds,
            alo.rate(),
            "-",
            "-"
        );
        println!(
            "{:<8} {:<14} {:>10.2} {:>12.0} {:>10.1} {:>12.1}",
            mode,
            "exactly_once",
            eos.seconds,
            eos.rate(),
            eos.batches as f64 / eos.seconds,
            eos.records as f64 / eos.batches.max(1) as f64
        );
        let ratio = eos.rate() / alo.rate();
        println!(
            "{mode}: exactly-once / at-least-once throughput = {ratio:.2} (goal >= {MIN_RATIO:.2})"
        );
        if ratio < MIN_RATIO {
            missed.push(format!("{mode} {ratio:.2}"));
        }
    }
    if !missed.is_empty() {
        bail!(
            "goal missed: exactly-once throughput below {MIN_RATIO:.2} of at-least-once's ({})",
            missed.join(", ")
        );
    }
    Ok(())
}
