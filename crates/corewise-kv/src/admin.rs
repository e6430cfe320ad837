//! memcached's operator commands: `shutdown`, `lru_crawler`, `slabs`,
//! `lru`, and the `stats detail` prefix statistics.
//!
//! Why a module of its own: these commands steer memcached's machinery
//! (slab page mover, LRU maintainer and crawler) rather than items, and
//! most of that machinery has no counterpart here. Each is accepted with
//! memcached 1.6.18's replies, and does what it means where that has a
//! meaning: the crawler's `crawl` frees expired items, `metadump` lists
//! items, `enable`/`disable` switch both; `shutdown` needs `-A`. Tuning
//! knobs of machinery that does not exist here (`lru tune`, `lru mode`,
//! `slabs automove`) are checked and acknowledged, as memcached does.

use crate::exec::{Flow, Shared};
use crate::store::slabs;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Per-prefix counters of `stats detail` (memcached's `-D :` prefixes).
///
/// ```
/// # // Runs every request in `buf` against `shared`, returning the replies.
/// # fn run(shared: &corewise_kv::exec::Shared, mut buf: &[u8]) -> String {
/// #     use corewise_kv::protocol::{Decoded, Decoder, Limits};
/// #     let (mut d, mut out) = (Decoder::new(Limits::default()), Vec::new());
/// #     while let (n, Decoded::Request(r)) = d.decode(buf) {
/// #         corewise_kv::exec::execute(shared, &r, &mut out, &mut Vec::new());
/// #         buf = &buf[n..];
/// #     }
/// #     String::from_utf8(out).unwrap()
/// # }
/// use corewise_kv::{config::Config, exec::Shared};
/// let shared = Shared::new(Config::default());
/// let reply = run(&shared, b"stats detail on\r\nset user:1 0 0 1\r\nx\r\nget user:1\r\nget user:2\r\nstats detail dump\r\n");
/// assert!(reply.ends_with("PREFIX user get 2 hit 1 set 1 del 0\r\nEND\r\n"));
/// ```
#[derive(Debug)]
pub struct Detail {
    enabled: AtomicBool,
    delimiter: u8,
    prefixes: corewise::sync::SpinLock<BTreeMap<Vec<u8>, [u64; 4]>>,
}

impl Default for Detail {
    fn default() -> Self {
        Self::new(b':', false)
    }
}

/// What a request did to a key, for `stats detail`.
///
/// ```
/// use corewise_kv::admin::{Detail, DetailOp};
/// let d = Detail::default();
/// d.command(Some(b"on"), &mut Vec::new());
/// d.record(b"a:1", DetailOp::Get(false));
/// d.record(b"a:1", DetailOp::Delete);
/// let mut out = Vec::new();
/// d.dump(&mut out);
/// assert_eq!(out, b"PREFIX a get 1 hit 0 set 0 del 1\r\n");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetailOp {
    /// A retrieval, and whether it hit.
    Get(bool),
    /// A storage command.
    Set,
    /// A delete.
    Delete,
}

impl Detail {
    /// Prefix statistics whose prefixes end at `delimiter` (memcached's
    /// `-D`), on from the start when `enabled`.
    ///
    /// ```
    /// use corewise_kv::admin::{Detail, DetailOp};
    /// let d = Detail::new(b'/', true);
    /// assert_eq!(d.delimiter(), b'/');
    /// d.record(b"a/1", DetailOp::Set);
    /// d.record(b"b:2", DetailOp::Set); // no prefix with this delimiter
    /// let mut out = Vec::new();
    /// d.dump(&mut out);
    /// assert_eq!(out, b"PREFIX a get 0 hit 0 set 1 del 0\r\n");
    /// ```
    pub fn new(delimiter: u8, enabled: bool) -> Self {
        Self {
            enabled: AtomicBool::new(enabled),
            delimiter,
            prefixes: corewise::sync::SpinLock::new(BTreeMap::new()),
        }
    }

    /// The delimiter that ends a prefix (`stats settings`'
    /// `stat_key_prefix`).
    pub fn delimiter(&self) -> u8 {
        self.delimiter
    }

