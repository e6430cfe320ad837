//! A connection's pending replies: bytes, with large values referenced
//! where they belong instead of copied.
//!
//! Why: a `get` of a 200 KB value used to copy the value into the reply
//! buffer under the shard lock, and the kernel then copied it again into
//! the socket. memcached sends straight from the item with `sendmsg`
//! iovecs. Item values are shared buffers ([`crate::store::Value`]), so a
//! reply keeps a reference to a value of at least [`REF_MIN`] bytes (an
//! atomic increment under the lock) and the send gathers the reply's byte
//! runs and those values in one vectored write. Smaller values are still
//! copied: an iovec per small value costs more than copying it.
//!
//! A referenced value counts in [`Reply::pending`] like copied bytes, so
//! the spilling that bounds a connection's unsent output
//! ([`crate::exec::SPILL_AT`]) bounds the values it holds too.

use crate::store::Value;
use std::io::{self, IoSlice};

/// Values of at least this many bytes are referenced, not copied.
///
/// ```
/// use corewise_kv::reply::{Reply, Sink, REF_MIN};
/// use std::sync::Arc;
/// let mut r = Reply::new();
/// r.value(&Arc::new(vec![b'a'; REF_MIN - 1])); // copied
/// r.value(&Arc::new(vec![b'b'; REF_MIN])); // referenced
/// assert_eq!((r.copied(), r.referenced(), r.pending()), (REF_MIN - 1, REF_MIN, 2 * REF_MIN - 1));
/// ```
pub const REF_MIN: usize = 8 * 1024;

/// Where a request's reply goes: the byte buffer, and a way to append a
/// value that may keep a reference to it instead of its bytes.
///
/// A plain `Vec<u8>` copies every value; a [`Reply`] references the large
/// ones.
///
/// ```
/// use corewise_kv::reply::{Reply, Sink};
/// use std::sync::Arc;
/// let value = Arc::new(vec![b'x'; 100_000]);
/// let (mut plain, mut reply) = (Vec::new(), Reply::new());
/// for out in [&mut plain as &mut dyn Sink, &mut reply] {
///     out.bytes().extend_from_slice(b"VALUE k 0 100000\r\n");
///     out.value(&value);
///     out.bytes().extend_from_slice(b"\r\n");
/// }
/// assert_eq!(plain.pending(), reply.pending());
/// assert_eq!(reply.to_vec(), plain);
/// ```
pub trait Sink {
    /// The bytes of the reply, to append to.
    fn bytes(&mut self) -> &mut Vec<u8>;
    /// Appends a value (its bytes, or a reference to them).
    fn value(&mut self, v: &Value);
    /// Bytes waiting to be sent, referenced values included.
    fn pending(&self) -> usize;
}

impl Sink for Vec<u8> {
    fn bytes(&mut self) -> &mut Vec<u8> {
        self
    }

    fn value(&mut self, v: &Value) {
        self.extend_from_slice(v);
    }

    fn pending(&self) -> usize {
        self.len()
    }
}

/// Reply bytes with large values referenced at their places.
///
/// ```
/// use corewise_kv::reply::{Reply, Sink};
/// use std::sync::Arc;
/// let mut r = Reply::new();
/// r.bytes().extend_from_slice(b"VA 20000\r\n");
/// r.value(&Arc::new(vec![b'v'; 20_000]));
/// r.bytes().extend_from_slice(b"\r\n");
/// let mut sent = Vec::new();
/// // A writer that takes 7 bytes at a time: every write stops mid-segment.
/// while !r.is_empty() {
///     let n = r.write_with(|s| {
///         let mut left = 7;
///         for s in s {
///             let k = s.len().min(left);
///             sent.extend_from_slice(&s[..k]);
///             left -= k;
///         }
///         Ok(7 - left)
///     })?;
///     assert!(n > 0);
/// }
/// assert_eq!(sent.len(), 10 + 20_000 + 2);
/// assert!(sent.starts_with(b"VA 20000\r\nvvv") && sent.ends_with(b"vv\r\n"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct Reply {
    bytes: Vec<u8>,
    /// Referenced values, each with the length of `bytes` when it was
    /// appended: it is sent after `bytes[..at]` and before what follows.
    refs: Vec<(usize, Value)>,
    /// Their total length.
    ref_bytes: usize,
    /// Bytes of the whole reply already written ([`Reply::write_with`]).
    sent: usize,
}

