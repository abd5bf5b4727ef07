//! Measures `put` throughput of the PostgreSQL and HTTP sinks on this machine, with batches of
//! 500 records, without Kafka: `cargo run --release -p spillway-connectors --example
//! sink_put_rate`. Needs the PostgreSQL server on 127.0.0.1:5432 (or
//! SPILLWAY_TEST_POSTGRES_URL); makes and drops its own database.

use std::time::{Duration, Instant};

use spillway_connectors::http::HttpSinkTask;
use spillway_connectors::postgres::PostgresSinkTask;
use spillway_core::{Field, Schema, SchemaRef, SinkRecord, SinkTask, Struct, Value};
use tokio_postgres::NoTls;

const BATCH: usize = 500;
const BATCHES: usize = 100;

fn order_schema() -> Schema {
    Schema::structure(vec![
        Field::new("id", Schema::int64()),
        Field::new("customer", Schema::string()),
        Field::new("qty", Schema::int32()),
        Field::new("price", Schema::float64()),
        Field::new("at", Schema::timestamp()),
        Field::new("tags", Schema::array(Schema::string()).optional()),
    ])
}

fn orders(count: usize, version: i32) -> Vec<SinkRecord> {
    let schema = SchemaRef::new(order_schema());
    (0..count)
        .map(|i| {
            let value = Struct::new()
                .with("id", Value::Int64(i as i64))
                .with(
                    "customer",
                    Value::String(format!("customer-{}", i % 977).into()),
                )
                .with("qty", Value::Int32(version + (i % 10) as i32))
                .with("price", Value::Float64(i as f64 * 0.25))
                .with("at", Value::Int64(1_700_000_000_000 + i as i64))
                .with("tags", Value::Array(vec!["a".into(), "b".into()]));
            let mut record = SinkRecord::new("orders", (i % 8) as i32, i as i64, value.into());
            record.value_schema = Some(schema.clone());
            record
        })
        .collect()
}

use spillway_core::config::config_map as config;

async fn rate(task: &mut dyn SinkTask, records: &[SinkRecord]) -> (f64, usize) {
    let start = Instant::now();
    let mut refused = 0;
    for batch in records.chunks(BATCH) {
        let outcomes = task.put(batch).await.expect("put");
        refused += outcomes.iter().filter(|o| !o.is_ok()).count();
    }
    (
        records.len() as f64 / start.elapsed().as_secs_f64(),
        refused,
    )
}

async fn postgres() {
    let server = std::env::var("SPILLWAY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let (admin, connection) = tokio_postgres::connect(&format!("{server}/postgres"), NoTls)
        .await
        .expect("PostgreSQL answers");
    tokio::spawn(connection);
    let db = format!("spillway_rate_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE \"{db}\""))
        .await
        .expect("create db");

    let mut task = PostgresSinkTask::new();
    task.start(&config(&[
        ("connection.url", &format!("{server}/{db}")),
        ("insert.mode", "upsert"),
        ("pk.mode", "record_value"),
        ("pk.fields", "id"),
        ("auto.create", "true"),
    ]))
    .await
    .expect("start");
    let total = BATCH * BATCHES;
    let (insert, _) = rate(&mut task, &orders(total, 1)).await;
    println!("postgres upsert, new rows:             {insert:>9.0} records/s ({total} records, batches of {BATCH})");
    let (update, _) = rate(&mut task, &orders(total, 2)).await;
    println!("postgres upsert, redelivery (updates): {update:>9.0} records/s");

    // One poison record per batch: the batch statement fails, then every row of the batch is
    // written in its own savepoint. This is what a savepoint per record would cost always.
    admin
        .batch_execute("SELECT 1")
        .await
        .expect("admin still up");
    let (db_admin, connection) = tokio_postgres::connect(&format!("{server}/{db}"), NoTls)
        .await
        .expect("db answers");
    tokio::spawn(connection);
    db_admin
        .batch_execute("ALTER TABLE orders ADD CONSTRAINT qty_not_13 CHECK (qty <> 13)")
        .await
        .expect("constraint");
    let mut poisoned = orders(total, 3);
    for batch in poisoned.chunks_mut(BATCH) {
        if let Value::Struct(s) = &mut batch[BATCH / 2].value {
            s.put("qty", Value::Int32(13));
        }
    }
    let (fallback, refused) = rate(&mut task, &poisoned).await;
    println!("postgres upsert, 1 poison per batch:   {fallback:>9.0} records/s ({refused} rejected; refused parts halved in savepoints)");
    task.stop().await.expect("stop");
    drop(db_admin);
    admin
        .batch_execute(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .await
        .expect("drop db");
}

async fn http() {
    let app = axum::Router::new().route(
        "/ingest",
        axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/ingest", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    for format in ["json_array", "ndjson"] {
        let mut task = HttpSinkTask::new();
        task.start(&config(&[
            ("http.url", &url),
            ("batch.format", format),
            ("batch.max.records", "500"),
        ]))
        .await
        .expect("start");
        let (r, _) = rate(&mut task, &orders(BATCH * BATCHES, 1)).await;
        println!("http {format:<10} to a local receiver:  {r:>9.0} records/s");
    }
}

#[tokio::main]
async fn main() {
    postgres().await;
    http().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}
