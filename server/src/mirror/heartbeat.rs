//! MM2's heartbeat record (Kafka 4.2 `Heartbeat`, version 0), byte for byte, so tools that read
//! MM2 heartbeats (`RemoteClusterUtils`, MM2's own checks) read Spillway's.
//!
//! A heartbeat says "the flow source->target was alive at `timestamp`". Each flow writes one per
//! `emit.heartbeats.interval.seconds` to the target's `heartbeats` topic; the opposite flow
//! replicates it onward as `<target>.heartbeats`, so the arrival of a heartbeat shows a path works
//! end to end. Encoding is Kafka's protocol `Struct`: strings as an i16 length and UTF-8 bytes,
//! integers big-endian; the value starts with an i16 version.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The version written (the only one MM2 defines).
pub const VERSION: i16 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub source_cluster_alias: String,
    pub target_cluster_alias: String,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
}

/// Why bytes are not a heartbeat.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeartbeatError {
    #[error("heartbeat {part} is truncated")]
    Truncated { part: &'static str },
    #[error("heartbeat {part} holds a string that is not UTF-8")]
    NotUtf8 { part: &'static str },
    #[error("heartbeat version {0} is unknown (expected {VERSION})")]
    Version(i16),
    #[error("an alias of {len} bytes does not fit a heartbeat (at most 32767)")]
    TooLong { len: usize },
}

fn put_string(buf: &mut BytesMut, s: &str) -> Result<(), HeartbeatError> {
    let len = i16::try_from(s.len()).map_err(|_| HeartbeatError::TooLong { len: s.len() })?;
    buf.put_i16(len);
    buf.put_slice(s.as_bytes());
    Ok(())
}

fn get_string(buf: &mut &[u8], part: &'static str) -> Result<String, HeartbeatError> {
    if buf.remaining() < 2 {
        return Err(HeartbeatError::Truncated { part });
    }
    let len = buf.get_i16();
    let len = usize::try_from(len).map_err(|_| HeartbeatError::Truncated { part })?;
    if buf.remaining() < len {
        return Err(HeartbeatError::Truncated { part });
    }
    let text = std::str::from_utf8(&buf[..len])
        .map_err(|_| HeartbeatError::NotUtf8 { part })?
        .to_owned();
    buf.advance(len);
    Ok(text)
}

impl Heartbeat {
    /// The record key: source alias, target alias.
    pub fn key(&self) -> Result<Bytes, HeartbeatError> {
        let mut buf = BytesMut::new();
        put_string(&mut buf, &self.source_cluster_alias)?;
        put_string(&mut buf, &self.target_cluster_alias)?;
        Ok(buf.freeze())
    }

    /// The record value: version, timestamp.
    pub fn value(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(10);
        buf.put_i16(VERSION);
        buf.put_i64(self.timestamp);
        buf.freeze()
    }

    /// Reads a heartbeat record.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Heartbeat, HeartbeatError> {
        let mut k = key;
        let source_cluster_alias = get_string(&mut k, "key")?;
        let target_cluster_alias = get_string(&mut k, "key")?;
        let mut v = value;
        if v.remaining() < 2 {
            return Err(HeartbeatError::Truncated { part: "value" });
        }
        let version = v.get_i16();
        if version != VERSION {
            return Err(HeartbeatError::Version(version));
        }
        if v.remaining() < 8 {
            return Err(HeartbeatError::Truncated { part: "value" });
        }
        Ok(Heartbeat {
            source_cluster_alias,
            target_cluster_alias,
            timestamp: v.get_i64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_encoded_as_kafkas_struct_layout() {
        let hb = Heartbeat {
            source_cluster_alias: "A".into(),
            target_cluster_alias: "BB".into(),
            timestamp: 0x0102_0304_0506_0708,
        };
        assert_eq!(
            &hb.key().expect("fits")[..],
            &[0, 1, b'A', 0, 2, b'B', b'B']
        );
        assert_eq!(&hb.value()[..], &[0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let back = Heartbeat::decode(&hb.key().expect("fits"), &hb.value()).expect("decodes");
        assert_eq!(back, hb);
    }

    #[test]
    fn truncated_or_unknown_heartbeats_are_refused() {
        assert_eq!(
            Heartbeat::decode(&[0, 5, b'A'], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(HeartbeatError::Truncated { part: "key" })
        );
        assert_eq!(
            Heartbeat::decode(&[0, 1, b'A', 0, 1, b'B'], &[0, 1, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(HeartbeatError::Version(1))
        );
        assert_eq!(
            Heartbeat::decode(&[0, 1, b'A', 0, 1, b'B'], &[0, 0, 0]),
            Err(HeartbeatError::Truncated { part: "value" })
        );
    }
}
