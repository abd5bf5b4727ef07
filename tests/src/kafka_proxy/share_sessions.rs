//! Kafka's share sessions in front of the mock (`ProxyOptions::with_kafka_share_sessions`).
//!
//! On Kafka 4.1/4.2 a ShareFetch at epoch 0 only removes the member's old session from the
//! cache and starts a new one; the records the member acquired stay acquired by it
//! (`SharePartitionManager.newContext`). The mock instead releases them whenever a session is
//! replaced. So a client that reopens its session after an error (INVALID_SHARE_SESSION_EPOCH
//! and the like, injected by the proxy) would see its records released on the mock and not on
//! Kafka. In this mode the proxy keeps the mock's session alive across such a reopen: it
//! remembers, per broker and member, the epoch the mock expects next, and maps the client's
//! epochs onto it, so the client's epoch 0 continues the mock's session (now with the
//! partitions the client listed) instead of replacing it.
//!
//! Coarser than Kafka: a session the mock ended (an error answer from the mock itself, any
//! connection to that broker closing, its idle timeout) is forgotten, and the client's next
//! epoch 0 reaches the mock unchanged, with the mock's release; a connection to the mock that
//! bypasses the proxy closing is not seen, so the first continued request then gets
//! SHARE_SESSION_NOT_FOUND from the mock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use kafka_protocol::messages::share_fetch_request::ForgottenTopic;
use kafka_protocol::messages::{
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
};
use uuid::Uuid;

use super::frame::{decode_request, decode_response, encode_request, RequestMeta};
use super::rewrite::{SHARE_ACKNOWLEDGE, SHARE_FETCH};

type Partition = (Uuid, i32);

/// The mock's session of one member on one broker, as the proxy has seen it.
#[derive(Debug)]
struct MockSession {
    /// The epoch the mock expects next.
    next: i32,
    /// The mock's epoch minus the client's, for the same request.
    shift: i32,
    partitions: BTreeSet<Partition>,
}

/// A forwarded ShareFetch/ShareAcknowledge, for the response side.
#[derive(Clone, Debug)]
pub(crate) struct ShareSeen {
    node: i32,
    member: String,
    api_key: i16,
    client_epoch: i32,
    /// The epoch the mock received.
    sent_epoch: i32,
    /// ShareFetch: the partitions the request listed, and those it forgot (as sent).
    listed: Vec<Partition>,
    forgotten: Vec<Partition>,
}

#[derive(Debug, Default)]
pub(crate) struct ShareSessions {
    sessions: Mutex<HashMap<(i32, String), MockSession>>,
    continued: AtomicU64,
}

impl ShareSessions {
    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<(i32, String), MockSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Epoch-0 reopens that continued the mock's session instead of replacing it.
    pub(crate) fn continued(&self) -> u64 {
        self.continued.load(Ordering::Relaxed)
    }

    /// A connection from the proxy to broker `node` closed: the mock ends every share session
    /// on that broker then.
    pub(crate) fn connection_closed(&self, node: i32) {
        self.sessions().retain(|(n, _), _| *n != node);
    }

