//! Issue 18 item 3, the kafka sink alone: records fed from memory to one `kafka` sink task
//! configured as `spillway mirror` configures a flow's (bytearray converters, same partition,
//! `A.${topic}`, MM2's metrics and offset syncs on the source location, no `spillway.source.*`
//! headers unless `--source-headers`), writing to a dev
//! broker. It isolates the sink's per-record path (`put` and the producer it calls) from the
//! consumer and the actors, for instruction counts under callgrind (bench/README.md):
//!
//! ```text
//! cargo build --release -p spillway-bench --bin kafka_sink_put
//! for n in 20000 60000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n target/release/kafka_sink_put --records $n
//! done
//! # instructions per record = (Ir(60000) - Ir(20000)) / 40000
//! ```
//!
//! `--generate-only` builds the same records without putting them: its per-record figure is the
//! harness's own share, to subtract. The broker is another process, so it is not counted; the
//! producer's librdkafka threads are (as they are in the C reference's figure).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Parser;
use spillway_connectors::kafka::KafkaSinkTask;
use spillway_core::data::Value;
use spillway_core::record::TimestampType;
use spillway_core::{
    Assignment, ConfigMap, PutOutcome, SinkRecord, SinkTask, Topic, TopicPartition,
};
use spillway_tests::DevBroker;

#[derive(Parser)]
struct Args {
    /// Records put.
    #[arg(long, default_value_t = 20_000)]
    records: u64,
    /// Records per `put` (a poll's worth).
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Partitions of the source topic (and its remote topic).
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Build the records but put none (the harness's own cost).
    #[arg(long)]
    generate_only: bool,
    /// Exactly once (classic mode, the target another cluster than the source, as a mirror
    /// flow's): each put is one transaction, committed by `flush` as the runtime does.
    #[arg(long)]
    exactly_once: bool,
    /// Write the `spillway.source.*` headers (the kafka sink's default; a mirror flow's only
    /// with `source.headers.enabled=true`).
    #[arg(long)]
    source_headers: bool,
}

/// One batch of source records `first..first + n`, as the bytearray converter hands them over.
fn batch(topic: &Topic, first: u64, n: u64, partitions: i32, value: &Bytes) -> Vec<SinkRecord> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    (first..first + n)
        .map(|i| {
            let partition = (i % partitions as u64) as i32;
            let offset = (i / partitions as u64) as i64;
            let mut record = SinkRecord::new(
                topic.clone(),
                partition,
                offset,
                Value::Bytes(value.clone()),
            );
            record.key = Value::Bytes(Bytes::from(format!("k{i}")));
            record.timestamp = Some(now);
            record.timestamp_type = TimestampType::CreateTime;
            record
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    // As the worker does (`spillway` main).
    spillway_actors::allocator::use_jemalloc();
    let args = Args::parse();
    let broker = DevBroker::try_start(
        1,
        &[
            ("A.orders", args.partitions),
            ("mm2-offset-syncs.B.internal", 1),
            ("__spillway_eos_ledger.mirror-A-B", args.partitions),
        ],
    )
    .context("dev broker")?;
    let telemetry = spillway::metrics::Telemetry::build(false)?;
    telemetry.install_global();
    let bootstrap = broker.bootstrap();
    let guarantee = if args.exactly_once {
        "exactly_once"
    } else {
        "at_least_once"
    };
    let config: ConfigMap = [
        ("name", "mirror-A-B"),
        ("connector.class", "kafka"),
        // Another cluster than the target, as in a mirror flow (only compared, never reached).
        ("source.bootstrap.servers", "cluster-a:9092"),
        ("target.bootstrap.servers", bootstrap.as_str()),
        ("topic.rename.format", "A.${topic}"),
        ("target.partition", "keep"),
        (
            "key.converter",
            "org.apache.kafka.connect.converters.ByteArrayConverter",
        ),
        (
            "value.converter",
            "org.apache.kafka.connect.converters.ByteArrayConverter",
        ),
        ("delivery.guarantee", guarantee),
        (
            "source.headers",
            if args.source_headers { "true" } else { "false" },
        ),
        ("source.cluster.alias", "A"),
        ("target.cluster.alias", "B"),
        ("offset.syncs.topic", "mm2-offset-syncs.B.internal"),
        ("offset.syncs.bootstrap.servers", bootstrap.as_str()),
        ("offset.lag.max", "100"),
        ("task.id", "0"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let mut task = KafkaSinkTask::default();
    task.start(&config).await.context("start")?;
    let topic = Topic::from("orders");
    if args.exactly_once {
        let partitions = (0..args.partitions)
            .map(|p| TopicPartition::new("orders", p))
            .collect();
        task.open(&Assignment::Partitions(partitions))
            .await
            .context("open")?;
    }
    let value = Bytes::from(vec![b'.'; args.value_size]);
    let started = Instant::now();
    let mut first = 0;
    let mut failed = 0;
    while first < args.records {
        let n = (args.records - first).min(args.batch as u64);
        let records = batch(&topic, first, n, args.partitions, &value);
        first += n;
        if args.generate_only {
            std::hint::black_box(records);
            continue;
        }
        let outcomes = task.put(&records).await.context("put")?;
        if args.exactly_once {
            // Per partition, as the runtime does (a short list, then a map of a few entries),
            // so that the harness adds no map insert and topic copy per record.
            let mut next: Vec<(i32, i64)> = Vec::new();
            for r in &records {
                match next.iter_mut().find(|(p, _)| *p == r.partition) {
                    Some((_, o)) => *o = (*o).max(r.offset + 1),
                    None => next.push((r.partition, r.offset + 1)),
                }
            }
            let offsets: BTreeMap<TopicPartition, i64> = next
                .into_iter()
                .map(|(p, o)| (TopicPartition::new("orders", p), o))
                .collect();
            task.flush(&offsets).await.context("commit")?;
        }
        failed += outcomes
            .iter()
            .filter(|o| !matches!(o, PutOutcome::Ok))
            .count();
    }
    let elapsed = started.elapsed();
    task.stop().await.context("stop")?;
    println!(
        "{} records in {:.2}s ({:.0}/s){}",
        args.records,
        elapsed.as_secs_f64(),
        args.records as f64 / elapsed.as_secs_f64(),
        if args.generate_only {
            ", generated only"
        } else {
            ""
        }
    );
    if failed > 0 {
        bail!("{failed} records not written");
    }
    Ok(())
}
