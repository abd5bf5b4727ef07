//! Copies of many small byte slices in shared chunks.

use bytes::{Bytes, BytesMut};

/// Bytes of one chunk of [`Copies`]: a poll's worth of small records.
pub(crate) const COPY_CHUNK: usize = 64 * 1024;

/// Where a poll copies its records' keys, values and header values out of the client's
/// buffers (librdkafka's, freed with the message; a ShareFetch response, which also carries
/// records of other members): consecutive slices of shared chunks, one allocation per
/// chunk instead of one per copy (issue 18). A record keeps its chunk alive; a copy larger
/// than a quarter of a chunk gets an allocation of its own. (The classic consumer copies a
/// batch's keys and values into one buffer of the batch's size instead, `message_queue`; its
/// header values and the rare record served from the consumer queue come here.)
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
        self.make_room(data.len());
        self.chunk.extend_from_slice(data);
        self.chunk.split().freeze()
    }

    /// A record's key and value, copied as [`Copies::copy`] would: when both are small and
    /// not empty, into one slice of the chunk that is then split in two. Splitting a `BytesMut`
    /// costs about a hundred instructions more than splitting the `Bytes` it became (issue 18).
    pub(crate) fn copy_pair(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> (Option<Bytes>, Option<Bytes>) {
        let (Some(k), Some(v)) = (key, value) else {
            return (key.map(|k| self.copy(k)), value.map(|v| self.copy(v)));
        };
        if k.is_empty() || v.is_empty() || k.len() + v.len() > self.chunk_size / 4 {
            return (Some(self.copy(k)), Some(self.copy(v)));
        }
        self.make_room(k.len() + v.len());
        self.chunk.extend_from_slice(k);
        self.chunk.extend_from_slice(v);
        let mut key = self.chunk.split().freeze();
        let value = key.split_off(k.len());
        (Some(key), Some(value))
    }

    /// A new chunk when the current one has no room for `len` more bytes; the old one lives
    /// on with the copies made in it.
    fn make_room(&mut self, len: usize) {
        if self.chunk.capacity() - self.chunk.len() < len {
            self.chunk = BytesMut::with_capacity(self.chunk_size);
        }
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

    #[test]
    fn a_key_and_its_value_are_copied_as_one_slice_split_in_two() {
        let mut copies = Copies::new(1024);
        let (key, value) = copies.copy_pair(Some(b"key-1"), Some(b"value one"));
        let (key, value) = (key.expect("key"), value.expect("value"));
        assert_eq!((&key[..], &value[..]), (&b"key-1"[..], &b"value one"[..]));
        assert_eq!(value.as_ptr(), key.as_ptr().wrapping_add(5), "one slice");
        // The next copy follows them in the chunk.
        let next = copies.copy(b"next");
        assert_eq!(next.as_ptr(), value.as_ptr().wrapping_add(9));
        // Null, empty and large parts are copied as `copy` does.
        assert_eq!(copies.copy_pair(None, Some(b"v")).0, None);
        assert_eq!(
            &copies.copy_pair(None, Some(b"v")).1.expect("value")[..],
            b"v"
        );
        assert_eq!(copies.copy_pair(Some(b"k"), None).1, None);
        let (empty, v) = copies.copy_pair(Some(b""), Some(b"v"));
        assert_eq!(
            (empty.as_deref(), v.as_deref()),
            (Some(&b""[..]), Some(&b"v"[..]))
        );
        let big = [3u8; 300];
        let (k, v) = copies.copy_pair(Some(b"k"), Some(&big));
        assert_eq!(
            (k.as_deref(), v.as_deref()),
            (Some(&b"k"[..]), Some(&big[..]))
        );
        // Past a chunk's end a new one starts; the copies before keep their bytes.
        let pairs: Vec<_> = (0..50u8)
            .map(|i| copies.copy_pair(Some(&[i; 4]), Some(&[i; 60])))
            .collect();
        drop(copies);
        for (i, (k, v)) in pairs.iter().enumerate() {
            assert_eq!(k.as_deref(), Some(&[i as u8; 4][..]));
            assert_eq!(v.as_deref(), Some(&[i as u8; 60][..]));
        }
        assert_eq!((&key[..], &value[..]), (&b"key-1"[..], &b"value one"[..]));
    }
}
