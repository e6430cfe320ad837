//! The item store: memcached's data model (key, value, flags, expiry, CAS)
//! behind a fixed number of shards.
//!
//! Why shards with runtime locks: every request touches one key, so a
//! key-hash shard choice spreads requests from different cores over
//! different locks. The critical sections are short and never block, and
//! user threads are not preempted while they hold a lock, so each shard is
//! a [`corewise::sync::SpinLock`]: a waiter spins for the few hundred
//! nanoseconds an operation takes instead of blocking its user thread. The
//! memory limit is split evenly over the shards; each evicts from its own
//! LRU tail, which approximates a global LRU closely when keys hash evenly.
//!
//! `flush_all` raises a CAS floor: every item whose CAS is at or below it
//! counts as gone, whichever shard it is in and whenever that shard is next
//! locked. A flush that takes effect now then also empties the shards one
//! by one; a delayed flush records its cut-off second (memcached's
//! `oldest_live`), raises the floor at every operation in that second and
//! the first one after it (memcached drops the items stored during the
//! cut-off second too), and leaves reclaiming to lookups and eviction.

mod clock;
mod hash;
mod shard;
pub mod slabs;

pub use clock::{Clock, Deadline, MAX_RELATIVE_EXPIRY};
pub use hash::{hash_key, FxBuild, FxHasher};
pub use shard::{Item, Miss, Shard, ShardCounters, Value, ITEM_OVERHEAD};

use crate::watch::Watch;
use corewise::sync::SpinLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// How a storage request treats an existing item.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store, StoreOutcome};
/// let s = Store::new(1 << 20, 1);
/// assert_eq!(s.store(SetMode::Replace, b"k", 0, Deadline::Never, b"a", None), StoreOutcome::NotStored);
/// assert!(matches!(s.store(SetMode::Add, b"k", 0, Deadline::Never, b"a", None), StoreOutcome::Stored(_)));
/// s.store(SetMode::Append, b"k", 0, Deadline::Never, b"b", None);
/// s.store(SetMode::Prepend, b"k", 0, Deadline::Never, b"c", None);
/// assert!(s.get(b"k", None, |it, _| assert_eq!(it.value[..], b"cab"[..])));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Store unconditionally.
    Set,
    /// Store only if the key is absent.
    Add,
    /// Store only if the key is present.
    Replace,
    /// Add the data after the existing value (flags and expiry kept).
    Append,
    /// Add the data before the existing value (flags and expiry kept).
    Prepend,
}

/// The outcome of a storage request.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store, StoreOutcome};
/// let s = Store::new(1 << 20, 1);
/// let StoreOutcome::Stored(cas) = s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v1", None) else { panic!() };
/// // A CAS store with the CAS the item has now succeeds, once.
/// assert!(matches!(s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v2", Some(cas)), StoreOutcome::Stored(_)));
/// assert_eq!(s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v3", Some(cas)), StoreOutcome::Exists);
/// assert_eq!(s.store(SetMode::Set, b"gone", 0, Deadline::Never, b"v", Some(cas)), StoreOutcome::NotFound);
/// // Larger than a shard may hold.
/// assert_eq!(s.store(SetMode::Set, b"big", 0, Deadline::Never, &vec![0; 2 << 20], None), StoreOutcome::NoMemory);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Stored; the item's new CAS.
    Stored(u64),
    /// A condition (add, replace, append, prepend) did not hold.
    NotStored,
    /// CAS given and the item changed since (or, for `cas`, it is absent:
    /// see [`StoreOutcome::NotFound`]).
    Exists,
    /// CAS given and the item is absent.
    NotFound,
    /// Larger than the memory a shard may hold.
    NoMemory,
}

/// What incr/decr left on a counter besides its value (see
/// [`Store::arith_facts`]).
///
/// ```
/// use corewise_kv::store::{CounterFacts, Deadline, Store};
/// let s = Store::new(1 << 20, 1);
/// let (_, facts) = s.arith_facts(b"hits", true, 1, Some((0, Deadline::At(100))), None);
/// assert_eq!(facts, Some(CounterFacts { exptime: 100, created: true }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterFacts {
    /// The item's expiry on the server clock (0: never).
    pub exptime: u32,
    /// The call created the counter (a miss with `create`).
    pub created: bool,
}

/// The outcome of incr/decr.
///
/// ```
/// use corewise_kv::store::{ArithOutcome, Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// assert_eq!(s.arith(b"n", true, 1, None, None), ArithOutcome::NotFound);
/// s.store(SetMode::Set, b"n", 0, Deadline::Never, b"10", None);
/// assert!(matches!(s.arith(b"n", false, 3, None, None), ArithOutcome::Value(7, _)));
/// assert_eq!(s.arith(b"n", true, 1, None, Some(12345)), ArithOutcome::Exists);
/// s.store(SetMode::Set, b"t", 0, Deadline::Never, b"text", None);
/// assert_eq!(s.arith(b"t", true, 1, None, None), ArithOutcome::NonNumeric);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOutcome {
    /// The new value and the item's new CAS.
    Value(u64, u64),
    /// No such item (and no auto-create asked).
    NotFound,
    /// The value is not a decimal number.
    NonNumeric,
    /// CAS given and it did not match.
    Exists,
}

/// The outcome of a delete.
///
/// ```
/// use corewise_kv::store::{Deadline, DeleteOutcome, SetMode, Store, StoreOutcome};
/// let s = Store::new(1 << 20, 1);
/// let StoreOutcome::Stored(cas) = s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None) else { panic!() };
/// assert_eq!(s.delete(b"k", Some(cas + 1)), DeleteOutcome::Exists);
/// assert_eq!(s.delete(b"k", Some(cas)), DeleteOutcome::Deleted);
/// assert_eq!(s.delete(b"k", None), DeleteOutcome::NotFound);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Removed.
    Deleted,
    /// No such item.
    NotFound,
    /// CAS given and it did not match.
    Exists,
}

/// What a read saw of an item before it touched it (for meta flags).
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
/// s.get(b"k", None, |_, before| assert!(!before.fetched));
/// s.get(b"k", None, |_, before| {
///     assert!(before.fetched);
///     assert_eq!(before.idle, 0);
/// });
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Before {
    /// It had been fetched before this read.
    pub fetched: bool,
    /// Seconds since its previous access.
    pub idle: u32,
}

/// What a meta get saw, besides the item (see [`Store::meta_get`]).
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
/// let mut seen = None;
/// let hit = s.meta_get(b"k", false, true, false, |_, view| seen = Some((view.before.fetched, view.created, view.now)));
/// assert!(hit);
/// assert_eq!(seen, Some((false, false, s.clock().now())));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MetaView {
    /// The item as it was before this read.
    pub before: Before,
    /// The item was created by this read (`mg ... N`).
    pub created: bool,
    /// Server seconds now.
    pub now: u32,
}

/// Options of a meta set beyond the classic ones.
///
/// ```
/// use corewise_kv::store::{Deadline, MetaStore, SetMode, Store, StoreOutcome};
/// let s = Store::new(1 << 20, 1);
/// let meta = MetaStore { new_cas: Some(777), ..MetaStore::default() };
/// let r = s.store_with(SetMode::Set, b"k", 0, Deadline::Never, b"v", None, meta);
/// assert_eq!(r, StoreOutcome::Stored(777));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetaStore {
    /// `E`: the CAS the item gets instead of a new one.
    pub new_cas: Option<u64>,
    /// `I` with `C`: a compare CAS older than the item's stores the value
    /// anyway, as stale, keeping the old expiry and win token.
    pub invalidate: bool,
}

/// The expiry field a deadline gives an item at server second `now`.
///
/// ```
/// use corewise_kv::store::{exptime_at, Deadline};
/// assert_eq!(exptime_at(Deadline::Never, 5), 0);
/// assert_eq!(exptime_at(Deadline::At(9), 5), 9);
/// assert_eq!(exptime_at(Deadline::Past, 5), 5);
/// ```
pub fn exptime_at(deadline: Deadline, now: u32) -> u32 {
    match deadline {
        Deadline::Never => 0,
        Deadline::At(t) => t,
        Deadline::Past => now,
    }
}

/// Totals over the store, for `stats`.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"a", 0, Deadline::Never, b"1", None);
/// s.store(SetMode::Set, b"b", 0, Deadline::Never, b"2", None);
/// let st = s.stats();
/// assert_eq!((st.curr_items, st.limit_maxbytes), (2, 1 << 20));
/// assert_eq!(st.counters.total_items, 2);
/// assert!(st.bytes > 0);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    /// Items held.
    pub curr_items: u64,
    /// Bytes held, each item counted as memcached counts it (header, CAS,
    /// key, flags suffix, value and CRLF).
    pub bytes: u64,
    /// Memory limit in bytes.
    pub limit_maxbytes: u64,
    /// Shard counters, summed.
    pub counters: ShardCounters,
    /// Age of the oldest item (seconds since its last access).
    pub oldest_age: u32,
}