/// The most segments one vectored write is given.
const MAX_IOV: usize = 64;

impl Reply {
    /// An empty reply.
    ///
    /// ```
    /// let r = corewise_kv::reply::Reply::new();
    /// assert!(r.is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty reply whose byte buffer has room for `n` bytes.
    ///
    /// ```
    /// let r = corewise_kv::reply::Reply::with_capacity(4096);
    /// assert!(r.capacity() >= 4096);
    /// ```
    pub fn with_capacity(n: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    /// Capacity of the byte buffer.
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink};
    /// let mut r = Reply::new();
    /// r.bytes().extend_from_slice(b"END\r\n");
    /// assert!(r.capacity() >= 5);
    /// ```
    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Nothing left to send.
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink};
    /// let mut r = Reply::new();
    /// r.bytes().push(b'x');
    /// assert!(!r.is_empty());
    /// r.clear();
    /// assert!(r.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    /// Bytes held as copies (sent or not).
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink};
    /// let mut r = Reply::new();
    /// r.bytes().extend_from_slice(b"HD\r\n");
    /// assert_eq!(r.copied(), 4);
    /// ```
    pub fn copied(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes held as references to values (sent or not).
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink, REF_MIN};
    /// let mut r = Reply::new();
    /// r.value(&std::sync::Arc::new(vec![0; REF_MIN]));
    /// assert_eq!((r.copied(), r.referenced()), (0, REF_MIN));
    /// ```
    pub fn referenced(&self) -> usize {
        self.ref_bytes
    }

    /// Forgets everything, sent or not (and drops the references).
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink, REF_MIN};
    /// use std::sync::Arc;
    /// let v = Arc::new(vec![0; REF_MIN]);
    /// let mut r = Reply::new();
    /// r.value(&v);
    /// assert_eq!(Arc::strong_count(&v), 2);
    /// r.clear();
    /// assert_eq!((Arc::strong_count(&v), r.pending()), (1, 0));
    /// ```
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.refs.clear();
        self.ref_bytes = 0;
        self.sent = 0;
    }

    /// Replaces the byte buffer with a new one of `n` bytes' capacity
    /// when it has grown past `keep` (after a large reply), and empties
    /// the reply.
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink};
    /// let mut r = Reply::new();
    /// r.bytes().resize(100_000, b'x');
    /// r.reset(65536, 4096);
    /// assert!(r.is_empty() && r.capacity() < 65536);
    /// ```
    pub fn reset(&mut self, keep: usize, n: usize) {
        self.clear();
        if self.bytes.capacity() > keep {
            self.bytes = Vec::with_capacity(n);
        }
        if self.refs.capacity() > MAX_IOV {
            self.refs = Vec::new();
        }
    }

    /// The whole reply as one buffer (a copy; for tests and tools).
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink, REF_MIN};
    /// let mut r = Reply::new();
    /// r.bytes().extend_from_slice(b"<");
    /// r.value(&std::sync::Arc::new(vec![b'-'; REF_MIN]));
    /// r.bytes().extend_from_slice(b">");
    /// let all = r.to_vec();
    /// assert_eq!((all.len(), all[0], all[REF_MIN + 1]), (REF_MIN + 2, b'<', b'>'));
    /// ```
    pub fn to_vec(&self) -> Vec<u8> {
        let mut all = Vec::with_capacity(self.pending());
        self.for_each_segment(|s| {
            all.extend_from_slice(s);
            true
        });
        all
    }

    /// Calls `f` with each non-empty segment in order (byte runs and
    /// values) until it returns false.
    fn for_each_segment<'a>(&'a self, mut f: impl FnMut(&'a [u8]) -> bool) {
        let mut at = 0;
        for (end, v) in &self.refs {
            let run = &self.bytes[at..*end];
            if !run.is_empty() && !f(run) {
                return;
            }
            if !v.is_empty() && !f(v) {
                return;
            }
            at = *end;
        }
        let run = &self.bytes[at..];
        if !run.is_empty() {
            f(run);
        }
    }

    /// Offers what is not yet sent to `write` as up to 64 segments (the
    /// first one starting where the last write stopped, in the middle of
    /// a segment if need be) and records the bytes `write` says it took.
    /// Once all of it has been taken, the reply is empty again.
    ///
    /// ```
    /// use corewise_kv::reply::{Reply, Sink, REF_MIN};
    /// use std::io::Write;
    /// let mut r = Reply::new();
    /// r.bytes().extend_from_slice(b"VALUE k 0 8192\r\n");
    /// r.value(&std::sync::Arc::new(vec![b'x'; REF_MIN]));
    /// r.bytes().extend_from_slice(b"\r\nEND\r\n");
    /// let mut sent = Vec::new();
    /// while !r.is_empty() {
    ///     r.write_with(|s| sent.write_vectored(s))?;
    /// }
    /// assert_eq!(sent.len(), 16 + REF_MIN + 7);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    /// What `write` returns; a write that takes nothing of a non-empty
    /// reply is [`io::ErrorKind::WriteZero`].
    pub fn write_with(
        &mut self,
        write: impl FnOnce(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let left = self.pending() - self.sent;
        if left == 0 {
            self.clear();
            return Ok(0);
        }
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        let mut k = 0;
        let mut skip = self.sent;
        self.for_each_segment(|s| {
            if skip >= s.len() {
                skip -= s.len();
                return true;
            }
            iov[k] = IoSlice::new(&s[skip..]);
            skip = 0;
            k += 1;
            k < MAX_IOV
        });
        let n = write(&iov[..k])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        // A writer cannot take more than it was offered; if one claims
        // to, the reply is done all the same.
        self.sent += n.min(left);
        if self.sent == self.pending() {
            self.clear();
        }
        Ok(n)
    }
}

