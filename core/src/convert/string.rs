//! The string converter (Connect's `StringConverter`): bytes are UTF-8 text with an optional
//! string schema; writing turns any value into its text form.

use bytes::Bytes;

use crate::convert::{converter_key, Converter, PassThrough, SchemaAndValue};
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
    /// `data` as text, or the error naming the topic and the fix. ASCII is checked a word at
    /// a time first ([`is_ascii_text`]); other text goes through `str::from_utf8`.
    /// Inlined, so that ASCII text costs no call and no result passed through memory.
    #[inline]
    fn checked<'a>(&self, topic: &str, data: &'a [u8]) -> Result<&'a str, ConvertError> {
        if is_ascii_text(data) {
            // SAFETY: ASCII is UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(data) });
        }
        self.checked_utf8(topic, data)
    }

    /// [`checked`](Self::checked) for text that is not all ASCII.
    #[inline(never)]
    fn checked_utf8<'a>(&self, topic: &str, data: &'a [u8]) -> Result<&'a str, ConvertError> {
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

/// Whether every byte of `data` is ASCII: 32 bytes per step through unaligned 8-byte words,
/// then the words and bytes left. Record-sized text (issue 18) costs about half of
/// `str::from_utf8`, which goes byte by byte up to an aligned word and after the last block
/// of 16, and a third of `<[u8]>::is_ascii` (bench/README.md, "An ASCII pass before UTF-8").
#[inline]
pub(crate) fn is_ascii_text(data: &[u8]) -> bool {
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let word = |bytes: &[u8]| u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
    let mut seen = 0u64;
    let mut blocks = data.chunks_exact(32);
    for b in &mut blocks {
        seen |= word(&b[..8]) | word(&b[8..16]) | word(&b[16..24]) | word(&b[24..]);
    }
    let mut words = blocks.remainder().chunks_exact(8);
    for w in &mut words {
        seen |= word(w);
    }
    let rest = words.remainder();
    if rest.len() >= 4 {
        // Two 4-byte reads that overlap cover 4 to 7 bytes.
        let half = |bytes: &[u8]| u32::from_ne_bytes(bytes.try_into().expect("4 bytes"));
        seen |= u64::from(half(&rest[..4]) | half(&rest[rest.len() - 4..]));
    } else {
        for &b in rest {
            seen |= u64::from(b);
        }
    }
    seen & HIGH_BITS == 0
}

/// Bytes the converter owns as its text: taken over, not copied or shared.
///
/// # Safety
/// `data` is `None` or UTF-8.
#[inline(always)]
pub(super) unsafe fn text_and_schema_unchecked(data: Option<Bytes>) -> SchemaAndValue {
    let value = match data {
        // SAFETY: UTF-8, as the caller promises.
        Some(d) => Value::String(unsafe { Text::from_bytes_unchecked(d) }),
        None => Value::Null,
    };
    SchemaAndValue::new(Some(optional_string_schema()), value)
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

    fn to_connect_owned(
        &self,
        topic: &str,
        data: Option<Bytes>,
    ) -> Result<SchemaAndValue, ConvertError> {
        if let Some(d) = &data {
            self.checked(topic, d)?;
        }
        // SAFETY: checked as UTF-8 just above.
        Ok(unsafe { text_and_schema_unchecked(data) })
    }

    fn pass_through(&self) -> Option<PassThrough> {
        Some(PassThrough::Text)
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
    fn the_ascii_pass_finds_a_high_byte_at_any_length_and_position() {
        for len in 0..=100usize {
            let text: Vec<u8> = (0..len).map(|i| b' ' + (i % 95) as u8).collect();
            assert!(is_ascii_text(&text), "all ASCII, {len} bytes");
            for at in 0..len {
                for high in [0x80u8, 0xc3, 0xff] {
                    let mut t = text.clone();
                    t[at] = high;
                    assert!(!is_ascii_text(&t), "{high:#x} at {at} of {len}");
                    assert_eq!(is_ascii_text(&t), t.is_ascii());
                }
            }
        }
    }

    #[test]
    fn text_past_the_ascii_pass_is_still_checked_as_utf8() {
        // Each length puts the byte in another of the pass's steps: block, word, tail.
        for len in [3usize, 7, 12, 31, 45, 100] {
            let mut valid = "a".repeat(len).into_bytes();
            valid.extend_from_slice("é".as_bytes());
            let got = converter().to_connect_shared("t", Some(&Bytes::from(valid.clone())));
            let expected = String::from_utf8(valid.clone()).unwrap();
            assert_eq!(got.expect("UTF-8").value, Value::from(expected.as_str()));
            let mut invalid = valid;
            invalid.pop();
            let err = converter()
                .to_connect_shared("t", Some(&Bytes::from(invalid)))
                .expect_err("a cut sequence is not UTF-8");
            assert!(err.to_string().contains("not UTF-8"), "{err}");
        }
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
