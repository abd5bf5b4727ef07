//! Which part of a record a transform works on: Connect's `$Key` and `$Value` variants.

use std::fmt;

use crate::data::{Struct, Value};
use crate::record::SinkRecord;
use crate::schema::{Schema, SchemaRef};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Key,
    Value,
}

impl Side {
    /// The class-name suffix (`Key` in `InsertField$Key`).
    pub fn suffix(self) -> &'static str {
        match self {
            Side::Key => "Key",
            Side::Value => "Value",
        }
    }

    pub fn schema(self, record: &SinkRecord) -> Option<&Schema> {
        match self {
            Side::Key => record.key_schema.as_deref(),
            Side::Value => record.value_schema.as_deref(),
        }
    }

    /// This side's schema, shared rather than copied, for a transform that keeps it.
    pub fn shared_schema(self, record: &SinkRecord) -> Option<SchemaRef> {
        match self {
            Side::Key => record.key_schema.clone(),
            Side::Value => record.value_schema.clone(),
        }
    }

    pub fn value(self, record: &SinkRecord) -> &Value {
        match self {
            Side::Key => &record.key,
            Side::Value => &record.value,
        }
    }

    /// Replaces this side's schema and value.
    pub fn set(self, record: &mut SinkRecord, schema: Option<Schema>, value: Value) {
        self.set_shared(record, schema.map(SchemaRef::new), value)
    }

    /// [`set`](Self::set) with a schema that is already shared (one the record had).
    pub fn set_shared(self, record: &mut SinkRecord, schema: Option<SchemaRef>, value: Value) {
        match self {
            Side::Key => {
                record.key_schema = schema;
                record.key = value;
            }
            Side::Value => {
                record.value_schema = schema;
                record.value = value;
            }
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Key => "key",
            Side::Value => "value",
        })
    }
}

/// The entries of a schemaless map value, or a message like Connect's
/// "Only Map objects supported in absence of schema for [purpose], found: int32".
pub fn require_map<'a>(value: &'a Value, purpose: &str) -> Result<&'a [(Value, Value)], String> {
    match value {
        Value::Map(entries) => Ok(entries),
        other => Err(format!(
            "without a schema only maps are supported for {purpose}, found {} '{other}'",
            other.type_name()
        )),
    }
}

/// The struct of a schema'd value, or a message naming what was found instead.
pub fn require_struct<'a>(value: &'a Value, purpose: &str) -> Result<&'a Struct, String> {
    match value {
        Value::Struct(s) => Ok(s),
        other => Err(format!(
            "with a schema only structs are supported for {purpose}, found {} '{other}'",
            other.type_name()
        )),
    }
}

/// The entry called `name` of a map's entries.
pub fn map_get<'a>(entries: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    entries
        .iter()
        .find(|(k, _)| matches!(k, Value::String(s) if s == name))
        .map(|(_, v)| v)
}

/// A map entry's key as a string, if it is one.
pub fn key_str(key: &Value) -> Option<&str> {
    match key {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// A copy of a struct schema with new fields and the rest of its metadata.
pub fn with_fields(schema: &Schema, fields: Vec<crate::schema::Field>) -> Schema {
    Schema {
        kind: crate::schema::SchemaType::Struct(fields),
        default: None,
        ..schema.clone()
    }
}
