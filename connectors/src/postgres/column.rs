//! Connect types as PostgreSQL columns, and a batch's values as the typed arrays one
//! `UNNEST`-based statement takes: one parameter per column, whatever the number of rows, so a
//! single prepared statement serves every batch of a table.

use spillway_core::convert::{Converter, JsonConverter};
use spillway_core::schema::{Schema, SchemaType};
use spillway_core::{RecordPart, Value};
use tokio_postgres::types::ToSql;

const TIMESTAMP: &str = "org.apache.kafka.connect.data.Timestamp";
const DATE: &str = "org.apache.kafka.connect.data.Date";
const TIME: &str = "org.apache.kafka.connect.data.Time";
const DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";

/// The PostgreSQL type of a column, chosen from the Connect schema of its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Boolean,
    /// `smallint`; also Connect's `INT8`, which PostgreSQL has no type for.
    SmallInt,
    Integer,
    BigInt,
    Real,
    Double,
    Text,
    Bytea,
    /// Arrays, maps and structs, written as their JSON text.
    Jsonb,
    /// Connect `Timestamp`: epoch milliseconds, stored as UTC `timestamp`.
    Timestamp,
    /// Connect `Date`: days since the epoch.
    Date,
    /// Connect `Time`: milliseconds since midnight.
    Time,
    /// Connect `Decimal`: an unscaled two's complement integer and the `scale` parameter.
    Numeric {
        scale: u32,
    },
}

impl ColumnType {
    /// The column type for a field of this schema.
    pub fn for_schema(schema: &Schema) -> Result<ColumnType, String> {
        match (schema.name.as_deref(), &schema.kind) {
            (Some(TIMESTAMP), SchemaType::Int64) => return Ok(ColumnType::Timestamp),
            (Some(DATE), SchemaType::Int32) => return Ok(ColumnType::Date),
            (Some(TIME), SchemaType::Int32) => return Ok(ColumnType::Time),
            (Some(DECIMAL), SchemaType::Bytes) => {
                let scale = schema
                    .parameters
                    .get("scale")
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| {
                        format!(
                            "Decimal schema has no valid 'scale' parameter (found {:?})",
                            schema.parameters.get("scale")
                        )
                    })?;
                return Ok(ColumnType::Numeric { scale });
            }
            _ => {}
        }
        Ok(match &schema.kind {
            SchemaType::Boolean => ColumnType::Boolean,
            SchemaType::Int8 | SchemaType::Int16 => ColumnType::SmallInt,
            SchemaType::Int32 => ColumnType::Integer,
            SchemaType::Int64 => ColumnType::BigInt,
            SchemaType::Float32 => ColumnType::Real,
            SchemaType::Float64 => ColumnType::Double,
            SchemaType::String => ColumnType::Text,
            SchemaType::Bytes => ColumnType::Bytea,
            SchemaType::Array(_) | SchemaType::Map(_, _) | SchemaType::Struct(_) => {
                ColumnType::Jsonb
            }
        })
    }

    /// The column type for a schemaless primitive (a key read by a converter without schema).
    pub fn for_value(value: &Value) -> Result<ColumnType, String> {
        Ok(match value {
            Value::Boolean(_) => ColumnType::Boolean,
            Value::Int8(_) | Value::Int16(_) => ColumnType::SmallInt,
            Value::Int32(_) => ColumnType::Integer,
            Value::Int64(_) => ColumnType::BigInt,
            Value::Float32(_) => ColumnType::Real,
            Value::Float64(_) => ColumnType::Double,
            Value::String(_) => ColumnType::Text,
            Value::Bytes(_) => ColumnType::Bytea,
            Value::Array(_) | Value::Map(_) | Value::Struct(_) => ColumnType::Jsonb,
            Value::Null => return Err("a null value has no type to make a column of".into()),
        })
    }

    /// The type in `CREATE TABLE` / `ADD COLUMN`.
    pub fn ddl(self) -> String {
        match self {
            ColumnType::Boolean => "boolean".into(),
            ColumnType::SmallInt => "smallint".into(),
            ColumnType::Integer => "integer".into(),
            ColumnType::BigInt => "bigint".into(),
            ColumnType::Real => "real".into(),
            ColumnType::Double => "double precision".into(),
            ColumnType::Text => "text".into(),
            ColumnType::Bytea => "bytea".into(),
            ColumnType::Jsonb => "jsonb".into(),
            ColumnType::Timestamp => "timestamp".into(),
            ColumnType::Date => "date".into(),
            ColumnType::Time => "time".into(),
            ColumnType::Numeric { .. } => "numeric".into(),
        }
    }

    /// The array type of the statement parameter that carries this column's values.
    pub fn parameter_array(self) -> &'static str {
        match self {
            ColumnType::Boolean => "boolean[]",
            ColumnType::SmallInt => "int2[]",
            ColumnType::Integer | ColumnType::Date | ColumnType::Time => "int4[]",
            ColumnType::BigInt | ColumnType::Timestamp => "int8[]",
            ColumnType::Real => "float4[]",
            ColumnType::Double => "float8[]",
            ColumnType::Text | ColumnType::Jsonb | ColumnType::Numeric { .. } => "text[]",
            ColumnType::Bytea => "bytea[]",
        }
    }

    /// The SQL that turns the unnested parameter element `element` into the column's value.
    pub fn select_expression(self, element: &str) -> String {
        match self {
            ColumnType::Jsonb => format!("{element}::jsonb"),
            ColumnType::Numeric { .. } => format!("{element}::numeric"),
            ColumnType::Timestamp => {
                format!("TIMESTAMP '1970-01-01' + {element} * INTERVAL '1 millisecond'")
            }
            ColumnType::Date => format!("DATE '1970-01-01' + {element}"),
            ColumnType::Time => format!("TIME '00:00' + {element} * INTERVAL '1 millisecond'"),
            _ => element.to_owned(),
        }
    }
}

