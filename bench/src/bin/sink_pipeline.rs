//! Issue 3's benchmark: the sink pipeline measured against a reference in the same run, on one
//! dev cluster per part.
//!
//! `cargo run --release -p spillway-bench --bin sink_pipeline -- [--part all|overhead|classic|parallelism|memory]`
//!
//! * (a) `overhead`: a share-mode connector (one task) into the `file` sink, run by
//!   `spillway_actors::Worker`, against the bare `spillway_kafka::share::ShareConsumer` draining
//!   the same topic (ACCEPT every record, commit once per poll). Each uses its own share group
//!   and runs in its own child process, one after the other. The connector runs with its
//!   metrics recorded through the OpenTelemetry SDK and rendered as Prometheus text every
//!   second, and once more with a no-op meter: their ratio is what recording metrics costs.
//!   Issue 18: the connector (metrics recorded) is also measured against librdkafka 2.16's
//!   share consumer in C (`bench/c/`, explicit ACCEPT, commit_sync per poll), `--rounds` times,
//!   each contender on a fresh cluster, the order alternating; it prints the median and spread
//!   and exits non-zero when CPU per record, rate or peak RSS miss their goals.
//! * `classic`: a classic-mode (consumer group) connector into the file sink against
//!   librdkafka's C classic consumer, the same way (issue 18 item 3): metrics recorded and
//!   scraped every second, rounds on fresh clusters, the order alternating.
//! * (b) `parallelism`: a bench-only sink that takes 10 ms per `put`, on a one-partition topic:
//!   share mode with 8 tasks (the dev broker's manual target assignment gives every member the
//!   partition, as Apache Kafka does) against classic mode (one partition: one active task).
//! * (c) `memory`: how much a worker process grows while it drains 1 KB records at full speed
//!   into the `file` sink (from its RSS with the connector already running on the empty topic),
//!   against the bound its config gives, printed with its formula. The records are produced in
//!   batches of `--memory-batch-bytes` (64 KiB): a fetch response carries every stored batch it
//!   acquired records from whole, so the bound counts one stored batch per partition around the
//!   acquired records, and every record held as its bytes plus the struct that holds them.
//!   Beside the RSS growth it prints the heap's (a counting allocator): the difference is what
//!   the allocator keeps from the system.
//!
//! Rates are measured over a steady window: from the first moment records were acknowledged
//! (and, where the data is produced while the consumers already run, once all of it is in the
//! topic) to the last acknowledgement; the records counted are those acknowledged inside it.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use clap::{Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use spillway_actors::consumer_settings::DEFAULT_MAX_POLL_RECORDS;
use spillway_actors::settings::{CLASSIC_INFLIGHT_BATCHES_DEFAULT, SHARE_INFLIGHT_BATCHES_DEFAULT};
use spillway_actors::Worker;
use spillway_bench::c_reference::{CReference, Rounds};
use spillway_bench::thread_cpu::{while_sampling, BrokerWork, Sampled};
use spillway_bench::{
    child_command, config, cpu_time, fits_dev_broker, last_json_line, measure, mib, peak_rss_bytes,
    run_child, share_requests, start_broker, BrokerAllocator, HeapCounter,
};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{
    ConfigError, ConfigMap, PutOutcome, RawRecord, SinkConnector, SinkError, SinkRecord, SinkTask,
};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_tests::{numbered_records, produce, DevBroker, TestProducer};

/// Counts the heap, for (c): what the records take apart from what the allocator keeps.
#[global_allocator]
static HEAP: HeapCounter = HeapCounter;

