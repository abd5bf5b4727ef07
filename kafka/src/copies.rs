//! Copies of many small byte slices in shared chunks.

use bytes::{Bytes, BytesMut};

/// Bytes of one chunk of [`Copies`]: a poll's worth of small records.
pub(crate) const COPY_CHUNK: usize = 64 * 1024;

/// Where a poll copies its records' keys, values and header values out of the client's
/// buffers (librdkafka's, freed with the message; a ShareFetch response, which also carries
/// records of other members): consecutive slices of shared chunks, one allocation per
/// chunk instead of one per copy (issue 18). A record keeps its chunk alive; a copy larger
/// than a quarter of a chunk gets an allocation of its own.
pub(crate) struct Copies {
    chunk: BytesMut,
    chunk_size: usize,
}

impl Copies {
    /// Chunks of `chunk_size` bytes; 0 copies each slice on its own.
    pub(crate) fn new(chunk_size: usize) -> Copies {
        Copies {
            chunk: BytesMut::new(),
            chunk_size,
        }
    }

    pub(crate) fn copy(&mut self, data: &[u8]) -> Bytes {
        if data.is_empty() {
            return Bytes::new();
        }
        if data.len() > self.chunk_size / 4 {
            return Bytes::copy_from_slice(data);
        }
        if self.chunk.capacity() - self.chunk.len() < data.len() {
            self.chunk = BytesMut::with_capacity(self.chunk_size);
        }
        self.chunk.extend_from_slice(data);
        self.chunk.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_share_chunks_and_keep_their_bytes() {
        let mut copies = Copies::new(1024);
        let a = copies.copy(b"first");
        let b = copies.copy(b"second");
        let big = copies.copy(&[7u8; 300]);
        assert_eq!(&a[..], b"first");
        assert_eq!(&b[..], b"second");
        assert_eq!(&big[..], &[7u8; 300][..]);
        assert_eq!(
            b.as_ptr(),
            a.as_ptr().wrapping_add(5),
            "consecutive in one chunk"
        );
        // Past a chunk's end a new one starts; the old one lives on with its records.
        let many: Vec<Bytes> = (0..100u8).map(|i| copies.copy(&[i; 100])).collect();
        drop(copies);
        for (i, c) in many.iter().enumerate() {
            assert_eq!(&c[..], &[i as u8; 100][..]);
        }
        assert_eq!(&a[..], b"first");
        assert!(Copies::new(0).copy(b"").is_empty());
        assert_eq!(&Copies::new(0).copy(b"x")[..], b"x");
    }
}
