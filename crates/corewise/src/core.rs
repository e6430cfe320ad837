//! One `Core` per CPU the runtime may use: 56 thread slots and the words that
//! other cores touch to claim a slot, wake a thread or wake the core.
//!
//! The layout follows Arachne. A slot's first cache line holds the function
//! of the thread that will start there, so creating a thread on another core
//! costs the transfer of that line and of the slot's wakeup line, nothing
//! more. The occupancy of all 56 slots is one atomic word (`MaskAndCount`),
//! so power-of-two-choices placement reads one word per candidate core and
//! a spawner claims a slot with one atomic bit-test-and-set.
//!
//! Unlike Arachne's, the word keeps no separate count: the count is the
//! mask's population count. With a count in the word, a claim had to be a
//! compare-and-swap of the whole word, which failed (and cost another
//! transfer of the line) whenever the core freed some other slot between
//! the spawner's read and its swap, and a busy receiving core frees one
//! after every thread. A `lock bts` on the claimed bit succeeds whatever
//! happened to the other bits (creation throughput from one spawner
//! 13.0 -> 16.3 M/s at a round trip of ~56 ns, 3.7 -> 4.1 M/s at ~420 ns).
//! A departure from Arachne's "mask and count" word, which keeps its
//! name here.

use crate::shim::{AtomicU64, Ordering};

/// Thread slots per core (Arachne's 56; the word's top 8 bits are unused).
pub(crate) const SLOTS: usize = 56;
const OCCUPANCY: u64 = (1 << SLOTS) - 1;

/// `wakeup_time` of a thread that waits for a signal.
pub(crate) const BLOCKED: u64 = u64::MAX;
/// `wakeup_time` of a thread that may run now.
pub(crate) const RUNNABLE: u64 = 0;

/// A core's slot occupancy mask (low 56 bits); the occupied-slot count is
/// its population count.
#[derive(Debug)]
pub(crate) struct MaskAndCount(AtomicU64);

impl MaskAndCount {
    /// All slots free.
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The occupancy mask.
    #[inline]
    pub(crate) fn occupied(&self) -> u64 {
        self.0.load(Ordering::Acquire) & OCCUPANCY
    }

    /// The number of occupied slots.
    #[inline]
    pub(crate) fn count(&self) -> u32 {
        (self.0.load(Ordering::Relaxed) & OCCUPANCY).count_ones()
    }

    /// Claims the lowest free slot, or `None` when all 56 are taken. Acquire:
    /// what the slot's previous thread wrote is visible to the new owner.
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let free = !cur & OCCUPANCY;
            if free == 0 {
                return None;
            }
            let slot = free.trailing_zeros() as usize;
            let bit = 1u64 << slot;
            // Only the claimed bit's old value is used, so this is one
            // `lock bts`, which a concurrent release of another slot
            // cannot make fail (a compare-and-swap of the word could).
            if self.0.fetch_or(bit, Ordering::Acquire) & bit == 0 {
                return Some(slot);
            }
            cur = self.0.load(Ordering::Relaxed);
        }
    }

    /// Claims the lowest free slot like [`claim`](Self::claim), then up to
    /// `max - 1` more with one compare-and-swap while the line is still
    /// here (no retry: if the word changed meanwhile, just the one slot);
    /// returns the first slot and the others as bits (see `crate::reserve`).
    /// One swap, not a bit set per slot: the core polls this word, and
    /// each bit set after its read would wait for the line again.
    #[inline]
    pub(crate) fn claim_ahead(&self, max: u32) -> Option<(usize, u64)> {
        let first = self.claim()?;
        let cur = self.0.load(Ordering::Relaxed);
        let mut free = !cur & OCCUPANCY;
        let mut more = 0u64;
        for _ in 1..max {
            if free == 0 {
                break;
            }
            let bit = free & free.wrapping_neg();
            more |= bit;
            free &= !bit;
        }
        if more != 0
            && self
                .0
                .compare_exchange(cur, cur | more, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            more = 0;
        }
        Some((first, more))
    }

    /// Frees `slot`, which the caller owns. Release: pairs with `claim`.
    #[inline]
    pub(crate) fn release(&self, slot: usize) {
        self.release_all(1u64 << slot);
    }

    /// Frees every slot in `slots` (bits), all owned by the caller and
    /// never filled (returned reservations).
    #[inline]
    pub(crate) fn release_all(&self, slots: u64) {
        self.0.fetch_and(!slots, Ordering::Release);
    }
}

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
pub(crate) struct SignalWord(AtomicU64);

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
/// signal to be placed again (see [`crate::park`]). Signals count in steps
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
}

