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

    /// How this converter reads bytes, when it keeps them as they are: the record converter
    /// then reads them inline ([`PassThrough`]). `None` for any converter that parses.
    fn pass_through(&self) -> Option<PassThrough> {
        None
    }

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

/// What the `string` and `bytearray` converters do with a key or value, done without a call
/// through [`Converter`]: the record converter reads a record's parts inline when both of its
/// converters pass them through (issue 18). A dynamic call returns its result through memory,
/// which the caller reads back in wider loads than the callee wrote it with; the store buffer
/// cannot forward those, and each such load waits for the stores to retire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassThrough {
    /// UTF-8 text with Connect's optional string schema (`string`). Only ASCII passes inline;
    /// other text goes through the converter, which checks it as UTF-8.
    Text,
    /// Bytes as they are, with the optional bytes schema (`bytearray`).
    Bytes,
}

impl PassThrough {
    /// Whether `data` (`None` for null) is read inline.
    #[inline(always)]
    pub fn passes(self, data: Option<&[u8]>) -> bool {
        match self {
            PassThrough::Bytes => true,
            PassThrough::Text => data.is_none_or(string::is_ascii_text),
        }
    }

    /// `data` read as this converter reads it.
    ///
    /// # Safety
    /// [`passes`](Self::passes) said yes to `data`: text is not checked again.
    #[inline(always)]
    pub unsafe fn read_unchecked(self, data: Option<Bytes>) -> SchemaAndValue {
        match self {
            PassThrough::Bytes => bytearray::bytes_and_schema(data),
            // SAFETY: ASCII, as the caller checked through `passes`.
            PassThrough::Text => unsafe { string::text_and_schema_unchecked(data) },
        }
    }
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
    fn text_passes_inline_only_when_ascii_and_bytes_always() {
        let cases: [(Option<&[u8]>, bool); 5] = [
            (None, true),
            (Some(b""), true),
            (Some(b"ascii text"), true),
            (Some("caf\u{e9}".as_bytes()), false),
            (Some(b"\xff"), false),
        ];
        for (data, text) in cases {
            assert_eq!(PassThrough::Text.passes(data), text, "{data:?}");
            assert!(PassThrough::Bytes.passes(data), "{data:?}");
        }
        for kind in [
            ConverterKind::String,
            ConverterKind::ByteArray,
            ConverterKind::Json,
        ] {
            let converter = kind
                .build(RecordPart::Value, &ConfigMap::new(), "value.converter.")
                .expect("built");
            let expected = match kind {
                ConverterKind::String => Some(PassThrough::Text),
                ConverterKind::ByteArray => Some(PassThrough::Bytes),
                ConverterKind::Json => None,
            };
            assert_eq!(converter.pass_through(), expected, "{kind:?}");
        }
    }

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
