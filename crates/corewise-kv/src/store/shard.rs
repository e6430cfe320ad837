//! One shard of the store: a hash map from key to a slot in a slab of
//! items, and an LRU list threaded through the slab by index.
//!
//! A read does not move its item to the head of the list: it marks the item
//! active, and eviction gives an active tail item a second chance (back to
//! the head, mark cleared) instead of evicting it, as memcached's segmented
//! LRU does with its active bit. Moving an item on every read wrote to its
//! two list neighbours, two cache misses on random items: with 100 000
//! items a read took 420-480 ns, most of it those misses.
//!
//! Indices instead of pointers keep the list safe code; the slab reuses
//! freed slots so a steady workload stops allocating list nodes. The key is
//! kept twice (map and item) so eviction can find the map entry from the
//! list tail without unsafe aliasing; the memory accounting counts both.

use super::hash::FxBuild;
use super::slabs::{chunks_for, class_of, ClassCounters, ClassStats, MAX_CLASSES};
use crate::watch::{Watch, EVICTIONS};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

const NIL: u32 = u32::MAX;

/// Bytes an item costs beyond its key and value (two key copies, the slab
/// node, the map entry): an estimate that makes `-m` mean roughly what it
/// means for memcached.
///
/// ```
/// use corewise_kv::store::{Item, ITEM_OVERHEAD};
/// let it = Item::new(b"key", b"value".to_vec(), 0, 0, 1, 1);
/// assert_eq!(it.size(), 2 * 3 + 5 + ITEM_OVERHEAD);
/// ```
pub const ITEM_OVERHEAD: usize = 96;

/// How many items at the LRU tail an insert checks for expired ones
/// (memcached's `lru_pull_tail` search depth).
const TAIL_SEARCH: usize = 5;

/// An item's value bytes, shared and immutable: a reply that sends a
/// large value holds a reference to it instead of a copy (see
/// [`crate::reply`]), and a change builds a new buffer (or edits this one
/// in place when nothing else holds it, [`Arc::make_mut`]), so a value
/// being sent never changes under the send.
///
/// ```
/// use corewise_kv::store::{Item, Value};
/// use std::sync::Arc;
/// let it = Item::new(b"k", b"abc".to_vec(), 0, 0, 1, 1);
/// let sent: Value = Arc::clone(&it.value); // what a reply keeps
/// assert_eq!((&sent[..], Arc::strong_count(&it.value)), (&b"abc"[..], 2));
/// ```
pub type Value = Arc<Vec<u8>>;

/// A stored item.
///
/// ```
/// use corewise_kv::store::Item;
/// let it = Item::new(b"k", b"v".to_vec(), 5, 0, 42, 1);
/// assert_eq!((&it.key[..], &it.value[..], it.flags, it.cas), (&b"k"[..], &b"v"[..], 5, 42));
/// assert!(!it.fetched && !it.stale);
/// ```
#[derive(Debug, Clone)]
pub struct Item {
    /// The key.
    pub key: Box<[u8]>,
    /// The value bytes (shared with replies that are sending them).
    pub value: Value,
    /// The client's opaque flags.
    pub flags: u32,
    /// Expiry in server seconds, 0 for never.
    pub exptime: u32,
    /// The item's CAS value (unique per modification).
    pub cas: u64,
    /// Server second of the last access: when it was stored, or its last
    /// fetch after the first (see [`Item::note_fetch`]).
    pub last_access: u32,
    /// Whether it has been read since it was stored.
    pub fetched: bool,
    /// Marked stale by a meta invalidation (`md ... I`): still served,
    /// with the `X` flag, until it is stored again.
    pub stale: bool,
    /// A meta get has been handed the win token (`W`) for it; later ones
    /// see `Z` until it is stored again or invalidated.
    pub token_sent: bool,
    /// [`ACTIVE`] and [`NO_CAS`], in one byte so that the item stays 56
    /// bytes.
    bits: u8,
    prev: u32,
    next: u32,
}

impl Item {
    /// A new item, not yet linked anywhere.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// assert!(sh.insert(Item::new(b"k", b"v".to_vec(), 0, 0, 1, 1), 1));
    /// assert_eq!(sh.lookup(b"k", 1, 0, false).unwrap().value[..], b"v"[..]);
    /// ```
    pub fn new(key: &[u8], value: Vec<u8>, flags: u32, exptime: u32, cas: u64, now: u32) -> Self {
        Self {
            key: key.into(),
            value: Arc::new(value),
            flags,
            exptime,
            cas,
            last_access: now,
            fetched: false,
            stale: false,
            token_sent: false,
            bits: 0,
            prev: NIL,
            next: NIL,
        }
    }

