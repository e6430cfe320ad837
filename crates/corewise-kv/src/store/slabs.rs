//! memcached's slab classes, as a way of reporting where items would live.
//!
//! Why: operators' tools (`memcached-tool`, `damemtop`) and the
//! `stats items`/`stats slabs`/`lru_crawler metadump` replies describe the
//! cache per slab class. Items here are allocated one by one, not in slab
//! pages, so the classes are a view: each item is counted in the class its
//! size (as memcached counts it, [`super::item_size`]) falls into, and a
//! class's pages are the 1 MiB pages its items would fill. The class sizes
//! are memcached's: 48 bytes of item header plus the minimum (`-n`, 48),
//! growing by a factor (`-f`, 1.25), each rounded up to 8 bytes, up to the
//! 512 KiB chunk limit; larger items are chunked in the largest class, as
//! in memcached. Like memcached's, the classes are the process's: a server
//! sets them once ([`set_layout`]) before its store is made.

use std::sync::OnceLock;

/// memcached's slab page size (its default `-I`).
///
/// ```
/// use corewise_kv::store::slabs::{chunk_sizes, per_page, PAGE_SIZE};
/// // A page holds as many chunks of a class as fit.
/// assert_eq!(per_page(1), PAGE_SIZE / chunk_sizes()[0]);
/// assert_eq!(PAGE_SIZE, 1 << 20);
/// ```
pub const PAGE_SIZE: usize = 1024 * 1024;

/// The largest chunk (memcached's `slab_chunk_max`: half a page).
///
/// ```
/// use corewise_kv::store::slabs::{chunk_sizes, chunks_for, CHUNK_MAX};
/// assert_eq!(*chunk_sizes().last().unwrap(), CHUNK_MAX);
/// assert_eq!(chunks_for(CHUNK_MAX + 1), 2); // larger items are chunked
/// ```
pub const CHUNK_MAX: usize = PAGE_SIZE / 2;

/// Highest class id memcached can have.
///
/// ```
/// use corewise_kv::store::{slabs::MAX_CLASSES, Store};
/// // Class ids index the per-class table directly.
/// assert_eq!(Store::new(1 << 20, 1).class_stats().len(), MAX_CLASSES + 1);
/// ```
pub const MAX_CLASSES: usize = 63;

/// memcached's default growth factor between classes (`-f`).
pub const DEFAULT_FACTOR: f64 = 1.25;
/// memcached's default minimum space for key, value and flags (`-n`).
pub const DEFAULT_MIN: usize = 48;

/// The process's slab classes: how they were made and their chunk sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The growth factor (`-f`).
    pub factor: f64,
    /// The minimum space for key, value and flags (`-n`).
    pub min: usize,
    sizes: Vec<usize>,
}

impl Layout {
    /// memcached's classes for this factor and minimum: the first chunk
    /// is its 48-byte item header plus `min`, each next one `factor`
    /// times larger, every one rounded up to 8 bytes, while below
    /// [`CHUNK_MAX`]` / factor`; the last class is [`CHUNK_MAX`].
    ///
    /// ```
    /// use corewise_kv::store::slabs::Layout;
    /// let l = Layout::new(2.0, 100);
    /// assert_eq!(&l.chunk_sizes()[..3], &[152, 304, 608]);
    /// assert_eq!(*l.chunk_sizes().last().unwrap(), 512 * 1024);
    /// ```
    pub fn new(factor: f64, min: usize) -> Self {
        let mut sizes = Vec::new();
        let mut size = 48usize.saturating_add(min);
        while sizes.len() < MAX_CLASSES - 1 && (size as f64) < CHUNK_MAX as f64 / factor {
            size = size.div_ceil(8) * 8;
            sizes.push(size);
            size = (size as f64 * factor) as usize;
        }
        sizes.push(CHUNK_MAX);
        Self { factor, min, sizes }
    }

    /// The chunk sizes of classes 1.. (index 0 is class 1).
    pub fn chunk_sizes(&self) -> &[usize] {
        &self.sizes
    }
}

static LAYOUT: OnceLock<Layout> = OnceLock::new();

/// Sets the process's classes (memcached's `-f` and `-n`); call it before
/// the first store is made. Returns false, changing nothing, when classes
/// other than these are already in use.
///
/// ```
/// use corewise_kv::store::slabs::{layout, set_layout, DEFAULT_FACTOR, DEFAULT_MIN};
/// // The defaults are in use once anything asked for a class.
/// assert_eq!(layout().factor, DEFAULT_FACTOR);
/// assert!(set_layout(DEFAULT_FACTOR, DEFAULT_MIN));
/// assert!(!set_layout(2.0, 100));
/// ```
pub fn set_layout(factor: f64, min: usize) -> bool {
    let wanted = Layout::new(factor, min);
    *LAYOUT.get_or_init(|| wanted.clone()) == wanted
}

/// The process's classes (memcached's defaults unless [`set_layout`]
/// chose others first).
///
/// ```
/// let l = corewise_kv::store::slabs::layout();
/// assert_eq!((l.factor, l.min), (1.25, 48));
/// ```
pub fn layout() -> &'static Layout {
    LAYOUT.get_or_init(|| Layout::new(DEFAULT_FACTOR, DEFAULT_MIN))
}

/// The chunk sizes of classes 1.. (index 0 is class 1).
///
/// ```
/// let c = corewise_kv::store::slabs::chunk_sizes();
/// assert_eq!(&c[..4], &[96, 120, 152, 192]);
/// assert_eq!(c.len(), 39);
/// assert_eq!(*c.last().unwrap(), 512 * 1024);
/// ```
pub fn chunk_sizes() -> &'static [usize] {
    layout().chunk_sizes()
}

