//! Runs one binary-protocol request against the store and writes
//! memcached's binary reply.
//!
//! Why next to [`crate::exec`] and not inside it: the binary protocol has
//! its own validation (each opcode fixes its extras, key and value
//! layout), its own outcome codes (status words instead of reply lines)
//! and its own quiet variants, but the store operations are the same, so
//! both modules are thin mappings from a request to the [`Store`] calls.
//! The status codes and error texts are memcached's (1.6), including its
//! choices where the text and binary protocols differ: `add` of a present
//! key answers "exists", `replace` of an absent one "not found", and a
//! storage command with a CAS is a compare-and-swap whatever its opcode.
//!
//! [`Store`]: crate::store::Store

use crate::admin::DetailOp;
use crate::exec::{stats, Flow, Shared, VERSION};
use crate::protocol::binary::{Frame, Header, RESPONSE_MAGIC};
use crate::protocol::KEY_MAX;
use crate::reply::Sink;
use crate::store::{ArithOutcome, Deadline, DeleteOutcome, SetMode, StoreOutcome};
use std::sync::atomic::Ordering;

/// Response status words.
mod status {
    pub const OK: u16 = 0x0000;
    pub const KEY_ENOENT: u16 = 0x0001;
    pub const KEY_EEXISTS: u16 = 0x0002;
    pub const E2BIG: u16 = 0x0003;
    pub const EINVAL: u16 = 0x0004;
    pub const NOT_STORED: u16 = 0x0005;
    pub const DELTA_BADVAL: u16 = 0x0006;
    pub const AUTH_ERROR: u16 = 0x0020;
    pub const UNKNOWN_COMMAND: u16 = 0x0081;
    pub const ENOMEM: u16 = 0x0082;
}

/// Opcodes.
mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// The body memcached sends with an error status.
fn error_text(status: u16) -> &'static [u8] {
    match status {
        status::KEY_ENOENT => b"Not found",
        status::KEY_EEXISTS => b"Data exists for key.",
        status::E2BIG => b"Too large.",
        status::EINVAL => b"Invalid arguments",
        status::NOT_STORED => b"Not stored.",
        status::DELTA_BADVAL => b"Non-numeric server-side value for incr or decr",
        status::ENOMEM => b"Out of memory",
        _ => b"Unknown command",
    }
}

/// Appends one response.
#[allow(clippy::too_many_arguments)]
fn respond(
    out: &mut Vec<u8>,
    h: &Header,
    status: u16,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    out.reserve(24 + extras.len() + key.len() + value.len());
    respond_head(out, h, status, cas, extras, key, value.len());
    out.extend_from_slice(value);
}

/// Appends one response up to its value, of `value_len` bytes, which the
/// caller appends.
#[allow(clippy::too_many_arguments)]
fn respond_head(
    out: &mut Vec<u8>,
    h: &Header,
    status: u16,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value_len: usize,
) {
    out.push(RESPONSE_MAGIC);
    out.push(h.opcode);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0);
    out.extend_from_slice(&status.to_be_bytes());
    let body = (extras.len() + key.len() + value_len) as u32;
    out.extend_from_slice(&body.to_be_bytes());
    out.extend_from_slice(&h.opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
}

/// Appends an error response (errors are sent for quiet commands too).
///
/// ```
/// use corewise_kv::exec_binary::write_error;
/// use corewise_kv::protocol::binary::Header;
/// let h = Header { magic: 0x80, opcode: 0x00, key_len: 0, extras_len: 0, body_len: 0, opaque: 9, cas: 0 };
/// let mut out = Vec::new();
/// write_error(&h, 0x0001, &mut out);
/// assert_eq!(&out[..2], &[0x81, 0x00]);
/// assert_eq!(&out[6..8], &[0x00, 0x01]); // status: not found
/// assert_eq!(&out[24..], b"Not found");
/// ```
pub fn write_error(h: &Header, status: u16, out: &mut Vec<u8>) {
    respond(out, h, status, 0, &[], &[], error_text(status));
}

