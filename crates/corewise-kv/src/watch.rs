//! `watch`: memcached's live log of fetches, mutations and evictions.
//!
//! Why a module of its own: the log is fed from the request path (exec)
//! and from eviction (store) and drained by the watching connections
//! (server), so it sits below all three. When nobody watches, the cost on
//! the request path is one relaxed load. A watcher that does not keep up
//! loses lines (counted and reported as `skipped=N`, as memcached does)
//! rather than growing the server.

use corewise::sync::SpinLock;
use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// `watch fetchers`: item reads.
///
/// ```
/// use corewise_kv::{config::Config, exec::Shared, watch::FETCHERS};
/// # use corewise_kv::protocol::{Decoded, Decoder, Limits};
/// let shared = Shared::new(Config::default());
/// let w = shared.store.watch.subscribe(FETCHERS);
/// # let (_, Decoded::Request(r)) = Decoder::new(Limits::default()).decode(b"get k\r\n") else { panic!() };
/// # corewise_kv::exec::execute(&shared, &r, &mut Vec::new(), &mut Vec::new());
/// // ... a `get k` ran ...
/// let lines = w.drain();
/// assert!(lines[0].contains("type=item_get key=k status=not_found"));
/// ```
pub const FETCHERS: u8 = 1;
/// `watch mutations`: item stores.
///
/// ```
/// use corewise_kv::{config::Config, exec::Shared, watch::MUTATIONS};
/// # use corewise_kv::protocol::{Decoded, Decoder, Limits};
/// let shared = Shared::new(Config::default());
/// let w = shared.store.watch.subscribe(MUTATIONS);
/// # let (_, Decoded::Request(r)) = Decoder::new(Limits::default()).decode(b"set k 0 0 1\r\nv\r\n") else { panic!() };
/// # corewise_kv::exec::execute(&shared, &r, &mut Vec::new(), &mut Vec::new());
/// // ... a `set k` ran ...
/// let lines = w.drain();
/// assert!(lines[0].contains("type=item_store key=k status=stored"));
/// ```
pub const MUTATIONS: u8 = 2;
/// `watch evictions`: items evicted to make room.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// use corewise_kv::watch::EVICTIONS;
/// let s = Store::new(4096, 1);
/// let w = s.watch.subscribe(EVICTIONS);
/// for k in [&b"a"[..], b"b", b"c"] {
///     s.store(SetMode::Set, k, 0, Deadline::Never, &[0; 1500], None);
/// }
/// let lines = w.drain();
/// assert!(lines.iter().any(|l| l.contains("type=eviction key=a")));
/// ```
pub const EVICTIONS: u8 = 4;

/// Lines a watcher may have waiting before new ones are dropped.
const QUEUE_MAX: usize = 8192;

/// One watching connection's queue.
///
/// ```
/// use corewise_kv::watch::{Watch, FETCHERS, MUTATIONS};
/// let log = Watch::default();
/// let w = log.subscribe(MUTATIONS);
/// log.emit(FETCHERS, |l| l.push_str("not for w"));
/// log.emit(MUTATIONS, |l| l.push_str("key=k"));
/// let lines = w.drain();
/// assert_eq!(lines.len(), 1);
/// assert!(lines[0].ends_with(" key=k\n"));
/// ```
#[derive(Debug)]
pub struct Watcher {
    mask: u8,
    queue: SpinLock<(VecDeque<String>, u64)>,
}

impl Watcher {
    /// Takes the waiting lines (a `skipped=N` line first when some were
    /// dropped).
    ///
    /// ```
    /// use corewise_kv::watch::{Watch, FETCHERS};
    /// let log = Watch::default();
    /// let w = log.subscribe(FETCHERS);
    /// // A watcher that does not keep up loses lines, and is told how many.
    /// for _ in 0..10_000 {
    ///     log.emit(FETCHERS, |l| l.push('x'));
    /// }
    /// let lines = w.drain();
    /// assert!(lines[0].starts_with("skipped="));
    /// assert!(w.drain().is_empty());
    /// ```
    pub fn drain(&self) -> Vec<String> {
        let mut q = self.queue.lock();
        let mut v = Vec::with_capacity(q.0.len() + 1);
        if q.1 > 0 {
            v.push(format!("skipped={}\n", q.1));
            q.1 = 0;
        }
        v.extend(q.0.drain(..));
        v
    }
}

/// The watchers and the log's sequence number.
///
/// ```
/// use corewise_kv::watch::{Watch, FETCHERS};
/// use std::sync::atomic::Ordering::Relaxed;
/// let log = Watch::default();
/// let w = log.subscribe(FETCHERS);
/// log.emit(FETCHERS, |l| l.push_str("key=a"));
/// assert_eq!(log.sent.load(Relaxed), 1);
/// assert_eq!(w.drain().len(), 1);
/// ```
#[derive(Debug)]
pub struct Watch {
    count: AtomicUsize,
    watchers: SpinLock<Vec<Arc<Watcher>>>,
    gid: AtomicU64,
    /// Lines queued for watchers (`log_watcher_sent`).
    pub sent: AtomicU64,
    /// Lines dropped for watchers that fell behind (`log_watcher_skipped`).
    pub skipped: AtomicU64,
}

