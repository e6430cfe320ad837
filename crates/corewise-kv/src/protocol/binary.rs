//! memcached's binary protocol: frames.
//!
//! A connection whose first byte is `0x80` speaks the binary protocol for
//! its whole life (memcached negotiates the same way). Every request is a
//! 24-byte header (magic, opcode, key length, extras length, data type,
//! vbucket, total body length, opaque, CAS, big-endian) followed by the
//! body: extras, key, value. Like the text parser this module is pure: it
//! splits buffered bytes into frames that borrow from the buffer and does
//! not look at what an opcode means beyond the body's layout
//! ([`crate::exec_binary`] does). A body larger than the item limit allows
//! is answered with "too large" and skipped as it arrives, so the
//! connection goes on, as in memcached.

use super::parse::{Limits, KEY_MAX};

/// The first byte of every request.
///
/// ```
/// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder, REQUEST_MAGIC}, Limits};
/// let mut d = BinaryDecoder::new(Limits::default());
/// let mut noop = [0u8; 24];
/// noop[0] = REQUEST_MAGIC;
/// noop[1] = 0x0a;
/// assert!(matches!(d.decode(&noop).1, BinDecoded::Frame(_)));
/// noop[0] = 0x00;
/// assert_eq!(d.decode(&noop).1, BinDecoded::BadMagic);
/// ```
pub const REQUEST_MAGIC: u8 = 0x80;
/// The first byte of every response.
///
/// ```
/// use corewise_kv::protocol::binary::{REQUEST_MAGIC, RESPONSE_MAGIC};
/// // A response is told from a request by its first byte.
/// assert_eq!(RESPONSE_MAGIC, REQUEST_MAGIC + 1);
/// ```
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Header length of requests and responses.
///
/// ```
/// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder, HEADER_LEN}, Limits};
/// let mut d = BinaryDecoder::new(Limits::default());
/// let mut noop = vec![0u8; HEADER_LEN];
/// noop[0] = 0x80;
/// noop[1] = 0x0a;
/// assert_eq!(d.decode(&noop[..HEADER_LEN - 1]), (0, BinDecoded::Incomplete));
/// assert_eq!(d.decode(&noop).0, HEADER_LEN);
/// ```
pub const HEADER_LEN: usize = 24;

/// Extras and key room a body may have beyond its value: the decoder skips
/// bodies longer than the item limit plus this.
const BODY_SLACK: usize = 255 + KEY_MAX;

/// A request header.
///
/// ```
/// use corewise_kv::protocol::binary::Header;
/// let mut b = [0u8; 24];
/// b[0] = 0x80;
/// b[1] = 0x0a; // noop
/// b[12..16].copy_from_slice(&7u32.to_be_bytes());
/// let h = Header::parse(&b);
/// assert_eq!((h.opcode, h.opaque, h.body_len), (0x0a, 7, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The first byte (0x80 for a request).
    pub magic: u8,
    /// The command.
    pub opcode: u8,
    /// Key length.
    pub key_len: u16,
    /// Extras length.
    pub extras_len: u8,
    /// Total body length: extras, key and value.
    pub body_len: u32,
    /// Copied into the response.
    pub opaque: u32,
    /// The request's CAS (0: none).
    pub cas: u64,
}

impl Header {
    /// Reads the first [`HEADER_LEN`] bytes of `b` (which must hold them).
    ///
    /// ```
    /// use corewise_kv::protocol::binary::Header;
    /// let mut b = [0u8; 24];
    /// b[0] = 0x80;
    /// b[2..4].copy_from_slice(&3u16.to_be_bytes()); // key length
    /// b[4] = 4; // extras
    /// b[8..12].copy_from_slice(&10u32.to_be_bytes());
    /// b[16..24].copy_from_slice(&0x1_0000_0002u64.to_be_bytes());
    /// let h = Header::parse(&b);
    /// assert_eq!((h.key_len, h.extras_len, h.body_len, h.cas), (3, 4, 10, 0x1_0000_0002));
    /// ```
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let be16 = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Header {
            magic: b[0],
            opcode: b[1],
            key_len: be16(2),
            extras_len: b[4],
            body_len: be32(8),
            opaque: be32(12),
            cas: u64::from(be32(16)) << 32 | u64::from(be32(20)),
        }
    }
}

