//! User-thread stacks: carved out of large reserved mappings, one guard
//! page each, committed only as touched, and given back when reused.
//!
//! A million threads need a million stacks. One `mmap` per stack plus an
//! `mprotect`ed guard page is two mappings per stack, and the kernel's
//! `vm.max_map_count` (65 530 by default) counts every one: that capped a
//! process near 32 000 threads. Here stacks are carved from chunks of
//! [`CHUNK_BYTES`] of address space (one mapping each, `MAP_NORESERVE`, so
//! nothing is committed or charged until touched), and each stack's guard
//! page is installed with `MADV_GUARD_INSTALL` (Linux 6.13+), which marks
//! page-table entries and does not split the mapping. So the mapping count
//! stays flat: one per chunk. The markers of [`GUARD_BATCH`] stacks are
//! installed with one `process_madvise` ahead of use. On older kernels the
//! guard falls back to `mprotect(PROT_NONE)` (two mappings per stack, as
//! before).
//!
//! The overflow handler finds the thread whose guard page was hit by
//! address arithmetic over the chunk table ([`find_guard`]): any number of
//! threads is named, within [`MAX_CHUNKS`] chunks of stacks.
//!
//! A parked thread's stack below its stack pointer is dead. When a thread
//! parks for a while on a stack that an earlier thread used (perhaps
//! deeply), the dispatcher gives those pages back, so a parked thread's
//! resident memory is what its own frames hold. Pages go back in batches
//! ([`GiveBack`]): one `madvise` per stack cost an inter-processor
//! interrupt each.

use crate::sched::ThreadContext;
use corosensei::stack::{Stack, StackPointer};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Address space reserved per chunk (1 GiB: 4 096 stacks of 256 KiB).
pub(crate) const CHUNK_BYTES: usize = 1 << 30;
/// Chunks the process may map (16 TiB of stacks in 1 GiB chunks).
pub(crate) const MAX_CHUNKS: usize = 16 * 1024;

/// `madvise` advice that installs guard markers (Linux 6.13).
const MADV_GUARD_INSTALL: i32 = 102;

/// How guard pages are made on this kernel.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuardKind {
    /// No stack made yet.
    Unknown,
    /// `MADV_GUARD_INSTALL`: no extra mapping per stack.
    Marker,
    /// `mprotect(PROT_NONE)`: one extra mapping per stack.
    Protect,
}

static GUARD_KIND: AtomicU8 = AtomicU8::new(0);

/// How guard pages are made (known after the first stack).
#[cfg(test)]
pub(crate) fn guard_kind() -> GuardKind {
    match GUARD_KIND.load(Ordering::Relaxed) {
        1 => GuardKind::Marker,
        2 => GuardKind::Protect,
        _ => GuardKind::Unknown,
    }
}

/// One chunk, as the overflow handler reads it (no locks there: atomics,
/// published with `base` last).
struct ChunkEntry {
    base: AtomicUsize,
    len: AtomicUsize,
    stride: AtomicUsize,
    /// Owner of each stack of the chunk (a leaked array of `len / stride`).
    owners: AtomicPtr<AtomicPtr<ThreadContext>>,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_CHUNK: ChunkEntry = ChunkEntry {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    stride: AtomicUsize::new(0),
    owners: AtomicPtr::new(std::ptr::null_mut()),
};

static CHUNKS: [ChunkEntry; MAX_CHUNKS] = [EMPTY_CHUNK; MAX_CHUNKS];

/// Stacks of one size: chunks and a free list.
struct Pool {
    stride: usize,
    /// Chunk numbers (in [`CHUNKS`]), how many stacks of each were handed
    /// out, and how many have their guard installed (see [`GUARD_BATCH`]).
    chunks: Vec<(usize, usize, usize)>,
    /// Stacks returned by dropped contexts: (chunk number, stack number).
    free: Vec<(usize, usize)>,
}

struct Pools {
    pools: Vec<Pool>,
    chunks_used: usize,
}

static POOLS: Mutex<Pools> = Mutex::new(Pools {
    pools: Vec::new(),
    chunks_used: 0,
});

fn page() -> usize {
    rustix::param::page_size()
}

/// A stack carved from a chunk: `[lo, lo + page)` is its guard,
/// `[lo + page, lo + stride)` the stack proper.
#[derive(Debug)]
pub(crate) struct PoolStack {
    lo: usize,
    stride: usize,
    chunk: usize,
    index: usize,
}

/// The extent of a [`PoolStack`], kept beside the coroutine that owns the
/// stack (which does not lend it out).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StackRange {
    lo: usize,
    stride: usize,
}

