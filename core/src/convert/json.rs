//! The JSON converter, compatible with Connect's `JsonConverter`: with `schemas.enable=true`
//! (the default) each key or value is an envelope `{"schema": ..., "payload": ...}` that
//! carries its own schema; with `false` it is plain JSON read without a schema.

use bytes::Bytes;
use serde_json::{json, Value as Json};

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance};
use crate::convert::json_schema::{schema_from_json, schema_to_json};
use crate::convert::json_value::{
    value_from_json, value_from_json_schemaless, value_to_json, value_to_json_schemaless,
};
use crate::convert::{converter_key, Converter, SchemaAndValue};
use crate::data::Value;
use crate::error::{ConfigError, ConvertError, RecordPart};
use crate::schema::{Schema, SchemaRef};

const SCHEMAS_ENABLE: &str = "schemas.enable";
const REPLACE_NULL_WITH_DEFAULT: &str = "replace.null.with.default";

#[derive(Debug, Clone)]
pub struct JsonConverter {
    part: RecordPart,
    schemas_enable: bool,
    replace_null_with_default: bool,
}

impl JsonConverter {
    pub fn new(part: RecordPart, schemas_enable: bool) -> Self {
        JsonConverter {
            part,
            schemas_enable,
            replace_null_with_default: true,
        }
    }

    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(
                    SCHEMAS_ENABLE,
                    ConfigType::Boolean,
                    Importance::High,
                    "Whether each key or value is a {\"schema\", \"payload\"} envelope. \
                     Set false to read and write plain JSON without schemas.",
                )
                .default("true"),
            )
            .define(
                ConfigKey::new(
                    REPLACE_NULL_WITH_DEFAULT,
                    ConfigType::Boolean,
                    Importance::Low,
                    "Whether a null for a field whose schema has a default reads and writes \
                     as that default.",
                )
                .default("true"),
            )
    }

    /// Builds from the keys under `prefix` (already stripped in `settings`).
    pub fn configure(
        part: RecordPart,
        settings: &ConfigMap,
        prefix: &str,
    ) -> Result<JsonConverter, ConfigError> {
        let parsed = JsonConverter::config_def().parse_prefixed(settings, prefix)?;
        Ok(JsonConverter {
            part,
            schemas_enable: parsed.boolean(SCHEMAS_ENABLE)?,
            replace_null_with_default: parsed.boolean(REPLACE_NULL_WITH_DEFAULT)?,
        })
    }

    fn read_error(&self, topic: &str, detail: String) -> ConvertError {
        ConvertError::Deserialize {
            converter: "json",
            part: self.part,
            topic: topic.to_owned(),
            detail,
        }
    }

    fn write_error(&self, topic: &str, detail: String) -> ConvertError {
        ConvertError::Serialize {
            converter: "json",
            part: self.part,
            topic: topic.to_owned(),
            detail,
        }
    }
}

/// The start of some bytes as text, for messages.
fn preview(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(60).collect::<String>())
    } else {
        text.into_owned()
    }
}

