//! `Cast`: changes the type of fields (`spec=id:int64,price:float32`) or of the whole key or
//! value (`spec=string`). Targets: int8, int16, int32, int64, float32, float64, boolean, string.
//! Numbers narrow the way Connect's (Java's) casts do: integers wrap, floats truncate toward
//! zero and saturate. Text parses strictly: `"1.5"` is not an int, `"yes"` not a boolean.

use crate::config::{
    ConfigDef, ConfigKey, ConfigMap, ConfigType, ConfigValue, Importance, Validator,
};
use crate::convert::json_value::value_to_json_schemaless;
use crate::data::{Struct, Value};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::schema::{Field, Schema, SchemaType};
use crate::transforms::side::{key_str, require_map, require_struct, with_fields, Side};
use crate::transforms::Transformation;

const SPEC: &str = "spec";
const TARGETS: &str = "int8, int16, int32, int64, float32, float64, boolean, string";

/// A type a value can be cast to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastTarget {
    Int8,
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    Boolean,
    String,
}

impl CastTarget {
    fn parse(text: &str) -> Option<CastTarget> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "int8" => CastTarget::Int8,
            "int16" => CastTarget::Int16,
            "int32" => CastTarget::Int32,
            "int64" => CastTarget::Int64,
            "float32" => CastTarget::Float32,
            "float64" => CastTarget::Float64,
            "boolean" => CastTarget::Boolean,
            "string" => CastTarget::String,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            CastTarget::Int8 => "int8",
            CastTarget::Int16 => "int16",
            CastTarget::Int32 => "int32",
            CastTarget::Int64 => "int64",
            CastTarget::Float32 => "float32",
            CastTarget::Float64 => "float64",
            CastTarget::Boolean => "boolean",
            CastTarget::String => "string",
        }
    }

    fn schema_type(self) -> SchemaType {
        match self {
            CastTarget::Int8 => SchemaType::Int8,
            CastTarget::Int16 => SchemaType::Int16,
            CastTarget::Int32 => SchemaType::Int32,
            CastTarget::Int64 => SchemaType::Int64,
            CastTarget::Float32 => SchemaType::Float32,
            CastTarget::Float64 => SchemaType::Float64,
            CastTarget::Boolean => SchemaType::Boolean,
            CastTarget::String => SchemaType::String,
        }
    }

    /// The schema after the cast: the target type, keeping only whether null is allowed.
    fn schema_from(self, original: &Schema) -> Schema {
        let mut schema = Schema::new(self.schema_type());
        schema.optional = original.optional;
        schema
    }

    /// Casts one value; the error says what could not become what.
    pub fn cast(self, value: &Value) -> Result<Value, String> {
        if value.is_null() {
            return Ok(Value::Null);
        }
        let fail = || {
            format!(
                "cannot cast {} '{value}' to {}",
                value.type_name(),
                self.name()
            )
        };
        if self == CastTarget::String {
            return Ok(Value::String(
                match value {
                    Value::Array(_) | Value::Map(_) | Value::Struct(_) => {
                        value_to_json_schemaless(value)
                            .map_err(|e| format!("{}: {e}", fail()))?
                            .to_string()
                    }
                    other => other.to_string(),
                }
                .into(),
            ));
        }
        if matches!(
            value,
            Value::Array(_) | Value::Map(_) | Value::Struct(_) | Value::Bytes(_)
        ) {
            return Err(format!(
                "{}; only primitive values can be cast to {}",
                fail(),
                self.name()
            ));
        }
        if self == CastTarget::Boolean {
            return match value {
                Value::Boolean(b) => Ok(Value::Boolean(*b)),
                Value::String(s) if s.trim().eq_ignore_ascii_case("true") => {
                    Ok(Value::Boolean(true))
                }
                Value::String(s) if s.trim().eq_ignore_ascii_case("false") => {
                    Ok(Value::Boolean(false))
                }
                Value::String(_) => Err(fail()),
                number => Ok(Value::Boolean(number.as_f64().is_some_and(|n| n != 0.0))),
            };
        }
        // Every remaining value is a boolean, a number or text: read it as i64 or f64.
        enum Num {
            I(i64),
            F(f64),
        }
        let num = match value {
            Value::Boolean(b) => Num::I(i64::from(*b)),
            Value::Float32(f) => Num::F(f64::from(*f)),
            Value::Float64(f) => Num::F(*f),
            Value::String(s) => {
                let s = s.trim();
                let float_target = matches!(self, CastTarget::Float32 | CastTarget::Float64);
                match s.parse::<i64>() {
                    Ok(i) => Num::I(i),
                    Err(_) if float_target => Num::F(s.parse().map_err(|_| fail())?),
                    Err(_) => return Err(fail()),
                }
            }
            other => Num::I(other.as_i64().ok_or_else(fail)?),
        };
        Ok(match (self, num) {
            (CastTarget::Int8, Num::I(i)) => Value::Int8(i as i8),
            (CastTarget::Int16, Num::I(i)) => Value::Int16(i as i16),
            (CastTarget::Int32, Num::I(i)) => Value::Int32(i as i32),
            (CastTarget::Int64, Num::I(i)) => Value::Int64(i),
            (CastTarget::Int8, Num::F(f)) => Value::Int8(f as i32 as i8),
            (CastTarget::Int16, Num::F(f)) => Value::Int16(f as i32 as i16),
            (CastTarget::Int32, Num::F(f)) => Value::Int32(f as i32),
            (CastTarget::Int64, Num::F(f)) => Value::Int64(f as i64),
            (CastTarget::Float32, Num::I(i)) => Value::Float32(i as f32),
            (CastTarget::Float64, Num::I(i)) => Value::Float64(i as f64),
            (CastTarget::Float32, Num::F(f)) => Value::Float32(f as f32),
            (CastTarget::Float64, Num::F(f)) => Value::Float64(f),
            (CastTarget::Boolean | CastTarget::String, _) => return Err(fail()),
        })
    }
}

