//! Connect values to and from JSON, with a schema (strict: the JSON must fit it) or without
//! (types are inferred: integers become `int64`, other numbers `float64`, objects maps).

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Number, Value as Json};

use crate::data::{Struct, Value};
use crate::schema::{Schema, SchemaType};

fn base64_engine() -> &'static base64::engine::GeneralPurpose {
    &base64::engine::general_purpose::STANDARD
}

/// Short text of a JSON value for messages.
fn shown(json: &Json) -> String {
    let text = json.to_string();
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(60).collect::<String>())
    } else {
        text
    }
}

/// Reads `json` as a value of `schema`. `replace_null_with_default`: a null for a schema
/// with a default reads as the default (Connect's `replace.null.with.default`).
pub fn value_from_json(
    schema: &Schema,
    json: &Json,
    replace_null_with_default: bool,
) -> Result<Value, String> {
    if json.is_null() {
        if let (Some(default), true) = (&schema.default, replace_null_with_default) {
            return Ok((**default).clone());
        }
        if schema.optional {
            return Ok(Value::Null);
        }
        return Err(format!(
            "invalid null value for required {} field",
            schema.kind.connect_name()
        ));
    }
    let mismatch = || {
        format!(
            "expected {} but found {}",
            schema.kind.connect_name(),
            shown(json)
        )
    };
    let int = |min: i64, max: i64| -> Result<i64, String> {
        json.as_i64()
            .filter(|v| (min..=max).contains(v))
            .ok_or_else(|| {
                format!(
                    "expected {} (an integer from {min} to {max}) but found {}",
                    schema.kind.connect_name(),
                    shown(json)
                )
            })
    };
    Ok(match &schema.kind {
        SchemaType::Boolean => Value::Boolean(json.as_bool().ok_or_else(mismatch)?),
        SchemaType::Int8 => Value::Int8(int(i8::MIN.into(), i8::MAX.into())? as i8),
        SchemaType::Int16 => Value::Int16(int(i16::MIN.into(), i16::MAX.into())? as i16),
        SchemaType::Int32 => Value::Int32(int(i32::MIN.into(), i32::MAX.into())? as i32),
        SchemaType::Int64 => Value::Int64(int(i64::MIN, i64::MAX)?),
        SchemaType::Float32 => Value::Float32(json.as_f64().ok_or_else(mismatch)? as f32),
        SchemaType::Float64 => Value::Float64(json.as_f64().ok_or_else(mismatch)?),
        SchemaType::String => Value::String(json.as_str().ok_or_else(mismatch)?.into()),
        SchemaType::Bytes => {
            let text = json.as_str().ok_or_else(mismatch)?;
            let raw = base64_engine()
                .decode(text)
                .map_err(|e| format!("bytes must be base64 text ({e}), found {}", shown(json)))?;
            Value::Bytes(Bytes::from(raw))
        }
        SchemaType::Array(items) => {
            let list = json.as_array().ok_or_else(mismatch)?;
            let mut out = Vec::with_capacity(list.len());
            for (i, item) in list.iter().enumerate() {
                out.push(
                    value_from_json(items, item, replace_null_with_default)
                        .map_err(|e| format!("element {i}: {e}"))?,
                );
            }
            Value::Array(out)
        }
        SchemaType::Map(keys, values) => {
            let mut out = Vec::new();
            if keys.kind == SchemaType::String {
                let obj = json.as_object().ok_or_else(mismatch)?;
                for (k, v) in obj {
                    let value = value_from_json(values, v, replace_null_with_default)
                        .map_err(|e| format!("map entry '{k}': {e}"))?;
                    out.push((Value::String(k.as_str().into()), value));
                }
            } else {
                // Maps with non-string keys are written as an array of [key, value] pairs.
                let pairs = json.as_array().ok_or_else(mismatch)?;
                for pair in pairs {
                    let (k, v) = match pair.as_array().map(Vec::as_slice) {
                        Some([k, v]) => (k, v),
                        _ => {
                            return Err(format!(
                                "a map with {} keys is an array of [key, value] pairs, found {}",
                                keys.kind.connect_name(),
                                shown(pair)
                            ))
                        }
                    };
                    out.push((
                        value_from_json(keys, k, replace_null_with_default)?,
                        value_from_json(values, v, replace_null_with_default)?,
                    ));
                }
            }
            Value::Map(out)
        }
        SchemaType::Struct(fields) => {
            let obj = json.as_object().ok_or_else(mismatch)?;
            let mut out = Struct::new();
            for field in fields {
                let v = obj.get(&field.name).unwrap_or(&Json::Null);
                let value = value_from_json(&field.schema, v, replace_null_with_default)
                    .map_err(|e| format!("field '{}': {e}", field.name))?;
                out.put(field.name.clone(), value);
            }
            Value::Struct(out)
        }
    })
}

