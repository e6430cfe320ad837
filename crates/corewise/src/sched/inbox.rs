//! A core's inbox: threads handed to the core by other cores, for its
//! dispatcher to put into free slots.
//!
//! A thread that has left its slot (it blocked for a while, see
//! [`crate::sched::park`]) is placed again when it is signalled; a thread created
//! while every slot of its cores is busy waits for one. Either way another
//! kernel thread hands a context to a chosen core. The receiving core's
//! slot table stays its own: the sender only pushes the context here, and
//! the core's dispatcher moves it into a free slot on its next pass, so no
//! two kernel threads ever write one slot's pointer.
//!
//! The inbox is an intrusive stack of contexts (Treiber push, one
//! compare-and-swap) that the single consumer empties all at once with one
//! swap. Taking the whole list is what makes it free of the ABA problem:
//! the consumer never pops one node while others push. A core that stops
//! running its dispatcher closes its inbox (the head becomes [`closed`]), so
//! a late sender's push fails and the sender chooses another core instead
//! of stranding the thread on a core nobody runs.

use crate::shim::{AtomicPtr, AtomicU32, Ordering};

/// A node that can sit in an [`Inbox`].
pub(crate) trait Linked: Sized {
    /// The node's link to the next one (written by the pusher before the
    /// node is published, read by the consumer after it took the list).
    fn link(&self) -> &AtomicPtr<Self>;
}

/// The head value of a closed inbox.
fn closed<T>() -> *mut T {
    // A non-null address no allocation has: nodes are aligned to 64.
    std::ptr::dangling_mut::<u8>().wrapping_add(1).cast()
}

/// A multi-producer, single-consumer handoff of nodes (see the module docs).
#[derive(Debug)]
pub(crate) struct Inbox<T: Linked + 'static> {
    head: AtomicPtr<T>,
}