/// Appends the response to a body over the item limit (memcached's "Too
/// large."); the decoder skips the body.
///
/// ```
/// use corewise_kv::exec_binary::write_too_large;
/// use corewise_kv::protocol::binary::Header;
/// let h = Header { magic: 0x80, opcode: 0x01, key_len: 1, extras_len: 8, body_len: 1 << 21, opaque: 3, cas: 0 };
/// let mut out = Vec::new();
/// write_too_large(&h, &mut out);
/// assert_eq!(&out[6..8], &[0x00, 0x03]); // status: too large
/// assert_eq!(&out[12..16], &3u32.to_be_bytes()); // the request's opaque
/// assert_eq!(&out[24..], b"Too large.");
/// ```
pub fn write_too_large(h: &Header, out: &mut Vec<u8>) {
    write_error(h, status::E2BIG, out);
}

/// Answers a request whose body is over the item limit (the decoder's
/// [`TooLarge`](crate::protocol::binary::BinDecoded::TooLarge)): "Too
/// large.", and for `set`/`setq` the key's old value is removed, as
/// memcached does (a failed set must not leave stale data behind).
///
/// ```
/// use corewise_kv::{config::Config, exec::Shared, exec_binary::too_large};
/// use corewise_kv::protocol::binary::Header;
/// use corewise_kv::store::{Deadline, SetMode};
/// let shared = Shared::new(Config::default());
/// shared.store.store(SetMode::Set, b"k", 0, Deadline::Never, b"old", None);
/// let h = Header { magic: 0x80, opcode: 0x01, key_len: 1, extras_len: 8, body_len: 1 << 21, opaque: 0, cas: 0 };
/// let mut out = Vec::new();
/// too_large(&shared, &h, b"k", &mut out);
/// assert_eq!(&out[6..8], &[0x00, 0x03]); // status: too large
/// assert!(!shared.store.get(b"k", None, |_, _| {}));
/// ```
pub fn too_large(shared: &Shared, h: &Header, key: &[u8], out: &mut Vec<u8>) {
    if matches!(h.opcode, op::SET | op::SETQ) {
        shared.store.remove(key);
    }
    shared
        .store
        .ops
        .store_too_large
        .fetch_add(1, Ordering::Relaxed);
    write_error(h, status::E2BIG, out);
}

/// Appends the response to a header whose extras and key overrun its
/// body: "Unknown command", as memcached answers before it closes the
/// connection (the caller closes it too).
///
/// ```
/// use corewise_kv::exec_binary::write_malformed;
/// use corewise_kv::protocol::binary::Header;
/// let h = Header { magic: 0x80, opcode: 0x00, key_len: 9, extras_len: 0, body_len: 1, opaque: 0, cas: 0 };
/// let mut out = Vec::new();
/// write_malformed(&h, &mut out);
/// assert_eq!(&out[6..8], &[0x00, 0x81]); // status: unknown command
/// assert_eq!(&out[24..], b"Unknown command");
/// ```
pub fn write_malformed(h: &Header, out: &mut Vec<u8>) {
    write_error(h, status::UNKNOWN_COMMAND, out);
}

fn be32(b: &[u8]) -> u32 {
    b.first_chunk::<4>().map_or(0, |c| u32::from_be_bytes(*c))
}

fn be64(b: &[u8]) -> u64 {
    b.first_chunk::<8>().map_or(0, |c| u64::from_be_bytes(*c))
}

/// Whether the frame has the layout its opcode needs: `extras` bytes of
/// extras (any count for `None`), a key (`Some(true)`), none
/// (`Some(false)`) or either (`None`), and a value or not.
fn layout(f: &Frame<'_>, extras: &[usize], key: Option<bool>, value: bool) -> bool {
    extras.contains(&f.extras.len())
        && f.key.len() <= KEY_MAX
        && key.is_none_or(|k| k != f.key.is_empty())
        && (value || f.value.is_empty())
}

