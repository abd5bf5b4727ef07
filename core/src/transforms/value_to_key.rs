//! `ValueToKey`: replaces the key with the listed fields of the value (a map, or a struct with
//! its own schema).

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::data::{Struct, Value};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::schema::{Field, Schema, SchemaRef};
use crate::transforms::side::{map_get, require_map, require_struct};
use crate::transforms::Transformation;

const FIELDS: &str = "fields";

#[derive(Debug, Clone)]
pub struct ValueToKey {
    fields: Vec<String>,
}

impl ValueToKey {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new(
                FIELDS,
                ConfigType::List,
                Importance::High,
                "Value fields that make up the new key.",
            )
            .validator(Validator::NonEmptyList),
        )
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = ValueToKey::config_def().parse_prefixed(settings, prefix)?;
        Ok(ValueToKey {
            fields: parsed.list(FIELDS)?.to_vec(),
        })
    }

    fn fail(detail: String) -> TransformError {
        TransformError::new("ValueToKey", detail)
    }
}

impl Transformation for ValueToKey {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        if record.value.is_null() {
            return Err(ValueToKey::fail(format!(
                "record {} is a tombstone, with no value to copy key fields from; \
                 skip tombstones with a RecordIsTombstone predicate and negate=true",
                record.original
            )));
        }
        match &record.value_schema {
            None => {
                let entries = require_map(&record.value, "copying fields from value to key")
                    .map_err(ValueToKey::fail)?;
                let key = Value::string_map(self.fields.iter().map(|f| {
                    (
                        f.clone(),
                        map_get(entries, f).cloned().unwrap_or(Value::Null),
                    )
                }));
                record.key_schema = None;
                record.key = key;
            }
            Some(schema) => {
                let s = require_struct(&record.value, "copying fields from value to key")
                    .map_err(ValueToKey::fail)?;
                let mut fields = Vec::with_capacity(self.fields.len());
                let mut key = Struct::new();
                for name in &self.fields {
                    let field = schema.field(name).ok_or_else(|| {
                        ValueToKey::fail(format!(
                            "field '{name}' is not in the value schema (fields: {})",
                            schema
                                .fields()
                                .iter()
                                .map(|f| f.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })?;
                    fields.push(Field::new(name.clone(), field.schema.clone()));
                    key.put(name.clone(), s.get(name).cloned().unwrap_or(Value::Null));
                }
                record.key_schema = Some(SchemaRef::new(Schema::structure(fields)));
                record.key = Value::Struct(key);
            }
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transforms::testkit::config;

    fn transform() -> ValueToKey {
        ValueToKey::configure(&config(&[("fields", "id,region")]), "").expect("valid")
    }

    #[test]
    fn map_values_give_a_map_key_of_the_listed_fields() {
        let v = Value::string_map([
            ("region", "eu".into()),
            ("id", Value::Int64(9)),
            ("x", "y".into()),
        ]);
        let out = transform()
            .apply(SinkRecord::new("t", 0, 0, v))
            .expect("map")
            .expect("kept");
        assert_eq!(
            out.key,
            Value::string_map([("id", Value::Int64(9)), ("region", "eu".into())])
        );
        assert_eq!(out.key_schema, None);
    }

    #[test]
    fn struct_values_give_a_struct_key_with_a_schema() {
        let schema = Schema::structure(vec![
            Field::new("id", Schema::int64()),
            Field::new("region", Schema::string().optional()),
            Field::new("x", Schema::string()),
        ]);
        let mut r = SinkRecord::new(
            "t",
            0,
            0,
            Value::Struct(
                Struct::new()
                    .with("id", Value::Int64(9))
                    .with("region", "eu".into())
                    .with("x", "y".into()),
            ),
        );
        r.value_schema = Some(SchemaRef::new(schema));
        let out = transform().apply(r).expect("struct").expect("kept");
        assert_eq!(
            out.key_schema,
            Some(SchemaRef::new(Schema::structure(vec![
                Field::new("id", Schema::int64()),
                Field::new("region", Schema::string().optional())
            ])))
        );
        assert_eq!(
            out.key,
            Value::Struct(
                Struct::new()
                    .with("id", Value::Int64(9))
                    .with("region", "eu".into())
            )
        );
    }

    #[test]
    fn a_field_missing_from_the_schema_is_named() {
        let mut r = SinkRecord::new("t", 0, 0, Value::Struct(Struct::new().with("id", 1.into())));
        r.value_schema = Some(SchemaRef::new(Schema::structure(vec![Field::new(
            "id",
            Schema::int32(),
        )])));
        let err = transform().apply(r).expect_err("region missing");
        assert_eq!(
            err.to_string(),
            "transform ValueToKey failed: field 'region' is not in the value schema (fields: id)"
        );
    }

    #[test]
    fn tombstones_are_refused_with_the_way_to_skip_them() {
        let err = transform()
            .apply(SinkRecord::new("t", 1, 5, Value::Null))
            .expect_err("no value");
        assert!(err.to_string().contains("record t-1@5 is a tombstone"));
        assert!(err.to_string().contains("RecordIsTombstone predicate"));
    }
}