impl StackRange {
    /// The part of the stack below `sp` (page-aligned down) as `(start,
    /// len)`, if it holds any page.
    fn below(&self, sp: usize) -> Option<(usize, usize)> {
        let bottom = self.lo + page();
        let top = sp & !(page() - 1);
        (top > bottom && top <= self.lo + self.stride).then(|| (bottom, top - bottom))
    }

    /// Gives back the pages of the stack below `sp` (page-aligned down),
    /// which the caller guarantees hold nothing live: the thread on this
    /// stack is suspended with its stack pointer at or above `sp`.
    pub(crate) fn give_back_below(&self, sp: usize) {
        if let Some((start, len)) = self.below(sp) {
            dontneed(start, len);
        }
    }
}

/// `madvise(MADV_DONTNEED)` on one range of a stack mapping.
fn dontneed(start: usize, len: usize) {
    // SAFETY: callers pass a range of a stack mapping we made that holds
    // nothing live; MADV_DONTNEED leaves it mapped (zero on touch).
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
}

/// Stack ranges to give back together, in one system call.
///
/// Giving back pages flushes their translations from every CPU that runs
/// the process: one inter-processor interrupt per `madvise`, about 13 µs a
/// range on a two-vCPU VM against 0.6 µs a range when 512 ranges go in one
/// `process_madvise` (Linux 6.16+ batches the flushes of `MADV_DONTNEED`
/// there). Kernels that refuse `process_madvise` on the calling process
/// (before 6.14 for `PIDFD_SELF`, or a seccomp filter) get one `madvise`
/// per range.
#[derive(Default)]
pub(crate) struct GiveBack {
    ranges: Vec<libc::iovec>,
}

/// `PIDFD_SELF` (Linux 6.14): the calling process, for `process_madvise`.
const PIDFD_SELF: libc::c_int = -10000;
/// Most ranges one `process_madvise` takes (`UIO_MAXIOV`).
const MAX_IOV: usize = 1024;
/// Whether `process_madvise` on ourselves was refused once (then we stop
/// trying).
static BATCH_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl GiveBack {
    /// Adds the part of `range` below `sp` (see
    /// [`StackRange::give_back_below`]; same contract, until [`flush`](Self::flush)).
    pub(crate) fn add_below(&mut self, range: StackRange, sp: usize) {
        if let Some((start, len)) = range.below(sp) {
            self.ranges.push(libc::iovec {
                iov_base: start as *mut libc::c_void,
                iov_len: len,
            });
        }
    }

    /// Gives back every range added (no system call when there is none),
    /// and empties the batch.
    pub(crate) fn flush(&mut self) {
        let mut done = 0;
        while done < self.ranges.len() && !BATCH_REFUSED.load(Ordering::Relaxed) {
            let part = &self.ranges[done..(done + MAX_IOV).min(self.ranges.len())];
            // SAFETY: the iovecs describe ranges of our own stack mappings
            // whose contents are dead (the `add_below` contract); the kernel
            // only reads the array.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    PIDFD_SELF,
                    part.as_ptr(),
                    part.len(),
                    libc::MADV_DONTNEED,
                    0,
                )
            };
            let total: usize = part.iter().map(|v| v.iov_len).sum();
            if r >= 0 && r as usize == total {
                done += part.len();
                continue;
            }
            if r < 0 {
                BATCH_REFUSED.store(true, Ordering::Relaxed);
            }
            // A partial or refused call: the rest one by one (giving back
            // twice is harmless).
            break;
        }
        for v in &self.ranges[done..] {
            dontneed(v.iov_base as usize, v.iov_len);
        }
        self.ranges.clear();
    }

    /// Whether nothing was added since the last flush.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl PoolStack {
    /// A stack of at least `size` usable bytes.
    pub(crate) fn new(size: usize) -> std::io::Result<Self> {
        let page = page();
        let stride = size.div_ceil(page) * page + page;
        let mut g = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        let pi = match g.pools.iter().position(|p| p.stride == stride) {
            Some(i) => i,
            None => {
                g.pools.push(Pool {
                    stride,
                    chunks: Vec::new(),
                    free: Vec::new(),
                });
                g.pools.len() - 1
            }
        };
        let pool = &mut g.pools[pi];
        if let Some((chunk, index)) = pool.free.pop() {
            let lo = CHUNKS[chunk].base.load(Ordering::Relaxed) + index * stride;
            return Ok(Self {
                lo,
                stride,
                chunk,
                index,
            });
        }
        let (chunk, index, covered) = match pool.chunks.last_mut() {
            Some((c, used, guarded)) if *used < CHUNKS[*c].len.load(Ordering::Relaxed) / stride => {
                *used += 1;
                let index = *used - 1;
                if index >= *guarded {
                    let per_chunk = CHUNKS[*c].len.load(Ordering::Relaxed) / stride;
                    *guarded = index + install_guards(*c, index, per_chunk, stride);
                }
                (*c, index, index < *guarded)
            }
            _ => {
                if g.chunks_used >= MAX_CHUNKS {
                    return Err(std::io::Error::other(format!(
                        "no address space left for user-thread stacks ({MAX_CHUNKS} chunks of {} MiB mapped)",
                        CHUNK_BYTES >> 20
                    )));
                }
                let c = g.chunks_used;
                // A process limited in address space (`ulimit -v`) may not
                // get a whole chunk: take what it can, down to one stack.
                let mut per_chunk = (CHUNK_BYTES / stride).max(1);
                loop {
                    match map_chunk(c, per_chunk * stride, stride, per_chunk) {
                        Ok(()) => break,
                        Err(_) if per_chunk > 1 => per_chunk = (per_chunk / 8).max(1),
                        Err(e) => return Err(e),
                    }
                }
                g.chunks_used += 1;
                let guarded = install_guards(c, 0, per_chunk, stride);
                pool.chunks.push((c, 1, guarded));
                (c, 0, guarded > 0)
            }
        };
        let lo = CHUNKS[chunk].base.load(Ordering::Relaxed) + index * stride;
        if !covered {
            // No batch (no markers on this kernel, or batches refused).
            install_guard(lo, page)?;
        }
        Ok(Self {
            lo,
            stride,
            chunk,
            index,
        })
    }

    /// Usable bytes (the guard page excluded).
    #[cfg(test)]
    pub(crate) fn usable(&self) -> usize {
        self.stride - page()
    }

    /// Records which thread context runs on this stack, for the overflow
    /// message.
    pub(crate) fn set_owner(&self, owner: *const ThreadContext) {
        let owners = CHUNKS[self.chunk].owners.load(Ordering::Acquire);
        // SAFETY: `owners` is the chunk's leaked array with one entry per
        // stack, and `index` is within it.
        unsafe { &*owners.add(self.index) }.store(owner.cast_mut(), Ordering::Release);
    }

    /// The stack's extent.
    pub(crate) fn range(&self) -> StackRange {
        StackRange {
            lo: self.lo,
            stride: self.stride,
        }
    }
}

