//! The PostgreSQL sink against the server on 127.0.0.1:5432 (trust auth, user postgres; set
//! SPILLWAY_TEST_POSTGRES_URL to use another). Each test makes its own database and drops it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use spillway_connectors::postgres::PostgresSinkTask;
use spillway_core::convert::{Converter, JsonConverter};
use spillway_core::{ConfigMap, Disposition, PutOutcome, RecordPart, SinkRecord, SinkTask, Value};
use tokio_postgres::NoTls;

fn server_url() -> String {
    std::env::var("SPILLWAY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

async fn admin(database: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&format!("{}/{database}", server_url()), NoTls)
            .await
            .expect("the test PostgreSQL server at 127.0.0.1:5432 answers");
    tokio::spawn(connection);
    client
}

/// A database of its own for one test, dropped (with its connections) when the test ends.
struct TestDb {
    name: String,
}

impl TestDb {
    async fn new(test: &str) -> TestDb {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "spillway_{test}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        admin("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .expect("create the test database");
        TestDb { name }
    }

    fn url(&self) -> String {
        format!("{}/{}", server_url(), self.name)
    }

    async fn client(&self) -> tokio_postgres::Client {
        admin(&self.name).await
    }

    fn config(&self, pairs: &[(&str, &str)]) -> ConfigMap {
        let mut config: ConfigMap = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        config.insert("connection.url".into(), self.url());
        config
    }

    /// Every row of `table` as text, ordered: what "contents unchanged" compares.
    async fn rows(&self, sql: &str) -> Vec<String> {
        self.client()
            .await
            .query(sql, &[])
            .await
            .expect("query the sink's table")
            .iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| {
                        row.get::<_, Option<String>>(i)
                            .unwrap_or_else(|| "NULL".into())
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside any runtime (or inside one that is shutting down): use a thread.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            runtime.block_on(async {
                admin("postgres")
                    .await
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

/// A record whose value is JSON with a schema envelope, read by core's JSON converter as the
/// runtime would.
fn envelope_record(topic: &str, offset: i64, key: Option<i64>, json: &str) -> SinkRecord {
    let value = JsonConverter::new(RecordPart::Value, true)
        .to_connect(topic, Some(json.as_bytes()))
        .expect("a valid envelope");
    let mut record = SinkRecord::new(topic, 0, offset, value.value);
    record.value_schema = value.schema;
    if let Some(key) = key {
        record.key = Value::Int64(key);
    }
    record
}

const ORDER_SCHEMA: &str = r#"{"type":"struct","name":"Order","fields":[
    {"field":"id","type":"int64","optional":false},
    {"field":"customer","type":"string","optional":true},
    {"field":"qty","type":"int32","optional":false},
    {"field":"tags","type":"array","items":{"type":"string"},"optional":true}]}"#;

fn order(offset: i64, id: i64, customer: &str, qty: i32) -> SinkRecord {
    let json = format!(
        r#"{{"schema":{ORDER_SCHEMA},"payload":{{"id":{id},"customer":"{customer}","qty":{qty},"tags":["a","b"]}}}}"#
    );
    envelope_record("orders", offset, Some(id), &json)
}

async fn started(config: &ConfigMap) -> PostgresSinkTask {
    let mut task = PostgresSinkTask::new();
    task.start(config).await.expect("the sink starts");
    task
}

fn dispositions(outcomes: &[PutOutcome]) -> Vec<Disposition> {
    outcomes.iter().map(PutOutcome::disposition).collect()
}

fn all_accepted(outcomes: &[PutOutcome]) -> bool {
    outcomes.iter().all(PutOutcome::is_ok)
}

#[tokio::test]
async fn upsert_makes_redelivery_idempotent() {
    let db = TestDb::new("upsert").await;
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_value"),
        ("pk.fields", "id"),
        ("auto.create", "true"),
    ]);
    let mut task = started(&config).await;
    // 300 records over 100 ids: later records update earlier ones, also within one batch.
    let records: Vec<SinkRecord> = (0..300)
        .map(|offset| {
            order(
                offset,
                offset % 100,
                &format!("c{offset}"),
                (offset + 1) as i32,
            )
        })
        .collect();
    for batch in records.chunks(70) {
        assert!(all_accepted(&task.put(batch).await.expect("written")));
    }
    let query = "SELECT id::text, customer, qty::text, tags::text FROM orders ORDER BY orders.id";
    let first = db.rows(query).await;
    assert_eq!(first.len(), 100);
    assert_eq!(first[7], "7|c207|208|[\"a\", \"b\"]");

    // Share groups redeliver in other groupings: everything again, in batches of 33.
    for batch in records.chunks(33) {
        assert!(all_accepted(&task.put(batch).await.expect("written again")));
    }
    assert_eq!(db.rows(query).await, first, "redelivery changed nothing");
    task.stop().await.expect("stops");
}

#[tokio::test]
async fn auto_evolve_adds_a_nullable_column_for_a_new_field() {
    let db = TestDb::new("evolve").await;
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_key"),
        ("pk.fields", "id"),
        ("auto.create", "true"),
        ("auto.evolve", "true"),
        ("table.name.format", "kafka_${topic}"),
    ]);
    let mut task = started(&config).await;
    let v1 = r#"{"schema":{"type":"struct","fields":[{"field":"name","type":"string","optional":false}]},
                 "payload":{"name":"ada"}}"#;
    let outcomes = task
        .put(&[envelope_record("users", 0, Some(1), v1)])
        .await
        .expect("v1 written");
    assert!(all_accepted(&outcomes));

    let v2 = r#"{"schema":{"type":"struct","fields":[{"field":"name","type":"string","optional":false},
                 {"field":"email","type":"string","optional":true},
                 {"field":"joined","type":"int64","name":"org.apache.kafka.connect.data.Timestamp","optional":true}]},
                 "payload":{"name":"grace","email":"grace@example.com","joined":86400000}}"#;
    let outcomes = task
        .put(&[envelope_record("users", 1, Some(2), v2)])
        .await
        .expect("v2 written");
    assert!(all_accepted(&outcomes));

    let columns = db
        .rows(
            "SELECT column_name::text, data_type::text, is_nullable::text FROM information_schema.columns \
             WHERE table_name = 'kafka_users' ORDER BY ordinal_position",
        )
        .await;
    assert_eq!(
        columns,
        vec![
            "id|bigint|NO",
            "name|text|NO",
            "email|text|YES",
            "joined|timestamp without time zone|YES",
        ]
    );
    assert_eq!(
        db.rows(
            "SELECT id::text, name, email, joined::text FROM kafka_users ORDER BY kafka_users.id"
        )
        .await,
        vec![
            "1|ada|NULL|NULL",
            "2|grace|grace@example.com|1970-01-02 00:00:00"
        ]
    );
}

