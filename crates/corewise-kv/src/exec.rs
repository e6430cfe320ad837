//! Runs one request against the store and writes memcached's reply.
//!
//! Why a module of its own: the same code serves both server modes and the
//! in-process tests, and the reply formats (classic and meta) are the part
//! that real clients check byte for byte, so they live in one place next to
//! each other. Replies are appended to the connection's output (a
//! [`Sink`]: the server's [`crate::reply::Reply`] keeps values of
//! [`crate::reply::REF_MIN`] bytes or more by reference instead of copying
//! them); the server writes that output once per batch of pipelined
//! requests.

use crate::admin::{Detail, DetailOp};
use crate::config::Config;
use crate::protocol::{
    decode_base64, GetKind, MetaCmd, MetaFlags, MetaMode, ProtoError, Request, StoreCmd,
};
use crate::reply::Sink;
use crate::store::{
    exptime_at, slabs, ArithOutcome, Deadline, DeleteOutcome, MetaStore, SetMode, Store,
    StoreOutcome,
};
use crate::watch;
use corewise::sync::SpinLock;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The version string `version` and `stats` report.
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
/// use corewise_kv::{config::Config, exec::{Shared, VERSION}};
/// let shared = Shared::new(Config::default());
/// assert_eq!(run(&shared, b"version\r\n"), format!("VERSION {VERSION}\r\n"));
/// assert!(VERSION.starts_with("1.6.")); // clients check for memcached 1.6
/// ```
pub const VERSION: &str = concat!("1.6.0-corewise-kv-", env!("CARGO_PKG_VERSION"));

/// Connection counters (memcached's `stats` names).
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
/// use std::sync::atomic::Ordering::Relaxed;
/// let shared = Shared::new(Config::default());
/// // The server counts connections as it accepts and closes them.
/// shared.conns.curr_connections.fetch_add(2, Relaxed);
/// shared.conns.total_connections.fetch_add(5, Relaxed);
/// let stats = run(&shared, b"stats\r\n");
/// assert!(stats.contains("STAT curr_connections 2\r\n"));
/// assert!(stats.contains("STAT total_connections 5\r\n"));
/// ```
#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Open connections.
    pub curr_connections: AtomicU64,
    /// Connections since start, as memcached counts them: the listening
    /// socket (counted when the server starts serving) and each accepted
    /// connection within `-c` (not those refused).
    pub total_connections: AtomicU64,
    /// The most client connections open at once since start (not reset by
    /// `stats reset`): `connection_structures` is this plus the listener,
    /// as memcached's count of the connection structures it has made
    /// (one per descriptor ever used, the lowest reused first).
    pub peak_connections: AtomicU64,
    /// Connections refused for `-c`.
    pub rejected_connections: AtomicU64,
    /// Bytes read from clients.
    pub bytes_read: AtomicU64,
    /// Bytes written to clients.
    pub bytes_written: AtomicU64,
    /// Times a connection let the others run after `-R` requests from
    /// one read with more requests waiting (memcached's `conn_yields`).
    pub conn_yields: AtomicU64,
    /// Connections closed for `-o idle_timeout` (memcached's
    /// `idle_kicks`).
    pub idle_kicks: AtomicU64,
}

/// What `stats conns` shows of one open connection.
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
/// use std::sync::atomic::Ordering::Relaxed;
/// let shared = Shared::new(Config::default());
/// let info = shared.conn_table.open(9, "tcp:127.0.0.1:40000".into(), shared.store.clock().now());
/// assert_eq!(info.peer, "tcp:127.0.0.1:40000");
/// assert!(run(&shared, b"stats conns\r\n").contains("STAT 9:state conn_new_cmd\r\n"));
/// info.busy.store(true, Relaxed); // running its requests
/// assert!(run(&shared, b"stats conns\r\n").contains("STAT 9:state conn_parse_cmd\r\n"));
/// ```
#[derive(Debug)]
pub struct ConnInfo {
    /// The client's address as `stats conns` shows it (`tcp:host:port`).
    pub peer: String,
    /// Server second of its last request (or of its accept).
    pub last_cmd: AtomicU32,
    /// It has sent something.
    pub spoke: AtomicBool,
    /// It is running requests now.
    pub busy: AtomicBool,
    /// It streams a `watch` log (never idle: `-o idle_timeout` spares it).
    pub watching: AtomicBool,
    /// Shut down for `-o idle_timeout`; its thread is closing it.
    pub kicked: AtomicBool,
    /// It has sent a request's head and the rest (a value) is on its way:
    /// `-o idle_timeout` spares it, as memcached spares a connection
    /// reading a value.
    pub mid_request: AtomicBool,
}

/// The open connections by file descriptor, and the listener, for
/// `stats conns`.
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
/// let table = &shared.conn_table;
/// table.set_listener(3, "tcp:127.0.0.1:11211".into());
/// let _info = table.open(8, "tcp:127.0.0.1:50000".into(), shared.store.clock().now());
/// let conns = run(&shared, b"stats conns\r\n");
/// assert!(conns.contains("STAT 3:state conn_listening\r\n"));
/// assert!(conns.contains("STAT 8:addr tcp:127.0.0.1:50000\r\n"));
/// ```
#[derive(Debug)]
pub struct ConnTable {
    conns: SpinLock<BTreeMap<i32, Arc<ConnInfo>>>,
    listener: SpinLock<Option<(i32, String)>>,
}

impl Default for ConnTable {
    fn default() -> Self {
        Self {
            conns: SpinLock::new(BTreeMap::new()),
            listener: SpinLock::new(None),
        }
    }
}

