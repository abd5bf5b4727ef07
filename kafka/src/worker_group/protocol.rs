//! What workers tell each other through the group coordinator: the member metadata each worker
//! sends in JoinGroup, and the assignment the leader hands each worker through SyncGroup.
//!
//! The coordinator treats both as opaque bytes; only Spillway workers read them. They are JSON
//! with a version field, so a field added later (with a default) is read by older workers, and a
//! worker that meets a newer major version says so instead of misreading it. The shape follows
//! Kafka Connect's incremental cooperative protocol (KIP-415): the metadata carries the worker's
//! REST URL, the config-topic offset it has read up to and what it runs now; the assignment
//! carries the leader, the config offset it was computed at, what to start, what to stop, and
//! how long until the next rebalance when departed workers' work is being held.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The group's protocol type, as Kafka Connect's workers use: a group of another type (a
/// consumer group of the same id) refuses these members with INCONSISTENT_GROUP_PROTOCOL.
pub const PROTOCOL_TYPE: &str = "connect";
/// The one protocol Spillway's workers offer. It is not one of Connect's names (`default`,
/// `compatible`, `sessioned`), so a Java Connect worker and a Spillway worker never agree on a
/// protocol and cannot share a group by mistake.
pub const PROTOCOL_NAME: &str = "spillway-cooperative";
/// The major version of the metadata and assignment written here.
pub const PROTOCOL_VERSION: u16 = 1;

/// One task of a connector (Connect's `ConnectorTaskId`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId {
    pub connector: String,
    pub task: u32,
}

impl TaskId {
    pub fn new(connector: impl Into<String>, task: u32) -> TaskId {
        TaskId {
            connector: connector.into(),
            task,
        }
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.connector, self.task)
    }
}

/// A set of connectors and tasks: what a worker runs, is given, or must stop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    #[serde(default)]
    pub connectors: BTreeSet<String>,
    #[serde(default)]
    pub tasks: BTreeSet<TaskId>,
}

impl Allocation {
    pub fn is_empty(&self) -> bool {
        self.connectors.is_empty() && self.tasks.is_empty()
    }

    /// Connectors plus tasks: the unit of load.
    pub fn len(&self) -> usize {
        self.connectors.len() + self.tasks.len()
    }

    /// Adds everything in `other`.
    pub fn add_all(&mut self, other: &Allocation) {
        self.connectors.extend(other.connectors.iter().cloned());
        self.tasks.extend(other.tasks.iter().cloned());
    }

    /// Removes everything in `other`.
    pub fn remove_all(&mut self, other: &Allocation) {
        self.connectors.retain(|c| !other.connectors.contains(c));
        self.tasks.retain(|t| !other.tasks.contains(t));
    }

    /// What is in `self` and not in `other`.
    pub fn minus(&self, other: &Allocation) -> Allocation {
        let mut rest = self.clone();
        rest.remove_all(other);
        rest
    }

    /// What is in both.
    pub fn intersect(&self, other: &Allocation) -> Allocation {
        Allocation {
            connectors: self
                .connectors
                .intersection(&other.connectors)
                .cloned()
                .collect(),
            tasks: self.tasks.intersection(&other.tasks).cloned().collect(),
        }
    }
}

/// What a worker sends in its JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerMetadata {
    pub version: u16,
    /// The worker's REST URL: where the others forward requests when it leads.
    pub url: String,
    /// The config-topic offset this worker has read up to (-1: nothing read yet).
    pub config_offset: i64,
    /// What the worker runs now; the leader keeps it running there (cooperative rebalancing).
    #[serde(default)]
    pub running: Allocation,
    /// The most tasks this worker runs (its `tasks.max.per.worker`); `None` (a worker that
    /// does not say): no limit. The leader never gives it more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<u64>,
}

/// One live worker's task capacity, as the leader saw it when it assigned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCapacity {
    pub url: String,
    /// Its `tasks.max.per.worker`; `None`: no limit.
    #[serde(default)]
    pub max_tasks: Option<u64>,
}

/// Why an assignment carries no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssignmentError {
    /// The leader has not read the config topic as far as some member: every member reads to
    /// the end of the config topic and joins again.
    ConfigMismatch,
}

/// What the leader gives one worker in SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerAssignment {
    pub version: u16,
    #[serde(default)]
    pub error: Option<AssignmentError>,
    /// The leader's member id and REST URL.
    pub leader: String,
    pub leader_url: String,
    /// The config offset the assignment was computed at: a worker that has not read that far
    /// reads on before starting what it is given.
    pub config_offset: i64,
    /// Start these (in addition to what the worker runs and keeps).
    #[serde(default)]
    pub assigned: Allocation,
    /// Stop these, then join again so the leader can hand them on.
    #[serde(default)]
    pub revoked: Allocation,
    /// When non-zero, departed workers' work is held: join again after this many milliseconds
    /// so the leader can reassign it if they have not come back.
    #[serde(default)]
    pub delay_ms: u64,
    /// Every member of the generation with its task capacity: the cluster's capacity is their
    /// sum (the leader refuses connectors beyond it).
    #[serde(default)]
    pub workers: Vec<WorkerCapacity>,
    /// Tasks no worker has room for (every worker is at its `tasks.max.per.worker`): they
    /// run nowhere until capacity returns; the leader reports them in the status topic.
    #[serde(default)]
    pub unassigned: Allocation,
}

