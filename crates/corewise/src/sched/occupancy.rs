//! One `Core` per CPU the runtime may use: 56 thread slots and the words that
//! other cores touch to claim a slot, wake a thread or wake the core.
//!
//! The layout follows Arachne. A slot's first cache line holds the function
//! of the thread that will start there, so creating a thread on another core
//! costs the transfer of that line and of the slot's wakeup line, nothing
//! more. The occupancy of all 56 slots is one atomic word (`MaskAndCount`),
//! so power-of-two-choices placement reads one word per candidate core and
//! a spawner claims a slot with one atomic bit-test-and-set.
//!
//! Unlike Arachne's, the word keeps no separate count: the count is the
//! mask's population count. With a count in the word, a claim had to be a
//! compare-and-swap of the whole word, which failed (and cost another
//! transfer of the line) whenever the core freed some other slot between
//! the spawner's read and its swap, and a busy receiving core frees one
//! after every thread. A `lock bts` on the claimed bit succeeds whatever
//! happened to the other bits (creation throughput from one spawner
//! 13.0 -> 16.3 M/s at a round trip of ~56 ns, 3.7 -> 4.1 M/s at ~420 ns).
//! A departure from Arachne's "mask and count" word, which keeps its
//! name here.

use crate::shim::{AtomicU64, Ordering};

/// Thread slots per core (Arachne's 56; the word's top 8 bits are unused).
pub(crate) const SLOTS: usize = 56;
const OCCUPANCY: u64 = (1 << SLOTS) - 1;

/// A core's slot occupancy mask (low 56 bits); the occupied-slot count is
/// its population count.
#[derive(Debug)]
pub(crate) struct MaskAndCount(AtomicU64);

impl MaskAndCount {
    /// All slots free.
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The occupancy mask.
    #[inline]
    pub(crate) fn occupied(&self) -> u64 {
        self.0.load(Ordering::Acquire) & OCCUPANCY
    }

    /// The number of occupied slots.
    #[inline]
    pub(crate) fn count(&self) -> u32 {
        (self.0.load(Ordering::Relaxed) & OCCUPANCY).count_ones()
    }

    /// Claims the lowest free slot, or `None` when all 56 are taken. Acquire:
    /// what the slot's previous thread wrote is visible to the new owner.
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        self.claim_from(0)
    }

    /// Claims the first free slot at or after `start`, wrapping around: the
    /// slot the dispatcher's scan, which starts at `start`, reaches first.
    /// Claims made one after another from the slot after the previous one
    /// are reached in the order they were made. Acquire, as [`claim`](Self::claim).
    #[inline]
    pub(crate) fn claim_from(&self, start: usize) -> Option<usize> {
        let ahead = (!0u64).checked_shl(start as u32).unwrap_or(0);
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let free = !cur & OCCUPANCY;
            if free == 0 {
                return None;
            }
            let slot = if free & ahead != 0 {
                (free & ahead).trailing_zeros()
            } else {
                free.trailing_zeros()
            } as usize;
            let bit = 1u64 << slot;
            // Only the claimed bit's old value is used, so this is one
            // `lock bts`, which a concurrent release of another slot
            // cannot make fail (a compare-and-swap of the word could).
            if self.0.fetch_or(bit, Ordering::Acquire) & bit == 0 {
                return Some(slot);
            }
            cur = self.0.load(Ordering::Relaxed);
        }
    }

    /// Claims up to `max` of the lowest free slots with one locked
    /// instruction (a `lock or` of their bits; those another claim took
    /// meanwhile are not ours, and only when it took all of them is the
    /// word read again); returns the lowest slot claimed and the others as
    /// bits (see `crate::reserve`), or `None` when all 56 are taken. One
    /// locked instruction, not one per slot: the core polls this word and
    /// frees a slot at every thread's end, so each further locked
    /// instruction would wait for the line again. Acquire, as
    /// [`claim`](Self::claim).
    #[inline]
    pub(crate) fn claim_ahead(&self, max: u32) -> Option<(usize, u64)> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let mut free = !cur & OCCUPANCY;
            if free == 0 {
                return None;
            }
            let mut want = 0u64;
            for _ in 0..max {
                let bit = free & free.wrapping_neg();
                want |= bit;
                free &= !bit;
                if free == 0 {
                    break;
                }
            }
            let old = self.0.fetch_or(want, Ordering::Acquire);
            let got = want & !old;
            if got != 0 {
                return Some((got.trailing_zeros() as usize, got & (got - 1)));
            }
            cur = old;
        }
    }

    /// Frees `slot`, which the caller owns. Release: pairs with `claim`.
    #[inline]
    pub(crate) fn release(&self, slot: usize) {
        self.release_all(1u64 << slot);
    }

    /// Frees every slot in `slots` (bits), all owned by the caller and
    /// never filled (returned reservations).
    #[inline]
    pub(crate) fn release_all(&self, slots: u64) {
        self.0.fetch_and(!slots, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn claim_fills_all_56_slots_then_fails() {
        let m = MaskAndCount::new();
        for i in 0..SLOTS {
            assert_eq!(m.claim(), Some(i));
            assert_eq!(m.count() as usize, i + 1);
        }
        assert_eq!(m.claim(), None);
        m.release(7);
        assert_eq!(m.count() as usize, SLOTS - 1);
        assert_eq!(m.claim(), Some(7));
    }

    #[test]
    fn claim_ahead_takes_the_lowest_free_slots_at_once() {
        let m = MaskAndCount::new();
        assert_eq!(m.claim_from(1), Some(1));
        assert_eq!(m.claim_from(3), Some(3));
        // Free: 0, 2, 4, 5, ...: four of them, the first returned alone.
        assert_eq!(m.claim_ahead(4), Some((0, (1 << 2) | (1 << 4) | (1 << 5))));
        assert_eq!(m.count(), 6);
        // Fewer free than asked: what is left.
        while m.count() < SLOTS as u32 - 2 {
            m.claim().unwrap();
        }
        let (first, more) = m.claim_ahead(8).unwrap();
        assert_eq!(more.count_ones(), 1);
        assert!(first < SLOTS && more & (1 << first) == 0);
        assert_eq!(m.claim_ahead(8), None);
    }

    #[test]
    fn claim_from_takes_the_first_free_slot_the_scan_reaches() {
        let m = MaskAndCount::new();
        assert_eq!(m.claim_from(10), Some(10));
        assert_eq!(m.claim_from(10), Some(11));
        assert_eq!(m.claim_from(SLOTS - 1), Some(SLOTS - 1));
        // Nothing free at or after the start: the scan wraps to slot 0.
        assert_eq!(m.claim_from(SLOTS - 1), Some(0));
        assert_eq!(m.claim_from(SLOTS), Some(1));
        assert_eq!(m.claim_from(64), Some(2));
        while m.claim_from(5).is_some() {}
        assert_eq!(m.count() as usize, SLOTS);
    }
}