/// One column's values for a set of rows, typed for its statement parameter.
#[derive(Debug)]
pub enum ColumnValues {
    Boolean(Vec<Option<bool>>),
    SmallInt(Vec<Option<i16>>),
    Integer(Vec<Option<i32>>),
    BigInt(Vec<Option<i64>>),
    Real(Vec<Option<f32>>),
    Double(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Bytea(Vec<Option<Vec<u8>>>),
}

impl ColumnValues {
    /// An empty buffer for `rows` values of `column`.
    pub fn with_capacity(column: ColumnType, rows: usize) -> ColumnValues {
        match column {
            ColumnType::Boolean => ColumnValues::Boolean(Vec::with_capacity(rows)),
            ColumnType::SmallInt => ColumnValues::SmallInt(Vec::with_capacity(rows)),
            ColumnType::Integer | ColumnType::Date | ColumnType::Time => {
                ColumnValues::Integer(Vec::with_capacity(rows))
            }
            ColumnType::BigInt | ColumnType::Timestamp => {
                ColumnValues::BigInt(Vec::with_capacity(rows))
            }
            ColumnType::Real => ColumnValues::Real(Vec::with_capacity(rows)),
            ColumnType::Double => ColumnValues::Double(Vec::with_capacity(rows)),
            ColumnType::Text | ColumnType::Jsonb | ColumnType::Numeric { .. } => {
                ColumnValues::Text(Vec::with_capacity(rows))
            }
            ColumnType::Bytea => ColumnValues::Bytea(Vec::with_capacity(rows)),
        }
    }

