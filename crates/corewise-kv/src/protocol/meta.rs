//! Meta command flags: one letter per token, some with an argument glued
//! on (`T30`, `Oabc`), parsed once into a struct; the raw tokens are kept
//! so return flags are echoed in the order the client gave them.

use super::parse::{parse_i64, parse_u64};
use super::ProtoError;

/// A mode token (`ms M<mode>`, `ma M<mode>`).
///
/// ```
/// use corewise_kv::protocol::{MetaCmd, MetaFlags, MetaMode};
/// let set = |raw: &'static [u8]| MetaFlags::parse_for(MetaCmd::Set, raw);
/// let arith = |raw: &'static [u8]| MetaFlags::parse_for(MetaCmd::Arith, raw);
/// assert_eq!(set(b"ME").unwrap().mode, Some(MetaMode::Add));
/// assert_eq!(arith(b"M+").unwrap().mode, Some(MetaMode::Incr));
/// assert!(set(b"MX").is_err());
/// // mg takes a mode token and ignores it.
/// assert_eq!(MetaFlags::parse(b"ME").unwrap().mode, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaMode {
    /// `E`: add.
    Add,
    /// `A`: append.
    Append,
    /// `P`: prepend.
    Prepend,
    /// `R`: replace.
    Replace,
    /// `S`: set.
    Set,
    /// `I` or `+`: increment.
    Incr,
    /// `D` or `-`: decrement.
    Decr,
}

/// The meta command a set of flags belongs to: memcached 1.6.18 accepts
/// the same flag letters on all four, but checks modes and words its
/// errors per command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetaCmd {
    /// `mg`.
    #[default]
    Get,
    /// `ms`.
    Set,
    /// `md`.
    Delete,
    /// `ma`.
    Arith,
}

/// The flag letters memcached 1.6.18 accepts on `mg`, `ms`, `md` and `ma`
/// alike (each command ignores those it has no use for), and two from
/// later versions kept on purpose: `E` (explicit CAS) and `x`.
const ACCEPTED: &[u8] = b"bcfhklqstuvxCDEFIJLMNOPRT";

/// Flag tokens after the key (and `ms`'s length) beyond which memcached
/// refuses a meta command: its tokenizer keeps 20 tokens, the command's
/// and the key's included.
const MAX_FLAG_TOKENS: usize = 17;

/// Longest opaque (`O`) memcached echoes, its letter excluded.
const OPAQUE_MAX: usize = 31;

/// The flags of one meta command.
///
/// ```
/// use corewise_kv::protocol::MetaFlags;
/// let f = MetaFlags::parse(b"v t T30 Oab q").unwrap();
/// assert!(f.value && f.ret_ttl && f.quiet);
/// assert_eq!(f.ttl, Some(30));
/// assert_eq!(f.opaque, Some(&b"ab"[..]));
/// assert!(MetaFlags::parse(b"v v").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFlags<'a> {
    raw: &'a [u8],
    cmd: MetaCmd,
    /// `b`: the key is base64.
    pub base64: bool,
    /// `q`: quiet (suppress the common-case reply).
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `c`: return the CAS.
    pub ret_cas: bool,
    /// `f`: return the client flags.
    pub ret_flags: bool,
    /// `h`: return whether it was hit before.
    pub ret_hit: bool,
    /// `k`: return the key.
    pub ret_key: bool,
    /// `l`: return seconds since last access.
    pub ret_access: bool,
    /// `s`: return the value size.
    pub ret_size: bool,
    /// `t`: return the remaining TTL.
    pub ret_ttl: bool,
    /// `O`: opaque token echoed back.
    pub opaque: Option<&'a [u8]>,
    /// `T`: new TTL.
    pub ttl: Option<i64>,
    /// `C`: compare CAS.
    pub compare_cas: Option<u64>,
    /// `E`: explicit new CAS (newer than memcached 1.6.18).
    pub new_cas: Option<u64>,
    /// `F`: client flags to store.
    pub client_flags: Option<u32>,
    /// `I`: invalidate (`md`: mark stale instead of deleting; `ms` with
    /// `C`: an older CAS stores the value as stale).
    pub invalidate: bool,
    /// `u`: do not bump the item in the LRU (nor mark it fetched).
    pub no_bump: bool,
    /// `M`: mode.
    pub mode: Option<MetaMode>,
    /// `D`: delta (ma).
    pub delta: Option<u64>,
    /// `J`: initial value on auto-create (ma).
    pub initial: Option<u64>,
    /// `N`: auto-create on miss with this TTL (`mg`: the creator wins).
    pub vivify: Option<i64>,
    /// `R`: win the recache token when the TTL left is below this.
    pub recache: Option<i64>,
    /// `x`: md empties the value but keeps the item (newer than memcached
    /// 1.6.18).
    pub remove_value: bool,
}