// SAFETY: `base` and `limit` describe `[lo, lo + stride)`, a range of a
// private read-write mapping that only this `PoolStack` uses until it is
// dropped; both are page-aligned (so 16-byte aligned), and the limit
// includes the guard page.
unsafe impl Stack for PoolStack {
    fn base(&self) -> StackPointer {
        StackPointer::new(self.lo + self.stride).expect("stack top is not null")
    }

    fn limit(&self) -> StackPointer {
        StackPointer::new(self.lo).expect("stack bottom is not null")
    }
}

impl Drop for PoolStack {
    fn drop(&mut self) {
        self.set_owner(std::ptr::null());
        self.range().give_back_below(self.lo + self.stride);
        let mut g = POOLS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = g.pools.iter_mut().find(|p| p.stride == self.stride) {
            p.free.push((self.chunk, self.index));
        }
    }
}

/// Maps chunk `c`: `len` bytes reserved, nothing committed.
fn map_chunk(c: usize, len: usize, stride: usize, stacks: usize) -> std::io::Result<()> {
    // SAFETY: an anonymous private mapping at an address the kernel
    // chooses; it never overlaps anything we own.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!(
                "cannot map {} KiB of address space for user-thread stacks: {e}",
                len >> 10
            ),
        ));
    }
    // No transparent huge pages in stacks: with THP set to `always` (the
    // Debian kernel's default) the first touch of a stack faulted in the
    // whole 2 MiB page around it, eight stacks' worth, and a parked thread
    // cost ~180 KiB instead of ~5. Advice only: a kernel without THP
    // refuses it, and nothing changes.
    // SAFETY: the range is the mapping just made, ours alone.
    unsafe { libc::madvise(base, len, libc::MADV_NOHUGEPAGE) };
    let owners: &'static [AtomicPtr<ThreadContext>] = Box::leak(
        (0..stacks)
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect(),
    );
    let e = &CHUNKS[c];
    e.owners
        .store(owners.as_ptr().cast_mut(), Ordering::Relaxed);
    e.stride.store(stride, Ordering::Relaxed);
    e.len.store(len, Ordering::Relaxed);
    e.base.store(base as usize, Ordering::Release);
    Ok(())
}

