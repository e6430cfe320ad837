//! Wire protocol between applications and the arbiter daemon.
//!
//! Why a hand-written binary format: every message is a handful of fixed-size
//! integers, the daemon must validate every byte it receives from untrusted
//! processes, and the decoder must be *total* (arbitrary bytes never panic, they
//! only produce a [`DecodeError`]), which is easiest to guarantee (and to fuzz)
//! with a small explicit reader over `&[u8]`.
//!
//! Every frame is `magic (2 bytes "CW") | version (1) | kind (1) | payload
//! length (u16 LE) | payload`. All integers are little-endian.
//!
//! ```
//! use corewise_arbiter::protocol::{decode_request, encode_request, Request};
//! let bytes = encode_request(&Request::SetRequestedCores { counts: [0, 1, 0, 0, 0, 0, 0, 2] });
//! let (msg, used) = decode_request(&bytes).unwrap().unwrap();
//! assert_eq!(used, bytes.len());
//! assert_eq!(msg, Request::SetRequestedCores { counts: [0, 1, 0, 0, 0, 0, 0, 2] });
//! // Garbage is an error, never a panic.
//! assert!(decode_request(b"not a frame at all").is_err());
//! ```

use thiserror::Error;

/// Protocol version carried in every frame.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, encode_request, DecodeError, Request, PROTOCOL_VERSION};
/// let mut f = encode_request(&Request::HelloApp);
/// assert_eq!(f[2], PROTOCOL_VERSION);
/// f[2] = PROTOCOL_VERSION + 1;
/// assert_eq!(decode_request(&f), Err(DecodeError::BadVersion(PROTOCOL_VERSION + 1)));
/// ```
pub const PROTOCOL_VERSION: u8 = 1;
/// Frame magic.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, encode_request, DecodeError, Request, MAGIC};
/// assert!(encode_request(&Request::StatusQuery).starts_with(&MAGIC));
/// // The first wrong byte is enough to reject a frame.
/// assert_eq!(decode_request(b"GET"), Err(DecodeError::BadMagic));
/// ```
pub const MAGIC: [u8; 2] = *b"CW";
/// Size of the frame header.
///
/// ```
/// use corewise_arbiter::protocol::{encode_request, Request, HEADER_LEN};
/// // A message without payload is just the header.
/// assert_eq!(encode_request(&Request::BlockUntilCoreAvailable).len(), HEADER_LEN);
/// assert_eq!(encode_request(&Request::ReplaceThread { tid: 1 }).len(), HEADER_LEN + 4);
/// ```
pub const HEADER_LEN: usize = 6;
/// Largest payload the daemon accepts from a client.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, DecodeError, MAX_REQUEST_PAYLOAD};
/// let len = (MAX_REQUEST_PAYLOAD as u16 + 1).to_le_bytes();
/// let header = [b'C', b'W', 1, 3, len[0], len[1]];
/// // Refused from the header alone, before the payload arrives.
/// assert_eq!(decode_request(&header), Err(DecodeError::TooLong(MAX_REQUEST_PAYLOAD + 1)));
/// ```
pub const MAX_REQUEST_PAYLOAD: usize = 64;
/// Largest payload a client accepts from the daemon (status replies).
///
/// ```
/// use corewise_arbiter::protocol::{encode_response, Response, StatusEntry, HEADER_LEN, MAX_RESPONSE_PAYLOAD};
/// let e = StatusEntry { pid: 1, uid: 0, name: "x".into(), requested: [0; 8], granted: vec![], preempted: 0 };
/// // A status table too long for one frame is cut to what fits.
/// let f = encode_response(&Response::Status { entries: vec![e; 10_000] });
/// assert!(f.len() <= HEADER_LEN + MAX_RESPONSE_PAYLOAD);
/// ```
pub const MAX_RESPONSE_PAYLOAD: usize = u16::MAX as usize;
/// Number of priority levels; level 0 is the highest priority.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, encode_request, Request, PRIORITY_LEVELS};
/// let mut counts = [0u32; PRIORITY_LEVELS];
/// counts[PRIORITY_LEVELS - 1] = 2; // two cores at the lowest priority
/// let f = encode_request(&Request::SetRequestedCores { counts });
/// let Some((Request::SetRequestedCores { counts: got }, _)) = decode_request(&f).unwrap() else { panic!() };
/// assert_eq!(got[7], 2);
/// ```
pub const PRIORITY_LEVELS: usize = 8;
/// Largest number of cores that may be requested at one level.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, encode_request, DecodeError, Request, MAX_CORES_PER_LEVEL};
/// let ok = encode_request(&Request::SetRequestedCores { counts: [MAX_CORES_PER_LEVEL, 0, 0, 0, 0, 0, 0, 0] });
/// assert!(decode_request(&ok).is_ok());
/// let too_many = encode_request(&Request::SetRequestedCores { counts: [MAX_CORES_PER_LEVEL + 1, 0, 0, 0, 0, 0, 0, 0] });
/// assert_eq!(decode_request(&too_many), Err(DecodeError::OutOfRange("core count")));
/// ```
pub const MAX_CORES_PER_LEVEL: u32 = 4096;
/// Longest application name carried in a status entry.
///
/// ```
/// use corewise_arbiter::protocol::{decode_response, encode_response, Response, StatusEntry, MAX_NAME_LEN};
/// let e = StatusEntry { pid: 1, uid: 0, name: "n".repeat(100), requested: [0; 8], granted: vec![], preempted: 0 };
/// let f = encode_response(&Response::Status { entries: vec![e] });
/// let Some((Response::Status { entries }, _)) = decode_response(&f).unwrap() else { panic!() };
/// assert_eq!(entries[0].name.len(), MAX_NAME_LEN);
/// ```
pub const MAX_NAME_LEN: usize = 64;
/// Longest message carried in an error frame.
///
/// ```
/// use corewise_arbiter::protocol::{decode_response, encode_response, Response, MAX_ERROR_LEN};
/// let f = encode_response(&Response::Error { message: "e".repeat(1000) });
/// let Some((Response::Error { message }, _)) = decode_response(&f).unwrap() else { panic!() };
/// assert_eq!(message.len(), MAX_ERROR_LEN);
/// ```
pub const MAX_ERROR_LEN: usize = 200;