/// A signed flag argument, read as memcached's `safe_strtol` reads it.
fn signed(arg: &[u8], err: ProtoError) -> Result<i64, ProtoError> {
    parse_i64(arg).ok_or(err)
}

/// An unsigned flag argument, read as memcached's `safe_strtoull` reads it.
fn unsigned(arg: &[u8], err: ProtoError) -> Result<u64, ProtoError> {
    parse_u64(arg).ok_or(err)
}

impl<'a> MetaFlags<'a> {
    /// Parses space-separated flag tokens as `mg` takes them.
    ///
    /// ```
    /// use corewise_kv::protocol::{MetaFlags, ProtoError};
    /// let f = MetaFlags::parse(b"N30 J13 D5 MI").unwrap();
    /// // mg reads N, J and D, and ignores a mode.
    /// assert_eq!((f.vivify, f.initial, f.delta, f.mode), (Some(30), Some(13), Some(5), None));
    /// assert_eq!(MetaFlags::parse(b"v v").err(), Some(ProtoError::DuplicateFlag));
    /// assert_eq!(MetaFlags::parse(b"!").err(), Some(ProtoError::BadFlag));
    /// ```
    pub fn parse(raw: &'a [u8]) -> Result<Self, ProtoError> {
        Self::parse_for(MetaCmd::Get, raw)
    }

    /// Parses space-separated flag tokens of `cmd` (`ms`'s after its
    /// length), with memcached 1.6.18's checks and error lines: `md` and
    /// `ma` word nearly every error `invalid or duplicate flag`.
    ///
    /// ```
    /// use corewise_kv::protocol::{MetaCmd, MetaFlags, ProtoError};
    /// assert_eq!(MetaFlags::parse_for(MetaCmd::Get, b"Tx"), Err(ProtoError::BadToken));
    /// assert_eq!(MetaFlags::parse_for(MetaCmd::Arith, b"Tx"), Err(ProtoError::InvalidOrDuplicateFlag));
    /// assert_eq!(MetaFlags::parse_for(MetaCmd::Set, b"Ma"), Err(ProtoError::BadMode));
    /// // Client flags are kept modulo 2^32, as `set` keeps them.
    /// assert_eq!(MetaFlags::parse_for(MetaCmd::Set, b"F4294967301").unwrap().client_flags, Some(5));
    /// ```
    pub fn parse_for(cmd: MetaCmd, raw: &'a [u8]) -> Result<Self, ProtoError> {
        Self::parse_checked(cmd, raw, true)
    }

    /// [`parse_for`](Self::parse_for) in a server whose items carry CAS
    /// values (`cas`) or not (`-C`): without, a flag that sets one (`E`)
    /// is refused where it stands, as memcached refuses it (`invalid
    /// flag`; `md` and `ma` word it `invalid or duplicate flag`).
    ///
    /// ```
    /// use corewise_kv::protocol::{MetaCmd, MetaFlags, ProtoError};
    /// assert!(MetaFlags::parse_checked(MetaCmd::Get, b"E5 v", true).is_ok());
    /// assert_eq!(MetaFlags::parse_checked(MetaCmd::Get, b"E v v", false), Err(ProtoError::BadFlag));
    /// assert_eq!(
    ///     MetaFlags::parse_checked(MetaCmd::Arith, b"E5", false),
    ///     Err(ProtoError::InvalidOrDuplicateFlag)
    /// );
    /// ```
    pub fn parse_checked(cmd: MetaCmd, raw: &'a [u8], cas: bool) -> Result<Self, ProtoError> {
        let tokens = raw.split(|&b| b == b' ').filter(|t| !t.is_empty()).count();
        let max = if cmd == MetaCmd::Set {
            MAX_FLAG_TOKENS - 1
        } else {
            MAX_FLAG_TOKENS
        };
        if tokens > max {
            return Err(if cmd == MetaCmd::Get {
                ProtoError::FlagsTooLong
            } else {
                ProtoError::TooManyFlags
            });
        }
        let f = Self::parse_tokens(cmd, raw, cas).map_err(|e| match (cmd, e) {
            (MetaCmd::Delete | MetaCmd::Arith, e) if e != ProtoError::BadArithMode => {
                ProtoError::InvalidOrDuplicateFlag
            }
            (_, e) => e,
        })?;
        // memcached checks the opaque's length last, when it echoes it.
        if f.opaque.is_some_and(|o| o.len() > OPAQUE_MAX) {
            return Err(ProtoError::OpaqueTooLong);
        }
        Ok(f)
    }