    /// Records a fetch at server second `now` as memcached's segmented LRU
    /// does: the first fetch only marks the item fetched, each later one
    /// also moves its last access to `now` (memcached bumps an item's time
    /// from its second fetch on). What `mg`'s `l` flag, `lru_crawler
    /// metadump`'s `la` and `stats items`' age show follows from it.
    ///
    /// ```
    /// use corewise_kv::store::Item;
    /// let mut it = Item::new(b"k", b"v".to_vec(), 0, 0, 1, 10);
    /// it.note_fetch(12);
    /// assert!(it.fetched);
    /// assert_eq!(it.last_access, 10); // the first fetch: stored at 10
    /// it.note_fetch(13);
    /// assert_eq!(it.last_access, 13);
    /// ```
    pub fn note_fetch(&mut self, now: u32) {
        if self.fetched {
            self.last_access = now;
        }
        self.fetched = true;
    }

    /// Bytes this item is charged.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let it = Item::new(b"k", vec![0; 100], 0, 0, 1, 1);
    /// let size = it.size();
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(it, 1);
    /// assert_eq!(sh.used(), size);
    /// ```
    pub fn size(&self) -> usize {
        2 * self.key.len() + self.value.len() + ITEM_OVERHEAD
    }

    /// Its size as memcached counts it ([`super::item_size`]).
    ///
    /// ```
    /// use corewise_kv::store::{item_size, Item};
    /// let it = Item::new(b"key", vec![0; 10], 7, 0, 1, 1);
    /// assert_eq!(it.ntotal(), item_size(3, 7, 10));
    /// ```
    pub fn ntotal(&self) -> usize {
        super::item_size_for(self.has_cas(), self.key.len(), self.flags, self.value.len())
    }

    /// Its slab class.
    ///
    /// ```
    /// use corewise_kv::store::{slabs::class_of, Item};
    /// let it = Item::new(b"k", vec![0; 1000], 0, 0, 1, 1);
    /// assert_eq!(it.class(), class_of(it.ntotal()));
    /// assert!(it.class() > 1);
    /// ```
    pub fn class(&self) -> usize {
        class_of(self.ntotal())
    }

    /// Read since it last reached the LRU tail.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"k", b"v".to_vec(), 0, 0, 1, 1), 1);
    /// assert!(!sh.lookup(b"k", 1, 0, false).unwrap().is_active());
    /// sh.lookup(b"k", 1, 0, true).unwrap(); // a read that counts as a use
    /// assert!(sh.lookup(b"k", 1, 0, false).unwrap().is_active());
    /// ```
    pub fn is_active(&self) -> bool {
        self.bits & ACTIVE != 0
    }

    /// Whether it is counted with memcached's 8 CAS bytes: yes, unless
    /// stored by a server run with `-C` (see [`super::item_size_for`]).
    ///
    /// ```
    /// use corewise_kv::store::Item;
    /// let mut it = Item::new(b"k", b"v".to_vec(), 0, 0, 1, 1);
    /// assert!(it.has_cas());
    /// let with = it.ntotal();
    /// it.set_has_cas(false);
    /// assert_eq!(it.ntotal(), with - 8);
    /// ```
    pub fn has_cas(&self) -> bool {
        self.bits & NO_CAS == 0
    }

    /// Sets [`has_cas`](Self::has_cas).
    pub fn set_has_cas(&mut self, on: bool) {
        if on {
            self.bits &= !NO_CAS;
        } else {
            self.bits |= NO_CAS;
        }
    }
}

/// [`Item`]'s bit: read since it last reached the LRU tail (its second
/// chance).
const ACTIVE: u8 = 1;
/// [`Item`]'s bit: counted without the CAS bytes (`-C`).
const NO_CAS: u8 = 2;

/// Per-shard counters (summed by [`super::Store::stats`]).
///
/// ```
/// use corewise_kv::store::{Item, Shard};
/// let mut sh = Shard::new(1 << 20);
/// sh.insert(Item::new(b"a", b"1".to_vec(), 0, 0, 1, 1), 1);
/// sh.insert(Item::new(b"b", b"2".to_vec(), 0, 0, 2, 1), 1);
/// assert_eq!(sh.counters.total_items, 2);
/// assert_eq!(sh.counters.evictions, 0);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ShardCounters {
    /// Items evicted to make room.
    pub evictions: u64,
    /// Evicted items that were never read.
    pub evicted_unfetched: u64,
    /// Expired items whose memory was reclaimed.
    pub reclaimed: u64,
    /// Expired items that were never read.
    pub expired_unfetched: u64,
    /// Items stored since start.
    pub total_items: u64,
}

