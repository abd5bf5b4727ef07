//! Fault controls a test drives while the proxy runs: drop or delay responses of an API, inject
//! a top-level or per-partition error code, close every client connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{
    DescribeClusterResponse, FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse,
    HeartbeatResponse, InitProducerIdResponse, JoinGroupResponse, LeaveGroupResponse,
    ProduceResponse, ShareAcknowledgeResponse, ShareFetchResponse, ShareGroupHeartbeatResponse,
    SyncGroupResponse,
};
use kafka_protocol::protocol::{Encodable, HeaderVersion, StrBytes};
use tokio::task::AbortHandle;

use super::frame::{decode_request, encode_response, response_header, RequestMeta};
use super::ProxyError;

/// APIs whose whole response the proxy can replace by a top-level error.
pub const TOP_LEVEL_ERROR_APIS: [i16; 11] = [1, 10, 11, 12, 13, 14, 22, 60, 76, 78, 79];
/// APIs whose per-partition answers the proxy can replace by an error.
pub const PARTITION_ERROR_APIS: [i16; 4] = [0, 1, 78, 79];

/// The message carried by injected errors, so a failure names its origin.
pub(crate) const INJECTED: &str = "injected by the Spillway test proxy";

#[derive(Clone, Debug)]
pub(crate) struct PartitionFault {
    pub topic: String,
    pub partition: i32,
    pub error_code: i16,
    pub remaining: u32,
}

#[derive(Default)]
struct FaultState {
    drops: HashMap<i16, u32>,
    delays: HashMap<i16, Duration>,
    errors: HashMap<i16, (i16, u32)>,
    partition_errors: HashMap<i16, Vec<PartitionFault>>,
    dropped: HashMap<i16, u64>,
}

#[derive(Default)]
pub(crate) struct FaultsInner {
    state: Mutex<FaultState>,
    connections: Mutex<HashMap<u64, AbortHandle>>,
}

/// The fault controls of one proxy (cheap to clone; all clones drive the same proxy).
#[derive(Clone, Default)]
pub struct ProxyFaults {
    inner: Arc<FaultsInner>,
}

impl std::fmt::Debug for ProxyFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyFaults").finish_non_exhaustive()
    }
}