#[tokio::test]
async fn without_auto_evolve_a_new_field_is_rejected_naming_table_and_column() {
    let db = TestDb::new("noevolve").await;
    db.client()
        .await
        .batch_execute("CREATE TABLE users (id bigint PRIMARY KEY, name text)")
        .await
        .expect("table");
    let config = db.config(&[("pk.mode", "record_key"), ("pk.fields", "id")]);
    let mut task = started(&config).await;
    let json = r#"{"schema":{"type":"struct","fields":[{"field":"name","type":"string"},{"field":"email","type":"string"}]},
                   "payload":{"name":"ada","email":"a@b"}}"#;
    let outcomes = task
        .put(&[envelope_record("users", 0, Some(1), json)])
        .await
        .expect("refused per record");
    assert_eq!(
        dispositions(&outcomes),
        vec![Disposition::Reject {
            reason: "table 'users' has no column(s) email and auto.evolve is false; add them or \
                     set auto.evolve=true"
                .into()
        }]
    );
}

#[tokio::test]
async fn a_poison_record_is_rejected_with_the_database_message_while_its_batch_lands() {
    let db = TestDb::new("poison").await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer varchar(8), qty integer NOT NULL \
             CONSTRAINT qty_positive CHECK (qty > 0), tags jsonb)",
        )
        .await
        .expect("table");
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_value"),
        ("pk.fields", "id"),
    ]);
    let mut task = started(&config).await;
    let mut batch: Vec<SinkRecord> = (0..10).map(|i| order(i, i, "ok", 1)).collect();
    batch[3] = order(3, 3, "ok", -5); // check constraint (23514)
    batch[6] = order(6, 6, "far-too-long-name", 1); // value too long (22001)
    batch[8] = SinkRecord::new("orders", 0, 8, "not a struct".into()); // no row at all

    let outcomes = task.put(&batch).await.expect("the batch is written");
    let rejected: Vec<(usize, String)> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o.disposition() {
            Disposition::Reject { reason } => Some((i, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(rejected.len(), 3, "{rejected:?}");
    assert_eq!(rejected[0].0, 3);
    assert_eq!(
        rejected[0].1,
        "the database refused record orders-0@3 for table 'orders': new row for relation \
         \"orders\" violates check constraint \"qty_positive\": Failing row contains (3, ok, -5, \
         [\"a\", \"b\"]). (SQLSTATE 23514)"
    );
    assert_eq!(rejected[1].0, 6);
    assert!(
        rejected[1]
            .1
            .contains("value too long for type character varying(8) (SQLSTATE 22001)"),
        "{}",
        rejected[1].1
    );
    assert_eq!(rejected[2].0, 8);
    assert!(
        rejected[2].1.contains("its value is a string"),
        "{}",
        rejected[2].1
    );
    assert_eq!(
        db.rows("SELECT id::text FROM orders ORDER BY orders.id")
            .await,
        vec!["0", "1", "2", "4", "5", "7", "9"],
        "the rest of the batch landed"
    );
}

#[tokio::test]
async fn tombstones_delete_rows_by_record_key() {
    let db = TestDb::new("delete").await;
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_key"),
        ("pk.fields", "id"),
        ("auto.create", "true"),
        ("delete.enabled", "true"),
    ]);
    let mut task = started(&config).await;
    let mut batch: Vec<SinkRecord> = (0..5).map(|i| order(i, i, "c", 1)).collect();
    let mut tombstone = SinkRecord::new("orders", 0, 5, Value::Null);
    tombstone.key = Value::Int64(2);
    batch.push(tombstone.clone());
    batch.push(order(6, 4, "again", 9));
    assert!(all_accepted(&task.put(&batch).await.expect("written")));
    assert_eq!(
        db.rows("SELECT id::text, customer FROM orders ORDER BY orders.id")
            .await,
        vec!["0|c", "1|c", "3|c", "4|again"]
    );
    // A redelivered tombstone deletes nothing more and is accepted.
    assert!(all_accepted(&task.put(&[tombstone]).await.expect("again")));
}