    /// Records `op` on `key` when `stats detail on` is in effect and the
    /// key has a prefix (text before the first delimiter, `:` by default).
    ///
    /// ```
    /// use corewise_kv::admin::{Detail, DetailOp};
    /// let d = Detail::default();
    /// d.record(b"a:1", DetailOp::Set); // off: not recorded
    /// d.command(Some(b"on"), &mut Vec::new());
    /// d.record(b"nokey", DetailOp::Set); // no prefix: not recorded
    /// d.record(b"a:2", DetailOp::Set);
    /// let mut out = Vec::new();
    /// d.dump(&mut out);
    /// assert_eq!(out, b"PREFIX a get 0 hit 0 set 1 del 0\r\n");
    /// ```
    pub fn record(&self, key: &[u8], op: DetailOp) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let Some(at) = key.iter().position(|&b| b == self.delimiter) else {
            return;
        };
        let mut map = self.prefixes.lock();
        let c = map.entry(key[..at].to_vec()).or_default();
        match op {
            DetailOp::Get(hit) => {
                c[0] += 1;
                c[1] += u64::from(hit);
            }
            DetailOp::Set => c[2] += 1,
            DetailOp::Delete => c[3] += 1,
        }
    }

    /// Whether recording is on.
    ///
    /// ```
    /// use corewise_kv::admin::Detail;
    /// let d = Detail::default();
    /// assert!(!d.enabled());
    /// d.command(Some(b"on"), &mut Vec::new());
    /// assert!(d.enabled());
    /// ```
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Forgets every prefix (`stats reset`).
    ///
    /// ```
    /// use corewise_kv::admin::{Detail, DetailOp};
    /// let d = Detail::default();
    /// d.command(Some(b"on"), &mut Vec::new());
    /// d.record(b"a:1", DetailOp::Set);
    /// d.clear();
    /// let mut out = Vec::new();
    /// d.dump(&mut out);
    /// assert!(out.is_empty());
    /// assert!(d.enabled()); // still recording
    /// ```
    pub fn clear(&self) {
        self.prefixes.lock().clear();
    }

    /// `stats detail <arg>`: `on`, `off` or `dump` (memcached's lines);
    /// a usage error otherwise.
    ///
    /// ```
    /// use corewise_kv::admin::Detail;
    /// let d = Detail::default();
    /// let mut out = Vec::new();
    /// d.command(Some(b"on"), &mut out);
    /// d.command(Some(b"dump"), &mut out);
    /// d.command(Some(b"maybe"), &mut out);
    /// assert_eq!(out, b"OK\r\nEND\r\nCLIENT_ERROR usage: stats detail on|off|dump\r\n");
    /// ```
    pub fn command(&self, arg: Option<&[u8]>, out: &mut Vec<u8>) {
        match arg {
            Some(b"on") => {
                self.enabled.store(true, Ordering::Relaxed);
                out.extend_from_slice(b"OK\r\n");
            }
            Some(b"off") => {
                self.enabled.store(false, Ordering::Relaxed);
                out.extend_from_slice(b"OK\r\n");
            }
            Some(b"dump") => {
                self.dump(out);
                out.extend_from_slice(b"END\r\n");
            }
            _ => out.extend_from_slice(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
        }
    }

    /// The `PREFIX` lines, by prefix.
    ///
    /// ```
    /// use corewise_kv::admin::{Detail, DetailOp};
    /// let d = Detail::default();
    /// d.command(Some(b"on"), &mut Vec::new());
    /// d.record(b"b:x", DetailOp::Get(true));
    /// d.record(b"a:x", DetailOp::Set);
    /// let mut out = Vec::new();
    /// d.dump(&mut out);
    /// // One line per prefix, in order.
    /// assert_eq!(out, b"PREFIX a get 0 hit 0 set 1 del 0\r\nPREFIX b get 1 hit 1 set 0 del 0\r\n");
    /// ```
    pub fn dump(&self, out: &mut Vec<u8>) {
        for (p, c) in self.prefixes.lock().iter() {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(p);
            let _ = write!(
                out,
                " get {} hit {} set {} del {}\r\n",
                c[0], c[1], c[2], c[3]
            );
        }
    }
}

/// Runs an operator command (`cmd` with the rest of its line `args`),
/// appending memcached's reply.
///
/// ```
/// use corewise_kv::{admin::execute, config::Config, exec::Shared};
/// let shared = Shared::new(Config::default());
/// let mut out = Vec::new();
/// execute(&shared, b"slabs", b"automove 1", &mut out);
/// execute(&shared, b"shutdown", b"", &mut out);
/// assert_eq!(out, b"OK\r\nERROR: shutdown not enabled\r\n");
/// ```
pub fn execute(shared: &Shared, cmd: &[u8], args: &[u8], out: &mut Vec<u8>) -> Flow {
    let t: Vec<&[u8]> = args
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    // memcached's `lru`, `extstore`, `watch` and `slabs automove` take a
    // last `noreply` (its `set_noreply_maybe`), which silences whatever
    // they answer, errors too; a `watch` then starts nothing, since
    // `noreply` is no watch flag. The others count their arguments exactly,
    // so a `noreply` there is one too many: `ERROR`.
    let silenced = t.last() == Some(&&b"noreply"[..])
        && match cmd {
            b"lru" | b"extstore" | b"watch" => true,
            b"slabs" => t.len() >= 2 && t[0] == b"automove",
            _ => false,
        };
    if silenced {
        if cmd != b"watch" {
            let mut discard = Vec::new();
            let _ = execute_loud(shared, cmd, &t, args, &mut discard);
        }
        return Flow::Continue;
    }
    execute_loud(shared, cmd, &t, args, out)
}