/// A message from a client to the daemon.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, encode_request, Request};
/// let req = Request::AttachThread { app_token: 0xfeed, tid: 1234 };
/// let f = encode_request(&req);
/// assert_eq!(decode_request(&f), Ok(Some((req, f.len()))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First message on an application's control socket: registers a new
    /// application (identified by the socket's peer credentials).
    HelloApp,
    /// First message on a kernel thread's socket: ties it to an application.
    AttachThread {
        /// Token received in [`Response::Welcome`].
        app_token: u64,
        /// Linux thread id of the calling kernel thread.
        tid: u32,
    },
    /// Cores wanted at each priority level (index 0 = highest priority).
    SetRequestedCores {
        /// Core counts per level.
        counts: [u32; PRIORITY_LEVELS],
    },
    /// The calling kernel thread gives back any core it holds and waits for one.
    BlockUntilCoreAvailable,
    /// Ask for the status table (answered with [`Response::Status`]).
    StatusQuery,
    /// On a kernel thread's connection: from now on this connection's
    /// kernel thread is `tid`, another thread of the same process (the
    /// application handed the core to a spare kernel thread while the
    /// attached one is blocked in the kernel). If the connection holds a
    /// core, `tid` joins that core's cpuset and the thread it replaces
    /// goes back to the unmanaged set. Answered with
    /// [`Response::Replaced`], or refused with a [`Response::Error`] that
    /// changes nothing and leaves the connection open.
    ///
    /// ```
    /// use corewise_arbiter::protocol::{decode_request, encode_request, Request};
    /// let f = encode_request(&Request::ReplaceThread { tid: 4242 });
    /// assert_eq!(decode_request(&f), Ok(Some((Request::ReplaceThread { tid: 4242 }, f.len()))));
    /// ```
    ReplaceThread {
        /// Linux thread id of the kernel thread that takes over.
        tid: u32,
    },
}

/// One row of the status table.
///
/// ```
/// use corewise_arbiter::protocol::{decode_response, encode_response, Response, StatusEntry};
/// let e = StatusEntry {
///     pid: 4321,
///     uid: 1000,
///     name: "kv".into(),
///     requested: [0, 2, 0, 0, 0, 0, 0, 0],
///     granted: vec![2, 3],
///     preempted: 1,
/// };
/// let f = encode_response(&Response::Status { entries: vec![e.clone()] });
/// let (back, _) = decode_response(&f).unwrap().unwrap();
/// assert_eq!(back, Response::Status { entries: vec![e] });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusEntry {
    /// Process id of the application.
    pub pid: u32,
    /// User id of the application.
    pub uid: u32,
    /// Process name (`/proc/<pid>/comm`).
    pub name: String,
    /// Requested cores per priority level after limits were applied.
    pub requested: [u32; PRIORITY_LEVELS],
    /// Cores currently granted.
    pub granted: Vec<u32>,
    /// Number of times a core was taken away by force.
    pub preempted: u32,
}

