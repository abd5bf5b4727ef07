//! `InsertField`: adds fields holding the record's topic, partition, offset or timestamp, or a
//! static string. A field name ending in `!` is required in the new schema, `?` (the default)
//! optional. Tombstones pass through untouched.

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance};
use crate::data::Value;
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::schema::{Field, Schema};
use crate::transforms::side::{require_map, require_struct, with_fields, Side};
use crate::transforms::Transformation;

const TOPIC: &str = "topic.field";
const PARTITION: &str = "partition.field";
const OFFSET: &str = "offset.field";
const TIMESTAMP: &str = "timestamp.field";
const STATIC_FIELD: &str = "static.field";
const STATIC_VALUE: &str = "static.value";

/// A field to insert: its name and whether the schema marks it required (`name!`).
#[derive(Debug, Clone, PartialEq)]
struct InsertSpec {
    name: String,
    required: bool,
}

impl InsertSpec {
    fn parse(text: &str) -> InsertSpec {
        if let Some(name) = text.strip_suffix('!') {
            InsertSpec {
                name: name.to_owned(),
                required: true,
            }
        } else {
            InsertSpec {
                name: text.strip_suffix('?').unwrap_or(text).to_owned(),
                required: false,
            }
        }
    }

    fn schema(&self, base: Schema) -> Schema {
        if self.required {
            base
        } else {
            base.optional()
        }
    }
}

#[derive(Debug, Clone)]
pub struct InsertField {
    side: Side,
    topic: Option<InsertSpec>,
    partition: Option<InsertSpec>,
    offset: Option<InsertSpec>,
    timestamp: Option<InsertSpec>,
    static_field: Option<InsertSpec>,
    static_value: Option<String>,
}

impl InsertField {
    pub fn config_def() -> ConfigDef {
        let field = |name: &str, doc: &str| {
            ConfigKey::new(name, ConfigType::String, Importance::Medium, doc).null_default()
        };
        ConfigDef::new()
            .define(field(TOPIC, "Field name for the record's topic; suffix ! for a required field, ? for optional (default)."))
            .define(field(PARTITION, "Field name for the record's partition."))
            .define(field(OFFSET, "Field name for the record's offset."))
            .define(field(TIMESTAMP, "Field name for the record's timestamp."))
            .define(field(STATIC_FIELD, "Field name for the static value."))
            .define(field(STATIC_VALUE, "The static value to insert."))
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = InsertField::config_def().parse_prefixed(settings, prefix)?;
        let spec = |key: &str| -> Result<Option<InsertSpec>, ConfigError> {
            Ok(parsed
                .string(key)?
                .filter(|s| !s.is_empty())
                .map(InsertSpec::parse))
        };
        let static_field = spec(STATIC_FIELD)?;
        let static_value = parsed.string(STATIC_VALUE)?.map(str::to_owned);
        if static_field.is_some() && static_value.is_none() {
            return Err(ConfigError::Conflict(format!(
                "{prefix}{STATIC_FIELD} is set but {prefix}{STATIC_VALUE} is not; set the value to insert"
            )));
        }
        Ok(InsertField {
            side,
            topic: spec(TOPIC)?,
            partition: spec(PARTITION)?,
            offset: spec(OFFSET)?,
            timestamp: spec(TIMESTAMP)?,
            static_field,
            static_value,
        })
    }

    /// The fields to add for `record`, with their schemas and values.
    fn insertions(&self, record: &SinkRecord) -> Vec<(&InsertSpec, Schema, Value)> {
        let mut out = Vec::new();
        if let Some(spec) = &self.topic {
            out.push((
                spec,
                Schema::string(),
                Value::String(record.topic.as_str().into()),
            ));
        }
        if let Some(spec) = &self.partition {
            out.push((spec, Schema::int32(), Value::Int32(record.partition)));
        }
        if let Some(spec) = &self.offset {
            out.push((spec, Schema::int64(), Value::Int64(record.offset)));
        }
        if let Some(spec) = &self.timestamp {
            let value = record.timestamp.map_or(Value::Null, Value::Int64);
            out.push((spec, Schema::timestamp(), value));
        }
        if let (Some(spec), Some(text)) = (&self.static_field, &self.static_value) {
            out.push((spec, Schema::string(), Value::String(text.as_str().into())));
        }
        out
    }

    fn fail(&self, detail: String) -> TransformError {
        TransformError::new(format!("InsertField${}", self.side.suffix()), detail)
    }
}

