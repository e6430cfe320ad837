//! A spin lock for very short critical sections.
//!
//! On a user-thread runtime the holder of a lock can be a thread of the same
//! core that is not running (it was switched out). Spinning then would wait
//! forever, so after a short spin the waiter yields its core.

use crate::shim::{spin_loop, AtomicBool, MutPtr, Ordering, UnsafeCell};

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
}

// SAFETY: the lock gives one thread at a time access to the value.
unsafe impl<T: Send> Send for SpinLock<T> {}
// SAFETY: as above; `T: Send` suffices since access is exclusive.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// Access to a [`SpinLock`]'s value; unlocks on drop.
pub struct SpinLockGuard<'a, T> {
    lock: &'a SpinLock<T>,
    ptr: MutPtr<T>,
}

const SPINS_BEFORE_YIELD: u32 = 64;

impl<T> SpinLock<T> {
    /// An unlocked lock holding `value`.
    pub fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, spinning (and yielding the core after a while).
    #[inline]
    pub fn lock(&self) -> SpinLockGuard<'_, T> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
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
    #[inline]
    pub fn try_lock(&self) -> Option<SpinLockGuard<'_, T>> {
        if self.locked.swap(true, Ordering::Acquire) {
            None
        } else {
            Some(SpinLockGuard {
                lock: self,
                ptr: self.value.get_mut(),
            })
        }
    }
}

impl<T> std::ops::Deref for SpinLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so access is exclusive.
        unsafe { self.ptr.deref() }
    }
}

impl<T> std::ops::DerefMut for SpinLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, so access is exclusive.
        unsafe { self.ptr.deref() }
    }
}

impl<T> Drop for SpinLockGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
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
