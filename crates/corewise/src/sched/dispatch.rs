//! The dispatcher: the loop each core's kernel thread runs while it holds
//! the core.
//!
//! There are no ready queues (Arachne): the dispatcher scans the occupied
//! slots, round robin from the last thread it ran, for one whose
//! `wakeup_time` is due, marks it `BLOCKED` and switches to it. A thread that
//! yields marks itself runnable before switching back; one that blocks
//! leaves `BLOCKED` or a deadline. When a full scan finds nothing, the core
//! spins for the idle budget (which adapts to the gaps it sees, see
//! [`SpinBudget`]) and then sleeps in the kernel (see
//! [`crate::sched::idle`]) with the earliest deadline as the timeout.
//!
//! The loop also keeps the two statistics of Arachne's core estimation, as
//! cumulative counters the core manager samples: idle ticks (so utilization
//! is the rest), and load ticks, the runnable-thread count weighted by time.
//! A rotation (one round-robin pass over the slots) runs each runnable
//! thread once, so the runs in a rotation times its length is the load.
//! The clock is read, and the arbiter asked whether the core must go, at the
//! end of the first rotation after [`RUNS_PER_CLOCK`] runs, not after every
//! rotation: with two threads yielding to each other a rotation is two
//! switches, and a TSC read (~15 ns on AMD hosts) was a third of the
//! dispatcher's time. Between reads a rotation's length is taken to be
//! proportional to its runs (see [`LoadMeter`]). A full core (56 threads)
//! still checks after every rotation, and a core the runtime asked the
//! arbiter to take back checks after its current run (a flag on the line
//! the dispatcher writes at every run: rotations of long runs lasted
//! seconds). (A departure from Arachne, whose
//! dispatcher checks `must_release` on every pass; I/O is still submitted
//! and reaped on every pass.) Likewise a spinning idle core scans
//! its slots [`IDLE_POLLS_PER_CLOCK`] times per clock read, so a wakeup
//! waits for a scan, not for a scan and a TSC read.
//!
//! When the arbiter asks for the core back, the dispatcher stops new
//! threads from landing here, parks its blocked threads and hands the
//! others to the remaining cores (see [`crate::sched::park::evict_all`]): joins
//! and signals follow the context, a sleeper is woken early and sleeps
//! again where it lands. Then it returns and the kernel thread waits for a
//! core again.
//!
//! Between runs the dispatcher also moves threads between its slots and the
//! rest of the runtime (see [`crate::sched::park`]): it takes threads handed to it
//! into free slots, fires the timers of threads it parked, and at a sweep
//! (at most every [`crate::sched::park::SWEEP`], at a clock read it makes anyway)
//! lets threads that stayed blocked leave their slots.

use crate::clock;
use crate::policy::CorePolicy;
use crate::sched::context::AfterRun;
use crate::sched::{Core, ThreadContext, BLOCKED};
use crate::shim::Ordering;