/// Request counters (memcached's `stats` names).
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// use std::sync::atomic::Ordering::Relaxed;
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
/// s.get(b"k", None, |_, _| {});
/// s.get(b"missing", None, |_, _| {});
/// assert_eq!(s.ops.cmd_set.load(Relaxed), 1);
/// assert_eq!((s.ops.get_hits.load(Relaxed), s.ops.get_misses.load(Relaxed)), (1, 1));
/// ```
#[derive(Debug, Default)]
pub struct OpCounters {
    /// Keys asked for by retrievals.
    pub cmd_get: AtomicU64,
    /// Storage requests.
    pub cmd_set: AtomicU64,
    /// Touch requests (incl. gat).
    pub cmd_touch: AtomicU64,
    /// flush_all requests.
    pub cmd_flush: AtomicU64,
    /// Retrieval hits.
    pub get_hits: AtomicU64,
    /// Retrieval misses.
    pub get_misses: AtomicU64,
    /// Misses on expired items.
    pub get_expired: AtomicU64,
    /// Misses on flushed items.
    pub get_flushed: AtomicU64,
    /// Deletes that removed an item.
    pub delete_hits: AtomicU64,
    /// Deletes of absent keys.
    pub delete_misses: AtomicU64,
    /// Increments that found their item.
    pub incr_hits: AtomicU64,
    /// Increments of absent keys.
    pub incr_misses: AtomicU64,
    /// Decrements that found their item.
    pub decr_hits: AtomicU64,
    /// Decrements of absent keys.
    pub decr_misses: AtomicU64,
    /// CAS requests that stored.
    pub cas_hits: AtomicU64,
    /// CAS requests on absent keys.
    pub cas_misses: AtomicU64,
    /// CAS requests with a stale CAS value.
    pub cas_badval: AtomicU64,
    /// Touches that found their item.
    pub touch_hits: AtomicU64,
    /// Touches of absent keys.
    pub touch_misses: AtomicU64,
    /// Crawls and metadumps run (`lru_crawler_starts`).
    pub lru_crawler_starts: AtomicU64,
    /// Expired items a crawl reclaimed (`crawler_reclaimed`).
    pub crawler_reclaimed: AtomicU64,
    /// Meta debug (`me`) requests (what memcached 1.6.18 counts as
    /// `cmd_meta`).
    pub cmd_meta: AtomicU64,
    /// Stores refused for the item size limit.
    pub store_too_large: AtomicU64,
    /// Stores refused for want of memory.
    pub store_no_memory: AtomicU64,
}

impl OpCounters {
    /// Sets every counter to zero (`stats reset`).
    ///
    /// ```
    /// use corewise_kv::store::OpCounters;
    /// use std::sync::atomic::Ordering::Relaxed;
    /// let c = OpCounters::default();
    /// c.cmd_get.fetch_add(5, Relaxed);
    /// c.reset();
    /// assert_eq!(c.cmd_get.load(Relaxed), 0);
    /// ```
    pub fn reset(&self) {
        for c in [
            &self.cmd_get,
            &self.cmd_set,
            &self.cmd_touch,
            &self.cmd_flush,
            &self.get_hits,
            &self.get_misses,
            &self.get_expired,
            &self.get_flushed,
            &self.delete_hits,
            &self.delete_misses,
            &self.incr_hits,
            &self.incr_misses,
            &self.decr_hits,
            &self.decr_misses,
            &self.cas_hits,
            &self.cas_misses,
            &self.cas_badval,
            &self.touch_hits,
            &self.touch_misses,
            &self.cmd_meta,
            &self.lru_crawler_starts,
            &self.crawler_reclaimed,
            &self.store_too_large,
            &self.store_no_memory,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The store.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store, StoreOutcome};
/// let s = Store::new(1 << 20, 1);
/// assert!(matches!(s.store(SetMode::Set, b"k", 7, Deadline::Never, b"v", None), StoreOutcome::Stored(_)));
/// let mut got = Vec::new();
/// assert!(s.get(b"k", None, |it, _| got.extend_from_slice(&it.value)));
/// assert_eq!(got, b"v");
/// ```
#[derive(Debug)]
pub struct Store {
    shards: Box<[SpinLock<Shard>]>,
    mask: u64,
    clock: Clock,
    next_cas: AtomicU64,
    cas_floor: AtomicU64,
    /// Whether clients see CAS values (memcached's `-C` turns them off).
    cas_enabled: AtomicBool,
    flush_at: AtomicU64,
    /// The last `flush_all`'s cut-off in memcached's time base, as its
    /// `stats settings` shows it (0: none).
    oldest_live: AtomicU64,
    limit: AtomicU64,
    /// The item size limit (`-I`), as [`item_size`] counts an item.
    item_max: AtomicU64,
    /// The server second of the last sweep of every shard's LRU tail.
    swept_at: AtomicU32,
    /// Request counters.
    pub ops: OpCounters,
    /// The `watch` log.
    pub watch: Arc<Watch>,
}

/// An item's size as memcached 1.6 counts it against the item size limit
/// (`-I`): its 48-byte header, an 8-byte CAS, the key and its terminator,
/// the client flags when not zero, and the value with its CRLF. With
/// `-I 1m` the largest value under key `k` and flags 0 is 1 048 516 bytes.
///
/// ```
/// assert_eq!(corewise_kv::store::item_size(1, 0, 1_048_516), 1 << 20);
/// ```
pub fn item_size(nkey: usize, flags: u32, nvalue: usize) -> usize {
    item_size_for(true, nkey, flags, nvalue)
}

/// [`item_size`] in a server with CAS values (`cas`) or without (`-C`,
/// where memcached's items lack the 8-byte CAS: with `-I 1m` the largest
/// value under key `k` and flags 0 is then 1 048 524 bytes).
///
/// ```
/// use corewise_kv::store::item_size_for;
/// assert_eq!(item_size_for(false, 1, 0, 1_048_524), 1 << 20);
/// assert_eq!(item_size_for(true, 1, 0, 1_048_516), 1 << 20);
/// ```
pub fn item_size_for(cas: bool, nkey: usize, flags: u32, nvalue: usize) -> usize {
    let suffix = if flags == 0 { 0 } else { 4 };
    let cas = if cas { 8 } else { 0 };
    (48 + cas + nkey + 1 + suffix + 2).saturating_add(nvalue)
}

impl Store {
    /// A store holding at most `limit` bytes in `shards` shards (rounded
    /// up to a power of two, at least 1).
    ///
    /// ```
    /// use corewise_kv::store::Store;
    /// let s = Store::new(64 << 20, 3); // 3 shards: rounded up to 4
    /// assert_eq!(s.limit(), 64 << 20);
    /// assert_eq!(s.stats().curr_items, 0);
    /// ```
    pub fn new(limit: usize, shards: usize) -> Self {
        let n = shards.clamp(1, 1024).next_power_of_two();
        let per = limit / n;
        let watch = Arc::new(Watch::default());
        Self {
            shards: (0..n)
                .map(|_| SpinLock::new(Shard::watched(per, Arc::clone(&watch))))
                .collect(),
            mask: n as u64 - 1,
            clock: Clock::new(),
            next_cas: AtomicU64::new(1),
            cas_floor: AtomicU64::new(0),
            cas_enabled: AtomicBool::new(true),
            oldest_live: AtomicU64::new(0),
            flush_at: AtomicU64::new(0),
            limit: AtomicU64::new(limit as u64),
            item_max: AtomicU64::new(u64::MAX),
            swept_at: AtomicU32::new(0),
            ops: OpCounters::default(),
            watch,
        }
    }

    /// The shard count that suits a memory limit and item size limit: up to
    /// 64 shards, each able to hold at least four maximal items.
    ///
    /// ```
    /// use corewise_kv::store::Store;
    /// assert_eq!(Store::shards_for(64 << 20, 1 << 20), 15);
    /// assert_eq!(Store::shards_for(1 << 30, 1 << 20), 64); // at most 64
    /// assert_eq!(Store::shards_for(1 << 20, 1 << 20), 1); // at least 1
    /// ```
    pub fn shards_for(limit: usize, item_max: usize) -> usize {
        let per = item_max
            .saturating_add(ITEM_OVERHEAD + 512)
            .saturating_mul(4)
            .max(1);
        (limit / per).clamp(1, 64)
    }

    /// The server clock.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, Store};
    /// let s = Store::new(1 << 20, 1);
    /// assert_eq!(s.clock().now(), 1); // server seconds start at 1
    /// assert_eq!(s.clock().deadline(0), Deadline::Never);
    /// ```
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The memory limit.
    ///
    /// ```
    /// use corewise_kv::store::Store;
    /// assert_eq!(Store::new(8 << 20, 2).limit(), 8 << 20);
    /// ```
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed) as usize
    }

