//! A record as a row: which table, which columns (primary key first), and which values, as
//! `pk.mode` and `pk.fields` say. Rows of the same [`RowShape`] can be written by one statement.

use spillway_core::schema::Schema;
use spillway_core::{SinkRecord, Value};

use crate::postgres::column::ColumnType;
use crate::postgres::config::{PkMode, PostgresSinkConfig};

/// One column of a row's table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Column {
    pub name: String,
    pub kind: ColumnType,
    /// Whether the schema allows null (nullable column on create).
    pub optional: bool,
}

/// Write the row, or delete the row with this key (a tombstone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Write,
    Delete,
}

/// What rows must share to go through one statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowShape {
    pub table: String,
    pub operation: Operation,
    /// Primary key columns (empty with `pk.mode=none`).
    pub key: Vec<Column>,
    /// The other columns (empty for deletes).
    pub fields: Vec<Column>,
}

impl RowShape {
    /// Key columns, then the other columns: the order of a row's values.
    pub fn columns(&self) -> impl Iterator<Item = &Column> + Clone {
        self.key.iter().chain(self.fields.iter())
    }
}

/// A struct field absent from its value reads as null.
static NULL: Value = Value::Null;

/// The shape of `record`'s row and its values, in [`RowShape::columns`] order. The error says
/// why the record cannot be a row.
pub fn row_of<'a>(
    config: &PostgresSinkConfig,
    record: &'a SinkRecord,
) -> Result<(RowShape, Vec<&'a Value>), String> {
    let table = config.table_for(&record.topic);
    if record.is_tombstone() {
        if !config.delete_enabled {
            return Err(
                "it is a tombstone (null value) and delete.enabled is false; set \
                        delete.enabled=true with pk.mode=record_key to delete rows"
                    .into(),
            );
        }
        let (key, values) = key_columns(config, record)?;
        let shape = RowShape {
            table,
            operation: Operation::Delete,
            key,
            fields: Vec::new(),
        };
        return Ok((shape, values));
    }
    let (Value::Struct(value), Some(value_schema)) =
        (&record.value, record.value_schema.as_deref())
    else {
        return Err(format!(
            "its value is a {}{}; the PostgreSQL sink needs a struct with a schema (JSON with a \
             schema envelope: value.converter=json and value.converter.schemas.enable=true)",
            record.value.type_name(),
            if record.value_schema.is_none() {
                " without schema"
            } else {
                ""
            }
        ));
    };
    let (key, mut values) = match config.pk_mode {
        PkMode::None => (Vec::new(), Vec::new()),
        PkMode::RecordKey => key_columns(config, record)?,
        PkMode::RecordValue => {
            let names = chosen(&config.pk_fields, value_schema);
            struct_columns(value_schema, value, &names, "value")?
        }
    };
    let mut fields = Vec::new();
    for field in value_schema.fields() {
        if key.iter().any(|k| k.name == field.name) {
            continue;
        }
        fields.push(column(&field.name, &field.schema)?);
        values.push(value.get(&field.name).unwrap_or(&NULL));
    }
    if key.is_empty() && fields.is_empty() {
        return Err("its value struct has no fields, so there is no column to write".into());
    }
    Ok((
        RowShape {
            table,
            operation: Operation::Write,
            key,
            fields,
        },
        values,
    ))
}

/// `pk.fields`, or every field of the struct when it is empty (as Connect's JDBC sink).
fn chosen(pk_fields: &[String], schema: &Schema) -> Vec<String> {
    if pk_fields.is_empty() {
        schema.fields().iter().map(|f| f.name.clone()).collect()
    } else {
        pk_fields.to_vec()
    }
}

fn column(name: &str, schema: &Schema) -> Result<Column, String> {
    Ok(Column {
        name: name.to_owned(),
        kind: ColumnType::for_schema(schema).map_err(|e| format!("field '{name}': {e}"))?,
        optional: schema.optional,
    })
}

/// Primary key columns from the record key (`pk.mode=record_key`).
fn key_columns<'a>(
    config: &PostgresSinkConfig,
    record: &'a SinkRecord,
) -> Result<(Vec<Column>, Vec<&'a Value>), String> {
    match (&record.key, record.key_schema.as_deref()) {
        (Value::Null, _) => {
            Err("its key is null, but pk.mode=record_key takes the primary key from it".into())
        }
        (Value::Struct(key), Some(schema)) => {
            let names = chosen(&config.pk_fields, schema);
            struct_columns(schema, key, &names, "key")
        }
        (Value::Map(_) | Value::Struct(_), _) | (Value::Array(_), _) => Err(format!(
            "its key is a {} without a struct schema; pk.mode=record_key needs a primitive key \
             or a struct with a schema (key.converter=json with key.converter.schemas.enable=true)",
            record.key.type_name()
        )),
        (key, schema) => {
            let [name] = config.pk_fields.as_slice() else {
                return Err(format!(
                    "its key is a primitive {}, so pk.fields must name its one column, but \
                     pk.fields is '{}'",
                    key.type_name(),
                    config.pk_fields.join(",")
                ));
            };
            let kind = match schema {
                Some(schema) => ColumnType::for_schema(schema),
                None => ColumnType::for_value(key),
            }
            .map_err(|e| format!("key: {e}"))?;
            let column = Column {
                name: name.clone(),
                kind,
                optional: false,
            };
            Ok((vec![column], vec![key]))
        }
    }
}

