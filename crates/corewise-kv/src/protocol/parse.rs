//! The incremental decoder.
//!
//! A request is a line (`\n`-terminated, an optional `\r` before it) and,
//! for storage commands, a data block of the announced length plus CRLF.
//! The decoder looks at the buffered bytes, and returns a request only when
//! all of it is there; until then it consumes nothing, so the caller keeps
//! the bytes and calls again with more. Errors that leave input behind that
//! must not be read as commands (an oversized value, an endless line) put
//! the decoder into a skipping state that eats exactly that input, as
//! memcached's "swallow" state does.

use super::meta::{MetaCmd, MetaFlags};
use super::{GetKind, Keys, ProtoError, Request, StoreCmd};

/// Longest key memcached accepts.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, ProtoError, KEY_MAX};
/// let mut d = Decoder::new(Limits::default());
/// let ok = format!("get {}\r\n", "k".repeat(KEY_MAX));
/// assert!(matches!(d.decode(ok.as_bytes()).1, Decoded::Request(_)));
/// let long = format!("get {}\r\n", "k".repeat(KEY_MAX + 1));
/// assert_eq!(d.decode(long.as_bytes()).1, Decoded::Error(ProtoError::BadFormat));
/// ```
pub const KEY_MAX: usize = 250;

/// Room for a command line beside a value in a connection's read buffer
/// (other lines are bounded by [`PARTIAL_LINE_MAX`], a multi-key get by
/// [`GET_LINE_MAX`]).
///
/// ```
/// use corewise_kv::protocol::{GET_LINE_MAX, MAX_LINE};
/// assert!(MAX_LINE < GET_LINE_MAX);
/// ```
pub const MAX_LINE: usize = 64 * 1024;

/// Longest retrieval line (`get`, `gets`, `gat`, `gats`). memcached lets a
/// multi-get name any number of keys (it grows its read buffer for the
/// line), and clients send one line for all of a `get_multi`'s keys on a
/// server: 50 000 keys of 50 bytes are a 2.5 MB line. Past this bound the
/// line is refused and the rest of it skipped.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, ProtoError, GET_LINE_MAX};
/// let mut d = Decoder::new(Limits { item_max: 1024, ..Limits::default() });
/// // Three megabytes of keys: one request.
/// let mut line = b"get".to_vec();
/// for i in 0..300_000 {
///     line.extend_from_slice(format!(" key{i:06}").as_bytes());
/// }
/// line.extend_from_slice(b"\r\n");
/// assert!(matches!(d.decode(&line).1, Decoded::Request(_)));
/// // A retrieval line past the limit is an error; the rest of it is skipped.
/// let mut line = b"get ".to_vec();
/// line.resize(GET_LINE_MAX + 10, b'k');
/// assert_eq!(d.decode(&line).1, Decoded::Error(ProtoError::LineTooLong));
/// ```
pub const GET_LINE_MAX: usize = 64 * 1024 * 1024;

/// Longest command line other than a retrieval's: a longer one closes
/// the connection, as in memcached (which closes a connection whose
/// buffered line passes 2 KiB without a newline unless it is a multi-get).
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request, PARTIAL_LINE_MAX};
/// let mut d = Decoder::new(Limits::default());
/// // Up to the limit: wait for the rest of the line.
/// assert_eq!(d.decode(&vec![b's'; PARTIAL_LINE_MAX]), (0, Decoded::Incomplete));
/// // Longer, and no retrieval: the connection is closed.
/// let long = vec![b's'; PARTIAL_LINE_MAX + 1];
/// assert_eq!(d.decode(&long), (long.len(), Decoded::Request(Request::Quit)));
/// ```
pub const PARTIAL_LINE_MAX: usize = 2048;

/// Limits the decoder enforces.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request};
/// let mut d = Decoder::new(Limits { item_max: 4, ..Limits::default() });
/// let (n, r) = d.decode(b"set k 0 0 5\r\nhello\r\n");
/// assert_eq!(
///     r,
///     Decoded::Request(Request::TooLarge { key: b"k", noreply: false, base64: false, remove_old: true })
/// );
/// assert_eq!(n, 13); // the line; the data block is skipped as it arrives
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest value accepted (memcached's `-I`).
    pub item_max: usize,
    /// Whether items carry CAS values (memcached's `-C` turns them off);
    /// without, a meta request that sets one (`E`) is refused, as
    /// memcached refuses it.
    pub cas: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            item_max: 1024 * 1024,
            cas: true,
        }
    }
}

