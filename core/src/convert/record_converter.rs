//! A key converter and a value converter applied together: raw records in, sink records out,
//! and back for sinks that write Kafka records.

use bytes::Bytes;

use crate::config::ConfigMap;
use crate::convert::{
    header_from_connect, headers_to_connect, resolve_converter, Converter, PassThrough,
    SchemaAndValue,
};
use crate::error::{ConfigError, ConvertError, RecordPart};
use crate::push_in_place;
use crate::record::{RawRecord, SinkRecord};

#[derive(Debug)]
pub struct RecordConverter {
    key: Box<dyn Converter>,
    value: Box<dyn Converter>,
    /// Both converters' [`PassThrough`], when both keep the bytes as they are: records are
    /// then read inline.
    passes: Option<(PassThrough, PassThrough)>,
}

impl RecordConverter {
    pub fn new(key: Box<dyn Converter>, value: Box<dyn Converter>) -> Self {
        let passes = key.pass_through().zip(value.pass_through());
        RecordConverter { key, value, passes }
    }

    /// Both converters as the connector and worker configure them.
    pub fn from_config(connector: &ConfigMap, worker: &ConfigMap) -> Result<Self, ConfigError> {
        Ok(RecordConverter::new(
            resolve_converter(RecordPart::Key, connector, worker)?,
            resolve_converter(RecordPart::Value, connector, worker)?,
        ))
    }

    /// Converts a raw record; the error says whether the key or the value failed.
    pub fn to_sink_record(&self, raw: RawRecord) -> Result<SinkRecord, ConvertError> {
        self.convert(&raw)
    }

    /// [`to_sink_record`](Self::to_sink_record) from a borrowed record, which the caller keeps
    /// (for a dead letter): only what the sink record owns is copied.
    // Inlined so that the record is built where its caller keeps it, not built and moved.
    #[inline]
    pub fn convert(&self, raw: &RawRecord) -> Result<SinkRecord, ConvertError> {
        let key = self.key.to_connect_shared(&raw.topic, raw.key.as_ref())?;
        let value = self
            .value
            .to_connect_shared(&raw.topic, raw.value.as_ref())?;
        Ok(sink_record(raw, key, value))
    }

    /// [`convert`](Self::convert) onto the end of `out`: the record is built in its slot of
    /// the list, not built, returned and moved there (a copy of the whole record per record,
    /// issue 18).
    #[inline]
    pub fn convert_into(
        &self,
        raw: &RawRecord,
        out: &mut Vec<SinkRecord>,
    ) -> Result<(), ConvertError> {
        if self.passes.is_some() {
            // Clones only when both converters pass bytes through: the record's own refers
            // to them, and any that do not pass inline go to their converter as they are.
            return self.push_converted(raw, raw.key.clone(), raw.value.clone(), out);
        }
        let key = self.key.to_connect_shared(&raw.topic, raw.key.as_ref())?;
        let value = self
            .value
            .to_connect_shared(&raw.topic, raw.value.as_ref())?;
        push_sink_record(out, raw, key, value);
        Ok(())
    }

    /// [`convert_into`](Self::convert_into) for a raw record whose key and value nothing
    /// reads after conversion (no dead letter queue, no error log with the record): they move
    /// into the sink record, and the raw record keeps neither, even when conversion fails.
    #[inline]
    pub fn convert_owned_into(
        &self,
        raw: &mut RawRecord,
        out: &mut Vec<SinkRecord>,
    ) -> Result<(), ConvertError> {
        let (key, value) = (raw.key.take(), raw.value.take());
        self.push_converted(raw, key, value, out)
    }

    /// The sink record of `raw` with `key` and `value` (its own, or clones), which the
    /// converters take over, pushed onto `out`.
    #[inline(always)]
    fn push_converted(
        &self,
        raw: &RawRecord,
        key: Option<Bytes>,
        value: Option<Bytes>,
        out: &mut Vec<SinkRecord>,
    ) -> Result<(), ConvertError> {
        let (key, value) = match self.read_inline(key, value) {
            Ok(parts) => parts,
            Err((key, value)) => (
                self.key.to_connect_owned(&raw.topic, key)?,
                self.value.to_connect_owned(&raw.topic, value)?,
            ),
        };
        push_sink_record(out, raw, key, value);
        Ok(())
    }

