//! A queue of waiting threads, the building block of every primitive here.
//!
//! The queue is an intrusive list of [`Link`]s. A user thread's link lives in
//! its slot's first cache line, in the bytes that held the thread's function
//! before it started (see `Invocation::wait_link`): that is the line a
//! signal writes and the waiter's dispatcher reads to wake it, so a notifier
//! that unlinks, marks and signals a user thread touches one line of the
//! waiter's, and the woken thread finds the mark in the line its dispatcher
//! just fetched. (With the link on the waiter's stack and a `VecDeque` of
//! pointers, as before, a cross-core notify moved the queue's buffer and the
//! waiter's stack line too: two more transfers on the wake path.) An OS
//! thread's link (and every link in the loom models) is on its stack, beside
//! the handle that wakes it.
//!
//! A waiter links itself in under the queue's spin lock (after checking,
//! under that lock, that it still has to wait), and blocks. A notifier
//! unlinks a link under the lock, takes a copy of the waiter's handle, marks
//! the link notified, and wakes the copy after the lock is released; from
//! the mark on the link is never touched again, so the waiter may return
//! (and its link be reused) as soon as it sees the mark. A waiter that times
//! out removes its link under the lock; if the link is gone, a notifier
//! already took it and the wakeup counts.

use super::spin::SpinLock;
use super::waiter::{deadline_passed, park, park_until, Waiter};
use crate::shim::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::time::Instant;

/// Whose link it is, and so how to wake its thread.
#[derive(Clone, Copy)]
enum Owner {
    /// A user thread; the link sits in this slot.
    #[cfg(not(loom))]
    Slot(&'static crate::sched::ThreadContext),
    /// A thread whose link and `Waiter` are on its own stack.
    Stack(*const Waiter),
}

/// A waiter's place in a queue.
pub(crate) struct Link {
    /// The next link; read and written only under the queue's lock.
    next: AtomicPtr<Link>,
    /// Set by the notifier that unlinked this link (its last touch).
    notified: AtomicBool,
    owner: Owner,
}

impl Link {
    fn new(owner: Owner) -> Self {
        Self {
            next: AtomicPtr::new(std::ptr::null_mut()),
            notified: AtomicBool::new(false),
            owner,
        }
    }

    /// Who to wake, copied out before the link is marked.
    fn waiter(&self) -> Waiter {
        match self.owner {
            #[cfg(not(loom))]
            Owner::Slot(slot) => Waiter::User(crate::thread::ThreadId::new(slot)),
            // SAFETY: a stack link's `Waiter` outlives the link's time in a
            // queue (both are locals of the waiting `wait` call).
            Owner::Stack(w) => unsafe { (*w).clone() },
        }
    }
}

/// The linked list, guarded by the queue's spin lock.
struct List {
    head: *const Link,
    tail: *const Link,
}

// SAFETY: the list only holds pointers to links whose owners wait (and stay
// alive) until they are unlinked under the lock.
unsafe impl Send for List {}

impl List {
    fn push_back(&mut self, link: &Link) {
        link.next.store(std::ptr::null_mut(), Ordering::Relaxed);
        let p: *const Link = link;
        if self.tail.is_null() {
            self.head = p;
        } else {
            // SAFETY: the tail is a queued (so live) link.
            unsafe { &*self.tail }
                .next
                .store(p.cast_mut(), Ordering::Relaxed);
        }
        self.tail = p;
    }

    /// Unlinks the first link. A pointer, not a reference: its owner may
    /// return (and the link's memory go) once the link is marked.
    fn pop_front(&mut self) -> Option<*const Link> {
        if self.head.is_null() {
            return None;
        }
        let head = self.head;
        // SAFETY: the head is a queued (so live) link.
        self.head = unsafe { &*head }.next.load(Ordering::Relaxed);
        if self.head.is_null() {
            self.tail = std::ptr::null();
        }
        Some(head)
    }