/// The class id (1-based) of an item of `ntotal` bytes.
///
/// ```
/// use corewise_kv::store::slabs::class_of;
/// assert_eq!(class_of(63), 1);
/// assert_eq!(class_of(97), 2);
/// assert_eq!(class_of(1 << 20), 39);
/// ```
pub fn class_of(ntotal: usize) -> usize {
    let sizes = chunk_sizes();
    sizes.partition_point(|&s| s < ntotal).min(sizes.len() - 1) + 1
}

/// Chunks of class `id` in one page.
///
/// ```
/// use corewise_kv::store::slabs::per_page;
/// assert_eq!(per_page(1), 1024 * 1024 / 96);
/// assert_eq!(per_page(39), 2); // 512 KiB chunks
/// ```
pub fn per_page(id: usize) -> usize {
    chunk_sizes()
        .get(id.wrapping_sub(1))
        .map_or(1, |&s| (PAGE_SIZE / s).max(1))
}

/// Chunks an item of `ntotal` bytes takes in its class (more than one only
/// for items over [`CHUNK_MAX`]).
///
/// ```
/// use corewise_kv::store::slabs::chunks_for;
/// assert_eq!(chunks_for(100), 1);
/// assert_eq!(chunks_for(3 << 19), 3); // 1.5 MiB: three 512 KiB chunks
/// ```
pub fn chunks_for(ntotal: usize) -> usize {
    if ntotal > CHUNK_MAX {
        ntotal.div_ceil(CHUNK_MAX)
    } else {
        1
    }
}

/// Per-class counters kept by each shard.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"k", 0, Deadline::Never, b"v", None);
/// s.get(b"k", None, |_, _| {});
/// let hits: u64 = s.class_stats().iter().map(|c| c.counters.get_hits).sum();
/// assert_eq!(hits, 1);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassCounters {
    /// Items evicted.
    pub evicted: u64,
    /// Evicted items that had an expiry.
    pub evicted_nonzero: u64,
    /// Seconds since the last access of the last evicted item.
    pub evicted_time: u32,
    /// Evicted items never read.
    pub evicted_unfetched: u64,
    /// Stores refused for want of memory.
    pub outofmemory: u64,
    /// Expired items whose memory was reclaimed.
    pub reclaimed: u64,
    /// Expired items never read.
    pub expired_unfetched: u64,
    /// Reads that found an item of the class.
    pub get_hits: u64,
    /// Storage requests whose new item falls in the class.
    pub cmd_set: u64,
    /// Deletes of an item of the class.
    pub delete_hits: u64,
    /// Increments of an item of the class.
    pub incr_hits: u64,
    /// Decrements of an item of the class.
    pub decr_hits: u64,
    /// CAS stores that replaced an item of the class.
    pub cas_hits: u64,
    /// CAS stores refused by an item of the class.
    pub cas_badval: u64,
    /// Touches of an item of the class.
    pub touch_hits: u64,
}

/// What `stats items` and `stats slabs` report for one class.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"a", 0, Deadline::Never, b"1", None);
/// s.store(SetMode::Set, b"b", 0, Deadline::Never, b"2", None);
/// let c = s.class_stats()[1];
/// assert_eq!((c.number, c.used_chunks), (2, 2));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassStats {
    /// Items in the class.
    pub number: u64,
    /// Of which read since they last reached an LRU tail (memcached's
    /// active items; reported as warm).
    pub active: u64,
    /// Seconds since the last access of the least recently used item.
    pub age: u32,
    /// Bytes of its items, as memcached counts them.
    pub mem_requested: u64,
    /// Chunks its items take.
    pub used_chunks: u64,
    /// The shards' counters, summed.
    pub counters: ClassCounters,
}

impl ClassStats {
    /// Pages the class's chunks fill (none when empty).
    ///
    /// ```
    /// use corewise_kv::store::slabs::{per_page, ClassStats};
    /// let c = ClassStats { used_chunks: per_page(5) as u64 + 1, ..ClassStats::default() };
    /// assert_eq!(c.pages(5), 2);
    /// assert_eq!(ClassStats::default().pages(5), 0);
    /// ```
    pub fn pages(&self, id: usize) -> u64 {
        self.used_chunks.div_ceil(per_page(id) as u64)
    }
}

impl ClassCounters {
    /// Adds `o` into `self` (`evicted_time`: the larger).
    ///
    /// ```
    /// use corewise_kv::store::slabs::ClassCounters;
    /// let mut a = ClassCounters { get_hits: 2, evicted_time: 5, ..ClassCounters::default() };
    /// a.add(&ClassCounters { get_hits: 3, evicted_time: 9, ..ClassCounters::default() });
    /// assert_eq!((a.get_hits, a.evicted_time), (5, 9));
    /// ```
    pub fn add(&mut self, o: &ClassCounters) {
        self.evicted += o.evicted;
        self.evicted_nonzero += o.evicted_nonzero;
        self.evicted_time = self.evicted_time.max(o.evicted_time);
        self.evicted_unfetched += o.evicted_unfetched;
        self.outofmemory += o.outofmemory;
        self.reclaimed += o.reclaimed;
        self.expired_unfetched += o.expired_unfetched;
        self.get_hits += o.get_hits;
        self.cmd_set += o.cmd_set;
        self.delete_hits += o.delete_hits;
        self.incr_hits += o.incr_hits;
        self.decr_hits += o.decr_hits;
        self.cas_hits += o.cas_hits;
        self.cas_badval += o.cas_badval;
        self.touch_hits += o.touch_hits;
    }
}
