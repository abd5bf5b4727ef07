//! Spillway core: the record and data model, acknowledgement handles, configuration
//! (declaration, validation, group-protocol resolution, `.properties`), converters,
//! transforms (SMTs) and predicates, and the `SinkConnector` / `SinkTask` traits.
//!
//! This crate knows nothing of Kafka clients, actix or sled: the runtime crates feed it raw
//! records and take acknowledgements back.

pub mod ack;
pub mod config;
pub mod connector;
pub mod convert;
pub mod data;
pub mod dead_letter;
pub mod egress;
pub mod error;
pub mod in_place;
pub mod pipeline;
pub mod record;
pub mod schema;
pub mod topic;
pub mod transforms;
pub mod windowed;

pub use ack::{Ack, BatchAck, BatchOwner, Disposition};
pub use config::ConfigMap;
pub use connector::{Assignment, ConsumerGroupMetadata, PutOutcome, SinkConnector, SinkTask};
pub use data::{Struct, Text, Value};
pub use dead_letter::{dead_letter_record, DeadLetterRecord, ErrorContext};
pub use error::{
    ConfigError, ConnectError, ConvertError, RecordPart, SinkError, Stage, TransformError,
};
pub use pipeline::{Processed, RecordPipeline};
pub use record::{Header, RawRecord, RecordCoordinates, SinkRecord, TimestampType, TopicPartition};
pub use schema::{Field, Schema, SchemaRef, SchemaType};
pub use topic::Topic;
