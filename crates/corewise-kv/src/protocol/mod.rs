//! memcached's protocols: the classic text commands and the meta commands
//! (this module), and the binary protocol's frames ([`binary`]).
//!
//! Why a separate, pure module: the parser is the one piece of the server
//! that sees arbitrary bytes from the network, so it is a total function
//! over a byte buffer — no I/O, no store, no allocation of request data
//! (requests borrow keys and values from the connection's buffer) — and can
//! be property-tested and fuzzed on its own. [`Decoder`] is incremental: it
//! is handed whatever the connection has buffered and either returns one
//! request (and how many bytes it used), asks for more bytes, or reports a
//! protocol error and how much input the error swallowed, exactly as
//! memcached does, so one bad request never costs the connection.

mod base64;
pub mod binary;
mod meta;
mod parse;

pub use base64::{decode_base64, encode_base64};
pub use meta::{MetaCmd, MetaFlags, MetaMode};
pub(crate) use parse::c_number;
pub use parse::{Decoded, Decoder, Limits, GET_LINE_MAX, KEY_MAX, MAX_LINE, PARTIAL_LINE_MAX};

use thiserror::Error;

/// A protocol error: its `Display` is the exact line memcached sends
/// (without the CRLF).
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, ProtoError};
/// let mut d = Decoder::new(Limits::default());
/// assert_eq!(d.decode(b"bogus\r\n"), (7, Decoded::Error(ProtoError::Unknown)));
/// assert_eq!(d.decode(b"incr k x\r\n").1, Decoded::Error(ProtoError::BadDelta));
/// // Its Display is the line memcached sends.
/// assert_eq!(ProtoError::BadDelta.to_string(), "CLIENT_ERROR invalid numeric delta argument");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// Unknown command or wrong number of arguments.
    #[error("ERROR")]
    Unknown,
    /// A malformed command line (bad number, key too long, ...).
    #[error("CLIENT_ERROR bad command line format")]
    BadFormat,
    /// A retrieval line longer than its limit ([`GET_LINE_MAX`]); the rest
    /// of the line is skipped.
    /// (Any other line over [`PARTIAL_LINE_MAX`] closes the connection.)
    #[error("CLIENT_ERROR line too long")]
    LineTooLong,
    /// An error on a command that ends in `noreply`: memcached sends
    /// nothing, so a pipelining client's replies stay in step.
    #[error("")]
    Silenced,
    /// `cache_memlimit` below memcached's floor of 8 MB.
    #[error("MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m")]
    MemLimitTooSmall,
    /// A value larger than the item size limit; the data block is skipped.
    #[error("SERVER_ERROR object too large for cache")]
    TooLarge,
    /// The data block was not followed by CRLF.
    #[error("CLIENT_ERROR bad data chunk")]
    BadChunk,
    /// incr/decr with a delta that is not a 64-bit unsigned number.
    #[error("CLIENT_ERROR invalid numeric delta argument")]
    BadDelta,
    /// touch/gat with an exptime that is not a number.
    #[error("CLIENT_ERROR invalid exptime argument")]
    BadExptime,
    /// delete with an argument other than `0` or `noreply`.
    #[error("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]")]
    DeleteUsage,
    /// A meta command with an unknown or malformed flag.
    #[error("CLIENT_ERROR invalid flag")]
    BadFlag,
    /// A meta command with the same flag twice.
    #[error("CLIENT_ERROR duplicate flag")]
    DuplicateFlag,
    /// `ms` with an unknown mode.
    #[error("CLIENT_ERROR invalid mode for ms M token")]
    BadMode,
    /// `ma` with an unknown mode.
    #[error("CLIENT_ERROR invalid mode for ma M token")]
    BadArithMode,
    /// A mode token (`M`) that is not one letter.
    #[error("CLIENT_ERROR incorrect length for M token")]
    ModeLength,
    /// `mg`/`ms` with a number flag (`T`, `N`, `R`, `C`) that is not one.
    #[error("CLIENT_ERROR bad token in command line format")]
    BadToken,
    /// A meta `D` that is not a 64-bit unsigned number.
    #[error("CLIENT_ERROR invalid numeric delta value")]
    BadDeltaValue,
    /// A meta `J` that is not a 64-bit unsigned number.
    #[error("CLIENT_ERROR invalid numeric initial value")]
    BadInitialValue,
    /// Any bad flag of `md` or `ma` (memcached words them all so).
    #[error("CLIENT_ERROR invalid or duplicate flag")]
    InvalidOrDuplicateFlag,
    /// An opaque (`O`) over 31 bytes.
    #[error("CLIENT_ERROR opaque token too long")]
    OpaqueTooLong,
    /// `mg` with more flag tokens than memcached's tokenizer keeps.
    #[error("CLIENT_ERROR options flags are too long")]
    FlagsTooLong,
    /// `ms`, `md` or `ma` with more flag tokens than memcached keeps.
    #[error("CLIENT_ERROR options flags too long")]
    TooManyFlags,
    /// A base64 key (meta `b` flag) that does not decode.
    #[error("CLIENT_ERROR error decoding key")]
    BadKeyEncoding,
}

