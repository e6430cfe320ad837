//! A readers-writer lock whose waiters block their user thread.
//!
//! One word holds the whole state: the number of readers (or the
//! write-locked mark) and the number of writers waiting. Readers enter only
//! while no writer holds the lock *or waits for it*, so a stream of readers
//! cannot starve a writer: a writer that has to wait counts itself first,
//! the readers already in finish, and the last one out wakes it. Readers
//! and writers wait on two queues ([`WaitQueue`]); every change that can
//! let a waiter in is followed by a notify of the queue it concerns, and
//! each waiter checks its condition under its queue's lock, so no wakeup
//! is lost (the queue's own Dekker pairing):
//!
//! - the last reader out, with writers waiting: wake one writer;
//! - a writer unlocking: wake one writer if any waits, else every reader;
//! - a writer giving up (timeout) and leaving no writer waiting, the lock
//!   free of writers: wake every reader (they were held back by it alone).

use super::wait_queue::{WaitOutcome, WaitQueue};
use crate::shim::{AtomicU64, ConstPtr, MutPtr, Ordering, UnsafeCell};
use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

/// Readers holding the lock (bits 0..30).
const READERS: u64 = (1 << 30) - 1;
/// The write-locked mark.
const WRITE_LOCKED: u64 = 1 << 30;
/// One waiting writer (the count is bits 32..64).
const WRITER_WAITING: u64 = 1 << 32;
/// More readers wait until one leaves.
const MAX_READERS: u64 = READERS - 1;

fn readers(s: u64) -> u64 {
    s & READERS
}
fn write_locked(s: u64) -> bool {
    s & WRITE_LOCKED != 0
}
fn writers_waiting(s: u64) -> u64 {
    s >> 32
}
/// Whether a reader may enter now.
fn readable(s: u64) -> bool {
    !write_locked(s) && writers_waiting(s) == 0 && readers(s) < MAX_READERS
}
/// Whether a writer may enter now (waiting writers do not hold it back:
/// whoever gets there first takes it).
fn writable(s: u64) -> bool {
    !write_locked(s) && readers(s) == 0
}

/// A readers-writer lock: any number of readers or one writer; waiting
/// blocks the user thread only (an OS thread: the OS thread). A waiting
/// writer holds new readers back, so writers are not starved.
///
/// ```
/// use corewise::sync::RwLock;
/// use std::sync::Arc;
/// let rt = corewise::Runtime::new().unwrap();
/// let config = Arc::new(RwLock::new(String::from("v1")));
/// let readers: Vec<_> = (0..4).map(|_| {
///     let c = config.clone();
///     rt.spawn(move || c.read().starts_with('v')).unwrap()
/// }).collect();
/// *config.write() = String::from("v2");
/// for r in readers { assert!(r.join().unwrap()); }
/// assert_eq!(*config.read(), "v2");
/// ```
pub struct RwLock<T> {
    state: AtomicU64,
    readers_queue: WaitQueue,
    writers_queue: WaitQueue,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread (so `T: Send`) and
// `&T` to many at once (so `T: Sync`), as std's `RwLock`.
unsafe impl<T: Send> Send for RwLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for RwLock<T> {}

/// Shared access to a [`RwLock`]'s value; releases on drop.
///
/// ```
/// let l = corewise::sync::RwLock::new(5);
/// let (a, b) = (l.read(), l.read());
/// assert_eq!(*a + *b, 10);
/// ```
pub struct RwLockReadGuard<'a, T> {
    lock: &'a RwLock<T>,
    // Dropped before the lock is released, so loom sees the access end
    // inside the critical section.
    ptr: ManuallyDrop<ConstPtr<T>>,
}

/// Exclusive access to a [`RwLock`]'s value; releases on drop.
///
/// ```
/// let l = corewise::sync::RwLock::new(vec![1]);
/// l.write().push(2);
/// assert_eq!(*l.read(), [1, 2]);
/// ```
pub struct RwLockWriteGuard<'a, T> {
    lock: &'a RwLock<T>,
    ptr: ManuallyDrop<MutPtr<T>>,
}

impl<T> RwLock<T> {
    /// An unlocked lock holding `value`.
    ///
    /// ```
    /// let l = corewise::sync::RwLock::new(0u8);
    /// assert_eq!(*l.read(), 0);
    /// ```
    pub fn new(value: T) -> Self {
        Self {
            state: AtomicU64::new(0),
            readers_queue: WaitQueue::new(),
            writers_queue: WaitQueue::new(),
            value: UnsafeCell::new(value),
        }
    }