#[tokio::test]
async fn a_missing_table_without_auto_create_rejects_its_records_naming_the_table() {
    let db = TestDb::new("notable").await;
    let mut task = started(&db.config(&[])).await;
    let outcomes = task.put(&[order(0, 1, "c", 1)]).await.expect("per record");
    assert_eq!(
        dispositions(&outcomes),
        vec![Disposition::Reject {
            reason: "table 'orders' does not exist and auto.create is false; create the table or \
                     set auto.create=true"
                .into()
        }]
    );
}

/// Ends every connection of the sink to `db` (the way a server restart would).
async fn terminate_sink_connections(db: &TestDb) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND application_name = 'spillway-postgres-sink'",
            &[&db.name],
        )
        .await
        .expect("terminate")
        .get(0)
}

#[tokio::test]
async fn terminated_connections_release_the_batch_and_it_lands_when_retried() {
    let db = TestDb::new("restart").await;
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_value"),
        ("pk.fields", "id"),
        ("auto.create", "true"),
    ]);
    let mut task = started(&config).await;
    let records: Vec<SinkRecord> = (0..1000).map(|i| order(i, i, "c", 1)).collect();
    let batches: Vec<&[SinkRecord]> = records.chunks(100).collect();
    assert!(all_accepted(
        &task.put(batches[0]).await.expect("first batch")
    ));

    // Between batches: the idle connection is gone; the next batch must still land.
    assert!(terminate_sink_connections(&db).await >= 1);
    let mut released = 0;
    for batch in &batches[1..5] {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match task.put(batch).await {
                Ok(outcomes) if all_accepted(&outcomes) => break,
                Ok(outcomes) => panic!("unexpected outcomes {:?}", dispositions(&outcomes)),
                Err(e) => {
                    assert!(e.is_retriable(), "a lost connection is retriable: {e}");
                    released += 1;
                    assert!(attempts < 3, "the batch lands once retried");
                }
            }
        }
    }

    // During a batch: block the write on a lock, kill the sink's backend, then let go.
    let blocker = db.client().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let killer = async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let waiting: i64 = db
                .client()
                .await
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                     AND application_name = 'spillway-postgres-sink' AND wait_event_type = 'Lock'",
                    &[&db.name],
                )
                .await
                .expect("activity")
                .get(0);
            if waiting > 0 {
                break;
            }
        }
        assert!(terminate_sink_connections(&db).await >= 1);
        blocker.batch_execute("ROLLBACK").await.expect("unlock");
    };
    let (result, ()) = tokio::join!(task.put(batches[5]), killer);
    let error = result.expect_err("the batch in flight fails");
    assert!(error.is_retriable(), "{error}");
    assert!(
        error
            .message()
            .contains("terminating connection due to administrator command")
            || error.message().contains("connection"),
        "{error}"
    );
    released += 1;
    let rows_after_failure = db.rows("SELECT count(*)::text FROM orders").await;
    assert_eq!(
        rows_after_failure,
        vec!["500"],
        "nothing of the failed batch was committed"
    );

    // Redelivery of the released batch, then the rest of the stream. The pool may still hold
    // a connection whose termination the client has not read yet (it looks open at checkout):
    // that put fails retriable too, and the next one lands.
    for batch in &batches[5..] {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match task.put(batch).await {
                Ok(outcomes) => {
                    assert!(all_accepted(&outcomes));
                    break;
                }
                Err(e) => {
                    assert!(e.is_retriable(), "a lost connection is retriable: {e}");
                    assert!(attempts < 3, "the batch lands once retried: {e}");
                }
            }
        }
    }
    assert!(released >= 1);
    assert_eq!(
        db.rows("SELECT count(*)::text, count(DISTINCT id)::text, min(id)::text, max(id)::text FROM orders")
            .await,
        vec!["1000|1000|0|999"],
        "nothing lost, nothing doubled"
    );
}

