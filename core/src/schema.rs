//! Connect's schema: the optional type description that travels beside a key or value.
//!
//! A record's key and value each have an `Option<Schema>`: `None` is Connect's "schemaless"
//! data (plain JSON, maps), `Some` is typed data (structs with named fields). Logical types
//! (`org.apache.kafka.connect.data.Timestamp`, `Date`, `Time`, `Decimal`) are ordinary
//! schemas with a `name`; their values keep their physical type (e.g. `Int64` millis), so
//! converters carry them through without special cases.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, LazyLock};

use crate::data::Value;

/// Name of Connect's timestamp logical type (an `int64` of epoch milliseconds).
pub const TIMESTAMP_LOGICAL_NAME: &str = "org.apache.kafka.connect.data.Timestamp";

/// The shape of a schema; containers hold the schemas of their parts.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaType {
    Boolean,
    Int8,
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    String,
    Bytes,
    /// Array of elements that all follow the inner schema.
    Array(Box<Schema>),
    /// Map from keys of the first schema to values of the second.
    Map(Box<Schema>, Box<Schema>),
    /// Ordered, named fields.
    Struct(Vec<Field>),
}

impl SchemaType {
    /// Connect's upper-case type name (`INT32`, `STRUCT`), as its messages print it.
    pub fn connect_name(&self) -> &'static str {
        match self {
            SchemaType::Boolean => "BOOLEAN",
            SchemaType::Int8 => "INT8",
            SchemaType::Int16 => "INT16",
            SchemaType::Int32 => "INT32",
            SchemaType::Int64 => "INT64",
            SchemaType::Float32 => "FLOAT32",
            SchemaType::Float64 => "FLOAT64",
            SchemaType::String => "STRING",
            SchemaType::Bytes => "BYTES",
            SchemaType::Array(_) => "ARRAY",
            SchemaType::Map(_, _) => "MAP",
            SchemaType::Struct(_) => "STRUCT",
        }
    }

    /// True for everything but arrays, maps and structs.
    pub fn is_primitive(&self) -> bool {
        !matches!(
            self,
            SchemaType::Array(_) | SchemaType::Map(_, _) | SchemaType::Struct(_)
        )
    }
}

/// One named field of a struct schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub schema: Schema,
}

impl Field {
    pub fn new(name: impl Into<String>, schema: Schema) -> Self {
        Field {
            name: name.into(),
            schema,
        }
    }
}

/// A Connect schema: a type plus the metadata the JSON converter's envelope carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub kind: SchemaType,
    /// Whether `null` is a legal value.
    pub optional: bool,
    /// Logical type or record name, e.g. `org.apache.kafka.connect.data.Timestamp`.
    pub name: Option<String>,
    pub version: Option<i32>,
    pub doc: Option<String>,
    pub parameters: BTreeMap<String, String>,
    /// Used in place of a `null` value when the schema is optional.
    pub default: Option<Box<Value>>,
}

/// Connect's `OPTIONAL_STRING_SCHEMA`, shared: the `string` converter gives every key or
/// value this one schema rather than a copy per record.
pub fn optional_string_schema() -> SchemaRef {
    static SCHEMA: LazyLock<Schema> = LazyLock::new(|| Schema::string().optional());
    SchemaRef::fixed(&SCHEMA)
}

/// Connect's `OPTIONAL_BYTES_SCHEMA`, shared as [`optional_string_schema`] is.
pub fn optional_bytes_schema() -> SchemaRef {
    static SCHEMA: LazyLock<Schema> = LazyLock::new(|| Schema::bytes().optional());
    SchemaRef::fixed(&SCHEMA)
}

/// A schema shared between records: a converter's constant schema by a static reference
/// (cloned and dropped without counting, twice per record for a `string` or `bytearray`
/// key and value), any other by a counted [`Arc`]. It reads as the [`Schema`] it holds.
#[derive(Clone)]
pub struct SchemaRef(Held);

#[derive(Clone)]
enum Held {
    Fixed(&'static Schema),
    Shared(Arc<Schema>),
}

impl SchemaRef {
    /// A schema kept for the life of the process (a converter's constant).
    pub fn fixed(schema: &'static Schema) -> Self {
        SchemaRef(Held::Fixed(schema))
    }

    pub fn new(schema: Schema) -> Self {
        SchemaRef(Held::Shared(Arc::new(schema)))
    }

    /// Whether both hold the very same schema (not only an equal one).
    pub fn ptr_eq(a: &SchemaRef, b: &SchemaRef) -> bool {
        std::ptr::eq::<Schema>(&**a, &**b)
    }
}

impl std::ops::Deref for SchemaRef {
    type Target = Schema;