/// A whole request.
///
/// ```
/// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder}, Limits};
/// // set "k" = "v", flags 5: 8 bytes of extras (flags, expiry), key, value.
/// let mut req = vec![0x80, 0x01, 0, 1, 8, 0, 0, 0, 0, 0, 0, 10];
/// req.extend_from_slice(&[0; 12]);
/// req.extend_from_slice(&[0, 0, 0, 5, 0, 0, 0, 0]);
/// req.extend_from_slice(b"kv");
/// let (_, r) = BinaryDecoder::new(Limits::default()).decode(&req);
/// let BinDecoded::Frame(f) = r else { panic!() };
/// assert_eq!((f.extras.len(), f.key, f.value), (8, &b"k"[..], &b"v"[..]));
/// assert_eq!(f.header.opcode, 0x01);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Its header.
    pub header: Header,
    /// The extras (their layout depends on the opcode).
    pub extras: &'a [u8],
    /// The key (may be empty).
    pub key: &'a [u8],
    /// The value (may be empty).
    pub value: &'a [u8],
}

/// What [`BinaryDecoder::decode`] found.
///
/// ```
/// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder}, Limits};
/// let mut d = BinaryDecoder::new(Limits { item_max: 10, ..Limits::default() });
/// // A set whose value (1000 bytes) is far over the limit.
/// let mut req = vec![0x80, 0x01, 0, 1, 8, 0, 0, 0];
/// req.extend_from_slice(&(8 + 1 + 1000u32).to_be_bytes());
/// req.extend_from_slice(&[0; 12]);
/// req.extend_from_slice(&[0; 8]);
/// req.push(b'k');
/// req.extend_from_slice(&[b'x'; 1000]);
/// let (used, r) = d.decode(&req);
/// assert!(matches!(r, BinDecoded::TooLarge(h, b"k") if h.opcode == 0x01));
/// // The rest of the body is skipped on the next calls.
/// assert_eq!(d.decode(&req[used..]), (req.len() - used, BinDecoded::Incomplete));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinDecoded<'a> {
    /// More bytes are needed (bytes of a skipped body may have been used).
    Incomplete,
    /// One request.
    Frame(Frame<'a>),
    /// A body over the size limit, with the request's key: answer "too
    /// large" (a `set` also removes the key's old value, as in memcached);
    /// the decoder skips the rest of the body as it arrives.
    TooLarge(Header, &'a [u8]),
    /// The header's extras and key do not fit its body length: answer
    /// "unknown command" and close the connection, as memcached does.
    Malformed(Header),
    /// Not a request magic: the stream cannot be followed, close it.
    BadMagic,
}

/// Splits a binary-protocol byte stream into frames.
///
/// ```
/// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder}, Limits};
/// let mut d = BinaryDecoder::new(Limits::default());
/// let mut req = vec![0x80, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
/// req.extend_from_slice(&[0; 12]);
/// req.push(b'k');
/// let (used, f) = d.decode(&req);
/// assert_eq!(used, 25);
/// assert!(matches!(f, BinDecoded::Frame(f) if f.key == b"k" && f.value.is_empty()));
/// ```
#[derive(Debug, Clone)]
pub struct BinaryDecoder {
    limits: Limits,
    skip: u64,
}

impl BinaryDecoder {
    /// A decoder that refuses values over `limits.item_max`.
    ///
    /// ```
    /// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder}, Limits};
    /// let mut d = BinaryDecoder::new(Limits::default());
    /// assert_eq!(d.decode(&[]), (0, BinDecoded::Incomplete));
    /// ```
    pub fn new(limits: Limits) -> Self {
        Self { limits, skip: 0 }
    }

    /// Decodes the first frame of `buf`; returns the bytes used and what
    /// they were. Never panics, whatever `buf` holds.
    ///
    /// ```
    /// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder}, Limits};
    /// let mut d = BinaryDecoder::new(Limits::default());
    /// // A header whose key is longer than its whole body.
    /// let mut bad = vec![0x80, 0x00, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1];
    /// bad.extend_from_slice(&[0; 12]);
    /// bad.push(b'k');
    /// assert!(matches!(d.decode(&bad), (24, BinDecoded::Malformed(h)) if h.key_len == 9));
    /// ```
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> (usize, BinDecoded<'a>) {
        if self.skip > 0 {
            let n = usize::try_from(self.skip)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            self.skip -= n as u64;
            return (n, BinDecoded::Incomplete);
        }
        // A whole header first, then its magic, as memcached reads it: a
        // short tail that is not a request waits for more bytes (the
        // connection is closed only once 24 bytes show it is no request).
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return (0, BinDecoded::Incomplete);
        };
        let h = Header::parse(head);
        if h.magic != REQUEST_MAGIC {
            return (0, BinDecoded::BadMagic);
        }
        let body = u64::from(h.body_len);
        let (ext, key) = (usize::from(h.extras_len), usize::from(h.key_len));
        if body > (self.limits.item_max + BODY_SLACK) as u64 {
            // Wait for the extras and the key (at most 64 KiB), so a too
            // large `set` can remove the key's old value; skip the rest.
            let Some(k) = buf.get(HEADER_LEN + ext..HEADER_LEN + ext + key) else {
                return (0, BinDecoded::Incomplete);
            };
            self.skip = body - (ext + key) as u64;
            return (HEADER_LEN + ext + key, BinDecoded::TooLarge(h, k));
        }
        if ext + key > body as usize {
            self.skip = body;
            return (HEADER_LEN, BinDecoded::Malformed(h));
        }
        let total = HEADER_LEN + body as usize;
        let Some(frame) = buf.get(HEADER_LEN..total) else {
            return (0, BinDecoded::Incomplete);
        };
        let (extras, rest) = frame.split_at(ext);
        let (key, value) = rest.split_at(key);
        (
            total,
            BinDecoded::Frame(Frame {
                header: h,
                extras,
                key,
                value,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
        let mut v = vec![REQUEST_MAGIC, op];
        v.extend_from_slice(&(key.len() as u16).to_be_bytes());
        v.push(extras.len() as u8);
        v.extend_from_slice(&[0, 0, 0]);
        let body = (extras.len() + key.len() + value.len()) as u32;
        v.extend_from_slice(&body.to_be_bytes());
        v.extend_from_slice(&opaque.to_be_bytes());
        v.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        v.extend_from_slice(extras);
        v.extend_from_slice(key);
        v.extend_from_slice(value);
        v
    }

    #[test]
    fn splits_a_frame_into_its_parts() {
        let mut d = BinaryDecoder::new(Limits::default());
        let b = req(0x01, &[1, 2, 3, 4, 0, 0, 0, 9], b"key", b"value", 42);
        let (used, f) = d.decode(&b);
        assert_eq!(used, b.len());
        let BinDecoded::Frame(f) = f else {
            panic!("{f:?}")
        };
        assert_eq!(f.header.opcode, 0x01);
        assert_eq!(f.header.opaque, 42);
        assert_eq!(f.header.cas, 0x0102_0304_0506_0708);
        assert_eq!(f.extras, &[1, 2, 3, 4, 0, 0, 0, 9]);
        assert_eq!(f.key, b"key");
        assert_eq!(f.value, b"value");
    }

    #[test]
    fn waits_for_the_whole_frame() {
        let mut d = BinaryDecoder::new(Limits::default());
        let b = req(0x00, &[], b"key", &[], 1);
        for cut in 0..b.len() {
            assert_eq!(
                d.decode(&b[..cut]),
                (0, BinDecoded::Incomplete),
                "cut {cut}"
            );
        }
        assert!(matches!(d.decode(&b).1, BinDecoded::Frame(_)));
    }

    #[test]
    fn skips_a_body_over_the_limit_and_goes_on() {
        let mut d = BinaryDecoder::new(Limits {
            item_max: 100,
            ..Limits::default()
        });
        let big = req(0x01, &[0; 8], b"k", &[7; 1000], 1);
        let noop = req(0x0a, &[], &[], &[], 2);
        let mut stream = big.clone();
        stream.extend_from_slice(&noop);
        // The header alone is not enough: the key is needed too.
        assert_eq!(
            d.decode(&stream[..HEADER_LEN + 8]).1,
            BinDecoded::Incomplete
        );
        let (used, f) = d.decode(&stream);
        assert_eq!(used, HEADER_LEN + 9);
        assert!(matches!(f, BinDecoded::TooLarge(h, b"k") if h.opaque == 1));
        // The body arrives in pieces and is skipped.
        let mut pos = used;
        loop {
            let end = (pos + 300).min(stream.len());
            let (n, f) = d.decode(&stream[pos..end]);
            pos += n;
            if let BinDecoded::Frame(f) = f {
                assert_eq!(f.header.opaque, 2);
                break;
            }
            assert!(n > 0, "progress");
        }
        assert_eq!(pos, stream.len());
    }

    #[test]
    fn extras_and_key_longer_than_the_body_are_malformed() {
        let mut d = BinaryDecoder::new(Limits::default());
        let mut b = req(0x00, &[], b"key", &[], 1);
        b[2..4].copy_from_slice(&10u16.to_be_bytes());
        let (used, f) = d.decode(&b);
        assert_eq!(used, HEADER_LEN);
        assert!(matches!(f, BinDecoded::Malformed(_)));
        assert_eq!(d.decode(&b[HEADER_LEN..]), (3, BinDecoded::Incomplete));
    }

    #[test]
    fn a_wrong_magic_stops_the_stream_once_a_whole_header_is_in() {
        let mut d = BinaryDecoder::new(Limits::default());
        assert_eq!(d.decode(b"get a\r\n"), (0, BinDecoded::Incomplete));
        assert_eq!(
            d.decode(b"get a\r\nget b\r\nget c\r\nget d\r\n"),
            (0, BinDecoded::BadMagic)
        );
        assert_eq!(d.decode(&[0x81; 30]), (0, BinDecoded::BadMagic));
    }
}