/// get, gets, gat, gats.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, GetKind, Limits, Request};
/// let mut d = Decoder::new(Limits::default());
/// let (_, r) = d.decode(b"gats 60 a b\r\n");
/// let Decoded::Request(Request::Get { kind, exptime, keys }) = r else { panic!() };
/// assert_eq!((kind, exptime), (GetKind::Gats, 60));
/// assert_eq!(keys.iter().count(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetKind {
    /// `get`: value and flags.
    Get,
    /// `gets`: also the CAS value.
    Gets,
    /// `gat`: get and touch.
    Gat,
    /// `gats`: get and touch, with CAS.
    Gats,
}

/// The classic storage commands.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request, StoreCmd};
/// let mut d = Decoder::new(Limits::default());
/// let (_, r) = d.decode(b"cas k 0 0 1 99\r\nx\r\n");
/// assert!(matches!(r, Decoded::Request(Request::Store { cmd: StoreCmd::Cas, cas: 99, .. })));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCmd {
    /// `set`.
    Set,
    /// `add`.
    Add,
    /// `replace`.
    Replace,
    /// `append`.
    Append,
    /// `prepend`.
    Prepend,
    /// `cas`.
    Cas,
}

/// The keys of a retrieval, borrowed from the request line and split
/// lazily.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request};
/// let mut d = Decoder::new(Limits::default());
/// let (_, r) = d.decode(b"get a bb ccc\r\n");
/// let Decoded::Request(Request::Get { keys, .. }) = r else { panic!() };
/// assert_eq!(keys.iter().collect::<Vec<_>>(), [&b"a"[..], b"bb", b"ccc"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a>(pub(crate) &'a [u8]);

impl<'a> Keys<'a> {
    /// The keys, in request order.
    ///
    /// ```
    /// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request};
    /// let mut d = Decoder::new(Limits::default());
    /// let (_, r) = d.decode(b"get  x   y\r\n"); // extra spaces are no keys
    /// let Decoded::Request(Request::Get { keys, .. }) = r else { panic!() };
    /// assert_eq!(keys.iter().collect::<Vec<_>>(), [&b"x"[..], b"y"]);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.split(|&b| b == b' ').filter(|k| !k.is_empty())
    }
}