/// What one call to [`Decoder::decode`] found.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, ProtoError, Request};
/// let mut d = Decoder::new(Limits::default());
/// assert_eq!(d.decode(b"vers"), (0, Decoded::Incomplete));
/// assert_eq!(d.decode(b"version\r\n"), (9, Decoded::Request(Request::Version)));
/// assert_eq!(d.decode(b"get\r\n").1, Decoded::Error(ProtoError::Unknown));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// Not enough bytes for a whole request (some may have been skipped).
    Incomplete,
    /// A request.
    Request(Request<'a>),
    /// A bad request: send this error line.
    Error(ProtoError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    None,
    /// Skip this many more bytes.
    Bytes(usize),
    /// Skip through the next newline.
    Line,
    /// Skip everything: the connection is being closed.
    All,
}

/// The incremental decoder of one connection.
///
/// ```
/// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request};
/// let mut d = Decoder::new(Limits::default());
/// let buf = b"set k 0 0 2\r\nhi\r\nget k\r\n";
/// let (n, r) = d.decode(buf);
/// assert!(matches!(r, Decoded::Request(Request::Store { data: b"hi", .. })));
/// let (m, r) = d.decode(&buf[n..]);
/// assert!(matches!(r, Decoded::Request(Request::Get { .. })));
/// assert_eq!(n + m, buf.len());
/// assert_eq!(d.decode(b"get k"), (0, Decoded::Incomplete));
/// ```
#[derive(Debug, Clone)]
pub struct Decoder {
    limits: Limits,
    skip: Skip,
    /// How many bytes at the start of the pending line are known to hold
    /// no newline (a long multi-get arrives in many reads; each is
    /// searched once).
    scanned: usize,
}

fn find_newline(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

/// C's `isspace` (the "C" locale): what `strtol` skips before a number,
/// and what memcached's `safe_strto*` accept right after one.
fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A number token as memcached's `safe_strtol`, `safe_strtoul` and
/// `safe_strtoull` read it: C's `strtol`/`strtoull` (leading whitespace
/// skipped, an optional sign, decimal digits), then a check that the
/// token ends there or goes on with whitespace, after which anything is
/// ignored. Tokens are split on spaces only, so a tab, or a CR left before
/// the line's CR LF (`set k 0 0 1\r\r\n`), ends a number here as it does
/// in memcached. The sign and the digits' value; `None` without digits,
/// past 64 bits (`ERANGE`), or with another byte right after the digits.
pub(crate) fn c_number(tok: &[u8]) -> Option<(bool, u64)> {
    let start = tok.iter().position(|&b| !c_space(b))?;
    let rest = tok.get(start..)?;
    let (negative, rest) = match rest.split_first() {
        Some((b'-', r)) => (true, r),
        Some((b'+', r)) => (false, r),
        _ => (false, rest),
    };
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(rest.len());
    let (digits, after) = rest.split_at(end);
    if digits.is_empty() || after.first().is_some_and(|&b| !c_space(b)) {
        return None;
    }
    let value = digits.iter().try_fold(0u64, |v, &d| {
        v.checked_mul(10)?
            .checked_add(u64::from(d.saturating_sub(b'0')))
    })?;
    Some((negative, value))
}

/// A signed number token, read as [`c_number`] reads it (`strtol`, kept
/// in 64 bits).
pub(super) fn parse_i64(tok: &[u8]) -> Option<i64> {
    match c_number(tok)? {
        (false, v) => i64::try_from(v).ok(),
        (true, v) => 0i64.checked_sub_unsigned(v),
    }
}

/// An unsigned number token, read as [`c_number`] reads it: `strtoull`
/// negates a `-` number, and memcached refuses the result when it is
/// negative as a signed number (so `-0` passes, `-1` does not).
pub(super) fn parse_u64(tok: &[u8]) -> Option<u64> {
    match c_number(tok)? {
        (false, v) => Some(v),
        (true, v) => Some(v.wrapping_neg()).filter(|&n| i64::try_from(n).is_ok()),
    }
}

fn key_ok(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= KEY_MAX
}

/// The line split into at most `N` space-separated tokens; the last holds
/// the rest of the line.
struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    fn next_token(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = self.rest.get(start..)?;
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (tok, tail) = rest.split_at(end);
        self.rest = tail;
        Some(tok)
    }

    fn rest(&self) -> &'a [u8] {
        let start = self
            .rest
            .iter()
            .position(|&b| b != b' ')
            .unwrap_or(self.rest.len());
        self.rest.get(start..).unwrap_or(&[])
    }

    fn collect_all(mut self) -> Vec<&'a [u8]> {
        let mut v = Vec::new();
        while let Some(t) = self.next_token() {
            v.push(t);
            if v.len() > 24 {
                break;
            }
        }
        v
    }
}