impl ConnTable {
    /// Records the listening socket, with its address as `stats conns`
    /// shows it (`tcp:host:port` or `unix:path`).
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
    /// shared.conn_table.set_listener(4, "tcp:0.0.0.0:11211".into());
    /// assert!(run(&shared, b"stats conns\r\n").contains("STAT 4:addr tcp:0.0.0.0:11211\r\n"));
    /// ```
    pub fn set_listener(&self, fd: i32, addr: String) {
        *self.listener.lock() = Some((fd, addr));
    }

    /// Records an accepted connection; its entry is updated through the
    /// returned handle.
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
    /// use std::sync::atomic::Ordering::Relaxed;
    /// let shared = Shared::new(Config::default());
    /// let info = shared.conn_table.open(6, "tcp:127.0.0.1:1234".into(), shared.store.clock().now());
    /// info.spoke.store(true, Relaxed);
    /// assert!(run(&shared, b"stats conns\r\n").contains("STAT 6:state conn_read\r\n"));
    /// ```
    pub fn open(&self, fd: i32, peer: String, now: u32) -> Arc<ConnInfo> {
        let info = Arc::new(ConnInfo {
            peer,
            last_cmd: AtomicU32::new(now),
            spoke: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            watching: AtomicBool::new(false),
            kicked: AtomicBool::new(false),
            mid_request: AtomicBool::new(false),
        });
        self.conns.lock().insert(fd, Arc::clone(&info));
        info
    }

    /// Forgets a closed connection.
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
    /// let _info = shared.conn_table.open(6, "tcp:127.0.0.1:1234".into(), shared.store.clock().now());
    /// shared.conn_table.close(6);
    /// assert!(!run(&shared, b"stats conns\r\n").contains("STAT 6:"));
    /// ```
    pub fn close(&self, fd: i32) {
        self.conns.lock().remove(&fd);
    }

    /// Shuts down the connections idle for more than `timeout` seconds at
    /// server second `now` (`-o idle_timeout`), as memcached closes them:
    /// not one running requests, streaming a `watch` log or midway through
    /// a request (see [`ConnInfo::mid_request`]). Each socket
    /// is shut down under the table's lock while its connection still
    /// owns the descriptor (a connection leaves the table before it closes
    /// its socket), so a descriptor reused since cannot be hit; the
    /// connection's thread then reads the end and closes. Returns how
    /// many it shut down.
    ///
    /// ```
    /// use corewise_kv::{config::Config, exec::Shared};
    /// use std::sync::atomic::Ordering::Relaxed;
    /// let shared = Shared::new(Config::default());
    /// let (mut client, server) = std::os::unix::net::UnixStream::pair()?;
    /// use std::os::fd::AsRawFd;
    /// let info = shared.conn_table.open(server.as_raw_fd(), "tcp:127.0.0.1:1".into(), 100);
    /// assert_eq!(shared.conn_table.kick_idle(102, 2), 0); // idle 2 s: not more than 2
    /// assert_eq!(shared.conn_table.kick_idle(103, 2), 1);
    /// assert!(info.kicked.load(Relaxed));
    /// assert_eq!(shared.conn_table.kick_idle(110, 2), 0); // once
    /// use std::io::Read;
    /// assert_eq!(client.read(&mut [0u8; 8])?, 0); // the client sees the end
    /// shared.conn_table.close(server.as_raw_fd());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kick_idle(&self, now: u32, timeout: u32) -> u64 {
        let conns = self.conns.lock();
        let mut kicked = 0;
        for (&fd, c) in conns.iter() {
            let idle = now.saturating_sub(c.last_cmd.load(Ordering::Relaxed));
            if idle <= timeout
                || c.busy.load(Ordering::Relaxed)
                || c.watching.load(Ordering::Relaxed)
                || c.mid_request.load(Ordering::Relaxed)
                || c.kicked.swap(true, Ordering::Relaxed)
            {
                continue;
            }
            // SAFETY: `fd` is open: its connection takes it out of this
            // table, under the lock held here, before closing it.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            kicked += 1;
        }
        kicked
    }

    /// `stats conns`: the listener, then every connection by descriptor,
    /// with memcached's fields and state names.
    fn write(&self, now: u32, uptime: u64, out: &mut Vec<u8>) {
        let listen = self.listener.lock().clone();
        if let Some((fd, addr)) = &listen {
            stat(out, &format!("{fd}:addr"), addr);
            stat(out, &format!("{fd}:state"), "conn_listening");
            stat(out, &format!("{fd}:secs_since_last_cmd"), uptime);
        }
        let conns: Vec<(i32, Arc<ConnInfo>)> = self
            .conns
            .lock()
            .iter()
            .map(|(fd, c)| (*fd, Arc::clone(c)))
            .collect();
        for (fd, c) in conns {
            stat(out, &format!("{fd}:addr"), &c.peer);
            if let Some((_, addr)) = &listen {
                stat(out, &format!("{fd}:listen_addr"), addr);
            }
            let state = if c.watching.load(Ordering::Relaxed) {
                "conn_watch"
            } else if c.busy.load(Ordering::Relaxed) {
                "conn_parse_cmd"
            } else if c.spoke.load(Ordering::Relaxed) {
                "conn_read"
            } else {
                "conn_new_cmd"
            };
            stat(out, &format!("{fd}:state"), state);
            let idle = now.saturating_sub(c.last_cmd.load(Ordering::Relaxed));
            stat(out, &format!("{fd}:secs_since_last_cmd"), idle);
        }
    }
}