/// A message from the daemon to a client.
///
/// ```
/// use corewise_arbiter::protocol::{decode_response, encode_response, Response};
/// let ack = Response::RequestAck { effective: [1, 0, 0, 0, 0, 0, 0, 0], clipped: true };
/// let f = encode_response(&ack);
/// assert_eq!(decode_response(&f), Ok(Some((ack, f.len()))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Answer to [`Request::HelloApp`]; the shared page travels as SCM_RIGHTS.
    Welcome {
        /// Token that kernel-thread sockets present in [`Request::AttachThread`].
        app_token: u64,
    },
    /// Answer to [`Request::AttachThread`].
    Attached,
    /// Answer to [`Request::SetRequestedCores`].
    RequestAck {
        /// The request as the daemon will apply it.
        effective: [u32; PRIORITY_LEVELS],
        /// Whether the request was clipped by the user's limits.
        clipped: bool,
    },
    /// The kernel thread now owns this core and is confined to it.
    Granted {
        /// Core id.
        core: u32,
    },
    /// The core was reclaimed by force after the release timeout.
    Preempted {
        /// Core id.
        core: u32,
    },
    /// Answer to [`Request::ReplaceThread`]: the new kernel thread is the
    /// connection's from now on (and confined to its core, if it holds one).
    Replaced,
    /// Answer to [`Request::StatusQuery`].
    Status {
        /// One row per application.
        entries: Vec<StatusEntry>,
    },
    /// The daemon refuses the connection (bad frame, wrong protocol
    /// version, a limit reached) and closes it after this frame; or it
    /// refuses a [`Request::ReplaceThread`], which leaves the connection
    /// open and unchanged. It always
    /// carries the daemon's own protocol version, so a client of another
    /// version learns which one the daemon speaks.
    Error {
        /// Why, for a human (at most [`MAX_ERROR_LEN`] bytes).
        message: String,
    },
}

/// Why bytes could not be decoded.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, DecodeError};
/// assert_eq!(decode_request(b"CW\x01\xee\x00\x00"), Err(DecodeError::UnknownKind(0xee)));
/// // A payload that does not fit the kind (hello takes none).
/// assert_eq!(decode_request(b"CW\x01\x01\x01\x00x"), Err(DecodeError::Malformed(1)));
/// assert_eq!(DecodeError::BadVersion(9).to_string(), "unsupported protocol version 9");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The frame does not start with [`MAGIC`].
    #[error("bad frame magic")]
    BadMagic,
    /// The frame uses another protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// Unknown message kind.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The payload is longer than allowed.
    #[error("payload of {0} bytes is too long")]
    TooLong(usize),
    /// The payload length does not fit the message kind.
    #[error("malformed payload for message kind {0}")]
    Malformed(u8),
    /// A field is out of its valid range.
    #[error("field out of range: {0}")]
    OutOfRange(&'static str),
}

const K_HELLO: u8 = 1;
const K_ATTACH: u8 = 2;
const K_SET: u8 = 3;
const K_BLOCK: u8 = 4;
const K_STATUS_Q: u8 = 5;
const K_REPLACE: u8 = 6;
const K_WELCOME: u8 = 101;
const K_ATTACHED: u8 = 102;
const K_ACK: u8 = 103;
const K_GRANTED: u8 = 104;
const K_PREEMPTED: u8 = 105;
const K_STATUS: u8 = 106;
const K_ERROR: u8 = 107;
const K_REPLACED: u8 = 108;

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len().min(MAX_RESPONSE_PAYLOAD);
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(kind);
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&payload[..len]);
    out
}

/// One raw frame: kind, payload, bytes consumed.
type RawFrame<'a> = (u8, &'a [u8], usize);

