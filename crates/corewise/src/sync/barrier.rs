//! A barrier: `n` threads meet, then all go on; waiting blocks the user
//! thread.
//!
//! Arrivals are counted under a spin lock (a few instructions each), which
//! also fixes the generation an arrival belongs to. The `n`-th arrival
//! resets the count, advances the generation and wakes everyone; the
//! others wait on a [`WaitQueue`] while the generation is still theirs, so
//! a barrier is reusable at once: a thread that rushes into the next round
//! counts towards that round only.

use super::spin::SpinLock;
use super::wait_queue::WaitQueue;
use crate::shim::{AtomicUsize, Ordering};

/// `n` threads wait for each other, as `std::sync::Barrier`; waiting
/// blocks the user thread only.
///
/// ```
/// use corewise::sync::Barrier;
/// use std::sync::Arc;
/// let rt = corewise::Runtime::new().unwrap();
/// let b = Arc::new(Barrier::new(4));
/// let hs: Vec<_> = (0..4).map(|_| {
///     let b = b.clone();
///     rt.spawn(move || b.wait().is_leader()).unwrap()
/// }).collect();
/// let leaders = hs.into_iter().map(|h| h.join().unwrap()).filter(|&l| l).count();
/// assert_eq!(leaders, 1);
/// ```
pub struct Barrier {
    n: usize,
    arrived: SpinLock<usize>,
    generation: AtomicUsize,
    waiters: WaitQueue,
}

/// What [`Barrier::wait`] returns: whether this thread was the leader (the
/// one, per round, that arrived last).
///
/// ```
/// let b = corewise::sync::Barrier::new(1);
/// assert!(b.wait().is_leader());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarrierWaitResult(bool);

impl BarrierWaitResult {
    /// True for exactly one thread of each round.
    ///
    /// ```
    /// let b = corewise::sync::Barrier::new(1);
    /// assert!(b.wait().is_leader());
    /// assert!(b.wait().is_leader());
    /// ```
    pub fn is_leader(&self) -> bool {
        self.0
    }
}

impl Barrier {
    /// A barrier for `n` threads (`0` acts as `1`, as with std).
    ///
    /// ```
    /// let b = corewise::sync::Barrier::new(0);
    /// assert!(b.wait().is_leader());
    /// ```
    pub fn new(n: usize) -> Self {
        Self {
            n,
            arrived: SpinLock::new(0),
            generation: AtomicUsize::new(0),
            waiters: WaitQueue::new(),
        }
    }

    /// Blocks until `n` threads have called `wait` in this round; one of
    /// them gets a result whose [`is_leader`](BarrierWaitResult::is_leader)
    /// is true.
    ///
    /// ```
    /// use std::sync::Arc;
    /// let b = Arc::new(corewise::sync::Barrier::new(2));
    /// let b2 = b.clone();
    /// let t = std::thread::spawn(move || b2.wait().is_leader());
    /// let mine = b.wait().is_leader();
    /// assert!(mine != t.join().unwrap());
    /// ```
    pub fn wait(&self) -> BarrierWaitResult {
        let mut arrived = self.arrived.lock();
        let generation = self.generation.load(Ordering::Relaxed);
        *arrived += 1;
        if *arrived >= self.n {
            *arrived = 0;
            self.generation
                .store(generation.wrapping_add(1), Ordering::SeqCst);
            drop(arrived);
            self.waiters.notify_all();
            return BarrierWaitResult(true);
        }
        drop(arrived);
        while self.generation.load(Ordering::Acquire) == generation {
            self.waiters.wait(
                None,
                || self.generation.load(Ordering::SeqCst) == generation,
                || {},
            );
        }
        BarrierWaitResult(false)
    }
}

impl std::fmt::Debug for Barrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Barrier")
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two threads, two rounds: one leader per round, nobody left behind
    /// (a thread rushing into round two must not count for round one).
    #[test]
    fn barrier_two_rounds_one_leader_each() {
        loom::model(|| {
            let b = Arc::new(Barrier::new(2));
            let t = {
                let b = b.clone();
                loom::thread::spawn(move || [b.wait().is_leader(), b.wait().is_leader()])
            };
            let mine = [b.wait().is_leader(), b.wait().is_leader()];
            let theirs = t.join().unwrap();
            assert!(mine[0] != theirs[0]);
            assert!(mine[1] != theirs[1]);
        });
    }
}
