//! Converters turn a record's key and value bytes into Connect values (`to_connect`) and back
//! (`from_connect`, for sinks that write Kafka records again). Three are built in, each also
//! known by its Kafka Connect class name:
//!
//! | name | Connect class | data |
//! |---|---|---|
//! | `json` | `org.apache.kafka.connect.json.JsonConverter` | JSON, with the `{"schema","payload"}` envelope unless `schemas.enable=false` |
//! | `string` | `org.apache.kafka.connect.storage.StringConverter` | UTF-8 text |
//! | `bytearray` | `org.apache.kafka.connect.converters.ByteArrayConverter` | bytes as they are |
//!
//! A connector's `key.converter` / `value.converter` wins over the worker's; without either,
//! `bytearray` passes bytes through untouched. Settings for a converter are the keys under its
//! prefix, e.g. `value.converter.schemas.enable`.

mod bytearray;
mod header;
mod json;
pub(crate) mod json_schema;
pub(crate) mod json_value;
mod record_converter;
mod string;

use std::fmt;

use bytes::Bytes;

pub use bytearray::ByteArrayConverter;
pub use header::{header_from_connect, headers_to_connect};
pub use json::JsonConverter;
pub use json_schema::{schema_from_json, schema_to_json};
pub use record_converter::{RecordConverter, Serialized};
pub use string::StringConverter;

use crate::config::{ConfigDef, ConfigMap};
use crate::data::Value;
use crate::error::{ConfigError, ConvertError, RecordPart};
use crate::schema::{Schema, SchemaRef};

/// A converted key or value and its schema (`None` for schemaless data). The schema is
/// shared: a converter whose every value has the same schema (`string`, `bytearray`) hands out
/// one, as Connect's return a constant like `OPTIONAL_STRING_SCHEMA`.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaAndValue {
    pub schema: Option<SchemaRef>,
    pub value: Value,
}

impl SchemaAndValue {
    pub fn new(schema: Option<SchemaRef>, value: Value) -> Self {
        SchemaAndValue { schema, value }
    }

    /// A null with no schema: what null bytes convert to.
    pub fn null() -> Self {
        SchemaAndValue::new(None, Value::Null)
    }
}

/// Bytes to Connect data and back, for one part (key or value) of records.
pub trait Converter: Send + Sync + fmt::Debug {
    /// The short name (`json`), used in messages.
    fn name(&self) -> &'static str;

    /// Reads the bytes of a record from `topic`; `None` is a null key or a tombstone.
    fn to_connect(&self, topic: &str, data: Option<&[u8]>) -> Result<SchemaAndValue, ConvertError>;

    /// [`to_connect`](Self::to_connect) from the record's own buffer, which a converter that
    /// keeps the bytes as they are can share rather than copy.
    fn to_connect_shared(
        &self,
        topic: &str,
        data: Option<&Bytes>,
    ) -> Result<SchemaAndValue, ConvertError> {
        self.to_connect(topic, data.map(|d| &d[..]))
    }

    /// [`to_connect_shared`](Self::to_connect_shared) from bytes nothing else will read: a
    /// converter that keeps them as they are takes them over, without the reference count's
    /// increment now and decrement later (two atomic operations a record part, issue 18).
    fn to_connect_owned(
        &self,
        topic: &str,
        data: Option<Bytes>,
    ) -> Result<SchemaAndValue, ConvertError> {
        self.to_connect_shared(topic, data.as_ref())
    }

    /// Writes a value for `topic`; `Ok(None)` is a null key or a tombstone.
    // Connect's name for the direction, kept so Connect users recognise it.
    #[allow(clippy::wrong_self_convention)]
    fn from_connect(
        &self,
        topic: &str,
        schema: Option<&Schema>,
        value: &Value,
    ) -> Result<Option<Bytes>, ConvertError>;
}

/// The built-in converters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConverterKind {
    Json,
    String,
    ByteArray,
}

impl ConverterKind {
    /// Short names in the order messages list them.
    pub const NAMES: &'static str = "json, string, bytearray";

    /// Finds a converter by short name or Connect class name (ASCII case ignored).
    /// `config_key` is where the name was read, for the message.
    pub fn from_name(config_key: &str, name: &str) -> Result<ConverterKind, ConfigError> {
        let trimmed = name.trim();
        let is = |aliases: &[&str]| aliases.iter().any(|a| a.eq_ignore_ascii_case(trimmed));
        if is(&[
            "json",
            "JsonConverter",
            "org.apache.kafka.connect.json.JsonConverter",
        ]) {
            Ok(ConverterKind::Json)
        } else if is(&[
            "string",
            "StringConverter",
            "org.apache.kafka.connect.storage.StringConverter",
        ]) {
            Ok(ConverterKind::String)
        } else if is(&[
            "bytearray",
            "ByteArrayConverter",
            "org.apache.kafka.connect.converters.ByteArrayConverter",
        ]) {
            Ok(ConverterKind::ByteArray)
        } else {
            Err(ConfigError::UnknownPlugin {
                kind: "converter",
                key: config_key.to_owned(),
                name: name.to_owned(),
                expected: ConverterKind::NAMES.to_owned(),
            })
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConverterKind::Json => "json",
            ConverterKind::String => "string",
            ConverterKind::ByteArray => "bytearray",
        }
    }

