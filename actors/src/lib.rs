//! The sink runtime: actix actors that run sink connectors on share groups (KIP-932, the
//! KIP-1302 loop) or consumer groups.
//!
//! ```text
//! Worker ─▶ ConnectorRouter ─▶ ConnectorSupervisor ─▶ per task, on a shared pool thread:
//!
//!   ConsumerActor ─SourceBatch─▶ ConverterActor ─SinkBatch─▶ SinkActor ─Outcomes─▶ AckerActor
//!   (consumer/: poll)            (converter.rs)              (sink.rs)              (acker.rs: dead
//!        ▲                                                                          letters, ACCEPT/
//!        │                                                                          RELEASE/REJECT
//!        └──────────────────── Committed (credits: poll again) ◀─────────────────── + commit)
//! ```
//! Records flow one way, poll → convert → put → acknowledge and commit; only credits go back.
//! The consumer and the acker take turns on the task's one Kafka client ([`acker::SharedSource`]).
//! A batch's `BatchAck` dropped on any path tells the acker (`Unsettled`), which releases the
//! batch's records at once. The router (`router.rs`) only routes the worker's requests; the
//! supervisor (`supervisor.rs`) starts a connector's tasks and restarts them when they fail;
//! `task.rs` wires one task's pipeline.
//!
//! A batch is done once its acknowledgements (share) or offsets (classic) are committed; at
//! most `task.inflight.batches` batches per task are between poll and commit. A batch lost on
//! the way (a panic, a failure, a stop) is released at once, never left to its lock.

pub mod acker;
pub mod allocator;
pub mod consumer;
pub mod consumer_settings;
pub mod converter;
pub mod dead_letter;
pub use spillway_core::egress;
pub mod error;
pub mod group_ids;
pub mod limits;
pub mod lock_retry;
pub mod messages;
pub mod metrics;
pub mod panic_guard;
pub mod panics;
pub mod pool;
pub mod router;
pub mod settings;
pub mod share_group;
pub mod sink;
pub mod source;
pub mod status;
pub mod supervisor;
pub mod task;
pub mod telemetry;
pub mod tenancy;
pub mod worker;

pub use error::RuntimeError;
pub use status::{ConnectorStatus, Counts, State, TaskStatus};
pub use tenancy::{Confinement, InflightBytes, OverridePolicy, TenantScope, Throttle};
pub use worker::Worker;