impl Decoder {
    /// A decoder with these limits.
    ///
    /// ```
    /// use corewise_kv::protocol::{Decoder, Limits};
    /// let d = Decoder::new(Limits { item_max: 2048, ..Limits::default() });
    /// assert_eq!(d.limits().item_max, 2048);
    /// ```
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            skip: Skip::None,
            scanned: 0,
        }
    }

    /// The limits.
    ///
    /// ```
    /// use corewise_kv::protocol::{Decoder, Limits};
    /// assert_eq!(Decoder::new(Limits::default()).limits(), Limits { item_max: 1 << 20, cas: true });
    /// ```
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Decodes the first request of `buf`: returns how many bytes it used
    /// (drop them from the buffer) and what it found. Never panics,
    /// whatever `buf` holds.
    ///
    /// ```
    /// use corewise_kv::protocol::{Decoded, Decoder, Limits, Request};
    /// let mut d = Decoder::new(Limits::default());
    /// let buf = b"touch k 10\r\nmn\r\n";
    /// let (n, r) = d.decode(buf);
    /// assert_eq!(r, Decoded::Request(Request::Touch { key: b"k", exptime: 10, noreply: false }));
    /// assert_eq!(d.decode(&buf[n..]), (4, Decoded::Request(Request::MetaNoop)));
    /// ```
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> (usize, Decoded<'a>) {
        let mut used = 0;
        loop {
            let rest = buf.get(used..).unwrap_or(&[]);
            match self.skip {
                Skip::None => break,
                Skip::Bytes(n) => {
                    let k = n.min(rest.len());
                    used += k;
                    if k < n {
                        self.skip = Skip::Bytes(n - k);
                        return (used, Decoded::Incomplete);
                    }
                    self.skip = Skip::None;
                }
                Skip::All => return (used + rest.len(), Decoded::Incomplete),
                Skip::Line => match find_newline(rest) {
                    Some(p) => {
                        used += p + 1;
                        self.skip = Skip::None;
                    }
                    None => return (used + rest.len(), Decoded::Incomplete),
                },
            }
        }
        let buf = buf.get(used..).unwrap_or(&[]);
        let max = self.line_max(buf);
        if max == PARTIAL_LINE_MAX && buf.len() > max && find_newline(&buf[..=max]).is_none() {
            // memcached closes a connection whose buffered line is over
            // 2 KiB with no newline and is not a multi-get: no command is
            // that long. Decided on the first 2 KiB + 1 bytes, so the
            // outcome does not depend on how the line was split into reads
            // (nor does anything after it: the decoder swallows the rest).
            self.skip = Skip::All;
            return (used + buf.len(), Decoded::Request(Request::Quit));
        }
        let from = if used == 0 {
            self.scanned.min(buf.len())
        } else {
            0
        };
        let Some(nl) = find_newline(&buf[from..]).map(|p| p + from) else {
            if buf.len() > max {
                self.scanned = 0;
                self.skip = Skip::Line;
                return (used + buf.len(), Decoded::Error(ProtoError::LineTooLong));
            }
            self.scanned = buf.len();
            return (used, Decoded::Incomplete);
        };
        self.scanned = 0;
        if nl > max {
            return (used + nl + 1, Decoded::Error(ProtoError::LineTooLong));
        }
        let line = buf.get(..nl).unwrap_or(&[]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // memcached reads the line as a C string: a NUL ends it (`get a\0b`
        // asks for `a`; `set a\0b 0 0 1` is too short a command).
        let line = line.split(|&b| b == 0).next().unwrap_or(line);
        let after = buf.get(nl + 1..).unwrap_or(&[]);
        let (extra, d) = self.command(line, after);
        match d {
            Decoded::Incomplete => (used, Decoded::Incomplete),
            d => (used + nl + 1 + extra, d),
        }
    }

    /// The longest command line accepted at the start of `buf`:
    /// [`PARTIAL_LINE_MAX`], except for a retrieval (`get`, `gets`, `gat`,
    /// `gats`), which memcached lets name as many keys as the client likes;
    /// here as many as fit in [`GET_LINE_MAX`] (a connection's read buffer
    /// grows to hold that much while the line arrives).
    fn line_max(&self, buf: &[u8]) -> usize {
        // memcached skips up to 100 leading spaces before it looks.
        let spaces = buf.iter().take(101).take_while(|&&b| b == b' ').count();
        let head = buf.get(spaces..).unwrap_or_default();
        let head = &head[..head.len().min(8)];
        let retrieval = spaces <= 100
            && [&b"get "[..], b"gets ", b"gat ", b"gats "]
                .iter()
                .any(|p| head.starts_with(p));
        if retrieval {
            GET_LINE_MAX
        } else {
            PARTIAL_LINE_MAX
        }
    }

    /// One command line; `after` is what follows it (the data block of a
    /// storage command). Returns the data bytes used and the result.
    fn command<'a>(&mut self, line: &'a [u8], after: &'a [u8]) -> (usize, Decoded<'a>) {
        let (used, d) = self.command_inner(line, after);
        // memcached stays silent about an error on a command that takes
        // `noreply` and ends with it.
        // A wrong argument count is `ERROR` all the same.
        let silent = matches!(d, Decoded::Error(e) if e != ProtoError::Unknown) && {
            let mut toks = Tokens { rest: line };
            let takes = matches!(
                toks.next_token(),
                Some(
                    b"set"
                        | b"add"
                        | b"replace"
                        | b"append"
                        | b"prepend"
                        | b"cas"
                        | b"delete"
                        | b"incr"
                        | b"decr"
                        | b"touch"
                        | b"flush_all"
                        | b"verbosity"
                        | b"cache_memlimit"
                )
            );
            takes && line.split(|&b| b == b' ').rev().find(|t| !t.is_empty()) == Some(b"noreply")
        };
        if silent {
            return (used, Decoded::Error(ProtoError::Silenced));
        }
        (used, d)
    }

    fn command_inner<'a>(&mut self, line: &'a [u8], after: &'a [u8]) -> (usize, Decoded<'a>) {
        let mut toks = Tokens { rest: line };
        let Some(cmd) = toks.next_token() else {
            return (0, Decoded::Error(ProtoError::Unknown));
        };
        let r = match cmd {
            b"get" => self.get(GetKind::Get, toks),
            b"gets" => self.get(GetKind::Gets, toks),
            b"gat" => self.get(GetKind::Gat, toks),
            b"gats" => self.get(GetKind::Gats, toks),
            b"set" => return self.store(StoreCmd::Set, toks, after),
            b"add" => return self.store(StoreCmd::Add, toks, after),
            b"replace" => return self.store(StoreCmd::Replace, toks, after),
            b"append" => return self.store(StoreCmd::Append, toks, after),
            b"prepend" => return self.store(StoreCmd::Prepend, toks, after),
            b"cas" => return self.store(StoreCmd::Cas, toks, after),
            b"ms" => return self.meta_set(toks, after),
            b"delete" => delete(toks),
            b"incr" => arith(true, toks),
            b"decr" => arith(false, toks),
            b"touch" => touch(toks),
            b"flush_all" => flush_all(toks),
            b"stats" => {
                let rest = toks.rest();
                let end = rest.iter().rposition(|&b| b != b' ').map_or(0, |e| e + 1);
                let group = &rest[..end];
                Ok(Request::Stats {
                    group: (!group.is_empty()).then_some(group),
                })
            }
            b"shutdown" | b"lru_crawler" | b"slabs" | b"lru" | b"watch" | b"extstore" => {
                Ok(Request::Admin {
                    cmd,
                    args: toks.rest(),
                })
            }
            // memcached ignores arguments of version and quit.
            b"version" => Ok(Request::Version),
            b"quit" => Ok(Request::Quit),
            b"verbosity" => verbosity(toks),
            b"cache_memlimit" => {
                let t = toks.collect_all();
                // A second token is `noreply` or ignored, as in memcached.
                let (mb, noreply) = match t.as_slice() {
                    [m] => (*m, false),
                    [m, last] => (*m, *last == b"noreply"),
                    _ => return (0, Decoded::Error(ProtoError::Unknown)),
                };
                // memcached: below 8 MB is refused, and a limit that is not
                // an unsigned number is an unknown command (silenced by
                // `noreply` all the same: memcached took it first).
                match parse_u64(mb) {
                    Some(mb) if mb >= 8 => Ok(Request::MemLimit { mb, noreply }),
                    Some(_) => Err(ProtoError::MemLimitTooSmall),
                    None if noreply => Err(ProtoError::Silenced),
                    None => Err(ProtoError::Unknown),
                }
            }
            b"mn" => Ok(Request::MetaNoop),
            b"mg" | b"md" | b"ma" => meta(cmd, toks, self.limits.cas),
            b"me" => meta_debug(toks),
            // An HTTP request line (`GET / HTTP/1.0`): memcached closes the
            // connection rather than answer a client that cannot follow.
            _ if line
                .split(|&b| b == b' ')
                .rfind(|t| !t.is_empty())
                .is_some_and(|t| t.starts_with(b"HTTP/")) =>
            {
                Ok(Request::Quit)
            }
            _ => Err(ProtoError::Unknown),
        };
        match r {
            Ok(r) => (0, Decoded::Request(r)),
            Err(e) => (0, Decoded::Error(e)),
        }
    }

    fn get<'a>(&self, kind: GetKind, mut toks: Tokens<'a>) -> Result<Request<'a>, ProtoError> {
        let exptime = match kind {
            GetKind::Gat | GetKind::Gats => {
                let t = toks.next_token().ok_or(ProtoError::Unknown)?;
                parse_i64(t).ok_or(ProtoError::BadExptime)?
            }
            _ => 0,
        };
        let keys = Keys(toks.rest());
        let mut n = 0;
        for k in keys.iter() {
            if k.len() > KEY_MAX {
                return Err(ProtoError::BadFormat);
            }
            n += 1;
        }
        // `gat <exptime>` with no key is an empty answer in memcached;
        // `get` with none is an unknown command.
        if n == 0 && !matches!(kind, GetKind::Gat | GetKind::Gats) {
            return Err(ProtoError::Unknown);
        }
        Ok(Request::Get {
            kind,
            exptime,
            keys,
        })
    }

    /// The data block of `len` bytes after a command line: the request
    /// (given the data), a wait for more bytes, or an error.
    fn data_block<'a>(
        &mut self,
        len: usize,
        after: &'a [u8],
        make: impl FnOnce(&'a [u8]) -> Request<'a>,
    ) -> (usize, Decoded<'a>) {
        if len > self.limits.item_max {
            // Skip the data block (and its CRLF), whenever it arrives.
            self.skip = Skip::Bytes(len.saturating_add(2));
            return (0, Decoded::Error(ProtoError::TooLarge));
        }
        let Some(block) = after.get(..len + 2) else {
            return (0, Decoded::Incomplete);
        };
        let (data, end) = block.split_at(len);
        if end != b"\r\n" {
            return (len + 2, Decoded::Error(ProtoError::BadChunk));
        }
        (len + 2, Decoded::Request(make(data)))
    }

    fn store<'a>(
        &mut self,
        cmd: StoreCmd,
        toks: Tokens<'a>,
        after: &'a [u8],
    ) -> (usize, Decoded<'a>) {
        let t = toks.collect_all();
        let want = if cmd == StoreCmd::Cas { 5 } else { 4 };
        let noreply = match t.len() {
            n if n == want => false,
            n if n == want + 1 && t.get(want) == Some(&&b"noreply"[..]) => true,
            n if n == want + 1 => false,
            _ => return (0, Decoded::Error(ProtoError::Unknown)),
        };
        let parsed = (|| {
            let key = *t.first()?;
            // memcached reads the flags as an unsigned long and keeps the
            // low 32 bits (2^32 is stored as 0).
            let flags = parse_u64(t.get(1)?)? as u32;
            let exptime = parse_i64(t.get(2)?)?;
            // ... and the length as a 32-bit int that must leave room for
            // the CRLF: anything larger is a bad command line, not a
            // too-large value (no data block is skipped).
            let len = parse_i64(t.get(3)?)?;
            if len > i64::from(i32::MAX - 2) {
                return None;
            }
            let cas = if cmd == StoreCmd::Cas {
                parse_u64(t.get(4)?)?
            } else {
                0
            };
            if !key_ok(key) || len < 0 {
                return None;
            }
            Some((key, flags, exptime, usize::try_from(len).ok()?, cas))
        })();
        let Some((key, flags, exptime, len, cas)) = parsed else {
            return (0, Decoded::Error(ProtoError::BadFormat));
        };
        if crate::store::item_size_for(self.limits.cas, key.len(), flags, len)
            > self.limits.item_max
        {
            // Skip the data block (and its CRLF), whenever it arrives.
            self.skip = Skip::Bytes(len.saturating_add(2));
            return (
                0,
                Decoded::Request(Request::TooLarge {
                    key,
                    noreply,
                    base64: false,
                    remove_old: cmd == StoreCmd::Set,
                }),
            );
        }
        self.data_block(len, after, |data| Request::Store {
            cmd,
            key,
            flags,
            exptime,
            data,
            cas,
            noreply,
        })
    }

    fn meta_set<'a>(&mut self, mut toks: Tokens<'a>, after: &'a [u8]) -> (usize, Decoded<'a>) {
        // No key at all is not a command memcached knows (`ERROR`); a key
        // without a length is a bad command line.
        let Some(key) = toks.next_token() else {
            return (0, Decoded::Error(ProtoError::Unknown));
        };
        let Some(len) = toks.next_token() else {
            return (0, Decoded::Error(ProtoError::BadFormat));
        };
        // memcached checks the key's length before it reads the data
        // length: a key token over 250 bytes skips nothing, and the data
        // block is read as a command.
        if key.len() > KEY_MAX {
            return (0, Decoded::Error(ProtoError::BadFormat));
        }
        // A length memcached's int32 cannot hold with its CRLF is a bad
        // command line (nothing is skipped), as for `set`.
        let Some(len) = parse_i64(len)
            .filter(|&n| (0..=i64::from(i32::MAX - 2)).contains(&n))
            .and_then(|n| usize::try_from(n).ok())
        else {
            return (0, Decoded::Error(ProtoError::BadFormat));
        };
        let flags = match MetaFlags::parse_checked(MetaCmd::Set, toks.rest(), self.limits.cas) {
            Ok(f) => f,
            // memcached refuses too many flags before it knows to skip
            // the data block: the block is read as commands.
            Err(e @ ProtoError::TooManyFlags) => return (0, Decoded::Error(e)),
            Err(e) => {
                // The data block still follows, whatever its length (as
                // memcached swallows it): skip it so it is not read as
                // commands.
                self.skip = Skip::Bytes(len.saturating_add(2));
                return (0, Decoded::Error(e));
            }
        };
        if !meta_key_ok(key, flags.base64) {
            if len <= self.limits.item_max {
                self.skip = Skip::Bytes(len + 2);
            }
            return (0, Decoded::Error(ProtoError::BadFormat));
        }
        // The limit counts the item as memcached does (header, key, flags),
        // whatever the mode; the old value goes, as with `set`.
        let nkey = if flags.base64 {
            decoded_len(key)
        } else {
            key.len()
        };
        let client_flags = flags.client_flags.unwrap_or(0);
        if crate::store::item_size_for(self.limits.cas, nkey, client_flags, len)
            > self.limits.item_max
        {
            self.skip = Skip::Bytes(len.saturating_add(2));
            return (
                0,
                Decoded::Request(Request::TooLarge {
                    key,
                    noreply: false,
                    base64: flags.base64,
                    remove_old: true,
                }),
            );
        }
        self.data_block(len, after, |data| Request::MetaSet { key, data, flags })
    }
}

