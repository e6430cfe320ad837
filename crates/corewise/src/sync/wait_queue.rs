//! A queue of waiting threads, the building block of every primitive here.
//!
//! A waiter puts a node on its own stack, links it in under the queue's spin
//! lock (after checking, under that lock, that it still has to wait), and
//! blocks. A notifier unlinks a node under the lock, takes a copy of the
//! waiter's handle, marks the node notified, and wakes the copy after the
//! lock is released; from the mark on the node is never touched again, so
//! the waiter may return (and its stack frame vanish) as soon as it sees the
//! mark. A waiter that times out removes its node under the lock; if the
//! node is gone, a notifier already took it and the wakeup counts.

use super::spin::SpinLock;
use super::waiter::{deadline_passed, park, park_until, Waiter};
use crate::shim::{fence, AtomicBool, AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::time::Instant;

struct Node {
    waiter: Waiter,
    notified: AtomicBool,
}

struct NodePtr(*const Node);
// SAFETY: a node is only reached through the queue while its owner waits,
// and it is only read (its `Waiter` is Send + Sync, its flag atomic).
unsafe impl Send for NodePtr {}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    /// A notifier woke us.
    Notified,
    /// The deadline passed first.
    TimedOut,
    /// The condition said not to wait.
    NotQueued,
}

/// Threads waiting for something.
pub(crate) struct WaitQueue {
    nodes: SpinLock<VecDeque<NodePtr>>,
    pub(crate) len: AtomicUsize,
}

impl WaitQueue {
    pub(crate) fn new() -> Self {
        Self {
            nodes: SpinLock::new(VecDeque::new()),
            len: AtomicUsize::new(0),
        }
    }

    /// Waits unless `must_wait()` (called under the queue lock) says no.
    /// `after_enqueue` runs once the node is queued and the queue unlocked
    /// (a condition variable releases its mutex there).
    pub(crate) fn wait(
        &self,
        deadline: Option<Instant>,
        must_wait: impl FnOnce() -> bool,
        after_enqueue: impl FnOnce(),
    ) -> WaitOutcome {
        let node = Node {
            waiter: Waiter::current(),
            notified: AtomicBool::new(false),
        };
        {
            let mut q = self.nodes.lock();
            // Dekker with `notify_*`'s fast path: count ourselves, fence,
            // then read the condition; a notifier changes the condition,
            // fences, then reads the count.
            self.len.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if !must_wait() {
                self.len.fetch_sub(1, Ordering::SeqCst);
                return WaitOutcome::NotQueued;
            }
            q.push_back(NodePtr(&node));
        }
        after_enqueue();
        loop {
            if node.notified.load(Ordering::Acquire) {
                return WaitOutcome::Notified;
            }
            match deadline {
                None => park(),
                Some(d) if !deadline_passed(d) => park_until(d),
                Some(_) => {
                    let mut q = self.nodes.lock();
                    if let Some(pos) = q.iter().position(|p| std::ptr::eq(p.0, &node)) {
                        q.remove(pos);
                        self.len.fetch_sub(1, Ordering::SeqCst);
                        return WaitOutcome::TimedOut;
                    }
                    // A notifier unlinked us and marked the node under the
                    // lock we now hold.
                    drop(q);
                    debug_assert!(node.notified.load(Ordering::Acquire));
                    return WaitOutcome::Notified;
                }
            }
        }
    }

    /// Wakes the longest waiter; returns whether there was one.
    pub(crate) fn notify_one(&self) -> bool {
        fence(Ordering::SeqCst);
        if self.len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let woken = {
            let mut q = self.nodes.lock();
            q.pop_front().map(|p| {
                self.len.fetch_sub(1, Ordering::SeqCst);
                Self::mark(p)
            })
        };
        match woken {
            Some(w) => {
                w.wake();
                true
            }
            None => false,
        }
    }

    /// Wakes every waiter; returns how many.
    pub(crate) fn notify_all(&self) -> usize {
        fence(Ordering::SeqCst);
        if self.len.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let woken: Vec<Waiter> = {
            let mut q = self.nodes.lock();
            let n = q.len();
            self.len.fetch_sub(n, Ordering::SeqCst);
            q.drain(..).map(Self::mark).collect()
        };
        for w in &woken {
            w.wake();
        }
        woken.len()
    }

    /// Unlinked node: copy its waiter, then mark it (last touch).
    fn mark(p: NodePtr) -> Waiter {
        // SAFETY: the node is alive: its owner does not return before it is
        // marked or has removed it itself under the lock we hold.
        let node = unsafe { &*p.0 };
        let w = node.waiter.clone();
        node.notified.store(true, Ordering::Release);
        w
    }
}
