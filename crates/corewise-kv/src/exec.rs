//! Runs one request against the store and writes memcached's reply.
//!
//! Why a module of its own: the same code serves both server modes and the
//! in-process tests, and the reply formats (classic and meta) are the part
//! that real clients check byte for byte, so they live in one place next to
//! each other. Replies are appended to the connection's output buffer; the
//! server writes that buffer once per batch of pipelined requests.

use crate::config::Config;
use crate::protocol::{decode_base64, GetKind, MetaFlags, MetaMode, ProtoError, Request, StoreCmd};
use crate::store::{ArithOutcome, DeleteOutcome, SetMode, Store, StoreOutcome};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The version string `version` and `stats` report.
pub const VERSION: &str = concat!("1.6.0-corewise-kv-", env!("CARGO_PKG_VERSION"));

/// Connection counters (memcached's `stats` names).
#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Open connections.
    pub curr_connections: AtomicU64,
    /// Connections accepted since start.
    pub total_connections: AtomicU64,
    /// Connections refused for `-c`.
    pub rejected_connections: AtomicU64,
    /// Bytes read from clients.
    pub bytes_read: AtomicU64,
    /// Bytes written to clients.
    pub bytes_written: AtomicU64,
}

/// Everything a request may need: the store, the settings, the counters.
#[derive(Debug)]
pub struct Shared {
    /// The items.
    pub store: Store,
    /// The server's settings.
    pub config: Config,
    /// Connection counters.
    pub conns: ConnCounters,
    /// Verbosity level set by `verbosity`.
    pub verbosity: AtomicU64,
    started: Instant,
}

impl Shared {
    /// Shared state for a server with this configuration.
    pub fn new(config: Config) -> Self {
        let limit = config.memory_mb.saturating_mul(1024 * 1024);
        let store = Store::new(limit, Store::shards_for(limit, config.item_max));
        store.set_item_max(config.item_max);
        let verbose = u64::from(config.verbose);
        Self {
            store,
            config,
            conns: ConnCounters::default(),
            verbosity: AtomicU64::new(verbose),
            started: Instant::now(),
        }
    }
}

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on reading.
    Continue,
    /// Close the connection (`quit`).
    Close,
}