    /// A record's key and value read inline when both converters pass such bytes through
    /// ([`PassThrough`]); otherwise both come back, for the converters.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn read_inline(
        &self,
        key: Option<Bytes>,
        value: Option<Bytes>,
    ) -> Result<(SchemaAndValue, SchemaAndValue), (Option<Bytes>, Option<Bytes>)> {
        match self.passes {
            Some((k, v)) if k.passes(key.as_deref()) && v.passes(value.as_deref()) => {
                // SAFETY: both said yes to these very bytes just above.
                Ok(unsafe { (k.read_unchecked(key), v.read_unchecked(value)) })
            }
            _ => Err((key, value)),
        }
    }

    /// Serializes a sink record's key, value and headers for writing to Kafka: what a
    /// producer sends, without the coordinates a whole raw record would copy.
    pub fn serialize(&self, record: &SinkRecord) -> Result<Serialized, ConvertError> {
        let topic = &record.topic;
        // Most records carry none: no collecting through a fallible iterator for them.
        let headers = if record.headers.is_empty() {
            Vec::new()
        } else {
            record
                .headers
                .iter()
                .map(|h| Ok((h.key.clone(), header_from_connect(topic, h)?)))
                .collect::<Result<_, ConvertError>>()?
        };
        Ok(Serialized {
            key: self
                .key
                .from_connect(topic, record.key_schema.as_deref(), &record.key)?,
            value: self
                .value
                .from_connect(topic, record.value_schema.as_deref(), &record.value)?,
            headers,
        })
    }
}

/// A sink record serialized for Kafka ([`RecordConverter::serialize`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serialized {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// The sink record of `raw` with its converted `key` and `value`, as a struct expression
/// handed to `$build!` after `$args`: one field list for a record returned ([`returned!`])
/// and one built in its slot of a list ([`push_in_place!`]).
macro_rules! sink_record {
    ($build:ident!($($args:tt)*), $raw:ident, $key:ident, $value:ident) => {
        $build!(
            $($args)*
            SinkRecord {
                original: $raw.coordinates(),
                key_schema: $key.schema,
                key: $key.value,
                value_schema: $value.schema,
                value: $value.value,
                headers: headers_to_connect(&$raw.headers),
                timestamp: $raw.timestamp,
                timestamp_type: $raw.timestamp_type,
                delivery_count: $raw.delivery_count,
                lock_deadline: $raw.lock_deadline,
                topic: $raw.topic.clone(),
                partition: $raw.partition,
                offset: $raw.offset,
            }
        )
    };
}

/// The struct expression itself, for [`sink_record!`].
macro_rules! returned {
    ($record:expr) => {
        $record
    };
}

/// The sink record of `raw` with its converted key and value.
#[inline(always)]
fn sink_record(raw: &RawRecord, key: SchemaAndValue, value: SchemaAndValue) -> SinkRecord {
    sink_record!(returned!(), raw, key, value)
}

