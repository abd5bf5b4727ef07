//! `HoistField`: wraps the key or value in a single named field (a map without a schema, a
//! struct with one).

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::data::{Struct, Value};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::schema::{Field, Schema};
use crate::transforms::side::Side;
use crate::transforms::Transformation;

const FIELD: &str = "field";

#[derive(Debug, Clone)]
pub struct HoistField {
    side: Side,
    field: String,
}

impl HoistField {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new(
                FIELD,
                ConfigType::String,
                Importance::Medium,
                "Name of the field that will hold the original key or value.",
            )
            .validator(Validator::NonEmptyString),
        )
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = HoistField::config_def().parse_prefixed(settings, prefix)?;
        Ok(HoistField {
            side,
            field: parsed.string(FIELD)?.unwrap_or_default().to_owned(),
        })
    }
}

impl Transformation for HoistField {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record).clone();
        match self.side.schema(&record).cloned() {
            None => {
                let wrapped = Value::string_map([(self.field.clone(), value)]);
                self.side.set(&mut record, None, wrapped);
            }
            Some(schema) => {
                let wrapped_schema =
                    Schema::structure(vec![Field::new(self.field.clone(), schema)]);
                let wrapped = Value::Struct(Struct::new().with(self.field.clone(), value));
                self.side.set(&mut record, Some(wrapped_schema), wrapped);
            }
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SchemaRef;
    use crate::transforms::testkit::config;

    fn transform() -> HoistField {
        HoistField::configure(Side::Value, &config(&[("field", "line")]), "").expect("valid")
    }

    #[test]
    fn a_schemaless_value_is_wrapped_in_a_map() {
        let out = transform()
            .apply(SinkRecord::new("t", 0, 0, "hello".into()))
            .expect("any")
            .expect("kept");
        assert_eq!(out.value, Value::string_map([("line", "hello".into())]));
    }

    #[test]
    fn a_schema_value_is_wrapped_in_a_struct_with_one_field() {
        let mut r = SinkRecord::new("t", 0, 0, Value::Int64(3));
        r.value_schema = Some(SchemaRef::new(Schema::int64()));
        let out = transform().apply(r).expect("any").expect("kept");
        assert_eq!(
            out.value_schema,
            Some(SchemaRef::new(Schema::structure(vec![Field::new(
                "line",
                Schema::int64()
            )])))
        );
        assert_eq!(
            out.value,
            Value::Struct(Struct::new().with("line", Value::Int64(3)))
        );
    }

    #[test]
    fn an_empty_field_name_is_refused() {
        let err = HoistField::configure(Side::Key, &config(&[("field", " ")]), "transforms.h.")
            .expect_err("empty");
        assert_eq!(
            err.to_string(),
            "invalid value ' ' for transforms.h.field: must not be empty"
        );
    }
}