/// Runs `f`, appending its response (if any) to `out`.
///
/// ```
/// use corewise_kv::{config::Config, exec::Shared, exec_binary::execute_binary};
/// use corewise_kv::protocol::{binary::{BinDecoded, BinaryDecoder}, Limits};
/// let shared = Shared::new(Config::default());
/// let mut dec = BinaryDecoder::new(Limits::default());
/// // noop, opaque 5
/// let mut req = vec![0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5];
/// req.extend_from_slice(&[0; 8]);
/// let (_, BinDecoded::Frame(f)) = dec.decode(&req) else { unreachable!() };
/// let mut out = Vec::new();
/// execute_binary(&shared, &f, &mut out);
/// assert_eq!(out.len(), 24);
/// assert_eq!((out[0], out[1], out[15]), (0x81, 0x0a, 5));
/// ```
pub fn execute_binary<O: Sink>(shared: &Shared, f: &Frame<'_>, out: &mut O) -> Flow {
    if retrieves(f.header.opcode) {
        retrieve(shared, f, out)
    } else {
        execute_bytes(shared, f, out.bytes())
    }
}

/// The commands whose replies may carry an item's value, answered by
/// `retrieve` (into a [`Sink`] that may keep large values by reference).
fn retrieves(opcode: u8) -> bool {
    matches!(
        opcode,
        op::GET
            | op::GETQ
            | op::GETK
            | op::GETKQ
            | op::GAT
            | op::GATQ
            | op::GATK
            | op::GATKQ
            | op::TOUCH
    )
}

/// The get, get-and-touch and touch opcodes: the ones that send a value,
/// by reference when `out` keeps large ones that way.
fn retrieve<O: Sink>(shared: &Shared, f: &Frame<'_>, out: &mut O) -> Flow {
    let h = &f.header;
    let store = &shared.store;
    let touching = matches!(
        h.opcode,
        op::GAT | op::GATQ | op::GATK | op::GATKQ | op::TOUCH
    );
    let want = if touching { 4 } else { 0 };
    if !layout(f, &[want], Some(true), false) {
        // As in `execute_bytes`: invalid arguments, and close.
        write_error(h, status::EINVAL, out.bytes());
        return Flow::Close;
    }
    let touch = touching.then(|| store.clock().deadline(i64::from(be32(f.extras))));
    let with_key = matches!(h.opcode, op::GETK | op::GETKQ | op::GATK | op::GATKQ);
    let quiet = matches!(h.opcode, op::GETQ | op::GETKQ | op::GATQ | op::GATKQ);
    // A touch answers with the flags but not the value (memcached).
    let with_value = h.opcode != op::TOUCH;
    let key: &[u8] = if with_key { f.key } else { &[] };
    let hit = store.get(f.key, touch, |it, _| {
        let len = if with_value { it.value.len() } else { 0 };
        let flags = it.flags.to_be_bytes();
        respond_head(
            out.bytes(),
            h,
            status::OK,
            store.shown_cas(it.cas),
            &flags,
            key,
            len,
        );
        if with_value {
            out.value(&it.value);
        }
    });
    shared.detail.record(f.key, DetailOp::Get(hit));
    if !hit && !quiet {
        if with_key {
            respond(out.bytes(), h, status::KEY_ENOENT, 0, &[], f.key, &[]);
        } else {
            write_error(h, status::KEY_ENOENT, out.bytes());
        }
    }
    Flow::Continue
}

