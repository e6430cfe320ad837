//! The running user thread: which context the kernel thread is running
//! now, and what happens when a thread's function has returned.
//!
//! The running thread's context is found through a thread-local that the
//! dispatcher sets before each switch; it is read through a function that is
//! never inlined, so its address is computed anew after every switch (a user
//! thread may resume on another kernel thread once cores are released).

use super::context::ThreadContext;
use crate::policy::CorePolicy;
use crate::shim::Ordering;
use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<*const ThreadContext> = const { Cell::new(std::ptr::null()) };
}

/// The slot of the running user thread, if the caller is one.
#[inline(never)]
pub(crate) fn current_slot() -> Option<&'static ThreadContext> {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: the dispatcher stores only pointers to slots of leaked
    // ('static) cores, and null when no user thread runs.
    unsafe { p.as_ref() }
}

/// Sets the running thread (null: none), before and after each run. Only
/// the dispatcher calls it, and the dispatcher runs on its own kernel
/// thread's stack, never on another kernel thread: a thread-local address
/// kept across the switch stays right, so unlike [`current_slot`] it may
/// be inlined (two calls a run were 3-4 % of a one-way yield).
#[inline]
pub(crate) fn set_current(slot: *const ThreadContext) {
    CURRENT.with(|c| c.set(slot));
}

/// Runs in the slot's coroutine after the thread's function returned (it
/// catches its own panics, see `spawn_joinable`): frees the slot.
pub(crate) fn exit_slot_thread(slot: &'static ThreadContext) {
    // The spawn wrappers dropped the thread's `thread_local!` values
    // already (before its result was published); this only guarantees
    // that none can reach the context's next thread.
    let _ = crate::local::run_destructors(slot.locals());
    let core = slot.core();
    let class = slot.class();
    slot.set_name(None);
    // The generation is bumped by the next spawner (see `spawn_job`), which
    // writes this line anyway: a write here would cost this core a line
    // upgrade per thread.
    slot.wakeup().reset();
    let shared = core.runtime();
    shared.policy.thread_exited(class, core.index);
    if core.queued.load(Ordering::Relaxed) == 0 {
        core.mask.release(slot.index());
    } else {
        // Threads wait for a slot on this core: the dispatcher gives this
        // one to the oldest of them once the coroutine is back. Freed, it
        // would go to the next spawner, which would overtake them all (a
        // pool fed faster than it drains ran new threads first and left
        // the waiting ones a whole rotation of the slots behind).
        slot.after_run
            .set(crate::sched::context::AfterRun::HandOver);
    }
    shared.limit_wait.notify();
}
