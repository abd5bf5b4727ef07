//! The byte-array converter (Connect's `ByteArrayConverter`): bytes pass through untouched,
//! the natural choice for Kafka-to-Kafka copies.

use bytes::Bytes;

use crate::convert::{Converter, PassThrough, SchemaAndValue};
use crate::data::Value;
use crate::error::{ConvertError, RecordPart};
use crate::schema::{optional_bytes_schema, Schema, SchemaType};

#[derive(Debug, Clone)]
pub struct ByteArrayConverter {
    part: RecordPart,
}

impl ByteArrayConverter {
    pub fn new(part: RecordPart) -> Self {
        ByteArrayConverter { part }
    }
}

/// Bytes the converter owns as its value: taken over, not copied or shared.
#[inline(always)]
pub(super) fn bytes_and_schema(data: Option<Bytes>) -> SchemaAndValue {
    let value = match data {
        Some(d) => Value::Bytes(d),
        None => Value::Null,
    };
    SchemaAndValue::new(Some(optional_bytes_schema()), value)
}

impl Converter for ByteArrayConverter {
    fn name(&self) -> &'static str {
        "bytearray"
    }

    fn to_connect(
        &self,
        _topic: &str,
        data: Option<&[u8]>,
    ) -> Result<SchemaAndValue, ConvertError> {
        let value = match data {
            Some(d) => Value::Bytes(Bytes::copy_from_slice(d)),
            None => Value::Null,
        };
        Ok(SchemaAndValue::new(Some(optional_bytes_schema()), value))
    }

    /// The record's bytes shared, not copied (Connect's converter also hands back the array
    /// it was given): no allocation per key or value.
    fn to_connect_shared(
        &self,
        _topic: &str,
        data: Option<&Bytes>,
    ) -> Result<SchemaAndValue, ConvertError> {
        // A match, not `map_or`: that built the `Null` first and dropped it for every key and
        // value that was there (issue 18).
        let value = match data {
            Some(d) => Value::Bytes(d.clone()),
            None => Value::Null,
        };
        Ok(SchemaAndValue::new(Some(optional_bytes_schema()), value))
    }

    fn to_connect_owned(
        &self,
        _topic: &str,
        data: Option<Bytes>,
    ) -> Result<SchemaAndValue, ConvertError> {
        Ok(bytes_and_schema(data))
    }

    fn pass_through(&self) -> Option<PassThrough> {
        Some(PassThrough::Bytes)
    }

    /// Only bytes (or null) can be written; a transform that changed the type needs another
    /// converter.
    fn from_connect(
        &self,
        topic: &str,
        schema: Option<&Schema>,
        value: &Value,
    ) -> Result<Option<Bytes>, ConvertError> {
        let error = |detail: String| ConvertError::Serialize {
            converter: "bytearray",
            part: self.part,
            topic: topic.to_owned(),
            detail,
        };
        if let Some(s) = schema {
            // A variant test: the derived `!=` was a call per key and per value (issue 18).
            if !matches!(s.kind, SchemaType::Bytes) {
                return Err(error(format!(
                    "the schema is {s}, not BYTES; use the json or string converter for such data"
                )));
            }
        }
        match value {
            Value::Null => Ok(None),
            Value::Bytes(b) => Ok(Some(b.clone())),
            other => Err(error(format!(
                "expected bytes but the value is {} '{other}'; use the json or string converter for such data",
                other.type_name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_through_unchanged_both_ways() {
        let c = ByteArrayConverter::new(RecordPart::Value);
        let raw = b"\x00\x01\xffanything";
        let got = c.to_connect("t", Some(raw)).expect("any bytes");
        assert_eq!(got.schema.as_deref(), Some(&Schema::bytes().optional()));
        let back = c
            .from_connect("t", got.schema.as_deref(), &got.value)
            .expect("bytes");
        assert_eq!(back.as_deref(), Some(&raw[..]));
    }

    #[test]
    fn bytes_read_from_a_record_share_its_buffer() {
        let c = ByteArrayConverter::new(RecordPart::Value);
        let raw = Bytes::from_static(b"\x00\x01\xffanything");
        let got = c.to_connect_shared("t", Some(&raw)).expect("any bytes");
        assert_eq!(got, c.to_connect("t", Some(&raw)).expect("any bytes"));
        let Value::Bytes(shared) = &got.value else {
            panic!("not bytes: {:?}", got.value);
        };
        assert_eq!(shared.as_ptr(), raw.as_ptr(), "shared, not copied");
        assert_eq!(
            c.to_connect_shared("t", None).expect("null").value,
            Value::Null
        );
    }

    #[test]
    fn null_stays_null() {
        let c = ByteArrayConverter::new(RecordPart::Key);
        assert_eq!(c.to_connect("t", None).expect("null").value, Value::Null);
        assert_eq!(c.from_connect("t", None, &Value::Null), Ok(None));
    }

    #[test]
    fn non_bytes_values_are_refused_naming_the_value() {
        let c = ByteArrayConverter::new(RecordPart::Value);
        let err = c
            .from_connect("t", None, &Value::Int32(3))
            .expect_err("not bytes");
        assert_eq!(
            err.to_string(),
            "bytearray converter cannot write the value of a record for topic 't': expected bytes but the value is int32 '3'; use the json or string converter for such data"
        );
        let err = c
            .from_connect("t", Some(&Schema::string()), &Value::Bytes(Bytes::new()))
            .expect_err("schema is not bytes");
        assert!(err.to_string().contains("the schema is STRING, not BYTES"));
    }
}
