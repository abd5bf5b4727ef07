//! What goes on the wire: record values as JSON (through core's JSON converter, schemaless, so
//! the receiver gets plain JSON), joined into one body per batch, and the idempotency key that
//! names the batch's records.

use bytes::Bytes;
use sha2::{Digest, Sha256};
use spillway_core::convert::{Converter, JsonConverter};
use spillway_core::{RecordCoordinates, RecordPart, SinkRecord};

use crate::http::config::BatchFormat;

/// The record's value as JSON text.
pub fn value_json(converter: &JsonConverter, record: &SinkRecord) -> Result<Bytes, String> {
    converter
        .from_connect(&record.topic, record.value_schema.as_deref(), &record.value)
        .map(|json| json.unwrap_or_else(|| Bytes::from_static(b"null")))
        .map_err(|e| e.to_string())
}

/// The converter the sink writes values with: plain JSON, no schema envelope.
pub fn value_converter() -> JsonConverter {
    JsonConverter::new(RecordPart::Value, false)
}

impl BatchFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            BatchFormat::JsonArray => "application/json",
            BatchFormat::Ndjson => "application/x-ndjson",
        }
    }

    /// One body holding every value, in order.
    pub fn encode<'a>(self, values: impl Iterator<Item = &'a Bytes> + Clone) -> Vec<u8> {
        let size: usize = values.clone().map(|v| v.len() + 1).sum();
        let mut body = Vec::with_capacity(size + 2);
        match self {
            BatchFormat::JsonArray => {
                body.push(b'[');
                for (i, value) in values.enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    body.extend_from_slice(value);
                }
                body.push(b']');
            }
            BatchFormat::Ndjson => {
                for value in values {
                    body.extend_from_slice(value);
                    body.push(b'\n');
                }
            }
        }
        body
    }
}

/// The idempotency key of a request: SHA-256 (hex) of the connector name and the coordinates
/// (topic, partition, offset) where each of its records was read. The coordinates are sorted
/// first, so the same records give the same key in any order, on any task, on every delivery.
pub fn idempotency_key<'a>(
    connector: &str,
    records: impl Iterator<Item = &'a RecordCoordinates>,
) -> String {
    let mut coordinates: Vec<&RecordCoordinates> = records.collect();
    coordinates.sort();
    let mut hash = Sha256::new();
    // Lengths before names keep ("ab","c") and ("a","bc") apart.
    hash.update((connector.len() as u64).to_be_bytes());
    hash.update(connector.as_bytes());
    for c in coordinates {
        hash.update((c.topic.len() as u64).to_be_bytes());
        hash.update(c.topic.as_bytes());
        hash.update(c.partition.to_be_bytes());
        hash.update(c.offset.to_be_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::SchemaRef;
    use spillway_core::{Field, Schema, Struct, Value};

    fn coordinates(list: &[(&str, i32, i64)]) -> Vec<RecordCoordinates> {
        list.iter()
            .map(|(t, p, o)| RecordCoordinates::new(*t, *p, *o))
            .collect()
    }

    #[test]
    fn the_same_records_give_the_same_key_in_any_order() {
        let a = coordinates(&[("orders", 0, 5), ("orders", 1, 7), ("orders", 0, 6)]);
        let b = coordinates(&[("orders", 0, 6), ("orders", 0, 5), ("orders", 1, 7)]);
        let key = idempotency_key("sink", a.iter());
        assert_eq!(key, idempotency_key("sink", b.iter()));
        assert_eq!(key.len(), 64);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn other_records_or_another_connector_give_another_key() {
        let a = coordinates(&[("orders", 0, 5)]);
        let offset = coordinates(&[("orders", 0, 6)]);
        let partition = coordinates(&[("orders", 1, 5)]);
        let topic = coordinates(&[("orderz", 0, 5)]);
        let key = idempotency_key("sink", a.iter());
        assert_ne!(key, idempotency_key("sink", offset.iter()));
        assert_ne!(key, idempotency_key("sink", partition.iter()));
        assert_ne!(key, idempotency_key("sink", topic.iter()));
        assert_ne!(key, idempotency_key("other", a.iter()));
    }

    #[test]
    fn the_key_derivation_is_pinned() {
        // Receivers store keys across restarts and upgrades: the derivation must not drift.
        // Expected: SHA-256 of be64(4) "sink" be64(6) "orders" be32(3) be64(42).
        let one = coordinates(&[("orders", 3, 42)]);
        assert_eq!(
            idempotency_key("sink", one.iter()),
            "86d7b1fce8fb4608e6c10ccf02f263e93b60f6eb36f134187f58c6da12bcd880"
        );
    }

    #[test]
    fn json_array_and_ndjson_bodies() {
        let values = [Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"2")];
        assert_eq!(
            BatchFormat::JsonArray.encode(values.iter()),
            b"[{\"a\":1},2]".to_vec()
        );
        assert_eq!(
            BatchFormat::Ndjson.encode(values.iter()),
            b"{\"a\":1}\n2\n".to_vec()
        );
        assert_eq!(BatchFormat::JsonArray.encode([].iter()), b"[]".to_vec());
    }

    #[test]
    fn struct_values_become_plain_json_without_envelope() {
        let mut record = SinkRecord::new(
            "t",
            0,
            0,
            Value::Struct(Struct::new().with("id", 7.into()).with("name", "x".into())),
        );
        record.value_schema = Some(SchemaRef::new(Schema::structure(vec![
            Field::new("id", Schema::int32()),
            Field::new("name", Schema::string()),
        ])));
        assert_eq!(
            value_json(&value_converter(), &record).expect("json"),
            Bytes::from_static(b"{\"id\":7,\"name\":\"x\"}")
        );
    }
}