impl LocalWake {
    /// A free slot's state.
    pub(crate) fn new() -> Self {
        Self {
            consumed: AtomicU64::new(0),
            deadline: AtomicU64::new(BLOCKED),
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
    /// [`IdleGate::wake_after_rmw`](crate::idle::IdleGate::wake_after_rmw).
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

#[cfg(not(loom))]
pub(crate) use runtime_core::*;

#[cfg(not(loom))]
mod runtime_core {
    use super::*;
    use crate::context::Context;
    use crate::idle::IdleGate;
    use crate::runtime::Shared;
    use crate::shim::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize};
    #[cfg(test)]
    const _LINE0_IS_ONE_LINE: () = assert!(size_of::<Invocation>() == 64);
    use crossbeam_utils::CachePadded;
    use std::cell::{Cell, UnsafeCell};
    use std::mem::{align_of, size_of, MaybeUninit};
    use std::sync::OnceLock;

    /// Bytes of a thread's function that fit in the slot's first cache line.
    const INLINE_BYTES: usize = 40;

    /// The first cache line of a slot: everything a spawner writes and a
    /// signaller touches, so creating a thread on another core moves one
    /// line (plus the core's `MaskAndCount`), and so does a signal.
    #[repr(C, align(64))]
    pub(crate) struct Invocation {
        /// The thread's closure, when it fits (else a `Box` pointer).
        storage: UnsafeCell<MaybeUninit<[u64; INLINE_BYTES / 8]>>,
        /// The function that runs `storage`, as a `usize`; 0 = nothing to
        /// run. Published (release) after `storage` is written.
        run: AtomicUsize,
        /// `ThreadClass` of the thread in the slot (as u32).
        pub(crate) class: AtomicU32,
        /// Bumped by the spawner that puts a new thread in the slot, so
        /// `ThreadId`s of earlier threads are recognised as stale.
        pub(crate) generation: AtomicU32,
        /// The shared half of the slot's wakeup state.
        pub(crate) signals: SignalWord,
    }

    impl Invocation {
        fn new() -> Self {
            Self {
                storage: UnsafeCell::new(MaybeUninit::uninit()),
                run: AtomicUsize::new(0),
                class: AtomicU32::new(0),
                generation: AtomicU32::new(0),
                signals: SignalWord::new(),
            }
        }

        /// Stores `f` (inline when it fits, otherwise boxed) and publishes it.
        ///
        /// # Safety
        /// The caller owns the slot (claimed it and has not yet made it
        /// runnable), so nothing else reads or writes `storage`.
        pub(crate) unsafe fn put<F: FnOnce() + Send + 'static>(&self, f: F) {
            let run: unsafe fn(*mut u8) = if size_of::<F>() <= INLINE_BYTES && align_of::<F>() <= 8
            {
                // SAFETY: the storage is 40 bytes aligned to 64 and F fits.
                unsafe { self.storage.get().cast::<F>().write(f) };
                run_inline::<F>
            } else {
                let boxed: Box<F> = Box::new(f);
                // SAFETY: a pointer fits in the storage.
                unsafe {
                    self.storage
                        .get()
                        .cast::<*mut F>()
                        .write(Box::into_raw(boxed))
                };
                run_boxed::<F>
            };
            self.run.store(run as usize, Ordering::Release);
        }

        /// Whether a function is published in the slot (from `put` until the
        /// thread's function has returned). An occupied slot without one is
        /// being filled by a spawner right now.
        #[inline]
        pub(crate) fn is_published(&self) -> bool {
            self.run.load(Ordering::Acquire) != 0
        }

        /// Slot's own thread: runs the published function, if there is one,
        /// leaving the line empty. Returns whether one ran.
        ///
        /// # Safety
        /// Called only by the slot's own coroutine.
        pub(crate) unsafe fn run_published(&self) -> bool {
            let run = self.run.load(Ordering::Acquire);
            if run == 0 {
                return false;
            }
            // SAFETY: a non-zero `run` is an `unsafe fn(*mut u8)` stored by
            // `put`, which wrote the matching closure before publishing.
            unsafe {
                let run: unsafe fn(*mut u8) = std::mem::transmute::<usize, unsafe fn(*mut u8)>(run);
                run(self.storage.get().cast());
            }
            // Cleared only now: a write to this line before the thread ran
            // would cost a cache-line upgrade on the creation path. Nothing
            // looks at `run` until the slot is free again.
            self.run.store(0, Ordering::Relaxed);
            true
        }
    }

    impl Invocation {
        /// Puts the running thread's wait link in `storage` and returns it.
        ///
        /// The storage is dead from the moment the thread's function was
        /// taken out of it (`run_published` moves it to the thread's stack)
        /// until the slot is freed, and a user thread waits on one queue at
        /// a time; so the link sits in the line that a signal writes and the
        /// dispatcher reads to wake the thread (see `sync::wait_queue`).
        ///
        /// # Safety
        /// Called only by the slot's running thread, while no earlier link
        /// of its is still queued.
        pub(crate) unsafe fn wait_link(
            &self,
            link: crate::sync::wait_queue::Link,
        ) -> &crate::sync::wait_queue::Link {
            const {
                assert!(size_of::<crate::sync::wait_queue::Link>() <= INLINE_BYTES);
                assert!(align_of::<crate::sync::wait_queue::Link>() <= 8);
            }
            let p = self.storage.get().cast::<crate::sync::wait_queue::Link>();
            // SAFETY: per the contract the storage holds nothing live and
            // no other thread reaches it (the old link is unlinked); it is
            // big and aligned enough (checked above).
            unsafe {
                p.write(link);
                &*p
            }
        }
    }

    /// # Safety
    /// `p` holds an `F` written by `Invocation::put`, read exactly once.
    unsafe fn run_inline<F: FnOnce()>(p: *mut u8) {
        // SAFETY: per the function's contract.
        let f = unsafe { p.cast::<F>().read() };
        f()
    }

    /// # Safety
    /// `p` holds a `*mut F` from `Box::into_raw`, read exactly once.
    unsafe fn run_boxed<F: FnOnce()>(p: *mut u8) {
        // SAFETY: per the function's contract.
        let f = unsafe { Box::from_raw(p.cast::<*mut F>().read()) };
        f()
    }

    /// One thread slot.
    #[repr(C, align(64))]
    pub(crate) struct ThreadContext {
        /// Line 0: function, class, generation, signal count.
        pub(crate) invocation: Invocation,
        /// Line 1 is read-mostly: a signaller reads `core` right after its
        /// swap on line 0, so nothing the dispatcher writes on every
        /// wakeup may share this line (that would cost the signaller a
        /// second transfer).
        /// Owned by the core's kernel thread.
        core: AtomicPtr<Core>,
        /// The slot the context occupies in its core (it moves when the
        /// thread migrates).
        index: AtomicUsize,
        /// The thread's name, if it has one (a leaked `Box<str>` while the
        /// thread lives; read by the stack-overflow handler).
        name_ptr: AtomicPtr<u8>,
        name_len: AtomicUsize,
        /// The next context in an inbox (see [`crate::inbox`]), written by
        /// the sender before it publishes the context there.
        link: AtomicPtr<ThreadContext>,
        /// Lines 2 on, core-private: the dispatcher's half of the wakeup
        /// state (written on every wakeup), the execution context, the
        /// yielder.
        local: CachePadded<LocalWake>,
        context: UnsafeCell<Option<Context>>,
        /// Set by the slot's coroutine when it starts; valid while it lives.
        pub(crate) yielder: Cell<*const crate::context::SlotYielder>,
    }

    // SAFETY: the `Cell`/`UnsafeCell` fields are touched only by the kernel
    // thread that owns the slot's core (the dispatcher and the thread it runs),
    // or by a spawner that owns the slot through `MaskAndCount::claim` before
    // it publishes the slot's function (release).
    unsafe impl Sync for ThreadContext {}
    // SAFETY: as for `Sync`; a context is created on one thread and handed to
    // the core's kernel thread before any use.
    unsafe impl Send for ThreadContext {}

    impl crate::inbox::Linked for ThreadContext {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.link
        }
    }