/// Splits one frame off the front of `buf`: `Ok(None)` means more bytes are needed.
fn split_frame(buf: &[u8], max_payload: usize) -> Result<Option<RawFrame<'_>>, DecodeError> {
    // Check the magic and version as soon as those bytes are present, so a
    // garbage sender is detected without waiting for a full header.
    for (i, m) in MAGIC.iter().enumerate() {
        match buf.get(i) {
            Some(b) if b != m => return Err(DecodeError::BadMagic),
            Some(_) => {}
            None => return Ok(None),
        }
    }
    match buf.get(2) {
        Some(&v) if v != PROTOCOL_VERSION => return Err(DecodeError::BadVersion(v)),
        Some(_) => {}
        None => return Ok(None),
    }
    let (Some(&kind), Some(&l0), Some(&l1)) = (buf.get(3), buf.get(4), buf.get(5)) else {
        return Ok(None);
    };
    let len = u16::from_le_bytes([l0, l1]) as usize;
    if len > max_payload {
        return Err(DecodeError::TooLong(len));
    }
    match buf.get(HEADER_LEN..HEADER_LEN + len) {
        Some(payload) => Ok(Some((kind, payload, HEADER_LEN + len))),
        None => Ok(None),
    }
}

/// Little reader over a payload that never panics.
struct Reader<'a> {
    buf: &'a [u8],
    kind: u8,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Malformed(self.kind));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// A Linux thread id: positive and within `pid_t`.
    fn tid(&mut self) -> Result<u32, DecodeError> {
        let tid = self.u32()?;
        if tid == 0 || tid > i32::MAX as u32 {
            return Err(DecodeError::OutOfRange("tid"));
        }
        Ok(tid)
    }
    fn counts(&mut self) -> Result<[u32; PRIORITY_LEVELS], DecodeError> {
        let mut c = [0u32; PRIORITY_LEVELS];
        for v in c.iter_mut() {
            *v = self.u32()?;
            if *v > MAX_CORES_PER_LEVEL {
                return Err(DecodeError::OutOfRange("core count"));
            }
        }
        Ok(c)
    }
    fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed(self.kind))
        }
    }
}

fn put_counts(out: &mut Vec<u8>, counts: &[u32; PRIORITY_LEVELS]) {
    for c in counts {
        out.extend_from_slice(&c.to_le_bytes());
    }
}

/// Encodes a client request as one frame.
///
/// ```
/// use corewise_arbiter::protocol::{encode_request, Request};
/// assert_eq!(&encode_request(&Request::HelloApp)[..2], b"CW");
/// ```
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut p = Vec::new();
    let kind = match req {
        Request::HelloApp => K_HELLO,
        Request::AttachThread { app_token, tid } => {
            p.extend_from_slice(&app_token.to_le_bytes());
            p.extend_from_slice(&tid.to_le_bytes());
            K_ATTACH
        }
        Request::SetRequestedCores { counts } => {
            put_counts(&mut p, counts);
            K_SET
        }
        Request::BlockUntilCoreAvailable => K_BLOCK,
        Request::StatusQuery => K_STATUS_Q,
        Request::ReplaceThread { tid } => {
            p.extend_from_slice(&tid.to_le_bytes());
            K_REPLACE
        }
    };
    frame(kind, &p)
}

