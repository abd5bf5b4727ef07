//! The header transforms: `InsertHeader` (a literal header), `DropHeaders` (by key), and
//! `HeaderFrom` (copy or move key/value fields into headers).

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::data::{Struct, Value};
use crate::error::{ConfigError, TransformError};
use crate::record::{Header, SinkRecord};
use crate::schema::Schema;
use crate::transforms::side::{key_str, map_get, require_map, require_struct, with_fields, Side};
use crate::transforms::Transformation;

/// Adds a header with a literal string value.
#[derive(Debug, Clone)]
pub struct InsertHeader {
    header: String,
    value: String,
}

impl InsertHeader {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(
                    "header",
                    ConfigType::String,
                    Importance::High,
                    "Name of the header to add.",
                )
                .validator(Validator::NonEmptyString),
            )
            .define(ConfigKey::new(
                "value.literal",
                ConfigType::String,
                Importance::High,
                "The header's value (a string).",
            ))
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = InsertHeader::config_def().parse_prefixed(settings, prefix)?;
        Ok(InsertHeader {
            header: parsed.string("header")?.unwrap_or_default().to_owned(),
            value: parsed
                .string("value.literal")?
                .unwrap_or_default()
                .to_owned(),
        })
    }
}

impl Transformation for InsertHeader {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        record.headers.push(Header::new(
            self.header.clone(),
            Some(Schema::string()),
            Value::String(self.value.as_str().into()),
        ));
        Ok(Some(record))
    }
}

/// Removes every header whose key is listed.
#[derive(Debug, Clone)]
pub struct DropHeaders {
    headers: Vec<String>,
}

impl DropHeaders {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new(
                "headers",
                ConfigType::List,
                Importance::High,
                "Header keys to remove.",
            )
            .validator(Validator::NonEmptyList),
        )
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = DropHeaders::config_def().parse_prefixed(settings, prefix)?;
        Ok(DropHeaders {
            headers: parsed.list("headers")?.to_vec(),
        })
    }
}

impl Transformation for DropHeaders {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        record.headers.retain(|h| !self.headers.contains(&h.key));
        Ok(Some(record))
    }
}

/// Whether `HeaderFrom` leaves the fields in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Copy,
    Move,
}

/// Copies (or moves) fields of the key or value into headers, pairwise by position.
#[derive(Debug, Clone)]
pub struct HeaderFrom {
    side: Side,
    pairs: Vec<(String, String)>,
    operation: Operation,
}

impl HeaderFrom {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(
                    "fields",
                    ConfigType::List,
                    Importance::High,
                    "Fields to read, in the order of headers.",
                )
                .validator(Validator::NonEmptyList),
            )
            .define(
                ConfigKey::new(
                    "headers",
                    ConfigType::List,
                    Importance::High,
                    "Header names, one per field.",
                )
                .validator(Validator::NonEmptyList),
            )
            .define(
                ConfigKey::new(
                    "operation",
                    ConfigType::String,
                    Importance::High,
                    "copy keeps the fields; move removes them.",
                )
                .validator(Validator::OneOf(&["copy", "move"])),
            )
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = HeaderFrom::config_def().parse_prefixed(settings, prefix)?;
        let fields = parsed.list("fields")?;
        let headers = parsed.list("headers")?;
        if fields.len() != headers.len() {
            return Err(ConfigError::Conflict(format!(
                "{prefix}fields lists {} field(s) but {prefix}headers lists {} header(s); list one header per field",
                fields.len(),
                headers.len()
            )));
        }
        let operation = match parsed.string("operation")? {
            Some(op) if op.eq_ignore_ascii_case("move") => Operation::Move,
            _ => Operation::Copy,
        };
        Ok(HeaderFrom {
            side,
            pairs: fields
                .iter()
                .cloned()
                .zip(headers.iter().cloned())
                .collect(),
            operation,
        })
    }

    fn fail(&self, detail: String) -> TransformError {
        TransformError::new(format!("HeaderFrom${}", self.side.suffix()), detail)
    }

    fn moves(&self, field: &str) -> bool {
        self.operation == Operation::Move && self.pairs.iter().any(|(f, _)| f == field)
    }
}