/// Everything a request may need: the store, the settings, the counters.
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
/// use corewise_kv::store::{Deadline, SetMode};
/// let shared = Shared::new(Config::default());
/// // Requests and direct calls see the same store.
/// shared.store.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
/// assert_eq!(run(&shared, b"get k\r\n"), "VALUE k 0 1\r\nv\r\nEND\r\n");
/// ```
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
    /// The LRU crawler is on (`lru_crawler enable|disable`).
    pub crawler_enabled: AtomicBool,
    /// The level `slabs automove` last set (memcached's default is 1;
    /// reported in `stats settings`, nothing here moves pages).
    pub slab_automove: AtomicU64,
    /// The LRU crawler's pause between items (µs) and items per class per
    /// crawl, as `lru_crawler sleep|tocrawl` last set them (reported in
    /// `stats settings`; a crawl here is one pass under each shard's lock).
    pub crawler_sleep: AtomicU64,
    /// See [`crawler_sleep`](Self::crawler_sleep).
    pub crawler_tocrawl: AtomicU64,
    /// `stats detail` prefix statistics.
    pub detail: Detail,
    /// `stats sizes` lists the item size histogram (`stats sizes_enable`;
    /// off by default, as in memcached).
    pub sizes_enabled: AtomicBool,
    /// Open connections, for `stats conns`.
    pub conn_table: ConnTable,
    started: Instant,
}

impl Shared {
    /// Shared state for a server with this configuration.
    ///
    /// ```
    /// use corewise_kv::{config::Config, exec::Shared};
    /// let shared = Shared::new(Config { memory_mb: 8, item_max: 4096, ..Config::default() });
    /// assert_eq!(shared.store.limit(), 8 << 20);
    /// assert_eq!(shared.config.item_max, 4096);
    /// ```
    pub fn new(config: Config) -> Self {
        let limit = config.memory_mb.saturating_mul(1024 * 1024);
        let store = Store::new(limit, Store::shards_for(limit, config.item_max));
        store.set_item_max(config.item_max);
        store.set_evictions(!config.no_evictions);
        store.set_cas_enabled(config.cas_enabled);
        let verbose = u64::from(config.verbose);
        let (crawler, sizes) = (config.lru_crawler, config.track_sizes);
        let detail = Detail::new(config.prefix_delimiter, config.detail_on_start);
        Self {
            store,
            config,
            conns: ConnCounters::default(),
            verbosity: AtomicU64::new(verbose),
            crawler_enabled: AtomicBool::new(crawler),
            slab_automove: AtomicU64::new(1),
            crawler_sleep: AtomicU64::new(100),
            crawler_tocrawl: AtomicU64::new(0),
            detail,
            sizes_enabled: AtomicBool::new(sizes),
            conn_table: ConnTable::default(),
            started: Instant::now(),
        }
    }
}

/// What the connection does after a request.
///
/// ```
/// use corewise_kv::{config::Config, exec::{execute, Flow, Shared}, watch::MUTATIONS};
/// use corewise_kv::protocol::{Decoded, Decoder, Limits};
/// let shared = Shared::new(Config::default());
/// let mut d = Decoder::new(Limits::default());
/// let mut flow = |req: &[u8]| {
///     let (_, Decoded::Request(r)) = d.decode(req) else { panic!() };
///     execute(&shared, &r, &mut Vec::new(), &mut Vec::new())
/// };
/// assert_eq!(flow(b"version\r\n"), Flow::Continue);
/// assert_eq!(flow(b"watch mutations\r\n"), Flow::Watch(MUTATIONS));
/// assert_eq!(flow(b"quit\r\n"), Flow::Close);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on reading.
    Continue,
    /// Close the connection (`quit`).
    Close,
    /// Become a `watch` log stream of these event classes (see
    /// [`crate::watch`]), if the request was the last one buffered.
    Watch(u8),
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
pub fn execute<O: Sink>(
    shared: &Shared,
    req: &Request<'_>,
    out: &mut O,
    scratch: &mut Vec<u8>,
) -> Flow {
    execute_spilling(shared, req, out, scratch, &mut |_| Ok(()))
}

/// Unsent reply bytes (referenced values included, see
/// [`crate::reply`]) above which a multi-key `get` hands its output to
/// `spill` before looking up the next key.
///
/// ```
/// use corewise_kv::{config::Config, exec::{execute_spilling, Shared, SPILL_AT}};
/// use corewise_kv::protocol::{Decoded, Decoder, Limits};
/// use corewise_kv::store::{Deadline, SetMode};
/// let shared = Shared::new(Config::default());
/// let value = vec![b'x'; SPILL_AT / 2 + 1];
/// for k in [&b"a"[..], b"b", b"c"] {
///     shared.store.store(SetMode::Set, k, 0, Deadline::Never, &value, None);
/// }
/// let (_, Decoded::Request(r)) = Decoder::new(Limits::default()).decode(b"get a b c\r\n") else { panic!() };
/// let (mut out, mut spills) = (Vec::new(), 0);
/// let mut spill = |o: &mut Vec<u8>| { spills += 1; o.clear(); Ok(()) };
/// execute_spilling(&shared, &r, &mut out, &mut Vec::new(), &mut spill);
/// // Past SPILL_AT after the second value: sent before the third is looked up.
/// assert_eq!(spills, 1);
/// ```
pub const SPILL_AT: usize = 256 * 1024;

/// [`execute`], bounding the output of a multi-key retrieval: whenever
/// `out` holds more than [`SPILL_AT`] bytes between two keys (copied or
/// referenced, [`Sink::pending`]), `spill` is called to send them (and
/// empty `out`), so one request naming many large values never holds more
/// than one value plus [`SPILL_AT`] of reply, nor references to more.
/// A `spill` error closes the connection.
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
pub fn execute_spilling<O: Sink>(
    shared: &Shared,
    req: &Request<'_>,
    out: &mut O,
    scratch: &mut Vec<u8>,
    spill: &mut dyn FnMut(&mut O) -> std::io::Result<()>,
) -> Flow {
    execute_conn(shared, req, out, scratch, spill, -1)
}

