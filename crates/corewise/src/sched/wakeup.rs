//! The wake-up protocol of a slot: a signal count that any core bumps
//! (in the slot's first line) and the core-private half that the
//! dispatcher keeps (with the generation that last ran), plus the `PARKED`
//! mark of a thread that left its slot.

use crate::shim::{AtomicU32, AtomicU64, Ordering};

/// `wakeup_time` of a thread that waits for a signal.
pub(crate) const BLOCKED: u64 = u64::MAX;
/// `wakeup_time` of a thread that may run now.
pub(crate) const RUNNABLE: u64 = 0;

/// The shared half of a slot's wakeup state: a count of signals, bumped by
/// any core (it lives in the slot's first cache line).
///
/// Arachne keeps one `wakeupTime` word that signallers set to 0 and the
/// dispatcher sets to "never" before it runs the thread; that second write
/// costs the dispatcher an extra cache-line upgrade on every wakeup. Here
/// signallers only count, and the dispatcher remembers (in the core-private
/// [`LocalWake`]) which count it has seen: a thread is runnable when the
/// count moved on, or when its own deadline passed. The dispatcher never
/// writes the shared line, so a wakeup costs one transfer each way.
#[derive(Debug)]
pub(crate) struct SignalWord(pub(super) AtomicU64);

impl SignalWord {
    /// No signal yet.
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// After a signal found the thread [`PARKED`]: clears the mark and
    /// returns true for exactly one caller, which must place the thread.
    #[inline]
    pub(crate) fn claim_unpark(&self) -> bool {
        self.0.fetch_and(!PARKED, Ordering::AcqRel) & PARKED != 0
    }
}

/// The signal word's low bit: the thread has left its slot and waits for a
/// signal to be placed again (see [`crate::sched::park`]). Signals count in steps
/// of [`SIGNAL`] above it, so a signal is still one `lock xadd`, and it
/// tells the signaller whether the thread was parked.
pub(crate) const PARKED: u64 = 1;
/// One signal's step in the signal word.
pub(crate) const SIGNAL: u64 = 2;

/// The core-private half: the signal count the dispatcher has consumed and
/// the thread's own deadline ([`RUNNABLE`], [`BLOCKED`] or ticks). Written
/// only by the kernel thread that runs the slot's core (plain stores).
#[derive(Debug)]
pub(crate) struct LocalWake {
    consumed: AtomicU64,
    deadline: AtomicU64,
    /// The generation whose function last ran in the context (see
    /// [`Invocation::to_run`](crate::sched::slot::Invocation::to_run)):
    /// written when a thread ends, by the core that ran it, so it sits in
    /// this core-private line and not in the slot's first.
    pub(crate) ran_generation: AtomicU32,
}

impl LocalWake {
    /// A free slot's state.
    pub(crate) fn new() -> Self {
        Self {
            consumed: AtomicU64::new(0),
            deadline: AtomicU64::new(BLOCKED),
            ran_generation: AtomicU32::new(0),
        }
    }
}

/// Both halves of one slot's wakeup state, as the protocol uses them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wakeup<'a> {
    pub(crate) shared: &'a SignalWord,
    pub(crate) local: &'a LocalWake,
}

