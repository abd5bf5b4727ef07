//! `spillway demo`: the whole story on one machine. It starts the dev broker (behind the test-kit
//! proxy, which answers Kafka's admin requests, so share groups keep Kafka's default start and
//! the share connector sets earliest itself), produces sample
//! orders, and runs two file sinks side by side in one worker — one on a share group with three
//! tasks (KIP-1302), one on a classic consumer group — while more orders arrive. It prints live
//! progress and ends with a summary that checks every record arrived in both files; it fails
//! (non-zero exit) if any is missing.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use spillway_actors::{ConnectorStatus, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_tests::{numbered_records, ProxiedDevBroker, TestProducer};

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Records produced in total (half before the connectors start, half while they run).
    pub records: u64,
    /// Partitions of the demo topic.
    pub partitions: i32,
    /// Tasks of the share-group connector.
    pub share_tasks: usize,
    /// Where the two output files go.
    pub output_dir: PathBuf,
    /// How long to wait for every record before giving up.
    pub timeout: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            records: 20_000,
            partitions: 6,
            share_tasks: 3,
            output_dir: std::env::temp_dir().join("spillway-demo"),
            timeout: Duration::from_secs(120),
        }
    }
}

const TOPIC: &str = "demo.orders";
const SHARE: &str = "orders-share";
const CLASSIC: &str = "orders-classic";

use spillway_core::config::config_map as config;

/// The record numbers found in a demo output file (each line starts `v<n>:`).
fn numbers_in(path: &Path) -> BTreeSet<u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix('v')?.split(':').next()?.parse().ok())
        .collect()
}

fn progress_line(status: &ConnectorStatus, total: u64, rate: f64) -> String {
    let t = status.totals();
    format!(
        "{:<15} {:<45} tasks {}  accepted {:>7}/{total}  released {:>5}  rejected {:>5}  redelivered {:>5}  {:>8.0} rec/s",
        status.name,
        status.group_protocol,
        status.tasks.len(),
        t.accepted,
        t.released,
        t.rejected,
        t.ack_failures,
        rate
    )
}

