//! Slots that the thread running on a core has claimed ahead on other cores.
//!
//! A thread that creates threads on another core in a burst paid, for each
//! one, a turn of that core's occupancy word: a transfer of the line, which
//! the receiving core reads on every poll and writes whenever a thread
//! exits. With the vCPUs on two L3s (a transfer ~200 ns) that capped
//! creation throughput from one spawner at ~4 M/s. So the second and later
//! spawns of a run claim up to [`RESERVE`] free slots of the chosen core at
//! once (one locked `or` of their bits) and keep the ones they do not use
//! yet; the next spawns onto that core fill them without touching its
//! word. The claim starts the transfer of every reserved slot's first
//! line, and on most CPUs each spawn from the reservation that of the next
//! one's (`sched::spawn::prefetch_reserved`).
//!
//! A reservation lives only while the thread that made it runs: when the
//! thread switches out (yields, blocks or exits), its dispatcher gives every
//! reserved slot back. The first spawn of a run claims one slot, so a thread
//! that creates one thread at a time never holds any. Meanwhile a reserved
//! slot looks occupied to everyone: its core's dispatcher skips it (nothing
//! is published there), placement counts it, and a core being released
//! waits for it as for a slot whose spawner is still writing it.
//!
//! Only the kernel thread that runs the core touches its `Reservations`
//! (the running thread's spawns and the dispatcher between runs), so the
//! fields are atomics read and written with plain loads and stores.

use crate::sched::core::Core;
use crate::shim::{AtomicU32, AtomicU64, Ordering};

/// Slots claimed at most at once by a spawn that is not the first of its
/// run.
pub(crate) const RESERVE: u32 = 8;

/// A burst's claims take at least 1/`BURST_SHARE` of the threads it has
/// put on each candidate core so far (up to [`RESERVE`]), whatever the
/// chosen core's lead (see `crate::sched::spawn`), so a long burst's
/// imbalance stays within about that share of each core's threads.
pub(crate) const BURST_SHARE: u32 = 8;

/// Cores a runtime can have (one reservation word each).
const MAX_CORES: usize = 64;

/// One core's reservations on the other cores (see the module docs).
#[derive(Debug)]
pub(crate) struct Reservations {
    /// Spawns by the running thread since it was switched in (saturates).
    spawns: AtomicU32,
    /// The cores on which slots are reserved (bit per core index).
    cores: AtomicU64,
    /// Reserved slots, by the index of the core that holds them.
    bits: [AtomicU64; MAX_CORES],
    /// The candidate cores (a core mask) of the spawn that reserved them:
    /// only a spawn with the same candidates takes them, so a burst pinned
    /// to one core does not capture later spawns that placement would
    /// send elsewhere.
    made_for: [AtomicU64; MAX_CORES],
}

impl Reservations {
    /// None held.
    pub(crate) fn new() -> Self {
        Self {
            spawns: AtomicU32::new(0),
            cores: AtomicU64::new(0),
            bits: [const { AtomicU64::new(0) }; MAX_CORES],
            made_for: [const { AtomicU64::new(0) }; MAX_CORES],
        }
    }

    /// Counts a spawn of the running thread; returns the spawns it made
    /// before this one in its run (0: the first, which claims no more
    /// than its slot).
    #[inline]
    pub(crate) fn count_spawn(&self) -> u32 {
        let n = self.spawns.load(Ordering::Relaxed);
        self.spawns.store(n.saturating_add(1), Ordering::Relaxed);
        n
    }

    /// Takes a reserved slot on one of the cores in `candidates` (a core
    /// mask), if one is held: the burst's placement was decided when the
    /// slots were claimed. Returns the core index, the slot, and the slot
    /// the next take there will return (if one is left).
    #[inline]
    pub(crate) fn take(&self, candidates: u64) -> Option<(usize, usize, Option<usize>)> {
        let mut on = self.cores.load(Ordering::Relaxed) & candidates;
        while on != 0
            && self.made_for[on.trailing_zeros() as usize].load(Ordering::Relaxed) != candidates
        {
            on &= on - 1;
        }
        if on == 0 {
            return None;
        }
        let target = on.trailing_zeros() as usize;
        let word = &self.bits[target];
        let held = word.load(Ordering::Relaxed);
        let rest = held & held.wrapping_sub(1);
        word.store(rest, Ordering::Relaxed);
        if rest == 0 {
            self.cores.store(
                self.cores.load(Ordering::Relaxed) & !(1 << target),
                Ordering::Relaxed,
            );
        }
        let next = (rest != 0).then(|| rest.trailing_zeros() as usize);
        Some((target, held.trailing_zeros() as usize, next))
    }

    /// Keeps `slots` (claimed on core `target` by a spawn whose candidate
    /// cores were `candidates`) for the next spawns with those candidates.
    #[inline]
    pub(crate) fn keep(&self, target: usize, slots: u64, candidates: u64) {
        if slots == 0 {
            return;
        }
        if let Some(word) = self.bits.get(target) {
            word.store(word.load(Ordering::Relaxed) | slots, Ordering::Relaxed);
            self.made_for[target].store(candidates, Ordering::Relaxed);
            self.cores.store(
                self.cores.load(Ordering::Relaxed) | (1 << target),
                Ordering::Relaxed,
            );
        }
    }

    /// The running thread switched out: gives every reserved slot back to
    /// its core and starts the count of spawns anew.
    ///
    /// `cores` gives the runtime's cores; it is called only when something
    /// is reserved (so the dispatcher's run loop, where this sits, loads
    /// nothing else when nothing is).
    #[inline]
    pub(crate) fn end_run<'c>(&self, cores: impl FnOnce() -> &'c [Core]) {
        if self.spawns.load(Ordering::Relaxed) != 0 {
            self.give_back(cores());
        }
    }

    #[cold]
    fn give_back(&self, cores: &[Core]) {
        self.spawns.store(0, Ordering::Relaxed);
        let mut on = self.cores.load(Ordering::Relaxed);
        self.cores.store(0, Ordering::Relaxed);
        while on != 0 {
            let target = on.trailing_zeros() as usize;
            on &= on - 1;
            let held = self.bits[target].load(Ordering::Relaxed);
            self.bits[target].store(0, Ordering::Relaxed);
            if let Some(core) = cores.get(target) {
                core.mask.release_all(held);
            }
        }
    }
}
