//! Distributed mode's membership: workers form one classic group on Kafka's group coordinator,
//! as Kafka Connect's workers do (protocol type `connect`), and the elected leader divides
//! connectors and tasks among them, incrementally and cooperatively (KIP-415).
//!
//! [`protocol`] is what members send each other through the coordinator, [`assignor`] the
//! leader's pure assignment logic, [`member`] the member that speaks the group protocol.

pub mod assignor;
pub mod member;
pub mod protocol;

pub use assignor::{GroupAssignment, IncrementalAssignor, MemberAssignment};
pub use member::{MemberEvent, WorkerGroupConfig, WorkerGroupError, WorkerGroupMember, WorkerHost};
pub use protocol::{
    Allocation, AssignmentError, TaskId, WorkerAssignment, WorkerCapacity, WorkerMetadata,
};