/// [`execute_binary`] of the opcodes that write bytes only.
fn execute_bytes(shared: &Shared, f: &Frame<'_>, out: &mut Vec<u8>) -> Flow {
    let h = &f.header;
    let store = &shared.store;
    let deadline = |exptime: u32| store.clock().deadline(i64::from(exptime));
    // A body that does not have the layout its opcode needs: memcached
    // answers "Invalid arguments" and closes the connection, since what
    // follows may not be a header.
    let invalid = |out: &mut Vec<u8>| {
        write_error(h, status::EINVAL, out);
        Flow::Close
    };
    match h.opcode {
        // Answered by `retrieve`.
        o if retrieves(o) => {}
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => {
            if !layout(f, &[8], Some(true), true) {
                return invalid(out);
            }
            let quiet = matches!(h.opcode, op::SETQ | op::ADDQ | op::REPLACEQ);
            let mode = match h.opcode {
                op::ADD | op::ADDQ => SetMode::Add,
                op::REPLACE | op::REPLACEQ => SetMode::Replace,
                _ => SetMode::Set,
            };
            store_value(
                shared,
                f,
                mode,
                be32(f.extras),
                deadline(be32(&f.extras[4..])),
                quiet,
                out,
            );
        }
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => {
            if !layout(f, &[0], Some(true), true) {
                return invalid(out);
            }
            let quiet = matches!(h.opcode, op::APPENDQ | op::PREPENDQ);
            let mode = if matches!(h.opcode, op::APPEND | op::APPENDQ) {
                SetMode::Append
            } else {
                SetMode::Prepend
            };
            store_value(shared, f, mode, 0, Deadline::Never, quiet, out);
        }
        op::DELETE | op::DELETEQ => {
            if !layout(f, &[0], Some(true), false) {
                return invalid(out);
            }
            let compare = (h.cas != 0).then_some(h.cas);
            shared.detail.record(f.key, DetailOp::Delete);
            match store.delete(f.key, compare) {
                DeleteOutcome::Deleted => {
                    if h.opcode == op::DELETE {
                        respond(out, h, status::OK, 0, &[], &[], &[]);
                    }
                }
                DeleteOutcome::NotFound => write_error(h, status::KEY_ENOENT, out),
                DeleteOutcome::Exists => write_error(h, status::KEY_EEXISTS, out),
            }
        }
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            if !layout(f, &[20], Some(true), false) {
                return invalid(out);
            }
            let incr = matches!(h.opcode, op::INCREMENT | op::INCREMENTQ);
            let quiet = matches!(h.opcode, op::INCREMENTQ | op::DECREMENTQ);
            let (delta, initial, exptime) =
                (be64(f.extras), be64(&f.extras[8..]), be32(&f.extras[16..]));
            // An expiration of all ones: do not create a missing counter.
            let create = (exptime != u32::MAX).then(|| (initial, deadline(exptime)));
            let compare = (h.cas != 0).then_some(h.cas);
            match store.arith(f.key, incr, delta, create, compare) {
                ArithOutcome::Value(v, cas) => {
                    if !quiet {
                        respond(out, h, status::OK, cas, &[], &[], &v.to_be_bytes());
                    }
                }
                ArithOutcome::NotFound => write_error(h, status::KEY_ENOENT, out),
                ArithOutcome::NonNumeric => write_error(h, status::DELTA_BADVAL, out),
                ArithOutcome::Exists => write_error(h, status::KEY_EEXISTS, out),
            }
        }
        op::QUIT | op::QUITQ => {
            if !layout(f, &[0], Some(false), false) {
                return invalid(out);
            }
            if h.opcode == op::QUIT {
                respond(out, h, status::OK, 0, &[], &[], &[]);
            }
            return Flow::Close;
        }
        op::FLUSH | op::FLUSHQ => {
            if !layout(f, &[0, 4], Some(false), false) {
                return invalid(out);
            }
            if !shared.config.flush_enabled {
                // memcached's answer under `-F`, to flushq too; unlike a
                // text flush it is not counted in `cmd_flush`.
                respond(out, h, status::AUTH_ERROR, 0, &[], &[], b"Auth failure.");
                return Flow::Continue;
            }
            store.flush(i64::from(be32(f.extras)));
            if h.opcode == op::FLUSH {
                respond(out, h, status::OK, 0, &[], &[], &[]);
            }
        }
        op::NOOP => {
            if !layout(f, &[0], Some(false), false) {
                return invalid(out);
            }
            respond(out, h, status::OK, 0, &[], &[], &[]);
        }
        op::VERSION => {
            if !layout(f, &[0], Some(false), false) {
                return invalid(out);
            }
            respond(out, h, status::OK, 0, &[], &[], VERSION.as_bytes());
        }
        op::STAT => {
            if !layout(f, &[0], None, false) {
                return invalid(out);
            }
            stat_responses(shared, f, out);
        }
        // No SASL here (memcached built or run without it answers the
        // same), but memcached checks a SASL frame's layout first: a list
        // with any body, or an auth or step without a key or with extras,
        // is invalid and closes the connection.
        op::SASL_LIST_MECHS => {
            if !layout(f, &[0], Some(false), false) {
                return invalid(out);
            }
            write_error(h, status::UNKNOWN_COMMAND, out);
        }
        op::SASL_AUTH | op::SASL_STEP => {
            if !layout(f, &[0], Some(true), true) {
                return invalid(out);
            }
            write_error(h, status::UNKNOWN_COMMAND, out);
        }
        // Verbosity included: memcached 1.6 no longer serves it in binary.
        _ => write_error(h, status::UNKNOWN_COMMAND, out),
    }
    Flow::Continue
}

