//! A user thread's context: its slot line, its core, name, inbox link,
//! the dispatcher's private wake-up half and its coroutine. Contexts exist
//! apart from slots: a parked thread keeps its context while the slot runs
//! someone else.

use super::core::Core;
use super::coroutine::Context;
use super::slot::Invocation;
use super::stack::GiveBack;
use super::wakeup::{LocalWake, Wakeup};
use crate::shim::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use crossbeam_utils::CachePadded;
use std::cell::{Cell, UnsafeCell};

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
    /// The next context in an inbox (see [`crate::sched::inbox`]), written by
    /// the sender before it publishes the context there.
    link: AtomicPtr<ThreadContext>,
    /// Lines 2 on, core-private: the dispatcher's half of the wakeup
    /// state (written on every wakeup), the execution context, the
    /// yielder.
    local: CachePadded<LocalWake>,
    /// The thread's `corewise::thread_local!` values (see `crate::local`),
    /// null until it first uses one and again after its exit; touched only
    /// by the thread itself, so it moves with the context.
    locals: Cell<*mut crate::local::Table>,
    context: UnsafeCell<Option<Context>>,
    /// Set by the slot's coroutine when it starts; valid while it lives.
    pub(crate) yielder: Cell<*const crate::sched::coroutine::SlotYielder>,
    /// The stack pointer the thread had when it last switched out.
    pub(crate) stack_pointer: Cell<usize>,
    /// A thread has run to its end on this stack since its pages were last
    /// given back: the next thread that parks here gives back the pages
    /// below its stack pointer.
    pub(crate) stack_used: Cell<bool>,
    /// What the dispatcher does with the slot once the thread switched out
    /// (set by the thread while it runs; see [`AfterRun`]).
    pub(crate) after_run: Cell<AfterRun>,
    /// The kernel thread that runs the thread now (set by the dispatcher
    /// before each run): its handoff flags.
    pub(crate) kthread: Cell<*const crate::sched::kthread::KernelThread>,
}

/// What the dispatcher does with a slot after its thread switched out: a
/// flag the thread leaves on its own context, so the dispatcher's run loop
/// tests one field for both cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRun {
    /// Nothing: the thread yielded or blocked in its slot, or its slot was
    /// freed when it ended.
    Nothing,
    /// The thread blocks for longer than a sweep period (a `sleep`): it
    /// is parked at once instead of staying in its slot until the next
    /// sweep.
    Park,
    /// The thread ended while threads waited for a slot on its core: its
    /// slot was kept for the oldest of them (see
    /// [`crate::sched::park::hand_over`]).
    HandOver,
}

// SAFETY: the `Cell`/`UnsafeCell` fields are touched only by the kernel
// thread that owns the slot's core (the dispatcher and the thread it runs),
// or by a spawner that owns the slot through `MaskAndCount::claim` before
// it publishes the slot's function (release).
unsafe impl Sync for ThreadContext {}
// SAFETY: as for `Sync`; a context is created on one thread and handed to
// the core's kernel thread before any use.
unsafe impl Send for ThreadContext {}

impl crate::sched::inbox::Linked for ThreadContext {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.link
    }
}

/// Spare contexts made in one allocation (see
/// [`ThreadContext::new_spare`]).
#[cfg(not(loom))]
const SLAB_CONTEXTS: usize = 256;

/// The class word's flag for a thread created with `Builder::core`: it
/// runs on that core only, so it is never parked or moved by load.
pub(crate) const PINNED: u32 = 1 << 16;