/// Appends `v` in decimal.
fn num(out: &mut Vec<u8>, v: u64) {
    let mut b = [0u8; 20];
    let mut i = b.len();
    let mut v = v;
    loop {
        i -= 1;
        b[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&b[i..]);
}

fn inum(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    num(out, v.unsigned_abs());
}

fn line(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.extend_from_slice(b"\r\n");
}

/// Writes a protocol error's line.
///
/// ```
/// let mut out = Vec::new();
/// corewise_kv::exec::write_error(corewise_kv::protocol::ProtoError::Unknown, &mut out);
/// assert_eq!(out, b"ERROR\r\n");
/// ```
pub fn write_error(e: ProtoError, out: &mut Vec<u8>) {
    if e == ProtoError::Silenced {
        return;
    }
    out.extend_from_slice(e.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Runs `req`, appending its reply to `out`. `scratch` is reused for
/// decoded base64 keys.
///
/// ```
/// use corewise_kv::{config::Config, exec::{execute, Shared}, protocol::{Decoded, Decoder, Limits}};
/// let shared = Shared::new(Config::default());
/// let mut dec = Decoder::new(Limits::default());
/// let mut out = Vec::new();
/// for req in [&b"set a 1 0 1\r\nx\r\n"[..], b"get a\r\n"] {
///     if let (_, Decoded::Request(r)) = dec.decode(req) {
///         execute(&shared, &r, &mut out, &mut Vec::new());
///     }
/// }
/// assert_eq!(out, b"STORED\r\nVALUE a 1 1\r\nx\r\nEND\r\n");
/// ```
pub fn execute(
    shared: &Shared,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> Flow {
    execute_spilling(shared, req, out, scratch, &mut |_| Ok(()))
}

/// Unsent reply bytes above which a multi-key `get` hands its output to
/// `spill` before looking up the next key.
pub const SPILL_AT: usize = 256 * 1024;

/// [`execute`], bounding the output of a multi-key retrieval: whenever
/// `out` holds more than [`SPILL_AT`] bytes between two keys, `spill`
/// is called to send them (and empty `out`), so one request naming many
/// large values never holds more than one value plus [`SPILL_AT`] of
/// reply. A `spill` error closes the connection.
///
/// ```
/// use corewise_kv::{config::Config, exec::{execute_spilling, Flow, Shared}, protocol::{Decoded, Decoder, Limits}};
/// let shared = Shared::new(Config::default());
/// let mut dec = Decoder::new(Limits::default());
/// let (mut out, mut sent) = (Vec::new(), Vec::new());
/// if let (_, Decoded::Request(r)) = dec.decode(b"get a b\r\n") {
///     let mut spill = |o: &mut Vec<u8>| { sent.append(o); Ok(()) };
///     assert_eq!(execute_spilling(&shared, &r, &mut out, &mut Vec::new(), &mut spill), Flow::Continue);
/// }
/// assert_eq!(out, b"END\r\n");
/// ```
pub fn execute_spilling(
    shared: &Shared,
    req: &Request<'_>,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
    spill: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
) -> Flow {
    let store = &shared.store;
    match *req {
        Request::Get {
            kind,
            exptime,
            keys,
        } => {
            let touch = matches!(kind, GetKind::Gat | GetKind::Gats)
                .then(|| store.clock().deadline(exptime));
            let with_cas = matches!(kind, GetKind::Gets | GetKind::Gats);
            for key in keys.iter() {
                store.get(key, touch, |it, _| {
                    out.extend_from_slice(b"VALUE ");
                    out.extend_from_slice(key);
                    out.push(b' ');
                    num(out, u64::from(it.flags));
                    out.push(b' ');
                    num(out, it.value.len() as u64);
                    if with_cas {
                        out.push(b' ');
                        num(out, it.cas);
                    }
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(&it.value);
                    out.extend_from_slice(b"\r\n");
                });
                if out.len() > SPILL_AT && spill(out).is_err() {
                    return Flow::Close;
                }
            }
            out.extend_from_slice(b"END\r\n");
        }
        Request::Store {
            cmd,
            key,
            flags,
            exptime,
            data,
            cas,
            noreply,
        } => {
            let (mode, compare) = match cmd {
                StoreCmd::Set => (SetMode::Set, None),
                StoreCmd::Add => (SetMode::Add, None),
                StoreCmd::Replace => (SetMode::Replace, None),
                StoreCmd::Append => (SetMode::Append, None),
                StoreCmd::Prepend => (SetMode::Prepend, None),
                StoreCmd::Cas => (SetMode::Set, Some(cas)),
            };
            let r = store.store(
                mode,
                key,
                flags,
                store.clock().deadline(exptime),
                data,
                compare,
            );
            if !noreply {
                line(
                    out,
                    match r {
                        StoreOutcome::Stored(_) => b"STORED",
                        StoreOutcome::NotStored => b"NOT_STORED",
                        StoreOutcome::Exists => b"EXISTS",
                        StoreOutcome::NotFound => b"NOT_FOUND",
                        StoreOutcome::NoMemory => b"SERVER_ERROR out of memory storing object",
                    },
                );
            }
        }
        Request::Delete { key, noreply } => {
            let r = store.delete(key, None);
            if !noreply {
                line(
                    out,
                    if r == DeleteOutcome::Deleted {
                        b"DELETED"
                    } else {
                        b"NOT_FOUND"
                    },
                );
            }
        }
        Request::Arith {
            key,
            incr,
            delta,
            noreply,
        } => {
            let r = store.arith(key, incr, delta, None, None);
            if !noreply {
                match r {
                    ArithOutcome::Value(v, _) => {
                        num(out, v);
                        out.extend_from_slice(b"\r\n");
                    }
                    ArithOutcome::NotFound | ArithOutcome::Exists => line(out, b"NOT_FOUND"),
                    ArithOutcome::NonNumeric => line(
                        out,
                        b"CLIENT_ERROR cannot increment or decrement non-numeric value",
                    ),
                }
            }
        }
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            let hit = store.touch(key, store.clock().deadline(exptime));
            if !noreply {
                line(out, if hit { b"TOUCHED" } else { b"NOT_FOUND" });
            }
        }
        Request::FlushAll { delay, noreply } => {
            store.flush(store.clock().deadline(delay));
            if !noreply {
                line(out, b"OK");
            }
        }
        Request::Stats { group } => stats(shared, group, out),
        Request::Version => {
            out.extend_from_slice(b"VERSION ");
            line(out, VERSION.as_bytes());
        }
        Request::MemLimit { mb, noreply } => {
            let bytes = usize::try_from(mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX);
            store.set_limit(bytes);
            if !noreply {
                line(out, b"OK");
            }
        }
        Request::Verbosity { level, noreply } => {
            // memcached caps the level at its highest, 2.
            shared.verbosity.store(level.min(2), Ordering::Relaxed);
            if !noreply {
                line(out, b"OK");
            }
        }
        Request::Quit => return Flow::Close,
        Request::TooLarge { key, noreply } => {
            store.delete(key, None);
            if !noreply {
                write_error(ProtoError::TooLarge, out);
            }
        }
        Request::MetaNoop => line(out, b"MN"),
        Request::MetaGet { key, flags } => {
            if let Some(k) = meta_key(key, &flags, scratch, out) {
                meta_get(shared, key, k, &flags, out);
            }
        }
        Request::MetaSet { key, data, flags } => {
            if let Some(k) = meta_key(key, &flags, scratch, out) {
                meta_set(shared, key, k, data, &flags, out);
            }
        }
        Request::MetaDelete { key, flags } => {
            if let Some(k) = meta_key(key, &flags, scratch, out) {
                let r = store.delete(k, flags.compare_cas);
                let code: &[u8] = match r {
                    DeleteOutcome::Deleted => b"HD",
                    DeleteOutcome::NotFound => b"NF",
                    DeleteOutcome::Exists => b"EX",
                };
                if !(flags.quiet && r == DeleteOutcome::Deleted) {
                    out.extend_from_slice(code);
                    meta_ret(shared, key, &flags, None, out);
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        Request::MetaArith { key, flags } => {
            if let Some(k) = meta_key(key, &flags, scratch, out) {
                meta_arith(shared, key, k, &flags, out);
            }
        }
        Request::MetaDebug { key, flags } => {
            if let Some(k) = meta_key(key, &flags, scratch, out) {
                match store.inspect(k) {
                    Some((ttl, la, cas, fetched, size)) => {
                        out.extend_from_slice(b"ME ");
                        out.extend_from_slice(key);
                        out.extend_from_slice(b" exp=");
                        inum(out, ttl);
                        out.extend_from_slice(b" la=");
                        num(out, u64::from(la));
                        out.extend_from_slice(b" cas=");
                        num(out, cas);
                        out.extend_from_slice(if fetched { b" fetch=yes" } else { b" fetch=no" });
                        out.extend_from_slice(b" cls=1 size=");
                        num(out, size as u64);
                        out.extend_from_slice(b"\r\n");
                    }
                    None => line(out, b"EN"),
                }
            }
        }
    }
    Flow::Continue
}

/// The binary key of a meta request (base64-decoded with `b`); writes the
/// error and returns `None` when it does not decode.
fn meta_key<'k>(
    key: &'k [u8],
    flags: &MetaFlags<'_>,
    scratch: &'k mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Option<&'k [u8]> {
    if !flags.base64 {
        return Some(key);
    }
    match decode_base64(key, scratch) {
        Some(()) if !scratch.is_empty() && scratch.len() <= crate::protocol::KEY_MAX => {
            Some(scratch)
        }
        _ => {
            write_error(ProtoError::BadKeyEncoding, out);
            None
        }
    }
}

/// Item facts for return flags.
struct Facts {
    cas: u64,
    flags: u32,
    size: usize,
    ttl: i64,
    hit: bool,
    idle: u32,
}

/// Appends the return flags the request asked for, in its order.
fn meta_ret(
    shared: &Shared,
    key: &[u8],
    flags: &MetaFlags<'_>,
    facts: Option<&Facts>,
    out: &mut Vec<u8>,
) {
    let _ = shared;
    for c in flags.returned() {
        match (c, facts) {
            (b'O', _) => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(flags.opaque.unwrap_or_default());
            }
            (b'k', _) => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(key);
                if flags.base64 {
                    out.extend_from_slice(b" b");
                }
            }
            (b'c', Some(f)) => {
                out.extend_from_slice(b" c");
                num(out, f.cas);
            }
            (b'f', Some(f)) => {
                out.extend_from_slice(b" f");
                num(out, u64::from(f.flags));
            }
            (b'h', Some(f)) => out.extend_from_slice(if f.hit { b" h1" } else { b" h0" }),
            (b'l', Some(f)) => {
                out.extend_from_slice(b" l");
                num(out, u64::from(f.idle));
            }
            (b's', Some(f)) => {
                out.extend_from_slice(b" s");
                num(out, f.size as u64);
            }
            (b't', Some(f)) => {
                out.extend_from_slice(b" t");
                inum(out, f.ttl);
            }
            _ => {}
        }
    }
}

fn meta_get(
    shared: &Shared,
    wire_key: &[u8],
    key: &[u8],
    flags: &MetaFlags<'_>,
    out: &mut Vec<u8>,
) {
    let store = &shared.store;
    let touch = flags.ttl.map(|t| store.clock().deadline(t));
    let mut facts = None;
    let mut value_at = None;
    let hit = store.get(key, touch, |it, before| {
        facts = Some(Facts {
            cas: it.cas,
            flags: it.flags,
            size: it.value.len(),
            ttl: store.clock().ttl_left(it.exptime),
            hit: before.fetched,
            idle: before.idle,
        });
        if flags.value {
            // Stage the value at the end of `out`; the header goes in
            // front of it below.
            value_at = Some(out.len());
            out.extend_from_slice(&it.value);
        }
    });
    if !hit {
        if let Some(ttl) = flags.vivify {
            // Auto-vivify: create an empty item so later readers see a
            // hit; this reader is told it missed.
            let _ = store.store(SetMode::Add, key, 0, store.clock().deadline(ttl), b"", None);
        }
        if !flags.quiet {
            out.extend_from_slice(b"EN");
            meta_ret(shared, wire_key, flags, None, out);
            out.extend_from_slice(b"\r\n");
        }
        return;
    }
    let mut head = Vec::with_capacity(64);
    match (value_at, &facts) {
        (Some(_), Some(f)) => {
            head.extend_from_slice(b"VA ");
            num(&mut head, f.size as u64);
        }
        _ => head.extend_from_slice(b"HD"),
    }
    meta_ret(shared, wire_key, flags, facts.as_ref(), &mut head);
    head.extend_from_slice(b"\r\n");
    match value_at {
        Some(at) => {
            out.splice(at..at, head);
            out.extend_from_slice(b"\r\n");
        }
        None => out.extend_from_slice(&head),
    }
}

fn meta_set(
    shared: &Shared,
    wire_key: &[u8],
    key: &[u8],
    data: &[u8],
    flags: &MetaFlags<'_>,
    out: &mut Vec<u8>,
) {
    let store = &shared.store;
    let mode = match flags.mode.unwrap_or(MetaMode::Set) {
        MetaMode::Set => SetMode::Set,
        MetaMode::Add => SetMode::Add,
        MetaMode::Append => SetMode::Append,
        MetaMode::Prepend => SetMode::Prepend,
        MetaMode::Replace => SetMode::Replace,
        MetaMode::Incr | MetaMode::Decr => {
            write_error(ProtoError::BadMode, out);
            return;
        }
    };
    let deadline = store.clock().deadline(flags.ttl.unwrap_or(0));
    let r = store.store_with(
        mode,
        key,
        flags.client_flags.unwrap_or(0),
        deadline,
        data,
        flags.compare_cas,
        flags.new_cas,
    );
    let (code, cas): (&[u8], u64) = match r {
        StoreOutcome::Stored(c) => (b"HD", c),
        StoreOutcome::NotStored => (b"NS", 0),
        StoreOutcome::Exists => (b"EX", 0),
        StoreOutcome::NotFound => (b"NF", 0),
        StoreOutcome::NoMemory => {
            line(out, b"SERVER_ERROR out of memory storing object");
            return;
        }
    };
    if flags.quiet && code == b"HD" {
        return;
    }
    out.extend_from_slice(code);
    let facts = Facts {
        cas,
        flags: flags.client_flags.unwrap_or(0),
        size: data.len(),
        ttl: flags.ttl.unwrap_or(-1),
        hit: false,
        idle: 0,
    };
    meta_ret(shared, wire_key, flags, (cas != 0).then_some(&facts), out);
    out.extend_from_slice(b"\r\n");
}

fn meta_arith(
    shared: &Shared,
    wire_key: &[u8],
    key: &[u8],
    flags: &MetaFlags<'_>,
    out: &mut Vec<u8>,
) {
    let store = &shared.store;
    let incr = match flags.mode.unwrap_or(MetaMode::Incr) {
        MetaMode::Incr => true,
        MetaMode::Decr => false,
        _ => {
            write_error(ProtoError::BadMode, out);
            return;
        }
    };
    let create = flags
        .vivify
        .map(|ttl| (flags.initial.unwrap_or(0), store.clock().deadline(ttl)));
    let r = store.arith(
        key,
        incr,
        flags.delta.unwrap_or(1),
        create,
        flags.compare_cas,
    );
    match r {
        ArithOutcome::Value(v, cas) => {
            if let Some(t) = flags.ttl {
                store.touch(key, store.clock().deadline(t));
            }
            let digits = v.to_string();
            let facts = Facts {
                cas,
                flags: 0,
                size: digits.len(),
                ttl: flags.ttl.unwrap_or(-1),
                hit: false,
                idle: 0,
            };
            if flags.value {
                out.extend_from_slice(b"VA ");
                num(out, digits.len() as u64);
                meta_ret(shared, wire_key, flags, Some(&facts), out);
                out.extend_from_slice(b"\r\n");
                line(out, digits.as_bytes());
            } else if !flags.quiet {
                out.extend_from_slice(b"HD");
                meta_ret(shared, wire_key, flags, Some(&facts), out);
                out.extend_from_slice(b"\r\n");
            }
        }
        ArithOutcome::NotFound => {
            out.extend_from_slice(b"NF");
            meta_ret(shared, wire_key, flags, None, out);
            out.extend_from_slice(b"\r\n");
        }
        ArithOutcome::Exists => {
            out.extend_from_slice(b"EX");
            meta_ret(shared, wire_key, flags, None, out);
            out.extend_from_slice(b"\r\n");
        }
        ArithOutcome::NonNumeric => line(
            out,
            b"CLIENT_ERROR cannot increment or decrement non-numeric value",
        ),
    }
}

fn stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "STAT {name} {value}\r\n");
}

fn rusage() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (t(ru.ru_utime), t(ru.ru_stime))
}

pub(crate) fn stats(shared: &Shared, group: Option<&[u8]>, out: &mut Vec<u8>) {
    let store = &shared.store;
    let cfg = &shared.config;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    match group {
        None => {
            let s = store.stats();
            let o = &store.ops;
            let c = &shared.conns;
            let (user, sys) = rusage();
            stat(out, "pid", std::process::id());
            stat(out, "uptime", shared.started.elapsed().as_secs());
            stat(out, "time", store.clock().unix_now());
            stat(out, "version", VERSION);
            stat(out, "pointer_size", usize::BITS);
            stat(out, "rusage_user", format!("{user:.6}"));
            stat(out, "rusage_system", format!("{sys:.6}"));
            stat(out, "max_connections", cfg.max_conns);
            stat(out, "curr_connections", ld(&c.curr_connections));
            stat(out, "total_connections", ld(&c.total_connections));
            stat(out, "rejected_connections", ld(&c.rejected_connections));
            stat(out, "connection_structures", ld(&c.curr_connections));
            for (name, v) in [
                ("cmd_get", &o.cmd_get),
                ("cmd_set", &o.cmd_set),
                ("cmd_flush", &o.cmd_flush),
                ("cmd_touch", &o.cmd_touch),
                ("get_hits", &o.get_hits),
                ("get_misses", &o.get_misses),
                ("get_expired", &o.get_expired),
                ("get_flushed", &o.get_flushed),
                ("delete_misses", &o.delete_misses),
                ("delete_hits", &o.delete_hits),
                ("incr_misses", &o.incr_misses),
                ("incr_hits", &o.incr_hits),
                ("decr_misses", &o.decr_misses),
                ("decr_hits", &o.decr_hits),
                ("cas_misses", &o.cas_misses),
                ("cas_hits", &o.cas_hits),
                ("cas_badval", &o.cas_badval),
                ("touch_hits", &o.touch_hits),
                ("touch_misses", &o.touch_misses),
                ("bytes_read", &c.bytes_read),
                ("bytes_written", &c.bytes_written),
            ] {
                stat(out, name, ld(v));
            }
            stat(out, "limit_maxbytes", s.limit_maxbytes);
            stat(out, "threads", cfg.threads);
            stat(out, "bytes", s.bytes);
            stat(out, "curr_items", s.curr_items);
            stat(out, "total_items", s.counters.total_items);
            stat(out, "expired_unfetched", s.counters.expired_unfetched);
            stat(out, "evicted_unfetched", s.counters.evicted_unfetched);
            stat(out, "evictions", s.counters.evictions);
            stat(out, "reclaimed", s.counters.reclaimed);
            crate::runtime_stats::write(out);
        }
        Some(b"settings") => {
            stat(out, "maxbytes", store.limit());
            stat(out, "maxconns", cfg.max_conns);
            stat(out, "tcpport", cfg.port);
            stat(out, "udpport", 0);
            stat(out, "inter", &cfg.listen);
            stat(out, "verbosity", ld(&shared.verbosity));
            stat(out, "evictions", "on");
            stat(out, "cas_enabled", "yes");
            stat(out, "item_size_max", cfg.item_max);
            stat(out, "num_threads", cfg.threads);
            stat(out, "binding_protocol", "auto-negotiate");
            stat(out, "corewise_mode", cfg.mode);
        }
        Some(b"items") => {
            let s = store.stats();
            if s.curr_items > 0 {
                stat(out, "items:1:number", s.curr_items);
                stat(out, "items:1:age", s.oldest_age);
                stat(out, "items:1:evicted", s.counters.evictions);
                stat(
                    out,
                    "items:1:evicted_unfetched",
                    s.counters.evicted_unfetched,
                );
                stat(
                    out,
                    "items:1:expired_unfetched",
                    s.counters.expired_unfetched,
                );
                stat(out, "items:1:reclaimed", s.counters.reclaimed);
            }
        }
        Some(b"slabs") => {
            // One "class": items are individually allocated, not slabbed.
            let s = store.stats();
            if s.curr_items > 0 {
                stat(out, "1:chunk_size", cfg.item_max);
                stat(out, "1:used_chunks", s.curr_items);
                stat(out, "1:mem_requested", s.bytes);
            }
            stat(out, "active_slabs", u64::from(s.curr_items > 0));
            stat(out, "total_malloced", s.bytes);
        }
        Some(b"sizes") => stat(out, "sizes_status", "disabled"),
        Some(b"reset") => {
            store.ops.reset();
            for c in [
                &shared.conns.total_connections,
                &shared.conns.rejected_connections,
                &shared.conns.bytes_read,
                &shared.conns.bytes_written,
            ] {
                c.store(0, Ordering::Relaxed);
            }
            line(out, b"RESET");
            return;
        }
        Some(_) => {
            write_error(ProtoError::Unknown, out);
            return;
        }
    }
    out.extend_from_slice(b"END\r\n");
}