/// Decodes one client request from the front of `buf`.
///
/// Returns `Ok(None)` if `buf` holds only part of a frame, `Ok(Some((msg,
/// consumed)))` on success and an error for anything malformed. Total: never
/// panics, whatever the input.
///
/// ```
/// use corewise_arbiter::protocol::{decode_request, encode_request, Request};
/// let f = encode_request(&Request::BlockUntilCoreAvailable);
/// assert_eq!(decode_request(&f[..3]), Ok(None));
/// assert_eq!(decode_request(&f), Ok(Some((Request::BlockUntilCoreAvailable, f.len()))));
/// ```
pub fn decode_request(buf: &[u8]) -> Result<Option<(Request, usize)>, DecodeError> {
    let Some((kind, payload, used)) = split_frame(buf, MAX_REQUEST_PAYLOAD)? else {
        return Ok(None);
    };
    let mut r = Reader { buf: payload, kind };
    let msg = match kind {
        K_HELLO => Request::HelloApp,
        K_ATTACH => {
            let app_token = r.u64()?;
            let tid = r.tid()?;
            Request::AttachThread { app_token, tid }
        }
        K_REPLACE => Request::ReplaceThread { tid: r.tid()? },
        K_SET => Request::SetRequestedCores {
            counts: r.counts()?,
        },
        K_BLOCK => Request::BlockUntilCoreAvailable,
        K_STATUS_Q => Request::StatusQuery,
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(Some((msg, used)))
}

/// Encodes a daemon response as one frame.
///
/// ```
/// use corewise_arbiter::protocol::{decode_response, encode_response, Response};
/// let f = encode_response(&Response::Granted { core: 3 });
/// assert_eq!(decode_response(&f).unwrap().unwrap().0, Response::Granted { core: 3 });
/// ```
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let mut p = Vec::new();
    let kind = match resp {
        Response::Welcome { app_token } => {
            p.extend_from_slice(&app_token.to_le_bytes());
            K_WELCOME
        }
        Response::Attached => K_ATTACHED,
        Response::Replaced => K_REPLACED,
        Response::RequestAck { effective, clipped } => {
            put_counts(&mut p, effective);
            p.push(u8::from(*clipped));
            K_ACK
        }
        Response::Granted { core } => {
            p.extend_from_slice(&core.to_le_bytes());
            K_GRANTED
        }
        Response::Preempted { core } => {
            p.extend_from_slice(&core.to_le_bytes());
            K_PREEMPTED
        }
        Response::Status { entries } => {
            let mut count = 0u16;
            let mut body = Vec::new();
            for e in entries {
                let mut one = Vec::new();
                one.extend_from_slice(&e.pid.to_le_bytes());
                one.extend_from_slice(&e.uid.to_le_bytes());
                one.extend_from_slice(&e.preempted.to_le_bytes());
                put_counts(&mut one, &e.requested);
                let mut name_end = e.name.len().min(MAX_NAME_LEN);
                while !e.name.is_char_boundary(name_end) {
                    name_end -= 1;
                }
                let name = &e.name.as_bytes()[..name_end];
                one.push(name.len() as u8);
                one.extend_from_slice(name);
                let ncores = e.granted.len().min(u16::MAX as usize);
                one.extend_from_slice(&(ncores as u16).to_le_bytes());
                for c in &e.granted[..ncores] {
                    one.extend_from_slice(&c.to_le_bytes());
                }
                if 2 + body.len() + one.len() > MAX_RESPONSE_PAYLOAD || count == u16::MAX {
                    break;
                }
                body.extend_from_slice(&one);
                count += 1;
            }
            p.extend_from_slice(&count.to_le_bytes());
            p.extend_from_slice(&body);
            K_STATUS
        }
        Response::Error { message } => {
            let mut end = message.len().min(MAX_ERROR_LEN);
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            p.extend_from_slice(&message.as_bytes()[..end]);
            K_ERROR
        }
    };
    frame(kind, &p)
}