    /// Changes the memory limit (`cache_memlimit`); shrinking evicts.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// for i in 0..100 {
    ///     s.store(SetMode::Set, format!("k{i}").as_bytes(), 0, Deadline::Never, &[0; 1000], None);
    /// }
    /// s.set_limit(10_000); // shrinking evicts
    /// assert_eq!(s.limit(), 10_000);
    /// assert!(s.stats().bytes <= 10_000);
    /// assert!(s.stats().counters.evictions > 0);
    /// ```
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit as u64, Ordering::Relaxed);
        let per = limit / self.shards.len();
        let now = self.clock.now();
        for sh in self.shards.iter() {
            sh.lock().set_limit(per, now);
        }
    }

    fn shard(&self, key: &[u8]) -> &SpinLock<Shard> {
        let i = (hash_key(key) >> 40) & self.mask;
        &self.shards[i as usize]
    }

    /// Once per server second, frees the expired items at the LRU tail of
    /// every shard. Each insert reclaims its own shard's tail; this makes
    /// the memory of expired items in shards that see no insert reusable
    /// too, as memcached's one LRU per slab class (and its LRU maintainer)
    /// makes every expired item's memory reusable by any new item.
    fn sweep_tails(&self, now: u32) {
        if self.shards.len() == 1 {
            return;
        }
        let last = self.swept_at.load(Ordering::Relaxed);
        if last >= now
            || self
                .swept_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for sh in self.shards.iter() {
            sh.lock().reclaim_tail(now);
        }
    }

    fn new_cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Ordering::Relaxed)
    }

    /// Turns CAS values off for clients, as memcached's `-C` does: every
    /// item shows CAS 0 (`gets`, `mg c`, the binary header), a `cas` (or
    /// `ms C` in set or replace mode) finds no match (`EXISTS` on an
    /// existing item, `NOT_FOUND` otherwise), an append's compare value is
    /// ignored, and the compare values of `ma`, `md` and the binary
    /// delete and counters match 0. Items still carry a sequence number
    /// inside the store. A `flush_all` then drops what is stored in the
    /// rest of its second too (its cut-off is that second, where with CAS
    /// values it is the second before), as memcached's does without CAS.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, DeleteOutcome, SetMode, Store, StoreOutcome};
    /// let s = Store::new(1 << 20, 1);
    /// s.set_cas_enabled(false);
    /// assert!(!s.cas_enabled());
    /// assert_eq!(s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None), StoreOutcome::Stored(0));
    /// assert_eq!(s.store(SetMode::Set, b"k", 0, Deadline::Never, b"w", Some(0)), StoreOutcome::Exists);
    /// assert_eq!(s.store(SetMode::Set, b"gone", 0, Deadline::Never, b"w", Some(0)), StoreOutcome::NotFound);
    /// assert_eq!(s.delete(b"k", Some(0)), DeleteOutcome::Deleted);
    /// ```
    pub fn set_cas_enabled(&self, on: bool) {
        self.cas_enabled.store(on, Ordering::Relaxed);
    }

    /// The last `flush_all`'s cut-off (items stored up to and during it
    /// are gone once it comes) in memcached's time base, as `stats
    /// settings`' `oldest` shows it: 0 before any flush.
    ///
    /// ```
    /// let s = corewise_kv::store::Store::new(1 << 20, 1);
    /// assert_eq!(s.oldest_live(), 0);
    /// s.flush(10);
    /// assert_eq!(s.oldest_live(), s.clock().memcached_time(s.clock().now()) + 9);
    /// ```
    pub fn oldest_live(&self) -> u64 {
        self.oldest_live.load(Ordering::Relaxed)
    }

    /// Whether clients see CAS values (see
    /// [`set_cas_enabled`](Self::set_cas_enabled)).
    ///
    /// ```
    /// assert!(corewise_kv::store::Store::new(1 << 20, 1).cas_enabled());
    /// ```
    pub fn cas_enabled(&self) -> bool {
        self.cas_enabled.load(Ordering::Relaxed)
    }

    /// The CAS value a client sees for an item whose sequence number is
    /// `cas`: itself, or 0 when CAS is off.
    ///
    /// ```
    /// let s = corewise_kv::store::Store::new(1 << 20, 1);
    /// assert_eq!(s.shown_cas(7), 7);
    /// s.set_cas_enabled(false);
    /// assert_eq!(s.shown_cas(7), 0);
    /// ```
    #[inline]
    pub fn shown_cas(&self, cas: u64) -> u64 {
        if self.cas_enabled() {
            cas
        } else {
            0
        }
    }

    /// [`item_size`] as this server counts items (with or without the
    /// CAS bytes, see [`set_cas_enabled`](Self::set_cas_enabled)).
    ///
    /// ```
    /// use corewise_kv::store::{item_size, Store};
    /// let s = Store::new(1 << 20, 1);
    /// assert_eq!(s.size_of_item(1, 0, 10), item_size(1, 0, 10));
    /// s.set_cas_enabled(false);
    /// assert_eq!(s.size_of_item(1, 0, 10), item_size(1, 0, 10) - 8);
    /// ```
    pub fn size_of_item(&self, nkey: usize, flags: u32, nvalue: usize) -> usize {
        item_size_for(self.cas_enabled(), nkey, flags, nvalue)
    }

    /// A new item, counted as this server's items are (with or without
    /// the CAS bytes).
    fn item(
        &self,
        key: &[u8],
        value: Vec<u8>,
        flags: u32,
        exptime: u32,
        cas: u64,
        now: u32,
    ) -> Item {
        let mut it = Item::new(key, value, flags, exptime, cas, now);
        it.set_has_cas(self.cas_enabled());
        it
    }

    /// Whether a request's compare value (if any) matches an item whose
    /// sequence number is `cas`, as the client sees it.
    #[inline]
    fn matches(&self, compare: Option<u64>, cas: u64) -> bool {
        compare.is_none_or(|c| c == self.shown_cas(cas))
    }

    /// (now, cas floor), applying a pending flush whose cut-off second has
    /// come. memcached drops every item last stored at or before the
    /// cut-off, including those stored during that second; here the floor
    /// is raised over every CAS handed out so far at each request in that
    /// second and once more at the first request after it, which then
    /// ends the flush. No CAS is used up (memcached takes none then).
    fn now_floor(&self) -> (u32, u64) {
        let now = self.clock.now();
        let at = self.flush_at.load(Ordering::Relaxed);
        if at != 0 && u64::from(now) >= at {
            let handed_out = self.next_cas.load(Ordering::Acquire).saturating_sub(1);
            self.cas_floor.fetch_max(handed_out, Ordering::AcqRel);
            if u64::from(now) > at {
                let _ = self
                    .flush_at
                    .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
        (now, self.cas_floor.load(Ordering::Acquire))
    }

    /// Reads `key`: calls `f` with the item (and what it was before this
    /// read) and returns true on a hit. `touch` also sets a new expiry
    /// (gat, mg T); a past deadline makes the item expire after this read.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 3, Deadline::Never, b"value", None);
    /// let mut flags = 0;
    /// assert!(s.get(b"k", None, |it, _| flags = it.flags));
    /// assert_eq!(flags, 3);
    /// assert!(!s.get(b"other", None, |_, _| unreachable!()));
    /// // Get-and-touch with a past deadline: served once, then gone.
    /// assert!(s.get(b"k", Some(Deadline::Past), |_, _| {}));
    /// assert!(!s.get(b"k", None, |_, _| {}));
    /// ```
    pub fn get(&self, key: &[u8], touch: Option<Deadline>, f: impl FnOnce(&Item, Before)) -> bool {
        let (now, floor) = self.now_floor();
        // As memcached 1.6.18 counts: a get-and-touch is a touch, not a get.
        bump(if touch.is_some() {
            &self.ops.cmd_touch
        } else {
            &self.ops.cmd_get
        });
        let mut shard = self.shard(key).lock();
        match shard.lookup(key, now, floor, true) {
            Ok(it) => {
                let before = Before {
                    fetched: it.fetched,
                    idle: now.saturating_sub(it.last_access),
                };
                it.note_fetch(now);
                match touch {
                    Some(Deadline::Never) => it.exptime = 0,
                    Some(Deadline::At(t)) => it.exptime = t,
                    Some(Deadline::Past) => it.exptime = now,
                    None => {}
                }
                let cls = it.class();
                f(it, before);
                if touch.is_some() {
                    shard.class_op(cls, |c| &mut c.touch_hits);
                } else {
                    shard.class_op(cls, |c| &mut c.get_hits);
                }
                drop(shard);
                bump(if touch.is_some() {
                    &self.ops.touch_hits
                } else {
                    &self.ops.get_hits
                });
                true
            }
            Err(m) => {
                drop(shard);
                bump(if touch.is_some() {
                    &self.ops.touch_misses
                } else {
                    &self.ops.get_misses
                });
                match m {
                    Miss::Expired => bump(&self.ops.get_expired),
                    Miss::Flushed => bump(&self.ops.get_flushed),
                    Miss::Absent => {}
                }
                false
            }
        }
    }

    /// A meta get (`mg`): like [`get`](Self::get), but `f` may change the
    /// item (expiry, win token) in place, `vivify` creates an empty item on
    /// a miss (`N`; `f` is then told it `created` it), and `bump` false
    /// leaves the item's fetched mark and last access alone (`u`). A hit
    /// counts as a touch when `touch` (`T`), as a get otherwise; a miss as
    /// a get (memcached's counting). Returns false on a miss that was not
    /// vivified.
    ///
    /// ```
    /// use corewise_kv::store::Store;
    /// let s = Store::new(1 << 20, 1);
    /// let mut first = None;
    /// assert!(s.meta_get(b"k", true, true, false, |it, v| { first = Some(v.created); it.token_sent = true; }));
    /// assert_eq!(first, Some(true));
    /// assert!(s.meta_get(b"k", true, true, false, |it, v| assert!(!v.created && it.token_sent)));
    /// ```
    pub fn meta_get(
        &self,
        key: &[u8],
        vivify: bool,
        bump_item: bool,
        touch: bool,
        f: impl FnOnce(&mut Item, MetaView),
    ) -> bool {
        let (now, floor) = self.now_floor();
        let mut shard = self.shard(key).lock();
        let mut miss = None;
        let mut created = false;
        let found = match shard.lookup(key, now, floor, bump_item) {
            Ok(it) => Some(it),
            Err(m) => {
                miss = Some(m);
                None
            }
        };
        // A hit is looked up once; a vivified miss again after its insert.
        let found = match found {
            Some(it) => Some(it),
            None if vivify => {
                let item = self.item(key, Vec::new(), 0, 0, self.new_cas(), now);
                created = shard.insert(item, now);
                if created {
                    shard.lookup(key, now, floor, bump_item).ok()
                } else {
                    None
                }
            }
            None => None,
        };
        let Some(it) = found else {
            drop(shard);
            bump(&self.ops.cmd_get);
            bump(&self.ops.get_misses);
            match miss {
                Some(Miss::Expired) => bump(&self.ops.get_expired),
                Some(Miss::Flushed) => bump(&self.ops.get_flushed),
                _ => {}
            }
            return false;
        };
        let before = Before {
            fetched: it.fetched,
            idle: now.saturating_sub(it.last_access),
        };
        if bump_item {
            it.note_fetch(now);
        }
        let view = MetaView {
            before,
            created,
            now,
        };
        let cls = it.class();
        f(it, view);
        if touch {
            shard.class_op(cls, |c| &mut c.touch_hits);
        } else {
            shard.class_op(cls, |c| &mut c.get_hits);
        }
        drop(shard);
        if touch {
            bump(&self.ops.cmd_touch);
            bump(&self.ops.touch_hits);
        } else {
            bump(&self.ops.cmd_get);
            bump(&self.ops.get_hits);
        }
        true
    }

    /// Marks `key` stale instead of deleting it (`md ... I`): a new CAS, the
    /// win token cleared so the next reader wins, and a new expiry when
    /// `ttl` is given. `compare` must match the CAS when given.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, DeleteOutcome, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
    /// assert_eq!(s.invalidate(b"k", None, None), DeleteOutcome::Deleted);
    /// assert!(s.meta_get(b"k", false, true, false, |it, _| assert!(it.stale)));
    /// ```
    pub fn invalidate(
        &self,
        key: &[u8],
        compare: Option<u64>,
        ttl: Option<Deadline>,
    ) -> DeleteOutcome {
        let (now, floor) = self.now_floor();
        let mut shard = self.shard(key).lock();
        let Ok(it) = shard.lookup(key, now, floor, false) else {
            drop(shard);
            bump(&self.ops.delete_misses);
            return DeleteOutcome::NotFound;
        };
        if !self.matches(compare, it.cas) {
            drop(shard);
            bump(&self.ops.delete_misses);
            return DeleteOutcome::Exists;
        }
        if let Some(d) = ttl {
            it.exptime = exptime_at(d, now);
        }
        it.stale = true;
        it.token_sent = false;
        it.cas = self.new_cas();
        DeleteOutcome::Deleted
    }

    /// Empties `key`'s value but keeps the item (`md ... x`, newer than
    /// memcached 1.6.18; done as memcached's `process_mdelete_cmd` does
    /// it): a new item with no value, client flags `flags`, expiry
    /// `deadline` and the old item's CAS, or `meta.new_cas` (`E`). With
    /// `meta.invalidate` (`I`) it is then marked stale as
    /// [`invalidate`](Self::invalidate) marks an item (a new CAS unless
    /// `meta.new_cas`), and not counted as a delete. `compare` must match
    /// the CAS when given.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, DeleteOutcome, MetaStore, SetMode, Store, StoreOutcome};
    /// let s = Store::new(1 << 20, 1);
    /// let StoreOutcome::Stored(cas) = s.store(SetMode::Set, b"k", 5, Deadline::At(100), b"value", None) else { panic!() };
    /// let keep = MetaStore::default();
    /// assert_eq!(s.clear_value(b"k", Some(cas + 1), 0, Deadline::Never, keep), DeleteOutcome::Exists);
    /// assert_eq!(s.clear_value(b"k", Some(cas), 7, Deadline::Never, keep), DeleteOutcome::Deleted);
    /// assert!(s.get(b"k", None, |it, _| {
    ///     assert_eq!((it.value.len(), it.flags, it.exptime, it.cas), (0, 7, 0, cas));
    /// }));
    /// assert_eq!(s.clear_value(b"gone", None, 0, Deadline::Never, keep), DeleteOutcome::NotFound);
    /// // Counted as memcached counts it: a hit, and two misses.
    /// use std::sync::atomic::Ordering::Relaxed;
    /// assert_eq!((s.ops.delete_hits.load(Relaxed), s.ops.delete_misses.load(Relaxed)), (1, 2));
    /// ```
    pub fn clear_value(
        &self,
        key: &[u8],
        compare: Option<u64>,
        flags: u32,
        deadline: Deadline,
        meta: MetaStore,
    ) -> DeleteOutcome {
        let (now, floor) = self.now_floor();
        let mut shard = self.shard(key).lock();
        let found = shard.lookup(key, now, floor, false).map(|it| it.cas);
        let old_cas = match found {
            Ok(cas) if self.matches(compare, cas) => cas,
            _ => {
                drop(shard);
                bump(&self.ops.delete_misses);
                return if found.is_ok() {
                    DeleteOutcome::Exists
                } else {
                    DeleteOutcome::NotFound
                };
            }
        };
        let new_cas = meta.new_cas.filter(|_| self.cas_enabled());
        let cas = new_cas.unwrap_or(old_cas);
        let mut item = self.item(key, Vec::new(), flags, exptime_at(deadline, now), cas, now);
        if meta.invalidate {
            item.stale = true;
            item.cas = new_cas.unwrap_or_else(|| self.new_cas());
        }
        let cls = item.class();
        // Only an empty item too large for an empty shard fails to fit
        // (never, for a key of at most 250 bytes): the key is gone then.
        if shard.insert(item, now) && !meta.invalidate {
            shard.class_op(cls, |c| &mut c.delete_hits);
            drop(shard);
            bump(&self.ops.delete_hits);
        }
        DeleteOutcome::Deleted
    }

    /// A storage request. `compare` is the CAS a `cas` (or `ms C`) request
    /// carries; `new_cas` an explicit CAS to give the item (`ms E`).
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store, StoreOutcome};
    /// let s = Store::new(1 << 20, 1);
    /// let r = s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
    /// assert!(matches!(r, StoreOutcome::Stored(_)));
    /// // Storing with a past deadline answers success but removes the item.
    /// assert!(matches!(s.store(SetMode::Set, b"k", 0, Deadline::Past, b"v", None), StoreOutcome::Stored(_)));
    /// assert!(!s.get(b"k", None, |_, _| {}));
    /// ```
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        flags: u32,
        deadline: Deadline,
        data: &[u8],
        compare: Option<u64>,
    ) -> StoreOutcome {
        self.store_with(
            mode,
            key,
            flags,
            deadline,
            data,
            compare,
            MetaStore::default(),
        )
    }

    /// Sets the item size limit an append or prepend must respect (a
    /// longer result is not stored, as in memcached); none by default.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store, StoreOutcome};
    /// let s = Store::new(1 << 20, 1);
    /// s.set_item_max(100);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, &[b'a'; 40], None);
    /// let r = s.store(SetMode::Append, b"k", 0, Deadline::Never, &[b'a'; 40], None);
    /// assert_eq!(r, StoreOutcome::NotStored);
    /// ```
    pub fn set_item_max(&self, n: usize) {
        self.item_max.store(n as u64, Ordering::Relaxed);
    }

    /// Lets stores evict other items to make room (the default), or not
    /// (memcached's `-M`): a store that does not fit then answers
    /// [`StoreOutcome::NoMemory`], and only a `set` loses the key's old
    /// value, as in memcached.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store, StoreOutcome};
    /// let s = Store::new(1 << 20, 1);
    /// s.set_evictions(false);
    /// assert!(!s.evictions());
    /// let big = vec![0u8; 600 << 10];
    /// assert!(matches!(s.store(SetMode::Set, b"a", 0, Deadline::Never, &big, None), StoreOutcome::Stored(_)));
    /// assert_eq!(s.store(SetMode::Set, b"b", 0, Deadline::Never, &big, None), StoreOutcome::NoMemory);
    /// assert!(s.get(b"a", None, |_, _| {}), "nothing was evicted");
    /// ```
    pub fn set_evictions(&self, on: bool) {
        for sh in self.shards.iter() {
            sh.lock().set_evict(on);
        }
    }

    /// Whether stores may evict (see [`set_evictions`](Self::set_evictions)).
    pub fn evictions(&self) -> bool {
        self.shards.iter().all(|sh| sh.lock().evicts())
    }

    /// [`store`](Self::store) with the meta set's options (an explicit new
    /// CAS, invalidation).
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, MetaStore, SetMode, Store, StoreOutcome};
    /// let s = Store::new(1 << 20, 1);
    /// let StoreOutcome::Stored(old) = s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v1", None) else { panic!() };
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v2", None);
    /// // With invalidation, a store carrying an older CAS still lands, as stale.
    /// let meta = MetaStore { invalidate: true, ..MetaStore::default() };
    /// let r = s.store_with(SetMode::Set, b"k", 0, Deadline::Never, b"v0", Some(old), meta);
    /// assert!(matches!(r, StoreOutcome::Stored(_)));
    /// assert!(s.get(b"k", None, |it, _| assert!(it.stale && it.value[..] == b"v0"[..])));
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn store_with(
        &self,
        mode: SetMode,
        key: &[u8],
        flags: u32,
        deadline: Deadline,
        data: &[u8],
        compare: Option<u64>,
        meta: MetaStore,
    ) -> StoreOutcome {
        let cas_on = self.cas_enabled();
        let new_cas = meta.new_cas.filter(|_| cas_on);
        // As memcached's `do_store_item` reads a compare value: in set and
        // replace mode it makes the request a `cas` (which never matches
        // with CAS off); an append or prepend must match it (unless CAS is
        // off, or it is 0); an add ignores it.
        let cas_request = compare.filter(|_| matches!(mode, SetMode::Set | SetMode::Replace));
        let append_compare = compare
            .filter(|&c| c != 0 && cas_on && matches!(mode, SetMode::Append | SetMode::Prepend));
        let (now, floor) = self.now_floor();
        bump(&self.ops.cmd_set);
        self.sweep_tails(now);
        let mut shard = self.shard(key).lock();
        shard.class_op(
            slabs::class_of(self.size_of_item(key.len(), flags, data.len())),
            |c| &mut c.cmd_set,
        );
        let existing = shard.lookup(key, now, floor, false).ok();
        let old_cls = existing.as_ref().map_or(0, |it| it.class());
        // `ms ... I C<older>`: stored, but stale, keeping expiry and token.
        let mut keep = None;
        if let Some(c) = cas_request {
            match &existing {
                None => {
                    drop(shard);
                    bump(&self.ops.cas_misses);
                    return StoreOutcome::NotFound;
                }
                Some(it) if cas_on && meta.invalidate && c != 0 && c < it.cas => {
                    keep = Some((it.exptime, it.token_sent));
                }
                Some(it) if !cas_on || it.cas != c => {
                    shard.class_op(old_cls, |c| &mut c.cas_badval);
                    drop(shard);
                    bump(&self.ops.cas_badval);
                    return StoreOutcome::Exists;
                }
                Some(_) => {}
            }
        }
        if let (Some(c), Some(it)) = (append_compare, &existing) {
            if it.cas != c {
                return StoreOutcome::Exists;
            }
        }
        let present = existing.is_some();
        let ok = match mode {
            SetMode::Set => true,
            SetMode::Add => !present,
            SetMode::Replace | SetMode::Append | SetMode::Prepend => present,
        };
        if !ok {
            return StoreOutcome::NotStored;
        }
        let cas = new_cas.unwrap_or_else(|| self.new_cas());
        let item = match (mode, existing) {
            (SetMode::Append | SetMode::Prepend, Some(old)) => {
                let size = self.size_of_item(key.len(), old.flags, old.value.len() + data.len());
                if size as u64 > self.item_max.load(Ordering::Relaxed) {
                    return StoreOutcome::NotStored;
                }
                let mut v = Vec::with_capacity(old.value.len() + data.len());
                if mode == SetMode::Append {
                    v.extend_from_slice(&old.value);
                    v.extend_from_slice(data);
                } else {
                    v.extend_from_slice(data);
                    v.extend_from_slice(&old.value);
                }
                self.item(key, v, old.flags, old.exptime, cas, now)
            }
            _ => {
                let exptime = match deadline {
                    Deadline::Never => 0,
                    Deadline::At(t) => t,
                    Deadline::Past => {
                        shard.remove(key);
                        if cas_request.is_some() {
                            shard.class_op(old_cls, |c| &mut c.cas_hits);
                        }
                        drop(shard);
                        if cas_request.is_some() {
                            bump(&self.ops.cas_hits);
                        }
                        return StoreOutcome::Stored(self.shown_cas(cas));
                    }
                };
                let mut it = self.item(key, data.to_vec(), flags, exptime, cas, now);
                if let Some((exptime, token_sent)) = keep {
                    it.exptime = exptime;
                    it.stale = true;
                    it.token_sent = token_sent;
                }
                it
            }
        };
        let ntotal = item.ntotal();
        // Without evictions, a store that does not fit leaves the old value
        // (memcached removes it only for `set`, which `insert` does).
        if mode != SetMode::Set && !shard.evicts() && !shard.fits(key, item.size(), now) {
            shard.count_out_of_memory(ntotal);
            drop(shard);
            bump(&self.ops.store_no_memory);
            return StoreOutcome::NoMemory;
        }
        let stored = shard.insert(item, now);
        if !stored {
            shard.count_out_of_memory(ntotal);
            drop(shard);
            bump(&self.ops.store_no_memory);
            return StoreOutcome::NoMemory;
        }
        if cas_request.is_some() {
            shard.class_op(old_cls, |c| &mut c.cas_hits);
        }
        drop(shard);
        if cas_request.is_some() {
            bump(&self.ops.cas_hits);
        }
        StoreOutcome::Stored(self.shown_cas(cas))
    }

    /// incr (`incr` true) or decr by `delta`. Increments wrap at 2^64,
    /// decrements stop at 0. As in memcached, a result no longer than the
    /// value is written over it and padded with spaces (the value keeps
    /// its length; the item gets a new CAS all the same), and a longer one
    /// replaces it at its own length. `create` makes a missing item with
    /// this initial value and expiry (meta `ma N`); `compare` is `ma C`.
    ///
    /// ```
    /// use corewise_kv::store::{ArithOutcome, Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"n", 0, Deadline::Never, b"1", None);
    /// assert!(matches!(s.arith(b"n", true, 41, None, None), ArithOutcome::Value(42, _)));
    /// assert!(matches!(s.arith(b"n", false, 100, None, None), ArithOutcome::Value(0, _))); // stops at 0
    /// assert!(s.get(b"n", None, |it, _| assert_eq!(it.value[..], b"0 "[..]))); // padded
    /// // Created on a miss when asked.
    /// assert!(matches!(s.arith(b"m", true, 1, Some((9, Deadline::Never)), None), ArithOutcome::Value(9, _)));
    /// ```
    pub fn arith(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        create: Option<(u64, Deadline)>,
        compare: Option<u64>,
    ) -> ArithOutcome {
        self.arith_facts(key, incr, delta, create, compare).0
    }

    /// [`arith`](Self::arith), and for a counter it changed or created,
    /// its expiry and whether this call created it (what `ma`'s `t` flag
    /// and quiet mode need).
    ///
    /// ```
    /// use corewise_kv::store::{ArithOutcome, Deadline, Store};
    /// let s = Store::new(1 << 20, 1);
    /// let (r, facts) = s.arith_facts(b"n", true, 1, Some((5, Deadline::Never)), None);
    /// assert!(matches!(r, ArithOutcome::Value(5, _)));
    /// assert_eq!(facts.map(|f| (f.exptime, f.created)), Some((0, true)));
    /// let (r, facts) = s.arith_facts(b"n", true, 1, None, None);
    /// assert!(matches!(r, ArithOutcome::Value(6, _)));
    /// assert_eq!(facts.map(|f| f.created), Some(false));
    /// ```
    pub fn arith_facts(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        create: Option<(u64, Deadline)>,
        compare: Option<u64>,
    ) -> (ArithOutcome, Option<CounterFacts>) {
        let (now, floor) = self.now_floor();
        let (hits, misses) = if incr {
            (&self.ops.incr_hits, &self.ops.incr_misses)
        } else {
            (&self.ops.decr_hits, &self.ops.decr_misses)
        };
        let mut shard = self.shard(key).lock();
        match shard.lookup(key, now, floor, true) {
            Ok(it) => {
                // A compare value of 0 is none (memcached's `do_add_delta`).
                if !self.matches(compare.filter(|&c| c != 0), it.cas) {
                    return (ArithOutcome::Exists, None);
                }
                let Some(v) = parse_counter(&it.value) else {
                    return (ArithOutcome::NonNumeric, None);
                };
                let v = if incr {
                    v.wrapping_add(delta)
                } else {
                    v.saturating_sub(delta)
                };
                let (old, cls) = (it.size(), it.class());
                write_counter(&mut it.value, v);
                it.cas = self.new_cas();
                it.last_access = now;
                let cas = it.cas;
                let facts = CounterFacts {
                    exptime: it.exptime,
                    created: false,
                };
                shard.resized(key, old, now);
                if incr {
                    shard.class_op(cls, |c| &mut c.incr_hits);
                } else {
                    shard.class_op(cls, |c| &mut c.decr_hits);
                }
                drop(shard);
                bump(hits);
                (ArithOutcome::Value(v, self.shown_cas(cas)), Some(facts))
            }
            Err(_) => {
                // A miss that creates the counter is not counted (memcached).
                let Some((initial, deadline)) = create else {
                    bump(misses);
                    return (ArithOutcome::NotFound, None);
                };
                let exptime = match deadline {
                    Deadline::Never => 0,
                    Deadline::At(t) => t,
                    Deadline::Past => now,
                };
                let cas = self.new_cas();
                let item = self.item(key, initial.to_string().into_bytes(), 0, exptime, cas, now);
                if shard.insert(item, now) {
                    let facts = CounterFacts {
                        exptime,
                        created: true,
                    };
                    (
                        ArithOutcome::Value(initial, self.shown_cas(cas)),
                        Some(facts),
                    )
                } else {
                    (ArithOutcome::NotFound, None)
                }
            }
        }
    }

    /// Removes `key` without counting a delete (a store that failed for
    /// its size must not leave the old value behind).
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// use std::sync::atomic::Ordering::Relaxed;
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
    /// s.remove(b"k");
    /// assert!(!s.get(b"k", None, |_, _| {}));
    /// assert_eq!(s.ops.delete_hits.load(Relaxed), 0); // not counted as a delete
    /// ```
    pub fn remove(&self, key: &[u8]) {
        self.shard(key).lock().remove(key);
    }

    /// Deletes `key` (only if its CAS is `compare`, when given).
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, DeleteOutcome, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
    /// assert_eq!(s.delete(b"k", None), DeleteOutcome::Deleted);
    /// assert_eq!(s.delete(b"k", None), DeleteOutcome::NotFound);
    /// ```
    pub fn delete(&self, key: &[u8], compare: Option<u64>) -> DeleteOutcome {
        let (now, floor) = self.now_floor();
        let mut shard = self.shard(key).lock();
        let (cas, cls) = match shard.lookup(key, now, floor, false) {
            Ok(it) => (it.cas, it.class()),
            Err(_) => {
                drop(shard);
                bump(&self.ops.delete_misses);
                return DeleteOutcome::NotFound;
            }
        };
        if !self.matches(compare, cas) {
            return DeleteOutcome::Exists;
        }
        shard.remove(key);
        shard.class_op(cls, |c| &mut c.delete_hits);
        drop(shard);
        bump(&self.ops.delete_hits);
        DeleteOutcome::Deleted
    }

    /// Sets a new expiry on `key`; false if absent.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
    /// assert!(s.touch(b"k", Deadline::At(500)));
    /// assert_eq!(s.inspect(b"k").map(|i| i.0), Some(499)); // seconds left
    /// assert!(!s.touch(b"missing", Deadline::Never));
    /// ```
    pub fn touch(&self, key: &[u8], deadline: Deadline) -> bool {
        let (now, floor) = self.now_floor();
        bump(&self.ops.cmd_touch);
        let mut shard = self.shard(key).lock();
        let hit = match shard.lookup(key, now, floor, true) {
            Ok(it) => {
                it.exptime = exptime_at(deadline, now);
                let cls = it.class();
                shard.class_op(cls, |c| &mut c.touch_hits);
                true
            }
            Err(_) => false,
        };
        drop(shard);
        bump(if hit {
            &self.ops.touch_hits
        } else {
            &self.ops.touch_misses
        });
        hit
    }

    /// `flush_all <exptime>` (binary flush with its expiration), by
    /// memcached 1.6.18's rule (see [`Clock::flush_cutoff`]): every item
    /// last stored at or before the cut-off second is gone once that
    /// second comes, items stored during it too. A cut-off already here
    /// (no delay, a delay of 1, a past time) takes effect at once and
    /// frees the items now; a later one waits, replacing any flush that
    /// was waiting; an absolute time long past flushes nothing and cancels
    /// a waiting flush. Like memcached, a flush that takes effect at once
    /// or does nothing uses up one CAS value.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 2);
    /// s.store(SetMode::Set, b"a", 0, Deadline::Never, b"1", None);
    /// s.flush(1000); // a cut-off 999 seconds away: nothing changes yet
    /// assert!(s.get(b"a", None, |_, _| {}));
    /// s.flush(0); // now
    /// assert!(!s.get(b"a", None, |_, _| {}));
    /// assert_eq!(s.stats().curr_items, 0);
    /// // A delay of 1 also drops what is stored later in this second.
    /// s.store(SetMode::Set, b"b", 0, Deadline::Never, b"2", None);
    /// s.flush(1);
    /// s.store(SetMode::Set, b"c", 0, Deadline::Never, b"3", None);
    /// assert!(!s.get(b"b", None, |_, _| {}));
    /// assert!(!s.get(b"c", None, |_, _| {}));
    /// ```
    pub fn flush(&self, exptime: i64) {
        bump(&self.ops.cmd_flush);
        let now = self.clock.now();
        let cas_on = self.cas_enabled();
        // Without CAS values memcached takes the flush's own second as the
        // cut-off (`realtime(exptime)`, not one second less): what is
        // stored later in that second goes too.
        let cutoff = self
            .clock
            .flush_cutoff(exptime)
            .map(|c| c.saturating_add(u32::from(!cas_on)));
        // memcached's oldest_live: realtime(exptime), less one with CAS.
        let realtime = self.clock.memcached_realtime(exptime);
        self.oldest_live
            .store(realtime - u64::from(cas_on), Ordering::Relaxed);
        match cutoff {
            // Without CAS values a cut-off in the past drops only what was
            // last stored or bumped by then (with them, memcached drops
            // every item older than the flush's CAS: everything).
            Some(cutoff) if cutoff < now && !cas_on => {
                self.flush_at.store(0, Ordering::Release);
                for sh in self.shards.iter() {
                    sh.lock().remove_accessed_by(cutoff);
                }
            }
            Some(cutoff) if cutoff > now => {
                self.flush_at.store(u64::from(cutoff), Ordering::Release);
            }
            Some(cutoff) => {
                // Items stored later in this second go too when the
                // cut-off is this second.
                let pending = if cutoff == now { u64::from(cutoff) } else { 0 };
                self.flush_at.store(pending, Ordering::Release);
                let cas = self.new_cas();
                self.cas_floor.fetch_max(cas, Ordering::AcqRel);
                // A flush that takes effect now also frees the memory now,
                // one shard at a time, so `curr_items` and `bytes` say what
                // is there.
                for sh in self.shards.iter() {
                    sh.lock().clear();
                }
            }
            None => {
                self.flush_at.store(0, Ordering::Release);
                self.new_cas();
            }
        }
    }

    /// Totals over all shards.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 4);
    /// for k in [&b"a"[..], b"b", b"c"] {
    ///     s.store(SetMode::Set, k, 0, Deadline::Never, b"v", None);
    /// }
    /// let st = s.stats();
    /// assert_eq!(st.curr_items, 3);
    /// assert_eq!(st.oldest_age, 0);
    /// ```
    pub fn stats(&self) -> StoreStats {
        let now = self.clock.now();
        let mut s = StoreStats {
            limit_maxbytes: self.limit() as u64,
            ..StoreStats::default()
        };
        for sh in self.shards.iter() {
            let g = sh.lock();
            s.curr_items += g.len() as u64;
            s.bytes += g.requested() as u64;
            s.counters.evictions += g.counters.evictions;
            s.counters.evicted_unfetched += g.counters.evicted_unfetched;
            s.counters.reclaimed += g.counters.reclaimed;
            s.counters.expired_unfetched += g.counters.expired_unfetched;
            s.counters.total_items += g.counters.total_items;
            s.oldest_age = s.oldest_age.max(g.oldest_age(now));
        }
        s
    }

    /// Zeroes every counter (`stats reset`): the request counters, the
    /// item counters of every shard and slab class, and the `watch` log's.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// use std::sync::atomic::Ordering::Relaxed;
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
    /// s.reset_counters();
    /// assert_eq!(s.ops.cmd_set.load(Relaxed), 0);
    /// assert_eq!(s.stats().counters.total_items, 0);
    /// assert_eq!(s.stats().curr_items, 1); // the items stay
    /// ```
    pub fn reset_counters(&self) {
        self.ops.reset();
        for sh in self.shards.iter() {
            sh.lock().reset_counters();
        }
        self.watch.sent.store(0, Ordering::Relaxed);
        self.watch.skipped.store(0, Ordering::Relaxed);
    }

    /// Frees every expired or flushed item now (`lru_crawler crawl`).
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// use std::sync::atomic::Ordering::Relaxed;
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"live", 0, Deadline::Never, b"v", None);
    /// s.store(SetMode::Set, b"old", 0, Deadline::At(1), b"v", None); // expired: now is 1
    /// s.crawl();
    /// assert_eq!(s.ops.crawler_reclaimed.load(Relaxed), 1);
    /// assert_eq!(s.stats().curr_items, 1);
    /// ```
    pub fn crawl(&self) {
        let (now, floor) = self.now_floor();
        bump(&self.ops.lru_crawler_starts);
        for sh in self.shards.iter() {
            let n = sh.lock().reclaim_all(now, floor);
            self.ops.crawler_reclaimed.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Calls `f` with every live item, shard by shard, least recently
    /// used first (`lru_crawler metadump`); each shard is locked while its
    /// items are visited.
    ///
    /// ```
    /// use corewise_kv::store::{Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"first", 0, Deadline::Never, b"1", None);
    /// s.store(SetMode::Set, b"second", 0, Deadline::Never, b"2", None);
    /// let mut keys = Vec::new();
    /// s.for_each_item(|it| keys.push(it.key.to_vec()));
    /// assert_eq!(keys, vec![b"first".to_vec(), b"second".to_vec()]); // least recent first
    /// ```
    pub fn for_each_item(&self, mut f: impl FnMut(&Item)) {
        let (now, floor) = self.now_floor();
        bump(&self.ops.lru_crawler_starts);
        for sh in self.shards.iter() {
            let g = sh.lock();
            let items: Vec<&Item> = g.iter_lru().collect();
            for it in items.into_iter().rev() {
                if (it.exptime == 0 || it.exptime > now) && it.cas > floor {
                    f(it);
                }
            }
        }
    }

    /// Visits up to `limit` live items of slab class `class` (0: no
    /// limit), each shard's most recent first, for `stats cachedump`; the
    /// visitor returns false to stop early. Each shard is locked while its
    /// items are visited.
    ///
    /// ```
    /// use corewise_kv::store::{item_size, slabs::class_of, Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"small", 0, Deadline::Never, b"1", None);
    /// s.store(SetMode::Set, b"big", 0, Deadline::Never, &[0; 5000], None);
    /// let mut keys = Vec::new();
    /// s.for_each_in_class(class_of(item_size(3, 0, 5000)), 0, |it| {
    ///     keys.push(it.key.to_vec());
    ///     true
    /// });
    /// assert_eq!(keys, vec![b"big".to_vec()]);
    /// ```
    pub fn for_each_in_class(&self, class: usize, limit: usize, mut f: impl FnMut(&Item) -> bool) {
        let (now, floor) = self.now_floor();
        let mut left = if limit == 0 { usize::MAX } else { limit };
        for sh in self.shards.iter() {
            let g = sh.lock();
            for it in g.iter_lru() {
                if left == 0 {
                    return;
                }
                let live = (it.exptime == 0 || it.exptime > now) && it.cas > floor;
                if live && it.class() == class {
                    left -= 1;
                    if !f(it) {
                        return;
                    }
                }
            }
        }
    }

    /// Items and counters per slab class (index = class id; see
    /// [`slabs`]), from a walk over every shard.
    ///
    /// ```
    /// use corewise_kv::store::{item_size, slabs::class_of, Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, &[0; 500], None);
    /// let per_class = s.class_stats();
    /// let cls = class_of(item_size(1, 0, 500));
    /// assert_eq!(per_class[cls].number, 1);
    /// assert_eq!(per_class[cls].counters.cmd_set, 1);
    /// ```
    pub fn class_stats(&self) -> Vec<slabs::ClassStats> {
        let now = self.clock.now();
        let mut v = vec![slabs::ClassStats::default(); slabs::MAX_CLASSES + 1];
        for sh in self.shards.iter() {
            sh.lock().class_stats(now, &mut v);
        }
        v
    }

    /// The items stored, counted by size as [`item_size`] counts it,
    /// rounded up to a multiple of 32 bytes (`stats sizes`).
    ///
    /// ```
    /// use corewise_kv::store::{item_size, Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 2);
    /// s.store(SetMode::Set, b"a", 0, Deadline::Never, b"abc", None);
    /// s.store(SetMode::Set, b"b", 0, Deadline::Never, b"xyz", None);
    /// let size = item_size(1, 0, 3).div_ceil(32) * 32;
    /// assert_eq!(s.size_histogram().into_iter().collect::<Vec<_>>(), vec![(size, 2)]);
    /// ```
    pub fn size_histogram(&self) -> std::collections::BTreeMap<usize, u64> {
        let mut hist = std::collections::BTreeMap::new();
        for sh in self.shards.iter() {
            for it in sh.lock().iter_lru() {
                *hist.entry(it.ntotal().div_ceil(32) * 32).or_insert(0) += 1;
            }
        }
        hist
    }

    /// Debug view of one item without touching it (meta `me`): (expiry
    /// left or -1, seconds since last access, cas, fetched, item size as
    /// [`item_size`] counts it, which is what memcached's `me` reports).
    ///
    /// ```
    /// use corewise_kv::store::{item_size, Deadline, SetMode, Store};
    /// let s = Store::new(1 << 20, 1);
    /// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"value", None);
    /// let (ttl, idle, _cas, fetched, size) = s.inspect(b"k").unwrap();
    /// assert_eq!((ttl, idle, fetched), (-1, 0, false));
    /// assert_eq!(size, item_size(1, 0, 5));
    /// assert_eq!(s.inspect(b"nope"), None);
    /// ```
    pub fn inspect(&self, key: &[u8]) -> Option<(i64, u32, u64, bool, usize)> {
        let (now, floor) = self.now_floor();
        let mut shard = self.shard(key).lock();
        let it = shard.lookup(key, now, floor, false).ok()?;
        Some((
            self.clock.ttl_left(it.exptime),
            now.saturating_sub(it.last_access),
            self.shown_cas(it.cas),
            it.fetched,
            it.ntotal(),
        ))
    }
}

/// Stores counter value `v` as memcached's incr/decr does: a number no
/// longer than the value is written over it in place, the rest of the
/// value filled with spaces (`"007"` + 1 is `"8  "`, read back as 8), so
/// the value keeps its length; a longer number, or a value a reply is
/// still sending (memcached: an item someone else holds a reference to),
/// gets a new buffer of the number's exact length.
fn write_counter(value: &mut Value, v: u64) {
    let digits = v.to_string();
    let digits = digits.as_bytes();
    match Arc::get_mut(value) {
        Some(buf) if digits.len() <= buf.len() => {
            let (head, pad) = buf.split_at_mut(digits.len());
            head.copy_from_slice(digits);
            pad.fill(b' ');
        }
        _ => *value = Arc::new(digits.to_vec()),
    }
}

/// A counter value, read as memcached reads it (`strtoull` then a check
/// of what follows): optional leading whitespace, an optional sign, at
/// least one digit, then the end of the value, whitespace or a NUL (what
/// follows is ignored: `" 12"`, `"1 2"` and `"1\0x"` count as 12, 1 and 1;
/// `strtoull` reads the value as a C string, so a NUL ends it). Overflow,
/// no digits, another character after the digits, or a negative number
/// are not a counter.
fn parse_counter(v: &[u8]) -> Option<u64> {
    // A C string: a NUL ends it.
    let c_string = v.split(|&b| b == 0).next().unwrap_or_default();
    // strtoull negates a '-' number; memcached refuses the result when it
    // is negative as a signed number (so only "-0" passes).
    match crate::protocol::c_number(c_string)? {
        (false, n) => Some(n),
        (true, 0) => Some(0),
        (true, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &Store, k: &[u8], v: &[u8]) -> StoreOutcome {
        s.store(SetMode::Set, k, 0, Deadline::Never, v, None)
    }

    fn value(s: &Store, k: &[u8]) -> Option<Vec<u8>> {
        let mut out = None;
        s.get(k, None, |it, _| out = Some(it.value.to_vec()));
        out
    }

    #[test]
    fn modes() {
        let s = Store::new(1 << 20, 4);
        assert_eq!(
            s.store(SetMode::Replace, b"a", 0, Deadline::Never, b"1", None),
            StoreOutcome::NotStored
        );
        assert!(matches!(
            s.store(SetMode::Add, b"a", 0, Deadline::Never, b"1", None),
            StoreOutcome::Stored(_)
        ));
        assert_eq!(
            s.store(SetMode::Add, b"a", 0, Deadline::Never, b"2", None),
            StoreOutcome::NotStored
        );
        s.store(SetMode::Append, b"a", 0, Deadline::Never, b"3", None);
        s.store(SetMode::Prepend, b"a", 0, Deadline::Never, b"0", None);
        assert_eq!(value(&s, b"a").unwrap(), b"013");
    }

    #[test]
    fn cas_and_arith() {
        let s = Store::new(1 << 20, 4);
        let StoreOutcome::Stored(c) = set(&s, b"n", b"10") else {
            panic!()
        };
        assert_eq!(
            s.store(SetMode::Set, b"n", 0, Deadline::Never, b"x", Some(c + 100)),
            StoreOutcome::Exists
        );
        assert_eq!(
            s.store(SetMode::Set, b"m", 0, Deadline::Never, b"x", Some(1)),
            StoreOutcome::NotFound
        );
        assert!(matches!(
            s.arith(b"n", true, 5, None, None),
            ArithOutcome::Value(15, _)
        ));
        assert!(matches!(
            s.arith(b"n", false, 100, None, None),
            ArithOutcome::Value(0, _)
        ));
        set(&s, b"big", u64::MAX.to_string().as_bytes());
        assert!(matches!(
            s.arith(b"big", true, 2, None, None),
            ArithOutcome::Value(1, _)
        ));
        set(&s, b"t", b"abc");
        assert_eq!(s.arith(b"t", true, 1, None, None), ArithOutcome::NonNumeric);
        for bad in [
            &b"1a"[..],
            b"",
            b" ",
            b"\x001",
            b"-1",
            b"99999999999999999999999",
        ] {
            assert_eq!(parse_counter(bad), None, "{bad:?}");
        }
        for (ok, n) in [
            (&b" 12"[..], 12),
            (b"12 ", 12),
            (b"1 2", 1),
            (b"+7", 7),
            (b"-0", 0),
            (b"1\0x", 1),
            (b"12\0", 12),
        ] {
            assert_eq!(parse_counter(ok), Some(n), "{ok:?}");
        }
        assert_eq!(
            s.arith(b"none", true, 1, None, None),
            ArithOutcome::NotFound
        );
    }

    #[test]
    fn counters_keep_their_length() {
        let s = Store::new(1 << 20, 1);
        set(&s, b"n", b"007");
        let before = s.inspect(b"n").map(|i| i.2);
        assert!(matches!(
            s.arith(b"n", true, 1, None, None),
            ArithOutcome::Value(8, _)
        ));
        assert_eq!(value(&s, b"n").unwrap(), b"8  ");
        assert_ne!(s.inspect(b"n").map(|i| i.2), before, "a new CAS");
        // The padded value reads as 8; a result as long as the value fills it.
        s.arith(b"n", true, 992, None, None);
        assert_eq!(value(&s, b"n").unwrap(), b"1000");
        s.arith(b"n", false, 1, None, None);
        assert_eq!(value(&s, b"n").unwrap(), b"999 ");

        // A longer number gets its own length.
        let mut v: Value = Arc::new(b"99".to_vec());
        write_counter(&mut v, 100);
        assert_eq!(v[..], b"100"[..]);
        // So does one whose old bytes a reply is still sending, which keeps
        // them as they were.
        let sent = Arc::clone(&v);
        write_counter(&mut v, 7);
        assert_eq!((&v[..], &sent[..]), (&b"7"[..], &b"100"[..]));
        write_counter(&mut v, 0);
        assert_eq!(v[..], b"0"[..]);
    }

    #[test]
    fn flush_and_delete() {
        let s = Store::new(1 << 20, 4);
        set(&s, b"a", b"1");
        s.flush(0);
        assert_eq!(value(&s, b"a"), None);
        set(&s, b"a", b"2");
        assert_eq!(value(&s, b"a").unwrap(), b"2");
        assert_eq!(s.delete(b"a", None), DeleteOutcome::Deleted);
        assert_eq!(s.delete(b"a", None), DeleteOutcome::NotFound);
    }

    #[test]
    fn flush_cutoffs_follow_memcached() {
        let s = Store::new(1 << 20, 4);
        let now = s.clock().now();
        let pending = || s.flush_at.load(Ordering::Relaxed);
        set(&s, b"a", b"1");
        // Later: waits, one second early.
        s.flush(10);
        assert_eq!(pending(), u64::from(now + 9));
        assert!(value(&s, b"a").is_some());
        // A time long past flushes nothing and cancels it; like memcached,
        // it uses up a CAS value.
        let cas = s.next_cas.load(Ordering::Relaxed);
        s.flush(2_592_001);
        assert_eq!(pending(), 0);
        assert_eq!(s.next_cas.load(Ordering::Relaxed), cas + 1);
        assert!(value(&s, b"a").is_some());
        // A delay of 1: at once, and for the rest of this second.
        s.flush(1);
        assert_eq!(pending(), u64::from(now));
        assert_eq!(value(&s, b"a"), None);
        set(&s, b"b", b"2");
        assert_eq!(value(&s, b"b"), None);
        // No delay: at once, and items stored next stay.
        s.flush(0);
        assert_eq!(pending(), 0);
        set(&s, b"c", b"3");
        assert_eq!(value(&s, b"c").unwrap(), b"3");
        assert_eq!(s.ops.get_flushed.load(Ordering::Relaxed), 1); // `b`
    }

    #[test]
    fn memory_limit_holds() {
        let s = Store::new(64 * 1024, 4);
        for i in 0..1000 {
            set(&s, format!("key{i}").as_bytes(), &[0u8; 500]);
        }
        let st = s.stats();
        assert!(st.bytes <= 64 * 1024);
        assert!(st.counters.evictions > 0);
        assert!(value(&s, b"key999").is_some());
    }
}
