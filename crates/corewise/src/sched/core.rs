//! One `Core` per CPU the runtime may use: 56 slots (pointers to thread
//! contexts), the occupancy word, the idle gate, the inbox of threads handed
//! over by other cores, statistics and the core-private scheduling state.

use super::context::ThreadContext;
use super::idle::IdleGate;
use super::occupancy::{MaskAndCount, SLOTS};
use crate::runtime::Shared;
use crate::shim::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crossbeam_utils::CachePadded;
use std::cell::UnsafeCell;
use std::sync::OnceLock;

/// Per-core counters.
#[derive(Debug, Default)]
pub(crate) struct CoreStats {
    /// User-thread runs started by the dispatcher.
    pub(crate) dispatches: AtomicU64,
    /// Times the core went to sleep in the kernel.
    pub(crate) sleeps: AtomicU64,
    /// Clock ticks spent with nothing to run (spinning or asleep).
    pub(crate) idle: super::idletime::IdleTime,
    /// Runnable threads times ticks, summed over rotations.
    pub(crate) load_ticks: AtomicU64,
    /// Set when the runtime asked the arbiter for fewer cores: the
    /// dispatcher looks whether its core must go after its current run
    /// instead of at the end of a rotation, which on a full core of
    /// threads that compute for milliseconds lasted 60-390 ms. It sits on
    /// the line the dispatcher writes at every run (`dispatches`), so the
    /// look costs a load of a line it holds.
    pub(crate) release_check: AtomicBool,
}

/// One core: slots, occupancy, idle gate, lifecycle flags, statistics.
pub(crate) struct Core {
    pub(crate) mask: CachePadded<MaskAndCount>,
    pub(crate) gate: CachePadded<IdleGate>,
    /// Set while a kernel thread holds this core and runs its dispatcher.
    pub(crate) active: CachePadded<AtomicBool>,
    pub(crate) stats: CachePadded<CoreStats>,
    /// The contexts in this core's slots. Contexts move between cores
    /// when threads migrate (Arachne swaps them the same way), so a
    /// slot holds a pointer. An array in the core, not a boxed slice: a
    /// read is one load at a fixed offset, with no length to load for the
    /// bounds check (it is read several times per run).
    slots: [AtomicPtr<ThreadContext>; SLOTS],
    pub(crate) index: usize,
    /// The CPU the core's kernel thread runs on while it holds the core.
    pub(crate) cpu: AtomicUsize,
    runtime: OnceLock<&'static Shared>,
    /// The core's ring or epoll set (see [`crate::io`]), created by its
    /// kernel thread.
    pub(crate) io: crate::io::CoreIo,
    /// Slots the thread running here has claimed ahead on other cores
    /// (touched only by this core's kernel thread).
    pub(crate) reserved: CachePadded<crate::reserve::Reservations>,
    /// Threads handed to this core by others, for free slots here.
    pub(crate) inbox: CachePadded<crate::sched::inbox::Inbox<ThreadContext>>,
    /// Threads in the inbox or waiting for a slot here: with the
    /// occupied slots, the load that placement compares (threads handed
    /// over in a burst are not in any slot yet).
    pub(crate) queued: CachePadded<AtomicU32>,
    /// Parked threads waiting on this core's timers (written by its
    /// dispatcher, read by the handoff monitor).
    pub(crate) timers_parked: AtomicU32,
    /// The core-private scheduling state (threads waiting for a slot,
    /// timers of parked threads, spare contexts): only this core's
    /// kernel thread touches it.
    sched: UnsafeCell<crate::sched::park::CoreSched>,
    /// The core's owner and the monitor's handoff request (see
    /// [`crate::sched::handoff`]).
    pub(crate) handoff: CachePadded<crate::sched::handoff::CoreHandoff>,
}

// SAFETY: `sched` is touched only by the core's own kernel thread (see
// `Core::sched`); every other field is atomic or immutable after start.
unsafe impl Sync for Core {}

