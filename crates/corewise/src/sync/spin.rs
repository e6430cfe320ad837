//! A spin lock for very short critical sections.
//!
//! On a user-thread runtime the holder of a lock can be a thread of the same
//! core that is not running (it was switched out). Spinning then would wait
//! forever, so after a short spin the waiter yields its core.

use crate::shim::{spin_loop, AtomicBool, MutPtr, Ordering, UnsafeCell};
use std::mem::ManuallyDrop;

/// A test-and-test-and-set lock. Do not block while holding it.
///
/// ```
/// use corewise::sync::SpinLock;
/// let l = SpinLock::new(1);
/// *l.lock() += 1;
/// assert_eq!(*l.lock(), 2);
/// ```
#[derive(Debug)]
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
    /// Model-only: lets a contender block until the lock is released.
    #[cfg(loom)]
    model: ModelGate,
}

// SAFETY: the lock gives one thread at a time access to the value.
unsafe impl<T: Send> Send for SpinLock<T> {}
// SAFETY: as above; `T: Send` suffices since access is exclusive.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// Access to a [`SpinLock`]'s value; unlocks on drop.
///
/// ```
/// let l = corewise::sync::SpinLock::new(0);
/// let mut g = l.lock();
/// *g += 5;
/// assert!(l.try_lock().is_none()); // locked while the guard lives
/// drop(g);
/// assert_eq!(*l.lock(), 5);
/// ```
pub struct SpinLockGuard<'a, T> {
    lock: &'a SpinLock<T>,
    // Dropped before the lock is released, so loom sees the access end
    // inside the critical section.
    ptr: ManuallyDrop<MutPtr<T>>,
}

const SPINS_BEFORE_YIELD: u32 = 64;

impl<T> SpinLock<T> {
    /// An unlocked lock holding `value` (usable in a `static`).
    ///
    /// ```
    /// static L: corewise::sync::SpinLock<u32> = corewise::sync::SpinLock::new(0);
    /// *L.lock() += 1;
    /// assert_eq!(*L.lock(), 1);
    /// ```
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// An unlocked lock holding `value`.
    #[cfg(loom)]
    pub fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
            model: ModelGate::new(),
        }
    }

    /// Takes the lock, spinning (and yielding the core after a while).
    ///
    /// ```
    /// use corewise::sync::SpinLock;
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let l = Arc::new(SpinLock::new(0u32));
    /// let hs: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let l = l.clone();
    ///         rt.spawn(move || for _ in 0..100 { *l.lock() += 1 }).unwrap()
    ///     })
    ///     .collect();
    /// for h in hs {
    ///     h.join().unwrap();
    /// }
    /// assert_eq!(*l.lock(), 400);
    /// ```
    #[inline]
    pub fn lock(&self) -> SpinLockGuard<'_, T> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            // The model blocks a contender until the next unlock instead of
            // spinning: see `ModelGate`.
            #[cfg(loom)]
            return self.model.lock_contended(self);
            #[allow(unreachable_code)]
            let mut spins = 0;
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins >= SPINS_BEFORE_YIELD {
                    spins = 0;
                    #[cfg(not(loom))]
                    crate::thread::yield_now();
                }
                spin_loop();
            }
        }
    }

    /// Takes the lock if it is free.
    ///
    /// ```
    /// let l = corewise::sync::SpinLock::new('x');
    /// let g = l.try_lock().unwrap();
    /// assert!(l.try_lock().is_none());
    /// drop(g);
    /// assert_eq!(l.try_lock().map(|g| *g), Some('x'));
    /// ```
    #[inline]
    pub fn try_lock(&self) -> Option<SpinLockGuard<'_, T>> {
        // A compare-exchange, not a swap: a failed attempt must not write.
        // A failing `swap(true)` stores `true`, and loom (whose modification
        // order is partial) may then let every later swap of the spinner
        // read its own previous `true` instead of the holder's unlocking
        // store, spinning forever. A failed CAS stores nothing, so the
        // unlock is the newest store and the next attempt sees it. (Same
        // cost as the swap in production: one locked instruction.)
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            None
        } else {
            Some(SpinLockGuard {
                lock: self,
                ptr: ManuallyDrop::new(self.value.get_mut()),
            })
        }
    }
}

impl<T> std::ops::Deref for SpinLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so access is exclusive.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> std::ops::DerefMut for SpinLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, so access is exclusive.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> Drop for SpinLockGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        self.lock.locked.store(false, Ordering::Release);
        #[cfg(loom)]
        self.lock.model.released();
    }
}

/// How the loom models wait for a held spin lock.
///
/// Spinning (even with `yield_now`) does not terminate in loom: with two
/// contenders and the holder preempted, the scheduler may hand the core back
/// and forth between the contenders forever (a yield is not a preemption,
/// so the preemption bound does not cut this off), and the model exceeds its
/// branch limit. A contender's failed compare-exchanges write nothing and
/// its `Relaxed` polling loads have no effect, so every interleaving of the
/// real spin loop is equivalent to one in which the contender sleeps until
/// an unlock and then retries; that is what the model does, with a loom
/// mutex and condition variable.
///
/// `contenders` (only read-modify-writes, all `Relaxed`, so they read the
/// newest value and create no happens-before edge) lets an unlock skip the
/// gate when nobody waits, so uncontended lock/unlock pairs synchronize only
/// through `locked`, as in production. A contender registers before it takes
/// the gate and retries the compare-exchange under it, and an unlock that
/// sees a registration takes the gate before notifying, so a release cannot
/// fall between a contender's failed retry and its wait.
#[cfg(loom)]
#[derive(Debug)]
struct ModelGate {
    contenders: crate::shim::AtomicUsize,
    gate: loom::sync::Mutex<()>,
    released: loom::sync::Condvar,
}

#[cfg(loom)]
impl ModelGate {
    fn new() -> Self {
        Self {
            contenders: crate::shim::AtomicUsize::new(0),
            gate: loom::sync::Mutex::new(()),
            released: loom::sync::Condvar::new(),
        }
    }

    fn lock_contended<'a, T>(&self, lock: &'a SpinLock<T>) -> SpinLockGuard<'a, T> {
        self.contenders.fetch_add(1, Ordering::Relaxed);
        let mut gate = self.gate.lock().unwrap();
        loop {
            if let Some(g) = lock.try_lock() {
                self.contenders.fetch_sub(1, Ordering::Relaxed);
                return g;
            }
            gate = self.released.wait(gate).unwrap();
        }
    }

    fn released(&self) {
        if self.contenders.fetch_add(0, Ordering::Relaxed) != 0 {
            drop(self.gate.lock().unwrap());
            self.released.notify_all();
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn spin_lock_excludes() {
        loom::model(|| {
            let l = Arc::new(SpinLock::new(0));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    loom::thread::spawn(move || *l.lock() += 1)
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(*l.lock(), 2);
        });
    }
}
