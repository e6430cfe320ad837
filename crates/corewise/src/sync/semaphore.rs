//! A counting semaphore.

use super::wait_queue::{WaitOutcome, WaitQueue};
use crate::shim::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A counting semaphore; `acquire` blocks the user thread while no permit is
/// available.
///
/// ```
/// use corewise::sync::Semaphore;
/// use std::time::Duration;
/// let s = Semaphore::new(1);
/// s.acquire();
/// assert!(!s.try_acquire());
/// assert!(!s.acquire_timeout(Duration::from_millis(1)));
/// s.release();
/// assert!(s.try_acquire());
/// ```
pub struct Semaphore {
    permits: AtomicUsize,
    waiters: WaitQueue,
}

impl Semaphore {
    /// A semaphore with `permits` permits.
    ///
    /// ```
    /// let s = corewise::sync::Semaphore::new(3);
    /// assert_eq!(s.available(), 3);
    /// ```
    pub fn new(permits: usize) -> Self {
        Self {
            permits: AtomicUsize::new(permits),
            waiters: WaitQueue::new(),
        }
    }

    /// Takes a permit if one is available.
    ///
    /// ```
    /// let s = corewise::sync::Semaphore::new(1);
    /// assert!(s.try_acquire());
    /// assert!(!s.try_acquire());
    /// assert_eq!(s.available(), 0);
    /// ```
    pub fn try_acquire(&self) -> bool {
        let mut cur = self.permits.load(Ordering::Relaxed);
        while cur > 0 {
            match self.permits.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
        false
    }

    /// Takes a permit, blocking until one is available.
    ///
    /// ```
    /// use corewise::sync::Semaphore;
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let s = Arc::new(Semaphore::new(0));
    /// let s2 = s.clone();
    /// let waiter = rt.spawn(move || { s2.acquire(); "got a permit" }).unwrap();
    /// s.release();
    /// assert_eq!(waiter.join().unwrap(), "got a permit");
    /// assert_eq!(s.available(), 0);
    /// ```
    pub fn acquire(&self) {
        self.acquire_until(None);
    }

    /// Takes a permit, or gives up after `timeout`; returns whether it got one.
    ///
    /// ```
    /// use corewise::sync::Semaphore;
    /// use std::time::Duration;
    /// let s = Semaphore::new(1);
    /// assert!(s.acquire_timeout(Duration::from_millis(1)));
    /// assert!(!s.acquire_timeout(Duration::from_millis(1)));
    /// ```
    pub fn acquire_timeout(&self, timeout: Duration) -> bool {
        self.acquire_until(crate::deadline::after(timeout))
    }

    fn acquire_until(&self, deadline: Option<Instant>) -> bool {
        loop {
            if self.try_acquire() {
                return true;
            }
            let outcome =
                self.waiters
                    .wait(deadline, || self.permits.load(Ordering::SeqCst) == 0, || {});
            if outcome == WaitOutcome::TimedOut {
                return self.try_acquire();
            }
        }
    }

    /// Returns a permit, waking a waiter.
    ///
    /// ```
    /// let s = corewise::sync::Semaphore::new(0);
    /// s.release();
    /// s.release();
    /// assert_eq!(s.available(), 2);
    /// ```
    pub fn release(&self) {
        self.permits.fetch_add(1, Ordering::SeqCst);
        self.waiters.notify_one();
    }

    /// Permits available now.
    ///
    /// ```
    /// let s = corewise::sync::Semaphore::new(2);
    /// s.acquire();
    /// assert_eq!(s.available(), 1);
    /// ```
    pub fn available(&self) -> usize {
        self.permits.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn semaphore_no_lost_release() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(0));
            let s2 = s.clone();
            let t = loom::thread::spawn(move || s2.release());
            s.acquire();
            t.join().unwrap();
            assert_eq!(s.available(), 0);
        });
    }

    #[test]
    fn semaphore_two_waiters_one_timeout() {
        loom::model(|| {
            let s = Arc::new(Semaphore::new(0));
            let s2 = s.clone();
            let t = loom::thread::spawn(move || s2.acquire_until(Some(Instant::now())));
            s.release();
            let got = t.join().unwrap();
            assert_eq!(s.available(), if got { 0 } else { 1 });
        });
    }
}