impl Transformation for InsertField {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record);
        if value.is_null() {
            return Ok(Some(record));
        }
        let insertions = self.insertions(&record);
        match self.side.schema(&record) {
            None => {
                let mut entries = require_map(value, "field insertion")
                    .map_err(|e| self.fail(e))?
                    .to_vec();
                for (spec, _, v) in insertions {
                    let key = Value::String(spec.name.as_str().into());
                    match entries.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = v,
                        None => entries.push((key, v)),
                    }
                }
                self.side.set(&mut record, None, Value::Map(entries));
            }
            Some(schema) => {
                let mut s = require_struct(value, "field insertion")
                    .map_err(|e| self.fail(e))?
                    .clone();
                let mut fields = schema.fields().to_vec();
                for (spec, base, v) in insertions {
                    if spec.required && v.is_null() {
                        return Err(self.fail(format!(
                            "field '{}' is required (!) but record {} has no timestamp",
                            spec.name, record.original
                        )));
                    }
                    fields.retain(|f| f.name != spec.name);
                    fields.push(Field::new(spec.name.clone(), spec.schema(base)));
                    s.put(spec.name.clone(), v);
                }
                let schema = with_fields(schema, fields);
                self.side.set(&mut record, Some(schema), Value::Struct(s));
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
    use crate::schema::TIMESTAMP_LOGICAL_NAME;
    use crate::transforms::testkit::config;

    fn record(value: Value) -> SinkRecord {
        let mut r = SinkRecord::new("orders", 3, 42, value);
        r.timestamp = Some(1_000);
        r
    }

    fn all_fields() -> InsertField {
        InsertField::configure(
            Side::Value,
            &config(&[
                ("topic.field", "t"),
                ("partition.field", "p!"),
                ("offset.field", "o?"),
                ("timestamp.field", "ts"),
                ("static.field", "src"),
                ("static.value", "kafka"),
            ]),
            "",
        )
        .expect("valid")
    }

    #[test]
    fn schemaless_maps_get_metadata_fields() {
        let out = all_fields()
            .apply(record(Value::string_map([("a", Value::Int64(1))])))
            .expect("map")
            .expect("kept");
        assert_eq!(
            out.value,
            Value::string_map([
                ("a", Value::Int64(1)),
                ("t", "orders".into()),
                ("p", Value::Int32(3)),
                ("o", Value::Int64(42)),
                ("ts", Value::Int64(1_000)),
                ("src", "kafka".into()),
            ])
        );
    }

    #[test]
    fn structs_get_fields_with_schemas_and_required_markers() {
        let mut r = record(Value::Struct(Struct::new().with("a", 1.into())));
        r.value_schema = Some(SchemaRef::new(
            Schema::structure(vec![Field::new("a", Schema::int32())]).named("Order"),
        ));
        let out = all_fields().apply(r).expect("struct").expect("kept");
        let schema = out.value_schema.expect("still schema'd");
        assert_eq!(schema.name.as_deref(), Some("Order"));
        assert!(
            !schema.field("p").expect("inserted").schema.optional,
            "p! is required"
        );
        assert!(schema.field("o").expect("inserted").schema.optional);
        let ts = &schema.field("ts").expect("inserted").schema;
        assert_eq!(ts.name.as_deref(), Some(TIMESTAMP_LOGICAL_NAME));
        let Value::Struct(s) = out.value else {
            panic!("struct expected")
        };
        assert_eq!(s.get("t"), Some(&Value::from("orders")));
        assert_eq!(s.get("o"), Some(&Value::Int64(42)));
    }

    #[test]
    fn tombstones_pass_through_untouched() {
        let r = record(Value::Null);
        assert_eq!(all_fields().apply(r.clone()), Ok(Some(r)));
    }

    #[test]
    fn schemaless_non_maps_are_refused_naming_what_was_found() {
        let err = all_fields()
            .apply(record("text".into()))
            .expect_err("not a map");
        assert_eq!(
            err.to_string(),
            "transform InsertField$Value failed: without a schema only maps are supported for field insertion, found string 'text'"
        );
    }

    #[test]
    fn the_key_variant_inserts_into_the_key() {
        let t =
            InsertField::configure(Side::Key, &config(&[("topic.field", "t")]), "").expect("valid");
        let mut r = record(Value::Null);
        r.key = Value::string_map([("id", Value::Int64(1))]);
        let out = t.apply(r).expect("map").expect("kept");
        assert_eq!(out.key.map_get("t"), Some(&Value::from("orders")));
    }

    #[test]
    fn a_static_field_without_a_value_is_refused() {
        let err = InsertField::configure(
            Side::Value,
            &config(&[("static.field", "s")]),
            "transforms.i.",
        )
        .expect_err("no value");
        assert_eq!(
            err.to_string(),
            "transforms.i.static.field is set but transforms.i.static.value is not; set the value to insert"
        );
    }
}