/// An LRU-ordered map with a memory limit.
///
/// ```
/// use corewise_kv::store::{Item, Shard};
/// // Room for two small items: the least recently used one goes.
/// let one = Item::new(b"a", vec![0; 100], 0, 0, 1, 1).size();
/// let mut sh = Shard::new(2 * one);
/// sh.insert(Item::new(b"a", vec![0; 100], 0, 0, 1, 1), 1);
/// sh.insert(Item::new(b"b", vec![0; 100], 0, 0, 2, 1), 1);
/// sh.insert(Item::new(b"c", vec![0; 100], 0, 0, 3, 1), 1);
/// assert!(sh.lookup(b"a", 1, 0, false).is_err());
/// assert_eq!(sh.counters.evictions, 1);
/// ```
#[derive(Debug)]
pub struct Shard {
    map: HashMap<Box<[u8]>, u32, FxBuild>,
    slab: Vec<Option<Item>>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    used: usize,
    /// The items' sizes as memcached counts them ([`Item::ntotal`]): the
    /// `bytes` of `stats`.
    requested: usize,
    limit: usize,
    /// Whether a store may evict other items to make room (memcached's
    /// `-M` turns it off: a full cache refuses stores instead).
    evict: bool,
    /// Counters of this shard.
    pub counters: ShardCounters,
    /// Counters per slab class (index = class id).
    pub class_counters: Vec<ClassCounters>,
    /// Where evictions are logged for `watch evictions`.
    watch: Arc<Watch>,
}

/// Why an item was not found.
///
/// ```
/// use corewise_kv::store::{Item, Miss, Shard};
/// let mut sh = Shard::new(1 << 20);
/// sh.insert(Item::new(b"exp", b"v".to_vec(), 0, 5, 1, 1), 1); // expires at second 5
/// sh.insert(Item::new(b"old", b"v".to_vec(), 0, 0, 2, 1), 1);
/// assert_eq!(sh.lookup(b"none", 1, 0, false).err(), Some(Miss::Absent));
/// assert_eq!(sh.lookup(b"exp", 5, 0, false).err(), Some(Miss::Expired));
/// assert_eq!(sh.lookup(b"old", 5, 2, false).err(), Some(Miss::Flushed)); // CAS floor 2
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No such key.
    Absent,
    /// It had expired (and is now gone).
    Expired,
    /// A flush made it invalid (and it is now gone).
    Flushed,
}

impl Shard {
    /// An empty shard that holds at most `limit` bytes of items.
    ///
    /// ```
    /// use corewise_kv::store::Shard;
    /// let sh = Shard::new(4096);
    /// assert_eq!((sh.limit(), sh.used(), sh.len()), (4096, 0, 0));
    /// ```
    pub fn new(limit: usize) -> Self {
        Self {
            map: HashMap::with_hasher(FxBuild),
            slab: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            used: 0,
            requested: 0,
            limit,
            evict: true,
            counters: ShardCounters::default(),
            class_counters: vec![ClassCounters::default(); MAX_CLASSES + 1],
            watch: Arc::default(),
        }
    }

    /// An empty shard whose evictions are logged to `watch`.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// use corewise_kv::watch::{Watch, EVICTIONS};
    /// use std::sync::Arc;
    /// let watch = Arc::new(Watch::default());
    /// let w = watch.subscribe(EVICTIONS);
    /// let size = Item::new(b"a", vec![0; 10], 0, 0, 1, 1).size();
    /// let mut sh = Shard::watched(size, Arc::clone(&watch));
    /// sh.insert(Item::new(b"a", vec![0; 10], 0, 0, 1, 1), 1);
    /// sh.insert(Item::new(b"b", vec![0; 10], 0, 0, 2, 1), 1); // evicts "a"
    /// let log = w.drain();
    /// assert_eq!(log.len(), 1);
    /// assert!(log[0].contains("key=a"));
    /// ```
    pub fn watched(limit: usize, watch: Arc<Watch>) -> Self {
        Self {
            watch,
            ..Self::new(limit)
        }
    }