    /// The class word's flag for a thread created with `Builder::core`: it
    /// runs on that core only, so it is never parked or moved by load.
    pub(crate) const PINNED: u32 = 1 << 16;

    impl ThreadContext {
        /// A context that belongs to no slot yet (see [`crate::park`]).
        pub(crate) fn new_spare() -> &'static Self {
            Box::leak(Box::new(Self::new(0)))
        }

        /// The thread's class.
        #[inline]
        pub(crate) fn class(&self) -> crate::policy::ThreadClass {
            crate::policy::ThreadClass::from_u32(
                self.invocation.class.load(Ordering::Relaxed) & !PINNED,
            )
        }

        /// Whether the thread may leave its slot and be placed on any core
        /// its class may use (not pinned, not `Exclusive`).
        #[inline]
        pub(crate) fn movable(&self) -> bool {
            let c = self.invocation.class.load(Ordering::Relaxed);
            c & PINNED == 0
                && crate::policy::ThreadClass::from_u32(c) != crate::policy::ThreadClass::Exclusive
        }

        /// Whether the context holds a live thread's function (see
        /// [`Invocation::is_published`]).
        #[inline]
        pub(crate) fn is_published(&self) -> bool {
            self.invocation.is_published()
        }

        fn new(index: usize) -> Self {
            Self {
                invocation: Invocation::new(),
                core: AtomicPtr::new(std::ptr::null_mut()),
                index: AtomicUsize::new(index),
                name_ptr: AtomicPtr::new(std::ptr::null_mut()),
                name_len: AtomicUsize::new(0),
                link: AtomicPtr::new(std::ptr::null_mut()),
                local: CachePadded::new(LocalWake::new()),
                context: UnsafeCell::new(None),
                yielder: Cell::new(std::ptr::null()),
            }
        }

