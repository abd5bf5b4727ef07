//! Connect's data model: the values a converter produces and a sink receives.
//!
//! A [`Value`] is schemaless on its own; the record keeps the matching [`Schema`](crate::Schema)
//! beside it when there is one. Structs keep their field order (it is part of the schema), and
//! maps keep insertion order so that a JSON object converts back to the same text.

use std::fmt;

use bytes::Bytes;
/// UTF-8 text in a shared buffer: the string converter's values share the record's bytes
/// instead of a copy each (issue 18), and cloning one copies no text.
pub use bytestring::ByteString as Text;

/// One Connect value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Boolean(bool),
    Int8(i8),
    Int16(i16),
    Int32(i32),
    Int64(i64),
    Float32(f32),
    Float64(f64),
    String(Text),
    Bytes(Bytes),
    Array(Vec<Value>),
    /// Key/value pairs in insertion order; keys may be any value, as in Connect.
    Map(Vec<(Value, Value)>),
    Struct(Struct),
}

/// A struct's fields in schema order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Struct {
    fields: Vec<(String, Value)>,
}

impl Struct {
    pub fn new() -> Self {
        Struct::default()
    }

    /// Sets `name` to `value`, replacing an existing field of that name in place.
    pub fn put(&mut self, name: impl Into<String>, value: Value) -> &mut Self {
        let name = name.into();
        match self.fields.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((name, value)),
        }
        self
    }

    /// Builder form of [`Struct::put`].
    pub fn with(mut self, name: impl Into<String>, value: Value) -> Self {
        self.put(name, value);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Removes and returns the field called `name`.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        let index = self.fields.iter().position(|(n, _)| n == name)?;
        Some(self.fields.remove(index).1)
    }

    pub fn fields(&self) -> &[(String, Value)] {
        &self.fields
    }

    pub fn into_fields(self) -> Vec<(String, Value)> {
        self.fields
    }
}

impl FromIterator<(String, Value)> for Struct {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut s = Struct::new();
        for (name, value) in iter {
            s.put(name, value);
        }
        s
    }
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// A schemaless map with string keys, built from `(name, value)` pairs.
    pub fn string_map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::String(k.into().into()), v))
                .collect(),
        )
    }

    /// The value stored under the string key `key` of a map.
    pub fn map_get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| matches!(k, Value::String(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Lower-case type name used in messages (`int32`, `map`, `null`).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Boolean(_) => "boolean",
            Value::Int8(_) => "int8",
            Value::Int16(_) => "int16",
            Value::Int32(_) => "int32",
            Value::Int64(_) => "int64",
            Value::Float32(_) => "float32",
            Value::Float64(_) => "float64",
            Value::String(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
            Value::Struct(_) => "struct",
        }
    }

    /// The value as an `i64` when it is any integer type.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int8(v) => Some(v.into()),
            Value::Int16(v) => Some(v.into()),
            Value::Int32(v) => Some(v.into()),
            Value::Int64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an `f64` when it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float32(v) => Some(v.into()),
            Value::Float64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
}

impl fmt::Display for Value {
    /// Text form in the spirit of Connect's `toString()`: strings bare, structs as
    /// `Struct{a=1,b=x}`, maps as `{k=v}`, arrays as `[a, b]`, bytes as base64.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Boolean(v) => write!(f, "{v}"),
            Value::Int8(v) => write!(f, "{v}"),
            Value::Int16(v) => write!(f, "{v}"),
            Value::Int32(v) => write!(f, "{v}"),
            Value::Int64(v) => write!(f, "{v}"),
            Value::Float32(v) => write!(f, "{v:?}"),
            Value::Float64(v) => write!(f, "{v:?}"),
            Value::String(v) => f.write_str(v),
            Value::Bytes(v) => {
                use base64::Engine as _;
                f.write_str(&base64::engine::general_purpose::STANDARD.encode(v))
            }
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Value::Map(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}={v}")?;
                }
                f.write_str("}")
            }
            Value::Struct(s) => {
                f.write_str("Struct{")?;
                for (i, (k, v)) in s.fields().iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k}={v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.into())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v.into())
    }
}
impl From<Text> for Value {
    fn from(v: Text) -> Self {
        Value::String(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Boolean(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int32(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int64(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float64(v)
    }
}
impl From<Struct> for Value {
    fn from(v: Struct) -> Self {
        Value::Struct(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_put_replaces_existing_field_in_place() {
        let mut s = Struct::new().with("a", 1.into()).with("b", 2.into());
        s.put("a", 3.into());
        assert_eq!(
            s.fields(),
            &[
                ("a".to_owned(), Value::Int32(3)),
                ("b".to_owned(), 2.into())
            ]
        );
    }

    #[test]
    fn map_get_finds_string_keys_only() {
        let map = Value::Map(vec![
            (Value::Int32(1), "one".into()),
            ("k".into(), "v".into()),
        ]);
        assert_eq!(map.map_get("k"), Some(&Value::from("v")));
        assert_eq!(map.map_get("1"), None);
    }

    #[test]
    fn display_renders_nested_values_like_connect_to_string() {
        let value = Value::Struct(
            Struct::new()
                .with("id", 7.into())
                .with("tags", Value::Array(vec!["a".into(), "b".into()]))
                .with("attrs", Value::string_map([("x", Value::Boolean(true))])),
        );
        assert_eq!(value.to_string(), "Struct{id=7,tags=[a, b],attrs={x=true}}");
    }

    #[test]
    fn integer_values_widen_to_i64_and_f64() {
        assert_eq!(Value::Int8(-3).as_i64(), Some(-3));
        assert_eq!(Value::Int16(300).as_f64(), Some(300.0));
        assert_eq!(Value::String("1".into()).as_i64(), None);
    }
}