impl Wakeup<'_> {
    /// Makes the thread runnable (a release of everything written before).
    /// A read-modify-write: follow it with
    /// [`IdleGate::wake_after_rmw`](crate::sched::idle::IdleGate::wake_after_rmw).
    /// Returns true when the thread had left its slot ([`PARKED`]): the
    /// caller must then try [`SignalWord::claim_unpark`] and place it.
    #[inline]
    pub(crate) fn signal(&self) -> bool {
        self.shared.0.fetch_add(SIGNAL, Ordering::AcqRel) & PARKED != 0
    }

    /// Dispatcher, for a thread that is blocked in its slot: marks it
    /// [`PARKED`] if no signal arrived since it last ran, and returns
    /// whether it did. From then on the first signaller that clears the
    /// mark places the thread again; the dispatcher must take it out of
    /// its slot without running it.
    #[inline]
    pub(crate) fn try_park(&self) -> bool {
        let consumed = self.local.consumed.load(Ordering::Relaxed);
        self.shared
            .0
            .compare_exchange(
                consumed,
                consumed | PARKED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Dispatcher: if the thread is due (a new signal, or its deadline at
    /// `now`), consumes that and returns true; the thread is about to run.
    /// `now` is read only for a deadline.
    #[inline]
    pub(crate) fn take_if_due(&self, now: &mut impl FnMut() -> u64) -> bool {
        let seen = self.shared.0.load(Ordering::Acquire);
        let consumed = self.local.consumed.load(Ordering::Relaxed);
        let deadline = self.local.deadline.load(Ordering::Relaxed);
        if seen == consumed && (deadline == BLOCKED || (deadline != RUNNABLE && deadline > now())) {
            return false;
        }
        self.local.consumed.store(seen, Ordering::Relaxed);
        self.local.deadline.store(BLOCKED, Ordering::Relaxed);
        true
    }

    /// Whether the thread could run now (`None`), or else its deadline
    /// (`Some(BLOCKED)` for none): the re-check before sleeping, after the
    /// gate's fence.
    #[inline]
    pub(crate) fn due_or_deadline(&self, now: u64) -> Option<u64> {
        let seen = self.shared.0.load(Ordering::Acquire);
        let deadline = self.local.deadline.load(Ordering::Relaxed);
        if seen != self.local.consumed.load(Ordering::Relaxed)
            || deadline == RUNNABLE
            || (deadline != BLOCKED && deadline <= now)
        {
            None
        } else {
            Some(deadline)
        }
    }

    /// Whether the thread could run now; `now` is read only for a deadline.
    #[inline]
    pub(crate) fn is_due(&self, now: &mut impl FnMut() -> u64) -> bool {
        let deadline = self.local.deadline.load(Ordering::Relaxed);
        self.shared.0.load(Ordering::Relaxed) != self.local.consumed.load(Ordering::Relaxed)
            || deadline == RUNNABLE
            || (deadline != BLOCKED && deadline <= now())
    }

    /// Thread: be runnable again after switching out (`yield`).
    #[inline]
    pub(crate) fn set_runnable(&self) {
        self.local.deadline.store(RUNNABLE, Ordering::Relaxed);
    }

    /// Thread: sleep until `deadline` (ticks, or [`BLOCKED`]) or a signal.
    /// Returns false when a signal already arrived (it is consumed and the
    /// thread need not switch out).
    #[inline]
    pub(crate) fn block_until(&self, deadline: u64) -> bool {
        if self.consume_signal() {
            return false;
        }
        self.local.deadline.store(deadline, Ordering::Relaxed);
        true
    }

    /// Thread: consumes a pending signal, if any.
    #[inline]
    pub(crate) fn consume_signal(&self) -> bool {
        let seen = self.shared.0.load(Ordering::Acquire);
        if seen != self.local.consumed.load(Ordering::Relaxed) {
            self.local.consumed.store(seen, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Slot is being freed: no deadline, and every signal so far consumed.
    #[inline]
    pub(crate) fn reset(&self) {
        self.local.deadline.store(BLOCKED, Ordering::Relaxed);
        let seen = self.shared.0.load(Ordering::Relaxed);
        self.local.consumed.store(seen, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wakeup_keeps_a_signal_that_arrives_while_running() {
        let (shared, local) = (SignalWord::new(), LocalWake::new());
        let w = Wakeup {
            shared: &shared,
            local: &local,
        };
        w.signal();
        assert!(w.take_if_due(&mut || 0));
        // The thread runs; a signal arrives; the thread then blocks.
        w.signal();
        assert!(!w.block_until(BLOCKED), "signal consumed, no switch");
        assert!(w.block_until(BLOCKED));
        assert!(!w.take_if_due(&mut || u64::MAX - 1));
        w.signal();
        assert!(w.take_if_due(&mut || 0));
    }

    #[test]
    fn deadlines_are_due_only_when_reached() {
        let (shared, local) = (SignalWord::new(), LocalWake::new());
        let w = Wakeup {
            shared: &shared,
            local: &local,
        };
        assert!(w.block_until(100));
        assert!(!w.take_if_due(&mut || 99));
        assert_eq!(w.due_or_deadline(99), Some(100));
        assert!(w.take_if_due(&mut || 100));
        assert_eq!(w.due_or_deadline(1000), Some(BLOCKED));
        w.set_runnable();
        assert_eq!(w.due_or_deadline(0), None);
    }

    #[test]
    fn a_freed_slot_forgets_old_signals() {
        let (shared, local) = (SignalWord::new(), LocalWake::new());
        let w = Wakeup {
            shared: &shared,
            local: &local,
        };
        w.signal();
        w.signal();
        w.reset();
        assert!(!w.take_if_due(&mut || 0));
    }
}