/// Decodes one daemon response from the front of `buf` (total, like
/// [`decode_request`]).
///
/// ```
/// use corewise_arbiter::protocol::decode_response;
/// assert!(decode_response(&[b'C', b'W', 1, 250, 0, 0]).is_err());
/// ```
pub fn decode_response(buf: &[u8]) -> Result<Option<(Response, usize)>, DecodeError> {
    let Some((kind, payload, used)) = split_frame(buf, MAX_RESPONSE_PAYLOAD)? else {
        return Ok(None);
    };
    let mut r = Reader { buf: payload, kind };
    let msg = match kind {
        K_WELCOME => Response::Welcome {
            app_token: r.u64()?,
        },
        K_ATTACHED => Response::Attached,
        K_REPLACED => Response::Replaced,
        K_ACK => {
            let effective = r.counts()?;
            let clipped = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::OutOfRange("clipped flag")),
            };
            Response::RequestAck { effective, clipped }
        }
        K_GRANTED => Response::Granted { core: r.u32()? },
        K_PREEMPTED => Response::Preempted { core: r.u32()? },
        K_STATUS => {
            let n = r.u16()?;
            let mut entries = Vec::new();
            for _ in 0..n {
                let pid = r.u32()?;
                let uid = r.u32()?;
                let preempted = r.u32()?;
                let requested = r.counts()?;
                let name_len = r.u8()? as usize;
                if name_len > MAX_NAME_LEN {
                    return Err(DecodeError::OutOfRange("name length"));
                }
                let name = String::from_utf8_lossy(r.bytes(name_len)?).into_owned();
                let ncores = r.u16()?;
                let mut granted = Vec::new();
                for _ in 0..ncores {
                    granted.push(r.u32()?);
                }
                entries.push(StatusEntry {
                    pid,
                    uid,
                    name,
                    requested,
                    granted,
                    preempted,
                });
            }
            Response::Status { entries }
        }
        K_ERROR => {
            let n = r.buf.len();
            if n > MAX_ERROR_LEN {
                return Err(DecodeError::OutOfRange("error message length"));
            }
            Response::Error {
                message: String::from_utf8_lossy(r.bytes(n)?).into_owned(),
            }
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(Some((msg, used)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_requests() {
        let all = [
            Request::HelloApp,
            Request::AttachThread {
                app_token: 0xdead_beef_1234,
                tid: 77,
            },
            Request::SetRequestedCores {
                counts: [1, 2, 3, 4, 5, 6, 7, 8],
            },
            Request::BlockUntilCoreAvailable,
            Request::StatusQuery,
            Request::ReplaceThread { tid: 4_000_000 },
        ];
        let mut stream = Vec::new();
        for m in &all {
            stream.extend(encode_request(m));
        }
        let mut off = 0;
        for m in &all {
            let (got, used) = decode_request(&stream[off..]).unwrap().unwrap();
            assert_eq!(&got, m);
            off += used;
        }
        assert_eq!(off, stream.len());
    }

    #[test]
    fn round_trip_responses() {
        let all = [
            Response::Welcome { app_token: 9 },
            Response::Attached,
            Response::RequestAck {
                effective: [0, 0, 1, 0, 0, 0, 0, 0],
                clipped: true,
            },
            Response::Granted { core: 5 },
            Response::Preempted { core: 6 },
            Response::Replaced,
            Response::Status {
                entries: vec![StatusEntry {
                    pid: 1,
                    uid: 2,
                    name: "app".into(),
                    requested: [1; 8],
                    granted: vec![1, 3],
                    preempted: 4,
                }],
            },
            Response::Error {
                message: "unsupported protocol version 9".into(),
            },
        ];
        for m in &all {
            let f = encode_response(m);
            assert_eq!(decode_response(&f).unwrap().unwrap(), (m.clone(), f.len()));
        }
    }

    #[test]
    fn rejects_bad_frames() {
        assert_eq!(decode_request(b"XW"), Err(DecodeError::BadMagic));
        assert_eq!(
            decode_request(&[b'C', b'W', 9]),
            Err(DecodeError::BadVersion(9))
        );
        assert_eq!(
            decode_request(&[b'C', b'W', 1, 42, 0, 0]),
            Err(DecodeError::UnknownKind(42))
        );
        // Hello with a stray payload byte.
        assert_eq!(
            decode_request(&[b'C', b'W', 1, K_HELLO, 1, 0, 0]),
            Err(DecodeError::Malformed(K_HELLO))
        );
        assert_eq!(
            decode_request(&[b'C', b'W', 1, K_HELLO, 0xff, 0xff]),
            Err(DecodeError::TooLong(0xffff))
        );
        let mut f = encode_request(&Request::SetRequestedCores { counts: [0; 8] });
        f[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_request(&f),
            Err(DecodeError::OutOfRange("core count"))
        );
        // Thread ids outside `pid_t`'s positive range, and a short payload.
        for bad in [0, i32::MAX as u32 + 1, u32::MAX] {
            let f = encode_request(&Request::ReplaceThread { tid: bad });
            assert_eq!(decode_request(&f), Err(DecodeError::OutOfRange("tid")));
        }
        assert_eq!(
            decode_request(&[b'C', b'W', 1, K_REPLACE, 3, 0, 1, 2, 3]),
            Err(DecodeError::Malformed(K_REPLACE))
        );
        // `Replaced` carries nothing.
        assert_eq!(
            decode_response(&[b'C', b'W', 1, K_REPLACED, 1, 0, 0]),
            Err(DecodeError::Malformed(K_REPLACED))
        );
    }

    proptest! {
        #[test]
        fn decoders_are_total(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }

        #[test]
        fn decoders_are_total_after_valid_header(kind in any::<u8>(), rest in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut bytes = vec![b'C', b'W', PROTOCOL_VERSION, kind];
            bytes.extend(rest);
            if let Ok(Some((_, used))) = decode_request(&bytes) {
                prop_assert!(used <= bytes.len());
            }
            if let Ok(Some((_, used))) = decode_response(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn replace_thread_round_trips(tid in 1u32..=i32::MAX as u32) {
            let f = encode_request(&Request::ReplaceThread { tid });
            prop_assert_eq!(decode_request(&f).unwrap().unwrap(), (Request::ReplaceThread { tid }, f.len()));
        }

        #[test]
        fn set_requested_round_trips(counts in proptest::array::uniform8(0u32..=MAX_CORES_PER_LEVEL)) {
            let f = encode_request(&Request::SetRequestedCores { counts });
            prop_assert_eq!(decode_request(&f).unwrap().unwrap().0, Request::SetRequestedCores { counts });
        }
    }
}