#[tokio::test]
async fn every_poison_record_of_a_batch_is_found_and_only_those_are_rejected() {
    let db = TestDb::new("manypoison").await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer text, qty integer NOT NULL \
             CHECK (qty > 0), tags jsonb)",
        )
        .await
        .expect("table");
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_value"),
        ("pk.fields", "id"),
    ]);
    let mut task = started(&config).await;
    let poison = [0_i64, 1, 17, 18, 63, 64, 99, 130, 199];
    let batch: Vec<SinkRecord> = (0..200)
        .map(|i| order(i, i, "c", if poison.contains(&i) { 0 } else { 1 }))
        .collect();
    let outcomes = task.put(&batch).await.expect("the batch is written");
    let rejected: Vec<i64> = outcomes
        .iter()
        .zip(&batch)
        .filter(|(o, _)| !o.is_ok())
        .map(|(_, r)| r.offset)
        .collect();
    assert_eq!(rejected, poison);
    assert_eq!(
        db.rows("SELECT count(*)::text FROM orders").await,
        vec![(200 - poison.len()).to_string()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_tasks_create_and_fill_one_table_concurrently() {
    let db = TestDb::new("fourtasks").await;
    let config = db.config(&[
        ("insert.mode", "upsert"),
        ("pk.mode", "record_value"),
        ("pk.fields", "id"),
        ("auto.create", "true"),
        ("auto.evolve", "true"),
    ]);
    // Share groups hand any record to any task: every task sees overlapping ids, in other orders.
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..4 {
        let config = config.clone();
        tasks.spawn(async move {
            let mut task = started(&config).await;
            let mut ids: Vec<i64> = (0..400).collect();
            ids.rotate_left(t * 100);
            let records: Vec<SinkRecord> = ids.iter().map(|&i| order(i, i, "c", 1)).collect();
            let mut released = 0;
            for batch in records.chunks(50) {
                loop {
                    match task.put(batch).await {
                        Ok(outcomes) => {
                            assert!(all_accepted(&outcomes), "{:?}", dispositions(&outcomes));
                            break;
                        }
                        // Deadlocks between tasks upserting the same rows are retriable.
                        Err(e) if e.is_retriable() && released < 20 => released += 1,
                        Err(e) => panic!("task {t}: {e}"),
                    }
                }
            }
            task.stop().await.expect("stops");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a task ran to the end");
    }
    assert_eq!(
        db.rows("SELECT count(*)::text, count(DISTINCT id)::text FROM orders")
            .await,
        vec!["400|400"]
    );
}

/// A login the server refuses (a role it does not know, a database that does not exist) is
/// the connector's configuration, not a record's fault and not worth retrying: `start` fails
/// with a task-level error naming the SQLSTATE (class 28, 3D000). The task fails under the
/// restart policy; no record is rejected for it (docs/runtime.md, "Error kinds").
#[tokio::test]
async fn a_login_the_server_refuses_is_a_task_level_error() {
    let db = TestDb::new("refused_login").await;
    let mut unknown_role = db.config(&[("table.name.format", "orders")]);
    unknown_role.insert("connection.user".into(), "no_such_role_for_spillway".into());
    let mut unknown_database = db.config(&[("table.name.format", "orders")]);
    unknown_database.insert(
        "connection.url".into(),
        format!("{}/no_such_database_for_spillway", server_url()),
    );
    for (what, config, sqlstate) in [
        ("unknown role", unknown_role, "28000"),
        ("unknown database", unknown_database, "3D000"),
    ] {
        let mut task = PostgresSinkTask::new();
        let error = task
            .start(&config)
            .await
            .expect_err("the server refuses the login");
        assert!(error.is_task_level(), "{what}: {error}");
        assert!(!error.is_retriable(), "{what}: {error}");
        assert!(
            error.message().contains("cannot connect")
                && error.message().contains(&format!("SQLSTATE {sqlstate}")),
            "{what}: {error}"
        );
    }
}