        /// The slot's wakeup state.
        #[inline]
        pub(crate) fn wakeup(&self) -> Wakeup<'_> {
            Wakeup {
                shared: &self.invocation.signals,
                local: &self.local,
            }
        }

        /// The slot's generation counter.
        #[inline]
        pub(crate) fn generation(&self) -> &AtomicU32 {
            &self.invocation.generation
        }

        /// The core the context is on now.
        #[inline]
        pub(crate) fn core(&self) -> &'static Core {
            // SAFETY: always a pointer to a core of a leaked ('static)
            // runtime, set before the context is first used.
            unsafe { &*self.core.load(Ordering::Acquire) }
        }

        /// The slot index the context occupies in [`core`](Self::core).
        #[inline]
        pub(crate) fn index(&self) -> usize {
            self.index.load(Ordering::Relaxed)
        }

        /// Moves the context to slot `index` of `core` (migration).
        pub(crate) fn relocate(&self, core: &'static Core, index: usize) {
            self.index.store(index, Ordering::Relaxed);
            self.core
                .store(core as *const Core as *mut Core, Ordering::Release);
        }

        /// The slot's execution context, creating it on first use.
        ///
        /// # Safety
        /// Only the owning core's kernel thread may call this, and not while
        /// the context runs; the returned reference must not outlive that.
        #[allow(clippy::mut_from_ref)]
        #[inline]
        pub(crate) unsafe fn context(
            &'static self,
            stack_size: usize,
        ) -> std::io::Result<&'static mut Context> {
            // SAFETY: per the contract, no other reference exists.
            let slot = unsafe { &mut *self.context.get() };
            match slot {
                Some(c) => Ok(c),
                None => Self::create_context(slot, stack_size, self),
            }
        }

        /// The first use of a slot: its stack and coroutine (out of the
        /// dispatch path, which only ever finds them made).
        #[cold]
        #[inline(never)]
        fn create_context(
            slot: &'static mut Option<Context>,
            stack_size: usize,
            this: &'static Self,
        ) -> std::io::Result<&'static mut Context> {
            Ok(slot.insert(Context::new(stack_size, this)?))
        }

        /// Drops the slot's context (its stack), at runtime shutdown.
        ///
        /// # Safety
        /// As for [`context`](Self::context), and the slot must be free.
        pub(crate) unsafe fn drop_context(&self) {
            // SAFETY: per the contract.
            unsafe { *self.context.get() = None };
        }

        /// Sets the thread's name, freeing any old one. Costs nothing for a
        /// thread that never had a name.
        pub(crate) fn set_name(&self, name: Option<Box<str>>) {
            if name.is_none() && self.name_ptr.load(Ordering::Relaxed).is_null() {
                return;
            }
            let (ptr, len) = match name {
                Some(n) => {
                    let len = n.len();
                    (Box::into_raw(n).cast::<u8>(), len)
                }
                None => (std::ptr::null_mut(), 0),
            };
            let old_len = self.name_len.swap(len, Ordering::Relaxed);
            let old = self.name_ptr.swap(ptr, Ordering::Release);
            if !old.is_null() {
                // SAFETY: `old`/`old_len` came from `Box::into_raw` of a
                // `Box<str>` above, and the swap took them out exactly once.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(old, old_len) as *mut str)
                });
            }
        }

        /// The thread's name, if any.
        pub(crate) fn name(&self) -> Option<&str> {
            let ptr = self.name_ptr.load(Ordering::Acquire);
            if ptr.is_null() {
                return None;
            }
            let len = self.name_len.load(Ordering::Relaxed);
            // SAFETY: the name lives until the slot's thread exits; callers
            // are that thread or the crash handler.
            Some(unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(ptr, len)) })
        }
    }

    /// Per-core counters.
    #[derive(Debug, Default)]
    pub(crate) struct CoreStats {
        /// User-thread runs started by the dispatcher.
        pub(crate) dispatches: AtomicU64,
        /// Times the core went to sleep in the kernel.
        pub(crate) sleeps: AtomicU64,
        /// Clock ticks spent with nothing to run (spinning or asleep).
        pub(crate) idle_ticks: AtomicU64,
        /// Runnable threads times ticks, summed over rotations.
        pub(crate) load_ticks: AtomicU64,
        /// Start of the idle period going on now (0: busy).
        pub(crate) idle_since: AtomicU64,
    }

    impl CoreStats {
        /// Idle ticks up to `now`, counting an idle period still going on.
        pub(crate) fn idle_until(&self, now: u64) -> u64 {
            loop {
                let before = self.idle_ticks.load(Ordering::Acquire);
                let since = self.idle_since.load(Ordering::Acquire);
                let after = self.idle_ticks.load(Ordering::Acquire);
                if before == after {
                    let open = if since != 0 {
                        now.saturating_sub(since)
                    } else {
                        0
                    };
                    return before.wrapping_add(open);
                }
            }
        }
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
        /// slot holds a pointer.
        slots: Box<[AtomicPtr<ThreadContext>]>,
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
        pub(crate) inbox: CachePadded<crate::inbox::Inbox<ThreadContext>>,
        /// Threads in the inbox or waiting for a slot here: with the
        /// occupied slots, the load that placement compares (threads handed
        /// over in a burst are not in any slot yet).
        pub(crate) queued: CachePadded<AtomicU32>,
        /// The core-private scheduling state (threads waiting for a slot,
        /// timers of parked threads, spare contexts): only this core's
        /// kernel thread touches it.
        sched: UnsafeCell<crate::park::CoreSched>,
    }

    // SAFETY: `sched` is touched only by the core's own kernel thread (see
    // `Core::sched`); every other field is atomic or immutable after start.
    unsafe impl Sync for Core {}

    impl Core {
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
                    contexts
                        .iter()
                        .map(|c| AtomicPtr::new(c as *const ThreadContext as *mut ThreadContext))
                        .collect()
                },
                index,
                cpu: AtomicUsize::new(usize::MAX),
                runtime: OnceLock::new(),
                io: crate::io::CoreIo::new(),
                reserved: CachePadded::new(crate::reserve::Reservations::new()),
                inbox: CachePadded::new(crate::inbox::Inbox::new_closed()),
                queued: CachePadded::new(AtomicU32::new(0)),
                sched: UnsafeCell::new(crate::park::CoreSched::default()),
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
        pub(crate) unsafe fn sched(&self) -> &mut crate::park::CoreSched {
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
            // SAFETY: called by the running user thread, on this core's
            // kernel thread; the reference ends here.
            if unsafe { self.sched() }.waiting() || self.inbox.has_items() {
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
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn claim_fills_all_56_slots_then_fails() {
        let m = MaskAndCount::new();
        for i in 0..SLOTS {
            assert_eq!(m.claim(), Some(i));
            assert_eq!(m.count() as usize, i + 1);
        }
        assert_eq!(m.claim(), None);
        m.release(7);
        assert_eq!(m.count() as usize, SLOTS - 1);
        assert_eq!(m.claim(), Some(7));
    }

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

/// Models of the cross-core protocol: slot claim, publication through the
/// wakeup word, and the idle gate, as the dispatcher and spawners use them.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::idle::IdleGate;
    use crate::shim::{AtomicBool, UnsafeCell};
    use loom::sync::Arc;

    /// The dispatcher's loop, reduced to one slot: take a due thread, or
    /// announce sleep, re-check with SeqCst, and sleep.
    fn dispatch_until(
        mask: &MaskAndCount,
        w: Wakeup<'_>,
        gate: &IdleGate,
        mut run: impl FnMut() -> bool,
    ) {
        loop {
            if mask.occupied() & 1 != 0 && w.take_if_due(&mut || 0) {
                if run() {
                    return;
                }
                continue;
            }
            gate.prepare_sleep();
            if mask.occupied() & 1 != 0 && w.due_or_deadline(0).is_none() {
                gate.cancel_sleep();
                continue;
            }
            gate.sleep(None);
        }
    }

    #[test]
    fn spawn_onto_a_sleeping_core_is_never_lost() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let shared = Arc::new(SignalWord::new());
            let local = LocalWake::new();
            let gate = Arc::new(IdleGate::new());
            let job = Arc::new(UnsafeCell::new(0u32));
            let published = Arc::new(AtomicBool::new(false));
            let spawner = {
                let (mask, shared, gate, job, published) = (
                    mask.clone(),
                    shared.clone(),
                    gate.clone(),
                    job.clone(),
                    published.clone(),
                );
                loom::thread::spawn(move || {
                    assert_eq!(mask.claim(), Some(0));
                    // SAFETY: the slot is ours until it is published.
                    job.with_mut(|p| unsafe { *p = 42 });
                    published.store(true, Ordering::Release);
                    // The spawner's signal touches only the shared half.
                    shared.0.fetch_add(SIGNAL, Ordering::Release);
                    gate.wake_after_rmw();
                })
            };
            let w = Wakeup {
                shared: &shared,
                local: &local,
            };
            dispatch_until(&mask, w, &gate, || {
                // A stale signal may run the slot before it is published:
                // the slot loop checks the publication flag.
                if !published.load(Ordering::Acquire) {
                    return false;
                }
                // SAFETY: published with release; the spawner is done.
                assert_eq!(job.with_mut(|p| unsafe { *p }), 42);
                mask.release(0);
                true
            });
            spawner.join().unwrap();
            assert_eq!(mask.count(), 0);
        });
    }

    #[test]
    fn signal_racing_block_is_never_lost() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let shared = Arc::new(SignalWord::new());
            let local = LocalWake::new();
            let gate = Arc::new(IdleGate::new());
            let flag = Arc::new(AtomicBool::new(false));
            assert_eq!(mask.claim(), Some(0));
            let w = Wakeup {
                shared: &shared,
                local: &local,
            };
            w.signal();
            let signaller = {
                let (shared, gate, flag) = (shared.clone(), gate.clone(), flag.clone());
                loom::thread::spawn(move || {
                    flag.store(true, Ordering::Relaxed);
                    shared.0.fetch_add(SIGNAL, Ordering::Release);
                    gate.wake_after_rmw();
                })
            };
            // The user thread: wait for the flag with block().
            dispatch_until(&mask, w, &gate, || loop {
                if flag.load(Ordering::Relaxed) {
                    return true;
                }
                if w.block_until(BLOCKED) {
                    return false; // switched out
                }
            });
            signaller.join().unwrap();
        });
    }

    #[test]
    fn claiming_ahead_racing_a_claim_and_a_release_never_shares_a_slot() {
        // Slot 0 taken; the core frees it while one spawner claims three
        // slots ahead (a reservation) and another claims one.
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            assert_eq!(mask.claim(), Some(0));
            let m = mask.clone();
            let freer = loom::thread::spawn(move || m.release(0));
            let m = mask.clone();
            let ahead = loom::thread::spawn(move || {
                let (first, more) = m.claim_ahead(3).unwrap();
                (1u64 << first) | more
            });
            let m = mask.clone();
            let one = loom::thread::spawn(move || 1u64 << m.claim().unwrap());
            freer.join().unwrap();
            let (a, b) = (ahead.join().unwrap(), one.join().unwrap());
            assert_eq!(a & b, 0, "shared slots: {a:#b} and {b:#b}");
            assert!(a.count_ones() >= 1 && a.count_ones() <= 3);
            assert_eq!(mask.occupied(), a | b);
            mask.release_all(a | b);
            assert_eq!(mask.occupied(), 0);
        });
    }

    #[test]
    fn claims_racing_a_release_never_share_a_slot() {
        // Slots 0 and 1 taken; the core frees slot 0 while two spawners
        // claim. Each spawner must end with a slot of its own, and the
        // mask must hold exactly the slots in use.
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            assert_eq!(mask.claim(), Some(0));
            assert_eq!(mask.claim(), Some(1));
            let m = mask.clone();
            let freer = loom::thread::spawn(move || m.release(0));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let m = mask.clone();
                    loom::thread::spawn(move || m.claim().unwrap())
                })
                .collect();
            freer.join().unwrap();
            let got: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            assert_ne!(got[0], got[1], "two spawners claimed slot {}", got[0]);
            assert!(
                got.iter().all(|&s| s != 1),
                "slot 1 is still taken: {got:?}"
            );
            let expect = got.iter().fold(1u64 << 1, |m, &s| m | (1 << s));
            assert_eq!(mask.occupied(), expect);
            assert_eq!(mask.count(), 3);
        });
    }

    #[test]
    fn signals_racing_a_park_place_the_thread_exactly_once() {
        // A blocked thread's dispatcher parks it while two signallers
        // signal it. Either the park fails (a signal came first: the thread
        // stays in its slot and is due) or exactly one signaller places it.
        loom::model(|| {
            let shared = Arc::new(SignalWord::new());
            let local = LocalWake::new();
            let w = Wakeup {
                shared: &shared,
                local: &local,
            };
            assert!(w.block_until(BLOCKED));
            let signallers: Vec<_> = (0..2)
                .map(|_| {
                    let shared = shared.clone();
                    loom::thread::spawn(move || {
                        let parked = shared.0.fetch_add(SIGNAL, Ordering::AcqRel) & PARKED != 0;
                        usize::from(parked && shared.claim_unpark())
                    })
                })
                .collect();
            let parked = w.try_park();
            let placed: usize = signallers.into_iter().map(|h| h.join().unwrap()).sum();
            if parked {
                assert_eq!(placed, 1, "a parked thread is placed once");
            } else {
                assert_eq!(placed, 0);
                assert!(w.take_if_due(&mut || 0), "an unparked thread is due");
            }
            assert_eq!(shared.0.load(Ordering::Relaxed) & PARKED, 0);
        });
    }

    #[test]
    fn two_spawners_claim_distinct_slots() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let m = mask.clone();
                    loom::thread::spawn(move || m.claim().unwrap())
                })
                .collect();
            let mut got: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
            assert_eq!(mask.count(), 2);
        });
    }
}
