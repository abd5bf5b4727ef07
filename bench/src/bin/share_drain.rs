//! Issues 2 and 18's benchmark: drain the same records with Spillway's native share consumer
//! and with librdkafka 2.16's share consumer in C (the reference, `bench/c/`), in one run, and
//! print both CPU per record and rates (median and spread over the rounds), their ratios, peak
//! RSS and the share requests each client sent per 1,000 records. It exits non-zero when our
//! CPU per record exceeds `--max-cpu-ratio` (1.0) times the reference's.
//!
//! `cargo run --release -p spillway-bench --bin share_drain -- [--records N] [--rounds R] [--partitions P]`
//!
//! The reference used to be the Python `ShareConsumer` of `confluent-kafka`; its interpreter
//! added its own CPU per record, so the C program (the same librdkafka, linked from the same
//! wheel) replaced it here: it is the fairer measure of what librdkafka spends.
//!
//! `--tls-cost` measures instead what security costs our consumer (issue 13): the same drain
//! through the test-kit proxy in PLAINTEXT (the reference), SSL and SASL_SSL with SCRAM-SHA-512,
//! each on a fresh dev cluster per round, printing CPU per record beside plaintext's. The proxy
//! runs in this (parent) process, so its TLS work is not counted; the goal is that TLS adds at
//! most `--tls-max-ratio` to the consumer's CPU per record.
//!
//! Both clients acknowledge every record explicitly with ACCEPT and commit once per poll
//! (`max.poll.records` the same for both). Each
//! drains in its own process, one after the other, so neither steals CPU from the other. Our
//! side runs as a child process of this binary (`drain` subcommand) so its peak RSS is its own.
//!
//! The dev broker keeps only 5 MiB per partition (older batches are dropped), so a million
//! 100-byte records on 8 partitions cannot be held at once: the run drains them in rounds of
//! `--round-records` and adds up each client's drain time over the rounds. In every round each
//! client gets a fresh dev cluster with the round's records produced the same way, because the
//! dev broker's share path slows down with every group that has drained on it. On that broker
//! the broker's CPU is the ceiling for both clients (its ShareFetch answer walks every unarchived
//! offset of a partition against the list of record locks, brief §8.6 #32), so the throughput
//! ratio mostly says whether we keep it busy; CPU per record is where the clients differ.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use spillway_actors::consumer_settings::DEFAULT_MAX_POLL_RECORDS;
use spillway_bench::c_reference::{CReference, Rounds};
use spillway_bench::{cpu_time, peak_rss_bytes, run_child, share_requests, BrokerAllocator};
use spillway_kafka::security::{ClientSecurity, SecuritySettings};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_tests::{
    numbered_records, produce, DevBroker, KafkaProxy, ProxyOptions, ProxySecurity, SaslMechanism,
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
    /// Our consumer's MaxRecords per ShareFetch (0 = max.poll.records, as the reference).
    #[arg(long, default_value_t = 0)]
    fetch_max_records: usize,
    /// Rounds at least (each contender drains `--round-records` per round on a fresh cluster).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Goal: our CPU per record at most this times the C share consumer's (medians).
    #[arg(long, default_value_t = 1.0)]
    max_cpu_ratio: f64,
    /// Measure what TLS and SASL cost our consumer instead of comparing with librdkafka.
    #[arg(long)]
    tls_cost: bool,
    /// `--tls-cost` goal: SSL and SASL_SSL CPU per record at most this times plaintext's.
    #[arg(long, default_value_t = 1.5)]
    tls_max_ratio: f64,
    /// The dev broker's `malloc` (jemalloc keeps its cost per record the same whatever the
    /// client: `BrokerAllocator`).
    #[arg(long, value_enum, default_value_t = BrokerAllocator::Jemalloc)]
    broker_allocator: BrokerAllocator,
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
        #[arg(long)]
        fetch_max_records: usize,
        /// The consumer's security keys (librdkafka or Java spelling) as a JSON object.
        #[arg(long, default_value = "{}")]
        security: String,
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
    // As the worker does (`spillway` main).
    spillway_actors::allocator::use_jemalloc();
    let args = Args::parse();
    match args.role {
        Some(Role::Drain {
            bootstrap,
            group,
            topic,
            records,
            fetch_max_records,
            security,
        }) => {
            let security: std::collections::BTreeMap<String, String> =
                serde_json::from_str(&security).context("--security is a JSON object")?;
            let security = SecuritySettings::from_config(&security)?.client_security()?;
            let summary = drain(
                &bootstrap,
                &group,
                &topic,
                records,
                fetch_max_records,
                security,
            )
            .await?;
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        None if args.tls_cost => tls_cost(&args).await,
        None => compare(&args).await,
    }
}

async fn compare(args: &Args) -> Result<()> {
    // The dev broker keeps at most 5 MiB per partition and drops the oldest batches beyond that,
    // and its share path slows down with every share group that has drained on it (even on
    // another topic). So the records are drained in rounds, and in each round each client
    // drains the round's records on a dev cluster of its own, produced the same way; the order
    // alternates between rounds.
    let reference_program = CReference::build()?;
    let preload = args.broker_allocator.preload()?;
    let rounds = args
        .records
        .div_ceil(args.round_records.max(1))
        .max(args.rounds);
    let mut reference = Rounds::default();
    let mut ours = Rounds::default();
    let mut reference_requests = Totals::default();
    let mut ours_requests = Totals::default();
    let mut duplicates = 0u64;
    // The C reference's max.poll.records: ours fetches max.poll.records too unless told.
    let poll_records = if args.fetch_max_records == 0 {
        DEFAULT_MAX_POLL_RECORDS
    } else {
        args.fetch_max_records
    };
    for round in 0..rounds {
        let count = args.round_records.min(args.records).max(1);
        eprintln!(
            "round {}/{rounds}: {count} records of {} bytes, {} partitions",
            round + 1,
            args.record_bytes,
            args.partitions
        );
        let ours_first = round % 2 == 1;
        for ours_turn in [ours_first, !ours_first] {
            let broker = DevBroker::try_start_preloaded(
                args.brokers,
                &[("bench", args.partitions)],
                preload.as_deref(),
            )?;
            broker.set_share_auto_offset_reset("earliest");
            let bootstrap = broker.bootstrap();
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
            broker.start_request_tracking();
            if ours_turn {
                eprintln!("  draining with Spillway's share consumer...");
                let summary =
                    drain_in_child(&bootstrap, count, args.fetch_max_records, "{}").await?;
                if summary.records != count {
                    bail!("spillway drained {} of {count} records", summary.records);
                }
                ours.add(
                    summary.records,
                    summary.seconds,
                    summary.cpu_seconds,
                    summary.peak_rss_bytes,
                );
                ours_requests.add(summary.records, summary.seconds, summary.cpu_seconds);
                ours_requests.add_requests(broker.request_counts());
                duplicates += summary.duplicates;
            } else {
                eprintln!("  draining with librdkafka 2.16's C share consumer...");
                let summary = reference_program
                    .share_drain(&bootstrap, "bench-reference", "bench", count, poll_records)
                    .await?;
                reference.add_complete(&summary, count)?;
                reference_requests.add(summary.records, summary.seconds, summary.cpu_seconds);
                reference_requests.add_requests(broker.request_counts());
            }
        }
    }

    println!(
        "share_drain: {rounds} round(s) of {} records x {} B, {} partitions, {} brokers (dev broker, malloc {}), a fresh cluster per contender and round, order alternating; median (spread) over the rounds",
        args.round_records.min(args.records).max(1),
        args.record_bytes,
        args.partitions,
        args.brokers,
        args.broker_allocator.describe(preload.as_deref())
    );
    println!("  C share consumer (librdkafka 2.16): {}", reference.line());
    println!(
        "  spillway ShareConsumer            : {} ({duplicates} duplicate deliveries)",
        ours.line()
    );
    let cpu_ratio = ours.cpu_us_median() / reference.cpu_us_median().max(1e-9);
    let rate_ratio = ours.rate_median() / reference.rate_median().max(1e-9);
    println!("  throughput ratio (spillway / C): {rate_ratio:.2}");
    println!(
        "  CPU per record ratio (spillway / C): {cpu_ratio:.2}  (goal <= {:.2})",
        args.max_cpu_ratio
    );
    println!(
        "  requests (C)       : {}",
        share_requests(&reference_requests.requests, reference_requests.records)
    );
    println!(
        "  requests (spillway): {}",
        share_requests(&ours_requests.requests, ours_requests.records)
    );
    if cpu_ratio > args.max_cpu_ratio {
        bail!(
            "goal missed: spillway spends {cpu_ratio:.2}x the C share consumer's CPU per record (goal <= {:.2})",
            args.max_cpu_ratio
        );
    }
    Ok(())
}

/// Drains `count` records with our consumer in a child process, so that its peak RSS is its own.
async fn drain_in_child(
    bootstrap: &str,
    count: u64,
    fetch_max_records: usize,
    security: &str,
) -> Result<DrainSummary> {
    run_child(&[
        "drain".into(),
        "--bootstrap".into(),
        bootstrap.into(),
        "--group".into(),
        "bench-spillway".into(),
        "--topic".into(),
        "bench".into(),
        "--records".into(),
        count.to_string(),
        "--fetch-max-records".into(),
        fetch_max_records.to_string(),
        "--security".into(),
        security.into(),
    ])
    .await
}

/// `--tls-cost`: our consumer through the proxy in plaintext, SSL and SASL_SSL (SCRAM-SHA-512).
async fn tls_cost(args: &Args) -> Result<()> {
    const USER: (&str, &str) = ("bench", "bench-secret");
    let modes = [
        ProxySecurity::Plaintext,
        ProxySecurity::Ssl,
        ProxySecurity::SaslSsl,
    ];
    let mut totals: Vec<Totals> = modes.iter().map(|_| Totals::default()).collect();
    let preload = args.broker_allocator.preload()?;
    let rounds = args.records.div_ceil(args.round_records.max(1));
    for round in 0..rounds {
        let count = args
            .round_records
            .min(args.records - round * args.round_records);
        eprintln!("round {}/{rounds}: {count} records", round + 1);
        // Rotate the order between rounds, so no mode always drains first.
        for i in 0..modes.len() {
            let m = (i + round as usize) % modes.len();
            let security = modes[m];
            let broker = DevBroker::try_start_preloaded(
                args.brokers,
                &[("bench", args.partitions)],
                preload.as_deref(),
            )?;
            broker.set_share_auto_offset_reset("earliest");
            produce(
                &broker.bootstrap(),
                "bench",
                numbered_records(count, args.record_bytes, args.partitions),
                "none",
            )
            .await;
            let proxy = KafkaProxy::start(
                &broker.bootstrap(),
                ProxyOptions::new(security)
                    .with_mechanisms(&[SaslMechanism::ScramSha512])
                    .with_user(USER.0, USER.1),
            )?;
            let mut keys = serde_json::Map::new();
            keys.insert("security.protocol".into(), security.name().into());
            if let Some(pki) = proxy.pki() {
                keys.insert(
                    "ssl.ca.location".into(),
                    pki.ca_path.display().to_string().into(),
                );
            }
            if security.uses_sasl() {
                keys.insert("sasl.mechanism".into(), "SCRAM-SHA-512".into());
                keys.insert("sasl.username".into(), USER.0.into());
                keys.insert("sasl.password".into(), USER.1.into());
            }
            eprintln!("  draining through a {security} proxy...");
            let keys = serde_json::Value::Object(keys).to_string();
            let ours =
                drain_in_child(&proxy.bootstrap(), count, args.fetch_max_records, &keys).await?;
            if ours.records != count {
                bail!("{security}: drained {} of {count} records", ours.records);
            }
            totals[m].add(ours.records, ours.seconds, ours.cpu_seconds);
        }
    }
    println!(
        "share_drain --tls-cost: {} records x {} B, {} partitions, through the test-kit proxy (dev broker's malloc {})",
        args.records,
        args.record_bytes,
        args.partitions,
        args.broker_allocator.describe(preload.as_deref())
    );
    let plaintext = totals[0].cpu_per_record();
    let mut missed = Vec::new();
    for (security, total) in modes.iter().zip(&totals) {
        let ratio = total.cpu_per_record() / plaintext.max(f64::EPSILON);
        println!(
            "  {:<15}: {}  CPU/record vs plaintext: {ratio:.2}",
            security.name(),
            total.line()
        );
        if ratio > args.tls_max_ratio {
            missed.push(format!(
                "{security} costs {ratio:.2}x plaintext's CPU per record"
            ));
        }
    }
    if !missed.is_empty() {
        bail!(
            "goal missed (at most {:.2}x): {}",
            args.tls_max_ratio,
            missed.join("; ")
        );
    }
    Ok(())
}

/// Records, drain time (first record to last), CPU time and the requests the brokers received
/// of one client over all rounds.
#[derive(Default)]
struct Totals {
    records: u64,
    seconds: f64,
    cpu_seconds: f64,
    requests: std::collections::BTreeMap<i16, u64>,
}

impl Totals {
    fn add(&mut self, records: u64, seconds: f64, cpu_seconds: f64) {
        self.records += records;
        self.seconds += seconds;
        self.cpu_seconds += cpu_seconds;
    }

    fn add_requests(&mut self, counts: std::collections::BTreeMap<i16, u64>) {
        for (key, n) in counts {
            *self.requests.entry(key).or_default() += n;
        }
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
async fn drain(
    bootstrap: &str,
    group: &str,
    topic: &str,
    expected: u64,
    fetch_max_records: usize,
    security: ClientSecurity,
) -> Result<DrainSummary> {
    // From before the client is made, as the C reference counts its own.
    let cpu_start = cpu_time();
    let mut config = ShareConsumerConfig::new(bootstrap, group);
    config.fetch_max_records = fetch_max_records;
    config.security = security;
    let mut consumer = ShareConsumer::connect(config).await?;
    consumer.subscribe(&[topic]);
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