impl Converter for JsonConverter {
    fn name(&self) -> &'static str {
        "json"
    }

    fn to_connect(&self, topic: &str, data: Option<&[u8]>) -> Result<SchemaAndValue, ConvertError> {
        let data = match data {
            None => return Ok(SchemaAndValue::null()),
            Some([]) => return Ok(SchemaAndValue::null()),
            Some(d) => d,
        };
        let json: Json = serde_json::from_slice(data).map_err(|e| {
            self.read_error(
                topic,
                format!(
                    "'{}' is not valid JSON ({e}); if the topic holds plain text use {}=string",
                    preview(data),
                    converter_key(self.part)
                ),
            )
        })?;
        if !self.schemas_enable {
            return Ok(SchemaAndValue::new(None, value_from_json_schemaless(&json)));
        }
        let envelope = json
            .as_object()
            .filter(|o| o.len() == 2 && o.contains_key("schema") && o.contains_key("payload"));
        let Some(envelope) = envelope else {
            return Err(self.read_error(
                topic,
                format!(
                    "with schemas.enable=true the JSON must be an object with exactly the fields \
                     \"schema\" and \"payload\", found '{}'; for plain JSON set {}.schemas.enable=false",
                    preview(data),
                    converter_key(self.part)
                ),
            ));
        };
        let payload = &envelope["payload"];
        match &envelope["schema"] {
            Json::Null => Ok(SchemaAndValue::new(
                None,
                value_from_json_schemaless(payload),
            )),
            schema_json => {
                let schema = schema_from_json(schema_json)
                    .map_err(|e| self.read_error(topic, format!("bad schema: {e}")))?;
                let value = value_from_json(&schema, payload, self.replace_null_with_default)
                    .map_err(|e| self.read_error(topic, e))?;
                Ok(SchemaAndValue::new(Some(SchemaRef::new(schema)), value))
            }
        }
    }

    fn from_connect(
        &self,
        topic: &str,
        schema: Option<&Schema>,
        value: &Value,
    ) -> Result<Option<Bytes>, ConvertError> {
        if schema.is_none() && value.is_null() {
            return Ok(None);
        }
        let json = if self.schemas_enable {
            let schema_json = match schema {
                Some(s) => schema_to_json(s).map_err(|e| self.write_error(topic, e))?,
                None => Json::Null,
            };
            let payload = value_to_json(schema, value, self.replace_null_with_default)
                .map_err(|e| self.write_error(topic, e))?;
            json!({"schema": schema_json, "payload": payload})
        } else {
            match schema {
                Some(_) => value_to_json(schema, value, self.replace_null_with_default),
                None => value_to_json_schemaless(value),
            }
            .map_err(|e| self.write_error(topic, e))?
        };
        let text = serde_json::to_vec(&json)
            .map_err(|e| self.write_error(topic, format!("cannot encode JSON: {e}")))?;
        Ok(Some(Bytes::from(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Struct;
    use crate::schema::Field;

    fn with_schemas() -> JsonConverter {
        JsonConverter::new(RecordPart::Value, true)
    }

    fn without_schemas() -> JsonConverter {
        JsonConverter::new(RecordPart::Value, false)
    }

    #[test]
    fn schemas_are_enabled_by_default_like_connect() {
        let converter =
            JsonConverter::configure(RecordPart::Value, &ConfigMap::new(), "value.converter.")
                .expect("defaults are valid");
        assert!(converter.schemas_enable);
    }

    #[test]
    fn an_envelope_reads_as_a_struct_with_its_schema() {
        let data = br#"{"schema":{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"},{"type":"string","optional":true,"field":"name"}],"optional":false,"name":"Order"},"payload":{"id":7,"name":"pen"}}"#;
        let got = with_schemas()
            .to_connect("orders", Some(data))
            .expect("valid envelope");
        let schema = got.schema.expect("envelope has a schema");
        assert_eq!(schema.name.as_deref(), Some("Order"));
        assert_eq!(schema.fields().len(), 2);
        assert_eq!(
            got.value,
            Value::Struct(
                Struct::new()
                    .with("id", Value::Int64(7))
                    .with("name", "pen".into())
            )
        );
    }

    #[test]
    fn schema_and_struct_round_trip_through_the_envelope() {
        let schema = Schema::structure(vec![
            Field::new("id", Schema::int32()),
            Field::new("tags", Schema::array(Schema::string())),
        ]);
        let value = Value::Struct(
            Struct::new()
                .with("id", 1.into())
                .with("tags", Value::Array(vec!["a".into()])),
        );
        let bytes = with_schemas()
            .from_connect("t", Some(&schema), &value)
            .expect("fits schema")
            .expect("not null");
        let text = std::str::from_utf8(&bytes).expect("JSON is UTF-8");
        assert!(
            text.starts_with(r#"{"schema":{"type":"struct","fields":[{"type":"int32""#),
            "{text}"
        );
        assert!(
            text.ends_with(r#""payload":{"id":1,"tags":["a"]}}"#),
            "{text}"
        );
        let back = with_schemas()
            .to_connect("t", Some(&bytes))
            .expect("readable");
        assert_eq!(
            back,
            SchemaAndValue::new(Some(SchemaRef::new(schema)), value)
        );
    }

    #[test]
    fn plain_json_with_schemas_enabled_explains_the_setting_to_change() {
        let err = with_schemas()
            .to_connect("orders", Some(br#"{"id":7}"#))
            .expect_err("no envelope");
        assert_eq!(
            err.to_string(),
            "json converter cannot read the value of a record from topic 'orders': with \
             schemas.enable=true the JSON must be an object with exactly the fields \"schema\" \
             and \"payload\", found '{\"id\":7}'; for plain JSON set value.converter.schemas.enable=false"
        );
    }

    #[test]
    fn malformed_json_is_a_conversion_error_naming_the_text() {
        let err = without_schemas()
            .to_connect("orders", Some(b"{not json"))
            .expect_err("malformed");
        let message = err.to_string();
        assert!(
            message.contains("'{not json' is not valid JSON"),
            "{message}"
        );
        assert!(message.contains("use value.converter=string"), "{message}");
    }

    #[test]
    fn plain_json_reads_without_a_schema_when_schemas_are_disabled() {
        let got = without_schemas()
            .to_connect("t", Some(br#"{"b":2,"a":[1.5]}"#))
            .expect("plain JSON");
        assert_eq!(got.schema, None);
        assert_eq!(
            got.value,
            Value::string_map([
                ("b", Value::Int64(2)),
                ("a", Value::Array(vec![Value::Float64(1.5)])),
            ])
        );
        let back = without_schemas()
            .from_connect("t", None, &got.value)
            .expect("writable")
            .expect("not null");
        assert_eq!(&back[..], br#"{"b":2,"a":[1.5]}"#, "field order is kept");
    }

    #[test]
    fn null_bytes_are_null_and_a_null_without_schema_writes_null_bytes() {
        assert_eq!(
            with_schemas().to_connect("t", None),
            Ok(SchemaAndValue::null())
        );
        assert_eq!(
            with_schemas().from_connect("t", None, &Value::Null),
            Ok(None)
        );
    }

    #[test]
    fn an_envelope_with_a_null_schema_reads_schemaless() {
        let got = with_schemas()
            .to_connect("t", Some(br#"{"schema":null,"payload":"hi"}"#))
            .expect("valid");
        assert_eq!(got, SchemaAndValue::new(None, "hi".into()));
    }

    #[test]
    fn schemaless_values_write_an_envelope_with_a_null_schema() {
        let bytes = with_schemas()
            .from_connect("t", None, &Value::Int64(5))
            .expect("writable")
            .expect("not null");
        assert_eq!(&bytes[..], br#"{"schema":null,"payload":5}"#);
    }

    #[test]
    fn a_payload_that_does_not_fit_its_schema_is_refused() {
        let err = with_schemas()
            .to_connect(
                "t",
                Some(br#"{"schema":{"type":"int32","optional":false},"payload":"x"}"#),
            )
            .expect_err("string is not int32");
        assert!(err.to_string().ends_with(
            "expected INT32 (an integer from -2147483648 to 2147483647) but found \"x\""
        ));
    }

    #[test]
    fn key_converter_messages_name_the_key_settings() {
        let err = JsonConverter::new(RecordPart::Key, true)
            .to_connect("t", Some(b"42"))
            .expect_err("bare number with schemas enabled");
        assert!(err
            .to_string()
            .contains("set key.converter.schemas.enable=false"));
        assert!(err.to_string().contains("cannot read the key"));
    }
}
