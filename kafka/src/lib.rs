//! Everything that speaks to Kafka.
//!
//! Layers, bottom up: [`connection`] (one broker socket, pipelined requests) → [`cluster`]
//! (brokers, topics, leaders, one persistent connection per broker) → [`share`] (the KIP-932
//! share-group consumer: membership, sessions, fetch, acknowledgements). [`admin`] speaks Kafka's
//! admin API (configs, topics, share-group offsets) on the same cluster layer, and
//! [`worker_group`] is distributed mode's membership in the workers' classic group.

pub mod admin;
pub mod backoff;
pub mod classic;
pub mod cluster;
pub mod connection;
mod copies;
#[doc(hidden)]
pub mod cost;
pub mod groups;
pub mod kafka_log;
pub mod producer;
pub mod security;
pub mod share;
pub mod worker_group;

/// The protocol name of a Kafka error code, e.g. `NotLeaderOrFollower` for 6, for messages.
pub fn error_name(code: i16) -> String {
    match kafka_protocol::error::ResponseError::try_from_code(code) {
        None => "None".to_string(),
        Some(e) => format!("{e:?}"),
    }
}
