//! A condition variable for [`Mutex`](super::Mutex).

use super::mutex::MutexGuard;
use super::wait_queue::{WaitOutcome, WaitQueue};
use std::time::{Duration, Instant};

/// Whether a timed wait ended by its timeout.
///
/// ```
/// use corewise::sync::{Condvar, Mutex};
/// use std::time::Duration;
/// let (m, cv) = (Mutex::new(0), Condvar::new());
/// let (guard, result) = cv.wait_timeout(m.lock(), Duration::from_millis(1));
/// assert!(result.timed_out());
/// assert_eq!(*guard, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True when the wait gave up at its deadline.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let pair = Arc::new((Mutex::new(false), Condvar::new()));
    /// let p = pair.clone();
    /// let waiter = rt
    ///     .spawn(move || {
    ///         let (m, cv) = &*p;
    ///         let mut done = m.lock();
    ///         while !*done {
    ///             let (g, r) = cv.wait_timeout(done, Duration::from_secs(10));
    ///             assert!(!r.timed_out()); // notified long before the deadline
    ///             done = g;
    ///         }
    ///     })
    ///     .unwrap();
    /// *pair.0.lock() = true;
    /// pair.1.notify_one();
    /// waiter.join().unwrap();
    /// ```
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

/// Blocks threads until notified; waiting blocks the user thread only.
///
/// ```
/// use corewise::sync::{Condvar, Mutex};
/// use std::sync::Arc;
/// let rt = corewise::Runtime::new().unwrap();
/// let pair = Arc::new((Mutex::new(false), Condvar::new()));
/// let p = pair.clone();
/// let waiter = rt.spawn(move || {
///     let (m, cv) = &*p;
///     let mut ready = m.lock();
///     while !*ready { ready = cv.wait(ready); }
/// }).unwrap();
/// *pair.0.lock() = true;
/// pair.1.notify_all();
/// waiter.join().unwrap();
/// ```
pub struct Condvar {
    waiters: WaitQueue,
}

impl Default for Condvar {
    fn default() -> Self {
        Self::new()
    }
}

impl Condvar {
    /// A condition variable with no waiters.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::time::Duration;
    /// let (m, cv) = (Mutex::new(()), Condvar::new());
    /// // Nobody notifies a new condition variable: a timed wait times out.
    /// assert!(cv.wait_timeout(m.lock(), Duration::from_millis(1)).1.timed_out());
    /// ```
    pub fn new() -> Self {
        Self {
            waiters: WaitQueue::new(),
        }
    }

    /// Releases the mutex, blocks until notified (or spuriously), relocks.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let pair = Arc::new((Mutex::new(None), Condvar::new()));
    /// let p = pair.clone();
    /// let consumer = rt
    ///     .spawn(move || {
    ///         let (m, cv) = &*p;
    ///         let mut slot = m.lock();
    ///         while slot.is_none() {
    ///             slot = cv.wait(slot); // unlocks while blocked, relocks after
    ///         }
    ///         slot.take().unwrap()
    ///     })
    ///     .unwrap();
    /// *pair.0.lock() = Some(42);
    /// pair.1.notify_one();
    /// assert_eq!(consumer.join().unwrap(), 42);
    /// ```
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait_until(guard, None).0
    }

    /// Waits while `condition` holds.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
    /// let p = pair.clone();
    /// let waiter = rt
    ///     .spawn(move || *p.1.wait_while(p.0.lock(), |n| *n < 3))
    ///     .unwrap();
    /// for _ in 0..3 {
    ///     *pair.0.lock() += 1;
    ///     pair.1.notify_all();
    /// }
    /// assert_eq!(waiter.join().unwrap(), 3);
    /// ```
    pub fn wait_while<'a, T>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: impl FnMut(&mut T) -> bool,
    ) -> MutexGuard<'a, T> {
        while condition(&mut *guard) {
            guard = self.wait(guard);
        }
        guard
    }

    /// Like [`wait`](Self::wait), giving up after `timeout`.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::time::Duration;
    /// let (m, cv) = (Mutex::new(()), Condvar::new());
    /// let (_g, r) = cv.wait_timeout(m.lock(), Duration::from_millis(1));
    /// assert!(r.timed_out());
    /// ```
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_until(guard, crate::deadline::after(timeout))
    }

    fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        let mutex = guard.mutex;
        // We hold the mutex: its next locker will likely notify us.
        mutex.notify_hint.remember(self.queue_address());
        let outcome = self.waiters.wait(deadline, || true, move || drop(guard));
        (
            mutex.lock(),
            WaitTimeoutResult(outcome == WaitOutcome::TimedOut),
        )
    }

    /// The address of the waiters' queue (the line a notify touches
    /// first), for the mutex's [`NotifyHint`](super::notify_hint::NotifyHint).
    pub(crate) fn queue_address(&self) -> usize {
        std::ptr::from_ref(&self.waiters) as usize
    }

    /// Wakes one waiter.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let pair = Arc::new((Mutex::new(false), Condvar::new()));
    /// let p = pair.clone();
    /// let h = rt.spawn(move || *p.1.wait_while(p.0.lock(), |go| !*go)).unwrap();
    /// *pair.0.lock() = true;
    /// pair.1.notify_one();
    /// assert!(h.join().unwrap()); // woken, it saw the flag set
    /// ```
    pub fn notify_one(&self) {
        self.waiters.notify_one();
    }

    /// Wakes every waiter.
    ///
    /// ```
    /// use corewise::sync::{Condvar, Mutex};
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let pair = Arc::new((Mutex::new(false), Condvar::new()));
    /// let waiters: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let p = pair.clone();
    ///         rt.spawn(move || *p.1.wait_while(p.0.lock(), |go| !*go)).unwrap()
    ///     })
    ///     .collect();
    /// *pair.0.lock() = true;
    /// pair.1.notify_all();
    /// assert!(waiters.into_iter().all(|h| h.join().unwrap()));
    /// ```
    pub fn notify_all(&self) {
        self.waiters.notify_all();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::super::Mutex;
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn condvar_no_lost_notify() {
        loom::model(|| {
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let p = pair.clone();
            let t = loom::thread::spawn(move || {
                *p.0.lock() = true;
                p.1.notify_one();
            });
            let mut g = pair.0.lock();
            while !*g {
                g = pair.1.wait(g);
            }
            drop(g);
            t.join().unwrap();
        });
    }

    #[test]
    fn condvar_timeout_races_notify() {
        loom::model(|| {
            let pair = Arc::new((Mutex::new(0), Condvar::new()));
            let p = pair.clone();
            let t = loom::thread::spawn(move || {
                *p.0.lock() += 1;
                p.1.notify_all();
            });
            let g = pair.0.lock();
            let (g, _) = pair.1.wait_until(g, Some(Instant::now()));
            drop(g);
            t.join().unwrap();
            assert_eq!(
                pair.1.waiters.len.load(std::sync::atomic::Ordering::SeqCst),
                0
            );
        });
    }
}