/// The columns `names` of a struct and their values; `part` (key/value) is for messages.
fn struct_columns<'a>(
    schema: &Schema,
    value: &'a spillway_core::Struct,
    names: &[String],
    part: &str,
) -> Result<(Vec<Column>, Vec<&'a Value>), String> {
    let mut columns = Vec::with_capacity(names.len());
    let mut values = Vec::with_capacity(names.len());
    for name in names {
        let Some(field) = schema.field(name) else {
            let known: Vec<&str> = schema.fields().iter().map(|f| f.name.as_str()).collect();
            return Err(format!(
                "its {part} struct has no field '{name}' named in pk.fields (its fields: {})",
                known.join(", ")
            ));
        };
        let mut col = column(name, &field.schema)?;
        // A primary key column is never null.
        col.optional = false;
        columns.push(col);
        values.push(value.get(name).unwrap_or(&NULL));
    }
    Ok((columns, values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{ConfigMap, Field, Struct};

    fn config(pairs: &[(&str, &str)]) -> PostgresSinkConfig {
        let mut props: ConfigMap = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        props.insert("connection.url".into(), "postgres://h/db".into());
        PostgresSinkConfig::parse(&props).expect("valid")
    }

    fn order(id: i64, qty: i32) -> SinkRecord {
        let schema = Schema::structure(vec![
            Field::new("id", Schema::int64()),
            Field::new("qty", Schema::int32().optional()),
        ]);
        let mut record = SinkRecord::new(
            "orders",
            0,
            id,
            Value::Struct(Struct::new().with("id", id.into()).with("qty", qty.into())),
        );
        record.value_schema = Some(schema.into());
        record
    }

    #[test]
    fn record_value_mode_puts_the_chosen_fields_first_as_primary_key() {
        let config = config(&[("pk.mode", "record_value"), ("pk.fields", "id")]);
        let record = order(7, 3);
        let (shape, values) = row_of(&config, &record).expect("a row");
        let names: Vec<&str> = shape.columns().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["id", "qty"]);
        assert_eq!(shape.key.len(), 1);
        assert!(!shape.key[0].optional);
        assert_eq!(values, vec![&Value::Int64(7), &Value::Int32(3)]);
    }

    #[test]
    fn a_primitive_key_becomes_the_one_pk_column() {
        let config = config(&[("pk.mode", "record_key"), ("pk.fields", "order_id")]);
        let mut record = order(7, 3);
        record.key = Value::String("o-7".into());
        let (shape, values) = row_of(&config, &record).expect("a row");
        assert_eq!(shape.key[0].name, "order_id");
        assert_eq!(shape.key[0].kind, ColumnType::Text);
        assert_eq!(values[0], &Value::String("o-7".into()));
        assert_eq!(shape.fields.len(), 2);
    }

    #[test]
    fn a_tombstone_deletes_by_key_when_deletes_are_enabled() {
        let config = config(&[
            ("pk.mode", "record_key"),
            ("pk.fields", "id"),
            ("delete.enabled", "true"),
        ]);
        let mut record = SinkRecord::new("orders", 0, 1, Value::Null);
        record.key = Value::Int64(7);
        let (shape, values) = row_of(&config, &record).expect("a delete");
        assert_eq!(shape.operation, Operation::Delete);
        assert_eq!(values, vec![&Value::Int64(7)]);
    }

    #[test]
    fn a_tombstone_without_deletes_is_refused_saying_how_to_enable_them() {
        let config = config(&[]);
        let err = row_of(&config, &SinkRecord::new("t", 0, 0, Value::Null)).expect_err("no");
        assert!(err.contains("delete.enabled is false"), "{err}");
    }

    #[test]
    fn a_schemaless_value_is_refused_naming_what_it_is() {
        let record = SinkRecord::new("t", 0, 0, Value::string_map([("a", Value::Int64(1))]));
        let err = row_of(&config(&[]), &record).expect_err("no schema");
        assert!(
            err.starts_with(
                "its value is a map without schema; the PostgreSQL sink needs a struct"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_pk_field_missing_from_the_value_is_named_with_the_fields_there_are() {
        let config = config(&[("pk.mode", "record_value"), ("pk.fields", "order_id")]);
        let err = row_of(&config, &order(1, 1)).expect_err("no such field");
        assert_eq!(
            err,
            "its value struct has no field 'order_id' named in pk.fields (its fields: id, qty)"
        );
    }

    #[test]
    fn a_primitive_key_needs_exactly_one_pk_field() {
        let config = config(&[("pk.mode", "record_key"), ("pk.fields", "a,b")]);
        let mut record = order(1, 1);
        record.key = Value::Int32(1);
        let err = row_of(&config, &record).expect_err("two names");
        assert_eq!(
            err,
            "its key is a primitive int32, so pk.fields must name its one column, but pk.fields is 'a,b'"
        );
    }
}
