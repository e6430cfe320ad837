//! The handoff monitor: finds cores stuck in one user thread's run and asks
//! their kernel thread to hand the core over (see [`crate::sched::handoff`]).
//!
//! Like Go's `sysmon` it samples rather than spins: it sleeps
//! [`MIN_PERIOD`] between looks while cores get stuck, doubling the sleep
//! up to [`MAX_PERIOD`] after [`QUIET_LOOKS`] looks with nothing stuck, and
//! it blocks altogether while every dispatcher sleeps in the kernel (the
//! same activity count the budget watcher waits on), so an idle runtime
//! costs it nothing. A look reads two counters per core; only a core that
//! looks stuck costs a read of its kernel thread's `/proc` state.

use crate::runtime::Shared;
use crate::sched::handoff::{self, KernelState, BLOCKED_AFTER, COMPUTING_AFTER};
use crate::sched::kthread::SPARE_LIFETIME;
use crate::sched::Core;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The shortest sleep between two looks.
pub(crate) const MIN_PERIOD: Duration = Duration::from_micros(50);
/// The longest sleep between two looks (the detection delay of a first
/// blocking call after a quiet time), Go's `sysmon` bound. Every wakeup
/// of the monitor preempts a busy core for some microseconds: at 2 ms,
/// 1 % of the time of a busy runtime was disturbed and the p99 of
/// cross-core operations in `primitives` rose from ~150 ns to ~30 µs.
pub(crate) const MAX_PERIOD: Duration = Duration::from_millis(10);
/// Looks with nothing stuck before the sleep doubles.
const QUIET_LOOKS: u32 = 20;

/// What the monitor remembers of a core.
struct Seen {
    dispatches: u64,
    since: Instant,
    /// The kernel thread computed when the last handoff was asked for.
    computing: bool,
    /// Its CPU time when the run was first seen stuck (a thread that waits
    /// for a CPU, preempted by other processes, is not computing).
    cpu_base: Option<u64>,
    last_handoff: Option<Instant>,
    /// The running thread was asked to yield in this run.
    yield_asked: bool,
}

/// The monitor thread's loop; returns at shutdown.
pub(crate) fn run(shared: &'static Shared) {
    let now = Instant::now();
    let mut seen: Vec<Seen> = shared
        .cores
        .iter()
        .map(|_| Seen {
            dispatches: 0,
            since: now,
            computing: false,
            cpu_base: None,
            last_handoff: None,
            yield_asked: false,
        })
        .collect();
    let mut period = MAX_PERIOD;
    let mut quiet = 0u32;
    let mut warned: HashSet<(usize, u32)> = HashSet::new();
    while !shared.shutdown.load(Ordering::Acquire) {
        if shared.budget.all_asleep() {
            // An idle runtime keeps no spare: what was provisioned goes
            // back to the pool, whose threads exit after a while.
            for (core, s) in shared.cores.iter().zip(seen.iter_mut()) {
                s.last_handoff = None;
                unprovision(shared, core);
            }
        }
        if shared.budget.wait_while_idle() {
            let now = Instant::now();
            for s in seen.iter_mut() {
                s.since = now;
            }
            continue;
        }
        std::thread::park_timeout(period);
        let now = Instant::now();
        let mut next: Option<Duration> = None;
        for (core, s) in shared.cores.iter().zip(seen.iter_mut()) {
            if let Some(w) = look(shared, core, s, now) {
                next = Some(next.map_or(w, |n| n.min(w)));
            }
            if let Some(r) = core.handoff.take_report() {
                let name = r.name();
                if s.computing && warned.insert((r.context, r.generation)) {
                    tracing::warn!(
                        thread = name.as_deref().unwrap_or("<unnamed>"),
                        core = core.index,
                        "a user thread computed for more than {COMPUTING_AFTER:?} without a switch; its core's other threads moved to another kernel thread"
                    );
                } else {
                    tracing::debug!(
                        thread = name.as_deref().unwrap_or("<unnamed>"),
                        core = core.index,
                        "core handed over while a user thread blocked in the kernel"
                    );
                }
            }
        }
        if let Some(w) = next {
            period = w.max(MIN_PERIOD);
            quiet = 0;
        } else {
            quiet += 1;
            if quiet >= QUIET_LOOKS {
                quiet = 0;
                period = (period * 2).min(MAX_PERIOD);
            }
        }
    }
    for core in shared.cores.iter() {
        unprovision(shared, core);
    }
}

/// A thread that computes this long in one run while other threads wait
/// for its core is asked to yield at its next runtime call (a spawn, an
/// I/O call): cheap for it, and its core's timers and waiting threads are
/// not held up for [`COMPUTING_AFTER`].
pub(crate) const YIELD_AFTER: Duration = Duration::from_millis(1);

/// The longest the monitor waits for a computing thread's CPU time to reach
/// [`COMPUTING_AFTER`]: other cores may get stuck meanwhile.
const COMPUTING_LOOK: Duration = Duration::from_millis(2);