impl ThreadContext {
    /// A context that belongs to no slot yet (see [`crate::sched::park`]).
    ///
    /// Contexts live as long as the process and are made
    /// [`SLAB_CONTEXTS`] at a time in one allocation: one cache-aligned
    /// allocation each grew the allocator's per-thread heaps a page at a
    /// time, an `mprotect` per few contexts (3 200 system calls while
    /// 100 000 sleeping threads started).
    pub(crate) fn new_spare() -> &'static Self {
        #[cfg(loom)]
        {
            Box::leak(Box::new(Self::new(0)))
        }
        #[cfg(not(loom))]
        {
            static SLAB: std::sync::Mutex<&'static [ThreadContext]> = std::sync::Mutex::new(&[]);
            let mut slab = SLAB.lock().unwrap_or_else(|e| e.into_inner());
            if slab.is_empty() {
                *slab = Box::leak(
                    (0..SLAB_CONTEXTS)
                        .map(|_| Self::new(0))
                        .collect::<Box<[_]>>(),
                );
            }
            let (first, rest) = slab.split_first().expect("the slab was just filled");
            *slab = rest;
            first
        }
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
        self.invocation
            .is_published(self.local.ran_generation.load(Ordering::Relaxed))
    }

    /// The generation of a function published in the slot and not run
    /// yet, if any (see [`Invocation::to_run`]).
    #[inline]
    pub(crate) fn to_run(&self) -> Option<u32> {
        self.invocation
            .to_run(self.local.ran_generation.load(Ordering::Relaxed))
    }

    /// The slot's own coroutine: runs the function published as
    /// generation `g` (see [`Invocation::run_generation`]).
    ///
    /// # Safety
    /// Called only by the context's own coroutine, once, with `g` from
    /// [`to_run`](Self::to_run).
    #[inline]
    pub(crate) unsafe fn run_generation(&self, g: u32) {
        // SAFETY: per this function's contract.
        unsafe {
            self.invocation
                .run_generation(g, &self.local.ran_generation)
        }
    }

    pub(crate) fn new(index: usize) -> Self {
        Self {
            invocation: Invocation::new(),
            core: AtomicPtr::new(std::ptr::null_mut()),
            index: AtomicUsize::new(index),
            name_ptr: AtomicPtr::new(std::ptr::null_mut()),
            name_len: AtomicUsize::new(0),
            link: AtomicPtr::new(std::ptr::null_mut()),
            local: CachePadded::new(LocalWake::new()),
            locals: Cell::new(std::ptr::null_mut()),
            context: UnsafeCell::new(None),
            yielder: Cell::new(std::ptr::null()),
            stack_pointer: Cell::new(0),
            stack_used: Cell::new(false),
            after_run: Cell::new(AfterRun::Nothing),
            kthread: Cell::new(std::ptr::null()),
        }
    }

    /// The running thread's per-thread storage table (see `crate::local`).
    #[inline]
    pub(crate) fn locals(&self) -> &Cell<*mut crate::local::Table> {
        &self.locals
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

    /// Starts loading the context's lines that placing and running its
    /// thread touch (a hint: a thread that comes back after a long park is
    /// out of every cache, and a core places several at once, so their
    /// misses overlap instead of following one another).
    #[inline]
    pub(crate) fn prefetch(&self) {
        use crate::prefetch::read;
        read(std::ptr::from_ref(&self.invocation).cast());
        read(std::ptr::from_ref(&self.core).cast());
        read(std::ptr::from_ref(&*self.local).cast());
        read(std::ptr::from_ref(&self.context).cast());
        // The switch's line: yielder, stack pointer, kernel thread.
        read(std::ptr::from_ref(&self.stack_pointer).cast());
    }

    /// Starts fetching the slot's first line, shared (a hint, as
    /// [`prefetch`](Self::prefetch)): a dispatcher about to run the slot
    /// before it in scan order reads it next, and on most CPUs a spawner
    /// that holds the slot reserved (`sched::spawn::prefetch_reserved`).
    #[inline]
    pub(crate) fn prefetch_first_line(&self) {
        crate::prefetch::read(std::ptr::from_ref(&self.invocation).cast());
    }

    /// Starts fetching the slot's first line to own (a hint; see
    /// `sched::spawn::prefetch_reserved`): a spawner that holds the slot
    /// reserved writes it next.
    #[inline]
    pub(crate) fn prefetch_first_line_to_own(&self) {
        crate::prefetch::to_own(std::ptr::from_ref(&self.invocation).cast());
    }

    /// Starts loading the top of the suspended thread's stack, where its
    /// resumption reads first (a hint, as [`prefetch`](Self::prefetch)).
    /// Only the owning core's kernel thread may call this.
    #[inline]
    pub(crate) fn prefetch_stack(&self) {
        let sp = self.stack_pointer.get();
        if sp != 0 {
            crate::prefetch::read(sp as *const u8);
            crate::prefetch::read(sp.wrapping_add(64) as *const u8);
        }
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

    /// If a thread ran to its end on this stack since its pages were last
    /// given back (clearing that mark): adds to `batch` the pages below the
    /// stack pointer the suspended thread recorded when it last switched
    /// out. Whatever the earlier thread left there is dead.
    ///
    /// # Safety
    /// Only the owning core's kernel thread (or the one that took a spare
    /// out of the pool) may call this, while the thread is suspended after
    /// a switch out, and it stays suspended until the batch is flushed.
    pub(crate) unsafe fn give_back_stack_into(&self, batch: &mut GiveBack) {
        if !self.stack_used.replace(false) {
            return;
        }
        // SAFETY: per the contract, no other reference exists.
        if let Some(c) = unsafe { (*self.context.get()).as_ref() } {
            let sp = self.stack_pointer.get();
            if sp != 0 {
                // SAFETY: the coroutine is suspended and `sp` is from its
                // last switch out (contract).
                unsafe { c.add_below(sp, batch) };
            }
        }
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