    fn read_guard(&self) -> RwLockReadGuard<'_, T> {
        RwLockReadGuard {
            lock: self,
            ptr: ManuallyDrop::new(self.value.get()),
        }
    }

    fn write_guard(&self) -> RwLockWriteGuard<'_, T> {
        RwLockWriteGuard {
            lock: self,
            ptr: ManuallyDrop::new(self.value.get_mut()),
        }
    }

    /// Shared access if no writer holds the lock or waits for it.
    ///
    /// ```
    /// let l = corewise::sync::RwLock::new(1);
    /// let w = l.write();
    /// assert!(l.try_read().is_none());
    /// drop(w);
    /// assert!(l.try_read().is_some());
    /// ```
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let mut s = self.state.load(Ordering::Relaxed);
        while readable(s) {
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(self.read_guard()),
                Err(now) => s = now,
            }
        }
        None
    }

    /// Exclusive access if nobody holds the lock.
    ///
    /// ```
    /// let l = corewise::sync::RwLock::new(1);
    /// let r = l.read();
    /// assert!(l.try_write().is_none());
    /// drop(r);
    /// assert!(l.try_write().is_some());
    /// ```
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let mut s = self.state.load(Ordering::Relaxed);
        while writable(s) {
            match self.state.compare_exchange_weak(
                s,
                s | WRITE_LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(self.write_guard()),
                Err(now) => s = now,
            }
        }
        None
    }

    /// Shared access, blocking while a writer holds the lock or waits for
    /// it. Unlike std, no `Result`: there is no poisoning (a panic while
    /// holding a guard releases the lock).
    ///
    /// ```
    /// let l = corewise::sync::RwLock::new(3);
    /// assert_eq!(*l.read(), 3);
    /// ```
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.read_until(None).expect("no deadline")
    }

    /// Shared access, or `None` after `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = corewise::sync::RwLock::new(());
    /// let w = l.write();
    /// assert!(l.try_read_for(Duration::from_millis(1)).is_none());
    /// drop(w);
    /// assert!(l.try_read_for(Duration::from_millis(1)).is_some());
    /// ```
    pub fn try_read_for(&self, timeout: Duration) -> Option<RwLockReadGuard<'_, T>> {
        self.read_until(crate::deadline::after(timeout))
    }

    fn read_until(&self, deadline: Option<Instant>) -> Option<RwLockReadGuard<'_, T>> {
        loop {
            if let Some(g) = self.try_read() {
                return Some(g);
            }
            let outcome = self.readers_queue.wait(
                deadline,
                || !readable(self.state.load(Ordering::SeqCst)),
                || {},
            );
            if outcome == WaitOutcome::TimedOut {
                return None;
            }
        }
    }

    /// Exclusive access, blocking while readers or another writer hold the
    /// lock; new readers wait behind it meanwhile. No `Result`, as
    /// [`read`](Self::read).
    ///
    /// ```
    /// let l = corewise::sync::RwLock::new(3);
    /// *l.write() += 1;
    /// assert_eq!(*l.read(), 4);
    /// ```
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.write_until(None).expect("no deadline")
    }

    /// Exclusive access, or `None` after `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = corewise::sync::RwLock::new(());
    /// let r = l.read();
    /// assert!(l.try_write_for(Duration::from_millis(1)).is_none());
    /// drop(r);
    /// assert!(l.try_write_for(Duration::from_millis(1)).is_some());
    /// ```
    pub fn try_write_for(&self, timeout: Duration) -> Option<RwLockWriteGuard<'_, T>> {
        self.write_until(crate::deadline::after(timeout))
    }

    fn write_until(&self, deadline: Option<Instant>) -> Option<RwLockWriteGuard<'_, T>> {
        if let Some(g) = self.try_write() {
            return Some(g);
        }
        // Counted from here on: readers that come now wait behind us.
        self.state.fetch_add(WRITER_WAITING, Ordering::SeqCst);
        loop {
            let mut s = self.state.load(Ordering::Relaxed);
            while writable(s) {
                match self.state.compare_exchange_weak(
                    s,
                    (s - WRITER_WAITING) | WRITE_LOCKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some(self.write_guard()),
                    Err(now) => s = now,
                }
            }
            let outcome = self.writers_queue.wait(
                deadline,
                || !writable(self.state.load(Ordering::SeqCst)),
                || {},
            );
            if outcome == WaitOutcome::TimedOut {
                let s = self.state.fetch_sub(WRITER_WAITING, Ordering::SeqCst) - WRITER_WAITING;
                if writers_waiting(s) == 0 && !write_locked(s) {
                    // Readers may have waited for us alone.
                    self.readers_queue.notify_all();
                }
                return None;
            }
        }
    }

    fn read_unlock(&self) {
        let s = self.state.fetch_sub(1, Ordering::Release) - 1;
        if readers(s) == 0 && writers_waiting(s) != 0 {
            self.writers_queue.notify_one();
        } else if readers(s) == MAX_READERS - 1 {
            // A reader may have waited for room.
            self.readers_queue.notify_one();
        }
    }

    fn write_unlock(&self) {
        let s = self.state.fetch_and(!WRITE_LOCKED, Ordering::Release) & !WRITE_LOCKED;
        if writers_waiting(s) != 0 {
            self.writers_queue.notify_one();
        } else {
            self.readers_queue.notify_all();
        }
    }

    /// The value, taking the lock apart.
    ///
    /// ```
    /// let l = corewise::sync::RwLock::new(String::from("x"));
    /// assert_eq!(l.into_inner(), "x");
    /// ```
    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }

    /// The value, through exclusive access to the lock.
    ///
    /// ```
    /// let mut l = corewise::sync::RwLock::new(1);
    /// *l.get_mut() = 2;
    /// assert_eq!(*l.read(), 2);
    /// ```
    pub fn get_mut(&mut self) -> &mut T {
        // SAFETY: `&mut self` is exclusive, so no other pointer is in use.
        self.value.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for RwLock<T> {
    /// The value if it can be read now (as std's, which shows
    /// `<locked>` otherwise).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RwLock");
        match self.try_read() {
            Some(g) => d.field("data", &&*g),
            None => d.field("data", &format_args!("<locked>")),
        };
        d.finish_non_exhaustive()
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> std::ops::Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds a read lock: nobody writes the value.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        self.lock.read_unlock();
    }
}