    fn parse_tokens(cmd: MetaCmd, raw: &'a [u8], cas: bool) -> Result<Self, ProtoError> {
        let mut f = MetaFlags {
            raw,
            cmd,
            ..MetaFlags::default()
        };
        let mut seen = 0u64;
        for tok in raw.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            let (&c, arg) = tok.split_first().ok_or(ProtoError::BadFlag)?;
            if !ACCEPTED.contains(&c) {
                return Err(ProtoError::BadFlag);
            }
            let bit = match c {
                b'A'..=b'Z' => 1u64 << (c - b'A'),
                b'a'..=b'z' => 1u64 << (c - b'a' + 26),
                _ => return Err(ProtoError::BadFlag),
            };
            if seen & bit != 0 {
                return Err(ProtoError::DuplicateFlag);
            }
            seen |= bit;
            match c {
                b'b' => f.base64 = true,
                b'q' => f.quiet = true,
                b'v' => f.value = true,
                b'c' => f.ret_cas = true,
                b'f' => f.ret_flags = true,
                b'h' => f.ret_hit = true,
                b'k' => f.ret_key = true,
                b'l' => f.ret_access = true,
                b's' => f.ret_size = true,
                b't' => f.ret_ttl = true,
                b'u' => f.no_bump = true,
                b'P' | b'L' => {}
                b'O' => f.opaque = Some(arg),
                b'T' => f.ttl = Some(signed(arg, ProtoError::BadToken)?),
                b'C' => f.compare_cas = Some(unsigned(arg, ProtoError::BadToken)?),
                b'E' if !cas => return Err(ProtoError::BadFlag),
                b'E' => f.new_cas = Some(unsigned(arg, ProtoError::BadToken)?),
                b'x' => f.remove_value = true,
                // Read as `set` reads its flags (memcached's `safe_strtoul`
                // for both): the low 32 bits are kept, 2^32 is 0.
                b'F' => f.client_flags = Some(unsigned(arg, ProtoError::BadFormat)? as u32),
                b'I' => f.invalidate = true,
                b'D' => f.delta = Some(unsigned(arg, ProtoError::BadDeltaValue)?),
                b'J' => f.initial = Some(unsigned(arg, ProtoError::BadInitialValue)?),
                b'N' => f.vivify = Some(signed(arg, ProtoError::BadToken)?),
                b'R' => f.recache = Some(signed(arg, ProtoError::BadToken)?),
                b'M' => {
                    let &[m] = arg else {
                        return Err(ProtoError::ModeLength);
                    };
                    // Modes are upper case; `mg` and `md` ignore theirs.
                    f.mode = match (cmd, m) {
                        (MetaCmd::Set, b'E') => Some(MetaMode::Add),
                        (MetaCmd::Set, b'A') => Some(MetaMode::Append),
                        (MetaCmd::Set, b'P') => Some(MetaMode::Prepend),
                        (MetaCmd::Set, b'R') => Some(MetaMode::Replace),
                        (MetaCmd::Set, b'S') => Some(MetaMode::Set),
                        (MetaCmd::Set, _) => return Err(ProtoError::BadMode),
                        (MetaCmd::Arith, b'I' | b'+') => Some(MetaMode::Incr),
                        (MetaCmd::Arith, b'D' | b'-') => Some(MetaMode::Decr),
                        (MetaCmd::Arith, _) => return Err(ProtoError::BadArithMode),
                        (MetaCmd::Get | MetaCmd::Delete, _) => None,
                    };
                }
                _ => return Err(ProtoError::BadFlag),
            }
        }
        Ok(f)
    }

    /// Every flag token, in request order: its letter and the rest of the
    /// token (the argument, or for `O` the opaque).
    ///
    /// ```
    /// use corewise_kv::protocol::MetaFlags;
    /// let f = MetaFlags::parse(b"t T30 Oxy").unwrap();
    /// let t: Vec<_> = f.tokens().collect();
    /// assert_eq!(t, [(b't', &b""[..]), (b'T', b"30"), (b'O', b"xy")]);
    /// ```
    pub fn tokens(&self) -> impl Iterator<Item = (u8, &'a [u8])> + 'a {
        self.raw
            .split(|&b| b == b' ')
            .filter_map(|t| t.split_first().map(|(&c, arg)| (c, arg)))
    }

    /// The flag letters that ask for something back, in request order
    /// (`O`, `k` echo; `c f h l s t` return values, of which `ma` returns
    /// `c` and `t` only; `b` is echoed right after `k`, as memcached does).
    ///
    /// ```
    /// use corewise_kv::protocol::MetaFlags;
    /// let f = MetaFlags::parse(b"v t Oq k q c").unwrap();
    /// // `v` and `q` change the reply but return nothing of their own.
    /// assert_eq!(f.returned().collect::<Vec<u8>>(), b"tOkc");
    /// ```
    pub fn returned(&self) -> impl Iterator<Item = u8> + 'a {
        let wanted: &[u8] = if self.cmd == MetaCmd::Arith {
            b"Okct"
        } else {
            b"Okcfhlst"
        };
        self.raw
            .split(|&b| b == b' ')
            .filter_map(|t| t.first().copied())
            .filter(move |c| wanted.contains(c))
    }
}
