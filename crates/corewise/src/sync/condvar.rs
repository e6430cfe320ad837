//! A condition variable for [`Mutex`](super::Mutex).

use super::mutex::MutexGuard;
use super::wait_queue::{WaitOutcome, WaitQueue};
use std::time::{Duration, Instant};

/// Whether a timed wait ended by its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True when the wait gave up at its deadline.
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
    pub fn new() -> Self {
        Self {
            waiters: WaitQueue::new(),
        }
    }

    /// Releases the mutex, blocks until notified (or spuriously), relocks.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait_until(guard, None).0
    }

    /// Waits while `condition` holds.
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
        self.wait_until(guard, Some(Instant::now() + timeout))
    }

    fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        let mutex = guard.mutex;
        let outcome = self.waiters.wait(deadline, || true, move || drop(guard));
        (
            mutex.lock(),
            WaitTimeoutResult(outcome == WaitOutcome::TimedOut),
        )
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.waiters.notify_one();
    }

    /// Wakes every waiter.
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