/// [`sink_record`] built in its slot at the end of `out` ([`push_in_place!`]).
#[inline(always)]
fn push_sink_record(
    out: &mut Vec<SinkRecord>,
    raw: &RawRecord,
    key: SchemaAndValue,
    value: SchemaAndValue,
) {
    sink_record!(push_in_place!(out,), raw, key, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::ConverterKind;
    use crate::data::Value;
    use crate::error::Stage;
    use crate::schema::Schema;

    use crate::config::config_map as config;

    fn raw(key: &[u8], value: &[u8]) -> RawRecord {
        let mut r = RawRecord::new("orders", 2, 10);
        r.key = Some(Bytes::copy_from_slice(key));
        r.value = Some(Bytes::copy_from_slice(value));
        r.headers = vec![("h".into(), Some(Bytes::from_static(b"v")))];
        r.timestamp = Some(1_700_000_000_000);
        r.delivery_count = Some(2);
        r
    }

    #[test]
    fn raw_records_convert_with_their_coordinates_headers_and_delivery_count() {
        let converter = RecordConverter::from_config(
            &config(&[
                ("key.converter", "string"),
                ("value.converter", "json"),
                ("value.converter.schemas.enable", "false"),
            ]),
            &ConfigMap::new(),
        )
        .expect("valid");
        let record = converter
            .to_sink_record(raw(b"k1", br#"{"n":1}"#))
            .expect("converts");
        assert_eq!(record.key, Value::from("k1"));
        assert_eq!(record.value, Value::string_map([("n", Value::Int64(1))]));
        assert_eq!(record.original.to_string(), "orders-2@10");
        assert_eq!(record.delivery_count, Some(2));
        assert_eq!(
            record.headers[0].value,
            Value::Bytes(Bytes::from_static(b"v"))
        );
    }

    #[test]
    fn bytearray_records_serialize_back_to_the_same_bytes() {
        let converter =
            RecordConverter::from_config(&ConfigMap::new(), &ConfigMap::new()).expect("defaults");
        let original = raw(b"\x01k", b"\xffvalue");
        let record = converter
            .to_sink_record(original.clone())
            .expect("converts");
        assert_eq!(
            converter.serialize(&record),
            Ok(Serialized {
                key: original.key,
                value: original.value,
                headers: original.headers,
            })
        );
    }

    #[test]
    fn bytearray_records_share_the_raw_records_buffers() {
        let converter =
            RecordConverter::from_config(&ConfigMap::new(), &ConfigMap::new()).expect("defaults");
        let original = raw(b"\x01k", b"\xffvalue");
        let record = converter.convert(&original).expect("converts");
        let pointer = |v: &Value| match v {
            Value::Bytes(b) => b.as_ptr(),
            other => panic!("not bytes: {other:?}"),
        };
        assert_eq!(
            pointer(&record.key),
            original.key.as_ref().unwrap().as_ptr()
        );
        assert_eq!(
            pointer(&record.value),
            original.value.as_ref().unwrap().as_ptr()
        );
    }

    #[test]
    fn owned_conversion_moves_the_bytes_and_the_raw_record_keeps_none() {
        let converter = RecordConverter::from_config(
            &config(&[("value.converter", "string")]),
            &ConfigMap::new(),
        )
        .expect("valid");
        let mut original = raw(b"\x01k", b"text");
        let (key, value) = (original.key.clone(), original.value.clone());
        let mut out = Vec::new();
        converter
            .convert_owned_into(&mut original, &mut out)
            .expect("converts");
        assert_eq!(
            (original.key.as_ref(), original.value.as_ref()),
            (None, None)
        );
        drop((key, value));
        // Once the test's own copies are gone, the sink record holds the only reference: the
        // bytes were moved, not shared (sharing costs two atomic operations a part).
        let Value::Bytes(k) = &out[0].key else {
            panic!("not bytes: {:?}", out[0].key)
        };
        let Value::String(v) = &out[0].value else {
            panic!("not a string: {:?}", out[0].value)
        };
        assert!(k.is_unique() && v.as_bytes().is_unique());
        assert_eq!((&k[..], &v.as_bytes()[..]), (&b"\x01k"[..], &b"text"[..]));
        assert_eq!(out[0].original.to_string(), "orders-2@10");
        assert_eq!(out[0].headers.len(), 1, "headers are shared as before");
        // Shared conversion leaves the raw record its bytes.
        let kept = raw(b"k", b"text");
        converter.convert_into(&kept, &mut out).expect("converts");
        assert!(kept.value.is_some());
        let Value::String(v) = &out[1].value else {
            panic!("not a string")
        };
        assert!(!v.as_bytes().is_unique());
    }

    #[test]
    fn owned_conversion_fails_as_shared_conversion_does() {
        let converter = RecordConverter::from_config(
            &config(&[("value.converter", "string")]),
            &ConfigMap::new(),
        )
        .expect("valid");
        let mut bad = raw(b"k", b"\xff\xfe");
        let shared = converter
            .convert_into(&bad, &mut Vec::new())
            .expect_err("not UTF-8");
        let owned = converter
            .convert_owned_into(&mut bad, &mut Vec::new())
            .expect_err("not UTF-8");
        assert_eq!(owned.stage(), Stage::ValueConverter);
        assert_eq!(owned.to_string(), shared.to_string());
    }

    /// A converter read only through its trait: the oracle for what an inline read must give.
    #[derive(Debug)]
    struct ThroughTheTrait(Box<dyn Converter>);

    impl Converter for ThroughTheTrait {
        fn name(&self) -> &'static str {
            self.0.name()
        }
        fn to_connect(
            &self,
            topic: &str,
            data: Option<&[u8]>,
        ) -> Result<SchemaAndValue, ConvertError> {
            self.0.to_connect(topic, data)
        }
        fn to_connect_shared(
            &self,
            topic: &str,
            data: Option<&Bytes>,
        ) -> Result<SchemaAndValue, ConvertError> {
            self.0.to_connect_shared(topic, data)
        }
        fn to_connect_owned(
            &self,
            topic: &str,
            data: Option<Bytes>,
        ) -> Result<SchemaAndValue, ConvertError> {
            self.0.to_connect_owned(topic, data)
        }
        fn from_connect(
            &self,
            topic: &str,
            schema: Option<&Schema>,
            value: &Value,
        ) -> Result<Option<Bytes>, ConvertError> {
            self.0.from_connect(topic, schema, value)
        }
    }

    #[test]
    fn records_read_inline_are_what_the_converters_make_of_them() {
        let build = |kind: ConverterKind, part| {
            kind.build(part, &ConfigMap::new(), "")
                .expect("a built-in converter")
        };
        let kinds = [ConverterKind::String, ConverterKind::ByteArray];
        let parts: [Option<&[u8]>; 5] = [
            None,
            Some(b""),
            Some(b"plain ascii, longer than one word of eight"),
            Some("h\u{e9}llo, UTF-8 that is not ASCII".as_bytes()),
            Some(b"\xff\xfe not UTF-8"),
        ];
        for (key_kind, value_kind) in kinds
            .iter()
            .flat_map(|k| kinds.iter().map(move |v| (*k, *v)))
        {
            let inline = RecordConverter::new(
                build(key_kind, RecordPart::Key),
                build(value_kind, RecordPart::Value),
            );
            assert!(
                inline.passes.is_some(),
                "{key_kind:?} and {value_kind:?} pass through"
            );
            let oracle = RecordConverter::new(
                Box::new(ThroughTheTrait(build(key_kind, RecordPart::Key))),
                Box::new(ThroughTheTrait(build(value_kind, RecordPart::Value))),
            );
            assert!(oracle.passes.is_none());
            for key in parts {
                for value in parts {
                    let mut record = RawRecord::new("orders", 1, 7);
                    record.key = key.map(Bytes::copy_from_slice);
                    record.value = value.map(Bytes::copy_from_slice);
                    let case = format!("{key_kind:?} {key:?}, {value_kind:?} {value:?}");
                    let read = |converter: &RecordConverter, owned: bool| {
                        let mut out = Vec::new();
                        let mut raw = record.clone();
                        let result = if owned {
                            converter.convert_owned_into(&mut raw, &mut out)
                        } else {
                            converter.convert_into(&raw, &mut out)
                        };
                        result
                            .map(|()| {
                                let r = out.pop().expect("one record");
                                (r.key_schema, r.key, r.value_schema, r.value)
                            })
                            .map_err(|e| e.to_string())
                    };
                    for owned in [false, true] {
                        assert_eq!(
                            read(&inline, owned),
                            read(&oracle, owned),
                            "{case}, owned {owned}"
                        );
                    }
                    if key == Some(b"\xff\xfe not UTF-8") && key_kind == ConverterKind::String {
                        assert!(read(&inline, true).is_err(), "{case}: refused, not passed");
                    }
                }
            }
        }
        let json = RecordConverter::from_config(
            &config(&[("key.converter", "string"), ("value.converter", "json")]),
            &ConfigMap::new(),
        )
        .expect("valid");
        assert!(
            json.passes.is_none(),
            "a converter that parses reads through its trait"
        );
    }

    #[test]
    fn a_bad_value_reports_the_value_converter_stage() {
        let converter = RecordConverter::from_config(
            &config(&[("value.converter", "json")]),
            &ConfigMap::new(),
        )
        .expect("valid");
        let err = converter
            .to_sink_record(raw(b"k", b"not json"))
            .expect_err("malformed");
        assert_eq!(err.stage(), Stage::ValueConverter);
    }
}