    /// Maps a share request's epoch onto the mock's session; returns the frame to forward
    /// (rewritten when the epoch changed) and what the response side needs.
    pub(crate) fn on_request(
        &self,
        node: i32,
        meta: RequestMeta,
        frame: Bytes,
    ) -> Result<(Bytes, Option<ShareSeen>), String> {
        match meta.api_key {
            SHARE_FETCH => {
                let (header, mut request) =
                    decode_request::<ShareFetchRequest>(&frame, meta.version)?;
                let member = request
                    .member_id
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                let client_epoch = request.share_session_epoch;
                let listed: Vec<Partition> = request
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, p.partition_index)))
                    .collect();
                let sessions = self.sessions();
                let session = sessions.get(&(node, member.clone()));
                let mut rewritten = false;
                if let Some(session) = session {
                    if client_epoch == 0 {
                        // Continue the mock's session with the client's partition list: what
                        // it no longer lists is forgotten.
                        request.share_session_epoch = session.next;
                        let keep: BTreeSet<Partition> = listed.iter().copied().collect();
                        let mut forget: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
                        for (id, p) in session.partitions.difference(&keep) {
                            forget.entry(*id).or_default().push(*p);
                        }
                        request.forgotten_topics_data = forget
                            .into_iter()
                            .map(|(id, partitions)| {
                                let mut t = ForgottenTopic::default();
                                t.topic_id = id;
                                t.partitions = partitions;
                                t
                            })
                            .collect();
                        rewritten = true;
                    } else if client_epoch > 0 {
                        request.share_session_epoch = client_epoch.wrapping_add(session.shift);
                        rewritten = session.shift != 0;
                    }
                }
                drop(sessions);
                let forgotten = request
                    .forgotten_topics_data
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, *p)))
                    .collect();
                let seen = ShareSeen {
                    node,
                    member,
                    api_key: SHARE_FETCH,
                    client_epoch,
                    sent_epoch: request.share_session_epoch,
                    listed,
                    forgotten,
                };
                let frame = if rewritten {
                    encode_request(&header, &request, meta.version)?
                } else {
                    frame
                };
                Ok((frame, Some(seen)))
            }
            SHARE_ACKNOWLEDGE => {
                let (header, mut request) =
                    decode_request::<ShareAcknowledgeRequest>(&frame, meta.version)?;
                let member = request
                    .member_id
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                let client_epoch = request.share_session_epoch;
                let shift = self
                    .sessions()
                    .get(&(node, member.clone()))
                    .map_or(0, |s| s.shift);
                let rewritten = client_epoch > 0 && shift != 0;
                if rewritten {
                    request.share_session_epoch = client_epoch.wrapping_add(shift);
                }
                let seen = ShareSeen {
                    node,
                    member,
                    api_key: SHARE_ACKNOWLEDGE,
                    client_epoch,
                    sent_epoch: request.share_session_epoch,
                    listed: Vec::new(),
                    forgotten: Vec::new(),
                };
                let frame = if rewritten {
                    encode_request(&header, &request, meta.version)?
                } else {
                    frame
                };
                Ok((frame, Some(seen)))
            }
            _ => Ok((frame, None)),
        }
    }

    /// The mock answered `seen`'s request with `frame`: follow its session.
    pub(crate) fn on_response(&self, seen: &ShareSeen, version: i16, frame: &Bytes) {
        let code = if seen.api_key == SHARE_FETCH {
            decode_response::<ShareFetchResponse>(frame, version).map(|(_, r)| r.error_code)
        } else {
            decode_response::<ShareAcknowledgeResponse>(frame, version).map(|(_, r)| r.error_code)
        };
        let key = (seen.node, seen.member.clone());
        let mut sessions = self.sessions();
        // Closed, refused (the mock destroys the session on 122/123), or unreadable: forget
        // it, so the client's next epoch 0 goes to the mock as sent.
        if code != Ok(0) || seen.client_epoch < 0 {
            sessions.remove(&key);
            return;
        }
        let next = next_epoch(seen.sent_epoch);
        let client_next = next_epoch(seen.client_epoch);
        if seen.client_epoch == 0 {
            if seen.sent_epoch != 0 {
                self.continued.fetch_add(1, Ordering::Relaxed);
            }
            sessions.insert(
                key,
                MockSession {
                    next,
                    shift: next.wrapping_sub(client_next),
                    partitions: seen.listed.iter().copied().collect(),
                },
            );
            return;
        }
        if let Some(session) = sessions.get_mut(&key) {
            session.next = next;
            session.shift = next.wrapping_sub(client_next);
            session.partitions.extend(seen.listed.iter().copied());
            for p in &seen.forgotten {
                session.partitions.remove(p);
            }
        }
    }
}