/// Reads JSON without a schema, inferring Connect types.
pub fn value_from_json_schemaless(json: &Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int64(i),
            // Integers beyond i64 and fractions both become doubles.
            None => Value::Float64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::String(s.as_str().into()),
        Json::Array(items) => Value::Array(items.iter().map(value_from_json_schemaless).collect()),
        Json::Object(obj) => Value::Map(
            obj.iter()
                .map(|(k, v)| {
                    (
                        Value::String(k.as_str().into()),
                        value_from_json_schemaless(v),
                    )
                })
                .collect(),
        ),
    }
}

fn float(v: f64) -> Result<Json, String> {
    Number::from_f64(v)
        .map(Json::Number)
        .ok_or_else(|| format!("cannot write {v} as JSON (JSON has no NaN or infinity)"))
}

/// Writes `value` as JSON, checked against `schema` when there is one.
pub fn value_to_json(
    schema: Option<&Schema>,
    value: &Value,
    replace_null_with_default: bool,
) -> Result<Json, String> {
    let Some(schema) = schema else {
        return value_to_json_schemaless(value);
    };
    if value.is_null() {
        if let (Some(default), true) = (&schema.default, replace_null_with_default) {
            return value_to_json(Some(schema), default, false);
        }
        if schema.optional {
            return Ok(Json::Null);
        }
        return Err(format!(
            "invalid null value for required {} field",
            schema.kind.connect_name()
        ));
    }
    let mismatch = || {
        format!(
            "schema says {} but the value is {} '{}'",
            schema.kind.connect_name(),
            value.type_name(),
            value
        )
    };
    Ok(match (&schema.kind, value) {
        (SchemaType::Boolean, Value::Boolean(v)) => Json::Bool(*v),
        (SchemaType::Int8, Value::Int8(v)) => Json::from(*v),
        (SchemaType::Int16, Value::Int16(v)) => Json::from(*v),
        (SchemaType::Int32, Value::Int32(v)) => Json::from(*v),
        (SchemaType::Int64, Value::Int64(v)) => Json::from(*v),
        (SchemaType::Float32, Value::Float32(v)) => float(f64::from(*v))?,
        (SchemaType::Float64, Value::Float64(v)) => float(*v)?,
        (SchemaType::String, Value::String(v)) => Json::String(v.to_string()),
        (SchemaType::Bytes, Value::Bytes(v)) => Json::String(base64_engine().encode(v)),
        (SchemaType::Array(items), Value::Array(list)) => Json::Array(
            list.iter()
                .enumerate()
                .map(|(i, item)| {
                    value_to_json(Some(items), item, replace_null_with_default)
                        .map_err(|e| format!("element {i}: {e}"))
                })
                .collect::<Result<_, _>>()?,
        ),
        (SchemaType::Map(keys, values), Value::Map(entries)) => {
            if keys.kind == SchemaType::String {
                let mut obj = Map::new();
                for (k, v) in entries {
                    let Value::String(key) = k else {
                        return Err(format!(
                            "map keys must be strings per the schema, found {} '{k}'",
                            k.type_name()
                        ));
                    };
                    let json = value_to_json(Some(values), v, replace_null_with_default)
                        .map_err(|e| format!("map entry '{key}': {e}"))?;
                    obj.insert(key.to_string(), json);
                }
                Json::Object(obj)
            } else {
                Json::Array(
                    entries
                        .iter()
                        .map(|(k, v)| {
                            Ok(Json::Array(vec![
                                value_to_json(Some(keys), k, replace_null_with_default)?,
                                value_to_json(Some(values), v, replace_null_with_default)?,
                            ]))
                        })
                        .collect::<Result<_, String>>()?,
                )
            }
        }
        (SchemaType::Struct(fields), Value::Struct(s)) => {
            let mut obj = Map::new();
            for field in fields {
                let v = s.get(&field.name).unwrap_or(&Value::Null);
                let json = value_to_json(Some(&field.schema), v, replace_null_with_default)
                    .map_err(|e| format!("field '{}': {e}", field.name))?;
                obj.insert(field.name.clone(), json);
            }
            Json::Object(obj)
        }
        _ => return Err(mismatch()),
    })
}

