//! SQL text for a row shape. Writes and deletes take one array parameter per column and
//! `UNNEST` them, so the statement is the same for 1 or 5,000 rows: it is prepared once per
//! connection and shape, and a whole batch costs one round trip.

use std::fmt::Write as _;

use crate::postgres::config::InsertMode;
use crate::postgres::row::{Column, Operation, RowShape};

/// `name` as a quoted identifier: keeps case and any character, `"` doubled.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn join<T>(items: impl Iterator<Item = T>, f: impl Fn(T) -> String) -> String {
    items.map(f).collect::<Vec<_>>().join(", ")
}

/// `UNNEST($1::int8[], $2::text[]) AS r("id", "name")` for the columns.
fn unnest<'a>(columns: impl Iterator<Item = &'a Column> + Clone) -> String {
    let params = join(columns.clone().enumerate(), |(i, c)| {
        format!("${}::{}", i + 1, c.kind.parameter_array())
    });
    let names = join(columns, |c| quote(&c.name));
    format!("UNNEST({params}) AS r({names})")
}

fn element(column: &Column) -> String {
    column
        .kind
        .select_expression(&format!("r.{}", quote(&column.name)))
}

/// The statement writing (or deleting) rows of `shape`.
pub fn statement_sql(shape: &RowShape, mode: InsertMode) -> String {
    match shape.operation {
        Operation::Write => write_sql(shape, mode),
        Operation::Delete => delete_sql(shape),
    }
}

fn write_sql(shape: &RowShape, mode: InsertMode) -> String {
    let mut sql = format!(
        "INSERT INTO {} ({}) SELECT {} FROM {}",
        quote(&shape.table),
        join(shape.columns(), |c| quote(&c.name)),
        join(shape.columns(), element),
        unnest(shape.columns()),
    );
    if mode == InsertMode::Upsert && !shape.key.is_empty() {
        let _ = write!(
            sql,
            " ON CONFLICT ({}) ",
            join(shape.key.iter(), |c| quote(&c.name))
        );
        if shape.fields.is_empty() {
            sql.push_str("DO NOTHING");
        } else {
            let _ = write!(
                sql,
                "DO UPDATE SET {}",
                join(shape.fields.iter(), |c| format!(
                    "{0} = EXCLUDED.{0}",
                    quote(&c.name)
                ))
            );
        }
    }
    sql
}

fn delete_sql(shape: &RowShape) -> String {
    let matches = shape
        .key
        .iter()
        .map(|c| format!("t.{} = {}", quote(&c.name), element(c)))
        .collect::<Vec<_>>()
        .join(" AND ");
    format!(
        "DELETE FROM {} AS t USING {} WHERE {matches}",
        quote(&shape.table),
        unnest(shape.key.iter()),
    )
}

fn column_definition(column: &Column) -> String {
    let null = if column.optional { "" } else { " NOT NULL" };
    format!("{} {}{null}", quote(&column.name), column.kind.ddl())
}

/// `CREATE TABLE` for rows of `shape`, with their key as primary key.
pub fn create_table_sql(shape: &RowShape) -> String {
    let mut definitions: Vec<String> = shape.columns().map(column_definition).collect();
    if !shape.key.is_empty() {
        definitions.push(format!(
            "PRIMARY KEY ({})",
            join(shape.key.iter(), |c| quote(&c.name))
        ));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        quote(&shape.table),
        definitions.join(", ")
    )
}

/// `ALTER TABLE ... ADD COLUMN` for a field the table lacks; always nullable, since rows
/// already in the table have no value for it.
pub fn add_column_sql(table: &str, column: &Column) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}",
        quote(table),
        quote(&column.name),
        column.kind.ddl()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::column::ColumnType;

    fn col(name: &str, kind: ColumnType, optional: bool) -> Column {
        Column {
            name: name.into(),
            kind,
            optional,
        }
    }

    fn orders(operation: Operation) -> RowShape {
        RowShape {
            table: "Orders".into(),
            operation,
            key: vec![col("id", ColumnType::BigInt, false)],
            fields: if operation == Operation::Write {
                vec![
                    col("note", ColumnType::Text, true),
                    col("at", ColumnType::Timestamp, true),
                ]
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn upsert_unnests_one_array_per_column_and_updates_the_other_columns() {
        assert_eq!(
            statement_sql(&orders(Operation::Write), InsertMode::Upsert),
            "INSERT INTO \"Orders\" (\"id\", \"note\", \"at\") \
             SELECT r.\"id\", r.\"note\", TIMESTAMP '1970-01-01' + r.\"at\" * INTERVAL '1 millisecond' \
             FROM UNNEST($1::int8[], $2::text[], $3::int8[]) AS r(\"id\", \"note\", \"at\") \
             ON CONFLICT (\"id\") DO UPDATE SET \"note\" = EXCLUDED.\"note\", \"at\" = EXCLUDED.\"at\""
        );
    }

    #[test]
    fn insert_mode_has_no_conflict_clause() {
        let sql = statement_sql(&orders(Operation::Write), InsertMode::Insert);
        assert!(!sql.contains("ON CONFLICT"), "{sql}");
    }

    #[test]
    fn upsert_of_a_key_only_table_does_nothing_on_conflict() {
        let mut shape = orders(Operation::Write);
        shape.fields.clear();
        assert!(
            statement_sql(&shape, InsertMode::Upsert).ends_with("ON CONFLICT (\"id\") DO NOTHING")
        );
    }

    #[test]
    fn delete_matches_rows_on_every_key_column() {
        assert_eq!(
            statement_sql(&orders(Operation::Delete), InsertMode::Upsert),
            "DELETE FROM \"Orders\" AS t USING UNNEST($1::int8[]) AS r(\"id\") WHERE t.\"id\" = r.\"id\""
        );
    }

    #[test]
    fn create_table_declares_the_key_and_required_columns() {
        assert_eq!(
            create_table_sql(&orders(Operation::Write)),
            "CREATE TABLE IF NOT EXISTS \"Orders\" (\"id\" bigint NOT NULL, \"note\" text, \
             \"at\" timestamp, PRIMARY KEY (\"id\"))"
        );
    }

    #[test]
    fn identifiers_are_quoted_with_quotes_doubled() {
        assert_eq!(quote("we\"ird name"), "\"we\"\"ird name\"");
        assert_eq!(
            add_column_sql("t", &col("new", ColumnType::Integer, false)),
            "ALTER TABLE \"t\" ADD COLUMN IF NOT EXISTS \"new\" integer"
        );
    }
}