/// [`execute_spilling`] for the connection on descriptor `cfd` (named in
/// the `watch` log; -1 for none).
///
/// ```
/// use corewise_kv::{config::Config, exec::{execute_conn, Shared}, watch::FETCHERS};
/// use corewise_kv::protocol::{Decoded, Decoder, Limits};
/// let shared = Shared::new(Config::default());
/// let w = shared.store.watch.subscribe(FETCHERS);
/// let (_, Decoded::Request(r)) = Decoder::new(Limits::default()).decode(b"get k\r\n") else { panic!() };
/// let mut out = Vec::new();
/// execute_conn(&shared, &r, &mut out, &mut Vec::new(), &mut |_| Ok(()), 42);
/// assert_eq!(out, b"END\r\n");
/// // The `watch` log names the connection's descriptor.
/// assert!(w.drain()[0].contains("cfd=42"));
/// ```
pub fn execute_conn<O: Sink>(
    shared: &Shared,
    req: &Request<'_>,
    out: &mut O,
    scratch: &mut Vec<u8>,
    spill: &mut dyn FnMut(&mut O) -> std::io::Result<()>,
    cfd: i32,
) -> Flow {
    let store = &shared.store;
    // The retrievals write values (copied or referenced, as `out` does);
    // everything else writes bytes only.
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
                let mut seen = None;
                let hit = store.get(key, touch, |it, _| {
                    seen = Some((it.class(), it.value.len()));
                    let head = out.bytes();
                    head.extend_from_slice(b"VALUE ");
                    head.extend_from_slice(key);
                    head.push(b' ');
                    num(head, u64::from(it.flags));
                    head.push(b' ');
                    num(head, it.value.len() as u64);
                    if with_cas {
                        head.push(b' ');
                        num(head, store.shown_cas(it.cas));
                    }
                    head.extend_from_slice(b"\r\n");
                    out.value(&it.value);
                    out.bytes().extend_from_slice(b"\r\n");
                });
                shared.detail.record(key, DetailOp::Get(hit));
                log_get(shared, key, seen, cfd);
                if out.pending() > SPILL_AT && spill(out).is_err() {
                    return Flow::Close;
                }
            }
            out.bytes().extend_from_slice(b"END\r\n");
            return Flow::Continue;
        }
        Request::MetaGet { key, flags } => {
            if let Some(k) = meta_key(key, flags.base64, scratch, out.bytes(), MetaCmd::Get) {
                let seen = meta_get(shared, key, k, &flags, out);
                log_get(shared, k, seen, cfd);
            }
            return Flow::Continue;
        }
        _ => {}
    }
    let out = out.bytes();
    match *req {
        // Answered above.
        Request::Get { .. } | Request::MetaGet { .. } => {}
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
            shared.detail.record(key, DetailOp::Set);
            let deadline = store.clock().deadline(exptime);
            let r = store.store(mode, key, flags, deadline, data, compare);
            let name = match cmd {
                StoreCmd::Set => "set",
                StoreCmd::Add => "add",
                StoreCmd::Replace => "replace",
                StoreCmd::Append => "append",
                StoreCmd::Prepend => "prepend",
                StoreCmd::Cas => "cas",
            };
            log_store(shared, key, r, name, deadline, (flags, data.len()), cfd);
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
            shared.detail.record(key, DetailOp::Delete);
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
            // Under `-F` a flush is counted and refused, whatever its
            // delay, as memcached does.
            let reply: &[u8] = match delay {
                _ if !shared.config.flush_enabled => {
                    store.ops.cmd_flush.fetch_add(1, Ordering::Relaxed);
                    b"CLIENT_ERROR flush_all not allowed"
                }
                Some(delay) => {
                    store.flush(delay);
                    b"OK"
                }
                None => b"CLIENT_ERROR invalid exptime argument",
            };
            if !noreply {
                line(out, reply);
            }
        }
        Request::Stats { group } => stats(shared, group, out),
        Request::Admin { cmd, args } => return crate::admin::execute(shared, cmd, args, out),
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
        Request::TooLarge {
            key,
            noreply,
            base64,
            remove_old,
        } => {
            if let Some(k) = meta_key(key, base64, scratch, out, MetaCmd::Set) {
                if remove_old {
                    store.remove(k);
                }
                store.ops.store_too_large.fetch_add(1, Ordering::Relaxed);
                if !noreply {
                    write_error(ProtoError::TooLarge, out);
                }
            }
        }
        Request::MetaNoop => line(out, b"MN"),
        Request::MetaSet { key, data, flags } => {
            if let Some(k) = meta_key(key, flags.base64, scratch, out, MetaCmd::Set) {
                meta_set(shared, key, k, data, &flags, out, cfd);
            }
        }
        Request::MetaDelete { key, flags } => {
            if let Some(k) = meta_key(key, flags.base64, scratch, out, MetaCmd::Delete) {
                let r = if flags.remove_value {
                    // `x` (newer than memcached 1.6.18, which refuses it)
                    // empties the value and keeps the item, as memcached
                    // does since: client flags from `F` (else 0), the TTL
                    // from `T` (else none), the CAS kept (or `E`'s); with
                    // `I` the emptied item is also marked stale.
                    let ttl = flags
                        .ttl
                        .map_or(Deadline::Never, |t| store.clock().deadline(t));
                    let meta = MetaStore {
                        new_cas: flags.new_cas,
                        invalidate: flags.invalidate,
                    };
                    let client_flags = flags.client_flags.unwrap_or(0);
                    store.clear_value(k, flags.compare_cas, client_flags, ttl, meta)
                } else if flags.invalidate {
                    let ttl = flags.ttl.map(|t| store.clock().deadline(t));
                    store.invalidate(k, flags.compare_cas, ttl)
                } else {
                    let r = store.delete(k, flags.compare_cas);
                    if r == DeleteOutcome::Exists {
                        // memcached counts an `md` whose compare failed as
                        // a miss (a binary delete's, not).
                        store.ops.delete_misses.fetch_add(1, Ordering::Relaxed);
                    }
                    r
                };
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
            if let Some(k) = meta_key(key, flags.base64, scratch, out, MetaCmd::Arith) {
                meta_arith(shared, key, k, &flags, out);
            }
        }
        Request::MetaDebug { key, flags } => {
            store.ops.cmd_meta.fetch_add(1, Ordering::Relaxed);
            // memcached answers a base64 key that does not decode as a bad
            // command line.
            let k = if flags.base64 {
                match decode_base64(key, scratch) {
                    Some(()) if !scratch.is_empty() => Some(&scratch[..]),
                    _ => {
                        write_error(ProtoError::BadFormat, out);
                        None
                    }
                }
            } else {
                Some(key)
            };
            if let Some(k) = k {
                match store.inspect(k) {
                    Some((ttl, la, cas, fetched, size)) => {
                        // The item is named by its key as the request gave
                        // it: base64 with `b`, for a decoded key may hold
                        // spaces, CR LF or NUL that would break the line,
                        // and the text key otherwise. memcached 1.6.18
                        // names an item stored by `ms ... b` in base64 and
                        // any other by its plain key, so the two differ
                        // only when a key is asked for in the other form
                        // than it was stored in.
                        out.extend_from_slice(b"ME ");
                        out.extend_from_slice(key);
                        out.extend_from_slice(b" exp=");
                        inum(out, ttl);
                        out.extend_from_slice(b" la=");
                        num(out, u64::from(la));
                        out.extend_from_slice(b" cas=");
                        num(out, cas);
                        out.extend_from_slice(if fetched { b" fetch=yes" } else { b" fetch=no" });
                        out.extend_from_slice(b" cls=");
                        num(out, slabs::class_of(size) as u64);
                        out.extend_from_slice(b" size=");
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

/// The binary key of a meta request `cmd` (base64-decoded with `b`);
/// writes the error and returns `None` when it does not decode. memcached
/// words it per command: `mg` and `ms` say "error decoding key", `md` and
/// `ma` (which decode the key with their other flags) "invalid or
/// duplicate flag".
fn meta_key<'k>(
    key: &'k [u8],
    base64: bool,
    scratch: &'k mut Vec<u8>,
    out: &mut Vec<u8>,
    cmd: MetaCmd,
) -> Option<&'k [u8]> {
    if !base64 {
        return Some(key);
    }
    match decode_base64(key, scratch) {
        Some(()) if !scratch.is_empty() && scratch.len() <= crate::protocol::KEY_MAX => {
            Some(scratch)
        }
        _ => {
            write_error(
                match cmd {
                    MetaCmd::Get | MetaCmd::Set => ProtoError::BadKeyEncoding,
                    MetaCmd::Delete | MetaCmd::Arith => ProtoError::InvalidOrDuplicateFlag,
                },
                out,
            );
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
            (b'O' | b'k', _) => echo(c, key, flags, out),
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

/// `mg`; the item's class and value size when it was found (or created).
fn meta_get(
    shared: &Shared,
    wire_key: &[u8],
    key: &[u8],
    flags: &MetaFlags<'_>,
    out: &mut impl Sink,
) -> Option<(usize, usize)> {
    let store = &shared.store;
    let clock = store.clock();
    let mut seen = None;
    let (vivify, touch) = (flags.vivify.is_some(), flags.ttl.is_some());
    let hit = store.meta_get(key, vivify, !flags.no_bump, touch, |it, view| {
        seen = Some((it.class(), it.value.len()));
        // Written straight into the reply: no buffer of its own per hit.
        let head = out.bytes();
        if flags.value {
            head.extend_from_slice(b"VA ");
            num(head, it.value.len() as u64);
        } else {
            head.extend_from_slice(b"HD");
        }
        // memcached walks the flags in request order: a `t` before `T` or
        // `N` reports the expiry the item had before they change it.
        let mut win = false;
        for (c, _) in flags.tokens() {
            match c {
                b'T' => {
                    if let Some(t) = flags.ttl {
                        it.exptime = exptime_at(clock.deadline(t), view.now);
                    }
                }
                b'N' if view.created => {
                    if let Some(t) = flags.vivify {
                        it.exptime = exptime_at(clock.deadline(t), view.now);
                    }
                    win = true;
                }
                b'R' => {
                    let limit = match flags.recache.map(|r| clock.deadline(r)) {
                        Some(Deadline::At(t)) => t,
                        _ => 0,
                    };
                    if !it.token_sent && !view.created && it.exptime != 0 && it.exptime < limit {
                        win = true;
                    }
                }
                b's' => {
                    head.extend_from_slice(b" s");
                    num(head, it.value.len() as u64);
                }
                b't' => {
                    head.extend_from_slice(b" t");
                    inum(head, clock.ttl_left(it.exptime));
                }
                b'c' => {
                    head.extend_from_slice(b" c");
                    num(head, store.shown_cas(it.cas));
                }
                b'f' => {
                    head.extend_from_slice(b" f");
                    num(head, u64::from(it.flags));
                }
                b'l' => {
                    head.extend_from_slice(b" l");
                    num(head, u64::from(view.before.idle));
                }
                b'h' => head.extend_from_slice(if view.before.fetched { b" h1" } else { b" h0" }),
                b'O' | b'k' => echo(c, wire_key, flags, head),
                _ => {}
            }
        }
        // A token already handed out: `Z`; stale: `X`, and the first
        // reader of a stale item wins the token to refresh it.
        if it.token_sent {
            head.extend_from_slice(b" Z");
        }
        if it.stale {
            head.extend_from_slice(b" X");
            win |= !it.token_sent;
        }
        if win {
            head.extend_from_slice(b" W");
            it.token_sent = true;
        }
        head.extend_from_slice(b"\r\n");
        if flags.value {
            out.value(&it.value);
            out.bytes().extend_from_slice(b"\r\n");
        }
    });
    if !hit && !flags.quiet {
        let out = out.bytes();
        out.extend_from_slice(b"EN");
        meta_ret(shared, wire_key, flags, None, out);
        out.extend_from_slice(b"\r\n");
    }
    seen
}

/// Logs a fetch for `watch fetchers`: found (class, value size) or not.
fn log_get(shared: &Shared, key: &[u8], seen: Option<(usize, usize)>, cfd: i32) {
    shared.store.watch.emit(watch::FETCHERS, |l| {
        l.push_str("type=item_get key=");
        watch::uri_key(l, key);
        let (status, cls, size) = match seen {
            Some((cls, size)) => ("found", cls, size),
            None => ("not_found", 0, 0),
        };
        let _ = write!(l, " status={status} clsid={cls} cfd={cfd} size={size}");
    });
}

/// Logs a store for `watch mutations`: its outcome, command, TTL, the
/// item's class and the value size (`item` is the flags and value size).
fn log_store(
    shared: &Shared,
    key: &[u8],
    r: StoreOutcome,
    cmd: &str,
    deadline: Deadline,
    item: (u32, usize),
    cfd: i32,
) {
    let store = &shared.store;
    store.watch.emit(watch::MUTATIONS, |l| {
        l.push_str("type=item_store key=");
        watch::uri_key(l, key);
        let status = match r {
            StoreOutcome::Stored(_) => "stored",
            StoreOutcome::NotStored => "not_stored",
            StoreOutcome::Exists => "exists",
            StoreOutcome::NotFound => "not_found",
            StoreOutcome::NoMemory => "no_memory",
        };
        let ttl = match deadline {
            Deadline::At(t) => i64::from(t) - i64::from(store.clock().now()),
            _ => 0,
        };
        let cls = slabs::class_of(shared.store.size_of_item(key.len(), item.0, item.1));
        let _ = write!(
            l,
            " status={status} cmd={cmd} ttl={ttl} clsid={cls} cfd={cfd} size={}",
            item.1
        );
    });
}

/// Appends an echoed flag: `O` (the opaque) or `k` (the key as the client
/// sent it, and ` b` after it when that was base64).
fn echo(c: u8, wire_key: &[u8], flags: &MetaFlags<'_>, out: &mut Vec<u8>) {
    if c == b'O' {
        out.extend_from_slice(b" O");
        out.extend_from_slice(flags.opaque.unwrap_or_default());
    } else {
        out.extend_from_slice(b" k");
        out.extend_from_slice(wire_key);
        if flags.base64 {
            out.extend_from_slice(b" b");
        }
    }
}

fn meta_set(
    shared: &Shared,
    wire_key: &[u8],
    key: &[u8],
    data: &[u8],
    flags: &MetaFlags<'_>,
    out: &mut Vec<u8>,
    cfd: i32,
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
        MetaStore {
            new_cas: flags.new_cas,
            invalidate: flags.invalidate,
        },
    );
    let cmd = match (mode, flags.compare_cas) {
        (SetMode::Set | SetMode::Replace, Some(_)) => "cas",
        (SetMode::Set, None) => "set",
        (SetMode::Add, _) => "add",
        (SetMode::Replace, None) => "replace",
        (SetMode::Append, _) => "append",
        (SetMode::Prepend, _) => "prepend",
    };
    let item = (flags.client_flags.unwrap_or(0), data.len());
    log_store(shared, key, r, cmd, deadline, item, cfd);
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
    // memcached 1.6.18 returns only `O`, `k` and `c` from `ms`; `c` is the
    // new CAS, or 0 when nothing was stored.
    for (c, _) in flags.tokens() {
        match c {
            b'O' | b'k' => echo(c, wire_key, flags, out),
            b'c' => {
                out.extend_from_slice(b" c");
                num(out, cas);
            }
            _ => {}
        }
    }
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
    let (r, counter) = store.arith_facts(
        key,
        incr,
        flags.delta.unwrap_or(1),
        create,
        flags.compare_cas,
    );
    match r {
        ArithOutcome::Value(v, cas) => {
            let clock = store.clock();
            // `t` is the counter's TTL. memcached 1.6.18 applies `T` where
            // it stands among the flags, so a `t` before it reports the
            // TTL the counter had, and one after it the new one.
            let mut ttl = counter.map_or(-1, |c| clock.ttl_left(c.exptime));
            if let Some(t) = flags.ttl {
                let deadline = clock.deadline(t);
                store.touch(key, deadline);
                let t_first = flags
                    .tokens()
                    .map(|(c, _)| c)
                    .find(|&c| c == b'T' || c == b't');
                if t_first == Some(b'T') {
                    ttl = match deadline {
                        Deadline::Never => -1,
                        Deadline::At(at) => clock.ttl_left(at),
                        Deadline::Past => 0,
                    };
                }
            }
            // Quiet mode hides the reply of a counter that was changed,
            // not of one `N` created (memcached 1.6.18).
            if flags.quiet && !counter.is_some_and(|c| c.created) {
                return;
            }
            let digits = v.to_string();
            let facts = Facts {
                cas,
                flags: 0,
                size: digits.len(),
                ttl,
                hit: false,
                idle: 0,
            };
            if flags.value {
                out.extend_from_slice(b"VA ");
                num(out, digits.len() as u64);
                meta_ret(shared, wire_key, flags, Some(&facts), out);
                out.extend_from_slice(b"\r\n");
                line(out, digits.as_bytes());
            } else {
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

/// The words of a `stats` line after its group name.
fn group_args(line: &[u8]) -> Vec<&[u8]> {
    line.split(|&b| b == b' ')
        .filter(|w| !w.is_empty())
        .skip(1)
        .collect()
}

/// Most bytes of one `stats cachedump` reply, as memcached's buffer.
const CACHEDUMP_MAX: usize = 2 * 1024 * 1024;

/// `stats cachedump <class> <limit>`: up to `limit` (0: all that fit in
/// 2 MiB) items of a slab class, `ITEM <key> [<value bytes> b; <expiry,
/// unix time, 0 for none> s]`, with memcached 1.6.18's errors.
fn cachedump(store: &Store, args: Vec<&[u8]>, out: &mut Vec<u8>) {
    use std::io::Write as _;
    let [id, limit, ..] = args[..] else {
        line(out, b"CLIENT_ERROR bad command line");
        return;
    };
    let num = crate::admin::parse::<u32>;
    let (Some(id), Some(limit)) = (num(id), num(limit)) else {
        line(out, b"CLIENT_ERROR bad command line format");
        return;
    };
    if id as usize > slabs::MAX_CLASSES {
        line(out, b"CLIENT_ERROR Illegal slab id");
        return;
    }
    let clock = store.clock();
    let start = out.len();
    store.for_each_in_class(id as usize, limit as usize, |it| {
        let exp = if it.exptime == 0 {
            0
        } else {
            clock.start_unix() + i64::from(it.exptime) - 1
        };
        let at = out.len();
        out.extend_from_slice(b"ITEM ");
        out.extend_from_slice(&it.key);
        let _ = write!(out, " [{} b; {exp} s]\r\n", it.value.len());
        if out.len() - start > CACHEDUMP_MAX - 5 {
            out.truncate(at);
            return false;
        }
        true
    });
    line(out, b"END");
}

pub(crate) fn stats(shared: &Shared, group: Option<&[u8]>, out: &mut Vec<u8>) {
    let store = &shared.store;
    let cfg = &shared.config;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let whole = group.unwrap_or_default();
    let mut words = whole.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let (group, arg) = (words.next(), words.next());
    match group {
        Some(b"detail") => {
            shared.detail.command(arg, out);
            return;
        }
        Some(b"conns") => {
            let uptime = shared.started.elapsed().as_secs();
            shared.conn_table.write(store.clock().now(), uptime, out);
        }
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
            stat(out, "connection_structures", ld(&c.peak_connections) + 1);
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
                ("cmd_meta", &o.cmd_meta),
                ("lru_crawler_starts", &o.lru_crawler_starts),
                ("crawler_reclaimed", &o.crawler_reclaimed),
                ("log_watcher_sent", &store.watch.sent),
                ("log_watcher_skipped", &store.watch.skipped),
                ("store_too_large", &o.store_too_large),
                ("store_no_memory", &o.store_no_memory),
                ("bytes_read", &c.bytes_read),
                ("bytes_written", &c.bytes_written),
            ] {
                stat(out, name, ld(v));
            }
            stat(out, "limit_maxbytes", s.limit_maxbytes);
            stat(out, "threads", cfg.threads);
            stat(out, "conn_yields", ld(&c.conn_yields));
            stat(out, "idle_kicks", ld(&c.idle_kicks));
            stat(out, "bytes", s.bytes);
            stat(out, "curr_items", s.curr_items);
            stat(out, "total_items", s.counters.total_items);
            stat(out, "expired_unfetched", s.counters.expired_unfetched);
            stat(out, "evicted_unfetched", s.counters.evicted_unfetched);
            stat(out, "evictions", s.counters.evictions);
            stat(out, "reclaimed", s.counters.reclaimed);
            stat(out, "log_watchers", store.watch.watchers());
            stat(out, "lru_crawler_running", 0);
            crate::runtime_stats::write(out);
        }
        Some(b"settings") => {
            // memcached 1.6.18's order; of its settings, those this server
            // has (no UDP, SASL, TLS, extstore, slab rebalancer or LRU
            // maintainer: those lines are left out, not made up).
            let yes = |b: bool| if b { "yes" } else { "no" };
            stat(out, "maxbytes", store.limit());
            stat(out, "maxconns", cfg.max_conns);
            stat(out, "tcpport", cfg.port);
            stat(out, "udpport", 0);
            stat(out, "inter", &cfg.listen);
            stat(out, "verbosity", ld(&shared.verbosity));
            // In memcached's time base, as it prints it.
            stat(out, "oldest", store.oldest_live());
            stat(
                out,
                "evictions",
                if store.evictions() { "on" } else { "off" },
            );
            match &cfg.unix_socket {
                Some(path) => stat(out, "domain_socket", path.display()),
                None => stat(out, "domain_socket", "NULL"),
            }
            stat(out, "umask", format!("{:o}", cfg.unix_mask));
            stat(out, "shutdown_command", yes(cfg.enable_shutdown));
            let classes = slabs::layout();
            stat(out, "growth_factor", format!("{:.2}", classes.factor));
            stat(out, "chunk_size", classes.min);
            stat(out, "num_threads", cfg.threads);
            // memcached prints its worker count here whether or not UDP
            // is on.
            stat(out, "num_threads_per_udp", cfg.threads);
            // The delimiter's byte as it is (memcached prints a char).
            out.extend_from_slice(b"STAT stat_key_prefix ");
            out.push(shared.detail.delimiter());
            out.extend_from_slice(b"\r\n");
            stat(out, "detail_enabled", yes(shared.detail.enabled()));
            stat(out, "reqs_per_event", cfg.reqs_per_event);
            stat(out, "cas_enabled", yes(cfg.cas_enabled));
            stat(out, "tcp_backlog", cfg.backlog);
            stat(out, "binding_protocol", cfg.protocol);
            stat(out, "auth_enabled_sasl", "no");
            stat(out, "auth_enabled_ascii", "no");
            stat(out, "item_size_max", cfg.item_max);
            // A connection over -c is refused at once, as maxconns_fast.
            stat(out, "maxconns_fast", "yes");
            stat(
                out,
                "slab_automove",
                shared.slab_automove.load(Ordering::Relaxed),
            );
            stat(out, "slab_chunk_max", slabs::CHUNK_MAX);
            stat(
                out,
                "lru_crawler",
                yes(shared.crawler_enabled.load(Ordering::Relaxed)),
            );
            stat(
                out,
                "lru_crawler_sleep",
                shared.crawler_sleep.load(Ordering::Relaxed),
            );
            stat(
                out,
                "lru_crawler_tocrawl",
                shared.crawler_tocrawl.load(Ordering::Relaxed),
            );
            stat(out, "flush_enabled", yes(cfg.flush_enabled));
            stat(out, "dump_enabled", yes(cfg.dump_enabled));
            stat(out, "idle_timeout", cfg.idle_timeout);
            stat(
                out,
                "track_sizes",
                yes(shared.sizes_enabled.load(Ordering::Relaxed)),
            );
            stat(out, "ssl_enabled", "no");
            stat(out, "corewise_mode", cfg.mode);
        }
        Some(b"items") => {
            for (id, c) in store.class_stats().iter().enumerate() {
                if c.number == 0 {
                    continue;
                }
                let k = &c.counters;
                for (name, v) in [
                    ("number", c.number),
                    ("number_hot", 0),
                    ("number_warm", c.active),
                    ("number_cold", c.number - c.active),
                    ("age_hot", 0),
                    ("age_warm", 0),
                    ("age", u64::from(c.age)),
                    ("mem_requested", c.mem_requested),
                    ("evicted", k.evicted),
                    ("evicted_nonzero", k.evicted_nonzero),
                    ("evicted_time", u64::from(k.evicted_time)),
                    ("outofmemory", k.outofmemory),
                    ("reclaimed", k.reclaimed),
                    ("expired_unfetched", k.expired_unfetched),
                    ("evicted_unfetched", k.evicted_unfetched),
                ] {
                    stat(out, &format!("items:{id}:{name}"), v);
                }
            }
        }
        Some(b"slabs") => {
            // A view: items are allocated one by one; each class has the
            // pages its items would fill (see `store::slabs`).
            let (mut active, mut pages_total) = (0u64, 0u64);
            for (id, c) in store.class_stats().iter().enumerate() {
                let pages = c.pages(id);
                if pages == 0 {
                    continue;
                }
                active += 1;
                pages_total += pages;
                let per = slabs::per_page(id) as u64;
                let size = slabs::chunk_sizes().get(id - 1).copied().unwrap_or(0);
                for (name, v) in [
                    ("chunk_size", size as u64),
                    ("chunks_per_page", per),
                    ("total_pages", pages),
                    ("total_chunks", pages * per),
                    ("used_chunks", c.used_chunks),
                    ("free_chunks", pages * per - c.used_chunks),
                    ("free_chunks_end", 0),
                    ("get_hits", c.counters.get_hits),
                    ("cmd_set", c.counters.cmd_set),
                    ("delete_hits", c.counters.delete_hits),
                    ("incr_hits", c.counters.incr_hits),
                    ("decr_hits", c.counters.decr_hits),
                    ("cas_hits", c.counters.cas_hits),
                    ("cas_badval", c.counters.cas_badval),
                    ("touch_hits", c.counters.touch_hits),
                ] {
                    stat(out, &format!("{id}:{name}"), v);
                }
            }
            stat(out, "active_slabs", active);
            stat(out, "total_malloced", pages_total * slabs::PAGE_SIZE as u64);
        }
        // The number of items of each size as memcached counts an item's
        // size (`item_size`), rounded up to 32 bytes, smallest first; when
        // enabled (memcached keeps its histogram up to date at every link
        // and unlink; here it is counted when asked, over the items
        // stored, as `stats items` is).
        Some(b"sizes") => {
            if shared.sizes_enabled.load(Ordering::Relaxed) {
                for (size, n) in store.size_histogram() {
                    stat(out, &size.to_string(), n);
                }
            } else {
                stat(out, "sizes_status", "disabled");
            }
        }
        // memcached 1.6.18 ends these two replies without an `END` line.
        Some(b"sizes_enable") => {
            // memcached's size histogram needs CAS values (`-C` refuses it).
            if !cfg.cas_enabled {
                stat(out, "sizes_status", "error");
                stat(out, "sizes_error", "cas_support_disabled");
                return;
            }
            shared.sizes_enabled.store(true, Ordering::Relaxed);
            stat(out, "sizes_status", "enabled");
            return;
        }
        Some(b"sizes_disable") => {
            shared.sizes_enabled.store(false, Ordering::Relaxed);
            stat(out, "sizes_status", "disabled");
            return;
        }
        Some(b"cachedump") => {
            if shared.config.dump_enabled {
                cachedump(store, group_args(whole), out);
            } else {
                line(out, b"CLIENT_ERROR stats cachedump not allowed");
            }
            return;
        }
        // No external storage: memcached without extstore answers so.
        Some(b"extstore") => {}
        Some(b"reset") => {
            store.reset_counters();
            shared.detail.clear();
            for c in [
                &shared.conns.total_connections,
                &shared.conns.rejected_connections,
                &shared.conns.bytes_read,
                &shared.conns.bytes_written,
                &shared.conns.conn_yields,
                &shared.conns.idle_kicks,
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