/// One parsed request; keys and values borrow the connection's buffer.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request};
/// let mut d = Decoder::new(Limits::default());
/// let (_, r) = d.decode(b"delete k noreply\r\n");
/// assert_eq!(r, Decoded::Request(Request::Delete { key: b"k", noreply: true }));
/// let (_, r) = d.decode(b"incr n 5\r\n");
/// assert_eq!(r, Decoded::Request(Request::Arith { key: b"n", incr: true, delta: 5, noreply: false }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request<'a> {
    /// get, gets, gat, gats.
    Get {
        /// Which of the four.
        kind: GetKind,
        /// New expiry (gat, gats).
        exptime: i64,
        /// The keys.
        keys: Keys<'a>,
    },
    /// set, add, replace, append, prepend, cas.
    Store {
        /// Which command.
        cmd: StoreCmd,
        /// The key.
        key: &'a [u8],
        /// Client flags.
        flags: u32,
        /// Expiry argument.
        exptime: i64,
        /// The value.
        data: &'a [u8],
        /// The CAS value (cas only).
        cas: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// delete.
    Delete {
        /// The key.
        key: &'a [u8],
        /// No reply wanted.
        noreply: bool,
    },
    /// incr (`incr` true) or decr.
    Arith {
        /// The key.
        key: &'a [u8],
        /// incr or decr.
        incr: bool,
        /// The amount.
        delta: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// touch.
    Touch {
        /// The key.
        key: &'a [u8],
        /// New expiry.
        exptime: i64,
        /// No reply wanted.
        noreply: bool,
    },
    /// flush_all, with an optional delay.
    FlushAll {
        /// Delay (expiry rules), 0 for now; `None` when it is not a
        /// number (`CLIENT_ERROR invalid exptime argument`, unless
        /// flushing is off).
        delay: Option<i64>,
        /// No reply wanted.
        noreply: bool,
    },
    /// stats, with an optional group name and its arguments.
    Stats {
        /// The rest of the line: the group (`settings`, `items`, `slabs`,
        /// `detail on`, ...).
        group: Option<&'a [u8]>,
    },
    /// An operator command: `shutdown`, `lru_crawler`, `slabs`, `lru`,
    /// `watch` (see [`crate::admin`]).
    Admin {
        /// The command word.
        cmd: &'a [u8],
        /// The rest of the line.
        args: &'a [u8],
    },
    /// version.
    Version,
    /// cache_memlimit: a new memory limit in megabytes.
    MemLimit {
        /// Megabytes.
        mb: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// verbosity.
    Verbosity {
        /// The level asked for (its low 32 bits, as memcached's
        /// `safe_strtoul` keeps them).
        level: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// quit.
    Quit,
    /// A storage command (classic or `ms`) whose item is over the item
    /// size limit (its data block is skipped): memcached answers
    /// `SERVER_ERROR object too large for cache`, and for `set` and `ms`
    /// removes the key's old value (so a failed update leaves no stale
    /// value behind); `add`, `replace`, `append`, `prepend` and `cas`
    /// leave it.
    TooLarge {
        /// The key.
        key: &'a [u8],
        /// Whether the error line is suppressed.
        noreply: bool,
        /// The key is base64 (`ms ... b`).
        base64: bool,
        /// The key's old value goes (`set`, `ms`).
        remove_old: bool,
    },
    /// Meta get (`mg`).
    MetaGet {
        /// The key (base64 when `flags.base64`).
        key: &'a [u8],
        /// The flags.
        flags: MetaFlags<'a>,
    },
    /// Meta set (`ms`).
    MetaSet {
        /// The key (base64 when `flags.base64`).
        key: &'a [u8],
        /// The value.
        data: &'a [u8],
        /// The flags.
        flags: MetaFlags<'a>,
    },
    /// Meta delete (`md`).
    MetaDelete {
        /// The key (base64 when `flags.base64`).
        key: &'a [u8],
        /// The flags.
        flags: MetaFlags<'a>,
    },
    /// Meta arithmetic (`ma`).
    MetaArith {
        /// The key (base64 when `flags.base64`).
        key: &'a [u8],
        /// The flags.
        flags: MetaFlags<'a>,
    },
    /// Meta no-op (`mn`).
    MetaNoop,
    /// Meta debug (`me`).
    MetaDebug {
        /// The key (base64 when `flags.base64`).
        key: &'a [u8],
        /// The flags.
        flags: MetaFlags<'a>,
    },
}