    /// The settings this converter reads (keys without the `key.converter.` prefix).
    pub fn config_def(self) -> ConfigDef {
        match self {
            ConverterKind::Json => JsonConverter::config_def(),
            ConverterKind::String | ConverterKind::ByteArray => ConfigDef::new(),
        }
    }

    /// Builds the converter for `part` from its settings; `prefix` (`value.converter.`) is
    /// used to name keys in messages.
    pub fn build(
        self,
        part: RecordPart,
        settings: &ConfigMap,
        prefix: &str,
    ) -> Result<Box<dyn Converter>, ConfigError> {
        Ok(match self {
            ConverterKind::Json => Box::new(JsonConverter::configure(part, settings, prefix)?),
            ConverterKind::String => Box::new(StringConverter::new(part)),
            ConverterKind::ByteArray => Box::new(ByteArrayConverter::new(part)),
        })
    }
}

/// The config key naming the converter of `part` (`key.converter` / `value.converter`).
pub fn converter_key(part: RecordPart) -> &'static str {
    match part {
        RecordPart::Key => "key.converter",
        RecordPart::Value | RecordPart::Header => "value.converter",
    }
}

/// The keys under `prefix`, with the prefix removed.
pub fn strip_prefix(props: &ConfigMap, prefix: &str) -> ConfigMap {
    props
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(prefix)
                .map(|rest| (rest.to_owned(), v.clone()))
        })
        .collect()
}

/// The converter for `part`: the connector's setting, else the worker's, else `bytearray`.
/// Its settings come from the same level as its name.
pub fn resolve_converter(
    part: RecordPart,
    connector: &ConfigMap,
    worker: &ConfigMap,
) -> Result<Box<dyn Converter>, ConfigError> {
    let key = converter_key(part);
    let prefix = format!("{key}.");
    let (kind, settings) = match (connector.get(key), worker.get(key)) {
        (Some(name), _) => (
            ConverterKind::from_name(key, name)?,
            strip_prefix(connector, &prefix),
        ),
        (None, Some(name)) => (
            ConverterKind::from_name(key, name)?,
            strip_prefix(worker, &prefix),
        ),
        (None, None) => (ConverterKind::ByteArray, ConfigMap::new()),
    };
    kind.build(part, &settings, &prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::config_map as config;

    #[test]
    fn connect_class_names_are_accepted_as_aliases() {
        for (name, kind) in [
            (
                "org.apache.kafka.connect.json.JsonConverter",
                ConverterKind::Json,
            ),
            (
                "org.apache.kafka.connect.storage.StringConverter",
                ConverterKind::String,
            ),
            (
                "org.apache.kafka.connect.converters.ByteArrayConverter",
                ConverterKind::ByteArray,
            ),
            ("JSON", ConverterKind::Json),
            (" bytearray ", ConverterKind::ByteArray),
        ] {
            assert_eq!(ConverterKind::from_name("value.converter", name), Ok(kind));
        }
    }

    #[test]
    fn an_unknown_converter_is_refused_naming_the_key_and_the_choices() {
        let err = ConverterKind::from_name("key.converter", "jsn").expect_err("typo");
        assert_eq!(
            err.to_string(),
            "unknown converter 'jsn' for key.converter; expected one of json, string, bytearray"
        );
    }

    #[test]
    fn the_connectors_converter_wins_over_the_workers_with_its_own_settings() {
        let connector = config(&[
            ("value.converter", "json"),
            ("value.converter.schemas.enable", "false"),
        ]);
        let worker = config(&[("value.converter", "string")]);
        let converter = resolve_converter(RecordPart::Value, &connector, &worker).expect("valid");
        assert_eq!(converter.name(), "json");
        let plain = converter
            .to_connect("t", Some(br#"{"a":1}"#))
            .expect("schemas disabled reads plain JSON");
        assert_eq!(plain.value, Value::string_map([("a", Value::Int64(1))]));
    }

    #[test]
    fn the_workers_converter_applies_when_the_connector_names_none() {
        let worker = config(&[("key.converter", "string")]);
        let converter =
            resolve_converter(RecordPart::Key, &ConfigMap::new(), &worker).expect("valid");
        assert_eq!(converter.name(), "string");
    }

    #[test]
    fn without_any_setting_bytes_pass_through() {
        let converter = resolve_converter(RecordPart::Value, &ConfigMap::new(), &ConfigMap::new())
            .expect("valid");
        assert_eq!(converter.name(), "bytearray");
    }

    #[test]
    fn bad_converter_settings_name_the_prefixed_key() {
        let connector = config(&[
            ("value.converter", "json"),
            ("value.converter.schemas.enable", "maybe"),
        ]);
        let err = resolve_converter(RecordPart::Value, &connector, &ConfigMap::new())
            .expect_err("not a boolean");
        assert_eq!(
            err.to_string(),
            "invalid value 'maybe' for value.converter.schemas.enable: expected a boolean (true or false)"
        );
    }
}
