//! A sleeping mutex: contended waiters block their user thread.

use super::notify_hint::NotifyHint;
use super::wait_queue::{WaitOutcome, WaitQueue};
use crate::shim::{spin_loop, AtomicU32, MutPtr, Ordering, UnsafeCell};
use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
const CONTENDED: u32 = 2;
/// Spins before blocking (none in the loom models, which explore each).
const SPINS: u32 = if cfg!(loom) { 0 } else { 100 };

/// A mutual-exclusion lock whose waiters block (user threads: only the
/// thread; OS threads: the OS thread).
///
/// ```
/// use corewise::sync::Mutex;
/// use std::sync::Arc;
/// let rt = corewise::Runtime::new().unwrap();
/// let m = Arc::new(Mutex::new(0u64));
/// let hs: Vec<_> = (0..8).map(|_| {
///     let m = m.clone();
///     rt.spawn(move || for _ in 0..1000 { *m.lock() += 1 }).unwrap()
/// }).collect();
/// for h in hs { h.join().unwrap(); }
/// assert_eq!(*m.lock(), 8000);
/// ```
pub struct Mutex<T> {
    state: AtomicU32,
    /// The condition variable its lockers will likely notify (see
    /// [`NotifyHint`]): in the lock's line, which a locker owns anyway.
    pub(crate) notify_hint: NotifyHint,
    waiters: WaitQueue,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives one thread at a time access to the value.
unsafe impl<T: Send> Send for Mutex<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Mutex<T> {}

/// Access to a [`Mutex`]'s value; unlocks on drop.
///
/// ```
/// let m = corewise::sync::Mutex::new(vec![1]);
/// {
///     let mut guard = m.lock();
///     guard.push(2); // DerefMut to the value
///     assert!(m.try_lock().is_none()); // held while the guard lives
/// }
/// assert_eq!(*m.try_lock().unwrap(), [1, 2]); // unlocked when it dropped
/// ```
pub struct MutexGuard<'a, T> {
    pub(crate) mutex: &'a Mutex<T>,
    // Dropped before the lock is released, so loom sees the access end
    // inside the critical section.
    ptr: ManuallyDrop<MutPtr<T>>,
}

impl<T> Mutex<T> {
    /// An unlocked mutex holding `value`.
    ///
    /// ```
    /// let m = corewise::sync::Mutex::new(String::from("a"));
    /// assert_eq!(*m.lock(), "a");
    /// ```
    pub fn new(value: T) -> Self {
        Self {
            state: AtomicU32::new(UNLOCKED),
            notify_hint: NotifyHint::new(),
            waiters: WaitQueue::new(),
            value: UnsafeCell::new(value),
        }
    }