impl ProxyFaults {
    fn state(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The responses to the next `count` requests of `api_key` never reach the client (the
    /// broker did get and handle the requests): the client sees a request timeout.
    pub fn drop_responses(&self, api_key: i16, count: u32) {
        self.state().drops.insert(api_key, count);
    }

    /// How many responses of `api_key` were dropped so far.
    pub fn dropped(&self, api_key: i16) -> u64 {
        self.state().dropped.get(&api_key).copied().unwrap_or(0)
    }

    /// Every response of `api_key` waits `delay` before it goes to the client (later responses on
    /// the same connection wait behind it, as behind a slow broker). `Duration::ZERO` clears it.
    pub fn delay_responses(&self, api_key: i16, delay: Duration) {
        if delay.is_zero() {
            self.state().delays.remove(&api_key);
        } else {
            self.state().delays.insert(api_key, delay);
        }
    }

    /// The next `count` requests of `api_key` are answered by the proxy with `error_code` as the
    /// top-level error (the shape Kafka answers an error in); the broker never sees them.
    /// Supported: [`TOP_LEVEL_ERROR_APIS`].
    pub fn inject_error(
        &self,
        api_key: i16,
        error_code: i16,
        count: u32,
    ) -> Result<(), ProxyError> {
        if !TOP_LEVEL_ERROR_APIS.contains(&api_key) {
            return Err(ProxyError::UnsupportedFault(format!(
                "api_key={api_key} has no top-level error the proxy can inject; supported: {TOP_LEVEL_ERROR_APIS:?}"
            )));
        }
        self.state().errors.insert(api_key, (error_code, count));
        Ok(())
    }

    /// In the next `count` responses of `api_key` that carry `topic`/`partition`, that
    /// partition's answer is replaced by `error_code` (records dropped; the broker did handle the
    /// request, so records a ShareFetch acquired stay locked until their lock times out).
    /// Supported: [`PARTITION_ERROR_APIS`]; topics are matched by name or, where the response
    /// carries only topic ids, by the ids seen in Metadata answers through this proxy.
    pub fn inject_partition_error(
        &self,
        api_key: i16,
        topic: &str,
        partition: i32,
        error_code: i16,
        count: u32,
    ) -> Result<(), ProxyError> {
        if !PARTITION_ERROR_APIS.contains(&api_key) {
            return Err(ProxyError::UnsupportedFault(format!(
                "api_key={api_key} has no per-partition error the proxy can inject; supported: {PARTITION_ERROR_APIS:?}"
            )));
        }
        self.state()
            .partition_errors
            .entry(api_key)
            .or_default()
            .push(PartitionFault {
                topic: topic.to_string(),
                partition,
                error_code,
                remaining: count,
            });
        Ok(())
    }

    /// Clears every pending drop, delay and injected error.
    pub fn clear(&self) {
        let mut state = self.state();
        state.drops.clear();
        state.delays.clear();
        state.errors.clear();
        state.partition_errors.clear();
    }

    /// Closes every client connection now (and its connection to the broker); returns how many.
    pub fn close_connections(&self) -> usize {
        let mut connections = self
            .inner
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let open = connections.values().filter(|h| !h.is_finished()).count();
        for (_, handle) in connections.drain() {
            handle.abort();
        }
        open
    }

    pub(crate) fn register_connection(&self, id: u64, handle: AbortHandle) {
        let mut connections = self
            .inner
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        connections.retain(|_, h| !h.is_finished());
        connections.insert(id, handle);
    }

    pub(crate) fn forget_connection(&self, id: u64) {
        self.inner
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// Whether to drop this response (counts it down).
    pub(crate) fn take_drop(&self, api_key: i16) -> bool {
        let mut state = self.state();
        match state.drops.get_mut(&api_key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                *state.dropped.entry(api_key).or_default() += 1;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn delay(&self, api_key: i16) -> Option<Duration> {
        self.state().delays.get(&api_key).copied()
    }

    /// The top-level error to answer this request with, if one is pending (counts it down).
    pub(crate) fn take_error(&self, api_key: i16) -> Option<i16> {
        let mut state = self.state();
        match state.errors.get_mut(&api_key) {
            Some((code, n)) if *n > 0 => {
                *n -= 1;
                Some(*code)
            }
            _ => None,
        }
    }

    pub(crate) fn has_partition_faults(&self, api_key: i16) -> bool {
        self.state()
            .partition_errors
            .get(&api_key)
            .is_some_and(|v| v.iter().any(|f| f.remaining > 0))
    }

    /// Applies pending per-partition faults to a response's (topic, partition) list: calls
    /// `set_error` for every partition that matches, and counts each fault down once per response.
    pub(crate) fn apply_partition_faults(
        &self,
        api_key: i16,
        partitions: &[(String, i32)],
        mut set_error: impl FnMut(usize, i16),
    ) -> bool {
        let mut state = self.state();
        let Some(faults) = state.partition_errors.get_mut(&api_key) else {
            return false;
        };
        let mut changed = false;
        for fault in faults.iter_mut().filter(|f| f.remaining > 0) {
            let mut hit = false;
            for (i, (topic, partition)) in partitions.iter().enumerate() {
                if *topic == fault.topic && *partition == fault.partition {
                    set_error(i, fault.error_code);
                    hit = true;
                }
            }
            if hit {
                fault.remaining -= 1;
                changed = true;
            }
        }
        changed
    }
}

fn message() -> Option<StrBytes> {
    Some(StrBytes::from_static_str(INJECTED))
}

/// Encodes `body`; when the version has no error message field, again without it.
fn encode_with_fallback<T: Encodable + HeaderVersion>(
    correlation_id: i32,
    version: i16,
    mut body: T,
    clear_message: impl Fn(&mut T),
) -> Result<Bytes, String> {
    let header = response_header(correlation_id);
    match encode_response(&header, &body, version) {
        Ok(frame) => Ok(frame),
        Err(_) => {
            clear_message(&mut body);
            encode_response(&header, &body, version)
        }
    }
}

/// The response Kafka would send for a request refused with `code` at the top level.
pub(crate) fn error_response(
    meta: RequestMeta,
    request: &Bytes,
    code: i16,
) -> Result<Bytes, String> {
    let (corr, v) = (meta.correlation_id, meta.version);
    match meta.api_key {
        1 => {
            let mut r = FetchResponse::default();
            r.error_code = code;
            encode_with_fallback(corr, v, r, |_| {})
        }
        10 => {
            let mut r = FindCoordinatorResponse::default();
            if v < 4 {
                r.error_code = code;
                r.error_message = message();
                r.node_id = (-1).into();
                r.port = -1;
            } else {
                let (_, request) = decode_request::<FindCoordinatorRequest>(request, v)?;
                r.coordinators = request
                    .coordinator_keys
                    .iter()
                    .map(|key| {
                        let mut c = Coordinator::default();
                        c.key = key.clone();
                        c.node_id = (-1).into();
                        c.port = -1;
                        c.error_code = code;
                        c.error_message = message();
                        c
                    })
                    .collect();
            }
            encode_with_fallback(corr, v, r, |r| r.error_message = None)
        }
        11 => {
            let mut r = JoinGroupResponse::default();
            r.error_code = code;
            encode_with_fallback(corr, v, r, |_| {})
        }
        12 => {
            let mut r = HeartbeatResponse::default();
            r.error_code = code;
            encode_with_fallback(corr, v, r, |_| {})
        }
        13 => {
            let mut r = LeaveGroupResponse::default();
            r.error_code = code;
            encode_with_fallback(corr, v, r, |_| {})
        }
        14 => {
            let mut r = SyncGroupResponse::default();
            r.error_code = code;
            encode_with_fallback(corr, v, r, |_| {})
        }
        22 => {
            let mut r = InitProducerIdResponse::default();
            r.error_code = code;
            encode_with_fallback(corr, v, r, |_| {})
        }
        60 => {
            let mut r = DescribeClusterResponse::default();
            r.error_code = code;
            r.error_message = message();
            encode_with_fallback(corr, v, r, |r| r.error_message = None)
        }
        76 => {
            let mut r = ShareGroupHeartbeatResponse::default();
            r.error_code = code;
            r.error_message = message();
            encode_with_fallback(corr, v, r, |r| r.error_message = None)
        }
        78 => {
            let mut r = ShareFetchResponse::default();
            r.error_code = code;
            r.error_message = message();
            encode_with_fallback(corr, v, r, |r| r.error_message = None)
        }
        79 => {
            let mut r = ShareAcknowledgeResponse::default();
            r.error_code = code;
            r.error_message = message();
            encode_with_fallback(corr, v, r, |r| r.error_message = None)
        }
        other => Err(format!("no top-level error response for api_key={other}")),
    }
}

/// Where each partition of a response stands: (topic index, partition index).
type Places = Vec<(usize, usize)>;
/// Each partition's fault key: (topic name, partition).
type FaultKeys = Vec<(String, i32)>;

/// Where each partition of a response stands and its fault key, in response order.
fn partition_places<T>(
    topics: &[T],
    topic_name: impl Fn(&T) -> String,
    partitions: impl Fn(&T) -> Vec<i32>,
) -> (Places, FaultKeys) {
    let mut index = Vec::new();
    let mut keys = Vec::new();
    for (t, topic) in topics.iter().enumerate() {
        let name = topic_name(topic);
        for (p, partition) in partitions(topic).into_iter().enumerate() {
            index.push((t, p));
            keys.push((name.clone(), partition));
        }
    }
    (index, keys)
}

/// Applies per-partition faults to a Produce response (by topic name).
pub(crate) fn produce_partition_faults(faults: &ProxyFaults, r: &mut ProduceResponse) -> bool {
    let (index, keys) = partition_places(
        &r.responses,
        |topic| topic.name.to_string(),
        |topic| topic.partition_responses.iter().map(|p| p.index).collect(),
    );
    faults.apply_partition_faults(0, &keys, |i, code| {
        let (t, p) = index[i];
        let part = &mut r.responses[t].partition_responses[p];
        part.error_code = code;
        part.base_offset = -1;
        part.error_message = message();
    })
}

/// Applies per-partition faults to a Fetch response (by name, or by id through `names`).
pub(crate) fn fetch_partition_faults(
    faults: &ProxyFaults,
    r: &mut FetchResponse,
    names: &dyn Fn(&uuid::Uuid) -> Option<String>,
) -> bool {
    let (index, keys) = partition_places(
        &r.responses,
        |topic| {
            if topic.topic.is_empty() {
                names(&topic.topic_id).unwrap_or_default()
            } else {
                topic.topic.to_string()
            }
        },
        |topic| topic.partitions.iter().map(|p| p.partition_index).collect(),
    );
    faults.apply_partition_faults(1, &keys, |i, code| {
        let (t, p) = index[i];
        let part = &mut r.responses[t].partitions[p];
        part.error_code = code;
        part.high_watermark = -1;
        part.last_stable_offset = -1;
        part.log_start_offset = -1;
        part.records = None;
    })
}

/// Applies per-partition faults to a ShareFetch response (topics by id through `names`).
pub(crate) fn share_fetch_partition_faults(
    faults: &ProxyFaults,
    r: &mut ShareFetchResponse,
    names: &dyn Fn(&uuid::Uuid) -> Option<String>,
) -> bool {
    let (index, keys) = partition_places(
        &r.responses,
        |topic| names(&topic.topic_id).unwrap_or_default(),
        |topic| topic.partitions.iter().map(|p| p.partition_index).collect(),
    );
    faults.apply_partition_faults(78, &keys, |i, code| {
        let (t, p) = index[i];
        let part = &mut r.responses[t].partitions[p];
        part.error_code = code;
        part.error_message = message();
        part.records = None;
        part.acquired_records.clear();
    })
}

/// Applies per-partition faults to a ShareAcknowledge response (topics by id through `names`).
pub(crate) fn share_ack_partition_faults(
    faults: &ProxyFaults,
    r: &mut ShareAcknowledgeResponse,
    names: &dyn Fn(&uuid::Uuid) -> Option<String>,
) -> bool {
    let (index, keys) = partition_places(
        &r.responses,
        |topic| names(&topic.topic_id).unwrap_or_default(),
        |topic| topic.partitions.iter().map(|p| p.partition_index).collect(),
    );
    faults.apply_partition_faults(79, &keys, |i, code| {
        let (t, p) = index[i];
        let part = &mut r.responses[t].partitions[p];
        part.error_code = code;
        part.error_message = message();
    })
}