/// How long a pipeline child with `--announce-ready` lets its tasks join and start fetching.
const READY_SETTLE: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    All,
    Overhead,
    /// Classic mode (consumer group, rdkafka) connector -> file against the C classic consumer.
    Classic,
    Parallelism,
    Memory,
}

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    /// Which part to run.
    #[arg(long, value_enum, default_value_t = Part::All)]
    part: Part,
    /// Brokers in the dev cluster.
    #[arg(long, default_value_t = 3)]
    brokers: u32,
    /// (a) records to produce and drain.
    #[arg(long, default_value_t = 200_000)]
    overhead_records: u64,
    /// (a) partitions of the topic.
    #[arg(long, default_value_t = 8)]
    overhead_partitions: i32,
    /// (a) record value size in bytes.
    #[arg(long, default_value_t = 100)]
    overhead_record_bytes: usize,
    /// (a) the connector's `task.inflight.batches` (default: the runtime's share-mode default).
    #[arg(long)]
    overhead_inflight: Option<usize>,
    /// The dev broker's `malloc`, in every part (jemalloc keeps the broker's cost per record
    /// the same whatever the client: `BrokerAllocator`).
    #[arg(long, value_enum, default_value_t = BrokerAllocator::Jemalloc)]
    broker_allocator: BrokerAllocator,
    /// (a): rounds against the C reference (a fresh cluster per contender and round, the order
    /// alternating).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// classic: rounds against the C reference, as (a)'s. More by default: on a two-core VM
    /// either contender's CPU a record moves by up to a third between rounds, wider than the
    /// goal's margin, and a median of three was once all slow rounds (bench/README.md).
    #[arg(long, default_value_t = 5)]
    classic_rounds: u64,
    /// classic: the connector's `task.inflight.batches` (default: the runtime's classic-mode
    /// default, as a user's connector has it).
    #[arg(long)]
    classic_inflight: Option<usize>,
    /// (a) goal: the connector's CPU per record at most this times the C share consumer's.
    #[arg(long, default_value_t = 1.0)]
    max_cpu_ratio: f64,
    /// (a) goal: the connector's rate at least this times the C share consumer's.
    #[arg(long, default_value_t = 1.0)]
    min_rate_ratio: f64,
    /// (a) goal: the connector's peak RSS at most this many MiB.
    #[arg(long, default_value_t = 64.0)]
    max_rss_mib: f64,
    /// classic goal: the classic-mode connector's CPU per record at most this times the C
    /// classic consumer's.
    #[arg(long, default_value_t = 1.3)]
    classic_max_cpu_ratio: f64,
    /// (b) records on the one-partition topic.
    #[arg(long, default_value_t = 4_000)]
    slow_records: u64,
    /// (b) share-mode tasks.
    #[arg(long, default_value_t = 8)]
    slow_tasks: usize,
    /// (b) milliseconds each `put` of the slow sink takes.
    #[arg(long, default_value_t = 10)]
    slow_put_ms: u64,
    /// (b) `max.poll.records` (the batch each `put` gets), same in both modes. Small, so that the
    /// sink is the bottleneck: the dev broker's share path on one partition tops out at about
    /// 3,000–5,000 records/s whatever the clients do (its batch walk and per-offset acquisition,
    /// brief §8.6 #32), which 100-record batches at 10 ms would already exceed (8 × 10,000/s).
    #[arg(long, default_value_t = 10)]
    slow_poll_records: usize,
    /// (b) records per produce call (a produce call's records share broker batches, and a share
    /// member acquires whole batches).
    #[arg(long, default_value_t = 8_000)]
    slow_produce_chunk: usize,
    /// (c) records to produce and drain.
    #[arg(long, default_value_t = 24_000)]
    memory_records: u64,
    /// (c) partitions of the topic.
    #[arg(long, default_value_t = 8)]
    memory_partitions: i32,
    /// (c) tasks of the connector.
    #[arg(long, default_value_t = 2)]
    memory_tasks: usize,
    /// (c) record value size in bytes.
    #[arg(long, default_value_t = 1024)]
    memory_record_bytes: usize,
    /// (c) `task.inflight.batches` (default: the runtime's share-mode default).
    #[arg(long)]
    memory_inflight: Option<usize>,
    /// (c) `max.poll.records`.
    #[arg(long, default_value_t = DEFAULT_MAX_POLL_RECORDS)]
    memory_poll_records: usize,
    /// (c) the producer's `batch.size`: the broker stores the records in batches of about this
    /// size and a fetch carries every stored batch it acquired records from, whole.
    #[arg(long, default_value_t = 65_536)]
    memory_batch_bytes: usize,
}

#[derive(Subcommand)]
enum Role {
    /// Internal: drain with the bare share consumer and print a JSON summary.
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
    /// Internal: run a share-mode file-sink connector in a worker and print a JSON summary.
    Pipeline {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        records: u64,
        #[arg(long)]
        tasks: usize,
        #[arg(long)]
        inflight: usize,
        #[arg(long)]
        max_poll_records: usize,
        #[arg(long)]
        file: String,
        /// Record metrics through a real OpenTelemetry SDK (the worker command's pipeline),
        /// scraped as Prometheus text every second; without it the meter is a no-op.
        #[arg(long)]
        metrics: bool,
        /// Once the connector's tasks run on the (empty) topic, print `ready` on stdout and
        /// note the RSS: the parent produces only then.
        #[arg(long)]
        announce_ready: bool,
        /// A classic-mode (consumer group) connector instead of a share-mode one.
        #[arg(long)]
        classic: bool,
    },
}

/// What one child process reports.
#[derive(Serialize, Deserialize, Debug)]
struct Summary {
    /// Records acknowledged in all.
    records: u64,
    /// Records acknowledged inside the measured window.
    window_records: u64,
    /// Length of the window.
    seconds: f64,
    /// CPU time of the process over the whole drain.
    cpu_seconds: f64,
    /// Peak RSS at the end.
    peak_rss_bytes: u64,
    /// Peak RSS once the client (or worker) was up, before any record was read.
    idle_rss_bytes: u64,
    /// With `--announce-ready`: peak RSS with the connector's tasks running on the still empty
    /// topic, before the parent produced anything.
    #[serde(default)]
    running_rss_bytes: Option<u64>,
    /// With `--announce-ready`: the most the heap grew from then on.
    #[serde(default)]
    heap_growth_bytes: Option<u64>,
    /// The part of `cpu_seconds` spent before records came (starting, joining), when known.
    #[serde(default)]
    cpu_before_records_seconds: Option<f64>,
}

impl Summary {
    /// Adds this run to `rounds` as its measured window: the window's records, with the share
    /// of the whole drain's CPU that they stand for.
    fn add_window_to(&self, rounds: &mut Rounds) {
        rounds.add(
            self.window_records,
            self.seconds,
            self.cpu_seconds * self.window_records as f64 / self.records.max(1) as f64,
            self.peak_rss_bytes,
        );
        if let Some(before) = self.cpu_before_records_seconds {
            rounds.add_before_records(before, self.records);
        }
    }

    fn rate(&self) -> f64 {
        self.window_records as f64 / self.seconds.max(1e-9)
    }