    fn guard(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            mutex: self,
            ptr: ManuallyDrop::new(self.value.get_mut()),
        }
    }

    /// Takes the lock if it is free.
    ///
    /// ```
    /// let m = corewise::sync::Mutex::new(1);
    /// let g = m.try_lock().unwrap();
    /// assert!(m.try_lock().is_none());
    /// drop(g);
    /// assert_eq!(m.try_lock().map(|g| *g), Some(1));
    /// ```
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| self.guard())
    }

    /// Takes the lock, blocking while another thread holds it.
    ///
    /// ```
    /// use corewise::sync::Mutex;
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let l = log.clone();
    /// rt.block_on(move || l.lock().push("user thread")).unwrap();
    /// log.lock().push("os thread");
    /// assert_eq!(*log.lock(), ["user thread", "os thread"]);
    /// ```
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.lock_until(None).expect("no deadline")
    }

    /// Takes the lock, or gives up after `timeout`.
    ///
    /// ```
    /// use corewise::sync::Mutex;
    /// use std::time::Duration;
    /// let m = Mutex::new(());
    /// let g = m.lock();
    /// assert!(m.try_lock_for(Duration::from_millis(1)).is_none());
    /// drop(g);
    /// assert!(m.try_lock_for(Duration::from_millis(1)).is_some());
    /// ```
    pub fn try_lock_for(&self, timeout: Duration) -> Option<MutexGuard<'_, T>> {
        self.lock_until(crate::deadline::after(timeout))
    }

    fn lock_until(&self, deadline: Option<Instant>) -> Option<MutexGuard<'_, T>> {
        if let Some(g) = self.try_lock() {
            self.notify_hint.take_and_prefetch();
            return Some(g);
        }
        // Every way in takes the hint: the next locker after a wait is the
        // likely notifier whether or not it had to wait for the lock (the
        // waiter itself holds it until its link is queued).
        for _ in 0..SPINS {
            spin_loop();
            if self.state.load(Ordering::Relaxed) == UNLOCKED {
                if let Some(g) = self.try_lock() {
                    self.notify_hint.take_and_prefetch();
                    return Some(g);
                }
            }
        }
        loop {
            if self.state.swap(CONTENDED, Ordering::Acquire) == UNLOCKED {
                self.notify_hint.take_and_prefetch();
                return Some(self.guard());
            }
            let outcome = self.waiters.wait(
                deadline,
                || self.state.load(Ordering::SeqCst) == CONTENDED,
                || {},
            );
            if outcome == WaitOutcome::TimedOut {
                return None;
            }
        }
    }

    fn unlock(&self) {
        if self.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            self.waiters.notify_one();
        }
    }

    /// The value, taking the mutex apart (std's returns a `LockResult`;
    /// there is no poisoning here).
    ///
    /// ```
    /// let m = corewise::sync::Mutex::new(vec![1, 2]);
    /// assert_eq!(m.into_inner(), [1, 2]);
    /// ```
    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }

    /// The value, through exclusive access to the mutex.
    ///
    /// ```
    /// let mut m = corewise::sync::Mutex::new(0);
    /// *m.get_mut() = 10; // no locking: `&mut` proves nobody else holds it
    /// assert_eq!(*m.lock(), 10);
    /// ```
    pub fn get_mut(&mut self) -> &mut T {
        // SAFETY: `&mut self` is exclusive, so no other pointer is in use.
        self.value.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        self.mutex.unlock();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn mutex_excludes_and_wakes() {
        loom::model(|| {
            let m = Arc::new(Mutex::new(0));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let m = m.clone();
                    loom::thread::spawn(move || *m.lock() += 1)
                })
                .collect();
            *m.lock() += 1;
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(*m.lock(), 3);
        });
    }

    #[test]
    fn mutex_timeout_leaves_no_waiter() {
        loom::model(|| {
            let m = Arc::new(Mutex::new(0));
            let m2 = m.clone();
            let t = loom::thread::spawn(move || {
                if let Some(mut g) = m2.lock_until(Some(Instant::now())) {
                    *g += 1;
                }
            });
            *m.lock() += 1;
            t.join().unwrap();
            assert!(*m.lock() >= 1);
            assert_eq!(m.waiters.len.load(Ordering::SeqCst), 0);
        });
    }

    /// An unlock's wakeup that lands on a waiter whose deadline passes at
    /// the same time must not be lost: the timed waiter then takes the lock
    /// (and passes the wakeup on at its unlock) rather than give up while
    /// an untimed waiter stays asleep on a free mutex.
    #[test]
    fn mutex_timeout_racing_unlock_keeps_the_wakeup() {
        loom::model(|| {
            let m = Arc::new(Mutex::new(0));
            let g = m.lock();
            let (ma, mb) = (m.clone(), m.clone());
            let a = loom::thread::spawn(move || {
                if let Some(mut g) = ma.lock_until(Some(Instant::now())) {
                    *g += 1;
                }
            });
            let b = loom::thread::spawn(move || *mb.lock() += 1);
            drop(g);
            a.join().unwrap();
            b.join().unwrap();
            assert!(*m.lock() >= 1);
            assert_eq!(m.waiters.len.load(Ordering::SeqCst), 0);
        });
    }
}