/// Writes a value without a schema: maps with string keys (and structs) become objects.
pub fn value_to_json_schemaless(value: &Value) -> Result<Json, String> {
    Ok(match value {
        Value::Null => Json::Null,
        Value::Boolean(v) => Json::Bool(*v),
        Value::Int8(v) => Json::from(*v),
        Value::Int16(v) => Json::from(*v),
        Value::Int32(v) => Json::from(*v),
        Value::Int64(v) => Json::from(*v),
        Value::Float32(v) => float(f64::from(*v))?,
        Value::Float64(v) => float(*v)?,
        Value::String(v) => Json::String(v.to_string()),
        Value::Bytes(v) => Json::String(base64_engine().encode(v)),
        Value::Array(items) => Json::Array(
            items
                .iter()
                .map(value_to_json_schemaless)
                .collect::<Result<_, _>>()?,
        ),
        Value::Map(entries) if entries.iter().all(|(k, _)| matches!(k, Value::String(_))) => {
            let mut obj = Map::new();
            for (k, v) in entries {
                if let Value::String(key) = k {
                    obj.insert(key.to_string(), value_to_json_schemaless(v)?);
                }
            }
            Json::Object(obj)
        }
        Value::Map(entries) => Json::Array(
            entries
                .iter()
                .map(|(k, v)| {
                    Ok(Json::Array(vec![
                        value_to_json_schemaless(k)?,
                        value_to_json_schemaless(v)?,
                    ]))
                })
                .collect::<Result<_, String>>()?,
        ),
        Value::Struct(s) => {
            let mut obj = Map::new();
            for (k, v) in s.fields() {
                obj.insert(k.clone(), value_to_json_schemaless(v)?);
            }
            Json::Object(obj)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Field;
    use serde_json::json;

    #[test]
    fn integers_out_of_the_schemas_range_are_refused_with_the_range() {
        let err = value_from_json(&Schema::int8(), &json!(300), true).expect_err("too big");
        assert_eq!(
            err,
            "expected INT8 (an integer from -128 to 127) but found 300"
        );
    }

    #[test]
    fn null_reads_as_default_then_as_null_when_optional_else_fails() {
        let with_default = Schema::int32().optional().with_default(Value::Int32(7));
        assert_eq!(
            value_from_json(&with_default, &Json::Null, true),
            Ok(Value::Int32(7))
        );
        assert_eq!(
            value_from_json(&with_default, &Json::Null, false),
            Ok(Value::Null)
        );
        assert_eq!(
            value_from_json(&Schema::int32(), &Json::Null, true),
            Err("invalid null value for required INT32 field".into())
        );
    }

    #[test]
    fn struct_errors_name_the_field_path() {
        let schema = Schema::structure(vec![Field::new(
            "inner",
            Schema::structure(vec![Field::new("n", Schema::int32())]),
        )]);
        let err = value_from_json(&schema, &json!({"inner": {"n": "x"}}), true)
            .expect_err("string for int");
        assert_eq!(err, "field 'inner': field 'n': expected INT32 (an integer from -2147483648 to 2147483647) but found \"x\"");
    }

    #[test]
    fn maps_with_non_string_keys_are_arrays_of_pairs() {
        let schema = Schema::map(Schema::int32(), Schema::string());
        let value = Value::Map(vec![(Value::Int32(1), "one".into())]);
        let json = value_to_json(Some(&schema), &value, true).expect("fits");
        assert_eq!(json, json!([[1, "one"]]));
        assert_eq!(value_from_json(&schema, &json, true), Ok(value));
    }

    #[test]
    fn bytes_are_base64_text() {
        let value = Value::Bytes(Bytes::from_static(b"\x00\xffhi"));
        let json = value_to_json(Some(&Schema::bytes()), &value, true).expect("fits");
        assert_eq!(json, json!("AP9oaQ=="));
        assert_eq!(value_from_json(&Schema::bytes(), &json, true), Ok(value));
    }

    #[test]
    fn values_that_do_not_match_the_schema_are_refused() {
        let err = value_to_json(Some(&Schema::int32()), &Value::from("7"), true)
            .expect_err("string is not int32");
        assert_eq!(err, "schema says INT32 but the value is string '7'");
    }

    #[test]
    fn schemaless_json_infers_int64_float64_and_maps() {
        let value = value_from_json_schemaless(&json!({"a": 1, "b": 1.5, "c": [true, null]}));
        assert_eq!(
            value,
            Value::string_map([
                ("a", Value::Int64(1)),
                ("b", Value::Float64(1.5)),
                ("c", Value::Array(vec![Value::Boolean(true), Value::Null])),
            ])
        );
    }

    #[test]
    fn nan_cannot_be_written_as_json() {
        let err = value_to_json_schemaless(&Value::Float64(f64::NAN)).expect_err("no NaN");
        assert!(err.contains("JSON has no NaN"));
    }
}