impl Transformation for HeaderFrom {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record);
        if value.is_null() {
            return Ok(Some(record));
        }
        let mut headers = Vec::with_capacity(self.pairs.len());
        match self.side.schema(&record).cloned() {
            None => {
                let entries =
                    require_map(value, "copying fields to headers").map_err(|e| self.fail(e))?;
                for (field, header) in &self.pairs {
                    let v = map_get(entries, field).cloned().unwrap_or(Value::Null);
                    headers.push(Header::new(header.clone(), None, v));
                }
                if self.operation == Operation::Move {
                    let kept = entries
                        .iter()
                        .filter(|(k, _)| key_str(k).is_none_or(|k| !self.moves(k)))
                        .cloned()
                        .collect();
                    self.side.set(&mut record, None, Value::Map(kept));
                }
            }
            Some(schema) => {
                let s =
                    require_struct(value, "copying fields to headers").map_err(|e| self.fail(e))?;
                for (field, header) in &self.pairs {
                    let field_schema = schema
                        .field(field)
                        .ok_or_else(|| {
                            self.fail(format!(
                                "field '{field}' is not in the {} schema {schema}",
                                self.side
                            ))
                        })?
                        .schema
                        .clone();
                    let v = s.get(field).cloned().unwrap_or(Value::Null);
                    headers.push(Header::new(header.clone(), Some(field_schema), v));
                }
                if self.operation == Operation::Move {
                    let fields = schema
                        .fields()
                        .iter()
                        .filter(|f| !self.moves(&f.name))
                        .cloned()
                        .collect();
                    let kept: Struct = s
                        .fields()
                        .iter()
                        .filter(|(n, _)| !self.moves(n))
                        .cloned()
                        .collect();
                    self.side.set(
                        &mut record,
                        Some(with_fields(&schema, fields)),
                        Value::Struct(kept),
                    );
                }
            }
        }
        record.headers.extend(headers);
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Field;
    use crate::schema::SchemaRef;
    use crate::transforms::testkit::config;
    use bytes::Bytes;

    #[test]
    fn insert_header_adds_a_string_header() {
        let t = InsertHeader::configure(
            &config(&[("header", "source"), ("value.literal", "spillway")]),
            "",
        )
        .expect("valid");
        let out = t
            .apply(SinkRecord::new("t", 0, 0, Value::Null))
            .expect("any")
            .expect("kept");
        assert_eq!(
            out.header("source").map(|h| &h.value),
            Some(&Value::from("spillway"))
        );
    }

    #[test]
    fn drop_headers_removes_every_header_with_a_listed_key() {
        let t = DropHeaders::configure(&config(&[("headers", "a,b")]), "").expect("valid");
        let mut r = SinkRecord::new("t", 0, 0, Value::Null);
        for key in ["a", "c", "a", "b"] {
            r.headers.push(Header::new(
                key,
                None,
                Value::Bytes(Bytes::from_static(b"x")),
            ));
        }
        let out = t.apply(r).expect("any").expect("kept");
        assert_eq!(
            out.headers
                .iter()
                .map(|h| h.key.as_str())
                .collect::<Vec<_>>(),
            vec!["c"]
        );
    }

    #[test]
    fn header_from_copies_map_fields_into_headers() {
        let t = HeaderFrom::configure(
            Side::Value,
            &config(&[
                ("fields", "id,missing"),
                ("headers", "x-id,x-m"),
                ("operation", "copy"),
            ]),
            "",
        )
        .expect("valid");
        let v = Value::string_map([("id", Value::Int64(5))]);
        let out = t
            .apply(SinkRecord::new("t", 0, 0, v.clone()))
            .expect("map")
            .expect("kept");
        assert_eq!(out.value, v, "copy leaves the value alone");
        assert_eq!(out.header("x-id").map(|h| &h.value), Some(&Value::Int64(5)));
        assert_eq!(out.header("x-m").map(|h| &h.value), Some(&Value::Null));
    }

    #[test]
    fn header_from_move_removes_struct_fields_and_keeps_their_schemas_on_headers() {
        let t = HeaderFrom::configure(
            Side::Value,
            &config(&[
                ("fields", "trace"),
                ("headers", "traceparent"),
                ("operation", "move"),
            ]),
            "",
        )
        .expect("valid");
        let mut r = SinkRecord::new(
            "t",
            0,
            0,
            Value::Struct(
                Struct::new()
                    .with("trace", "00-ab".into())
                    .with("n", 1.into()),
            ),
        );
        r.value_schema = Some(SchemaRef::new(Schema::structure(vec![
            Field::new("trace", Schema::string()),
            Field::new("n", Schema::int32()),
        ])));
        let out = t.apply(r).expect("struct").expect("kept");
        assert_eq!(
            out.value_schema,
            Some(SchemaRef::new(Schema::structure(vec![Field::new(
                "n",
                Schema::int32()
            )])))
        );
        assert_eq!(out.value, Value::Struct(Struct::new().with("n", 1.into())));
        let header = out.header("traceparent").expect("moved");
        assert_eq!(
            (header.schema.clone(), header.value.clone()),
            (Some(Schema::string()), Value::from("00-ab"))
        );
    }

    #[test]
    fn header_from_needs_one_header_per_field() {
        let err = HeaderFrom::configure(
            Side::Value,
            &config(&[("fields", "a,b"), ("headers", "h"), ("operation", "copy")]),
            "transforms.hf.",
        )
        .expect_err("mismatch");
        assert_eq!(
            err.to_string(),
            "transforms.hf.fields lists 2 field(s) but transforms.hf.headers lists 1 header(s); list one header per field"
        );
    }

    #[test]
    fn header_from_refuses_an_unknown_operation() {
        let err = HeaderFrom::configure(
            Side::Key,
            &config(&[("fields", "a"), ("headers", "h"), ("operation", "cut")]),
            "",
        )
        .expect_err("bad op");
        assert_eq!(
            err.to_string(),
            "invalid value 'cut' for operation: expected one of copy, move"
        );
    }
}