impl<T> std::ops::Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the write lock.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> std::ops::DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the write lock.
        unsafe { (*self.ptr).deref() }
    }
}

impl<T> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.ptr) };
        self.lock.write_unlock();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// A writer and a reader against a reader: the writer's update is
    /// seen whole, and whoever waits is woken.
    #[test]
    fn rwlock_excludes_and_wakes() {
        loom::model(|| {
            let l = Arc::new(RwLock::new((0, 0)));
            let w = {
                let l = l.clone();
                loom::thread::spawn(move || {
                    let mut g = l.write();
                    g.0 += 1;
                    g.1 += 1;
                })
            };
            let r = {
                let l = l.clone();
                loom::thread::spawn(move || {
                    let g = l.read();
                    assert_eq!(g.0, g.1);
                })
            };
            {
                let g = l.read();
                assert_eq!(g.0, g.1);
            }
            w.join().unwrap();
            r.join().unwrap();
            assert_eq!(*l.read(), (1, 1));
            assert_eq!(l.state.load(Ordering::SeqCst), 0);
        });
    }

    /// A writer that gives up while a reader waits behind it must let the
    /// reader in (the reader waited for it alone), and leave no count.
    #[test]
    fn rwlock_writer_timeout_releases_held_back_readers() {
        loom::model(|| {
            let l = Arc::new(RwLock::new(0));
            let held = l.read();
            let w = {
                let l = l.clone();
                loom::thread::spawn(move || {
                    if let Some(mut g) = l.write_until(Some(Instant::now())) {
                        *g += 1;
                    }
                })
            };
            let r = {
                let l = l.clone();
                loom::thread::spawn(move || *l.read())
            };
            drop(held);
            w.join().unwrap();
            let seen = r.join().unwrap();
            assert!(seen <= 1);
            assert_eq!(l.state.load(Ordering::SeqCst), 0);
        });
    }

    /// Two writers, one untimed: the untimed one always gets in, whatever
    /// the timed one does when its deadline meets an unlock.
    #[test]
    fn rwlock_writer_timeout_keeps_the_wakeup() {
        loom::model(|| {
            let l = Arc::new(RwLock::new(0));
            let g = l.write();
            let a = {
                let l = l.clone();
                loom::thread::spawn(move || {
                    if let Some(mut g) = l.write_until(Some(Instant::now())) {
                        *g += 1;
                    }
                })
            };
            let b = {
                let l = l.clone();
                loom::thread::spawn(move || *l.write() += 1)
            };
            drop(g);
            a.join().unwrap();
            b.join().unwrap();
            assert!(*l.read() >= 1);
            assert_eq!(l.state.load(Ordering::SeqCst), 0);
        });
    }
}