/// set, add, replace, append, prepend and their quiet forms.
fn store_value(
    shared: &Shared,
    f: &Frame<'_>,
    mode: SetMode,
    flags: u32,
    deadline: Deadline,
    quiet: bool,
    out: &mut Vec<u8>,
) {
    let h = &f.header;
    shared.detail.record(f.key, DetailOp::Set);
    if shared.store.size_of_item(f.key.len(), flags, f.value.len()) > shared.config.item_max {
        too_large(shared, h, f.key, out);
        return;
    }
    // memcached turns an add, set or replace that carries a CAS into a
    // `cas`; with CAS off (`-C`) the item cannot hold the value, so the
    // request stays what it was.
    let compare = (h.cas != 0 && shared.store.cas_enabled()).then_some(h.cas);
    let mode = if compare.is_some() && mode == SetMode::Add {
        SetMode::Set
    } else {
        mode
    };
    let appending = matches!(mode, SetMode::Append | SetMode::Prepend);
    let r = shared
        .store
        .store(mode, f.key, flags, deadline, f.value, compare);
    let status = match r {
        StoreOutcome::Stored(cas) => {
            if !quiet {
                respond(out, h, status::OK, cas, &[], &[], &[]);
            }
            return;
        }
        StoreOutcome::Exists => status::KEY_EEXISTS,
        StoreOutcome::NotFound if appending => status::NOT_STORED,
        StoreOutcome::NotFound => status::KEY_ENOENT,
        StoreOutcome::NotStored => match mode {
            SetMode::Add => status::KEY_EEXISTS,
            SetMode::Replace => status::KEY_ENOENT,
            _ => status::NOT_STORED,
        },
        StoreOutcome::NoMemory => status::ENOMEM,
    };
    write_error(h, status, out);
}

/// `stat` with an optional group key: one response per statistic (key =
/// name, value = value), then an empty one; a group binary `stat` does not
/// serve is "not found".
///
/// The groups are memcached's binary ones, matched as it matches them:
/// none (the general statistics), a key starting with `reset`,
/// `settings` or `detail`, and exactly `items`, `slabs`, `sizes`,
/// `sizes_enable` or `sizes_disable` (whose one statistic memcached sends
/// without the empty response after it, as its text reply has no `END`).
/// The text protocol's other groups (`conns`, `cachedump`, `extstore`,
/// ...) are not served in binary by memcached either.
fn stat_responses(shared: &Shared, f: &Frame<'_>, out: &mut Vec<u8>) {
    let h = &f.header;
    let group: Option<&[u8]> = match f.key {
        [] => None,
        k if k.starts_with(b"reset") => Some(b"reset"),
        k if k.starts_with(b"settings") => Some(b"settings"),
        k if k.starts_with(b"detail") => {
            stat_detail(shared, h, &k[b"detail".len()..], out);
            return;
        }
        k @ (b"items" | b"slabs" | b"sizes" | b"sizes_enable" | b"sizes_disable") => Some(k),
        _ => {
            write_error(h, status::KEY_ENOENT, out);
            return;
        }
    };
    let mut text = Vec::new();
    stats(shared, group, &mut text);
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"STAT ") {
            let at = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
            let (name, value) = rest.split_at(at);
            respond(
                out,
                h,
                status::OK,
                0,
                &[],
                name,
                value.get(1..).unwrap_or_default(),
            );
        } else if line == b"ERROR" {
            write_error(h, status::KEY_ENOENT, out);
            return;
        }
    }
    if !matches!(group, Some(b"sizes_enable" | b"sizes_disable")) {
        respond(out, h, status::OK, 0, &[], &[], &[]);
    }
}

