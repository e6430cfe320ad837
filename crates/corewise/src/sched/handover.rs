//! A one-place mailbox between the handoff monitor, which provisions a
//! spare kernel thread and context for a core, and the handoff signal
//! handler, which takes them (see [`crate::sched::handoff`]).
//!
//! The pair must move as one: a handler that found a spare thread but no
//! context, and put the thread back, could overwrite a thread the monitor
//! provisioned meanwhile. So a state word guards the pair: the monitor
//! writes only an `EMPTY` box (`EMPTY -> FILLING -> FULL`), a taker (the
//! handler, or the monitor taking its spares back) claims a `FULL` one
//! (`FULL -> TAKING -> EMPTY`). The handler never waits: if it cannot
//! claim, it declines and the monitor asks again. One compare-and-swap per
//! side, no locks, so the handler stays async-signal-safe.

use crate::shim::{AtomicU32, Ordering, UnsafeCell};

const EMPTY: u32 = 0;
const FILLING: u32 = 1;
const FULL: u32 = 2;
const TAKING: u32 = 3;

/// A box for one value that one side fills and either side takes.
pub(crate) struct Handover<T: Copy> {
    state: AtomicU32,
    value: UnsafeCell<Option<T>>,
}

// SAFETY: `value` is written only by the filler between its EMPTY -> FILLING
// claim and the FULL release, and read only by a taker between its FULL ->
// TAKING claim and the EMPTY release: the state word orders every access.
unsafe impl<T: Copy + Send> Sync for Handover<T> {}

impl<T: Copy> Handover<T> {
    /// An empty box.
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            value: UnsafeCell::new(None),
        }
    }

    /// Whether a value waits in the box.
    pub(crate) fn is_full(&self) -> bool {
        self.state.load(Ordering::Acquire) == FULL
    }

    /// Puts `v` in the box if it is empty; gives it back otherwise.
    pub(crate) fn put(&self, v: T) -> Result<(), T> {
        if self
            .state
            .compare_exchange(EMPTY, FILLING, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(v);
        }
        // SAFETY: FILLING is ours: no taker reads until FULL.
        self.value.with_mut(|p| unsafe { *p = Some(v) });
        self.state.store(FULL, Ordering::Release);
        Ok(())
    }

    /// Takes the value if the box is full (never waits).
    pub(crate) fn take(&self) -> Option<T> {
        if self
            .state
            .compare_exchange(FULL, TAKING, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        // SAFETY: TAKING is ours: no filler writes until EMPTY.
        let v = self.value.with_mut(|p| unsafe { (*p).take() });
        self.state.store(EMPTY, Ordering::Release);
        v
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// The monitor provisions twice and takes its spares back while the
    /// handler takes once: every value put is taken exactly once, by one
    /// side, and none is lost.
    #[test]
    fn a_provisioned_pair_is_taken_once() {
        loom::model(|| {
            let h = Arc::new(Handover::<(u32, u32)>::new());
            let handler = {
                let h = h.clone();
                loom::thread::spawn(move || h.take())
            };
            let mut put = Vec::new();
            let mut back = Vec::new();
            for v in [(1, 10), (2, 20)] {
                match h.put(v) {
                    Ok(()) => put.push(v),
                    Err(_) => {}
                }
                loom::thread::yield_now();
            }
            back.extend(h.take());
            let taken = handler.join().unwrap();
            let mut got: Vec<_> = back.into_iter().chain(taken).collect();
            got.sort_unstable();
            // What the monitor put and nobody took is still in the box.
            got.extend(h.take());
            got.sort_unstable();
            put.sort_unstable();
            assert_eq!(got, put);
        });
    }
}
