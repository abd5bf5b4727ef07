//! Issue 7's benchmark: the PostgreSQL (upsert, batches of 500) and HTTP sinks run by a
//! share-mode connector with 4 tasks on the dev broker, against the same sinks fed directly.
//!
//! `cargo run --release -p spillway-bench --bin sink_targets -- [--target all|postgres|http]`
//!
//! For each target, in the same run:
//! * reference: `tasks` sink tasks of the same connector class, each `put`ting its share of the
//!   records in batches of `max.poll.records`, concurrently, with no Kafka in between. The
//!   records are the very bytes produced to the topic, converted by the connector's own
//!   converter, so both sides write the same rows and requests.
//! * spillway: the connector in a `Worker`, share mode, `tasks` tasks, reading the topic.
//!
//! The ratio (spillway / reference) is what polling, converting, acknowledging and committing
//! through a share group costs on top of the sink itself. PostgreSQL must answer on
//! 127.0.0.1:5432 (or `SPILLWAY_TEST_POSTGRES_URL`); the benchmark makes and drops its own
//! database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use spillway_actors::Worker;
use spillway_bench::{config, measure, start_broker};
use spillway_connectors::http::HttpSinkTask;
use spillway_connectors::postgres::PostgresSinkTask;
use spillway_connectors::ConnectorRegistry;
use spillway_core::pipeline::{Processed, RecordPipeline};
use spillway_core::{ConfigMap, RawRecord, SinkRecord, SinkTask};
use spillway_tests::{TestProducer, TestRecord};
use tokio_postgres::NoTls;

const TOPIC: &str = "orders";

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    All,
    Postgres,
    Http,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value_t = Target::All)]
    target: Target,
    /// Records to produce (and write, once per side).
    #[arg(long, default_value_t = 40_000)]
    records: u64,
    /// Partitions of the topic (the dev broker gives each partition to one share member).
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Tasks of the connector, and concurrent sink tasks of the reference.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// `max.poll.records`: the batch each `put` gets, on both sides.
    #[arg(long, default_value_t = 500)]
    batch: usize,
}

/// An order as JSON with Connect's schema envelope, so the PostgreSQL sink can create its table.
fn order(n: u64) -> Vec<u8> {
    serde_json::json!({
        "schema": {
            "type": "struct", "name": "order", "optional": false,
            "fields": [
                {"field": "id", "type": "int64", "optional": false},
                {"field": "customer", "type": "string", "optional": false},
                {"field": "qty", "type": "int32", "optional": false},
                {"field": "price", "type": "double", "optional": false},
                {"field": "note", "type": "string", "optional": true}
            ]
        },
        "payload": {
            "id": n,
            "customer": format!("customer-{}", n % 977),
            "qty": (n % 10) as i32,
            "price": n as f64 * 0.25,
            "note": if n.is_multiple_of(3) { None } else { Some(format!("order {n}")) }
        }
    })
    .to_string()
    .into_bytes()
}

fn orders(records: u64, partitions: i32) -> Vec<TestRecord> {
    (0..records)
        .map(|n| TestRecord {
            partition: Some((n % partitions as u64) as i32),
            key: Some(n.to_string().into_bytes()),
            value: Some(order(n)),
            ..TestRecord::default()
        })
        .collect()
}

/// The records as the connector's converter turns them into sink records, split into one
/// share per reference task.
fn converted(
    records: &[TestRecord],
    connector: &ConfigMap,
    tasks: usize,
) -> Result<Vec<Vec<SinkRecord>>> {
    let pipeline = RecordPipeline::from_config(connector, &ConfigMap::new())?;
    let mut shares = vec![Vec::new(); tasks];
    for (i, record) in records.iter().enumerate() {
        let mut raw = RawRecord::new(TOPIC, record.partition.unwrap_or(0), i as i64);
        raw.key = record.key.clone().map(Into::into);
        raw.value = record.value.clone().map(Into::into);
        match pipeline.process(&raw) {
            Processed::Ready(sink_record) => shares[i % tasks].push(sink_record),
            other => bail!("record {i} did not convert: {other:?}"),
        }
    }
    Ok(shares)
}

/// `tasks` sink tasks made by `new_task`, started with `connector`, putting their shares in
/// batches of `batch` concurrently. Records per second over all of them.
async fn reference<T, F>(
    new_task: F,
    connector: &ConfigMap,
    shares: Vec<Vec<SinkRecord>>,
    batch: usize,
) -> Result<f64>
where
    T: SinkTask + 'static,
    F: Fn() -> T,
{
    let mut started = Vec::new();
    for share in shares {
        let mut task = new_task();
        task.start(connector).await?;
        started.push((task, share));
    }
    let total: usize = started.iter().map(|(_, share)| share.len()).sum();
    let begin = Instant::now();
    let runs = started.into_iter().map(|(mut task, share)| async move {
        for chunk in share.chunks(batch) {
            let outcomes = task.put(chunk).await?;
            if let Some(refused) = outcomes.iter().find(|o| !o.is_ok()) {
                bail!("the reference sink refused a record: {refused:?}");
            }
        }
        task.stop().await?;
        Ok::<_, anyhow::Error>(())
    });
    for result in futures::future::join_all(runs).await {
        result?;
    }
    Ok(total as f64 / begin.elapsed().as_secs_f64())
}