    fn cpu_us_per_record(&self) -> f64 {
        self.cpu_seconds * 1e6 / self.records.max(1) as f64
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    // As the worker does (`spillway` main).
    spillway_actors::allocator::use_jemalloc();
    let args = Args::parse();
    match &args.role {
        Some(Role::Drain {
            bootstrap,
            group,
            topic,
            records,
        }) => {
            let summary = drain(bootstrap, group, topic, *records).await?;
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        Some(Role::Pipeline {
            bootstrap,
            name,
            topic,
            records,
            tasks,
            inflight,
            max_poll_records,
            file,
            metrics,
            announce_ready,
            classic,
        }) => {
            let summary = pipeline(
                bootstrap,
                name,
                topic,
                *records,
                *tasks,
                *inflight,
                *max_poll_records,
                file,
                *metrics,
                *announce_ready,
                *classic,
            )
            .await?;
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        None => {
            // A missing allocator library is said before anything runs.
            let preload = args.broker_allocator.preload()?;
            eprintln!(
                "the dev broker's malloc: {}",
                args.broker_allocator.describe(preload.as_deref())
            );
            let all = args.part == Part::All;
            let mut missed = Vec::new();
            if all || args.part == Part::Overhead {
                missed.extend(overhead(&args).await?);
            }
            if all || args.part == Part::Classic {
                missed.extend(classic(&args).await?);
            }
            if all || args.part == Part::Parallelism {
                parallelism(&args).await?;
            }
            if all || args.part == Part::Memory {
                memory(&args).await?;
            }
            if !missed.is_empty() {
                bail!("goals missed: {}", missed.join("; "));
            }
            Ok(())
        }
    }
}

async fn produce_all(
    bootstrap: &str,
    topic: &str,
    records: u64,
    bytes: usize,
    partitions: i32,
) -> Result<()> {
    eprintln!(
        "producing {records} records of {bytes} bytes to {topic} ({partitions} partitions)..."
    );
    let produced = produce(
        bootstrap,
        topic,
        numbered_records(records, bytes, partitions),
        "none",
    )
    .await;
    if produced.len() as u64 != records {
        bail!("produced {} records, expected {records}", produced.len());
    }
    Ok(())
}

/// Runs this binary with `args` and reads the JSON summary it prints.
fn temp_dir(part: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("spillway-bench-{part}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// ---------------------------------------------------------------------------------------------
// (a) Pipeline overhead.

async fn overhead(args: &Args) -> Result<Vec<String>> {
    let (records, partitions, bytes) = (
        args.overhead_records,
        args.overhead_partitions,
        args.overhead_record_bytes,
    );
    // Each contender runs on a dev cluster of its own, with the same records produced the same
    // way: on the dev broker every share group that drains after another one runs slower, even
    // on another topic (seen here, one cluster: 14,500 rec/s first, 11,700 second, 10,100
    // third), so sharing a cluster would make the order decide the ratio.
    let overhead_inflight = args
        .overhead_inflight
        .unwrap_or(SHARE_INFLIGHT_BATCHES_DEFAULT);
    let reference_program = &CReference::build()?;
    let dir = temp_dir("overhead")?;
    let child_args = |role: &str, bootstrap: &str| -> Vec<String> {
        vec![
            role.into(),
            "--bootstrap".into(),
            bootstrap.into(),
            "--topic".into(),
            "overhead".into(),
            "--records".into(),
            records.to_string(),
        ]
    };
    let pipeline_args = |name: &str, metrics: bool, bootstrap: &str| {
        let mut a = child_args("pipeline", bootstrap);
        a.extend([
            "--name".into(),
            name.into(),
            "--tasks".into(),
            "1".into(),
            "--inflight".into(),
            overhead_inflight.to_string(),
            "--max-poll-records".into(),
            DEFAULT_MAX_POLL_RECORDS.to_string(),
            "--file".into(),
            dir.join(format!("{name}.txt"))
                .to_string_lossy()
                .into_owned(),
        ]);
        if metrics {
            a.push("--metrics".into());
        }
        a
    };

    // The goal's contenders: the connector as the worker command runs it (metrics recorded and
    // scraped) against librdkafka's C share consumer, round after round, the order alternating.
    let mut reference = Rounds::default();
    let mut ours = Rounds::default();
    let mut ours_requests = std::collections::BTreeMap::new();
    let mut reference_requests = std::collections::BTreeMap::new();
    let (mut ours_broker, mut reference_broker) = (BrokerWork::default(), BrokerWork::default());
    for round in 0..args.rounds.max(1) {
        let ours_first = round % 2 == 1;
        for ours_turn in [ours_first, !ours_first] {
            if ours_turn {
                eprintln!(
                    "(a) round {}: a share-mode connector into the file sink (1 task, metrics recorded and scraped every second)...",
                    round + 1
                );
                let run =
                    on_fresh_cluster(args, |b| pipeline_args("overhead-pipeline", true, b)).await?;
                run.summary.add_window_to(&mut ours);
                add_counts(&mut ours_requests, run.requests);
                ours_broker.add(run.broker, records);
            } else {
                eprintln!(
                    "(a) round {}: librdkafka 2.16's C share consumer...",
                    round + 1
                );
                let run = on_fresh_cluster_with(args, |bootstrap| async move {
                    reference_program
                        .share_drain(
                            &bootstrap,
                            "overhead-c",
                            "overhead",
                            records,
                            DEFAULT_MAX_POLL_RECORDS,
                        )
                        .await
                })
                .await?;
                reference.add_complete(&run.summary, records)?;
                add_counts(&mut reference_requests, run.requests);
                reference_broker.add(run.broker, records);
            }
        }
    }
    eprintln!("(a) draining with the bare ShareConsumer...");
    let OnCluster {
        summary: bare,
        requests: bare_requests,
        broker: bare_broker,
    } = on_fresh_cluster(args, |bootstrap| {
        let mut a = child_args("drain", bootstrap);
        a.extend(["--group".into(), "overhead-bare".into()]);
        a
    })
    .await?;
    eprintln!("(a) the connector with a no-op meter (no metrics SDK)...");
    let unmetered = on_fresh_cluster(args, |b| pipeline_args("overhead-unmetered", false, b)).await;
    let _ = std::fs::remove_dir_all(&dir);
    let OnCluster {
        summary: unmetered,
        requests: unmetered_requests,
        broker: unmetered_broker,
    } = unmetered?;

    println!(
        "(a) pipeline overhead: {records} records x {bytes} B, {partitions} partitions, {} brokers (dev broker, malloc {}), task.inflight.batches {overhead_inflight}; {} round(s), a fresh cluster per contender and round, order alternating; median (spread)",
        args.brokers,
        args.broker_allocator.describe(None),
        args.rounds.max(1)
    );
    println!("  C share consumer (librdkafka 2.16): {}", reference.line());
    println!("  share connector -> file sink      : {}", ours.line());
    println!(
        "  once each: bare ShareConsumer {:>6.2} us CPU/record {:>8.0} rec/s; connector, metrics not recorded {:>6.2} us CPU/record {:>8.0} rec/s",
        bare.cpu_us_per_record(),
        bare.rate(),
        unmetered.cpu_us_per_record(),
        unmetered.rate(),
    );
    println!(
        "  requests: C {}; pipeline {}; bare {}; unmetered {}",
        share_requests(&reference_requests, reference.records),
        share_requests(&ours_requests, ours.records),
        share_requests(&bare_requests, bare.records),
        share_requests(&unmetered_requests, unmetered.records)
    );
    let once = |sampled: Sampled| {
        let mut work = BrokerWork::default();
        work.add(sampled, records);
        work.line()
    };
    println!(
        "  dev broker's busiest thread (share of a core while it worked; its CPU per record drained):\n    C {}\n    connector {}\n    bare {}; unmetered {}",
        reference_broker.line(),
        ours_broker.line(),
        once(bare_broker),
        once(unmetered_broker)
    );
    let cpu_ratio = ours.cpu_us_median() / reference.cpu_us_median().max(1e-9);
    let rate_ratio = ours.rate_median() / reference.rate_median().max(1e-9);
    let rss = mib(ours.peak_rss_bytes);
    println!(
        "  CPU per record ratio (connector / C): {cpu_ratio:.2}  (goal <= {:.2})",
        args.max_cpu_ratio
    );
    println!(
        "  throughput ratio (connector / C): {rate_ratio:.2}  (goal >= {:.2})",
        args.min_rate_ratio
    );
    println!(
        "  connector peak RSS: {rss:.1} MiB  (goal <= {:.0} MiB)",
        args.max_rss_mib
    );
    println!(
        "  pipeline / bare ShareConsumer: throughput {:.2}, CPU per record {:.2}",
        unmetered.rate() / bare.rate(),
        unmetered.cpu_us_per_record() / bare.cpu_us_per_record().max(1e-9)
    );
    println!(
        "  metrics cost (recorded / not recorded): CPU per record {:.2}",
        ours.cpu_us_median() / unmetered.cpu_us_per_record().max(1e-9)
    );
    let mut missed = Vec::new();
    if cpu_ratio > args.max_cpu_ratio {
        missed.push(format!(
            "(a) share connector CPU per record {cpu_ratio:.2}x the C share consumer's (goal <= {:.2})",
            args.max_cpu_ratio
        ));
    }
    if rate_ratio < args.min_rate_ratio {
        missed.push(format!(
            "(a) share connector rate {rate_ratio:.2}x the C share consumer's (goal >= {:.2}){}",
            args.min_rate_ratio,
            ours_broker.ceiling_against(&reference_broker)
        ));
    }
    if rss > args.max_rss_mib {
        missed.push(format!(
            "(a) share connector peak RSS {rss:.1} MiB (goal <= {:.0})",
            args.max_rss_mib
        ));
    }
    Ok(missed)
}

/// Classic mode: a consumer-group connector into the file sink against librdkafka's C classic
/// consumer draining the same topic (committing every 500 records), each on a fresh cluster,
/// round after round, the order alternating.
async fn classic(args: &Args) -> Result<Vec<String>> {
    let records = args.overhead_records;
    let reference_program = &CReference::build()?;
    let dir = temp_dir("classic")?;
    let mut reference = Rounds::default();
    let mut ours = Rounds::default();
    let inflight = args
        .classic_inflight
        .unwrap_or(CLASSIC_INFLIGHT_BATCHES_DEFAULT);
    for round in 0..args.classic_rounds.max(1) {
        let ours_first = round % 2 == 1;
        for ours_turn in [ours_first, !ours_first] {
            if ours_turn {
                eprintln!(
                    "classic round {}: a classic-mode connector into the file sink (1 task)...",
                    round + 1
                );
                let file = dir.join("classic.txt").to_string_lossy().into_owned();
                let OnCluster { summary, .. } = on_fresh_cluster(args, |bootstrap| {
                    vec![
                        "pipeline".into(),
                        "--bootstrap".into(),
                        bootstrap.into(),
                        "--topic".into(),
                        "overhead".into(),
                        "--records".into(),
                        records.to_string(),
                        "--name".into(),
                        "classic".into(),
                        "--tasks".into(),
                        "1".into(),
                        "--inflight".into(),
                        inflight.to_string(),
                        "--max-poll-records".into(),
                        DEFAULT_MAX_POLL_RECORDS.to_string(),
                        "--file".into(),
                        file.clone(),
                        "--classic".into(),
                        // As the worker command runs it, as the share contender (a) is.
                        "--metrics".into(),
                    ]
                })
                .await?;
                let _ = std::fs::remove_file(&file);
                summary.add_window_to(&mut ours);
                eprintln!("  round {} connector: {}", round + 1, ours.last_round());
            } else {
                eprintln!(
                    "classic round {}: librdkafka's C classic consumer...",
                    round + 1
                );
                let OnCluster { summary, .. } =
                    on_fresh_cluster_with(args, |bootstrap| async move {
                        reference_program
                            .classic_drain(&bootstrap, "classic-c", "overhead", records)
                            .await
                    })
                    .await?;
                reference.add_complete(&summary, records)?;
                eprintln!("  round {} C: {}", round + 1, reference.last_round());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "classic mode: {records} records x {} B, {} partitions, {} brokers (dev broker, malloc {}), task.inflight.batches {inflight}; {} round(s); median (spread)",
        args.overhead_record_bytes,
        args.overhead_partitions,
        args.brokers,
        args.broker_allocator.describe(None),
        args.classic_rounds.max(1)
    );
    println!(
        "  C classic consumer (librdkafka 2.16): {}",
        reference.line()
    );
    println!("  classic connector -> file sink      : {}", ours.line());
    for (who, rounds) in [("C", &reference), ("connector", &ours)] {
        if let Some(line) = rounds.before_records_line() {
            println!("    {who}: {line}");
        }
    }
    if let (Some(c), Some(connector)) = (
        reference.after_first_us_median(),
        ours.after_first_us_median(),
    ) {
        // Printed, not judged: the goal counts whole runs, their start and join included.
        println!(
            "    CPU per record after the first record (connector / C): {:.2}",
            connector / c.max(1e-9)
        );
    }
    let cpu_ratio = ours.cpu_us_median() / reference.cpu_us_median().max(1e-9);
    println!(
        "  CPU per record ratio (connector / C): {cpu_ratio:.2}  (goal <= {:.2}); throughput ratio {:.2}",
        args.classic_max_cpu_ratio,
        ours.rate_median() / reference.rate_median().max(1e-9)
    );
    if cpu_ratio > args.classic_max_cpu_ratio {
        return Ok(vec![format!(
            "classic connector CPU per record {cpu_ratio:.2}x the C classic consumer's (goal <= {:.2})",
            args.classic_max_cpu_ratio
        )]);
    }
    Ok(Vec::new())
}

fn add_counts(
    total: &mut std::collections::BTreeMap<i16, u64>,
    counts: std::collections::BTreeMap<i16, u64>,
) {
    for (key, n) in counts {
        *total.entry(key).or_default() += n;
    }
}

/// Starts a dev cluster, produces part (a)'s records to its topic, runs one child on it and
/// returns the child's summary with the share requests the cluster received meanwhile.
async fn on_fresh_cluster(
    args: &Args,
    child_args: impl FnOnce(&str) -> Vec<String>,
) -> Result<OnCluster<Summary>> {
    on_fresh_cluster_with(args, |bootstrap| async move {
        run_child::<Summary>(&child_args(&bootstrap)).await
    })
    .await
}

/// What one contender's drain on a fresh cluster gave.
struct OnCluster<S> {
    summary: S,
    /// The dev broker's request counts by API key.
    requests: std::collections::BTreeMap<i16, u64>,
    /// What the dev broker's busiest thread did meanwhile.
    broker: Sampled,
}

/// As [`on_fresh_cluster`], with any drain (`drain`, given the bootstrap servers): the C
/// reference, or a child of ours.
async fn on_fresh_cluster_with<S, F, Fut>(args: &Args, drain: F) -> Result<OnCluster<S>>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<S>>,
{
    let (records, partitions, bytes) = (
        args.overhead_records,
        args.overhead_partitions,
        args.overhead_record_bytes,
    );
    fits_dev_broker(records, partitions, bytes)?;
    let broker = dev_cluster(args, "overhead", partitions)?;
    let bootstrap = broker.bootstrap();
    produce_all(&bootstrap, "overhead", records, bytes, partitions).await?;
    broker.start_request_tracking();
    let (summary, sampled) = while_sampling(broker.launcher_pid(), drain(bootstrap)).await;
    Ok(OnCluster {
        summary: summary?,
        requests: broker.request_counts(),
        broker: sampled,
    })
}

/// A dev cluster of `--brokers` on `--broker-allocator`, with `topic` for a share drain.
fn dev_cluster(args: &Args, topic: &str, partitions: i32) -> Result<DevBroker> {
    start_broker(
        args.brokers,
        topic,
        partitions,
        args.broker_allocator.preload()?.as_deref(),
    )
}

/// Drains `expected` records with the bare share consumer: ACCEPT every record, commit once
/// per poll (what the pipeline does per batch).
async fn drain(bootstrap: &str, group: &str, topic: &str, expected: u64) -> Result<Summary> {
    // From before the client is made, as the C reference and the connector count theirs.
    let cpu_start = cpu_time();
    let mut consumer = ShareConsumer::connect(ShareConsumerConfig::new(bootstrap, group)).await?;
    consumer.subscribe(&[topic]);
    let idle_rss_bytes = peak_rss_bytes().unwrap_or(0);
    let mut received = 0u64;
    let mut window_start: Option<(Instant, u64)> = None;
    let mut last = Instant::now();
    let started = Instant::now();
    while received < expected {
        let records = consumer.poll(Duration::from_millis(500)).await?;
        if records.is_empty() {
            let idle = if window_start.is_some() {
                last.elapsed()
            } else {
                started.elapsed()
            };
            if idle > Duration::from_secs(60) {
                bail!("the bare consumer got no records for 60 s ({received} of {expected})");
            }
            continue;
        }
        consumer.acknowledge_all(records.iter(), AcknowledgeType::Accept)?;
        received += records.len() as u64;
        let results = consumer.commit_sync(Duration::from_secs(30)).await?;
        if let Some((tp, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
            eprintln!("commit for {tp:?} failed: {e}");
        }
        last = Instant::now();
        window_start.get_or_insert((last, received));
    }
    let cpu_seconds = (cpu_time() - cpu_start).as_secs_f64();
    consumer.close().await?;
    let (start, before) = window_start.context("no records")?;
    Ok(Summary {
        records: received,
        window_records: received - before,
        seconds: last.duration_since(start).as_secs_f64(),
        cpu_seconds,
        peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
        idle_rss_bytes,
        running_rss_bytes: None,
        heap_growth_bytes: None,
        cpu_before_records_seconds: None,
    })
}

/// A share-mode file-sink connector in a worker of this process, until `records` are
/// acknowledged.
#[allow(clippy::too_many_arguments)]
async fn pipeline(
    bootstrap: &str,
    name: &str,
    topic: &str,
    records: u64,
    tasks: usize,
    inflight: usize,
    max_poll_records: usize,
    file: &str,
    metrics: bool,
    announce_ready: bool,
    classic: bool,
) -> Result<Summary> {
    if announce_ready {
        // (c) reads the heap; the other parts leave the allocator uncounted (bench/src/lib.rs).
        HeapCounter::start_counting();
    }
    let worker_config = config(&[
        ("bootstrap.servers", bootstrap),
        ("task.inflight.batches", &inflight.to_string()),
    ]);
    let (worker, scraping) = if metrics {
        let telemetry = std::sync::Arc::new(spillway::metrics::Telemetry::build(false)?);
        let worker = Worker::start_with_meter(
            worker_config,
            ConnectorRegistry::builtin(),
            &telemetry.meter(),
        )?;
        // As a Prometheus scraping every second would.
        let scraping = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let telemetry = std::sync::Arc::clone(&telemetry);
                let text = tokio::task::spawn_blocking(move || telemetry.render()).await;
                std::hint::black_box(text.ok().and_then(Result::ok).map(|t| t.len()));
            }
        });
        (worker, Some(scraping))
    } else {
        let worker = Worker::start(worker_config, ConnectorRegistry::builtin())?;
        (worker, None)
    };
    let idle_rss_bytes = peak_rss_bytes().unwrap_or(0);
    let cpu_start = cpu_time();
    let mut connector = config(&[
        ("name", name),
        ("connector.class", "FileStreamSink"),
        ("topics", topic),
        ("tasks.max", &tasks.to_string()),
        ("value.converter", "string"),
        ("file", file),
        (
            "consumer.override.max.poll.records",
            &max_poll_records.to_string(),
        ),
    ]);
    if !classic {
        connector.insert("consumer.override.group.protocol".into(), "share".into());
    } else {
        connector.insert(
            "consumer.override.auto.offset.reset".into(),
            "earliest".into(),
        );
    }
    worker.start_connector(connector).await?;
    let running = if announce_ready {
        // Every task joined and fetches (nothing yet): what the running connector costs.
        tokio::time::sleep(READY_SETTLE).await;
        HeapCounter::reset_peak();
        let heap = HeapCounter::now();
        println!("ready");
        Some((peak_rss_bytes().unwrap_or(0), heap))
    } else {
        None
    };
    let window = measure(
        &worker,
        name,
        records,
        Instant::now(),
        Duration::from_secs(600),
    )
    .await;
    let cpu_seconds = (cpu_time() - cpu_start).as_secs_f64();
    let peak = peak_rss_bytes().unwrap_or(0);
    let heap_peak = HeapCounter::peak();
    let accepted = worker.status(name).map_or(0, |s| s.totals().accepted);
    if let Some(scraping) = scraping {
        scraping.abort();
    }
    worker.shutdown().await;
    let window = window?;
    Ok(Summary {
        records: accepted,
        window_records: window.records,
        seconds: window.seconds,
        cpu_seconds,
        peak_rss_bytes: peak,
        idle_rss_bytes,
        running_rss_bytes: running.map(|(rss, _)| rss),
        heap_growth_bytes: running.map(|(_, heap)| (heap_peak - heap).max(0) as u64),
        cpu_before_records_seconds: window
            .cpu_before_records
            .map(|cpu| cpu.saturating_sub(cpu_start).as_secs_f64()),
    })
}

// ---------------------------------------------------------------------------------------------
// (b) Parallelism beyond partitions.

const SLOW_PUT_MS: &str = "slow.put.ms";

fn slow_def() -> ConfigDef {
    ConfigDef::new().define(
        ConfigKey::new(
            SLOW_PUT_MS,
            ConfigType::Long,
            Importance::High,
            "How long each put takes.",
        )
        .default("10"),
    )
}

/// A sink whose every `put` takes `slow.put.ms` and accepts the whole batch: a stand-in for a
/// slow downstream system.
#[derive(Default)]
struct SlowConnector {
    config: ConfigMap,
}

impl SinkConnector for SlowConnector {
    fn version(&self) -> &str {
        "bench"
    }

    fn config_def(&self) -> ConfigDef {
        slow_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        slow_def().parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(SlowTask::default())
    }
}

#[derive(Default)]
struct SlowTask {
    delay: Duration,
}

#[async_trait]
impl SinkTask for SlowTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let ms = config
            .get(SLOW_PUT_MS)
            .map_or(Ok(10), |v| v.parse::<u64>())
            .map_err(|e| SinkError::fatal(format!("{SLOW_PUT_MS}: {e}")))?;
        self.delay = Duration::from_millis(ms);
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        tokio::time::sleep(self.delay).await;
        Ok(records.iter().map(|_| PutOutcome::Ok).collect())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

async fn parallelism(args: &Args) -> Result<()> {
    let (records, tasks, put_ms, poll) = (
        args.slow_records,
        args.slow_tasks,
        args.slow_put_ms,
        args.slow_poll_records,
    );
    let broker = dev_cluster(args, "slow", 1)?;
    let bootstrap = broker.bootstrap();
    // Opened before the share members join and kept open until the end: on the dev broker a
    // closing client connection ends every share session on that broker.
    let producer = TestProducer::new(&bootstrap, "none");
    let worker = Worker::start(
        config(&[
            ("bootstrap.servers", &bootstrap),
            ("task.poll.timeout.ms", "100"),
        ]),
        ConnectorRegistry::builtin().with(&["slow"], || Box::new(SlowConnector::default())),
    )?;
    let connector = |name: &str, tasks: usize, share: bool| -> ConfigMap {
        let mut c = config(&[
            ("name", name),
            ("connector.class", "slow"),
            ("topics", "slow"),
            ("key.converter", "bytearray"),
            ("value.converter", "bytearray"),
            ("tasks.max", &tasks.to_string()),
            (SLOW_PUT_MS, &put_ms.to_string()),
            ("consumer.override.max.poll.records", &poll.to_string()),
        ]);
        if share {
            c.insert("consumer.override.group.protocol".into(), "share".into());
        }
        c
    };

    // Share mode: the members join the empty topic, get the partition by manual assignment, and
    // only then does the data arrive.
    eprintln!("(b) share mode: {tasks} tasks joining...");
    worker
        .start_connector(connector("slow-share", tasks, true))
        .await?;
    // The group the worker chose (a share connector's default is connect-share-<name>).
    let group_id = worker
        .status("slow-share")
        .map(|s| s.group_id)
        .context("the slow-share connector has no status")?;
    let group = group_id.as_str();
    let deadline = Instant::now() + Duration::from_secs(60);
    let members = loop {
        let members = broker.share_member_ids(group);
        if members.len() >= tasks {
            break members;
        }
        if Instant::now() > deadline {
            // The tasks' states say why (a failed task carries its reason).
            bail!(
                "only {} of {tasks} share members joined; the connector: {:?}",
                members.len(),
                worker.status("slow-share")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let assignment: Vec<(String, Vec<(String, i32)>)> = members
        .iter()
        .map(|m| (m.clone(), vec![("slow".to_owned(), 0)]))
        .collect();
    broker.share_target_assignment(group, &assignment);
    // Every member learns its assignment on its next heartbeat (300 ms).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let chunk = args.slow_produce_chunk.max(1) as u64;
    eprintln!(
        "producing {records} records of 100 bytes to slow (1 partition, {chunk} per produce call)..."
    );
    let mut next = 0u64;
    while next < records {
        let n = chunk.min(records - next);
        let batch: Vec<_> = numbered_records(next + n, 100, 1)
            .into_iter()
            .skip(next as usize)
            .collect();
        let produced = producer.send("slow", batch).await;
        if produced.len() as u64 != n {
            bail!("produced {} records, expected {n}", produced.len());
        }
        next += n;
    }
    let share = measure(
        &worker,
        "slow-share",
        records,
        Instant::now(),
        Duration::from_secs(300),
    )
    .await?;
    let per_task: Vec<u64> = worker
        .status("slow-share")
        .map(|s| s.tasks.iter().map(|t| t.counts.accepted).collect())
        .unwrap_or_default();
    worker.stop_connector("slow-share").await?;

    // Classic mode: one partition, so one task does all the work.
    eprintln!("(b) classic mode: 1 task...");
    worker
        .start_connector(connector("slow-classic", 1, false))
        .await?;
    let classic = measure(
        &worker,
        "slow-classic",
        records,
        Instant::now(),
        Duration::from_secs(300),
    )
    .await?;
    worker.shutdown().await;

    println!(
        "(b) parallelism beyond partitions: {records} records, 1 partition, sink {put_ms} ms per put, max.poll.records {poll}"
    );
    println!(
        "  classic mode, 1 task        : {:>9.0} rec/s  ({} records in {:.2} s window)",
        classic.rate(),
        classic.records,
        classic.seconds
    );
    println!(
        "  share mode, {tasks} tasks        : {:>9.0} rec/s  ({} records in {:.2} s window; accepted per task {per_task:?})",
        share.rate(),
        share.records,
        share.seconds
    );
    println!(
        "  throughput ratio (share / classic): {:.2}  (goal >= 4)",
        share.rate() / classic.rate()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// (c) Peak RSS against the configured bound.

async fn memory(args: &Args) -> Result<()> {
    let (records, partitions, bytes, tasks) = (
        args.memory_records,
        args.memory_partitions,
        args.memory_record_bytes,
        args.memory_tasks,
    );
    let inflight = args
        .memory_inflight
        .unwrap_or(SHARE_INFLIGHT_BATCHES_DEFAULT);
    let poll = args.memory_poll_records;
    let broker = dev_cluster(args, "memory", partitions)?;
    let bootstrap = broker.bootstrap();
    let dir = temp_dir("memory")?;
    eprintln!(
        "(c) starting a share-mode connector ({tasks} tasks, file sink) on the empty topic..."
    );
    let child_args: Vec<String> = vec![
        "pipeline".into(),
        "--bootstrap".into(),
        bootstrap.clone(),
        "--name".into(),
        "memory".into(),
        "--topic".into(),
        "memory".into(),
        "--records".into(),
        records.to_string(),
        "--tasks".into(),
        tasks.to_string(),
        "--inflight".into(),
        inflight.to_string(),
        "--max-poll-records".into(),
        poll.to_string(),
        "--file".into(),
        dir.join("memory.txt").to_string_lossy().into_owned(),
        "--announce-ready".into(),
    ];
    let batch_bytes = args.memory_batch_bytes;
    let ours = run_ready_child(&child_args, || async {
        eprintln!("(c) producing while it runs (producer batch.size {batch_bytes})...");
        let producer = TestProducer::with_batch_bytes(&bootstrap, "none", batch_bytes);
        let produced = producer
            .send("memory", numbered_records(records, bytes, partitions))
            .await;
        if produced.len() as u64 != records {
            bail!("produced {} records, expected {records}", produced.len());
        }
        Ok(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let ours = ours?;
    let running = ours
        .running_rss_bytes
        .context("the child did not report its RSS")?;
    let leaders = (args.brokers as usize).min(partitions.max(1) as usize);
    let bound = MemoryBound {
        tasks,
        poll_records: poll,
        record_bytes: bytes,
        leaders,
        partitions_per_leader: (partitions.max(1) as usize).div_ceil(leaders),
        stored_batch_bytes: batch_bytes,
        inflight,
    }
    .bytes();
    let growth = ours.peak_rss_bytes.saturating_sub(running);
    println!(
        "(c) peak RSS: {records} records x {bytes} B, {partitions} partitions on {} brokers, {tasks} tasks, task.inflight.batches {inflight}, max.poll.records {poll}",
        args.brokers
    );
    println!(
        "  drained at {:>9.0} rec/s ({:.1} MiB/s)",
        ours.rate(),
        ours.rate() * bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "  bound from the config: {} = {:.1} MiB (RawRecord {} B, SinkRecord {} B in memory besides their bytes)",
        MemoryBound::FORMULA,
        mib(bound),
        std::mem::size_of::<RawRecord>(),
        std::mem::size_of::<SinkRecord>()
    );
    println!(
        "  worker RSS: idle {:.1} MiB, connector running on the empty topic {:.1} MiB, peak while draining {:.1} MiB",
        mib(ours.idle_rss_bytes),
        mib(running),
        mib(ours.peak_rss_bytes)
    );
    println!(
        "  growth while draining: {:.1} MiB = {:.2} x bound",
        mib(growth),
        growth as f64 / bound.max(1) as f64
    );
    if let Some(heap) = ours.heap_growth_bytes {
        println!(
            "  of it heap (the data): {:.1} MiB = {:.2} x bound; the rest is what the allocator kept",
            mib(heap),
            heap as f64 / bound.max(1) as f64
        );
    }
    println!(
        "  data drained: {:.1} MiB; growth / data = {:.2}",
        mib(records * bytes as u64),
        growth as f64 / (records * bytes as u64).max(1) as f64
    );
    Ok(())
}

/// What a share-mode worker holds for its records at most, from its config and the data's
/// stored batch size (the share consumer fetches from a leader again only once the records
/// that leader gave are acknowledged: docs/runtime.md).
struct MemoryBound {
    tasks: usize,
    /// `max.poll.records`: the records of one fetch, and of one batch.
    poll_records: usize,
    record_bytes: usize,
    leaders: usize,
    partitions_per_leader: usize,
    /// The producer's batch size: a fetch response carries whole stored batches, so around
    /// the records it acquired it may carry up to one more batch per partition.
    stored_batch_bytes: usize,
    inflight: usize,
}

impl MemoryBound {
    const FORMULA: &'static str = "tasks x (leaders x (response: N x record + partitions per leader x stored batch, + its records: N x (record + RawRecord)) + min(inflight, leaders) x (converted: N x (record + SinkRecord), + sink output: N x record)), N = max.poll.records";

    fn bytes(&self) -> u64 {
        let n = self.poll_records;
        let record = self.record_bytes;
        // A record in memory is its bytes and the struct that holds them.
        let raw = record + std::mem::size_of::<RawRecord>();
        let converted = record + std::mem::size_of::<SinkRecord>();
        let response = n * record + self.partitions_per_leader * self.stored_batch_bytes;
        let per_leader = response + n * raw;
        let per_batch_in_flight = n * converted + n * record;
        let per_task =
            self.leaders * per_leader + self.inflight.min(self.leaders) * per_batch_in_flight;
        (self.tasks * per_task) as u64
    }
}

/// Runs a child that prints `ready` on stdout once it is set up, then `after_ready`, and reads
/// the child's JSON summary (its last stdout line).
async fn run_ready_child<F, Fut>(args: &[String], after_ready: F) -> Result<Summary>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = child_command(args)?.spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next_line().await? {
            Some(line) if line.trim() == "ready" => break,
            Some(_) => continue,
            None => bail!(
                "the child ended before it was ready: {}",
                child.wait().await?
            ),
        }
    }
    after_ready().await?;
    let mut rest = String::new();
    while let Some(line) = lines.next_line().await? {
        rest.push_str(&line);
        rest.push('\n');
    }
    let status = child.wait().await?;
    if !status.success() {
        bail!("child process {:?} failed: {status}", args.first());
    }
    last_json_line(&rest).context("reading the child's summary")
}