/// `stat detail on|off|dump` (`arg` is what follows `detail`, matched by
/// prefix as memcached does): the switches answer with the terminator
/// alone, the dump as one statistic named `detailed` whose value is the
/// text protocol's dump, `END` line included.
fn stat_detail(shared: &Shared, h: &Header, arg: &[u8], out: &mut Vec<u8>) {
    let sub: &[u8] = if arg.starts_with(b" dump") {
        b"dump"
    } else if arg.starts_with(b" on") {
        b"on"
    } else if arg.starts_with(b" off") {
        b"off"
    } else {
        write_error(h, status::KEY_ENOENT, out);
        return;
    };
    let mut text = Vec::new();
    shared.detail.command(Some(sub), &mut text);
    if sub == b"dump" {
        respond(out, h, status::OK, 0, &[], b"detailed", &text);
    }
    respond(out, h, status::OK, 0, &[], &[], &[]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::protocol::binary::{BinDecoded, BinaryDecoder, Header};
    use crate::protocol::Limits;

    fn req(op: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
        let mut v = vec![0x80, op];
        v.extend_from_slice(&(key.len() as u16).to_be_bytes());
        v.push(extras.len() as u8);
        v.extend_from_slice(&[0, 0, 0]);
        let body = (extras.len() + key.len() + value.len()) as u32;
        v.extend_from_slice(&body.to_be_bytes());
        v.extend_from_slice(&0xabcd_u32.to_be_bytes());
        v.extend_from_slice(&cas.to_be_bytes());
        v.extend_from_slice(extras);
        v.extend_from_slice(key);
        v.extend_from_slice(value);
        v
    }

    fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
        let mut e = flags.to_be_bytes().to_vec();
        e.extend_from_slice(&exptime.to_be_bytes());
        e
    }

    /// One parsed response.
    #[derive(Debug)]
    struct Resp {
        opcode: u8,
        status: u16,
        opaque: u32,
        cas: u64,
        extras: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    }

    fn run(shared: &Shared, bytes: &[u8]) -> (Vec<Resp>, Flow) {
        let mut dec = BinaryDecoder::new(Limits {
            item_max: shared.config.item_max,
            cas: shared.config.cas_enabled,
        });
        let mut out = Vec::new();
        let mut pos = 0;
        let mut flow = Flow::Continue;
        while pos < bytes.len() {
            let (n, d) = dec.decode(&bytes[pos..]);
            pos += n;
            match d {
                BinDecoded::Frame(f) => {
                    flow = execute_binary(shared, &f, &mut out);
                    if flow == Flow::Close {
                        break;
                    }
                }
                BinDecoded::TooLarge(h, k) => too_large(shared, &h, k, &mut out),
                BinDecoded::Malformed(h) => {
                    write_malformed(&h, &mut out);
                    flow = Flow::Close;
                    break;
                }
                BinDecoded::Incomplete if n > 0 => {}
                other => panic!("{other:?} at {pos}"),
            }
        }
        let mut resps = Vec::new();
        let mut p = 0;
        while p < out.len() {
            let h = Header::parse(out[p..p + 24].try_into().unwrap());
            assert_eq!(h.magic, 0x81);
            let status = u16::from_be_bytes([out[p + 6], out[p + 7]]);
            let body = &out[p + 24..p + 24 + h.body_len as usize];
            let (e, rest) = body.split_at(usize::from(h.extras_len));
            let (k, v) = rest.split_at(usize::from(h.key_len));
            resps.push(Resp {
                opcode: h.opcode,
                status,
                opaque: h.opaque,
                cas: h.cas,
                extras: e.to_vec(),
                key: k.to_vec(),
                value: v.to_vec(),
            });
            p += 24 + h.body_len as usize;
        }
        (resps, flow)
    }

    fn shared() -> Shared {
        Shared::new(Config {
            item_max: 1024,
            ..Config::default()
        })
    }

    #[test]
    fn set_then_get_and_getk() {
        let s = shared();
        let mut b = req(op::SET, &set_extras(0xdead_beef, 0), b"k", b"v1", 0);
        b.extend(req(op::GET, &[], b"k", &[], 0));
        b.extend(req(op::GETK, &[], b"k", &[], 0));
        let (r, _) = run(&s, &b);
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].status, r[0].opaque), (0, 0xabcd));
        assert_ne!(r[0].cas, 0);
        assert_eq!(r[1].extras, 0xdead_beef_u32.to_be_bytes());
        assert_eq!(
            (r[1].key.as_slice(), r[1].value.as_slice()),
            (&b""[..], &b"v1"[..])
        );
        assert_eq!(r[1].cas, r[0].cas);
        assert_eq!(
            (r[2].key.as_slice(), r[2].value.as_slice()),
            (&b"k"[..], &b"v1"[..])
        );
    }

    #[test]
    fn quiet_commands_answer_only_errors_and_hits() {
        let s = shared();
        let mut b = req(op::SETQ, &set_extras(0, 0), b"a", b"1", 0);
        b.extend(req(op::GETQ, &[], b"missing", &[], 0));
        b.extend(req(op::GETKQ, &[], b"a", &[], 0));
        b.extend(req(op::ADDQ, &set_extras(0, 0), b"a", b"2", 0));
        b.extend(req(op::DELETEQ, &[], b"a", &[], 0));
        b.extend(req(op::NOOP, &[], &[], &[], 0));
        let (r, _) = run(&s, &b);
        let seen: Vec<(u8, u16)> = r.iter().map(|r| (r.opcode, r.status)).collect();
        assert_eq!(
            seen,
            vec![
                (op::GETKQ, status::OK),
                (op::ADDQ, status::KEY_EEXISTS),
                (op::NOOP, status::OK)
            ]
        );
        assert_eq!(r[1].value, b"Data exists for key.");
    }

    #[test]
    fn misses_and_conditions_use_memcacheds_status_words() {
        let s = shared();
        let mut b = req(op::GET, &[], b"nope", &[], 0);
        b.extend(req(op::GETK, &[], b"nope", &[], 0));
        b.extend(req(op::REPLACE, &set_extras(0, 0), b"nope", b"x", 0));
        b.extend(req(op::APPEND, &[], b"nope", b"x", 0));
        b.extend(req(op::DELETE, &[], b"nope", &[], 0));
        b.extend(req(op::SET, &set_extras(0, 0), b"k", b"x", 0));
        b.extend(req(op::SET, &set_extras(0, 0), b"k", b"y", 12345));
        let (r, _) = run(&s, &b);
        let st: Vec<u16> = r.iter().map(|r| r.status).collect();
        assert_eq!(
            st,
            vec![
                status::KEY_ENOENT,
                status::KEY_ENOENT,
                status::KEY_ENOENT,
                status::NOT_STORED,
                status::KEY_ENOENT,
                status::OK,
                status::KEY_EEXISTS
            ]
        );
        assert_eq!(r[0].value, b"Not found");
        assert_eq!(
            (r[1].key.as_slice(), r[1].value.as_slice()),
            (&b"nope"[..], &b""[..])
        );
    }

    #[test]
    fn cas_swaps_only_the_version_it_names() {
        let s = shared();
        let (r, _) = run(&s, &req(op::SET, &set_extras(0, 0), b"k", b"1", 0));
        let cas = r[0].cas;
        let (r, _) = run(&s, &req(op::SET, &set_extras(0, 0), b"k", b"2", cas));
        assert_eq!(r[0].status, status::OK);
        let (r, _) = run(&s, &req(op::SET, &set_extras(0, 0), b"k", b"3", cas));
        assert_eq!(r[0].status, status::KEY_EEXISTS);
        let (r, _) = run(&s, &req(op::GET, &[], b"k", &[], 0));
        assert_eq!(r[0].value, b"2");
    }

    #[test]
    fn counters_create_count_and_refuse_text() {
        let s = shared();
        let arith = |delta: u64, initial: u64, exptime: u32| {
            let mut e = delta.to_be_bytes().to_vec();
            e.extend_from_slice(&initial.to_be_bytes());
            e.extend_from_slice(&exptime.to_be_bytes());
            e
        };
        let mut b = req(op::INCREMENT, &arith(1, 0, u32::MAX), b"n", &[], 0);
        b.extend(req(op::INCREMENT, &arith(1, 10, 0), b"n", &[], 0));
        b.extend(req(op::INCREMENT, &arith(5, 0, 0), b"n", &[], 0));
        b.extend(req(op::DECREMENT, &arith(100, 0, 0), b"n", &[], 0));
        b.extend(req(op::SET, &set_extras(0, 0), b"t", b"abc", 0));
        b.extend(req(op::INCREMENT, &arith(1, 0, 0), b"t", &[], 0));
        let (r, _) = run(&s, &b);
        assert_eq!(r[0].status, status::KEY_ENOENT);
        assert_eq!(r[1].value, 10u64.to_be_bytes());
        assert_eq!(r[2].value, 15u64.to_be_bytes());
        assert_eq!(r[3].value, 0u64.to_be_bytes(), "decrement stops at 0");
        assert_eq!(r[5].status, status::DELTA_BADVAL);
    }

    #[test]
    fn bad_layouts_close_too_large_values_and_unknown_opcodes_are_answered() {
        let s = shared();
        for bad in [
            req(op::GET, &[1, 2, 3, 4], b"k", &[], 0),
            req(op::SET, &set_extras(0, 0), &[b'k'; 251], b"x", 0),
            req(op::NOOP, &[], b"k", &[], 0),
        ] {
            let mut b = bad;
            b.extend(req(op::NOOP, &[], &[], &[], 0));
            let (r, flow) = run(&s, &b);
            let st: Vec<u16> = r.iter().map(|r| r.status).collect();
            assert_eq!((st, flow), (vec![status::EINVAL], Flow::Close));
        }
        let mut b = req(op::SET, &set_extras(0, 0), b"big", &[0; 1025], 0);
        b.extend(req(op::SET, &set_extras(0, 0), b"huge", &[0; 5000], 0));
        b.extend(req(0x20, &[], &[], &[], 0));
        b.extend(req(0x1b, &[0, 0, 0, 1], &[], &[], 0)); // verbosity
        b.extend(req(op::NOOP, &[], &[], &[], 0));
        let (r, _) = run(&s, &b);
        let st: Vec<u16> = r.iter().map(|r| r.status).collect();
        assert_eq!(
            st,
            vec![
                status::E2BIG,
                status::E2BIG,
                status::UNKNOWN_COMMAND,
                status::UNKNOWN_COMMAND,
                status::OK
            ]
        );
    }

    #[test]
    fn stat_lists_then_ends_and_quit_closes() {
        let s = shared();
        let mut b = req(op::STAT, &[], &[], &[], 0);
        b.extend(req(op::STAT, &[], b"nosuchgroup", &[], 0));
        b.extend(req(op::VERSION, &[], &[], &[], 0));
        b.extend(req(op::QUIT, &[], &[], &[], 0));
        b.extend(req(op::NOOP, &[], &[], &[], 0));
        let (r, flow) = run(&s, &b);
        assert_eq!(flow, Flow::Close);
        let pid = r.iter().find(|r| r.key == b"pid").expect("a pid stat");
        assert_eq!(pid.value, std::process::id().to_string().as_bytes());
        let end = r.iter().position(|r| r.key.is_empty()).unwrap();
        assert!(end > 10, "many stats before the terminator");
        assert_eq!(r[end + 1].status, status::KEY_ENOENT);
        assert_eq!(r[end + 2].value, VERSION.as_bytes());
        assert_eq!(
            r.last().map(|r| r.opcode),
            Some(op::QUIT),
            "nothing after quit"
        );
    }
}
