//! Issue 2's benchmark: drain the same records with Spillway's native share consumer and with
//! librdkafka's `ShareConsumer` (the reference) on one dev cluster, in one run, and print both
//! rates, the ratio, CPU per record and our peak RSS.
//!
//! `cargo run --release -p spillway-bench --bin share_drain -- [--records N] [--partitions P]`
//!
//! Both clients acknowledge every record explicitly with ACCEPT and commit once per poll. Each
//! drains its own share group (so each sees every record) in its own process, one after the
//! other, so neither steals the broker's CPU from the other. Our side runs as a child process of
//! this binary (`drain` subcommand) so its peak RSS is not inflated by the producer.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use spillway_bench::{cpu_time, mib, peak_rss_bytes};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_tests::{
    numbered_records, produce, DevBroker, ReferenceOptions, ReferenceShareConsumer,
};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    /// Records to produce and drain.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Brokers in the dev cluster.
    #[arg(long, default_value_t = 3)]
    brokers: u32,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 100)]
    record_bytes: usize,
}

#[derive(Subcommand)]
enum Role {
    /// Internal: drain with Spillway's consumer and print a JSON summary.
    Drain {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        group: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        records: u64,
    },
}

#[derive(Serialize, Deserialize, Debug)]
struct DrainSummary {
    records: u64,
    seconds: f64,
    cpu_seconds: f64,
    peak_rss_bytes: u64,
    duplicates: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    match args.role {
        Some(Role::Drain {
            bootstrap,
            group,
            topic,
            records,
        }) => {
            let summary = drain(&bootstrap, &group, &topic, records).await?;
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        None => compare(&args).await,
    }
}

async fn compare(args: &Args) -> Result<()> {
    let broker = DevBroker::try_start(args.brokers, &[("bench", args.partitions)])?;
    broker.set_share_auto_offset_reset("earliest");
    let bootstrap = broker.bootstrap();
    eprintln!(
        "producing {} records of {} bytes to {} partitions...",
        args.records, args.record_bytes, args.partitions
    );
    let produced = produce(
        &bootstrap,
        "bench",
        numbered_records(args.records, args.record_bytes, args.partitions),
        "none",
    )
    .await;
    if produced.len() as u64 != args.records {
        bail!(
            "produced {} records, expected {}",
            produced.len(),
            args.records
        );
    }

    eprintln!("draining with the reference ShareConsumer (librdkafka 2.16)...");
    let mut reference = ReferenceShareConsumer::start_with(
        &bootstrap,
        "bench-reference",
        &["bench"],
        ReferenceOptions {
            report_records: false,
            max_records: args.records,
            idle_exit: Duration::from_secs(20),
        },
    );
    let reference = reference
        .wait_summary(Duration::from_secs(1800))
        .context("the reference consumer gave no summary")?;

    eprintln!("draining with Spillway's share consumer...");
    let exe = std::env::current_exe()?;
    let output = tokio::process::Command::new(exe)
        .args([
            "drain",
            "--bootstrap",
            &bootstrap,
            "--group",
            "bench-spillway",
            "--topic",
            "bench",
        ])
        .args(["--records", &args.records.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .await?;
    if !output.status.success() {
        bail!("our drain process failed: {}", output.status);
    }
    let ours: DrainSummary =
        serde_json::from_slice(&output.stdout).context("reading our drain summary")?;

    let ours_rate = ours.records as f64 / ours.seconds;
    let reference_rate = reference.records as f64 / reference.seconds;
    println!(
        "share_drain: {} records x {} B, {} partitions, {} brokers (dev broker)",
        args.records, args.record_bytes, args.partitions, args.brokers
    );
    println!("  reference ShareConsumer : {:>10.0} rec/s  {:>6.2} us CPU/record  ({} records in {:.2} s)", reference_rate, reference.cpu_seconds * 1e6 / reference.records.max(1) as f64, reference.records, reference.seconds);
    println!("  spillway ShareConsumer  : {:>10.0} rec/s  {:>6.2} us CPU/record  ({} records in {:.2} s, {} duplicate deliveries)", ours_rate, ours.cpu_seconds * 1e6 / ours.records.max(1) as f64, ours.records, ours.seconds, ours.duplicates);
    println!(
        "  throughput ratio (spillway / reference): {:.2}",
        ours_rate / reference_rate
    );
    println!(
        "  CPU per record ratio (spillway / reference): {:.2}",
        (ours.cpu_seconds / ours.records.max(1) as f64)
            / (reference.cpu_seconds / reference.records.max(1) as f64)
    );
    println!("  spillway peak RSS: {:.1} MiB", mib(ours.peak_rss_bytes));
    Ok(())
}

/// Drains `expected` records, acknowledging each with ACCEPT and committing once per poll, as
/// the reference does.
async fn drain(bootstrap: &str, group: &str, topic: &str, expected: u64) -> Result<DrainSummary> {
    let mut consumer = ShareConsumer::connect(ShareConsumerConfig::new(bootstrap, group)).await?;
    consumer.subscribe(&[topic]);
    let cpu_start = cpu_time();
    let mut seen = std::collections::HashSet::with_capacity(expected as usize);
    let mut received = 0u64;
    let mut duplicates = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let idle_limit = Duration::from_secs(20);
    while received < expected {
        let records = consumer.poll(Duration::from_millis(500)).await?;
        if records.is_empty() {
            if first.is_some() && last.elapsed() > idle_limit {
                break;
            }
            continue;
        }
        first.get_or_insert_with(Instant::now);
        consumer.acknowledge_all(records.iter(), AcknowledgeType::Accept)?;
        for r in &records {
            if seen.insert((r.partition, r.offset)) {
                received += 1;
            } else {
                duplicates += 1;
            }
        }
        let results = consumer.commit_sync(Duration::from_secs(30)).await?;
        if let Some((tp, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
            eprintln!("commit for {tp:?} failed: {e}");
        }
        last = Instant::now();
    }
    let seconds = first
        .map(|f| last.duration_since(f).as_secs_f64())
        .unwrap_or(0.0);
    let cpu_seconds = (cpu_time() - cpu_start).as_secs_f64();
    consumer.close().await?;
    Ok(DrainSummary {
        records: received,
        seconds,
        cpu_seconds,
        peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
        duplicates,
    })
}