    /// Items held (some may be expired and not yet reclaimed).
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"a", b"1".to_vec(), 0, 0, 1, 1), 1);
    /// sh.insert(Item::new(b"a", b"2".to_vec(), 0, 0, 2, 1), 1); // replaces
    /// assert_eq!(sh.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the shard holds no item.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// assert!(sh.is_empty());
    /// sh.insert(Item::new(b"a", b"1".to_vec(), 0, 0, 1, 1), 1);
    /// assert!(!sh.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes charged to the items held.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// let it = Item::new(b"a", b"1".to_vec(), 0, 0, 1, 1);
    /// let size = it.size();
    /// sh.insert(it, 1);
    /// assert_eq!(sh.used(), size);
    /// sh.remove(b"a");
    /// assert_eq!(sh.used(), 0);
    /// ```
    pub fn used(&self) -> usize {
        self.used
    }

    /// The items' sizes as memcached counts them: what its `stats` call
    /// `bytes` (less than [`Shard::used`], which also charges this
    /// server's own bookkeeping).
    pub fn requested(&self) -> usize {
        self.requested
    }

    /// The memory limit.
    ///
    /// ```
    /// use corewise_kv::store::Shard;
    /// assert_eq!(Shard::new(1000).limit(), 1000);
    /// ```
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Changes the memory limit; a smaller limit evicts at once.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// for (i, k) in [b"a", b"b", b"c"].into_iter().enumerate() {
    ///     sh.insert(Item::new(k, vec![0; 100], 0, 0, i as u64 + 1, 1), 1);
    /// }
    /// sh.set_limit(sh.used() / 2, 1);
    /// assert_eq!(sh.len(), 1); // only the most recent one fits
    /// assert!(sh.lookup(b"c", 1, 0, false).is_ok());
    /// ```
    pub fn set_limit(&mut self, limit: usize, now: u32) {
        self.limit = limit;
        while self.used > self.limit && self.evict_one(now) {}
    }

    /// Looks `key` up; an expired or flushed item is removed and reported
    /// as a miss. `bump` marks a hit as recently used (see the module docs).
    ///
    /// ```
    /// use corewise_kv::store::{Item, Miss, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"k", b"v".to_vec(), 0, 10, 1, 1), 1); // expires at 10
    /// let it = sh.lookup(b"k", 9, 0, true).unwrap();
    /// std::sync::Arc::make_mut(&mut it.value).push(b'!'); // items are edited in place
    /// assert_eq!(sh.lookup(b"k", 9, 0, false).unwrap().value[..], b"v!"[..]);
    /// assert_eq!(sh.lookup(b"k", 10, 0, false).err(), Some(Miss::Expired));
    /// assert!(sh.is_empty()); // the expired item was removed
    /// ```
    pub fn lookup(
        &mut self,
        key: &[u8],
        now: u32,
        cas_floor: u64,
        bump: bool,
    ) -> Result<&mut Item, Miss> {
        let Some(&i) = self.map.get(key) else {
            return Err(Miss::Absent);
        };
        let (expired, flushed) = match self.item(i) {
            Some(it) => (it.exptime != 0 && it.exptime <= now, it.cas <= cas_floor),
            None => return Err(Miss::Absent),
        };
        if expired || flushed {
            // A read that finds an item expired frees it, but memcached
            // counts that as `get_expired` only: `reclaimed` is memory an
            // allocation took back from the LRU tail.
            self.unlink(i);
            return Err(if expired {
                Miss::Expired
            } else {
                Miss::Flushed
            });
        }
        let it = self
            .slab
            .get_mut(i as usize)
            .and_then(Option::as_mut)
            .ok_or(Miss::Absent)?;
        if bump {
            it.bits |= ACTIVE;
        }
        Ok(it)
    }

    /// Inserts `item`, replacing an item of the same key and evicting from
    /// the LRU tail until it fits. `false` (nothing stored, the old item
    /// removed) when it cannot fit even in an empty shard.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1000);
    /// assert!(sh.insert(Item::new(b"k", vec![0; 10], 0, 0, 1, 1), 1));
    /// // Too large even for the empty shard: refused, and the old item is gone.
    /// assert!(!sh.insert(Item::new(b"k", vec![0; 2000], 0, 0, 2, 1), 1));
    /// assert!(sh.is_empty());
    /// ```
    pub fn insert(&mut self, item: Item, now: u32) -> bool {
        self.remove(&item.key);
        self.reclaim_tail(now);
        let size = item.size();
        if size > self.limit {
            return false;
        }
        while self.used + size > self.limit {
            if !self.evict || !self.evict_one(now) {
                return false;
            }
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.slab.len() >= NIL as usize {
                    return false;
                }
                self.slab.push(None);
                (self.slab.len() - 1) as u32
            }
        };
        self.used += size;
        self.requested += item.ntotal();
        self.map.insert(item.key.clone(), i);
        if let Some(slot) = self.slab.get_mut(i as usize) {
            *slot = Some(item);
        }
        self.push_head(i);
        self.counters.total_items += 1;
        true
    }

    /// Removes `key`; the removed item, if there was one.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"k", b"v".to_vec(), 0, 0, 1, 1), 1);
    /// assert_eq!(sh.remove(b"k").map(|it| it.value.to_vec()), Some(b"v".to_vec()));
    /// assert!(sh.remove(b"k").is_none());
    /// ```
    pub fn remove(&mut self, key: &[u8]) -> Option<Item> {
        let i = *self.map.get(key)?;
        self.unlink(i)
    }

    /// Changes the charged size after an in-place edit of an item's value
    /// (`old` was its size before); evicts others if it grew past the limit.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"k", b"v".to_vec(), 0, 0, 1, 1), 1);
    /// let it = sh.lookup(b"k", 1, 0, false).unwrap();
    /// let old = it.size();
    /// std::sync::Arc::make_mut(&mut it.value).extend_from_slice(&[0; 100]);
    /// sh.resized(b"k", old, 1);
    /// assert_eq!(sh.used(), old + 100);
    /// ```
    pub fn resized(&mut self, key: &[u8], old: usize, now: u32) {
        let Some(&i) = self.map.get(key) else {
            return;
        };
        let new = self.item(i).map_or(old, Item::size);
        self.used = self.used.saturating_sub(old) + new;
        // An edit changes the value only, so both sizes move by as much.
        self.requested = (self.requested + new).saturating_sub(old);
        // Without evictions (`-M`) a counter that grew by a few digits
        // stays, a few bytes over the limit.
        while self.evict && self.used > self.limit && self.tail != i && self.evict_one(now) {}
    }

    /// Lets stores evict other items to make room, or not (`-M`).
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1000);
    /// sh.set_evict(false);
    /// assert!(!sh.evicts());
    /// assert!(sh.insert(Item::new(b"a", vec![0; 600], 0, 0, 1, 1), 1));
    /// // No room left without evicting `a`: refused, and `a` stays.
    /// assert!(!sh.insert(Item::new(b"b", vec![0; 600], 0, 0, 2, 1), 1));
    /// assert!(sh.lookup(b"a", 1, 0, false).is_ok());
    /// ```
    pub fn set_evict(&mut self, on: bool) {
        self.evict = on;
    }

    /// Whether stores may evict other items here (see
    /// [`set_evict`](Self::set_evict)).
    pub fn evicts(&self) -> bool {
        self.evict
    }

    /// Whether an item of `size` (as [`Item::size`] counts it) stored
    /// under `key` would fit without evicting anything, the key's current
    /// item and the expired items at the LRU tail freed first.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1000);
    /// sh.insert(Item::new(b"a", vec![0; 300], 0, 0, 1, 1), 1);
    /// assert!(sh.fits(b"a", 900, 1)); // replacing a frees its room
    /// assert!(!sh.fits(b"b", 900, 1));
    /// ```
    pub fn fits(&mut self, key: &[u8], size: usize, now: u32) -> bool {
        self.reclaim_tail(now);
        let old = self
            .map
            .get(key)
            .and_then(|&i| self.item(i))
            .map_or(0, Item::size);
        self.used - old + size <= self.limit
    }

    /// Removes every item.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"k", b"v".to_vec(), 0, 0, 1, 1), 1);
    /// sh.clear();
    /// assert!(sh.is_empty());
    /// assert_eq!(sh.used(), 0);
    /// ```
    pub fn clear(&mut self) {
        self.map.clear();
        self.slab.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.used = 0;
        self.requested = 0;
    }

    /// Items in LRU order, most recent first (for tests and `stats`).
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"a", b"1".to_vec(), 0, 0, 1, 1), 1);
    /// sh.insert(Item::new(b"b", b"2".to_vec(), 0, 0, 2, 1), 1);
    /// let keys: Vec<&[u8]> = sh.iter_lru().map(|it| &it.key[..]).collect();
    /// assert_eq!(keys, vec![&b"b"[..], &b"a"[..]]); // most recent first
    /// ```
    pub fn iter_lru(&self) -> impl Iterator<Item = &Item> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            let it = self.item(at)?;
            at = it.next;
            Some(it)
        })
    }

    /// Age in seconds of the least recently used item.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"a", b"1".to_vec(), 0, 0, 1, 3), 3); // last used at second 3
    /// sh.insert(Item::new(b"b", b"2".to_vec(), 0, 0, 2, 8), 8);
    /// assert_eq!(sh.oldest_age(10), 7);
    /// ```
    pub fn oldest_age(&self, now: u32) -> u32 {
        self.item(self.tail)
            .map_or(0, |it| now.saturating_sub(it.last_access))
    }

    /// Frees expired items among the last five (`TAIL_SEARCH`) of the LRU, as
    /// memcached does on every allocation: the memory of expired items is
    /// reused before the shard grows, not held until it is full.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"old", b"1".to_vec(), 0, 5, 1, 1), 1); // expires at 5
    /// sh.insert(Item::new(b"new", b"2".to_vec(), 0, 0, 2, 1), 1);
    /// sh.reclaim_tail(6);
    /// assert_eq!(sh.len(), 1);
    /// assert_eq!(sh.counters.reclaimed, 1);
    /// ```
    pub fn reclaim_tail(&mut self, now: u32) {
        let mut at = self.tail;
        for _ in 0..TAIL_SEARCH {
            let Some(it) = self.item(at) else {
                break;
            };
            let (prev, expired) = (it.prev, it.exptime != 0 && it.exptime <= now);
            if expired {
                if let Some(it) = self.unlink(at) {
                    self.count_reclaimed(&it);
                }
            }
            at = prev;
        }
    }

    fn evict_one(&mut self, now: u32) -> bool {
        // Active tail items go back to the head, each once: the loop ends
        // at the first inactive or expired one (or after every item).
        for _ in 0..self.map.len() {
            let t = self.tail;
            match self.links(t) {
                Some(it) if it.is_active() && (it.exptime == 0 || it.exptime > now) => {
                    it.bits &= !ACTIVE;
                    self.detach(t);
                    self.push_head(t);
                }
                _ => break,
            }
        }
        let t = self.tail;
        let Some(it) = self.unlink(t) else {
            return false;
        };
        if it.exptime != 0 && it.exptime <= now {
            self.count_reclaimed(&it);
        } else {
            self.counters.evictions += 1;
            if !it.fetched {
                self.counters.evicted_unfetched += 1;
            }
            self.watch.emit(EVICTIONS, |l| {
                l.push_str("type=eviction key=");
                crate::watch::uri_key(l, &it.key);
                let ttl = if it.exptime == 0 {
                    -1
                } else {
                    i64::from(it.exptime) - i64::from(now)
                };
                let _ = write!(
                    l,
                    " fetch={} ttl={ttl} la={} clsid={}",
                    if it.fetched { "yes" } else { "no" },
                    now.saturating_sub(it.last_access),
                    it.class()
                );
            });
            if let Some(c) = self.class_counters.get_mut(it.class()) {
                c.evicted += 1;
                c.evicted_nonzero += u64::from(it.exptime != 0);
                c.evicted_time = now.saturating_sub(it.last_access);
                c.evicted_unfetched += u64::from(!it.fetched);
            }
        }
        true
    }

    /// Counts an expired item whose memory was reclaimed at the LRU tail.
    fn count_reclaimed(&mut self, it: &Item) {
        self.counters.reclaimed += 1;
        if let Some(c) = self.class_counters.get_mut(it.class()) {
            c.reclaimed += 1;
        }
        self.count_expired_unfetched(it);
    }

    fn count_expired_unfetched(&mut self, it: &Item) {
        self.counters.expired_unfetched += u64::from(!it.fetched);
        if let Some(c) = self.class_counters.get_mut(it.class()) {
            c.expired_unfetched += u64::from(!it.fetched);
        }
    }

    /// Frees every expired item and every item a flush made invalid;
    /// returns how many had expired (the crawler's `crawler_reclaimed`;
    /// memcached does not count them as `reclaimed`).
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"exp", b"1".to_vec(), 0, 5, 1, 1), 1); // expires at 5
    /// sh.insert(Item::new(b"flushed", b"2".to_vec(), 0, 0, 2, 1), 1);
    /// sh.insert(Item::new(b"live", b"3".to_vec(), 0, 0, 9, 1), 1);
    /// // At second 6, with a flush that invalidated CAS values up to 5:
    /// assert_eq!(sh.reclaim_all(6, 5), 1); // one had expired
    /// assert_eq!(sh.len(), 1);
    /// ```
    pub fn reclaim_all(&mut self, now: u32, cas_floor: u64) -> u64 {
        let mut expired_n = 0;
        let mut at = self.tail;
        while let Some(it) = self.item(at) {
            let prev = it.prev;
            let expired = it.exptime != 0 && it.exptime <= now;
            if expired || it.cas <= cas_floor {
                if let Some(it) = self.unlink(at) {
                    if expired {
                        self.count_expired_unfetched(&it);
                        expired_n += 1;
                    }
                }
            }
            at = prev;
        }
        expired_n
    }

    /// Removes every item last stored or bumped at or before server second
    /// `cutoff` (a flush without CAS values, whose cut-off has passed);
    /// returns how many.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"old", b"1".to_vec(), 0, 0, 1, 3), 3); // stored at 3
    /// sh.insert(Item::new(b"new", b"2".to_vec(), 0, 0, 2, 7), 7);
    /// assert_eq!(sh.remove_accessed_by(5), 1);
    /// assert_eq!(sh.len(), 1);
    /// ```
    pub fn remove_accessed_by(&mut self, cutoff: u32) -> usize {
        let mut removed = 0;
        let mut at = self.tail;
        while let Some(it) = self.item(at) {
            let prev = it.prev;
            if it.last_access <= cutoff && self.unlink(at).is_some() {
                removed += 1;
            }
            at = prev;
        }
        removed
    }

    /// Zeroes this shard's counters and its classes'.
    ///
    /// ```
    /// use corewise_kv::store::{Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.insert(Item::new(b"a", b"1".to_vec(), 0, 0, 1, 1), 1);
    /// sh.reset_counters();
    /// assert_eq!(sh.counters.total_items, 0);
    /// assert_eq!(sh.len(), 1);
    /// ```
    pub fn reset_counters(&mut self) {
        self.counters = ShardCounters::default();
        self.class_counters.fill(ClassCounters::default());
    }

    /// Bumps one of class `cls`'s request counters.
    ///
    /// ```
    /// use corewise_kv::store::Shard;
    /// let mut sh = Shard::new(1 << 20);
    /// sh.class_op(3, |c| &mut c.get_hits);
    /// assert_eq!(sh.class_counters[3].get_hits, 1);
    /// sh.class_op(1000, |c| &mut c.get_hits); // no such class: ignored
    /// ```
    pub fn class_op(&mut self, cls: usize, f: impl FnOnce(&mut ClassCounters) -> &mut u64) {
        if let Some(c) = self.class_counters.get_mut(cls) {
            *f(c) += 1;
        }
    }

    /// Counts a store refused for want of memory (in its item's class).
    ///
    /// ```
    /// use corewise_kv::store::{slabs::class_of, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// sh.count_out_of_memory(5000);
    /// assert_eq!(sh.class_counters[class_of(5000)].outofmemory, 1);
    /// ```
    pub fn count_out_of_memory(&mut self, ntotal: usize) {
        if let Some(c) = self.class_counters.get_mut(class_of(ntotal)) {
            c.outofmemory += 1;
        }
    }

    /// Adds this shard's items and counters into `stats` (index = class
    /// id), with item ages as of `now`.
    ///
    /// ```
    /// use corewise_kv::store::{slabs::{self, ClassStats}, Item, Shard};
    /// let mut sh = Shard::new(1 << 20);
    /// let it = Item::new(b"k", vec![0; 200], 0, 0, 1, 1);
    /// let cls = it.class();
    /// sh.insert(it, 1);
    /// let mut stats = vec![ClassStats::default(); slabs::MAX_CLASSES + 1];
    /// sh.class_stats(4, &mut stats);
    /// assert_eq!((stats[cls].number, stats[cls].age), (1, 3));
    /// ```
    pub fn class_stats(&self, now: u32, stats: &mut [ClassStats]) {
        for it in self.iter_lru() {
            let n = it.ntotal();
            if let Some(s) = stats.get_mut(class_of(n)) {
                s.number += 1;
                s.active += u64::from(it.is_active());
                s.age = s.age.max(now.saturating_sub(it.last_access));
                s.mem_requested += n as u64;
                s.used_chunks += chunks_for(n) as u64;
            }
        }
        for (s, c) in stats.iter_mut().zip(&self.class_counters) {
            s.counters.add(c);
        }
    }

    fn item(&self, i: u32) -> Option<&Item> {
        self.slab.get(i as usize).and_then(Option::as_ref)
    }

    fn links(&mut self, i: u32) -> Option<&mut Item> {
        self.slab.get_mut(i as usize).and_then(Option::as_mut)
    }

    fn unlink(&mut self, i: u32) -> Option<Item> {
        self.detach(i);
        let it = self.slab.get_mut(i as usize)?.take()?;
        self.map.remove(&it.key);
        self.free.push(i);
        self.used = self.used.saturating_sub(it.size());
        self.requested = self.requested.saturating_sub(it.ntotal());
        Some(it)
    }

    fn detach(&mut self, i: u32) {
        let Some((prev, next)) = self.item(i).map(|it| (it.prev, it.next)) else {
            return;
        };
        match self.links(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.links(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
        if let Some(it) = self.links(i) {
            it.prev = NIL;
            it.next = NIL;
        }
    }

    fn push_head(&mut self, i: u32) {
        let old = self.head;
        if let Some(it) = self.links(i) {
            it.prev = NIL;
            it.next = old;
        }
        match self.links(old) {
            Some(h) => h.prev = i,
            None => self.tail = i,
        }
        self.head = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(k: &str, n: usize) -> Item {
        Item::new(k.as_bytes(), vec![b'x'; n], 0, 0, 1, 1)
    }

    #[test]
    fn evicts_least_recently_used() {
        let size = item("a", 100).size();
        let mut s = Shard::new(3 * size);
        assert!(s.insert(item("a", 100), 1));
        assert!(s.insert(item("b", 100), 1));
        assert!(s.insert(item("c", 100), 1));
        assert!(s.lookup(b"a", 1, 0, true).is_ok());
        assert!(s.insert(item("d", 100), 1));
        assert_eq!(s.lookup(b"b", 1, 0, false).err(), Some(Miss::Absent));
        assert!(s.lookup(b"a", 1, 0, false).is_ok());
        assert_eq!(s.counters.evictions, 1);
        let keys: Vec<_> = s.iter_lru().map(|i| i.key.to_vec()).collect();
        assert_eq!(keys, vec![b"d".to_vec(), b"a".to_vec(), b"c".to_vec()]);
        assert!(s.used() <= s.limit());
    }

    #[test]
    fn a_read_item_gets_one_second_chance() {
        let size = item("a", 100).size();
        let mut s = Shard::new(3 * size);
        for k in ["a", "b", "c"] {
            assert!(s.insert(item(k, 100), 1));
        }
        assert!(s.lookup(b"a", 1, 0, true).is_ok());
        // "a" is at the tail but was read: "b" goes instead, "a" moves up.
        assert!(s.insert(item("d", 100), 1));
        assert!(s.lookup(b"b", 1, 0, false).is_err());
        // Not read again since: "c", then "a" go in LRU order.
        assert!(s.insert(item("e", 100), 1));
        assert!(s.lookup(b"c", 1, 0, false).is_err());
        assert!(s.insert(item("f", 100), 1));
        assert!(s.lookup(b"a", 1, 0, false).is_err());
        assert_eq!(s.counters.evictions, 3);
        // An expired active item is reclaimed, not kept.
        let mut s = Shard::new(2 * size);
        let mut short = item("x", 100);
        short.exptime = 5;
        assert!(s.insert(short, 1));
        assert!(s.lookup(b"x", 1, 0, true).is_ok());
        assert!(s.insert(item("y", 100), 1));
        assert!(s.insert(item("z", 100), 10));
        assert!(s.lookup(b"x", 10, 0, false).is_err());
        assert_eq!((s.counters.reclaimed, s.counters.evictions), (1, 0));
    }

    #[test]
    fn too_big_is_refused() {
        let mut s = Shard::new(100);
        assert!(!s.insert(item("a", 1000), 1));
        assert!(s.is_empty());
    }

    #[test]
    fn expired_and_flushed_are_misses() {
        let mut s = Shard::new(1 << 20);
        let mut it = item("a", 1);
        it.exptime = 5;
        s.insert(it, 1);
        assert!(s.lookup(b"a", 4, 0, true).is_ok());
        assert_eq!(s.lookup(b"a", 5, 0, true).err(), Some(Miss::Expired));
        s.insert(item("b", 1), 1);
        assert_eq!(s.lookup(b"b", 1, 1, true).err(), Some(Miss::Flushed));
        assert_eq!(s.used(), 0);
    }
}