/// What to cast: the whole key/value, or named fields.
#[derive(Debug, Clone, PartialEq)]
enum CastSpec {
    Whole(CastTarget),
    Fields(Vec<(String, CastTarget)>),
}

fn parse_spec(items: &[String]) -> Result<CastSpec, String> {
    if let [single] = items {
        if !single.contains(':') {
            return CastTarget::parse(single)
                .map(CastSpec::Whole)
                .ok_or_else(|| format!("'{single}' is not a type; expected one of {TARGETS}"));
        }
    }
    let mut fields = Vec::with_capacity(items.len());
    for item in items {
        let (field, target) = item.split_once(':').ok_or_else(|| {
            format!("'{item}' is not field:type; a whole-value cast must be the only item")
        })?;
        let target = CastTarget::parse(target).ok_or_else(|| {
            format!("'{target}' in '{item}' is not a type; expected one of {TARGETS}")
        })?;
        fields.push((field.trim().to_owned(), target));
    }
    Ok(CastSpec::Fields(fields))
}

fn check_spec(value: &ConfigValue) -> Result<(), String> {
    match value {
        ConfigValue::List(items) if !items.is_empty() => parse_spec(items).map(|_| ()),
        _ => Err("must list at least one field:type or a single type".into()),
    }
}

#[derive(Debug, Clone)]
pub struct Cast {
    side: Side,
    spec: CastSpec,
}

impl Cast {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new(
                SPEC,
                ConfigType::List,
                Importance::High,
                "field:type pairs, or a single type to cast the whole key or value.",
            )
            .validator(Validator::Custom {
                check: check_spec,
                allowed: "field:type list or one type",
            }),
        )
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = Cast::config_def().parse_prefixed(settings, prefix)?;
        // The validator has already parsed the spec; this cannot fail after it passed.
        let spec = parse_spec(parsed.list(SPEC)?).map_err(|reason| ConfigError::InvalidValue {
            key: parsed.full_key(SPEC),
            value: parsed.list(SPEC).map(|l| l.join(",")).unwrap_or_default(),
            reason,
        })?;
        Ok(Cast { side, spec })
    }

    fn target(&self, name: &str) -> Option<CastTarget> {
        match &self.spec {
            CastSpec::Fields(fields) => fields.iter().find(|(f, _)| f == name).map(|(_, t)| *t),
            CastSpec::Whole(_) => None,
        }
    }

    fn fail(&self, detail: String) -> TransformError {
        TransformError::new(format!("Cast${}", self.side.suffix()), detail)
    }
}