/// Per-core cumulative counter update by its only writer.
#[inline]
fn bump(counter: &crate::shim::AtomicU64, by: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// Empty scans of an idle core between two clock reads (which end its spin,
/// account its idle time and check whether it must go): ~0.5 µs of polling.
const IDLE_POLLS_PER_CLOCK: u32 = 64;

/// The gap between two polls of a spinning idle core.
///
/// A wakeup waits, on average, half a poll period before the poll that sees
/// it, so the period should be short; but loads issued back to back keep
/// the watched lines flooded with speculative reads, and each write by a
/// waking core then costs a pipeline flush (in a two-core model of the
/// creation protocol, polling with no gap was a third slower than with
/// one). `pause` spaces the polls too, but costs ~22 ns on the AMD EPYC
/// host this was tuned on (~40 ns on Intel since Skylake). One multiply
/// whose operand goes through memory (`black_box`) costs a few ns: in
/// interleaved runs of cross-core creation it beat `pause` by ~4 ns at a
/// round trip of ~50 ns, and matched it at ~400 ns.
#[inline(always)]
fn poll_delay() {
    std::hint::black_box(std::hint::black_box(1u64).wrapping_mul(3));
}

/// How long an idle core spins before it sleeps in the kernel: up to the
/// runtime's idle spin, adapted to the gaps the core sees (in the spirit of
/// Linux's `haltpoll` governor for idle virtual CPUs). A spin pays off when
/// work arrives during it: the wake costs no system call and no
/// inter-processor interrupt. When work comes seldom, every spin is burnt
/// CPU: a thread-per-connection server at 2 000 requests/s spent 14 % of
/// its CPU with the default 50 µs spin, 3.5 % without (tokio 3 %), and on
/// a shared or virtual machine a CPU that looks busy is the one the host
/// makes wait (its p99 was twice as high). So after [`WASTED_SPINS`] sleeps
/// in a row whose gaps were longer than the full spin, each such sleep
/// halves the spin (down to none); a gap the full spin would have caught,
/// or work found while spinning, makes it full again at once. (Halving at
/// every long gap, and growing back by doubling as haltpoll does, left the
/// first cross-core wakes after each long idle gap to the kernel:
/// `primitives`' p99 for a cross-core create or notify went from ~0.5 to
/// 2-7 µs.)
#[derive(Debug)]
struct SpinBudget {
    full: u64,
    limit: u64,
    /// Sleeps in a row that the full spin would not have avoided.
    wasted: u32,
    /// The current idle period went to sleep in the kernel.
    slept: bool,
}

/// Long sleeps in a row before the spin starts to shrink.
const WASTED_SPINS: u32 = 4;

impl SpinBudget {
    fn new(full: u64) -> Self {
        Self {
            full,
            limit: full,
            wasted: 0,
            slept: false,
        }
    }

    /// Ticks to spin before sleeping, now.
    #[inline]
    fn limit(&self) -> u64 {
        self.limit
    }

    /// The core sleeps in the kernel (its spin ran out).
    #[inline]
    fn slept(&mut self) {
        self.slept = true;
    }

    /// An idle period of `gap` ticks ended.
    #[inline]
    fn idle_ended(&mut self, gap: u64) {
        if !std::mem::take(&mut self.slept) || gap <= self.full {
            self.wasted = 0;
            self.limit = self.full;
            return;
        }
        self.wasted = self.wasted.saturating_add(1);
        if self.wasted >= WASTED_SPINS {
            self.limit /= 2;
        }
    }
}

/// Runs after which the next rotation's end reads the clock.
const RUNS_PER_CLOCK: u64 = 32;

/// Runs this long on average switch the dispatcher to reading the clock
/// after every run (a few nanoseconds against tens of microseconds), until
/// [`RUNS_PER_CLOCK`] shorter ones in a row: a core of a few long runs
/// reaches a rotation's end, where it otherwise reads the clock, only
/// every few hundred milliseconds (56 slots of 3 ms tasks), and the start
/// of each run, which a computing thread's yield is timed from
/// (`KernelThread::run_starts`), would otherwise be known only at the
/// run's first timed runtime call.
const LONG_RUN: std::time::Duration = std::time::Duration::from_micros(50);

/// The dispatch count the core's next run will have.
#[inline]
fn next_dispatch(core: &Core) -> u64 {
    core.stats
        .dispatches
        .load(Ordering::Relaxed)
        .wrapping_add(1)
}

/// The load factor's accounting between clock reads.
///
/// The load is the runnable-thread count weighted by time: a rotation of
/// `r` runs that lasted `d` ticks adds `r * d`. Between two clock reads only
/// the total time `T` is known; taking each rotation's length as
/// proportional to its runs (threads run for similar slices) gives
/// `r_i * d_i = T * r_i² / Σr`, so the meter keeps `Σr` and `Σr²`. With a
/// steady `r` that is exactly `T * r`, as before.
#[derive(Debug)]
struct LoadMeter {
    since: u64,
    runs: u64,
    sum: u64,
    sum_sq: u64,
}

impl LoadMeter {
    /// Accounting from `now` on.
    fn new(now: u64) -> Self {
        Self {
            since: now,
            runs: 0,
            sum: 0,
            sum_sq: 0,
        }
    }

    /// A thread is about to run in the current rotation.
    #[inline]
    fn ran(&mut self) {
        self.runs += 1;
    }

    /// Whether any run was counted since the last take.
    #[inline]
    fn counted(&self) -> bool {
        self.runs != 0 || self.sum != 0
    }

    /// The current rotation is over; returns whether the clock is due.
    #[inline]
    fn end_rotation(&mut self) -> bool {
        self.sum += self.runs;
        self.sum_sq += self.runs * self.runs;
        self.runs = 0;
        self.sum >= RUNS_PER_CLOCK
    }

    /// The mean length of the runs counted since the last take, up to
    /// `now` (ticks; idle time included, which only a busy core lacks).
    fn mean_run(&self, now: u64) -> u64 {
        now.wrapping_sub(self.since) / self.sum.max(1)
    }

    /// The load ticks since the last take (or start), up to `now`.
    fn take(&mut self, now: u64) -> u64 {
        let elapsed = now.wrapping_sub(self.since);
        let load = if self.sum == 0 {
            0
        } else {
            (u128::from(elapsed) * u128::from(self.sum_sq) / u128::from(self.sum)) as u64
        };
        self.restart(now);
        load
    }

    /// Drops what was counted (an idle period ends) and starts at `now`.
    fn restart(&mut self, now: u64) {
        *self = Self::new(now);
    }
}

/// Why [`run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The arbiter took the core back and its threads moved elsewhere.
    Released,
    /// The core was handed to a spare kernel thread while a user thread
    /// blocked (see [`crate::sched::handoff`]); that thread was placed on
    /// a core and this kernel thread owns nothing now.
    Lost,
}

