//! Built-in sink connectors (kafka, postgres, http, file). Not built yet: see the issues "Sink
//! runtime" and "Sinks for real systems".

pub mod file;
pub mod http;
pub mod kafka;
pub mod kafka_mirror_metrics;
pub mod kafka_offset_syncs;
pub mod paths;
pub mod postgres;
pub mod registry;
pub mod runtime_keys;
pub mod topic_table;
pub mod trace_context;

pub use registry::{ConnectorFactory, ConnectorRegistry};
