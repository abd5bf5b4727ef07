//! Tables as the sink needs them: created from the first record's schema (`auto.create`) and
//! given a nullable column for each new field (`auto.evolve`). What a task has seen is cached,
//! so the catalog is read only when a record brings a table or a field not seen before.

use std::collections::{HashMap, HashSet};

use deadpool_postgres::ClientWrapper;

use crate::postgres::error::{DbFailure, PostgresSinkError};
use crate::postgres::row::RowShape;
use crate::postgres::statement::{add_column_sql, create_table_sql, quote};

/// The columns of the tables this task writes, as last read or made.
#[derive(Debug, Default)]
pub struct Tables {
    known: HashMap<String, HashSet<String>>,
    auto_create: bool,
    auto_evolve: bool,
}

impl Tables {
    pub fn new(auto_create: bool, auto_evolve: bool) -> Self {
        Tables {
            known: HashMap::new(),
            auto_create,
            auto_evolve,
        }
    }

    /// Whether a table or column that went missing would be made again on redelivery.
    pub fn repairs_itself(&self) -> bool {
        self.auto_create || self.auto_evolve
    }

    /// Forgets what is known of `table` (it was dropped or altered behind the sink's back).
    pub fn forget(&mut self, table: &str) {
        self.known.remove(table);
    }

    /// Makes sure `shape.table` has every column of `shape`, creating or altering it as the
    /// settings allow.
    pub async fn ensure(
        &mut self,
        client: &mut ClientWrapper,
        shape: &RowShape,
    ) -> Result<(), PostgresSinkError> {
        let table = &shape.table;
        if let Some(columns) = self.known.get(table) {
            if shape.columns().all(|c| columns.contains(&c.name)) {
                return Ok(());
            }
        }
        let ddl_error = |e: tokio_postgres::Error| PostgresSinkError::Ddl {
            table: table.clone(),
            failure: DbFailure::from_postgres(&e),
        };
        let tx = client.transaction().await.map_err(ddl_error)?;
        // Tasks of one connector meet the same new table or field at the same moment: the
        // lock makes the second one wait and then see the first one's change.
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1::text))", &[table])
            .await
            .map_err(ddl_error)?;
        let quoted = quote(table);
        let exists = tx
            .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&quoted])
            .await
            .map_err(ddl_error)?
            .get::<_, bool>(0);
        if !exists {
            if !self.auto_create {
                return Err(PostgresSinkError::MissingTable {
                    table: table.clone(),
                });
            }
            tx.batch_execute(&create_table_sql(shape))
                .await
                .map_err(ddl_error)?;
            tracing::info!(table = %table, "created table from the record schema");
        }
        let existing: HashSet<String> = tx
            .query(
                "SELECT attname::text FROM pg_attribute \
                 WHERE attrelid = to_regclass($1::text) AND attnum > 0 AND NOT attisdropped",
                &[&quoted],
            )
            .await
            .map_err(ddl_error)?
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect();
        let missing: Vec<_> = shape
            .columns()
            .filter(|c| !existing.contains(&c.name))
            .collect();
        if !missing.is_empty() {
            if !self.auto_evolve {
                let names: Vec<&str> = missing.iter().map(|c| c.name.as_str()).collect();
                return Err(PostgresSinkError::MissingColumns {
                    table: table.clone(),
                    columns: names.join(", "),
                });
            }
            for column in &missing {
                tx.batch_execute(&add_column_sql(table, column))
                    .await
                    .map_err(ddl_error)?;
                tracing::info!(table = %table, column = %column.name, "added a column for a new field");
            }
        }
        tx.commit().await.map_err(ddl_error)?;
        let mut columns = existing;
        columns.extend(missing.iter().map(|c| c.name.clone()));
        self.known.insert(table.clone(), columns);
        Ok(())
    }
}