impl Core {
    /// Whether the core has threads other than the running one: in its
    /// slots, waiting for a slot, in its inbox, or asleep on its timers.
    pub(crate) fn has_other_work(&self) -> bool {
        self.mask.count() > 1
            || self.queued.load(Ordering::Relaxed) != 0
            || self.inbox.has_items()
            || self.timers_parked.load(Ordering::Relaxed) != 0
    }

    /// A core with all slots free; `link` must be called once it has its
    /// final ('static) address.
    pub(crate) fn new(index: usize) -> Self {
        Self {
            mask: CachePadded::new(MaskAndCount::new()),
            gate: CachePadded::new(IdleGate::new()),
            active: CachePadded::new(AtomicBool::new(false)),
            stats: CachePadded::new(CoreStats::default()),
            slots: {
                let contexts: &'static [ThreadContext] =
                    Box::leak((0..SLOTS).map(ThreadContext::new).collect());
                std::array::from_fn(|i| {
                    AtomicPtr::new(&contexts[i] as *const ThreadContext as *mut ThreadContext)
                })
            },
            index,
            cpu: AtomicUsize::new(usize::MAX),
            runtime: OnceLock::new(),
            io: crate::io::CoreIo::new(),
            reserved: CachePadded::new(crate::reserve::Reservations::new()),
            inbox: CachePadded::new(crate::sched::inbox::Inbox::new_closed()),
            queued: CachePadded::new(AtomicU32::new(0)),
            timers_parked: AtomicU32::new(0),
            sched: UnsafeCell::new(crate::sched::park::CoreSched::default()),
            handoff: CachePadded::new(crate::sched::handoff::CoreHandoff::default()),
        }
    }

    /// The core-private scheduling state.
    ///
    /// # Safety
    /// Only the core's kernel thread may call this (its dispatcher, or
    /// the user thread it runs), and the reference must not be held
    /// across a switch or overlap another one from this function.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn sched(&self) -> &mut crate::sched::park::CoreSched {
        // SAFETY: per the contract, no other reference exists.
        unsafe { &mut *self.sched.get() }
    }

    /// Points the slots back at their core and the core at its runtime.
    pub(crate) fn link(&'static self, runtime: &'static Shared) {
        for i in 0..SLOTS {
            self.slot(i).relocate(self, i);
        }
        let _ = self.runtime.set(runtime);
    }

    /// The context in slot `i`.
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> &'static ThreadContext {
        // SAFETY: slots always point at leaked ('static) contexts.
        unsafe { &*self.slots[i].load(Ordering::Acquire) }
    }

    /// Puts `ctx` into slot `i` (migration).
    pub(crate) fn set_slot(&self, i: usize, ctx: &'static ThreadContext) {
        self.slots[i].store(
            ctx as *const ThreadContext as *mut ThreadContext,
            Ordering::Release,
        );
    }

    /// The load placement compares: occupied slots plus threads handed
    /// to the core that wait for one.
    #[inline]
    pub(crate) fn load(&self) -> u32 {
        self.mask.count() + self.queued.load(Ordering::Relaxed)
    }

    /// The runtime this core belongs to.
    #[inline]
    pub(crate) fn runtime(&self) -> &'static Shared {
        self.runtime.get().expect("core linked at runtime start")
    }

    /// Whether a thread other than `me` could run now on this core.
    #[inline]
    pub(crate) fn other_runnable(&self, me: usize) -> bool {
        // Atomics only: the caller may run on a kernel thread that has just
        // handed this core over (see `crate::sched::handoff`). `queued`
        // counts the threads waiting for a slot here and those in the inbox.
        if self.queued.load(Ordering::Relaxed) != 0 || self.inbox.has_items() {
            return true;
        }
        let mut others = self.mask.occupied() & !(1u64 << me);
        let mut now_cache = 0u64;
        let mut now = || {
            if now_cache == 0 {
                now_cache = crate::clock::now();
            }
            now_cache
        };
        while others != 0 {
            let i = others.trailing_zeros() as usize;
            others &= others - 1;
            if self.slot(i).wakeup().is_due(&mut now) {
                return true;
            }
        }
        false
    }
}
