//! The dispatcher: the loop each core's kernel thread runs while it holds
//! the core.
//!
//! There are no ready queues (Arachne): the dispatcher scans the occupied
//! slots, round robin from the last thread it ran, for one whose
//! `wakeup_time` is due, marks it `BLOCKED` and switches to it. A thread that
//! yields marks itself runnable before switching back; one that blocks
//! leaves `BLOCKED` or a deadline. When a full scan finds nothing, the core
//! spins for the idle budget and then sleeps in the kernel (see
//! [`crate::idle`]) with the earliest deadline as the timeout.

use crate::clock;
use crate::core::{Core, BLOCKED, RUNNABLE, SLOTS};
use crate::shim::Ordering;

/// Runs `core` until the arbiter asks for it back and it has no threads.
pub(crate) fn run(core: &'static Core) {
    let shared = core.runtime();
    let spin = shared.idle_spin_ticks;
    let mut next = 0usize;
    let mut idle_since = 0u64;
    loop {
        if let Some(i) = find_runnable(core, next) {
            idle_since = 0;
            if i < next {
                // The scan wrapped: one pass is over. Submit its I/O with
                // one enter and reap completions (a few loads when idle).
                core.io.pass();
            }
            run_thread(core, i);
            next = if i + 1 == SLOTS { 0 } else { i + 1 };
            continue;
        }
        if core.io.pass() {
            idle_since = 0;
            continue;
        }
        if core.mask.occupied() == 0 && shared.arbiter.must_release_core(core.index) {
            return;
        }
        let now = clock::now();
        if idle_since == 0 {
            idle_since = now;
            continue;
        }
        if now.wrapping_sub(idle_since) < spin {
            std::hint::spin_loop();
            continue;
        }
        core.gate.prepare_sleep();
        let (runnable, earliest) = recheck(core);
        if runnable
            || (core.mask.occupied() == 0 && shared.arbiter.must_release_core(core.index))
        {
            core.gate.cancel_sleep();
            continue;
        }
        let timeout = earliest.map(|d| clock::ticks_to_duration(d.saturating_sub(clock::now())));
        let sleeps = &core.stats.sleeps;
        sleeps.store(sleeps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        // Idle sleep and I/O wait are one wait: in the core's ring (or epoll
        // set), woken by completions, the timer, or the gate's futex word.
        if core.io.idle_wait(&core.gate, timeout) {
            core.gate.cancel_sleep();
        } else {
            core.gate.sleep(timeout);
        }
        idle_since = 0;
    }
}

/// The first due thread at or after slot `start` (wrapping), taken.
#[inline]
fn find_runnable(core: &Core, start: usize) -> Option<usize> {
    let mask = core.mask.occupied();
    if mask == 0 {
        return None;
    }
    let mut now_cache = 0u64;
    let mut now = || {
        if now_cache == 0 {
            now_cache = clock::now();
        }
        now_cache
    };
    let from_start = mask & (!0u64 << start);
    for part in [from_start, mask & !(!0u64 << start)] {
        let mut m = part;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if core.slots[i].wakeup().take_if_due(&mut now) {
                return Some(i);
            }
        }
    }
    None
}

/// The sleep re-check (after the gate's fence): is anything runnable, and when is the next deadline?
fn recheck(core: &Core) -> (bool, Option<u64>) {
    let mut m = core.mask.occupied();
    let now = clock::now();
    let mut earliest: Option<u64> = None;
    while m != 0 {
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        let w = core.slots[i].wakeup().load_acquire();
        if w == RUNNABLE || (w != BLOCKED && w <= now) {
            return (true, None);
        }
        if w != BLOCKED {
            earliest = Some(earliest.map_or(w, |e| e.min(w)));
        }
    }
    (false, earliest)
}

#[inline]
fn run_thread(core: &'static Core, i: usize) {
    let slot = &core.slots[i];
    crate::thread::set_current(slot);
    // SAFETY: this is the core's kernel thread; the context exists (made at
    // kernel-thread start) and is not running.
    let ctx = unsafe { slot.context(0) }.expect("slot contexts are created at start");
    let d = &core.stats.dispatches;
    d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    ctx.resume();
    crate::thread::set_current(std::ptr::null());
}
