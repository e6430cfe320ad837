//! A mutex's hint of the condition variable its lockers will notify.
//!
//! The usual way to wake a condition variable's waiter is to lock the
//! mutex, change the condition, unlock and notify. The notify's first
//! touch is the condition variable's queue line, which the waiter wrote
//! last when it queued itself, on its own core: a miss that costs a
//! cross-core transfer (about 90 ns of a ~330 ns cross-core notify on an
//! Intel Xeon host, traced with timestamps along the path). The waiter
//! holds the mutex when it queues, so it leaves the queue's address in the
//! mutex's line, and whoever takes the mutex next takes the hint and starts
//! fetching that line to own while it runs its critical section: the
//! notify then finds it there, or on its way (`examples/notify_cost.rs`).
//!
//! A hint only: a prefetch never faults and changes nothing the program
//! sees, so a stale address (the condition variable gone, or the mutex
//! used with another one since) costs one useless fetch. Under loom it
//! does nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The address of the wait queue last waited on with a mutex (0: none).
#[derive(Debug)]
pub(crate) struct NotifyHint(AtomicUsize);

impl NotifyHint {
    /// No condition variable seen yet.
    pub(crate) const fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// A waiter of the queue at address `queue` holds the mutex: remember
    /// the queue (stored only when it changes).
    #[inline]
    pub(crate) fn remember(&self, queue: usize) {
        if self.0.load(Ordering::Relaxed) != queue {
            self.0.store(queue, Ordering::Relaxed);
        }
    }

    /// The mutex was just taken: takes the remembered queue, if any, and
    /// starts fetching its line, to own. Taken, not kept: the next locker
    /// after a wait is the likely notifier, and a hint kept would make
    /// every lock pull the queue's line to its core, which several
    /// producers locking on several cores (with nobody waiting) would
    /// then pass around at every lock, and which, once the condition
    /// variable is gone, may belong to anything.
    #[inline]
    pub(crate) fn take_and_prefetch(&self) {
        let q = self.0.load(Ordering::Relaxed);
        if q != 0 {
            self.0.store(0, Ordering::Relaxed);
            crate::prefetch::to_own(q as *const u8);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_leaves_its_queue_in_the_mutex_and_the_next_locker_takes_it() {
        use std::sync::Arc;
        let pair = Arc::new((crate::sync::Mutex::new(false), crate::sync::Condvar::new()));
        let p = pair.clone();
        let waiter = std::thread::spawn(move || {
            let (m, cv) = &*p;
            let mut go = m.lock();
            while !*go {
                go = cv.wait(go);
            }
        });
        let (m, cv) = &*pair;
        // The waiter queues holding the mutex, then releases it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while m.notify_hint.0.load(Ordering::Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiter never waited"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            m.notify_hint.0.load(Ordering::Relaxed),
            cv.queue_address(),
            "the mutex remembers the queue its waiter queued on"
        );
        *m.lock() = true;
        assert_eq!(
            m.notify_hint.0.load(Ordering::Relaxed),
            0,
            "the next locker took the hint"
        );
        cv.notify_one();
        waiter.join().unwrap();
    }

    #[test]
    fn a_hint_is_used_once_and_prefetching_any_address_is_harmless() {
        let h = NotifyHint::new();
        h.take_and_prefetch(); // nothing remembered: nothing fetched
        let queue = [0u8; 64];
        h.remember(queue.as_ptr() as usize);
        assert_eq!(h.0.load(Ordering::Relaxed), queue.as_ptr() as usize);
        h.take_and_prefetch();
        assert_eq!(h.0.load(Ordering::Relaxed), 0, "taken by the lock");
        // A stale hint (an address nothing lives at any more) only costs
        // a useless fetch.
        h.remember(std::ptr::dangling::<u8>() as usize);
        h.take_and_prefetch();
        h.remember(usize::MAX);
        h.take_and_prefetch();
    }
}