/// +1, wrapping to 1 after `i32::MAX`, as Kafka's `ShareRequestMetadata.nextEpoch`.
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka_proxy::frame::{encode_response, response_header};
    use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{GroupId, RequestHeader};
    use kafka_protocol::protocol::StrBytes;

    const NODE: i32 = 1;
    const TOPIC: Uuid = Uuid::from_u128(9);

    fn meta(api_key: i16) -> RequestMeta {
        RequestMeta {
            api_key,
            version: 1,
            correlation_id: 3,
        }
    }

    fn header(api_key: i16) -> RequestHeader {
        let mut h = RequestHeader::default();
        h.request_api_key = api_key;
        h.request_api_version = 1;
        h.correlation_id = 3;
        h
    }

    fn fetch(epoch: i32, partitions: &[i32]) -> Bytes {
        let mut r = ShareFetchRequest::default();
        r.group_id = Some(GroupId(StrBytes::from_static_str("g")));
        r.member_id = Some(StrBytes::from_static_str("m"));
        r.share_session_epoch = epoch;
        if !partitions.is_empty() {
            let mut t = FetchTopic::default();
            t.topic_id = TOPIC;
            t.partitions = partitions
                .iter()
                .map(|p| {
                    let mut fp = FetchPartition::default();
                    fp.partition_index = *p;
                    fp
                })
                .collect();
            r.topics = vec![t];
        }
        encode_request(&header(SHARE_FETCH), &r, 1).expect("encode")
    }

    fn ack(epoch: i32) -> Bytes {
        let mut r = ShareAcknowledgeRequest::default();
        r.group_id = Some(GroupId(StrBytes::from_static_str("g")));
        r.member_id = Some(StrBytes::from_static_str("m"));
        r.share_session_epoch = epoch;
        encode_request(&header(SHARE_ACKNOWLEDGE), &r, 1).expect("encode")
    }

    fn answer(api_key: i16, code: i16) -> Bytes {
        if api_key == SHARE_FETCH {
            let mut r = ShareFetchResponse::default();
            r.error_code = code;
            encode_response(&response_header(3), &r, 1).expect("encode")
        } else {
            let mut r = ShareAcknowledgeResponse::default();
            r.error_code = code;
            encode_response(&response_header(3), &r, 1).expect("encode")
        }
    }

    /// Sends `frame` through the emulation with the broker answering `code`; returns the
    /// request as the broker got it.
    fn round_trip(
        s: &ShareSessions,
        api_key: i16,
        frame: Bytes,
        code: i16,
    ) -> (i32, Vec<Partition>) {
        let (sent, seen) = s.on_request(NODE, meta(api_key), frame).expect("request");
        let seen = seen.expect("followed");
        s.on_response(&seen, 1, &answer(api_key, code));
        if api_key == SHARE_FETCH {
            let (_, r) = decode_request::<ShareFetchRequest>(&sent, 1).expect("decode");
            let forgotten = r
                .forgotten_topics_data
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, *p)))
                .collect();
            (r.share_session_epoch, forgotten)
        } else {
            let (_, r) = decode_request::<ShareAcknowledgeRequest>(&sent, 1).expect("decode");
            (r.share_session_epoch, Vec::new())
        }
    }

    #[test]
    fn a_clients_epoch_zero_reopen_continues_the_brokers_session() {
        let s = ShareSessions::default();
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(0, &[0, 1]), 0).0, 0);
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(1, &[]), 0).0, 1);
        // The client reopens with partition 1 only: the broker's session goes on at epoch 2,
        // partition 0 forgotten.
        let (epoch, forgotten) = round_trip(&s, SHARE_FETCH, fetch(0, &[1]), 0);
        assert_eq!((epoch, forgotten), (2, vec![(TOPIC, 0)]));
        assert_eq!(s.continued(), 1);
        // The client's epochs 1, 2 are the broker's 3, 4.
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(1, &[]), 0).0, 3);
        assert_eq!(round_trip(&s, SHARE_ACKNOWLEDGE, ack(2), 0).0, 4);
        // A close goes through as sent and ends the session.
        assert_eq!(round_trip(&s, SHARE_ACKNOWLEDGE, ack(-1), 0).0, -1);
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(0, &[1]), 0).0, 0);
    }

    #[test]
    fn a_session_the_broker_ended_is_not_continued() {
        let s = ShareSessions::default();
        round_trip(&s, SHARE_FETCH, fetch(0, &[0]), 0);
        // The broker refused (and, being the mock, destroyed) the session.
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(1, &[]), 123).0, 1);
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(0, &[0]), 0).0, 0);
        // Any connection to the broker closing ends it on the mock too.
        round_trip(&s, SHARE_FETCH, fetch(1, &[]), 0);
        s.connection_closed(NODE);
        assert_eq!(round_trip(&s, SHARE_FETCH, fetch(0, &[0]), 0).0, 0);
        assert_eq!(s.continued(), 0);
    }
}