/// The length a base64 key decodes to.
fn decoded_len(key: &[u8]) -> usize {
    let pad = key.iter().rev().take_while(|&&b| b == b'=').count();
    (key.len() / 4 * 3).saturating_sub(pad)
}

fn meta_key_ok(key: &[u8], base64: bool) -> bool {
    if base64 {
        // memcached limits the key token as sent, encoded or not.
        !key.is_empty() && key.len() <= KEY_MAX
    } else {
        key_ok(key)
    }
}

/// `me <key> [b]`, read as memcached 1.6.18 reads it: a key of at most 250
/// bytes (none is a bad command line), `b` right after it for a base64 key,
/// and any other token ignored.
fn meta_debug<'a>(mut toks: Tokens<'a>) -> Result<Request<'a>, ProtoError> {
    let key = toks
        .next_token()
        .filter(|k| k.len() <= KEY_MAX)
        .ok_or(ProtoError::BadFormat)?;
    let flags = if toks.next_token() == Some(&b"b"[..]) {
        MetaFlags::parse(b"b")?
    } else {
        MetaFlags::default()
    };
    Ok(Request::MetaDebug { key, flags })
}

fn meta<'a>(cmd: &[u8], mut toks: Tokens<'a>, cas: bool) -> Result<Request<'a>, ProtoError> {
    let key = toks.next_token().ok_or(ProtoError::Unknown)?;
    let which = match cmd {
        b"md" => MetaCmd::Delete,
        b"ma" => MetaCmd::Arith,
        _ => MetaCmd::Get,
    };
    let flags = MetaFlags::parse_checked(which, toks.rest(), cas)?;
    if !meta_key_ok(key, flags.base64) {
        return Err(ProtoError::BadFormat);
    }
    Ok(match cmd {
        b"mg" => Request::MetaGet { key, flags },
        b"md" => Request::MetaDelete { key, flags },
        _ => Request::MetaArith { key, flags },
    })
}