impl Transformation for Cast {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record);
        let schema = self.side.schema(&record);
        if let CastSpec::Whole(target) = self.spec {
            let cast = target.cast(value).map_err(|e| self.fail(e))?;
            let schema = schema.map(|s| target.schema_from(s));
            self.side.set(&mut record, schema, cast);
            return Ok(Some(record));
        }
        if value.is_null() {
            return Ok(Some(record));
        }
        match schema {
            None => {
                let entries = require_map(value, "casting fields").map_err(|e| self.fail(e))?;
                let mut out = Vec::with_capacity(entries.len());
                for (k, v) in entries {
                    let v = match key_str(k).and_then(|name| self.target(name)) {
                        Some(target) => target
                            .cast(v)
                            .map_err(|e| self.fail(format!("field '{k}': {e}")))?,
                        None => v.clone(),
                    };
                    out.push((k.clone(), v));
                }
                self.side.set(&mut record, None, Value::Map(out));
            }
            Some(schema) => {
                let s = require_struct(value, "casting fields").map_err(|e| self.fail(e))?;
                let mut fields = Vec::with_capacity(schema.fields().len());
                let mut out = Struct::new();
                for field in schema.fields() {
                    let v = s.get(&field.name).cloned().unwrap_or(Value::Null);
                    match self.target(&field.name) {
                        Some(target) => {
                            let cast = target
                                .cast(&v)
                                .map_err(|e| self.fail(format!("field '{}': {e}", field.name)))?;
                            fields.push(Field::new(
                                field.name.clone(),
                                target.schema_from(&field.schema),
                            ));
                            out.put(field.name.clone(), cast);
                        }
                        None => {
                            fields.push(field.clone());
                            out.put(field.name.clone(), v);
                        }
                    }
                }
                let schema = with_fields(schema, fields);
                self.side.set(&mut record, Some(schema), Value::Struct(out));
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

    fn cast(spec: &str) -> Cast {
        Cast::configure(Side::Value, &config(&[("spec", spec)]), "").expect("valid spec")
    }

    #[test]
    fn schemaless_fields_are_cast_and_others_kept() {
        let v = Value::string_map([
            ("id", "42".into()),
            ("price", Value::Int64(3)),
            ("x", "y".into()),
        ]);
        let out = cast("id:int64,price:float64")
            .apply(SinkRecord::new("t", 0, 0, v))
            .expect("casts")
            .expect("kept");
        assert_eq!(
            out.value,
            Value::string_map([
                ("id", Value::Int64(42)),
                ("price", Value::Float64(3.0)),
                ("x", "y".into())
            ])
        );
    }

    #[test]
    fn struct_fields_change_type_in_the_schema_too_keeping_optionality() {
        let schema = Schema::structure(vec![
            Field::new("n", Schema::int64().optional()),
            Field::new("s", Schema::string()),
        ]);
        let mut r = SinkRecord::new(
            "t",
            0,
            0,
            Value::Struct(
                Struct::new()
                    .with("n", Value::Int64(7))
                    .with("s", "x".into()),
            ),
        );
        r.value_schema = Some(SchemaRef::new(schema));
        let out = cast("n:string").apply(r).expect("casts").expect("kept");
        assert_eq!(
            out.value_schema,
            Some(SchemaRef::new(Schema::structure(vec![
                Field::new("n", Schema::string().optional()),
                Field::new("s", Schema::string())
            ])))
        );
        assert_eq!(
            out.value,
            Value::Struct(Struct::new().with("n", "7".into()).with("s", "x".into()))
        );
    }

    #[test]
    fn a_whole_value_cast_changes_value_and_schema() {
        let mut r = SinkRecord::new("t", 0, 0, Value::Float64(2.9));
        r.value_schema = Some(SchemaRef::new(Schema::float64()));
        let out = cast("int32").apply(r).expect("casts").expect("kept");
        assert_eq!(
            (out.value_schema, out.value),
            (Some(SchemaRef::new(Schema::int32())), Value::Int32(2))
        );
    }

    #[test]
    fn numbers_narrow_like_java_and_booleans_become_one_or_zero() {
        assert_eq!(
            CastTarget::Int8.cast(&Value::Int32(300)),
            Ok(Value::Int8(44))
        );
        assert_eq!(
            CastTarget::Int32.cast(&Value::Float64(-1.9)),
            Ok(Value::Int32(-1))
        );
        assert_eq!(
            CastTarget::Int64.cast(&Value::Boolean(true)),
            Ok(Value::Int64(1))
        );
        assert_eq!(
            CastTarget::Boolean.cast(&Value::Int32(0)),
            Ok(Value::Boolean(false))
        );
        assert_eq!(
            CastTarget::Float32.cast(&"1.5".into()),
            Ok(Value::Float32(1.5))
        );
    }

    #[test]
    fn text_that_is_not_the_target_type_is_refused_naming_the_value() {
        assert_eq!(
            CastTarget::Int32.cast(&"1.5".into()),
            Err("cannot cast string '1.5' to int32".into())
        );
        assert_eq!(
            CastTarget::Boolean.cast(&"yes".into()),
            Err("cannot cast string 'yes' to boolean".into())
        );
        let err = cast("n:int32")
            .apply(SinkRecord::new(
                "t",
                0,
                0,
                Value::string_map([("n", "abc".into())]),
            ))
            .expect_err("not a number");
        assert_eq!(
            err.to_string(),
            "transform Cast$Value failed: field 'n': cannot cast string 'abc' to int32"
        );
    }

    #[test]
    fn containers_cast_to_string_as_json_and_to_nothing_else() {
        let map = Value::string_map([("a", Value::Int32(1))]);
        assert_eq!(CastTarget::String.cast(&map), Ok(Value::from(r#"{"a":1}"#)));
        assert!(CastTarget::Int32.cast(&map).is_err());
    }

    #[test]
    fn bad_specs_are_refused_naming_the_item_and_the_types() {
        let err = Cast::configure(
            Side::Value,
            &config(&[("spec", "a:int32,b:long")]),
            "transforms.c.",
        )
        .expect_err("bad type");
        assert_eq!(
            err.to_string(),
            "invalid value 'a:int32,b:long' for transforms.c.spec: 'long' in 'b:long' is not a type; expected one of int8, int16, int32, int64, float32, float64, boolean, string"
        );
        let err = Cast::configure(Side::Value, &config(&[("spec", "a:int32,int64")]), "")
            .expect_err("mixed");
        assert!(err.to_string().contains("'int64' is not field:type"));
    }
}
