//! `MaskField`: replaces the listed fields with their type's empty value (`0`, `false`, `""`,
//! empty collections) or with `replacement`, parsed as the field's type. Tombstones pass.

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::data::{Struct, Text, Value};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::transforms::side::{key_str, require_map, require_struct, Side};
use crate::transforms::Transformation;

const FIELDS: &str = "fields";
const REPLACEMENT: &str = "replacement";

#[derive(Debug, Clone)]
pub struct MaskField {
    side: Side,
    fields: Vec<String>,
    replacement: Option<String>,
}

impl MaskField {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(FIELDS, ConfigType::List, Importance::High, "Fields to mask.")
                    .validator(Validator::NonEmptyList),
            )
            .define(
                ConfigKey::new(REPLACEMENT, ConfigType::String, Importance::Low, "Text to put in place of masked values, parsed as each field's type; without it, the type's empty value.")
                    .null_default()
                    .validator(Validator::NonEmptyString),
            )
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = MaskField::config_def().parse_prefixed(settings, prefix)?;
        Ok(MaskField {
            side,
            fields: parsed.list(FIELDS)?.to_vec(),
            replacement: parsed.string(REPLACEMENT)?.map(str::to_owned),
        })
    }

    fn masked(&self, field: &str, value: &Value) -> Result<Value, String> {
        let Some(text) = &self.replacement else {
            return Ok(match value {
                Value::Null => Value::Null,
                Value::Boolean(_) => Value::Boolean(false),
                Value::Int8(_) => Value::Int8(0),
                Value::Int16(_) => Value::Int16(0),
                Value::Int32(_) => Value::Int32(0),
                Value::Int64(_) => Value::Int64(0),
                Value::Float32(_) => Value::Float32(0.0),
                Value::Float64(_) => Value::Float64(0.0),
                Value::String(_) => Value::String(Text::new()),
                Value::Bytes(_) => Value::Bytes(bytes::Bytes::new()),
                Value::Array(_) => Value::Array(Vec::new()),
                Value::Map(_) => Value::Map(Vec::new()),
                Value::Struct(_) => {
                    return Err(format!("cannot mask field '{field}': structs have no empty value; mask its inner fields instead"))
                }
            });
        };
        let bad = || {
            format!(
                "cannot mask {} field '{field}' with replacement '{text}'",
                value.type_name()
            )
        };
        let t = text.trim();
        Ok(match value {
            Value::Null => Value::Null,
            Value::String(_) => Value::String(text.as_str().into()),
            Value::Int8(_) => Value::Int8(t.parse().map_err(|_| bad())?),
            Value::Int16(_) => Value::Int16(t.parse().map_err(|_| bad())?),
            Value::Int32(_) => Value::Int32(t.parse().map_err(|_| bad())?),
            Value::Int64(_) => Value::Int64(t.parse().map_err(|_| bad())?),
            Value::Float32(_) => Value::Float32(t.parse().map_err(|_| bad())?),
            Value::Float64(_) => Value::Float64(t.parse().map_err(|_| bad())?),
            _ => {
                return Err(format!(
                    "{}; only strings and numbers take a replacement",
                    bad()
                ))
            }
        })
    }

    fn fail(&self, detail: String) -> TransformError {
        TransformError::new(format!("MaskField${}", self.side.suffix()), detail)
    }
}

impl Transformation for MaskField {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record);
        if value.is_null() {
            return Ok(Some(record));
        }
        let schema = self.side.shared_schema(&record);
        let masks = |name: &str| self.fields.iter().any(|f| f == name);
        let out = match &schema {
            None => {
                let entries = require_map(value, "masking").map_err(|e| self.fail(e))?;
                let mut out = Vec::with_capacity(entries.len());
                for (k, v) in entries {
                    let v = match key_str(k) {
                        Some(name) if masks(name) => {
                            self.masked(name, v).map_err(|e| self.fail(e))?
                        }
                        _ => v.clone(),
                    };
                    out.push((k.clone(), v));
                }
                Value::Map(out)
            }
            Some(_) => {
                let s = require_struct(value, "masking").map_err(|e| self.fail(e))?;
                let mut out = Struct::new();
                for (name, v) in s.fields() {
                    let v = if masks(name) {
                        self.masked(name, v).map_err(|e| self.fail(e))?
                    } else {
                        v.clone()
                    };
                    out.put(name.clone(), v);
                }
                Value::Struct(out)
            }
        };
        self.side.set_shared(&mut record, schema, out);
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SchemaRef;
    use crate::transforms::testkit::config;

    fn value() -> Value {
        Value::string_map([
            ("ssn", "123-45".into()),
            ("age", Value::Int32(40)),
            ("vip", Value::Boolean(true)),
            ("tags", Value::Array(vec!["a".into()])),
            ("keep", "k".into()),
        ])
    }

    #[test]
    fn masked_fields_become_their_types_empty_value() {
        let t = MaskField::configure(Side::Value, &config(&[("fields", "ssn,age,vip,tags")]), "")
            .expect("valid");
        let out = t
            .apply(SinkRecord::new("t", 0, 0, value()))
            .expect("map")
            .expect("kept");
        assert_eq!(
            out.value,
            Value::string_map([
                ("ssn", "".into()),
                ("age", Value::Int32(0)),
                ("vip", Value::Boolean(false)),
                ("tags", Value::Array(vec![])),
                ("keep", "k".into()),
            ])
        );
    }

    #[test]
    fn a_replacement_is_parsed_as_the_fields_type() {
        let t = MaskField::configure(
            Side::Value,
            &config(&[("fields", "ssn,age"), ("replacement", "-1")]),
            "",
        )
        .expect("valid");
        let out = t
            .apply(SinkRecord::new("t", 0, 0, value()))
            .expect("map")
            .expect("kept");
        assert_eq!(out.value.map_get("ssn"), Some(&Value::from("-1")));
        assert_eq!(out.value.map_get("age"), Some(&Value::Int32(-1)));
    }

    #[test]
    fn a_replacement_that_does_not_fit_the_type_is_refused_naming_the_field() {
        let t = MaskField::configure(
            Side::Value,
            &config(&[("fields", "age"), ("replacement", "***")]),
            "",
        )
        .expect("valid");
        let err = t
            .apply(SinkRecord::new("t", 0, 0, value()))
            .expect_err("not a number");
        assert_eq!(err.to_string(), "transform MaskField$Value failed: cannot mask int32 field 'age' with replacement '***'");
    }

    #[test]
    fn struct_fields_are_masked_and_the_schema_is_kept() {
        use crate::schema::{Field, Schema};
        let t =
            MaskField::configure(Side::Value, &config(&[("fields", "card")]), "").expect("valid");
        let schema = Schema::structure(vec![Field::new("card", Schema::string())]);
        let mut r = SinkRecord::new(
            "t",
            0,
            0,
            Value::Struct(Struct::new().with("card", "4111".into())),
        );
        r.value_schema = Some(SchemaRef::new(schema.clone()));
        let out = t.apply(r).expect("struct").expect("kept");
        assert_eq!(out.value_schema, Some(SchemaRef::new(schema)));
        assert_eq!(
            out.value,
            Value::Struct(Struct::new().with("card", "".into()))
        );
    }

    #[test]
    fn an_empty_field_list_is_refused() {
        let err =
            MaskField::configure(Side::Value, &config(&[("fields", "")]), "").expect_err("empty");
        assert_eq!(
            err.to_string(),
            "invalid value '' for fields: must list at least one item"
        );
    }
}
