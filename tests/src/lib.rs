//! Spillway's test kit: the dev broker (librdkafka's mock cluster behind `tools/devbroker.py`),
//! a bulk test-data producer, the reference share consumer, loss/duplicate checks, and a
//! read_committed reader for exactly-once output.
//!
//! Everything here sets itself up: the launcher's Python venv is created on first use, brokers
//! listen on free ports, and every child process is killed when its handle is dropped.

pub mod chaos;
pub mod checker;
pub mod committed;
pub mod dev_broker;
pub mod kafka_proxy;
pub mod produce;
pub mod proxied_broker;
pub mod python;
pub mod reference;

pub use checker::{Coordinates, DeliveryReport};
pub use committed::read_committed;
pub use dev_broker::{DevBroker, DevBrokerControl, DevBrokerError};
pub use kafka_proxy::{KafkaProxy, ProxyOptions, ProxySecurity, SaslMechanism, TokenIssuer};
pub use produce::{numbered_range, numbered_records, produce, Produced, TestProducer, TestRecord};
pub use proxied_broker::ProxiedDevBroker;
pub use reference::{ReferenceOptions, ReferenceRecord, ReferenceShareConsumer, ReferenceSummary};