impl Sink for Reply {
    fn bytes(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    fn value(&mut self, v: &Value) {
        if v.len() < REF_MIN {
            self.bytes.extend_from_slice(v);
        } else {
            self.ref_bytes += v.len();
            self.refs.push((self.bytes.len(), Value::clone(v)));
        }
    }

    fn pending(&self) -> usize {
        self.bytes.len() + self.ref_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A reply of small runs and values of both kinds.
    fn sample() -> (Reply, Vec<u8>) {
        let (mut r, mut flat) = (Reply::new(), Vec::new());
        for i in 0..150u32 {
            let head = format!("VALUE k{i} 0\r\n");
            let v: Value = Arc::new((0..(i as usize * 397) % 30_000).map(|b| b as u8).collect());
            for out in [&mut r as &mut dyn Sink, &mut flat] {
                out.bytes().extend_from_slice(head.as_bytes());
                out.value(&v);
                out.bytes().extend_from_slice(b"\r\n");
            }
        }
        r.bytes().extend_from_slice(b"END\r\n");
        flat.extend_from_slice(b"END\r\n");
        (r, flat)
    }

    #[test]
    fn partial_writes_of_every_size_resume_where_they_stopped() {
        for step in [1usize, 2, 5, 13, 4096, 8191, 8192, 70_000, usize::MAX] {
            let (mut r, flat) = sample();
            assert!(r.referenced() > 0 && r.copied() > 0);
            assert_eq!(r.pending(), flat.len());
            let mut sent = Vec::new();
            while !r.is_empty() {
                r.write_with(|segs| {
                    assert!(segs.len() <= MAX_IOV && segs.iter().all(|s| !s.is_empty()));
                    let mut left = step;
                    for s in segs {
                        let k = s.len().min(left);
                        sent.extend_from_slice(&s[..k]);
                        left -= k;
                    }
                    Ok(step - left)
                })
                .unwrap();
            }
            assert!(sent == flat, "step {step}");
        }
    }

    #[test]
    fn a_write_of_nothing_is_an_error_and_keeps_the_reply() {
        let (mut r, flat) = sample();
        let e = r.write_with(|_| Ok(0)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
        assert_eq!(r.pending(), flat.len());
        assert_eq!(r.to_vec(), flat);
    }
}