/// Looks at one core; if it is stuck, returns when to look again: soon
/// after a handoff was asked for, or, for a thread still computing, when
/// its CPU time could reach [`COMPUTING_AFTER`] (at most
/// [`COMPUTING_LOOK`]). Looking every [`MIN_PERIOD`] at a core that
/// computes cost two `/proc` reads 20 000 times a second: the monitor took
/// a CPU's share from a runtime busy with tasks of a few milliseconds.
fn look(
    shared: &'static Shared,
    core: &'static Core,
    s: &mut Seen,
    now: Instant,
) -> Option<Duration> {
    let h = &core.handoff;
    let tid = h.owner_tid.load(Ordering::Acquire);
    let dispatches = core.stats.dispatches.load(Ordering::Relaxed);
    let idle = tid == 0 || core.gate.is_sleeping() || core.stats.idle.is_idle();
    if idle || dispatches != s.dispatches {
        s.dispatches = dispatches;
        s.since = now;
        s.cpu_base = None;
        s.yield_asked = false;
        h.withdraw();
        if s.last_handoff
            .is_some_and(|t| now.duration_since(t) > SPARE_LIFETIME)
        {
            s.last_handoff = None;
            unprovision(shared, core);
        }
        return None;
    }
    let stuck = now.duration_since(s.since);
    if stuck < BLOCKED_AFTER {
        return None;
    }
    match handoff::kernel_state(tid) {
        Some(KernelState::Blocked) => s.computing = false,
        Some(KernelState::Computing) => {
            // A computing thread alone on its core keeps it: a spare would
            // only compete with it for the CPU (Go retakes a P only when it
            // has work too). Nor does it keep the monitor's looks short.
            if !has_other_work(core) {
                s.cpu_base = None;
                return None;
            }
            // Handed over after COMPUTING_AFTER of CPU time in this run, not
            // of wall time: a kernel thread preempted by other processes
            // would only gain a rival for its CPU.
            let Some(cpu) = handoff::cpu_time_ns(tid) else {
                return Some(MIN_PERIOD);
            };
            let base = *s.cpu_base.get_or_insert(cpu);
            let ran = cpu.saturating_sub(base);
            if !s.yield_asked && ran >= YIELD_AFTER.as_nanos() as u64 {
                // Others wait: the thread yields at its next runtime call
                // (a spawning or I/O loop), long before a handoff.
                s.yield_asked = true;
                h.request_yield();
                handoff::signal_thread(tid);
            }
            let left = (COMPUTING_AFTER.as_nanos() as u64).saturating_sub(ran);
            if left > 0 {
                let step = if s.yield_asked {
                    left
                } else {
                    (YIELD_AFTER.as_nanos() as u64).saturating_sub(ran).max(1)
                };
                return Some(Duration::from_nanos(step).min(COMPUTING_LOOK));
            }
            s.computing = true;
        }
        None => return Some(MIN_PERIOD),
    }
    if !provision(shared, core) {
        return Some(MIN_PERIOD);
    }
    h.request();
    handoff::signal_thread(tid);
    s.last_handoff = Some(now);
    Some(MIN_PERIOD)
}

/// Whether `core` has threads other than the running one: in its slots,
/// waiting for a slot, in its inbox, or asleep on its timers.
fn has_other_work(core: &Core) -> bool {
    core.mask.count() > 1
        || core.queued.load(Ordering::Relaxed) != 0
        || core.inbox.has_items()
        || core.timers_parked.load(Ordering::Relaxed) != 0
}

/// Makes sure `core` has a spare kernel thread and context ready.
fn provision(shared: &'static Shared, core: &'static Core) -> bool {
    let h = &core.handoff;
    if h.provisioned() {
        return true;
    }
    let kt = match shared.kthreads.take_spare(shared) {
        Ok(kt) => kt,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start a spare kernel thread");
            return false;
        }
    };
    let ctx = match crate::sched::park::take_spare(shared, None) {
        Ok(ctx) => ctx,
        Err(_) => {
            give_back(shared, kt, None);
            return false;
        }
    };
    if let Err((kt, ctx)) = h.provision(kt, ctx) {
        give_back(shared, kt, Some(ctx));
    }
    h.provisioned()
}

/// Takes back what `core` has provisioned (quiet for a while, or shutdown).
fn unprovision(shared: &'static Shared, core: &'static Core) {
    if let Some((kt, ctx)) = core.handoff.unprovision() {
        give_back(shared, kt, Some(ctx));
    }
}

/// Returns a spare kernel thread (and context) to the runtime's pools.
fn give_back(
    shared: &'static Shared,
    kt: &'static crate::sched::kthread::KernelThread,
    ctx: Option<&'static crate::sched::ThreadContext>,
) {
    shared.kthreads.return_spare(kt);
    if let Some(ctx) = ctx {
        crate::sched::park::return_spare(shared, ctx);
    }
}