/// Stacks whose guard markers are installed with one system call, ahead of
/// use: a marker costs ~0.7-1.0 µs alone and ~0.45 µs in a batch on a
/// VM, and a spawner that outruns its threads' ends makes a stack for most
/// spawns. The markers of stacks not yet handed out cost a page-table entry
/// each, no memory.
const GUARD_BATCH: usize = 64;

/// Installs the guard markers of stacks `first..` of chunk `c` (at most
/// [`GUARD_BATCH`], within the chunk's `per_chunk`) with one
/// `process_madvise` (Linux 6.14+); returns how many. 0 when the kernel has
/// no markers or refuses the batch: the caller installs each guard itself.
fn install_guards(c: usize, first: usize, per_chunk: usize, stride: usize) -> usize {
    if GUARD_KIND.load(Ordering::Relaxed) == 2 || BATCH_GUARDS_REFUSED.load(Ordering::Relaxed) {
        return 0;
    }
    let page = page();
    let base = CHUNKS[c].base.load(Ordering::Relaxed);
    let n = GUARD_BATCH.min(per_chunk.saturating_sub(first));
    let iov: Vec<libc::iovec> = (first..first + n)
        .map(|i| libc::iovec {
            iov_base: (base + i * stride) as *mut libc::c_void,
            iov_len: page,
        })
        .collect();
    // SAFETY: each range is the first page of a stack of a chunk we mapped,
    // not handed out yet, so it holds nothing; the kernel only reads the
    // array.
    let r = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            PIDFD_SELF,
            iov.as_ptr(),
            iov.len(),
            MADV_GUARD_INSTALL,
            0,
        )
    };
    if r >= 0 && r as usize == n * page {
        GUARD_KIND.store(1, Ordering::Relaxed);
        return n;
    }
    BATCH_GUARDS_REFUSED.store(true, Ordering::Relaxed);
    0
}

/// Whether a batch of guard markers was refused once (then each stack's
/// guard is installed on its own).
static BATCH_GUARDS_REFUSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes `[lo, lo + page)` a guard: a marker if the kernel has them, else
/// `PROT_NONE`.
fn install_guard(lo: usize, page: usize) -> std::io::Result<()> {
    if GUARD_KIND.load(Ordering::Relaxed) != 2 {
        // SAFETY: the page lies in a mapping we made and holds nothing.
        let r = unsafe { libc::madvise(lo as *mut libc::c_void, page, MADV_GUARD_INSTALL) };
        if r == 0 {
            GUARD_KIND.store(1, Ordering::Relaxed);
            return Ok(());
        }
    }
    // SAFETY: as above.
    let r = unsafe { libc::mprotect(lo as *mut libc::c_void, page, libc::PROT_NONE) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cannot make a stack guard page: {e} (vm.max_map_count reached?)"),
        ));
    }
    GUARD_KIND.store(2, Ordering::Relaxed);
    Ok(())
}

