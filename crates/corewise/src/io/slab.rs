//! Operation records of one core: who waits for an operation and where its
//! result goes.
//!
//! A record is named by a token, `generation << 32 | index`, which is what
//! goes into an SQE's `user_data` (or an epoll waiter list). The generation
//! makes a token unique over time: a completion, a cancel request or a
//! readiness event that arrives for a record that has since been reused
//! matches nothing. Records are touched only by the core's kernel thread
//! (its dispatcher and the user threads it runs), so there are no atomics
//! here. The result goes into an [`OpCell`] owned by the waiter (on its
//! stack, or in a batch's heap entry) and the record is freed at once: a
//! waiter never has to look at a core's table after its operation is done,
//! which matters when its thread has migrated to another core meanwhile.

use crate::thread::ThreadId;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// `user_data` of completions nobody waits for (linked timeouts, cancels).
pub(crate) const IGNORE: u64 = u64::MAX;
/// `user_data` of the idle futex wait on the core's gate word.
pub(crate) const GATE: u64 = u64::MAX - 1;
/// The result of an operation that its core cancelled because the core was
/// released: the waiter submits it again on the core it now runs on.
pub(crate) const EVACUATED: i32 = i32::MIN;

/// Where an operation's result is delivered; owned by the waiter.
#[derive(Debug, Default)]
pub(crate) struct OpCell {
    done: AtomicBool,
    result: AtomicI32,
}

impl OpCell {
    /// The result, once delivered.
    #[inline]
    pub(crate) fn get(&self) -> Option<i32> {
        self.done
            .load(Ordering::Acquire)
            .then(|| self.result.load(Ordering::Relaxed))
    }

    /// Makes the cell reusable for a new operation (its last one is done).
    pub(crate) fn reset(&self) {
        self.done.store(false, Ordering::Relaxed);
    }

    fn set(&self, r: i32) {
        self.result.store(r, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
    }
}

#[derive(Debug)]
struct Record {
    generation: u32,
    pending: bool,
    cell: *const OpCell,
    waiter: Option<ThreadId>,
    next_free: u32,
}

/// A growable table of records with a free list.
#[derive(Debug, Default)]
pub(crate) struct Slab {
    records: Vec<Record>,
    free: Option<u32>,
    pending: u32,
}

const NONE: u32 = u32::MAX;

impl Slab {
    /// A table with room for `n` records before it grows.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            records: Vec::with_capacity(n),
            free: None,
            pending: 0,
        }
    }

    /// A pending record delivering to `cell` and waking `waiter`.
    ///
    /// # Safety
    /// `cell` stays valid until the record completes or is freed.
    pub(crate) unsafe fn alloc(&mut self, cell: *const OpCell, waiter: Option<ThreadId>) -> u64 {
        let index = match self.free {
            Some(i) => {
                let next = self.records[i as usize].next_free;
                self.free = (next != NONE).then_some(next);
                i
            }
            None => {
                self.records.push(Record {
                    generation: 0,
                    pending: false,
                    cell: std::ptr::null(),
                    waiter: None,
                    next_free: NONE,
                });
                (self.records.len() - 1) as u32
            }
        };
        let r = &mut self.records[index as usize];
        r.generation = r.generation.wrapping_add(1);
        r.pending = true;
        r.cell = cell;
        r.waiter = waiter;
        self.pending += 1;
        (u64::from(r.generation) << 32) | u64::from(index)
    }

    fn index(&self, token: u64) -> Option<usize> {
        let i = (token & 0xffff_ffff) as usize;
        let r = self.records.get(i)?;
        (u64::from(r.generation) == token >> 32 && r.pending).then_some(i)
    }

    fn release(&mut self, i: usize) -> Option<ThreadId> {
        let free = self.free;
        let r = &mut self.records[i];
        r.pending = false;
        r.cell = std::ptr::null();
        r.next_free = free.unwrap_or(NONE);
        self.free = Some(i as u32);
        self.pending -= 1;
        r.waiter.take()
    }

    /// Delivers `result` to a pending record's cell and frees it; returns
    /// its waiter to signal (`None`: stale token).
    pub(crate) fn complete(&mut self, token: u64, result: i32) -> Option<Option<ThreadId>> {
        let i = self.index(token)?;
        // SAFETY: the cell is valid while the record is pending (`alloc`).
        unsafe { (*self.records[i].cell).set(result) };
        Some(self.release(i))
    }

    /// Completes every pending record with `result` (core evacuation).
    pub(crate) fn complete_all(&mut self, result: i32) -> Vec<ThreadId> {
        let mut woken = Vec::new();
        for i in 0..self.records.len() {
            if self.records[i].pending {
                // SAFETY: as in `complete`.
                unsafe { (*self.records[i].cell).set(result) };
                woken.extend(self.release(i));
            }
        }
        woken
    }

    /// Whether the record is still pending.
    pub(crate) fn is_pending(&self, token: u64) -> bool {
        self.index(token).is_some()
    }

    /// Frees a pending record without delivering (its waiter gave up and
    /// nothing of the kernel's points at the cell); stale tokens are ignored.
    pub(crate) fn free(&mut self, token: u64) {
        if let Some(i) = self.index(token) {
            self.release(i);
        }
    }

    /// Records still waiting for their event.
    pub(crate) fn pending(&self) -> u32 {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_go_stale_when_records_are_reused() {
        let mut s = Slab::with_capacity(2);
        let cell = OpCell::default();
        // SAFETY: `cell` outlives the records.
        let a = unsafe { s.alloc(&cell, None) };
        assert!(s.is_pending(a));
        assert_eq!(cell.get(), None);
        assert_eq!(s.complete(a, 7), Some(None));
        assert_eq!(cell.get(), Some(7));
        assert_eq!(s.complete(a, 8), None, "completed once");
        let cell2 = OpCell::default();
        // SAFETY: as above.
        let b = unsafe { s.alloc(&cell2, None) };
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff, "index reused");
        assert_ne!(a, b);
        assert_eq!(s.complete(a, 1), None, "stale token");
        assert_eq!(s.pending(), 1);
        assert_eq!(s.complete_all(EVACUATED).len(), 0);
        assert_eq!(cell2.get(), Some(EVACUATED));
        assert_eq!(s.pending(), 0);
    }
}