    /// Appends `value` as a value of `column`; the error says why it does not fit.
    pub fn push(&mut self, column: ColumnType, value: &Value) -> Result<(), String> {
        let mismatch = || {
            format!(
                "a {} value '{value}' does not fit a column of type {}",
                value.type_name(),
                column.ddl()
            )
        };
        match (self, value) {
            (ColumnValues::Boolean(v), Value::Null) => v.push(None),
            (ColumnValues::SmallInt(v), Value::Null) => v.push(None),
            (ColumnValues::Integer(v), Value::Null) => v.push(None),
            (ColumnValues::BigInt(v), Value::Null) => v.push(None),
            (ColumnValues::Real(v), Value::Null) => v.push(None),
            (ColumnValues::Double(v), Value::Null) => v.push(None),
            (ColumnValues::Text(v), Value::Null) => v.push(None),
            (ColumnValues::Bytea(v), Value::Null) => v.push(None),
            (ColumnValues::Boolean(v), Value::Boolean(b)) => v.push(Some(*b)),
            (ColumnValues::SmallInt(v), Value::Int8(i)) => v.push(Some(i16::from(*i))),
            (ColumnValues::SmallInt(v), Value::Int16(i)) => v.push(Some(*i)),
            (ColumnValues::Integer(v), Value::Int32(i)) => v.push(Some(*i)),
            (ColumnValues::BigInt(v), Value::Int64(i)) => v.push(Some(*i)),
            (ColumnValues::Real(v), Value::Float32(f)) => v.push(Some(*f)),
            (ColumnValues::Double(v), Value::Float64(f)) => v.push(Some(*f)),
            (ColumnValues::Bytea(v), Value::Bytes(b)) => v.push(Some(b.to_vec())),
            (ColumnValues::Text(v), value) => v.push(Some(text_of(column, value)?)),
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// The buffer as a statement parameter.
    pub fn as_param(&self) -> &(dyn ToSql + Sync) {
        match self {
            ColumnValues::Boolean(v) => v,
            ColumnValues::SmallInt(v) => v,
            ColumnValues::Integer(v) => v,
            ColumnValues::BigInt(v) => v,
            ColumnValues::Real(v) => v,
            ColumnValues::Double(v) => v,
            ColumnValues::Text(v) => v,
            ColumnValues::Bytea(v) => v,
        }
    }
}

/// The text a text-carried column gets: the string itself, JSON for nested values (through
/// core's JSON converter, so the encoding matches every other JSON Spillway writes), or a
/// decimal's digits.
fn text_of(column: ColumnType, value: &Value) -> Result<String, String> {
    match (column, value) {
        (ColumnType::Text, Value::String(s)) => Ok(s.to_string()),
        (ColumnType::Jsonb, value) => {
            let json = JsonConverter::new(RecordPart::Value, false)
                .from_connect("", None, value)
                .map_err(|e| e.to_string())?
                .unwrap_or_default();
            String::from_utf8(json.to_vec()).map_err(|e| e.to_string())
        }
        (ColumnType::Numeric { scale }, Value::Bytes(unscaled)) => decimal_text(unscaled, scale),
        _ => Err(format!(
            "a {} value '{value}' does not fit a column of type {}",
            value.type_name(),
            column.ddl()
        )),
    }
}

/// Connect's decimal (big-endian two's complement unscaled value) as decimal text.
fn decimal_text(unscaled: &[u8], scale: u32) -> Result<String, String> {
    if unscaled.is_empty() || unscaled.len() > 16 {
        return Err(format!(
            "a Decimal of {} bytes is not supported (1 to 16 bytes are)",
            unscaled.len()
        ));
    }
    let negative = unscaled[0] & 0x80 != 0;
    let mut bytes = [if negative { 0xff } else { 0 }; 16];
    bytes[16 - unscaled.len()..].copy_from_slice(unscaled);
    let n = i128::from_be_bytes(bytes);
    let digits = n.unsigned_abs().to_string();
    let scale = scale as usize;
    let text = if scale == 0 {
        digits
    } else if digits.len() > scale {
        format!(
            "{}.{}",
            &digits[..digits.len() - scale],
            &digits[digits.len() - scale..]
        )
    } else {
        format!("0.{}{digits}", "0".repeat(scale - digits.len()))
    };
    Ok(if negative { format!("-{text}") } else { text })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{Field, Struct};

    #[test]
    fn connect_types_map_to_postgres_columns() {
        assert_eq!(
            ColumnType::for_schema(&Schema::int64()),
            Ok(ColumnType::BigInt)
        );
        assert_eq!(
            ColumnType::for_schema(&Schema::int8()),
            Ok(ColumnType::SmallInt)
        );
        assert_eq!(
            ColumnType::for_schema(&Schema::timestamp()),
            Ok(ColumnType::Timestamp)
        );
        let nested = Schema::structure(vec![Field::new("a", Schema::string())]);
        assert_eq!(ColumnType::for_schema(&nested), Ok(ColumnType::Jsonb));
        assert_eq!(ColumnType::Double.ddl(), "double precision");
    }

    #[test]
    fn a_decimal_needs_its_scale() {
        let err = ColumnType::for_schema(&Schema::bytes().named(DECIMAL)).expect_err("no scale");
        assert_eq!(
            err,
            "Decimal schema has no valid 'scale' parameter (found None)"
        );
    }

    #[test]
    fn decimals_render_their_unscaled_value_with_the_scale() {
        assert_eq!(decimal_text(&[0x30, 0x39], 2), Ok("123.45".into()));
        assert_eq!(decimal_text(&[0xcf, 0xc7], 2), Ok("-123.45".into()));
        assert_eq!(decimal_text(&[0x05], 3), Ok("0.005".into()));
        assert_eq!(decimal_text(&[0x07], 0), Ok("7".into()));
    }

    #[test]
    fn nested_values_are_written_as_json_text() {
        let mut column = ColumnValues::with_capacity(ColumnType::Jsonb, 1);
        let value = Value::Struct(Struct::new().with("a", 1.into()).with("b", "x".into()));
        column.push(ColumnType::Jsonb, &value).expect("fits");
        let ColumnValues::Text(texts) = column else {
            panic!("jsonb travels as text")
        };
        assert_eq!(texts, vec![Some(r#"{"a":1,"b":"x"}"#.to_owned())]);
    }

    #[test]
    fn a_value_of_another_type_is_refused_naming_value_and_column() {
        let mut column = ColumnValues::with_capacity(ColumnType::Integer, 1);
        let err = column
            .push(ColumnType::Integer, &Value::String("ten".into()))
            .expect_err("text is no integer");
        assert_eq!(
            err,
            "a string value 'ten' does not fit a column of type integer"
        );
    }

    #[test]
    fn logical_types_convert_in_sql() {
        assert_eq!(
            ColumnType::Timestamp.select_expression("r.\"ts\""),
            "TIMESTAMP '1970-01-01' + r.\"ts\" * INTERVAL '1 millisecond'"
        );
        assert_eq!(ColumnType::Timestamp.parameter_array(), "int8[]");
    }
}
