//! Single message transforms (SMTs) and predicates with Kafka Connect's names and options.
//!
//! Each transform takes a record and returns it changed, or `None` to drop it (`Filter`).
//! Transforms that work on either part of a record have `$Key` and `$Value` variants
//! (`InsertField$Value`). Where Connect supports both, schemaless values (maps) and schema'd
//! values (structs with their schema) are handled; tombstones pass through the field
//! transforms untouched. [`TransformChain`] builds the configured chain.

mod cast;
mod chain;
mod extract_field;
mod filter;
mod headers;
mod hoist_field;
mod insert_field;
mod mask_field;
mod predicates;
mod regex_router;
mod registry;
mod replace_field;
mod side;
mod timestamp_router;
mod value_to_key;

use std::fmt;

pub use cast::{Cast, CastTarget};
pub use chain::{validate_transforms, TransformChain};
pub use extract_field::ExtractField;
pub use filter::Filter;
pub use headers::{DropHeaders, HeaderFrom, InsertHeader};
pub use hoist_field::HoistField;
pub use insert_field::InsertField;
pub use mask_field::MaskField;
pub use predicates::{HasHeaderKey, Predicate, RecordIsTombstone, TopicNameMatches};
pub use regex_router::{java_replacement, RegexRouter};
pub use registry::{
    lookup_predicate, lookup_transform, transform_names, PredicateType, TransformType, PREDICATES,
    TRANSFORMS,
};
pub use replace_field::ReplaceField;
pub use side::Side;
pub use timestamp_router::TimestampRouter;
pub use value_to_key::ValueToKey;

use crate::error::TransformError;
use crate::record::SinkRecord;

/// One transform: a record in, the changed record (or `None` to drop it) out.
pub trait Transformation: Send + Sync + fmt::Debug {
    fn apply(&self, record: SinkRecord) -> Result<Option<SinkRecord>, TransformError>;
}

#[cfg(test)]
pub(crate) mod testkit {
    pub use crate::config::config_map as config;
}
