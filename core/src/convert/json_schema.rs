//! Connect schemas written as JSON, as the `schema` half of the JSON converter's envelope:
//! `{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"}],"optional":false}`.
//! Type names are Connect's JSON names (`float`/`double`, not `float32`/`float64`).

use serde_json::{json, Map, Value as Json};

use crate::convert::json_value::{value_from_json, value_to_json};
use crate::schema::{Field, Schema, SchemaType};

/// Writes `schema` as Connect's JSON schema description.
pub fn schema_to_json(schema: &Schema) -> Result<Json, String> {
    // "type" comes first so the text reads like Connect's.
    let mut out = Map::new();
    out.insert("type".into(), Json::Null);
    let type_name = match &schema.kind {
        SchemaType::Boolean => "boolean",
        SchemaType::Int8 => "int8",
        SchemaType::Int16 => "int16",
        SchemaType::Int32 => "int32",
        SchemaType::Int64 => "int64",
        SchemaType::Float32 => "float",
        SchemaType::Float64 => "double",
        SchemaType::String => "string",
        SchemaType::Bytes => "bytes",
        SchemaType::Array(items) => {
            out.insert("items".into(), schema_to_json(items)?);
            "array"
        }
        SchemaType::Map(keys, values) => {
            out.insert("keys".into(), schema_to_json(keys)?);
            out.insert("values".into(), schema_to_json(values)?);
            "map"
        }
        SchemaType::Struct(fields) => {
            let mut list = Vec::with_capacity(fields.len());
            for field in fields {
                let mut f = schema_to_json(&field.schema)?;
                if let Json::Object(obj) = &mut f {
                    obj.insert("field".into(), json!(field.name));
                }
                list.push(f);
            }
            out.insert("fields".into(), Json::Array(list));
            "struct"
        }
    };
    out["type"] = json!(type_name);
    out.insert("optional".into(), json!(schema.optional));
    if let Some(name) = &schema.name {
        out.insert("name".into(), json!(name));
    }
    if let Some(version) = schema.version {
        out.insert("version".into(), json!(version));
    }
    if let Some(doc) = &schema.doc {
        out.insert("doc".into(), json!(doc));
    }
    if !schema.parameters.is_empty() {
        out.insert("parameters".into(), json!(schema.parameters));
    }
    if let Some(default) = &schema.default {
        let without_default = Schema {
            default: None,
            ..schema.clone()
        };
        out.insert(
            "default".into(),
            value_to_json(Some(&without_default), default, false)?,
        );
    }
    Ok(Json::Object(out))
}

/// Reads Connect's JSON schema description; the error says which part is wrong.
pub fn schema_from_json(json: &Json) -> Result<Schema, String> {
    let obj = json
        .as_object()
        .ok_or_else(|| format!("a schema must be a JSON object, found {json}"))?;
    let type_name = obj
        .get("type")
        .and_then(Json::as_str)
        .ok_or_else(|| format!("a schema needs a \"type\" string, found {json}"))?;
    let kind = match type_name {
        "boolean" => SchemaType::Boolean,
        "int8" => SchemaType::Int8,
        "int16" => SchemaType::Int16,
        "int32" => SchemaType::Int32,
        "int64" => SchemaType::Int64,
        "float" => SchemaType::Float32,
        "double" => SchemaType::Float64,
        "string" => SchemaType::String,
        "bytes" => SchemaType::Bytes,
        "array" => {
            let items = obj.get("items").ok_or("an array schema needs \"items\"")?;
            SchemaType::Array(Box::new(schema_from_json(items)?))
        }
        "map" => {
            let keys = obj.get("keys").ok_or("a map schema needs \"keys\"")?;
            let values = obj.get("values").ok_or("a map schema needs \"values\"")?;
            SchemaType::Map(
                Box::new(schema_from_json(keys)?),
                Box::new(schema_from_json(values)?),
            )
        }
        "struct" => {
            let fields = obj
                .get("fields")
                .and_then(Json::as_array)
                .ok_or("a struct schema needs a \"fields\" array")?;
            let mut out = Vec::with_capacity(fields.len());
            for f in fields {
                let name = f
                    .get("field")
                    .and_then(Json::as_str)
                    .ok_or_else(|| format!("a struct field needs a \"field\" name, found {f}"))?;
                let schema = schema_from_json(f).map_err(|e| format!("in field '{name}': {e}"))?;
                out.push(Field::new(name, schema));
            }
            SchemaType::Struct(out)
        }
        other => {
            return Err(format!(
                "unknown schema type '{other}'; expected one of boolean, int8, int16, int32, \
                 int64, float, double, string, bytes, array, map, struct"
            ))
        }
    };
    let mut schema = Schema::new(kind);
    schema.optional = obj.get("optional").and_then(Json::as_bool).unwrap_or(false);
    schema.name = obj.get("name").and_then(Json::as_str).map(str::to_owned);
    schema.version = obj
        .get("version")
        .and_then(Json::as_i64)
        .and_then(|v| i32::try_from(v).ok());
    schema.doc = obj.get("doc").and_then(Json::as_str).map(str::to_owned);
    if let Some(params) = obj.get("parameters").and_then(Json::as_object) {
        for (k, v) in params {
            let text = v
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string());
            schema.parameters.insert(k.clone(), text);
        }
    }
    if let Some(default) = obj.get("default").filter(|d| !d.is_null()) {
        let value = value_from_json(&schema, default, false)
            .map_err(|e| format!("bad default value: {e}"))?;
        schema.default = Some(Box::new(value));
    }
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;

    #[test]
    fn struct_schemas_round_trip_through_json() {
        let schema = Schema::structure(vec![
            Field::new("id", Schema::int64()),
            Field::new("price", Schema::float32().optional()),
            Field::new("tags", Schema::array(Schema::string())),
            Field::new(
                "attrs",
                Schema::map(Schema::string(), Schema::int32()).optional(),
            ),
            Field::new("ts", Schema::timestamp().optional()),
        ])
        .named("com.example.Order");
        let json = schema_to_json(&schema).expect("writable");
        assert_eq!(json["type"], "struct");
        assert_eq!(json["fields"][1]["type"], "float");
        assert_eq!(json["fields"][1]["field"], "price");
        assert_eq!(
            json["fields"][4]["name"],
            "org.apache.kafka.connect.data.Timestamp"
        );
        assert_eq!(schema_from_json(&json), Ok(schema));
    }

    #[test]
    fn defaults_are_read_with_the_schemas_own_type() {
        let json = json!({"type": "int32", "optional": true, "default": 5});
        let schema = schema_from_json(&json).expect("valid");
        assert_eq!(schema.default.as_deref(), Some(&Value::Int32(5)));
        assert_eq!(schema_to_json(&schema).expect("writable")["default"], 5);
    }

    #[test]
    fn unknown_types_list_the_known_ones() {
        let err = schema_from_json(&json!({"type": "float64"})).expect_err("not a JSON name");
        assert!(err.starts_with("unknown schema type 'float64'; expected one of boolean"));
    }

    #[test]
    fn a_field_without_a_name_is_refused() {
        let err = schema_from_json(&json!({"type": "struct", "fields": [{"type": "int32"}]}))
            .expect_err("nameless field");
        assert!(err.contains("needs a \"field\" name"), "{err}");
    }
}