impl<T: Linked + 'static> Inbox<T> {
    /// An inbox that is closed until its consumer [`open`](Self::open)s it.
    pub(crate) fn new_closed() -> Self {
        Self {
            head: AtomicPtr::new(closed()),
        }
    }

    /// An open, empty inbox.
    pub(crate) fn new_open() -> Self {
        Self {
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Pushes `node`; returns false (and leaves `node` untouched) when the
    /// inbox is closed. A release: what the pusher wrote before is visible
    /// to the consumer that takes the node.
    pub(crate) fn push(&self, node: &'static T) -> bool {
        let me = node as *const T as *mut T;
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            if head == closed() {
                return false;
            }
            node.link().store(head, Ordering::Relaxed);
            match self
                .head
                .compare_exchange_weak(head, me, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(h) => head = h,
            }
        }
    }

    /// Counts `node` in `count` and pushes it; on refusal (a closed inbox)
    /// uncounts it and returns false. The count goes up *before* the push
    /// can be seen, so the consumer, which uncounts each node it takes,
    /// never takes the count below zero (an unsigned count would wrap, and
    /// a load read from it would be four billion).
    pub(crate) fn push_counted(&self, node: &'static T, count: &AtomicU32) -> bool {
        count.fetch_add(1, Ordering::Relaxed);
        if self.push(node) {
            return true;
        }
        count.fetch_sub(1, Ordering::Relaxed);
        false
    }

    /// Whether a node may be waiting (one load; the consumer's fast check).
    #[inline]
    pub(crate) fn has_items(&self) -> bool {
        // Null (empty) and the closed mark are the two lowest addresses;
        // a node lies above both (one compare, not two).
        let h = self.head.load(Ordering::Relaxed);
        h as usize > closed::<T>() as usize
    }

    /// Consumer: takes every node pushed so far, oldest first, into `out`.
    pub(crate) fn take_all(&self, out: &mut impl Extend<&'static T>) -> usize {
        if !self.has_items() {
            return 0;
        }
        let list = self.head.swap(std::ptr::null_mut(), Ordering::Acquire);
        Self::collect(list, out)
    }

    /// Consumer: closes the inbox and takes what was in it, oldest first.
    pub(crate) fn close(&self, out: &mut impl Extend<&'static T>) -> usize {
        let list = self.head.swap(closed(), Ordering::Acquire);
        if list == closed() {
            return 0;
        }
        Self::collect(list, out)
    }

    /// Consumer: opens a closed inbox (no effect on an open one).
    pub(crate) fn open(&self) {
        let _ = self.head.compare_exchange(
            closed(),
            std::ptr::null_mut(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Whether the inbox is closed.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.head.load(Ordering::Acquire) == closed()
    }

    /// Reverses the taken list in place (the consumer owns every node of
    /// it now: no pusher writes a link it has published) and hands the
    /// nodes out oldest first, without allocating.
    fn collect(mut p: *mut T, out: &mut impl Extend<&'static T>) -> usize {
        let mut oldest: *mut T = std::ptr::null_mut();
        let mut n = 0;
        while !p.is_null() {
            // SAFETY: every pointer in the list came from a `&'static T` in
            // `push`, published with release and taken here with acquire.
            let node: &'static T = unsafe { &*p };
            p = node.link().load(Ordering::Relaxed);
            node.link().store(oldest, Ordering::Relaxed);
            oldest = node as *const T as *mut T;
            n += 1;
        }
        out.extend(Taken {
            next: oldest,
            left: n,
        });
        n
    }
}

/// The nodes of a taken and reversed list, oldest first. Its exact length
/// lets the receiving queue reserve once.
struct Taken<T: Linked + 'static> {
    next: *mut T,
    left: usize,
}

impl<T: Linked + 'static> Iterator for Taken<T> {
    type Item = &'static T;

    fn next(&mut self) -> Option<&'static T> {
        if self.next.is_null() {
            return None;
        }
        // SAFETY: as in `Inbox::collect`, which built this list from nodes
        // it owns; the links now run oldest to newest.
        let node: &'static T = unsafe { &*self.next };
        self.next = node.link().load(Ordering::Relaxed);
        self.left -= 1;
        Some(node)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<T: Linked + 'static> ExactSizeIterator for Taken<T> {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Node(u32, AtomicPtr<Node>);
    impl Linked for Node {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.1
        }
    }
    fn node(v: u32) -> &'static Node {
        Box::leak(Box::new(Node(v, AtomicPtr::new(std::ptr::null_mut()))))
    }

    #[test]
    fn nodes_come_out_in_push_order_and_a_closed_inbox_refuses() {
        let inbox = Inbox::new_open();
        for v in 0..5 {
            assert!(inbox.push(node(v)));
        }
        let mut out = Vec::new();
        assert_eq!(inbox.take_all(&mut out), 5);
        assert_eq!(out.iter().map(|n| n.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert!(inbox.push(node(9)));
        out.clear();
        assert_eq!(inbox.close(&mut out), 1);
        assert!(inbox.is_closed());
        assert!(!inbox.push(node(10)), "a closed inbox takes nothing");
        assert_eq!(inbox.take_all(&mut out), 0, "nothing new");
        inbox.open();
        assert!(inbox.push(node(11)));
    }
}

/// Models: a push racing a close never loses a node, and a consumer about to
/// sleep never misses a push (the idle gate's Dekker pattern).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sched::idle::IdleGate;
    use loom::sync::Arc;

    struct Node(AtomicPtr<Node>);
    impl Linked for Node {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.0
        }
    }
    fn node() -> &'static Node {
        Box::leak(Box::new(Node(AtomicPtr::new(std::ptr::null_mut()))))
    }

    #[test]
    fn a_push_racing_a_close_is_taken_or_refused_never_lost() {
        loom::model(|| {
            let inbox: Arc<Inbox<Node>> = Arc::new(Inbox::new_open());
            let (a, b) = (node(), node());
            let i2 = inbox.clone();
            let pusher = loom::thread::spawn(move || (i2.push(a), i2.push(b)));
            let mut got: Vec<&'static Node> = Vec::new();
            inbox.take_all(&mut got);
            inbox.close(&mut got);
            let (pa, pb) = pusher.join().unwrap();
            let accepted = usize::from(pa) + usize::from(pb);
            assert_eq!(got.len(), accepted, "every accepted node is taken once");
            if pb {
                assert!(pa, "pushes are ordered: b accepted means a was");
            }
        });
    }

    #[test]
    fn a_counted_push_is_counted_before_its_consumer_uncounts_it() {
        loom::model(|| {
            let inbox: Arc<Inbox<Node>> = Arc::new(Inbox::new_open());
            let count = Arc::new(AtomicU32::new(0));
            let (a, b) = (node(), node());
            let (i2, c2) = (inbox.clone(), count.clone());
            let pusher = loom::thread::spawn(move || {
                assert!(i2.push_counted(a, &c2));
                assert!(i2.push_counted(b, &c2));
            });
            // The consumer: take what is there and uncount it, as a
            // dispatcher does when it installs a thread from its inbox.
            let mut taken = 0;
            while taken < 2 {
                let mut got: Vec<&'static Node> = Vec::new();
                inbox.take_all(&mut got);
                for _ in got {
                    let before = count.fetch_sub(1, Ordering::Relaxed);
                    assert!(before >= 1, "uncounted before it was counted");
                    taken += 1;
                }
                loom::thread::yield_now();
            }
            pusher.join().unwrap();
            assert_eq!(count.load(Ordering::Relaxed), 0);
        });
    }

    #[test]
    fn a_push_onto_a_sleeping_core_wakes_it() {
        loom::model(|| {
            let inbox: Arc<Inbox<Node>> = Arc::new(Inbox::new_open());
            let gate = Arc::new(IdleGate::new());
            let n = node();
            let (i2, g2) = (inbox.clone(), gate.clone());
            let pusher = loom::thread::spawn(move || {
                assert!(i2.push(n));
                g2.wake_after_rmw();
            });
            // The dispatcher: look, announce sleep, look again, sleep.
            let mut got: Vec<&'static Node> = Vec::new();
            loop {
                if inbox.take_all(&mut got) > 0 {
                    break;
                }
                gate.prepare_sleep();
                if inbox.has_items() {
                    gate.cancel_sleep();
                    continue;
                }
                gate.sleep(None);
            }
            pusher.join().unwrap();
            assert_eq!(got.len(), 1);
        });
    }
}