/// For the overflow handler (async-signal-safe: atomics only): if `addr`
/// is in a stack's guard page, that stack's owner and usable size.
pub(crate) fn find_guard(addr: usize) -> Option<(*const ThreadContext, usize)> {
    let page = page();
    for e in CHUNKS.iter() {
        let base = e.base.load(Ordering::Acquire);
        if base == 0 {
            // Chunks are filled in order: the rest are empty.
            return None;
        }
        let len = e.len.load(Ordering::Relaxed);
        if addr < base || addr >= base + len {
            continue;
        }
        let stride = e.stride.load(Ordering::Relaxed);
        let off = addr - base;
        if off % stride >= page {
            return None;
        }
        let owners = e.owners.load(Ordering::Relaxed);
        // SAFETY: the array has `len / stride` entries and `off / stride`
        // is below that.
        let owner = unsafe { &*owners.add(off / stride) }.load(Ordering::Acquire);
        return Some((owner, stride - page));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mappings of this process that overlap `[lo, hi)`.
    fn maps_within(lo: usize, hi: usize) -> usize {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let (a, b) = l.split_whitespace().next()?.split_once('-')?;
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            })
            .filter(|&(a, b)| a < hi && b > lo)
            .count()
    }

    #[test]
    fn stacks_are_guarded_and_recycled() {
        let a = PoolStack::new(64 * 1024).unwrap();
        let b = PoolStack::new(64 * 1024).unwrap();
        assert!(a.usable() >= 64 * 1024);
        assert_ne!(a.lo, b.lo);
        assert!(find_guard(a.lo).is_some());
        assert!(find_guard(a.lo + page()).is_none());
        let lo = b.lo;
        drop(b);
        let c = PoolStack::new(64 * 1024).unwrap();
        assert_eq!(c.lo, lo, "a dropped stack is reused");
    }

    #[test]
    fn many_stacks_cost_no_mappings_with_guard_markers() {
        let stacks: Vec<_> = (0..2000)
            .map(|_| PoolStack::new(32 * 1024).unwrap())
            .collect();
        let lo = stacks.iter().map(|s| s.lo).min().unwrap();
        let hi = stacks.iter().map(|s| s.lo + s.stride).max().unwrap();
        let n = maps_within(lo, hi);
        match guard_kind() {
            // One chunk, maybe two (and pieces of others' stacks between).
            GuardKind::Marker => assert!(n < 16, "2000 stacks lie in {n} mappings"),
            // Older kernels: a guard splits the mapping.
            _ => assert!(n >= 2000, "{n}"),
        }
        drop(stacks);
    }

    #[test]
    fn stack_chunks_never_get_transparent_huge_pages() {
        let s = PoolStack::new(64 * 1024).unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut flags = None;
        for l in smaps.lines() {
            if let Some((a, b)) = l.split_whitespace().next().and_then(|r| r.split_once('-')) {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= s.lo + page() && s.lo + page() < b;
                    continue;
                }
            }
            if inside {
                if let Some(f) = l.strip_prefix("VmFlags:") {
                    flags = Some(f.to_string());
                }
            }
        }
        let flags = flags.expect("the stack's mapping in /proc/self/smaps");
        // `nh`: the mapping is advised MADV_NOHUGEPAGE (on a kernel built
        // without THP the advice is refused and there is nothing to check).
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            assert!(flags.split_whitespace().any(|f| f == "nh"), "{flags}");
        }
    }

    #[test]
    fn pages_below_the_stack_pointer_are_given_back() {
        let s = PoolStack::new(256 * 1024).unwrap();
        let lo = s.lo + page();
        let top = s.lo + s.stride;
        // SAFETY: the usable range is ours and mapped read-write.
        unsafe { std::ptr::write_bytes(lo as *mut u8, 7, top - lo) };
        s.range().give_back_below(top - 8 * 1024);
        // SAFETY: as above; given-back pages read as zero.
        unsafe {
            assert_eq!(*(lo as *const u8), 0);
            assert_eq!(*((top - 16 * 1024) as *const u8), 0);
            assert_eq!(*((top - 1) as *const u8), 7);
        }
    }

    #[test]
    fn a_batch_gives_back_the_ranges_of_many_stacks_and_nothing_above() {
        let stacks: Vec<_> = (0..40)
            .map(|_| PoolStack::new(64 * 1024).unwrap())
            .collect();
        let mut batch = GiveBack::default();
        for s in &stacks {
            let lo = s.lo + page();
            let top = s.lo + s.stride;
            // SAFETY: the usable range is ours and mapped read-write.
            unsafe { std::ptr::write_bytes(lo as *mut u8, 9, top - lo) };
            batch.add_below(s.range(), top - 4 * 1024);
        }
        assert!(!batch.is_empty());
        batch.flush();
        assert!(batch.is_empty());
        for s in &stacks {
            let lo = s.lo + page();
            let top = s.lo + s.stride;
            // SAFETY: as above; given-back pages read as zero.
            unsafe {
                assert_eq!(*(lo as *const u8), 0);
                assert_eq!(*((top - 4 * 1024 - 1) as *const u8), 0);
                assert_eq!(*((top - 4 * 1024) as *const u8), 9);
                assert_eq!(*((top - 1) as *const u8), 9);
            }
        }
    }

    #[test]
    fn a_range_outside_the_stack_is_not_added() {
        let s = PoolStack::new(64 * 1024).unwrap();
        let mut batch = GiveBack::default();
        // A stack pointer at the guard page or above the top: nothing.
        batch.add_below(s.range(), s.lo + page());
        batch.add_below(s.range(), s.lo + s.stride + page());
        assert!(batch.is_empty());
    }
}
