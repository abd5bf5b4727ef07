//! The sink runtime: actix actors that run sink connectors on share groups (KIP-932, the
//! KIP-1302 loop) or consumer groups.
//!
//! ```text
//! Worker ─▶ ConnectorRouter ─▶ ConnectorSupervisor ─▶ per task, on a shared pool thread:
//!
//!   ConsumerActor ─SourceBatch─▶ ConverterActor ─SinkBatch─▶ SinkActor ─Verdicts─▶ DeadLetterActor
//!   consumer/poll.rs             converter.rs                sink.rs                dead_letter.rs
//!        │                                                                               │
//!   ConsumerActor ◀──────────────── Settled (the credit and the verdicts) ──────────────┘
//!   consumer/acknowledge.rs: ACCEPT/RELEASE/REJECT + commit (share), offset commit (classic)
//!        ▲
//!        └── Unsettled (a batch's BatchAck dropped on any path: release its records at once)
//! ```
//! The consumer is the first stage and the last because it owns the Kafka client and nothing
//! else touches it: a share consumer's acknowledgements ride on its next fetch. The router
//! (`router.rs`) only routes the worker's requests; the supervisor (`supervisor.rs`) starts a
//! connector's tasks and restarts them when they fail; `task.rs` wires one task's pipeline.
//!
//! A batch is done once its acknowledgements (share) or offsets (classic) are committed; at
//! most `task.inflight.batches` batches per task are between poll and commit. A batch lost on
//! the way (a panic, a failure, a stop) is released at once, never left to its lock.

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
