//! Header values between Kafka bytes and Connect values. Incoming headers stay bytes (no
//! header converter guesses at their type), so a sink that writes Kafka records again
//! reproduces them exactly; headers that transforms set from fields are written in text form,
//! with containers as JSON, like Connect's `SimpleHeaderConverter`.

use bytes::Bytes;

use crate::convert::json_value::value_to_json_schemaless;
use crate::data::Value;
use crate::error::{ConvertError, RecordPart};
use crate::record::Header;

/// Raw headers as Connect headers: each value as `Bytes` (or `Null`), without a schema.
pub fn headers_to_connect(raw: &[(String, Option<Bytes>)]) -> Vec<Header> {
    // Most records carry none: an empty list without building a mapping iterator for it.
    if raw.is_empty() {
        return Vec::new();
    }
    raw.iter()
        .map(|(key, value)| {
            let value = match value {
                Some(b) => Value::Bytes(b.clone()),
                None => Value::Null,
            };
            Header::new(key.clone(), None, value)
        })
        .collect()
}

/// The bytes to write for a header.
pub fn header_from_connect(topic: &str, header: &Header) -> Result<Option<Bytes>, ConvertError> {
    Ok(match &header.value {
        Value::Null => None,
        Value::Bytes(b) => Some(b.clone()),
        Value::String(s) => Some(s.as_bytes().clone()),
        v @ (Value::Array(_) | Value::Map(_) | Value::Struct(_)) => {
            let json = value_to_json_schemaless(v).map_err(|detail| ConvertError::Serialize {
                converter: "header",
                part: RecordPart::Header,
                topic: topic.to_owned(),
                detail: format!("header '{}': {detail}", header.key),
            })?;
            Some(Bytes::from(json.to_string()))
        }
        other => Some(Bytes::from(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_header_bytes_survive_a_round_trip() {
        let raw = vec![
            (
                "traceparent".to_owned(),
                Some(Bytes::from_static(b"\x00-abc")),
            ),
            ("empty".to_owned(), None),
        ];
        let headers = headers_to_connect(&raw);
        let back: Vec<_> = headers
            .iter()
            .map(|h| {
                (
                    h.key.clone(),
                    header_from_connect("t", h).expect("writable"),
                )
            })
            .collect();
        assert_eq!(back, raw);
    }

    #[test]
    fn typed_header_values_are_written_as_text_and_containers_as_json() {
        let int = Header::new("n", None, Value::Int32(5));
        assert_eq!(header_from_connect("t", &int), Ok(Some(Bytes::from("5"))));
        let map = Header::new("m", None, Value::string_map([("a", Value::Boolean(true))]));
        assert_eq!(
            header_from_connect("t", &map),
            Ok(Some(Bytes::from(r#"{"a":true}"#)))
        );
    }
}