/// Runs `core` until the arbiter asks for it back and its threads have
/// moved elsewhere, or until the core is handed over.
pub(crate) fn run(core: &'static Core) -> Outcome {
    let shared = core.runtime();
    let me = crate::sched::handoff::this_kthread().expect("a runtime kernel thread");
    let mut spin = SpinBudget::new(shared.idle_spin_ticks);
    let mut next = 0usize;
    // Accounting: when the core went idle (0: busy), when spinning started
    // (0: not spinning), and the current rotation.
    let mut idle_since = 0u64;
    let mut spin_since = 0u64;
    let mut load = LoadMeter::new(clock::now());
    // The clock as the idle loop last read it (0: not read since a sleep).
    let mut idle_now = 0u64;
    // Empty scans left before the idle loop reads the clock again.
    let mut idle_polls = 0u32;
    // Parking (see `crate::sched::park`): slots seen occupied at the last sweep
    // and not run since, when that sweep was, and whether the next one is
    // due after the current run.
    let mut marks = 0u64;
    let mut last_sweep = clock::now();
    let mut sweep_due = false;
    // Long runs (see `LONG_RUN`): the clock is read after every run, and
    // when it was last read that way; runs in a row shorter than LONG_RUN.
    let mut long_runs = false;
    let mut last_run_end = 0u64;
    let mut short_runs = 0u64;
    let long_run_ticks = clock::duration_to_ticks(LONG_RUN);
    let sweep_ticks = crate::sched::park::SWEEP_TICKS.load(std::sync::atomic::Ordering::Relaxed);
    loop {
        if let Some(i) = find_runnable(core, next) {
            if idle_since != 0 {
                // Leaving idle: a wakeup's latency is this path, so it reads
                // no clock when the spinning loop read one a moment ago, and
                // skips the rotation's bookkeeping below (that loop passed
                // the I/O and checked for a release just now).
                let now = if idle_now != 0 {
                    idle_now
                } else {
                    clock::now()
                };
                core.stats.idle.end(now);
                if long_runs {
                    me.run_starts(next_dispatch(core), now);
                }
                spin.idle_ended(now.wrapping_sub(idle_since));
                idle_since = 0;
                spin_since = 0;
                idle_polls = 0;
                load.restart(now);
                next = i;
            }
            if i < next {
                // The scan wrapped: one rotation is over. Submit its I/O
                // with one enter and reap completions (a few loads when
                // idle); every RUNS_PER_CLOCK runs, account the load and see
                // whether the core must go.
                core.io.pass();
                crate::sched::park::service(core, shared, i + 1);
                if load.end_rotation() {
                    let now = clock::now();
                    if !long_runs && load.mean_run(now) >= long_run_ticks {
                        long_runs = true;
                        short_runs = 0;
                        last_run_end = now;
                    }
                    bump(&core.stats.load_ticks, load.take(now));
                    crate::sched::park::fire_timers(core, now);
                    // SAFETY: the dispatcher, between runs; the reference
                    // ends here.
                    let waiting = unsafe { core.sched() }.waiting();
                    if now.wrapping_sub(last_sweep) >= sweep_ticks || waiting {
                        sweep_due = true;
                    }
                    if shared.arbiter.must_release_core(core.index) {
                        // Slot i's thread was just taken (its wakeup
                        // consumed): put it back as runnable so that it
                        // moves with the others and runs wherever it lands.
                        let taken = core.slot(i);
                        taken.wakeup().set_runnable();
                        if must_go(core) {
                            return Outcome::Released;
                        }
                        if !std::ptr::eq(core.slot(i), taken) {
                            // It moved; slot i holds another context now.
                            continue;
                        }
                        // Still here (nowhere to move it): take it again.
                        taken.wakeup().take_if_due(&mut || 0);
                    } else {
                        must_go(core);
                    }
                }
            }
            load.ran();
            marks &= !(1u64 << i);
            if let Some(ctx) = run_thread(core, i, me) {
                crate::sched::handoff::place_lost(shared, core, ctx);
                return Outcome::Lost;
            }
            let ran = core.slot(i);
            if ran.after_run.get() != AfterRun::Nothing {
                after_run(core, ran, i);
            }
            // The thread switched out: what it reserved on other cores for
            // more spawns goes back (a load and a branch when nothing is).
            core.reserved.end_run(|| &shared.cores);
            if core.stats.release_check.load(Ordering::Relaxed) && release_now(core) {
                return Outcome::Released;
            }
            if long_runs {
                let now = clock::now();
                me.run_starts(next_dispatch(core), now);
                if now.wrapping_sub(last_run_end) < long_run_ticks {
                    short_runs += 1;
                    long_runs = short_runs < RUNS_PER_CLOCK;
                } else {
                    short_runs = 0;
                }
                last_run_end = now;
            }
            if sweep_due {
                sweep_due = false;
                let now = clock::now();
                crate::sched::park::make_room(core, &mut marks, now, i + 1);
                if now.wrapping_sub(last_sweep) >= sweep_ticks {
                    marks = crate::sched::park::sweep(core, marks, now, false);
                    last_sweep = now;
                }
            }
            // May be SLOTS: the next scan then wraps to a lower slot, which
            // ends the rotation. (Resetting it to 0 here hid the wrap from
            // slot SLOTS - 1 to slot 0: a full slot table never ended a
            // rotation, so it never accounted load nor released its core.)
            next = i + 1;
            continue;
        }
        if crate::sched::park::service(core, shared, next) || core.io.pass() {
            continue;
        }
        if idle_polls != 0 {
            // Spinning: look at the slots again before the clock (a TSC
            // read would double the time a spinning core takes to see a
            // wakeup).
            idle_polls -= 1;
            poll_delay();
            continue;
        }
        idle_polls = IDLE_POLLS_PER_CLOCK;
        let now = clock::now();
        idle_now = now;
        if load.counted() {
            load.end_rotation();
            bump(&core.stats.load_ticks, load.take(now));
        } else {
            load.restart(now);
        }
        if idle_since == 0 {
            idle_since = now;
            // Published so the core manager counts an idle period that is
            // still going on (a sleeping core updates nothing).
            core.stats.idle.begin(now);
        }
        if must_go(core) {
            core.stats.idle.end(now);
            return Outcome::Released;
        }
        crate::sched::park::fire_timers(core, now);
        // Threads waiting for a slot while every slot holds a blocked one.
        crate::sched::park::make_room(core, &mut marks, now, next);
        if now.wrapping_sub(last_sweep) >= sweep_ticks {
            marks = crate::sched::park::sweep(core, marks, now, false);
            last_sweep = now;
        }
        if spin_since == 0 {
            spin_since = now;
            continue;
        }
        if now.wrapping_sub(spin_since) < spin.limit() {
            std::hint::spin_loop();
            continue;
        }
        // Going to sleep in the kernel: every blocked thread leaves its
        // slot, so that whoever wakes it places it by load.
        marks = crate::sched::park::sweep(core, marks, now, true);
        last_sweep = now;
        crate::sched::park::tidy_spares(shared, || recheck(core).0);
        core.gate.prepare_sleep();
        let (runnable, earliest) = recheck(core);
        if runnable || shared.arbiter.must_release_core(core.index) {
            core.gate.cancel_sleep();
            continue;
        }
        // After the sweep: the threads it parked sleep on this core's timers.
        // SAFETY: the dispatcher, between runs; the reference ends here.
        let next_timer = unsafe { core.sched() }.next_timer();
        let earliest = match (earliest, next_timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = earliest.map(|d| clock::ticks_to_duration(d.saturating_sub(clock::now())));
        // An arbiter whose release requests are not delivered as wakeups
        // (the daemon writes shared memory) bounds the sleep.
        let timeout = match shared.arbiter.release_poll() {
            Some(p) => Some(timeout.map_or(p, |t| t.min(p))),
            None => timeout,
        };
        bump(&core.stats.sleeps, 1);
        spin.slept();
        // Idle sleep and I/O wait are one wait: in the core's ring (or epoll
        // set), woken by completions, the timer, or the gate's futex word.
        shared.budget.dispatcher_asleep();
        if core.io.idle_wait(&core.gate, timeout) {
            core.gate.cancel_sleep();
        } else {
            core.gate.sleep(timeout);
        }
        shared.budget.dispatcher_awake();
        spin_since = 0;
        idle_now = 0;
        idle_polls = 0;
    }
}

/// What the thread that just ran in slot `i` of `core` left for its
/// dispatcher to do (see [`AfterRun`]).
#[cold]
fn after_run(core: &'static Core, ran: &ThreadContext, i: usize) {
    match ran.after_run.replace(AfterRun::Nothing) {
        AfterRun::Nothing => {}
        AfterRun::Park => crate::sched::park::park_at_once(core, i),
        AfterRun::HandOver => crate::sched::park::hand_over(core, i),
    }
}

/// The runtime asked for fewer cores (see `CoreStats::release_check`):
/// whether this core must go, and could, between two runs. The check stays
/// armed while the core must go but its threads cannot all move yet.
#[cold]
fn release_now(core: &'static Core) -> bool {
    if !core.runtime().arbiter.must_release_core(core.index) {
        core.stats.release_check.store(false, Ordering::Relaxed);
        return false;
    }
    let gone = must_go(core);
    if gone {
        core.stats.release_check.store(false, Ordering::Relaxed);
    }
    gone
}

/// Whether the dispatcher must return: the arbiter wants the core and its
/// threads have moved away. If the arbiter changed its mind while threads
/// were still here, the core takes placements again.
#[inline]
fn must_go(core: &'static Core) -> bool {
    let shared = core.runtime();
    if shared.arbiter.must_release_core(core.index) {
        return release(core);
    }
    if !core.active.load(Ordering::Relaxed) {
        crate::sched::park::reopen(core);
        core.active.store(true, Ordering::SeqCst);
        shared
            .active_mask
            .fetch_or(1u64 << core.index, Ordering::AcqRel);
        shared.policy.core_added(core.index);
    }
    false
}

/// The arbiter wants the core: stop placements here and move the threads
/// away. Returns true when the core is empty and may be given back; false
/// when no other core can take its threads now (it keeps running them and
/// tries again on the next pass).
fn release(core: &'static Core) -> bool {
    let shared = core.runtime();
    if shared.shutdown.load(Ordering::Relaxed) {
        return shutdown_done(core);
    }
    let bit = 1u64 << core.index;
    if shared.active_mask.load(Ordering::Relaxed) & bit != 0 {
        shared.active_mask.fetch_and(!bit, Ordering::AcqRel);
        core.active.store(false, Ordering::SeqCst);
        shared.policy.core_removed(core.index);
    }
    // No thread may wait on this core's ring or epoll set from another
    // core, parked threads included: finish or cancel what is in flight
    // (threads resubmit where they run next). Nothing to do, and no system
    // call, when no I/O is in flight.
    if core.mask.occupied() != 0 || core.io.busy() {
        core.io.evacuate();
    }
    crate::sched::park::evict_all(core)
}

/// Shutting down: no core takes threads from others any more; a core runs
/// its own to the end, and stops once no thread is left anywhere (a parked
/// thread may still be woken, by a timer of some core or by I/O, and placed
/// on a core that still runs).
fn shutdown_done(core: &'static Core) -> bool {
    let shared = core.runtime();
    if core.mask.occupied() != 0 || shared.detached.load(Ordering::Acquire) != 0 {
        return false;
    }
    // SAFETY: the dispatcher, between runs; the reference ends here.
    if unsafe { core.sched() }.waiting() {
        return false;
    }
    // No thread is parked (`detached` is 0) and none is in a slot here:
    // the timers left are stale.
    crate::sched::park::drop_stale_timers(core);
    // Closed for good: a thread placed from now on goes to a core that
    // still runs (or to the runtime's shared inbox).
    !crate::sched::park::close_for_shutdown(core)
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
    let ahead = (!0u64).checked_shl(start as u32).unwrap_or(0);
    for part in [mask & ahead, mask & !ahead] {
        let mut m = part;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if core.slot(i).wakeup().take_if_due(&mut now) {
                prefetch_next(core, mask, i);
                return Some(i);
            }
        }
    }
    None
}

