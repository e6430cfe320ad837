//! The result cell between a user thread and whoever joins it.
//!
//! The thread stores its result and sets `DONE`; the joiner stores its
//! waiter handle and sets `WAITING`. Both flags live in one word changed by
//! `fetch_or`, so exactly one side sees the other's flag: the finisher wakes
//! the joiner only if the joiner registered first, and a joiner that comes
//! second does not wait at all. No lock, and one allocation per joinable
//! thread.

use super::waiter::{park, Waiter};
use crate::shim::{AtomicU32, Ordering, UnsafeCell};

const DONE: u32 = 1;
const WAITING: u32 = 2;

pub(crate) struct Packet<T> {
    state: AtomicU32,
    waiter: UnsafeCell<Option<Waiter>>,
    result: UnsafeCell<Option<T>>,
}

// SAFETY: `result` is written by the finisher before DONE (release) and read
// by the joiner after seeing DONE (acquire); `waiter` is written by the
// joiner before WAITING and read by the finisher only after seeing WAITING.
unsafe impl<T: Send> Sync for Packet<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Packet<T> {}

impl<T> Packet<T> {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU32::new(0),
            waiter: UnsafeCell::new(None),
            result: UnsafeCell::new(None),
        }
    }

    /// Finisher: store the result and wake a registered joiner.
    pub(crate) fn complete(&self, value: T) {
        // SAFETY: only the finisher writes `result`, once, before DONE.
        self.result.with_mut(|r| unsafe { *r = Some(value) });
        let prev = self.state.fetch_or(DONE, Ordering::AcqRel);
        if prev & WAITING != 0 {
            // SAFETY: the joiner wrote the waiter before setting WAITING and
            // never touches it again.
            let w = self.waiter.with_mut(|w| unsafe { (*w).clone() });
            if let Some(w) = w {
                w.wake();
            }
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) & DONE != 0
    }

    /// Joiner (once): wait for the result and take it.
    pub(crate) fn wait(&self) -> T {
        if !self.is_done() {
            // SAFETY: only the (single) joiner writes `waiter`, before WAITING.
            self.waiter
                .with_mut(|w| unsafe { *w = Some(Waiter::current()) });
            if self.state.fetch_or(WAITING, Ordering::AcqRel) & DONE == 0 {
                while !self.is_done() {
                    park();
                }
            }
        }
        // SAFETY: DONE was observed with acquire; the finisher is done with
        // `result`, and the joiner takes it once.
        self.result
            .with_mut(|r| unsafe { (*r).take() })
            .expect("a done packet holds its result until joined")
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn join_sees_result_whichever_comes_first() {
        loom::model(|| {
            let p = Arc::new(Packet::new());
            let p2 = p.clone();
            let t = loom::thread::spawn(move || p2.complete(42));
            assert_eq!(p.wait(), 42);
            t.join().unwrap();
        });
    }
}