    fn deref(&self) -> &Schema {
        match &self.0 {
            Held::Fixed(schema) => schema,
            Held::Shared(schema) => schema,
        }
    }
}

impl AsRef<Schema> for SchemaRef {
    fn as_ref(&self) -> &Schema {
        self
    }
}

impl PartialEq for SchemaRef {
    fn eq(&self, other: &Self) -> bool {
        SchemaRef::ptr_eq(self, other) || **self == **other
    }
}

impl fmt::Debug for SchemaRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl From<Schema> for SchemaRef {
    fn from(schema: Schema) -> Self {
        SchemaRef::new(schema)
    }
}

impl From<Arc<Schema>> for SchemaRef {
    fn from(schema: Arc<Schema>) -> Self {
        SchemaRef(Held::Shared(schema))
    }
}

impl Schema {
    /// A required schema of the given type with no metadata.
    pub fn new(kind: SchemaType) -> Self {
        Schema {
            kind,
            optional: false,
            name: None,
            version: None,
            doc: None,
            parameters: BTreeMap::new(),
            default: None,
        }
    }

    pub fn boolean() -> Self {
        Schema::new(SchemaType::Boolean)
    }
    pub fn int8() -> Self {
        Schema::new(SchemaType::Int8)
    }
    pub fn int16() -> Self {
        Schema::new(SchemaType::Int16)
    }
    pub fn int32() -> Self {
        Schema::new(SchemaType::Int32)
    }
    pub fn int64() -> Self {
        Schema::new(SchemaType::Int64)
    }
    pub fn float32() -> Self {
        Schema::new(SchemaType::Float32)
    }
    pub fn float64() -> Self {
        Schema::new(SchemaType::Float64)
    }
    pub fn string() -> Self {
        Schema::new(SchemaType::String)
    }
    pub fn bytes() -> Self {
        Schema::new(SchemaType::Bytes)
    }
    pub fn array(items: Schema) -> Self {
        Schema::new(SchemaType::Array(Box::new(items)))
    }
    pub fn map(keys: Schema, values: Schema) -> Self {
        Schema::new(SchemaType::Map(Box::new(keys), Box::new(values)))
    }
    pub fn structure(fields: Vec<Field>) -> Self {
        Schema::new(SchemaType::Struct(fields))
    }
    /// Connect's `Timestamp` logical type: epoch milliseconds in an `int64`.
    pub fn timestamp() -> Self {
        Schema::int64().named(TIMESTAMP_LOGICAL_NAME)
    }

    /// This schema, allowing `null`.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// This schema with a name (record name or logical type).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// This schema with a default value.
    pub fn with_default(mut self, default: Value) -> Self {
        self.default = Some(Box::new(default));
        self
    }

    /// The fields of a struct schema; empty for any other type.
    pub fn fields(&self) -> &[Field] {
        match &self.kind {
            SchemaType::Struct(fields) => fields,
            _ => &[],
        }
    }

    /// The field called `name`, if this is a struct schema that has one.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields().iter().find(|f| f.name == name)
    }
}

impl fmt::Display for Schema {
    /// Short form for messages: `INT32`, `optional STRUCT 'com.example.Order'`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.optional {
            f.write_str("optional ")?;
        }
        f.write_str(self.kind.connect_name())?;
        if let Some(name) = &self.name {
            write!(f, " '{name}'")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_converters_fixed_schema_is_one_shared_schema_that_reads_and_compares_as_any() {
        let (a, b) = (optional_string_schema(), optional_string_schema());
        assert!(SchemaRef::ptr_eq(&a, &b), "one schema for every record");
        assert!(matches!(a.0, Held::Fixed(_)), "held without a counter");
        assert_eq!(a.kind, SchemaType::String);
        assert!(a.optional);
        // Equal to a counted copy of the same schema, unequal to another.
        let counted = SchemaRef::new(Schema::string().optional());
        assert!(!SchemaRef::ptr_eq(&a, &counted));
        assert_eq!(a, counted);
        assert_ne!(optional_bytes_schema(), counted);
        assert_eq!(
            format!("{a:?}"),
            format!("{:?}", Schema::string().optional())
        );
        let shared = SchemaRef::from(Arc::new(Schema::int32()));
        assert!(SchemaRef::ptr_eq(&shared, &shared.clone()));
    }

    #[test]
    fn struct_schema_finds_fields_by_name() {
        let schema = Schema::structure(vec![
            Field::new("id", Schema::int64()),
            Field::new("name", Schema::string().optional()),
        ]);
        assert_eq!(schema.field("name").map(|f| f.schema.optional), Some(true));
        assert!(schema.field("missing").is_none());
        assert!(Schema::int32().fields().is_empty());
    }

    #[test]
    fn display_names_optionality_type_and_name() {
        let schema = Schema::timestamp().optional();
        assert_eq!(
            schema.to_string(),
            "optional INT64 'org.apache.kafka.connect.data.Timestamp'"
        );
    }
}