/// Bytes from another worker that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("the {what} from member '{member}' is not Spillway worker JSON ({reason}); is a worker of another kind (Kafka Connect?) or an older Spillway in group.id's group?")]
    Malformed {
        what: &'static str,
        member: String,
        reason: String,
    },
    #[error("the {what} from member '{member}' has protocol version {found}; this worker reads version {PROTOCOL_VERSION}. Upgrade this worker to the version of the others")]
    NewerVersion {
        what: &'static str,
        member: String,
        found: u16,
    },
}

impl WorkerMetadata {
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings, numbers and sets: serialising cannot fail.
        serde_json::to_vec(self).expect("worker metadata serialises")
    }

    pub fn decode(member: &str, bytes: &[u8]) -> Result<WorkerMetadata, ProtocolError> {
        let metadata: WorkerMetadata = decode("metadata", member, bytes)?;
        check_version("metadata", member, metadata.version)?;
        Ok(metadata)
    }
}

impl WorkerAssignment {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("worker assignment serialises")
    }

    pub fn decode(leader: &str, bytes: &[u8]) -> Result<WorkerAssignment, ProtocolError> {
        let assignment: WorkerAssignment = decode("assignment", leader, bytes)?;
        check_version("assignment", leader, assignment.version)?;
        Ok(assignment)
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    member: &str,
    bytes: &[u8],
) -> Result<T, ProtocolError> {
    // The major version is read first, so a newer worker's change of shape is reported as a
    // version mismatch rather than as garbage.
    #[derive(Deserialize)]
    struct Versioned {
        version: u16,
    }
    if let Ok(v) = serde_json::from_slice::<Versioned>(bytes) {
        check_version(what, member, v.version)?;
    }
    serde_json::from_slice(bytes).map_err(|e| ProtocolError::Malformed {
        what,
        member: member.to_owned(),
        reason: e.to_string(),
    })
}

fn check_version(what: &'static str, member: &str, found: u16) -> Result<(), ProtocolError> {
    if found > PROTOCOL_VERSION {
        return Err(ProtocolError::NewerVersion {
            what,
            member: member.to_owned(),
            found,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(connectors: &[&str], tasks: &[(&str, u32)]) -> Allocation {
        Allocation {
            connectors: connectors.iter().map(|c| c.to_string()).collect(),
            tasks: tasks.iter().map(|(c, t)| TaskId::new(*c, *t)).collect(),
        }
    }

    #[test]
    fn metadata_and_assignment_read_back_as_written() {
        let metadata = WorkerMetadata {
            version: PROTOCOL_VERSION,
            url: "http://w1:8083".into(),
            config_offset: 42,
            running: allocation(&["a"], &[("a", 0), ("a", 1)]),
            max_tasks: Some(40),
        };
        assert_eq!(
            WorkerMetadata::decode("m", &metadata.encode()).unwrap(),
            metadata
        );
        let assignment = WorkerAssignment {
            version: PROTOCOL_VERSION,
            error: None,
            leader: "m1".into(),
            leader_url: "http://w1:8083".into(),
            config_offset: 42,
            assigned: allocation(&["b"], &[("b", 0)]),
            revoked: allocation(&[], &[("a", 1)]),
            delay_ms: 5000,
            workers: vec![WorkerCapacity {
                url: "http://w1:8083".into(),
                max_tasks: Some(40),
            }],
            unassigned: allocation(&[], &[("c", 0)]),
        };
        assert_eq!(
            WorkerAssignment::decode("m1", &assignment.encode()).unwrap(),
            assignment
        );
    }

    #[test]
    fn fields_added_later_are_ignored_and_missing_sets_are_empty() {
        let text = br#"{"version":1,"url":"http://w","config_offset":-1,"future":true}"#;
        let metadata = WorkerMetadata::decode("m", text).unwrap();
        assert!(metadata.running.is_empty());
        assert_eq!(metadata.config_offset, -1);
        assert_eq!(
            metadata.max_tasks, None,
            "a worker that says nothing has no limit"
        );
    }

    #[test]
    fn a_newer_version_is_named_and_garbage_says_whose_it_is() {
        let newer = br#"{"version":2,"shape":"changed"}"#;
        let err = WorkerMetadata::decode("m7", newer).unwrap_err().to_string();
        assert!(err.contains("version 2") && err.contains("m7"), "{err}");
        let err = WorkerAssignment::decode("lead", b"\x00\x01binary")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lead") && err.contains("Kafka Connect"),
            "{err}"
        );
    }

    #[test]
    fn allocation_set_operations() {
        let a = allocation(&["x", "y"], &[("x", 0), ("y", 0)]);
        let b = allocation(&["y"], &[("y", 0), ("z", 0)]);
        assert_eq!(a.minus(&b), allocation(&["x"], &[("x", 0)]));
        assert_eq!(a.intersect(&b), allocation(&["y"], &[("y", 0)]));
        assert_eq!(a.len(), 4);
    }
}
