//! The PostgreSQL sink task: each `put` is one database transaction.
//!
//! Records are grouped into runs of consecutive records with the same row shape (table,
//! operation, columns); each run is one `UNNEST` statement inside a savepoint. When the
//! database refuses a run for its data (SQLSTATE class 22 or 23), the run is rolled back to its
//! savepoint and written again in halves, each in its own savepoint, halving the refused parts
//! until single rows remain, so only the poison records are rejected and the rest of the batch
//! still commits. A lost connection, a serialization failure or a deadlock releases the whole
//! batch instead: nothing of it was committed, and redelivery writes it again.

use std::collections::HashMap;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Transaction};
use spillway_core::egress::{EgressPolicy, EgressRefusal};
use spillway_core::{ConfigMap, PutOutcome, SinkError, SinkRecord, SinkTask, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use crate::postgres::column::ColumnValues;
use crate::postgres::config::{InsertMode, PostgresSinkConfig};
use crate::postgres::error::{DbFailure, PostgresSinkError};
use crate::postgres::row::{row_of, Operation, RowShape};
use crate::postgres::statement::statement_sql;
use crate::postgres::table::Tables;

/// Writes records to PostgreSQL tables; see the module docs for how a batch is written.
#[derive(Default)]
pub struct PostgresSinkTask {
    running: Option<Running>,
}

/// What a started task holds.
struct Running {
    config: PostgresSinkConfig,
    pool: Pool,
    tables: Tables,
    /// `host:port/database`, for messages.
    target: String,
}

/// One record's row within a run.
struct Row<'a> {
    /// Position of the record in the batch.
    index: usize,
    values: Vec<&'a Value>,
    /// Earlier records of the batch with the same primary key: an upsert writes only the
    /// last one (a statement may not update a row twice), and they share its outcome.
    superseded: Vec<usize>,
}

/// Consecutive rows of one shape, written by one statement.
struct Run<'a> {
    shape: RowShape,
    rows: Vec<Row<'a>>,
}

impl Run<'_> {
    fn indexes(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows
            .iter()
            .flat_map(|r| std::iter::once(r.index).chain(r.superseded.iter().copied()))
    }
}

fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("{host}:{port}/{db}")
}

impl PostgresSinkTask {
    pub fn new() -> Self {
        PostgresSinkTask::default()
    }

    fn running(&mut self) -> Result<&mut Running, SinkError> {
        self.running
            .as_mut()
            .ok_or_else(|| SinkError::fatal("the PostgreSQL sink task was not started"))
    }
}

/// Groups records into runs of one shape; records that cannot be rows get their outcome now.
fn plan<'a>(
    config: &PostgresSinkConfig,
    records: &'a [SinkRecord],
    outcomes: &mut [Option<PutOutcome>],
) -> Vec<Run<'a>> {
    let mut runs: Vec<Run<'a>> = Vec::new();
    for (index, record) in records.iter().enumerate() {
        match row_of(config, record) {
            Ok((shape, values)) => {
                let row = Row {
                    index,
                    values,
                    superseded: Vec::new(),
                };
                match runs.last_mut() {
                    Some(run) if run.shape == shape => run.rows.push(row),
                    _ => runs.push(Run {
                        shape,
                        rows: vec![row],
                    }),
                }
            }
            Err(detail) => {
                let error = PostgresSinkError::BadRecord {
                    record: record.original.clone(),
                    detail,
                };
                outcomes[index] = Some(PutOutcome::Fatal(error.into_sink_error()));
            }
        }
    }
    if config.insert_mode == InsertMode::Upsert {
        for run in &mut runs {
            if run.shape.operation == Operation::Write {
                keep_last_per_key(run);
            }
        }
    }
    runs
}

