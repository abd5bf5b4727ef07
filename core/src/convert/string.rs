//! The string converter (Connect's `StringConverter`): bytes are UTF-8 text with an optional
//! string schema; writing turns any value into its text form.

use bytes::Bytes;

use crate::convert::{converter_key, Converter, SchemaAndValue};
use crate::data::{Text, Value};
use crate::error::{ConvertError, RecordPart};
use crate::schema::{optional_string_schema, Schema};

#[derive(Debug, Clone)]
pub struct StringConverter {
    part: RecordPart,
}

impl StringConverter {
    pub fn new(part: RecordPart) -> Self {
        StringConverter { part }
    }
}

impl StringConverter {
    /// `data` as text, or the error naming the topic and the fix. `str::from_utf8` rather
    /// than `Text::try_from`, whose ASCII pre-pass costs more than the whole check for text
    /// of record size.
    fn checked<'a>(&self, topic: &str, data: &'a [u8]) -> Result<&'a str, ConvertError> {
        std::str::from_utf8(data).map_err(|e| ConvertError::Deserialize {
            converter: "string",
            part: self.part,
            topic: topic.to_owned(),
            detail: format!(
                "the bytes are not UTF-8 ({e}); use {}=bytearray to pass them through",
                converter_key(self.part)
            ),
        })
    }
}

impl Converter for StringConverter {
    fn name(&self) -> &'static str {
        "string"
    }

    /// Invalid UTF-8 is refused rather than replaced, so no byte is silently lost.
    fn to_connect(&self, topic: &str, data: Option<&[u8]>) -> Result<SchemaAndValue, ConvertError> {
        let schema = Some(optional_string_schema());
        let Some(data) = data else {
            return Ok(SchemaAndValue::new(schema, Value::Null));
        };
        let text = self.checked(topic, data)?;
        Ok(SchemaAndValue::new(schema, Value::String(text.into())))
    }

    /// The text shares the record's buffer: no copy, no allocation (issue 18).
    fn to_connect_shared(
        &self,
        topic: &str,
        data: Option<&Bytes>,
    ) -> Result<SchemaAndValue, ConvertError> {
        let schema = Some(optional_string_schema());
        let Some(data) = data else {
            return Ok(SchemaAndValue::new(schema, Value::Null));
        };
        self.checked(topic, data)?;
        // SAFETY: checked as UTF-8 just above.
        let text = unsafe { Text::from_bytes_unchecked(data.clone()) };
        Ok(SchemaAndValue::new(schema, Value::String(text)))
    }

    /// Strings are written as they are, bytes unchanged, anything else in its text form.
    fn from_connect(
        &self,
        _topic: &str,
        _schema: Option<&Schema>,
        value: &Value,
    ) -> Result<Option<Bytes>, ConvertError> {
        Ok(match value {
            Value::Null => None,
            Value::String(s) => Some(s.as_bytes().clone()),
            Value::Bytes(b) => Some(b.clone()),
            other => Some(Bytes::from(other.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Struct;

    fn converter() -> StringConverter {
        StringConverter::new(RecordPart::Value)
    }

    #[test]
    fn utf8_bytes_read_as_an_optional_string() {
        let got = converter()
            .to_connect("t", Some("héllo".as_bytes()))
            .expect("UTF-8");
        assert_eq!(got.schema.as_deref(), Some(&Schema::string().optional()));
        assert_eq!(got.value, Value::from("héllo"));
    }

    #[test]
    fn null_bytes_read_as_null() {
        assert_eq!(
            converter().to_connect("t", None).expect("null").value,
            Value::Null
        );
    }

    #[test]
    fn invalid_utf8_is_refused_with_the_fix() {
        let err = converter()
            .to_connect("raw", Some(&[0x66, 0xff]))
            .expect_err("not UTF-8");
        let message = err.to_string();
        assert!(message.starts_with("string converter cannot read the value of a record from topic 'raw': the bytes are not UTF-8"), "{message}");
        assert!(message.ends_with("use value.converter=bytearray to pass them through"));
    }

    #[test]
    fn long_text_is_checked_whole_and_a_late_bad_byte_is_placed() {
        let c = converter();
        // Longer than a vector block, with code points across block boundaries.
        let text = "añ€😀".repeat(40);
        let got = c
            .to_connect_shared("t", Some(&Bytes::from(text.clone())))
            .expect("UTF-8");
        assert_eq!(got.value, Value::String(text.as_str().into()));
        let mut bad = text.into_bytes();
        // The first byte of the last code point (a four-byte one).
        let at = bad.len() - 4;
        bad[at] = 0xff;
        let err = c
            .to_connect_shared("raw", Some(&Bytes::from(bad)))
            .expect_err("a bad byte near the end");
        assert!(
            err.to_string().contains(&format!("from index {at}")),
            "{err}"
        );
    }

    #[test]
    fn a_record_s_text_shares_its_buffer_both_ways() {
        let c = converter();
        let raw = Bytes::from("héllo wörld".to_owned());
        let got = c.to_connect_shared("t", Some(&raw)).expect("UTF-8");
        let Value::String(text) = &got.value else {
            panic!("{:?}", got.value)
        };
        assert_eq!(&text[..], "héllo wörld");
        assert_eq!(
            text.as_ptr(),
            raw.as_ptr(),
            "the text is the record's bytes"
        );
        let written = c.from_connect("t", None, &got.value).expect("text");
        assert_eq!(written.as_deref().map(<[u8]>::as_ptr), Some(raw.as_ptr()));
        let err = c
            .to_connect_shared("raw", Some(&Bytes::from_static(&[0x66, 0xc3])))
            .expect_err("a cut code point");
        assert!(err.to_string().contains("the bytes are not UTF-8"), "{err}");
        assert_eq!(
            c.to_connect_shared("t", None).expect("null").value,
            Value::Null
        );
    }

    #[test]
    fn any_value_writes_as_its_text() {
        let c = converter();
        assert_eq!(
            c.from_connect("t", None, &"x".into()),
            Ok(Some(Bytes::from("x")))
        );
        assert_eq!(
            c.from_connect("t", None, &Value::Int64(42)),
            Ok(Some(Bytes::from("42")))
        );
        let s = Value::Struct(Struct::new().with("a", 1.into()));
        assert_eq!(
            c.from_connect("t", None, &s),
            Ok(Some(Bytes::from("Struct{a=1}")))
        );
        assert_eq!(c.from_connect("t", None, &Value::Null), Ok(None));
    }
}