/// Runs the demo; `Err` when a record did not arrive (or the demo could not run).
pub async fn run(options: DemoOptions) -> Result<()> {
    let DemoOptions {
        records,
        partitions,
        share_tasks,
        output_dir,
        timeout,
    } = options;
    std::fs::create_dir_all(&output_dir)
        .with_context(|| format!("cannot create {}", output_dir.display()))?;
    let share_file = output_dir.join("orders-share.txt");
    let classic_file = output_dir.join("orders-classic.txt");
    for f in [&share_file, &classic_file] {
        let _ = std::fs::remove_file(f);
    }

    println!(
        "starting the dev broker (librdkafka's mock cluster, behind the test-kit proxy that answers Kafka's admin requests)..."
    );
    // Share groups are left at Kafka's default start (latest): the share connector asks for
    // earliest itself through IncrementalAlterConfigs, as it does on a real cluster, so the
    // backlog produced before it starts is delivered.
    let cluster = tokio::task::spawn_blocking(|| {
        let cluster = ProxiedDevBroker::start(1, &[]).map_err(anyhow::Error::msg)?;
        cluster.broker().set_share_heartbeat_interval(500);
        Ok::<_, anyhow::Error>(cluster)
    })
    .await
    .context("the dev broker launcher panicked")??;
    cluster.broker().create_topic(TOPIC, partitions);
    let bootstrap = cluster.bootstrap();
    let first_half = records / 2;
    let all = numbered_records(records, 100, partitions);
    let (early, late) = all.split_at(first_half as usize);
    // One producer for the whole run: on the dev broker a closing client connection ends every
    // share session on that broker (a divergence from Apache Kafka), so it stays open until the
    // connectors are done.
    let producer = std::sync::Arc::new(TestProducer::new(&bootstrap, "lz4"));
    producer.send(TOPIC, early.to_vec()).await;
    println!("produced {first_half} orders to {TOPIC} ({partitions} partitions) at {bootstrap}");

    // The demo serves no HTTP: its metrics leave over OTLP when OTEL_* asks for it.
    let telemetry = crate::metrics::Telemetry::from_env()?;
    let worker = Worker::start_with_meter(
        config(&[("bootstrap.servers", &bootstrap)]),
        ConnectorRegistry::builtin(),
        &telemetry.meter(),
    )?;
    // The classic connector first: librdkafka drops its bootstrap connection shortly after it
    // starts, which on the dev broker would end the share sessions of members already running.
    worker
        .start_connector(config(&[
            ("name", CLASSIC),
            (
                "connector.class",
                "org.apache.kafka.connect.file.FileStreamSinkConnector",
            ),
            ("topics", TOPIC),
            ("tasks.max", "2"),
            ("value.converter", "string"),
            ("file", &classic_file.to_string_lossy()),
        ]))
        .await?;
    let share_tasks_text = share_tasks.to_string();
    worker
        .start_connector(config(&[
            ("name", SHARE),
            ("connector.class", "FileStreamSink"),
            ("topics", TOPIC),
            ("tasks.max", &share_tasks_text),
            ("value.converter", "string"),
            ("file", &share_file.to_string_lossy()),
            ("consumer.override.group.protocol", "share"),
        ]))
        .await?;
    println!("running {SHARE} (share group, {share_tasks} tasks) and {CLASSIC} (consumer group) side by side");

    let late = late.to_vec();
    let late_producer = std::sync::Arc::clone(&producer);
    let producing = tokio::spawn(async move { late_producer.send(TOPIC, late).await });

    let started = Instant::now();
    let mut last = (Instant::now(), 0u64, 0u64);
    // Done when every record is in both files: `accepted` also counts records read again (a
    // classic group's rebalance redelivers what was not committed), so it can pass the total
    // while records are still missing.
    let arrived = |file: &Path| numbers_in(file).len() as u64 >= records;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let share = worker.status(SHARE);
        let classic = worker.status(CLASSIC);
        let now = Instant::now();
        let secs = now.duration_since(last.0).as_secs_f64().max(0.001);
        let accepted = |s: &Option<ConnectorStatus>| s.as_ref().map_or(0, |s| s.totals().accepted);
        let (a_share, a_classic) = (accepted(&share), accepted(&classic));
        let mut out = std::io::stdout().lock();
        for (status, prev, now_count) in [(&share, last.1, a_share), (&classic, last.2, a_classic)]
        {
            if let Some(s) = status {
                let rate = now_count.saturating_sub(prev) as f64 / secs;
                let _ = writeln!(out, "{}", progress_line(s, records, rate));
            }
        }
        drop(out);
        last = (now, a_share, a_classic);
        if arrived(&share_file) && arrived(&classic_file) {
            break;
        }
        if started.elapsed() > timeout {
            println!("timed out after {timeout:?}");
            break;
        }
    }
    producing.await.context("the producer task panicked")?;
    let elapsed = started.elapsed();
    let statuses = worker.statuses();
    worker.shutdown().await;
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    drop(producer);

    println!();
    println!("summary after {:.1} s:", elapsed.as_secs_f64());
    let expected: BTreeSet<u64> = (0..records).collect();
    let mut missing_total = 0;
    for (name, file) in [(SHARE, &share_file), (CLASSIC, &classic_file)] {
        let got = numbers_in(file);
        let missing = expected.difference(&got).count();
        missing_total += missing;
        let t = statuses
            .iter()
            .find(|s| s.name == name)
            .map(ConnectorStatus::totals)
            .unwrap_or_default();
        println!(
            "  {name:<15} {} distinct of {records} records in {} ({} missing); accepted {}, released {}, rejected {}, redelivered after a lost lock {}",
            got.len(),
            file.display(),
            missing,
            t.accepted,
            t.released,
            t.rejected,
            t.ack_failures
        );
    }
    if let Some(report) = statuses
        .iter()
        .find(|s| s.name == SHARE)
        .and_then(|s| s.group_settings.as_ref())
    {
        println!(
            "  share group {} (from the connector's status):",
            report.group
        );
        for setting in &report.settings {
            println!(
                "    {} = {} ({})",
                setting.name,
                setting.value.as_deref().unwrap_or("unknown"),
                setting.source
            );
        }
        for warning in &report.warnings {
            println!("    warning: {warning}");
        }
    }
    drop(cluster);
    if missing_total > 0 {
        bail!("{missing_total} records did not arrive");
    }
    println!("every record arrived in both files");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn the_demo_delivers_every_record_to_both_files() {
        let dir = std::env::temp_dir().join(format!("spillway-demo-test-{}", std::process::id()));
        run(DemoOptions {
            records: 2_000,
            partitions: 6,
            share_tasks: 3,
            output_dir: dir.clone(),
            timeout: Duration::from_secs(60),
        })
        .await
        .expect("every record arrives");
        assert_eq!(numbers_in(&dir.join("orders-share.txt")).len(), 2_000);
        let _ = std::fs::remove_dir_all(dir);
    }
}