/// The connector in a worker, share mode, until every record is acknowledged.
async fn spillway(bootstrap: &str, connector: &ConfigMap, records: u64) -> Result<f64> {
    let worker = Worker::start(
        config(&[("bootstrap.servers", bootstrap)]),
        ConnectorRegistry::builtin(),
    )?;
    let name = connector
        .get("name")
        .context("connector without a name")?
        .clone();
    worker.start_connector(connector.clone()).await?;
    let window = measure(
        &worker,
        &name,
        records,
        Instant::now(),
        Duration::from_secs(600),
    )
    .await;
    let status = worker.status(&name);
    worker.shutdown().await;
    let window = window?;
    if let Some(status) = status {
        let totals = status.totals();
        if totals.rejected > 0 || totals.released > 0 {
            bail!(
                "{name}: {} rejected, {} released",
                totals.rejected,
                totals.released
            );
        }
    }
    Ok(window.rate())
}

fn report(target: &str, reference: f64, spillway: f64, args: &Args) {
    println!(
        "{target}: {} records, {} tasks, batches of {}",
        args.records, args.tasks, args.batch
    );
    println!("  reference (sink tasks fed directly) : {reference:>9.0} rec/s");
    println!("  spillway, share mode                 : {spillway:>9.0} rec/s");
    println!(
        "  ratio (spillway / reference)         : {:.2}",
        spillway / reference
    );
}

fn connector_base(args: &Args, name: &str, class: &str) -> ConfigMap {
    config(&[
        ("name", name),
        ("connector.class", class),
        ("topics", TOPIC),
        ("tasks.max", &args.tasks.to_string()),
        ("key.converter", "string"),
        ("value.converter", "json"),
        ("value.converter.schemas.enable", "true"),
        ("consumer.override.group.protocol", "share"),
        (
            "consumer.override.max.poll.records",
            &args.batch.to_string(),
        ),
    ])
}

async fn postgres(args: &Args, bootstrap: &str, records: &[TestRecord]) -> Result<()> {
    let server = std::env::var("SPILLWAY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let (admin, connection) = tokio_postgres::connect(&format!("{server}/postgres"), NoTls)
        .await
        .with_context(|| format!("PostgreSQL does not answer at {server}"))?;
    tokio::spawn(connection);
    let db = format!("spillway_bench_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE \"{db}\""))
        .await?;
    let result = async {
        let mut connector = connector_base(args, "pg-orders", "postgres");
        for (key, value) in [
            ("connection.url", format!("{server}/{db}")),
            ("insert.mode", "upsert".into()),
            ("pk.mode", "record_value".into()),
            ("pk.fields", "id".into()),
            ("auto.create", "true".into()),
        ] {
            connector.insert(key.into(), value);
        }
        let mut direct = connector.clone();
        direct.insert("table.name.format".into(), "orders_reference".into());
        let shares = converted(records, &direct, args.tasks)?;
        let reference = reference(PostgresSinkTask::new, &direct, shares, args.batch).await?;
        let spillway = spillway(bootstrap, &connector, args.records).await?;
        let (db_client, connection) =
            tokio_postgres::connect(&format!("{server}/{db}"), NoTls).await?;
        tokio::spawn(connection);
        for table in ["orders", "orders_reference"] {
            let rows: i64 = db_client
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await?
                .get(0);
            if rows as u64 != args.records {
                bail!("{table} holds {rows} rows, expected {}", args.records);
            }
        }
        report("postgres upsert", reference, spillway, args);
        Ok(())
    }
    .await;
    admin
        .batch_execute(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .await?;
    result
}

async fn http(args: &Args, bootstrap: &str, records: &[TestRecord]) -> Result<()> {
    let received = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&received);
    // Counts the requests' bytes: a receiver that does as little as possible, so the figures
    // are the sink's and the pipeline's.
    let app = axum::Router::new().route(
        "/ingest",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(body.len() as u64, Ordering::Relaxed);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/ingest", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let mut connector = connector_base(args, "http-orders", "http");
    connector.insert("http.url".into(), url);
    connector.insert("batch.max.records".into(), args.batch.to_string());
    connector.insert("batch.format".into(), "json_array".into());
    let shares = converted(records, &connector, args.tasks)?;
    let reference = reference(HttpSinkTask::new, &connector, shares, args.batch).await?;
    let spillway = spillway(bootstrap, &connector, args.records).await?;
    server.abort();
    if received.load(Ordering::Relaxed) == 0 {
        bail!("the HTTP receiver got nothing");
    }
    report("http (json_array)", reference, spillway, args);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let broker = start_broker(1, TOPIC, args.partitions, None)?;
    let bootstrap = broker.bootstrap();
    let records = orders(args.records, args.partitions);
    eprintln!(
        "producing {} orders to {TOPIC} ({} partitions)...",
        args.records, args.partitions
    );
    // Kept open until the end: on the dev broker a closing connection ends every share session.
    let producer = TestProducer::new(&bootstrap, "lz4");
    producer.send(TOPIC, records.clone()).await;
    if matches!(args.target, Target::All | Target::Postgres) {
        postgres(&args, &bootstrap, &records).await?;
    }
    if matches!(args.target, Target::All | Target::Http) {
        http(&args, &bootstrap, &records).await?;
    }
    drop(producer);
    Ok(())
}