fn delete(toks: Tokens<'_>) -> Result<Request<'_>, ProtoError> {
    let t = toks.collect_all();
    let (key, noreply) = match t.as_slice() {
        [k] => (*k, false),
        [k, b"noreply"] => (*k, true),
        [k, b"0"] => (*k, false),
        [k, b"0", b"noreply"] => (*k, true),
        [_, ..] if t.len() <= 3 => return Err(ProtoError::DeleteUsage),
        _ => return Err(ProtoError::Unknown),
    };
    if !key_ok(key) {
        return Err(ProtoError::BadFormat);
    }
    Ok(Request::Delete { key, noreply })
}

/// The trailing `noreply` of a command whose last argument may be
/// anything: memcached takes the last token as `noreply` when it is
/// exactly that, and ignores it otherwise.
fn noreply_last(extra: &[u8]) -> bool {
    extra == b"noreply"
}

fn arith(incr: bool, toks: Tokens<'_>) -> Result<Request<'_>, ProtoError> {
    let t = toks.collect_all();
    let (key, delta, noreply) = match t.as_slice() {
        [k, d] => (*k, *d, false),
        [k, d, extra] => (*k, *d, noreply_last(extra)),
        _ => return Err(ProtoError::Unknown),
    };
    if !key_ok(key) {
        return Err(ProtoError::BadFormat);
    }
    let delta = parse_u64(delta).ok_or(ProtoError::BadDelta)?;
    Ok(Request::Arith {
        key,
        incr,
        delta,
        noreply,
    })
}

fn touch(toks: Tokens<'_>) -> Result<Request<'_>, ProtoError> {
    let t = toks.collect_all();
    let (key, exptime, noreply) = match t.as_slice() {
        [k, e] => (*k, *e, false),
        [k, e, extra] => (*k, *e, noreply_last(extra)),
        _ => return Err(ProtoError::Unknown),
    };
    if !key_ok(key) {
        return Err(ProtoError::BadFormat);
    }
    let exptime = parse_i64(exptime).ok_or(ProtoError::BadExptime)?;
    Ok(Request::Touch {
        key,
        exptime,
        noreply,
    })
}

/// `verbosity <level> [noreply]`: memcached reads the level with
/// `safe_strtoul` (the low 32 bits kept) after taking a last `noreply`,
/// which silences a bad level (the level then stays as it was); a token
/// after the level that is not `noreply` is ignored.
fn verbosity(toks: Tokens<'_>) -> Result<Request<'_>, ProtoError> {
    let level = |l: &[u8]| {
        parse_u64(l)
            .map(|v| u64::from(v as u32))
            .ok_or(ProtoError::BadFormat)
    };
    match toks.collect_all().as_slice() {
        [l] => Ok(Request::Verbosity {
            level: level(l)?,
            noreply: false,
        }),
        [l, last] => Ok(Request::Verbosity {
            level: level(l)?,
            noreply: *last == b"noreply",
        }),
        _ => Err(ProtoError::Unknown),
    }
}

fn flush_all(toks: Tokens<'_>) -> Result<Request<'_>, ProtoError> {
    let t = toks.collect_all();
    let (delay, noreply) = match t.as_slice() {
        [] => (None, false),
        [b"noreply"] => (None, true),
        [d] => (Some(*d), false),
        [d, extra] => (Some(*d), noreply_last(extra)),
        _ => return Err(ProtoError::Unknown),
    };
    // A delay that is not a number is the executor's error to give:
    // memcached refuses a flush under `-F` before it reads the delay.
    let delay = match delay {
        None => Some(0),
        Some(d) => parse_i64(d),
    };
    Ok(Request::FlushAll { delay, noreply })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> (usize, Decoded<'_>) {
        Decoder::new(Limits::default()).decode(buf)
    }

    #[test]
    fn classic_commands() {
        let (n, d) = one(b"cas k 5 10 3 99 noreply\r\nabc\r\n");
        assert_eq!(n, 30);
        assert_eq!(
            d,
            Decoded::Request(Request::Store {
                cmd: StoreCmd::Cas,
                key: b"k",
                flags: 5,
                exptime: 10,
                data: b"abc",
                cas: 99,
                noreply: true
            })
        );
        let (_, d) = one(b"gat 10 a b  c\n");
        let Decoded::Request(Request::Get { keys, exptime, .. }) = d else {
            panic!("{d:?}")
        };
        assert_eq!(exptime, 10);
        assert_eq!(keys.iter().collect::<Vec<_>>(), vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(one(b"bogus\r\n").1, Decoded::Error(ProtoError::Unknown));
        assert_eq!(one(b"incr k x\r\n").1, Decoded::Error(ProtoError::BadDelta));
        assert_eq!(
            one(b"delete k 5\r\n").1,
            Decoded::Error(ProtoError::DeleteUsage)
        );
        assert_eq!(
            one(b"set k 0 0 -1\r\n").1,
            Decoded::Error(ProtoError::BadFormat)
        );
        let long = format!("get {}\r\n", "k".repeat(251));
        assert_eq!(
            one(long.as_bytes()).1,
            Decoded::Error(ProtoError::BadFormat)
        );
    }

    #[test]
    fn numbers_read_as_strtol() {
        // Leading whitespace is skipped; whitespace after the digits ends
        // the number, and what follows it is ignored.
        for (tok, n) in [
            (&b"12"[..], 12),
            (b"+12", 12),
            (b"-12", -12),
            (b"12\r", 12),
            (b"\t12", 12),
            (b"12\tjunk", 12),
            (b"12\x0b", 12),
            (b"-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(parse_i64(tok), Some(n), "{tok:?}");
        }
        for tok in [
            &b""[..],
            b"\r",
            b"+",
            b"-",
            b"+-1",
            b"12x",
            b"1.5",
            b"12\0",
            b"x12",
            b"9223372036854775808",
            b"-9223372036854775809",
        ] {
            assert_eq!(parse_i64(tok), None, "{tok:?}");
        }
        assert_eq!(parse_u64(b"18446744073709551615\r"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"-0"), Some(0));
        assert_eq!(parse_u64(b"-1"), None);
        // In place on a command line: a CR left before the line's CR LF, a
        // tab after a number, leading whitespace; a key is left as it is.
        let (_, d) = one(b"set k\t 0\r \t0 1\r\r\nx\r\n");
        assert_eq!(
            d,
            Decoded::Request(Request::Store {
                cmd: StoreCmd::Set,
                key: b"k\t",
                flags: 0,
                exptime: 0,
                data: b"x",
                cas: 0,
                noreply: false
            })
        );
        assert_eq!(
            one(b"touch k 10\r\r\n").1,
            Decoded::Request(Request::Touch {
                key: b"k",
                exptime: 10,
                noreply: false
            })
        );
        assert_eq!(
            one(b"set k 0 0 1x\r\nx\r\n").1,
            Decoded::Error(ProtoError::BadFormat)
        );
    }

    #[test]
    fn too_large_is_skipped() {
        let mut d = Decoder::new(Limits {
            item_max: 4,
            ..Limits::default()
        });
        let buf = b"set k 0 0 10\r\n0123456789\r\nget k\r\n";
        let (n, r) = d.decode(buf);
        assert_eq!(
            r,
            Decoded::Request(Request::TooLarge {
                key: b"k",
                noreply: false,
                base64: false,
                remove_old: true
            })
        );
        let (m, r) = d.decode(&buf[n..]);
        assert!(matches!(r, Decoded::Request(Request::Get { .. })), "{r:?}");
        assert_eq!(n + m, buf.len());
    }

    #[test]
    fn long_retrieval_line_is_skipped_in_pieces() {
        let mut d = Decoder::new(Limits {
            item_max: 1024,
            ..Limits::default()
        });
        let mut big = b"get ".to_vec();
        big.resize(GET_LINE_MAX + 10, b'x');
        let (n, r) = d.decode(&big);
        assert_eq!((n, r), (big.len(), Decoded::Error(ProtoError::LineTooLong)));
        assert_eq!(d.decode(b"xxxx"), (4, Decoded::Incomplete));
        let (n, r) = d.decode(b"xx\r\nversion\r\n");
        assert_eq!((n, r), (13, Decoded::Request(Request::Version)));
    }

    #[test]
    fn a_long_line_that_is_not_a_multiget_closes() {
        let mut line = vec![b'x'; PARTIAL_LINE_MAX];
        assert_eq!(one(&line), (0, Decoded::Incomplete));
        line.push(b'x');
        assert_eq!(one(&line), (line.len(), Decoded::Request(Request::Quit)));
        // Whole or in pieces, a longer line closes all the same.
        line.extend_from_slice(b"\r\nversion\r\n");
        assert_eq!(one(&line), (line.len(), Decoded::Request(Request::Quit)));
        // A line of exactly the maximum is read.
        let mut ok = vec![b'x'; PARTIAL_LINE_MAX];
        ok.push(b'\n');
        assert_eq!(one(&ok).1, Decoded::Error(ProtoError::Unknown));
        // Leading spaces (up to 100) before a get are allowed.
        let mut get = vec![b' '; 100];
        get.extend_from_slice(b"get ");
        get.resize(5000, b'k');
        assert_eq!(one(&get), (0, Decoded::Incomplete));
        get.insert(0, b' ');
        assert_eq!(one(&get).1, Decoded::Request(Request::Quit));
    }

    #[test]
    fn bad_chunk() {
        let (n, r) = one(b"set k 0 0 1\r\nabc\r\n");
        assert_eq!(r, Decoded::Error(ProtoError::BadChunk));
        assert_eq!(n, 16);
    }

    #[test]
    fn meta() {
        let (_, r) = one(b"ms k 2 T10 F3 MA\r\nhi\r\n");
        let Decoded::Request(Request::MetaSet { key, data, flags }) = r else {
            panic!("{r:?}")
        };
        assert_eq!((key, data), (&b"k"[..], &b"hi"[..]));
        assert_eq!(flags.ttl, Some(10));
        assert_eq!(flags.client_flags, Some(3));
        assert_eq!(flags.mode, Some(super::super::MetaMode::Append));
        assert_eq!(one(b"mg k v z!\r\n").1, Decoded::Error(ProtoError::BadFlag));
        assert_eq!(one(b"mn\r\n").1, Decoded::Request(Request::MetaNoop));
    }
}