/// Leaves one row per primary key in an upsert run: the last, which carries the others. The
/// rows end up ordered by key, so tasks upserting overlapping keys (share groups hand any
/// record to any task) lock rows in the same order and seldom deadlock.
fn keep_last_per_key(run: &mut Run<'_>) {
    let key_len = run.shape.key.len();
    let mut position: HashMap<String, usize> = HashMap::with_capacity(run.rows.len());
    let mut kept: Vec<(String, Row<'_>)> = Vec::with_capacity(run.rows.len());
    for mut row in run.rows.drain(..) {
        let key = format!("{:?}", &row.values[..key_len]);
        match position.get(&key) {
            Some(&at) => {
                let earlier = &mut kept[at].1;
                row.superseded.push(earlier.index);
                row.superseded.append(&mut earlier.superseded);
                kept[at].1 = row;
            }
            None => {
                position.insert(key.clone(), kept.len());
                kept.push((key, row));
            }
        }
    }
    kept.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    run.rows = kept.into_iter().map(|(_, row)| row).collect();
}

/// One array parameter per column for `rows`; a value that fits no column names its row.
fn parameters(shape: &RowShape, rows: &[Row<'_>]) -> Result<Vec<ColumnValues>, (usize, String)> {
    shape
        .columns()
        .enumerate()
        .map(|(c, column)| {
            let mut values = ColumnValues::with_capacity(column.kind, rows.len());
            for (r, row) in rows.iter().enumerate() {
                values
                    .push(column.kind, row.values[c])
                    .map_err(|e| (r, format!("column '{}': {e}", column.name)))?;
            }
            Ok(values)
        })
        .collect()
}

/// Runs `statement` with the parameters of `rows`.
async fn execute(
    tx: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    params: &[ColumnValues],
) -> Result<u64, tokio_postgres::Error> {
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(ColumnValues::as_param).collect();
    tx.execute(statement, &refs).await
}

/// What became of a run that did not abort the batch: the records refused, with why.
type Refused = Vec<(usize, PostgresSinkError)>;

/// Writes one run inside its own savepoint. `Err` means the batch must be released (a
/// retriable failure); `Ok` lists the records refused for good.
async fn write_run(
    tx: &Transaction<'_>,
    run: &mut Run<'_>,
    mode: InsertMode,
    records: &[SinkRecord],
) -> Result<Refused, PostgresSinkError> {
    let table = run.shape.table.clone();
    let statement_error = |e: &tokio_postgres::Error| PostgresSinkError::Statement {
        table: table.clone(),
        failure: DbFailure::from_postgres(e),
    };
    let mut refused = Refused::new();
    let params = loop {
        match parameters(&run.shape, &run.rows) {
            Ok(params) => break params,
            Err((position, detail)) => {
                let row = run.rows.remove(position);
                let record = records[row.index].original.clone();
                for index in std::iter::once(row.index).chain(row.superseded) {
                    let error = PostgresSinkError::BadRecord {
                        record: record.clone(),
                        detail: detail.clone(),
                    };
                    refused.push((index, error));
                }
            }
        }
    };
    if run.rows.is_empty() {
        return Ok(refused);
    }
    tx.batch_execute("SAVEPOINT spillway_run")
        .await
        .map_err(|e| statement_error(&e))?;
    let sql = statement_sql(&run.shape, mode);
    let result = match tx.prepare_cached(&sql).await {
        Ok(statement) => execute(tx, &statement, &params).await.map(|_| statement),
        Err(e) => Err(e),
    };
    let error = match result {
        Ok(_) => {
            tx.batch_execute("RELEASE SAVEPOINT spillway_run")
                .await
                .map_err(|e| statement_error(&e))?;
            return Ok(refused);
        }
        Err(e) => e,
    };
    let failure = DbFailure::from_postgres(&error);
    if failure.is_retriable() {
        return Err(statement_error(&error));
    }
    tx.batch_execute("ROLLBACK TO SAVEPOINT spillway_run; RELEASE SAVEPOINT spillway_run")
        .await
        .map_err(|e| statement_error(&e))?;
    let nothing_to_delete =
        run.shape.operation == Operation::Delete && failure.code.as_deref() == Some("42P01");
    if nothing_to_delete {
        return Ok(refused);
    }
    if !failure.is_record_data_error() {
        if failure.is_missing_relation() {
            // Surfaced to the caller, which may repair the table and release.
            return Err(statement_error(&error));
        }
        for index in run.indexes() {
            refused.push((index, statement_error(&error)));
        }
        return Ok(refused);
    }
    // The data, not the SQL, was refused: the statement is prepared and cached.
    let statement = tx
        .prepare_cached(&sql)
        .await
        .map_err(|e| statement_error(&e))?;
    let poison = isolate_refused(tx, &statement, run, records, failure).await?;
    refused.extend(poison);
    Ok(refused)
}

/// Finds the rows of a refused run that the database refuses, by halving: each part is
/// written again in its own savepoint; a refused part of one row is a poison record, a refused
/// larger part is split in two. One poison record among 500 costs about 2·log2(500) ≈ 18
/// statements, where a savepoint per row costs 500 (measured: see the crate's
/// `sink_put_rate` example). The rows that are not refused stay written.
async fn isolate_refused(
    tx: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    run: &Run<'_>,
    records: &[SinkRecord],
    whole_run_failure: DbFailure,
) -> Result<Refused, PostgresSinkError> {
    let table = &run.shape.table;
    let statement_error = |e: &tokio_postgres::Error| PostgresSinkError::Statement {
        table: table.clone(),
        failure: DbFailure::from_postgres(e),
    };
    let refuse = |row: &Row<'_>, failure: &DbFailure, refused: &mut Refused| {
        for index in std::iter::once(row.index).chain(row.superseded.iter().copied()) {
            refused.push((
                index,
                PostgresSinkError::RecordRefused {
                    record: records[index].original.clone(),
                    table: table.clone(),
                    failure: failure.clone(),
                },
            ));
        }
    };
    let mut refused = Refused::new();
    let rows = run.rows.as_slice();
    if let [row] = rows {
        refuse(row, &whole_run_failure, &mut refused);
        return Ok(refused);
    }
    // Parts still to try, the next on top; the whole run is known to fail, so start halved.
    let middle = rows.len() / 2;
    let mut parts: Vec<&[Row<'_>]> = vec![&rows[middle..], &rows[..middle]];
    while let Some(part) = parts.pop() {
        let params = parameters(&run.shape, part).map_err(|(position, detail)| {
            PostgresSinkError::BadRecord {
                record: records[part[position].index].original.clone(),
                detail,
            }
        })?;
        tx.batch_execute("SAVEPOINT spillway_part")
            .await
            .map_err(|e| statement_error(&e))?;
        match execute(tx, statement, &params).await {
            Ok(_) => tx
                .batch_execute("RELEASE SAVEPOINT spillway_part")
                .await
                .map_err(|e| statement_error(&e))?,
            Err(e) => {
                let failure = DbFailure::from_postgres(&e);
                if failure.is_retriable() {
                    return Err(statement_error(&e));
                }
                tx.batch_execute(
                    "ROLLBACK TO SAVEPOINT spillway_part; RELEASE SAVEPOINT spillway_part",
                )
                .await
                .map_err(|e| statement_error(&e))?;
                match part {
                    [row] => refuse(row, &failure, &mut refused),
                    _ if !failure.is_record_data_error() => {
                        for row in part {
                            refuse(row, &failure, &mut refused);
                        }
                    }
                    _ => {
                        let middle = part.len() / 2;
                        parts.push(&part[middle..]);
                        parts.push(&part[..middle]);
                    }
                }
            }
        }
    }
    Ok(refused)
}

impl Running {
    /// Writes the batch in one transaction, filling in `outcomes`; `Err` releases the batch.
    async fn write(
        &mut self,
        records: &[SinkRecord],
        outcomes: &mut [Option<PutOutcome>],
    ) -> Result<(), PostgresSinkError> {
        let mut runs = plan(&self.config, records, outcomes);
        if runs.is_empty() {
            return Ok(());
        }
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| connect_error(&self.target, &e))?;
        let mut writable = Vec::with_capacity(runs.len());
        for run in runs.drain(..) {
            if run.shape.operation == Operation::Write {
                if let Err(e) = self.tables.ensure(&mut client, &run.shape).await {
                    if e.is_retriable() {
                        return Err(e);
                    }
                    for index in run.indexes() {
                        outcomes[index] = Some(PutOutcome::Fatal(e.clone().into_sink_error()));
                    }
                    continue;
                }
            }
            writable.push(run);
        }
        let transaction_error = |e: tokio_postgres::Error| PostgresSinkError::Transaction {
            records: records.len(),
            failure: DbFailure::from_postgres(&e),
        };
        let tx = client.transaction().await.map_err(transaction_error)?;
        for run in &mut writable {
            match write_run(&tx, run, self.config.insert_mode, records).await {
                Ok(refused) => {
                    for (index, error) in refused {
                        outcomes[index] = Some(PutOutcome::Fatal(error.into_sink_error()));
                    }
                }
                Err(e) => {
                    if let PostgresSinkError::Statement { table, failure } = &e {
                        if failure.is_missing_relation() {
                            self.tables.forget(table);
                            if !self.tables.repairs_itself() {
                                // Nothing will bring the table back: refuse the run.
                                for index in run.indexes() {
                                    outcomes[index] =
                                        Some(PutOutcome::Fatal(e.clone().into_sink_error()));
                                }
                                continue;
                            }
                            // The next delivery creates the table or column again.
                            return Err(PostgresSinkError::Statement {
                                table: table.clone(),
                                failure: DbFailure {
                                    connection_lost: true,
                                    ..failure.clone()
                                },
                            });
                        }
                    }
                    return Err(e);
                }
            }
        }
        tx.commit().await.map_err(transaction_error)?;
        Ok(())
    }
}

/// `connection` held to the worker's egress policy: every host name is resolved and judged now
/// and the connection is pinned to the judged address (`hostaddr`), so the pool's connections,
/// reconnections included, go where the policy allowed and a name rebound to an internal
/// address later is never connected to. Addresses the URL gives (`hostaddr=`) are what
/// tokio-postgres connects to, so those are judged. `Err(refused, reason)`: `refused` when the
/// policy refused an address (not a resolution failure, which may pass).
fn pin_to_vetted(
    policy: &EgressPolicy,
    mut connection: tokio_postgres::Config,
) -> Result<tokio_postgres::Config, (bool, String)> {
    let ports = connection.get_ports().to_vec();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let refused = |e: EgressRefusal| (e.is_internal(), e.to_string());
    if !connection.get_hostaddrs().is_empty() {
        for (i, addr) in connection.get_hostaddrs().iter().enumerate() {
            policy.vet(&addr.to_string(), port(i)).map_err(refused)?;
        }
        return Ok(connection);
    }
    let hosts = connection.get_hosts().to_vec();
    for (i, host) in hosts.iter().enumerate() {
        match host {
            tokio_postgres::config::Host::Tcp(name) => {
                let vetted = policy.vet(name, port(i)).map_err(refused)?;
                // vet answers at least one address.
                connection.hostaddr(vetted[0].ip());
            }
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => {
                return Err((
                    true,
                    format!(
                        "connection.url connects through the Unix socket {}, a path on the \
                         worker's machine, which a tenant's sink may not use",
                        path.display()
                    ),
                ))
            }
        }
    }
    Ok(connection)
}

/// A pool checkout that failed, with the server's SQLSTATE when it refused the login.
fn connect_error(target: &str, error: &deadpool_postgres::PoolError) -> PostgresSinkError {
    let code = match error {
        deadpool_postgres::PoolError::Backend(e) => e.code().map(|c| c.code().to_owned()),
        _ => None,
    };
    let detail = match &code {
        Some(code) => format!("{error} (SQLSTATE {code})"),
        None => error.to_string(),
    };
    PostgresSinkError::Connect {
        target: target.to_owned(),
        detail,
        code,
    }
}

#[async_trait]
impl SinkTask for PostgresSinkTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let egress = EgressPolicy::from_plugin_config(config)
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        let config =
            PostgresSinkConfig::parse(config).map_err(|e| SinkError::fatal(e.to_string()))?;
        let target = describe_target(&config.connection);
        let connection = match egress {
            None => config.connection.clone(),
            Some(policy) => {
                let connection = config.connection.clone();
                // Resolving blocks.
                let pinned =
                    tokio::task::spawn_blocking(move || pin_to_vetted(&policy, connection))
                        .await
                        .map_err(|e| SinkError::retriable(format!("resolving {target}: {e}")))?;
                match pinned {
                    Ok(connection) => connection,
                    Err((true, refusal)) => {
                        return Err(SinkError::task_level(format!(
                            "not connecting to {target}: {refusal}"
                        )))
                    }
                    Err((false, reason)) => {
                        return Err(SinkError::retriable(format!(
                            "not connecting to {target}: {reason}"
                        )))
                    }
                }
            }
        };
        let manager = Manager::from_config(
            connection,
            NoTls,
            ManagerConfig {
                // A connection broken while idle is noticed at checkout (is_closed) without a
                // round trip; one that breaks during a batch fails that batch, retriably.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .build()
            .map_err(|e| {
                SinkError::fatal(format!("cannot build a connection pool for {target}: {e}"))
            })?;
        // Fail early on a bad password or database name; a server that is down is retriable.
        let probe = pool
            .get()
            .await
            .map_err(|e| connect_error(&target, &e).into_sink_error())?;
        drop(probe);
        let tables = Tables::new(config.auto_create, config.auto_evolve);
        self.running = Some(Running {
            config,
            pool,
            tables,
            target,
        });
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        let running = self.running()?;
        let mut outcomes: Vec<Option<PutOutcome>> = vec![None; records.len()];
        running
            .write(records, &mut outcomes)
            .await
            .map_err(PostgresSinkError::into_sink_error)?;
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or(PutOutcome::Ok))
            .collect())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        if let Some(running) = self.running.take() {
            running.pool.close();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(url: &str) -> tokio_postgres::Config {
        url.parse().expect("a valid URL")
    }

    #[test]
    fn the_pool_is_pinned_to_the_address_the_policy_judged() {
        let loopback = EgressPolicy::parse("127.0.0.0/8,::1").expect("valid");
        let pinned = pin_to_vetted(&loopback, connection("postgres://u@localhost:5433/db"))
            .expect("allowed");
        let addr = pinned.get_hostaddrs()[0];
        assert!(addr.is_loopback(), "{addr}");
        let refused = pin_to_vetted(
            &EgressPolicy::default(),
            connection("postgres://u@localhost:5433/db"),
        )
        .expect_err("loopback");
        assert!(refused.0, "a refusal, not a resolution failure");
        assert!(
            refused.1.contains("localhost") && refused.1.contains("tenant.egress.allow"),
            "{}",
            refused.1
        );
        // hostaddr is what tokio-postgres connects to, whatever the host name says.
        let (refused, reason) = pin_to_vetted(
            &EgressPolicy::default(),
            connection("postgres://u@db.example.com/db?hostaddr=10.0.0.7"),
        )
        .expect_err("private");
        assert!(refused && reason.contains("10.0.0.7"), "{reason}");
    }
    use spillway_core::SchemaRef;
    use spillway_core::{Field, Schema, Struct};

    fn config(pairs: &[(&str, &str)]) -> PostgresSinkConfig {
        let mut props: ConfigMap = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        props.insert("connection.url".into(), "postgres://h/db".into());
        PostgresSinkConfig::parse(&props).expect("valid")
    }

    fn record(topic: &str, offset: i64, id: i64, note: &str) -> SinkRecord {
        let mut r = SinkRecord::new(
            topic,
            0,
            offset,
            Value::Struct(
                Struct::new()
                    .with("id", id.into())
                    .with("note", note.into()),
            ),
        );
        r.value_schema = Some(SchemaRef::new(Schema::structure(vec![
            Field::new("id", Schema::int64()),
            Field::new("note", Schema::string()),
        ])));
        r
    }

    #[test]
    fn consecutive_records_of_one_shape_form_one_run_and_bad_ones_are_refused_at_once() {
        let config = config(&[("pk.mode", "record_value"), ("pk.fields", "id")]);
        let records = vec![
            record("a", 0, 1, "x"),
            record("a", 1, 2, "y"),
            SinkRecord::new("a", 0, 2, "plain text".into()),
            record("b", 3, 1, "z"),
        ];
        let mut outcomes = vec![None; records.len()];
        let runs = plan(&config, &records, &mut outcomes);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].rows.len(), 2);
        assert_eq!(runs[1].shape.table, "b");
        let Some(PutOutcome::Fatal(e)) = &outcomes[2] else {
            panic!("the plain string cannot be a row")
        };
        assert!(e
            .message()
            .starts_with("record a-0@2 cannot be written to PostgreSQL: its value is a string"));
    }

    #[test]
    fn an_upsert_run_keeps_the_last_row_per_key_and_remembers_the_others() {
        let config = config(&[
            ("pk.mode", "record_value"),
            ("pk.fields", "id"),
            ("insert.mode", "upsert"),
        ]);
        let records = vec![
            record("a", 0, 1, "first"),
            record("a", 1, 2, "other"),
            record("a", 2, 1, "second"),
            record("a", 3, 1, "third"),
        ];
        let mut outcomes = vec![None; records.len()];
        let runs = plan(&config, &records, &mut outcomes);
        let rows = &runs[0].rows;
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].index, 3);
        assert_eq!(rows[0].values[1], &Value::String("third".into()));
        let mut superseded = rows[0].superseded.clone();
        superseded.sort();
        assert_eq!(superseded, vec![0, 2]);
        let mut all: Vec<usize> = runs[0].indexes().collect();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }

    #[test]
    fn plain_inserts_keep_every_row() {
        let config = config(&[("pk.mode", "record_value"), ("pk.fields", "id")]);
        let records = vec![record("a", 0, 1, "x"), record("a", 1, 1, "y")];
        let runs = plan(&config, &records, &mut [None, None]);
        assert_eq!(runs[0].rows.len(), 2);
    }

    #[test]
    fn the_target_names_host_port_and_database() {
        let config = config(&[]);
        assert_eq!(describe_target(&config.connection), "h:5432/db");
    }
}
