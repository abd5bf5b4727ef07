//! Kafka framing for the proxy: length-prefixed frames, the request header fields every version
//! shares, and typed decode/encode of bodies with the header version kafka-protocol prescribes.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Kafka's default `socket.request.max.bytes`; a longer frame means a desynchronised stream.
pub(crate) const MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// Reads one length-prefixed frame and returns it without the length. `None` when the peer
/// closed the stream cleanly between frames.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    read: &mut R,
) -> std::io::Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    match read.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let size = i32::from_be_bytes(len);
    if size < 0 || size as usize > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame length {size} is outside 0..={MAX_FRAME_BYTES}"),
        ));
    }
    let mut frame = BytesMut::zeroed(size as usize);
    read.read_exact(&mut frame).await?;
    Ok(Some(frame.freeze()))
}

/// Writes `frame` with its length prefix and flushes (TLS streams buffer until flushed).
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    write: &mut W,
    frame: &[u8],
) -> std::io::Result<()> {
    write.write_all(&(frame.len() as u32).to_be_bytes()).await?;
    write.write_all(frame).await?;
    write.flush().await
}

/// The fields at the start of every request header version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestMeta {
    pub api_key: i16,
    pub version: i16,
    pub correlation_id: i32,
}

/// Reads api key, version and correlation id, which every request header version starts with,
/// so requests of APIs kafka-protocol does not know still pass through.
pub(crate) fn peek_request(frame: &[u8]) -> Option<RequestMeta> {
    if frame.len() < 8 {
        return None;
    }
    Some(RequestMeta {
        api_key: i16::from_be_bytes([frame[0], frame[1]]),
        version: i16::from_be_bytes([frame[2], frame[3]]),
        correlation_id: i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
    })
}

/// Decodes a whole request frame as `T` (header version from `T`'s rules).
pub(crate) fn decode_request<T: Decodable + HeaderVersion>(
    frame: &Bytes,
    version: i16,
) -> Result<(RequestHeader, T), String> {
    let mut buf = frame.clone();
    let header = RequestHeader::decode(&mut buf, T::header_version(version))
        .map_err(|e| format!("request header: {e}"))?;
    let body = T::decode(&mut buf, version).map_err(|e| format!("request body v{version}: {e}"))?;
    Ok((header, body))
}

/// Splits a response frame into its header (version from `T`'s rules, which include
/// ApiVersions' header always being v0) and body.
pub(crate) fn decode_response<T: Decodable + HeaderVersion>(
    frame: &Bytes,
    version: i16,
) -> Result<(ResponseHeader, T), String> {
    let mut buf = frame.clone();
    let header = ResponseHeader::decode(&mut buf, T::header_version(version))
        .map_err(|e| format!("response header: {e}"))?;
    // Trailing bytes are ignored: the dev broker appends one to some responses.
    let body =
        T::decode(&mut buf, version).map_err(|e| format!("response body v{version}: {e}"))?;
    Ok((header, body))
}

/// Encodes a response frame (without length prefix).
pub(crate) fn encode_response<T: Encodable + HeaderVersion>(
    header: &ResponseHeader,
    body: &T,
    version: i16,
) -> Result<Bytes, String> {
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, T::header_version(version))
        .map_err(|e| format!("response header: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("response body v{version}: {e}"))?;
    Ok(buf.freeze())
}

/// A response header carrying only `correlation_id`.
pub(crate) fn response_header(correlation_id: i32) -> ResponseHeader {
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    header
}

/// Encodes a request frame (without length prefix), for the proxy's own requests upstream.
pub(crate) fn encode_request<T: Encodable + HeaderVersion>(
    header: &RequestHeader,
    body: &T,
    version: i16,
) -> Result<Bytes, String> {
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, T::header_version(version))
        .map_err(|e| format!("request header: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("request body v{version}: {e}"))?;
    Ok(buf.freeze())
}

/// The `acks` of a Produce request (v3+: after the nullable transactional id), read without
/// decoding the records. acks=0 requests get no response, so none may be awaited.
pub(crate) fn produce_acks(frame: &Bytes, version: i16) -> Option<i16> {
    use kafka_protocol::messages::ProduceRequest;
    let mut buf = frame.clone();
    RequestHeader::decode(&mut buf, ProduceRequest::header_version(version)).ok()?;
    if version < 3 {
        return Some(i16::from_be_bytes([*buf.first()?, *buf.get(1)?]));
    }
    let flexible = version >= 9;
    let skip = if flexible {
        // Compact nullable string: unsigned varint length + 1 (0 = null).
        let mut len: u64 = 0;
        let mut shift = 0;
        let mut used = 0;
        loop {
            let byte = *buf.get(used)?;
            used += 1;
            len |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        used + len.saturating_sub(1) as usize
    } else {
        let len = i16::from_be_bytes([*buf.first()?, *buf.get(1)?]);
        2 + len.max(0) as usize
    };
    Some(i16::from_be_bytes([*buf.get(skip)?, *buf.get(skip + 1)?]))
}

/// A frame of raw bytes (SASL tokens after a v0 handshake carry no Kafka header).
pub(crate) fn raw(bytes: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(bytes.len());
    buf.put_slice(bytes);
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ProduceRequest;
    use kafka_protocol::protocol::StrBytes;

    fn produce_frame(version: i16, acks: i16, txn: Option<&str>) -> Bytes {
        let mut header = RequestHeader::default();
        header.request_api_key = 0;
        header.request_api_version = version;
        header.correlation_id = 7;
        let mut body = ProduceRequest::default();
        body.acks = acks;
        body.transactional_id = txn.map(|t| StrBytes::from_string(t.to_string()).into());
        encode_request(&header, &body, version).unwrap()
    }

    #[test]
    fn produce_acks_are_read_in_flexible_and_older_versions() {
        for version in [3i16, 8, 9, 11] {
            for acks in [0i16, 1, -1] {
                for txn in [None, Some("txn-7")] {
                    let frame = produce_frame(version, acks, txn);
                    assert_eq!(
                        produce_acks(&frame, version),
                        Some(acks),
                        "v{version} {txn:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_request_meta_is_read_from_the_first_eight_bytes() {
        let frame = produce_frame(9, 1, None);
        assert_eq!(
            peek_request(&frame),
            Some(RequestMeta {
                api_key: 0,
                version: 9,
                correlation_id: 7
            })
        );
        assert_eq!(peek_request(&frame[..7]), None);
    }
}