/// Starts fetching the first line of the occupied slot after `i` in scan
/// order (wrapping), the line the next scan reads first, while slot `i`'s
/// thread runs (a hint).
///
/// A thread spawned from another core arrives as a miss on that line: one
/// after the other, a burst's misses did not overlap, and the receiving
/// core's dispatcher waited for each in turn (cross-core creation was
/// bound by it). Fetching the next one early overlaps the transfer with
/// the current run. Only the next: the next two measured slower (14.0
/// against 14.9 M/s; `docs/benchmarks.md`).
#[inline]
fn prefetch_next(core: &Core, mask: u64, i: usize) {
    let later = mask & (!0u64).checked_shl(i as u32 + 1).unwrap_or(0);
    let j = if later != 0 { later } else { mask }.trailing_zeros() as usize;
    if j != i {
        core.slot(j).prefetch_first_line();
    }
}

/// The sleep re-check (after the gate's fence): is anything runnable, and
/// when is the next deadline?
fn recheck(core: &Core) -> (bool, Option<u64>) {
    // Every source of work a waker publishes before its `gate.wake()`:
    // a source left out here is a lost wakeup (a cancel from another
    // thread, queued between the last pass and the sleep, left its waiter
    // blocked until some other event woke the core).
    if core.inbox.has_items() || core.runtime().homeless.has_items() || core.io.cancels_waiting() {
        return (true, None);
    }
    let mut m = core.mask.occupied();
    let now = clock::now();
    let mut earliest: Option<u64> = None;
    while m != 0 {
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        match core.slot(i).wakeup().due_or_deadline(now) {
            None => return (true, None),
            Some(BLOCKED) => {}
            Some(d) => earliest = Some(earliest.map_or(d, |e| e.min(d))),
        }
    }
    (false, earliest)
}