/// [`execute`] with its answer (`t`: the arguments as tokens).
fn execute_loud(shared: &Shared, cmd: &[u8], t: &[&[u8]], args: &[u8], out: &mut Vec<u8>) -> Flow {
    let reply: &[u8] = match cmd {
        b"shutdown" => {
            if !shared.config.enable_shutdown {
                b"ERROR: shutdown not enabled"
            } else if matches!(t, [] | [b"graceful"]) {
                // Nothing is lost by exiting at once: the cache is memory.
                std::process::exit(0);
            } else {
                b"CLIENT_ERROR invalid shutdown mode"
            }
        }
        b"lru_crawler" => return lru_crawler(shared, t, out),
        b"watch" if !shared.config.watch_enabled => b"CLIENT_ERROR watch commands not allowed",
        b"watch" => match crate::watch::mask_of(args) {
            // The server answers OK once it knows nothing follows.
            Some(mask) => return Flow::Watch(mask),
            None => b"ERROR",
        },
        b"slabs" => slabs_command(shared, t),
        b"lru" => lru(t),
        // No external storage here: as memcached without it configured.
        _ => b"ERROR",
    };
    out.extend_from_slice(reply);
    out.extend_from_slice(b"\r\n");
    Flow::Continue
}

/// A token as a number of type `T` (`None` when it is not one).
pub(crate) fn parse<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A number as memcached's `safe_strtoul` reads one into 32 bits: any
/// unsigned 64-bit number, cut to its low 32 bits (`4294967301` is 5); no
/// sign, nothing past 64 bits.
fn strtoul32(t: &[u8]) -> Option<u32> {
    parse::<u64>(t).map(|n| n as u32)
}

/// `slabs automove <0|1|2>`, `slabs automove ratio <r>`, `slabs reassign
/// <src> <dst>` (exactly two arguments, as memcached counts them). Pages
/// are a view here ([`slabs`]), so nothing moves: a reassignment memcached
/// would make (the source, or with -1 some class, has a spare page) is
/// acknowledged, the others get its refusals.
fn slabs_command(shared: &Shared, t: &[&[u8]]) -> &'static [u8] {
    match t {
        // The ratio of free to used memory that automove aims for; memcached
        // reads it with `strtod`. Nothing moves here, so it is only checked.
        [b"automove", b"ratio", r, ..] if parse::<f64>(r).is_some() => b"OK",
        [b"automove", b"ratio", ..] => b"ERROR",
        [b"automove", level, ..] => match parse::<u32>(level) {
            Some(l @ 0..=2) => {
                shared.slab_automove.store(u64::from(l), Ordering::Relaxed);
                b"OK"
            }
            Some(_) => b"ERROR",
            None => b"CLIENT_ERROR bad command line format",
        },
        [b"reassign", src, dst] => {
            let (Some(src), Some(dst)) = (parse::<i64>(src), parse::<i64>(dst)) else {
                return b"CLIENT_ERROR bad command line format";
            };
            let largest = slabs::chunk_sizes().len() as i64;
            let classes = shared.store.class_stats();
            let spare = |id: usize| classes.get(id).is_some_and(|c| c.pages(id) >= 2);
            if src == dst {
                b"SAME src and dst class are identical"
            } else if !(-1..=largest).contains(&src) || !(0..=largest).contains(&dst) {
                b"BADCLASS invalid src or dst class id"
            } else if src == -1 {
                if (1..classes.len()).any(|id| id as i64 != dst && spare(id)) {
                    b"OK"
                } else {
                    b"BADCLASS invalid src or dst class id"
                }
            } else if spare(src as usize) {
                b"OK"
            } else {
                b"NOSPARE source class has no spare pages"
            }
        }
        _ => b"ERROR",
    }
}

