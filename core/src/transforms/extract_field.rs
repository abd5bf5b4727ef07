//! `ExtractField`: replaces the key or value with one of its fields. A null stays null.

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::data::Value;
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::transforms::side::{map_get, require_map, require_struct, Side};
use crate::transforms::Transformation;

const FIELD: &str = "field";
const SYNTAX: &str = "field.syntax.version";

#[derive(Debug, Clone)]
pub struct ExtractField {
    side: Side,
    field: String,
}

impl ExtractField {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(FIELD, ConfigType::String, Importance::Medium, "The field to extract.")
                    .validator(Validator::NonEmptyString),
            )
            .define(
                ConfigKey::new(SYNTAX, ConfigType::String, Importance::Low, "Field name syntax: V1 takes the name as written (nested paths, V2, are not supported).")
                    .default("V1")
                    .validator(Validator::OneOf(&["V1"])),
            )
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = ExtractField::config_def().parse_prefixed(settings, prefix)?;
        Ok(ExtractField {
            side,
            field: parsed.string(FIELD)?.unwrap_or_default().to_owned(),
        })
    }

    fn fail(&self, detail: String) -> TransformError {
        TransformError::new(format!("ExtractField${}", self.side.suffix()), detail)
    }
}

impl Transformation for ExtractField {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record);
        match self.side.schema(&record) {
            None => {
                if value.is_null() {
                    return Ok(Some(record));
                }
                let entries = require_map(value, "field extraction").map_err(|e| self.fail(e))?;
                let extracted = map_get(entries, &self.field)
                    .cloned()
                    .unwrap_or(Value::Null);
                self.side.set(&mut record, None, extracted);
            }
            Some(schema) => {
                let field = schema.field(&self.field).ok_or_else(|| {
                    self.fail(format!(
                        "field '{}' is not in the {} schema {schema}",
                        self.field, self.side
                    ))
                })?;
                let field_schema = field.schema.clone();
                let extracted = if value.is_null() {
                    Value::Null
                } else {
                    let s = require_struct(value, "field extraction").map_err(|e| self.fail(e))?;
                    s.get(&self.field).cloned().unwrap_or(Value::Null)
                };
                self.side.set(&mut record, Some(field_schema), extracted);
            }
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Struct;
    use crate::schema::SchemaRef;
    use crate::schema::{Field, Schema};
    use crate::transforms::testkit::config;

    fn transform(side: Side) -> ExtractField {
        ExtractField::configure(side, &config(&[("field", "id")]), "").expect("valid")
    }

    #[test]
    fn a_map_value_is_replaced_by_its_field() {
        let v = Value::string_map([("id", Value::Int64(4)), ("x", "y".into())]);
        let out = transform(Side::Value)
            .apply(SinkRecord::new("t", 0, 0, v))
            .expect("map")
            .expect("kept");
        assert_eq!(out.value, Value::Int64(4));
    }

    #[test]
    fn a_struct_key_is_replaced_by_its_field_and_the_fields_schema() {
        let mut r = SinkRecord::new("t", 0, 0, Value::Null);
        r.key_schema = Some(SchemaRef::new(Schema::structure(vec![Field::new(
            "id",
            Schema::string(),
        )])));
        r.key = Value::Struct(Struct::new().with("id", "k1".into()));
        let out = transform(Side::Key)
            .apply(r)
            .expect("struct")
            .expect("kept");
        assert_eq!(out.key, Value::from("k1"));
        assert_eq!(out.key_schema, Some(SchemaRef::new(Schema::string())));
    }

    #[test]
    fn a_field_missing_from_the_schema_is_named() {
        let mut r = SinkRecord::new("t", 0, 0, Value::Struct(Struct::new()));
        r.value_schema = Some(SchemaRef::new(Schema::structure(vec![]).named("Empty")));
        let err = transform(Side::Value).apply(r).expect_err("no field");
        assert_eq!(err.to_string(), "transform ExtractField$Value failed: field 'id' is not in the value schema STRUCT 'Empty'");
    }

    #[test]
    fn null_stays_null() {
        let r = SinkRecord::new("t", 0, 0, Value::Null);
        assert_eq!(
            transform(Side::Value)
                .apply(r)
                .expect("null")
                .expect("kept")
                .value,
            Value::Null
        );
    }

    #[test]
    fn nested_field_syntax_is_refused_rather_than_ignored() {
        let err = ExtractField::configure(
            Side::Value,
            &config(&[("field", "a.b"), ("field.syntax.version", "V2")]),
            "",
        )
        .expect_err("V2 unsupported");
        assert_eq!(
            err.to_string(),
            "invalid value 'V2' for field.syntax.version: expected one of V1"
        );
    }
}