/// Runs the thread in slot `i` until it switches out. Returns its context
/// if the core was handed over meanwhile (the thread left the slot then,
/// and this kernel thread must not touch the core any more).
#[inline]
fn run_thread(
    core: &'static Core,
    i: usize,
    me: &'static crate::sched::kthread::KernelThread,
) -> Option<&'static ThreadContext> {
    let slot = core.slot(i);
    crate::sched::current::set_current(slot);
    slot.kthread.set(me);
    // SAFETY: this is the core's kernel thread; the context exists (made at
    // kernel-thread start) and is not running.
    let ctx = unsafe { slot.context(0) }.expect("slot contexts are created at start");
    let d = &core.stats.dispatches;
    d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    ctx.resume();
    crate::sched::current::set_current(std::ptr::null());
    // A yield asked for during the run is done: the thread switched out.
    // (Left set, it made the next thread run on this kernel thread yield
    // at its first runtime call; the handler sets it only while a thread
    // is current.)
    me.preempt.store(false, Ordering::Relaxed);
    if me.lost.load(Ordering::Relaxed) {
        me.lost.store(false, Ordering::Relaxed);
        return Some(slot);
    }
    None
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_steady_rotation_size_is_the_load() {
        let mut m = LoadMeter::new(1_000);
        // 3 runs a rotation: the rotation that reaches RUNS_PER_CLOCK runs
        // makes the clock due.
        let rotations = RUNS_PER_CLOCK.div_ceil(3);
        for _ in 0..rotations - 1 {
            m.ran();
            m.ran();
            m.ran();
            assert!(!m.end_rotation());
        }
        m.ran();
        m.ran();
        m.ran();
        assert!(m.end_rotation(), "the clock is due after the last rotation");
        assert_eq!(m.take(2_000), 3 * 1_000);
        assert!(!m.counted());
        assert_eq!(m.take(3_000), 0, "nothing ran since the take");
    }

    #[test]
    fn rotations_weigh_by_their_runs() {
        // One rotation of 3 runs and three of 1 run over 600 ticks: taken
        // as 3/6 and 1/6 of the time each, the load is (9 + 1 + 1 + 1)/6.
        let mut m = LoadMeter::new(0);
        for r in [3, 1, 1, 1] {
            for _ in 0..r {
                m.ran();
            }
            m.end_rotation();
        }
        assert_eq!(m.take(600), 600 * 12 / 6);
    }

    #[test]
    fn the_spin_shrinks_after_long_sleeps_in_a_row_and_is_full_again_when_it_pays() {
        let mut b = SpinBudget::new(800);
        let long = |b: &mut SpinBudget| {
            b.slept();
            b.idle_ended(10_000);
            b.limit()
        };
        // The first long sleeps in a row change nothing, then each halves.
        let seen: Vec<u64> = (0..14).map(|_| long(&mut b)).collect();
        assert_eq!(
            seen,
            [800, 800, 800, 400, 200, 100, 50, 25, 12, 6, 3, 1, 0, 0]
        );
        // A sleep the full spin would have caught: full again, and the
        // count starts over.
        b.slept();
        b.idle_ended(700);
        assert_eq!(b.limit(), 800);
        assert_eq!(long(&mut b), 800);
        // Work found while spinning counts as a spin that paid.
        long(&mut b);
        long(&mut b);
        b.idle_ended(100);
        assert_eq!(long(&mut b), 800);
        assert_eq!(long(&mut b), 800);
    }

    #[test]
    fn restart_forgets_what_was_counted() {
        let mut m = LoadMeter::new(0);
        m.ran();
        m.end_rotation();
        m.restart(500);
        assert!(!m.counted());
        m.ran();
        m.end_rotation();
        assert_eq!(m.take(700), 200);
    }
}