impl Default for Watch {
    fn default() -> Self {
        Self {
            count: AtomicUsize::new(0),
            watchers: SpinLock::new(Vec::new()),
            gid: AtomicU64::new(1),
            sent: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }
}

/// The event classes a `watch` argument list asks for (`fetchers` when
/// none); `None` for an unknown one.
///
/// ```
/// use corewise_kv::watch::{mask_of, EVICTIONS, FETCHERS, MUTATIONS};
/// assert_eq!(mask_of(b""), Some(FETCHERS));
/// assert_eq!(mask_of(b"mutations evictions"), Some(MUTATIONS | EVICTIONS));
/// assert_eq!(mask_of(b"rawcmds"), None);
/// ```
pub fn mask_of(args: &[u8]) -> Option<u8> {
    let mut mask = 0;
    for w in args.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
        mask |= match w {
            b"fetchers" => FETCHERS,
            b"mutations" => MUTATIONS,
            b"evictions" => EVICTIONS,
            _ => return None,
        };
    }
    Some(if mask == 0 { FETCHERS } else { mask })
}

/// Appends `key` URI-encoded, as memcached's log writes keys.
///
/// ```
/// use corewise_kv::watch::uri_key;
/// let mut out = String::new();
/// uri_key(&mut out, b"user 1/a~b");
/// assert_eq!(out, "user%201%2Fa~b");
/// ```
pub fn uri_key(out: &mut String, key: &[u8]) {
    for &b in key {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

impl Watch {
    /// Adds a watcher of the `mask` events.
    ///
    /// ```
    /// use corewise_kv::watch::{Watch, EVICTIONS, MUTATIONS};
    /// let log = Watch::default();
    /// let w = log.subscribe(MUTATIONS | EVICTIONS);
    /// log.emit(EVICTIONS, |l| l.push_str("key=a"));
    /// log.emit(MUTATIONS, |l| l.push_str("key=b"));
    /// assert_eq!(w.drain().len(), 2);
    /// ```
    pub fn subscribe(&self, mask: u8) -> Arc<Watcher> {
        let w = Arc::new(Watcher {
            mask,
            queue: SpinLock::new((VecDeque::new(), 0)),
        });
        self.watchers.lock().push(Arc::clone(&w));
        self.count.fetch_add(1, Ordering::Release);
        w
    }

    /// Watchers now (`log_watchers`).
    ///
    /// ```
    /// use corewise_kv::watch::{Watch, FETCHERS};
    /// let log = Watch::default();
    /// let w = log.subscribe(FETCHERS);
    /// assert_eq!(log.watchers(), 1);
    /// log.unsubscribe(&w);
    /// assert_eq!(log.watchers(), 0);
    /// ```
    pub fn watchers(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Removes a watcher.
    ///
    /// ```
    /// use corewise_kv::watch::{Watch, FETCHERS};
    /// let log = Watch::default();
    /// let w = log.subscribe(FETCHERS);
    /// log.unsubscribe(&w);
    /// log.emit(FETCHERS, |l| l.push_str("key=a"));
    /// assert!(w.drain().is_empty());
    /// ```
    pub fn unsubscribe(&self, w: &Arc<Watcher>) {
        let mut ws = self.watchers.lock();
        if let Some(i) = ws.iter().position(|x| Arc::ptr_eq(x, w)) {
            ws.swap_remove(i);
            self.count.fetch_sub(1, Ordering::Release);
        }
    }

    /// Logs one `kind` event: `body` writes what follows `ts=... gid=...`
    /// (without the newline). Nothing is built when nobody watches it.
    ///
    /// ```
    /// use corewise_kv::watch::{Watch, FETCHERS};
    /// let log = Watch::default();
    /// let mut built = false;
    /// log.emit(FETCHERS, |_| built = true);
    /// assert!(!built); // nobody watches: nothing is built
    /// let w = log.subscribe(FETCHERS);
    /// log.emit(FETCHERS, |l| l.push_str("key=a"));
    /// let line = &w.drain()[0];
    /// assert!(line.starts_with("ts=") && line.contains(" gid=") && line.ends_with(" key=a\n"));
    /// ```
    pub fn emit(&self, kind: u8, body: impl FnOnce(&mut String)) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let ws: Vec<Arc<Watcher>> = self
            .watchers
            .lock()
            .iter()
            .filter(|w| w.mask & kind != 0)
            .cloned()
            .collect();
        if ws.is_empty() {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let gid = self.gid.fetch_add(1, Ordering::Relaxed);
        let mut line = format!("ts={}.{:06} gid={gid} ", now.as_secs(), now.subsec_micros());
        body(&mut line);
        line.push('\n');
        for w in ws {
            let mut q = w.queue.lock();
            if q.0.len() >= QUEUE_MAX {
                q.1 += 1;
                self.skipped.fetch_add(1, Ordering::Relaxed);
            } else {
                q.0.push_back(line.clone());
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
