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
//!
//! The dev broker keeps only 5 MiB per partition (older batches are dropped), so a million
//! 100-byte records on 8 partitions cannot be held at once: the run produces and drains them in
//! rounds of `--round-records`, and adds up each client's drain time over the rounds.

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
    /// Records per round: what the dev broker retains per partition (5 MiB) bounds it.
    #[arg(long, default_value_t = 250_000)]
    round_records: u64,
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
    // The dev broker keeps at most 5 MiB per partition and drops the oldest batches beyond that,
    // so the records are produced and drained in rounds that fit, each drained by both clients
    // before the next round is produced.
    let rounds = args.records.div_ceil(args.round_records.max(1));
    let mut reference_total = Totals::default();
    let mut ours_total = Totals::default();
    let mut peak_rss = 0u64;
    let mut duplicates = 0u64;
    for round in 0..rounds {
        let count = args
            .round_records
            .min(args.records - round * args.round_records);
        eprintln!(
            "round {}/{rounds}: producing {count} records of {} bytes to {} partitions...",
            round + 1,
            args.record_bytes,
            args.partitions
        );
        let produced = produce(
            &bootstrap,
            "bench",
            numbered_records(count, args.record_bytes, args.partitions),
            "none",
        )
        .await;
        if produced.len() as u64 != count {
            bail!("produced {} records, expected {count}", produced.len());
        }

        eprintln!("  draining with the reference ShareConsumer (librdkafka 2.16)...");
        let mut reference = ReferenceShareConsumer::start_with(
            &bootstrap,
            "bench-reference",
            &["bench"],
            ReferenceOptions {
                report_records: false,
                max_records: count,
                idle_exit: Duration::from_secs(20),
            },
        );
        let reference = reference
            .wait_summary(Duration::from_secs(1800))
            .context("the reference consumer gave no summary")?;
        reference_total.add(reference.records, reference.seconds, reference.cpu_seconds);

        eprintln!("  draining with Spillway's share consumer...");
        let exe = std::env::current_exe()?;
        let output = tokio::process::Command::new(exe)
            .args([
                "drain",
                "--bootstrap",
                &bootstrap,
                "--group",
                "bench-spillway",
            ])
            .args(["--topic", "bench", "--records", &count.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .await?;
        if !output.status.success() {
            bail!("our drain process failed: {}", output.status);
        }
        let ours: DrainSummary =
            serde_json::from_slice(&output.stdout).context("reading our drain summary")?;
        ours_total.add(ours.records, ours.seconds, ours.cpu_seconds);
        peak_rss = peak_rss.max(ours.peak_rss_bytes);
        duplicates += ours.duplicates;
    }

    println!(
        "share_drain: {} records x {} B, {} partitions, {} brokers (dev broker), {rounds} round(s)",
        args.records, args.record_bytes, args.partitions, args.brokers
    );
    println!("  reference ShareConsumer : {}", reference_total.line());
    println!(
        "  spillway ShareConsumer  : {} ({duplicates} duplicate deliveries)",
        ours_total.line()
    );
    println!(
        "  throughput ratio (spillway / reference): {:.2}",
        ours_total.rate() / reference_total.rate()
    );
    println!(
        "  CPU per record ratio (spillway / reference): {:.2}",
        ours_total.cpu_per_record() / reference_total.cpu_per_record()
    );
    println!("  spillway peak RSS: {:.1} MiB", mib(peak_rss));
    Ok(())
}

/// Records, drain time (first record to last) and CPU time of one client over all rounds.
#[derive(Default)]
struct Totals {
    records: u64,
    seconds: f64,
    cpu_seconds: f64,
}

impl Totals {
    fn add(&mut self, records: u64, seconds: f64, cpu_seconds: f64) {
        self.records += records;
        self.seconds += seconds;
        self.cpu_seconds += cpu_seconds;
    }

    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds.max(f64::EPSILON)
    }

    fn cpu_per_record(&self) -> f64 {
        self.cpu_seconds / self.records.max(1) as f64
    }

    fn line(&self) -> String {
        format!(
            "{:>9.0} rec/s  {:>6.2} us CPU/record  ({} records in {:.2} s)",
            self.rate(),
            self.cpu_per_record() * 1e6,
            self.records,
            self.seconds
        )
    }
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