/// `lru tune|mode|temp_ttl ...`: checked as memcached checks them.
fn lru(t: &[&[u8]]) -> &'static [u8] {
    match t {
        [b"tune", hot, warm, hot_f, warm_f, ..] => {
            match (
                parse::<u32>(hot),
                parse::<u32>(warm),
                parse::<f64>(hot_f),
                parse::<f64>(warm_f),
            ) {
                (Some(h), Some(w), Some(_), Some(_)) if u64::from(h) + u64::from(w) > 80 => {
                    b"ERROR hot and warm pcts must not exceed 80"
                }
                (Some(_), Some(_), Some(_), Some(_)) => b"OK",
                _ => b"ERROR",
            }
        }
        [b"mode", b"flat" | b"segmented", ..] => b"OK",
        [b"temp_ttl", ttl, ..] if parse::<i32>(ttl).is_some() => b"OK",
        _ => b"ERROR",
    }
}

/// The classes an `lru_crawler` argument names: `all`, or ids separated
/// by commas; `None` for a bad one.
fn classes(arg: &[u8]) -> Option<Vec<usize>> {
    if arg == b"all" {
        return Some((1..=slabs::MAX_CLASSES).collect());
    }
    arg.split(|&b| b == b',')
        .map(|id| parse::<usize>(id).filter(|id| (1..=slabs::MAX_CLASSES).contains(id)))
        .collect()
}

fn lru_crawler(shared: &Shared, t: &[&[u8]], out: &mut Vec<u8>) -> Flow {
    let enabled = &shared.crawler_enabled;
    let on = enabled.load(Ordering::Relaxed);
    // Every subcommand takes exactly its arguments, as memcached counts
    // them (more: `ERROR`).
    let reply: &[u8] = match t {
        [b"enable"] if on => b"ERROR failed to start lru crawler thread",
        [b"enable"] => {
            enabled.store(true, Ordering::Relaxed);
            b"OK"
        }
        [b"disable"] => {
            enabled.store(false, Ordering::Relaxed);
            b"OK"
        }
        [b"sleep", n] => match strtoul32(n) {
            Some(us) if us > 1_000_000 => b"CLIENT_ERROR sleep must be one second or less",
            Some(us) => {
                shared.crawler_sleep.store(u64::from(us), Ordering::Relaxed);
                b"OK"
            }
            None => b"CLIENT_ERROR bad command line format",
        },
        [b"tocrawl", n] => match strtoul32(n) {
            Some(n) => {
                shared
                    .crawler_tocrawl
                    .store(u64::from(n), Ordering::Relaxed);
                b"OK"
            }
            None => b"CLIENT_ERROR bad command line format",
        },
        [b"crawl" | b"metadump", _] if !on => b"CLIENT_ERROR lru crawler disabled",
        [b"metadump", _] if !shared.config.dump_enabled => b"ERROR metadump not allowed",
        [b"crawl", arg] => match classes(arg) {
            Some(_) => {
                shared.store.crawl();
                b"OK"
            }
            None => b"BADCLASS invalid class id",
        },
        [b"metadump", b"hash"] => {
            metadump(shared, None, out);
            return Flow::Continue;
        }
        [b"metadump", arg] => match classes(arg) {
            Some(ids) => {
                metadump(shared, Some(&ids), out);
                return Flow::Continue;
            }
            None => b"BADCLASS invalid class id",
        },
        _ => b"ERROR",
    };
    out.extend_from_slice(reply);
    out.extend_from_slice(b"\r\n");
    Flow::Continue
}

/// One line per live item of the named classes (all for `None`), in
/// memcached's format: the key URI-encoded, expiry and last access as unix
/// times, then `END`.
fn metadump(shared: &Shared, ids: Option<&[usize]>, out: &mut Vec<u8>) {
    let store = &shared.store;
    let clock = store.clock();
    let unix = |t: u32| clock.start_unix() + i64::from(t) - 1;
    store.for_each_item(|it| {
        let cls = it.class();
        if ids.is_some_and(|ids| !ids.contains(&cls)) {
            return;
        }
        out.extend_from_slice(b"key=");
        for &b in it.key.iter() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b);
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
        let exp = if it.exptime == 0 {
            -1
        } else {
            unix(it.exptime)
        };
        let _ = writeln!(
            out,
            " exp={exp} la={} cas={} fetch={} cls={cls} size={}",
            unix(it.last_access),
            store.shown_cas(it.cas),
            if it.fetched { "yes" } else { "no" },
            it.ntotal()
        );
    });
    out.extend_from_slice(b"END\r\n");
}

#[cfg(test)]
mod tests {
    use super::strtoul32;

    #[test]
    fn numbers_are_read_as_memcached_reads_them_into_32_bits() {
        assert_eq!(strtoul32(b"4294967301"), Some(5));
        assert_eq!(strtoul32(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(strtoul32(b"18446744073709551616"), None);
        assert_eq!(strtoul32(b"-1"), None);
        assert_eq!(strtoul32(b"100"), Some(100));
    }
}