    /// Unlinks `link` if it is queued; returns whether it was.
    fn remove(&mut self, link: &Link) -> bool {
        let target: *const Link = link;
        let mut prev: *const Link = std::ptr::null();
        let mut cur = self.head;
        while !cur.is_null() {
            // SAFETY: every link reached from the head is queued (so live).
            let next = unsafe { &*cur }.next.load(Ordering::Relaxed);
            if std::ptr::eq(cur, target) {
                if prev.is_null() {
                    self.head = next;
                } else {
                    // SAFETY: `prev` is a queued link.
                    unsafe { &*prev }.next.store(next, Ordering::Relaxed);
                }
                if std::ptr::eq(self.tail, target) {
                    self.tail = prev;
                }
                return true;
            }
            prev = cur;
            cur = next;
        }
        false
    }
}

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
    links: SpinLock<List>,
    pub(crate) len: AtomicUsize,
}

impl WaitQueue {
    pub(crate) fn new() -> Self {
        Self {
            links: SpinLock::new(List {
                head: std::ptr::null(),
                tail: std::ptr::null(),
            }),
            len: AtomicUsize::new(0),
        }
    }

    /// Waits unless `must_wait()` (called under the queue lock) says no.
    /// `after_enqueue` runs once the link is queued and the queue unlocked
    /// (a condition variable releases its mutex there).
    pub(crate) fn wait(
        &self,
        deadline: Option<Instant>,
        must_wait: impl FnOnce() -> bool,
        after_enqueue: impl FnOnce(),
    ) -> WaitOutcome {
        // A user thread waits on one queue at a time, so its slot has room
        // for one link; an OS thread's link is on its stack.
        let stack_waiter: Waiter;
        let stack_link: Link;
        #[cfg(not(loom))]
        let slot_link = crate::sched::current::current_slot().map(|slot| {
            // SAFETY: we are the slot's running thread, and no link of ours
            // is queued anywhere (a wait ends unlinked).
            unsafe { slot.invocation.wait_link(Link::new(Owner::Slot(slot))) }
        });
        #[cfg(loom)]
        let slot_link: Option<&Link> = None;
        let link: &Link = match slot_link {
            Some(l) => l,
            None => {
                stack_waiter = Waiter::current();
                stack_link = Link::new(Owner::Stack(&stack_waiter));
                &stack_link
            }
        };
        {
            let mut q = self.links.lock();
            // Dekker with `notify_*`'s fast path: count ourselves, fence,
            // then read the condition; a notifier changes the condition,
            // fences, then reads the count.
            self.len.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if !must_wait() {
                self.len.fetch_sub(1, Ordering::SeqCst);
                return WaitOutcome::NotQueued;
            }
            q.push_back(link);
        }
        after_enqueue();
        loop {
            if link.notified.load(Ordering::Acquire) {
                return WaitOutcome::Notified;
            }
            match deadline {
                None => park(),
                Some(d) if !deadline_passed(d) => park_until(d),
                Some(_) => {
                    let mut q = self.links.lock();
                    if q.remove(link) {
                        self.len.fetch_sub(1, Ordering::SeqCst);
                        return WaitOutcome::TimedOut;
                    }
                    // A notifier unlinked us and marked the link under the
                    // lock we now hold.
                    drop(q);
                    debug_assert!(link.notified.load(Ordering::Acquire));
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
            let mut q = self.links.lock();
            q.pop_front().map(|l| {
                self.len.fetch_sub(1, Ordering::SeqCst);
                Self::mark(l)
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
        let mut woken: Vec<Waiter> = Vec::new();
        {
            let mut q = self.links.lock();
            while let Some(l) = q.pop_front() {
                woken.push(Self::mark(l));
            }
            self.len.fetch_sub(woken.len(), Ordering::SeqCst);
        }
        for w in &woken {
            w.wake();
        }
        woken.len()
    }

    /// Unlinked link: copy its waiter, then mark it (last touch).
    fn mark(link: *const Link) -> Waiter {
        // SAFETY: the link is alive: its owner does not return before it is
        // marked or has removed it itself under the lock the caller holds.
        let l = unsafe { &*link };
        let w = l.waiter();
        l.notified.store(true, Ordering::Release);
        w
    }
}
