//! The handoff monitor: finds cores stuck in one user thread's run and asks
//! their kernel thread to hand the core over (see [`crate::sched::handoff`]).
//!
//! Like Go's `sysmon` it samples rather than spins: it sleeps
//! [`MIN_PERIOD`] between looks while cores get stuck, doubling the sleep
//! up to [`MAX_PERIOD`] after [`QUIET_LOOKS`] looks with nothing stuck, and
//! once every dispatcher has slept for [`IDLE_BEFORE_WAIT`] it blocks until
//! one wakes (the same activity count the budget watcher waits on), so an
//! idle runtime costs it nothing. A look reads two counters per core; a
//! core that looks stuck costs its kernel thread's CPU clock, and a read of
//! its `/proc` state when that clock stood still.
//!
//! Two periodic jobs ride on its wakeups. The neighbour share is sampled
//! here when a window has ended (every 10 ms by default, the monitor's own
//! longest sleep, so no wakeup is added for it), and the budget is re-read
//! once a second. The samples are not taken on a dispatcher: reading the
//! process CPU clock there, on a kernel thread inside a CPU-bound run, put
//! about 1.5 ms on the p99 task latency of a process beside it (see
//! `docs/architecture.md`, "Samples on the monitor's wakeups"); read by
//! the monitor, just woken, it did not. A thread that computes while others
//! wait yields at its next runtime call by its own clock (see
//! [`crate::sched::handoff::Entry`]); a run that clock does not time gets a
//! yield request at a look the monitor makes anyway.

use crate::runtime::Shared;
use crate::sched::handoff::{self, KernelState, BLOCKED_AFTER, COMPUTING_AFTER};
use crate::sched::kthread::{SPARE_LIFETIME, YIELD_AFTER};
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
/// How long every dispatcher must have slept, with no thread run, before
/// the monitor blocks until one wakes (see [`run`]).
const IDLE_BEFORE_WAIT: Duration = Duration::from_millis(50);

/// Threads run so far on all cores (a change says the runtime was awake).
fn total_dispatches(shared: &Shared) -> u64 {
    shared
        .cores
        .iter()
        .map(|c| c.stats.dispatches.load(Ordering::Relaxed))
        .fold(0, u64::wrapping_add)
}

/// What the monitor remembers of a core.
struct Seen {
    dispatches: u64,
    since: Instant,
    /// The kernel thread computed when the last handoff was asked for.
    computing: bool,
    /// Its CPU time when the run was first seen stuck (a thread that waits
    /// for a CPU, preempted by other processes, is not computing).
    cpu_base: Option<u64>,
    /// When `cpu_base` was taken.
    wall_base: Instant,
    /// The kernel thread and its CPU time at the previous look of this
    /// run: a clock that moved says "computing" without reading `/proc`.
    cpu_last: Option<(i32, u64)>,
    last_handoff: Option<Instant>,
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
            wall_base: now,
            cpu_last: None,
            last_handoff: None,
        })
        .collect();
    let mut period = MAX_PERIOD;
    // A computing core's next mark (one look, not a new period).
    let mut wake: Option<Duration> = None;
    let mut quiet = 0u32;
    let mut warned: HashSet<(usize, u32)> = HashSet::new();
    let mut quiet_since: Option<Instant> = None;
    let mut dispatched = total_dispatches(shared);
    while !shared.shutdown.load(Ordering::Acquire) {
        // It blocks only once the runtime has been idle for IDLE_BEFORE_WAIT,
        // not at every dispatcher sleep: blocked, it costs the first
        // dispatcher to wake a futex wake, and it then runs on that CPU
        // just as the wake's work starts. A one-CPU echo server at 2 000
        // requests/s woke it ~250 times a second that way (its dispatcher
        // preempted 650 times in 5 s); looking every MAX_PERIOD instead
        // costs a few microseconds a look and is off the request's path.
        let now = Instant::now();
        let d = total_dispatches(shared);
        if d != dispatched || !shared.budget.all_asleep() {
            dispatched = d;
            quiet_since = None;
        } else if now.duration_since(*quiet_since.get_or_insert(now)) >= IDLE_BEFORE_WAIT {
            // An idle runtime keeps no spare: what was provisioned goes
            // back to the pool, whose threads exit after a while.
            for (core, s) in shared.cores.iter().zip(seen.iter_mut()) {
                s.last_handoff = None;
                unprovision(shared, core);
            }
            if shared.budget.wait_while_idle() {
                let now = Instant::now();
                for s in seen.iter_mut() {
                    s.since = now;
                }
                quiet_since = None;
                dispatched = total_dispatches(shared);
                continue;
            }
        }
        let mut sleep = match wake {
            Some(w) => period.min(w),
            None => period,
        };
        // A share window shorter than the period (configured so) is
        // sampled when it ends; the default window is the period.
        if let Some(until) = shared.budget.until_share_due() {
            sleep = sleep.min(until.max(MIN_PERIOD));
        }
        std::thread::park_timeout(sleep);
        // The budget re-read (once a second) and the share sample (once a
        // window) ride on this wakeup.
        shared.budget.budget_tick_if_due();
        shared.budget.share_tick_if_due();
        let now = Instant::now();
        let mut soon = false;
        wake = None;
        for (core, s) in shared.cores.iter().zip(seen.iter_mut()) {
            match look(shared, core, s, now) {
                Next::Quiet => {}
                Next::After(w) => wake = Some(wake.map_or(w, |n| n.min(w))),
                Next::Soon => soon = true,
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
        if soon {
            period = MIN_PERIOD;
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

/// Whether `core` has a kernel thread that is neither asleep nor idle.
fn is_awake(core: &Core) -> bool {
    core.handoff.owner_tid.load(Ordering::Acquire) != 0
        && !core.gate.is_sleeping()
        && !core.stats.idle.is_idle()
}

/// When [`look`] wants to look at a core again.
enum Next {
    /// At the monitor's period (the core is not stuck, or a computing
    /// thread needs nothing before then).
    Quiet,
    /// After this long (a computing thread's next mark): one look, the
    /// period stays.
    After(Duration),
    /// Within [`MIN_PERIOD`] (a handoff was asked for, or the thread's
    /// state could not be read); the period starts over from there.
    Soon,
}

/// Looks at one core; if it is stuck, returns when to look again: soon
/// after a handoff was asked for, or, for a thread still computing, when
/// its CPU time could reach [`COMPUTING_AFTER`] at the rate it has
/// computed so far. Looking every [`MIN_PERIOD`] at a core that computes
/// cost two `/proc` reads 20 000 times a second: the monitor took a CPU's share from a runtime busy with
/// tasks of a few milliseconds. Waiting the CPU time still missing as wall
/// time approached a mark by thirds when the thread had a third of a CPU
/// (beside two busy neighbours): about ten looks.
///
/// That wait is one look, not the monitor's new period: taken as the
/// period, it held every look at that cadence for the next
/// [`QUIET_LOOKS`] looks, though only the computing core asked for it.
fn look(shared: &'static Shared, core: &'static Core, s: &mut Seen, now: Instant) -> Next {
    let h = &core.handoff;
    let tid = h.owner_tid.load(Ordering::Acquire);
    let dispatches = core.stats.dispatches.load(Ordering::Relaxed);
    let idle = !is_awake(core);
    if idle || dispatches != s.dispatches {
        s.dispatches = dispatches;
        s.since = now;
        s.cpu_base = None;
        s.cpu_last = None;
        h.withdraw();
        if s.last_handoff
            .is_some_and(|t| now.duration_since(t) > SPARE_LIFETIME)
        {
            s.last_handoff = None;
            unprovision(shared, core);
        }
        return Next::Quiet;
    }
    let stuck = now.duration_since(s.since);
    if stuck < BLOCKED_AFTER {
        return Next::Quiet;
    }
    // The thread's CPU clock is one system call; its `/proc` state (open,
    // read, close) is read only when the clock has not moved since the
    // last look of this run (or at the first): a thread that ran since
    // then computes, or blocked only a moment ago and is found at the next
    // look. A core computing a 4 ms task beside busy neighbours was looked
    // at about eight times per task, and the two `/proc` reads of each
    // look made the monitor 1.7 % of a CPU.
    let cpu = handoff::cpu_time_ns(tid);
    let moved =
        matches!((cpu, s.cpu_last), (Some(now_ns), Some((t, then))) if t == tid && now_ns > then);
    s.cpu_last = cpu.map(|c| (tid, c));
    let state = if moved {
        Some(KernelState::Computing)
    } else {
        handoff::kernel_state(tid)
    };
    match state {
        Some(KernelState::Blocked) => s.computing = false,
        Some(KernelState::Computing) => {
            // A computing thread alone on its core keeps it: a spare would
            // only compete with it for the CPU (Go retakes a P only when it
            // has work too). Nor does it keep the monitor's looks short.
            if !core.has_other_work() {
                s.cpu_base = None;
                return Next::Quiet;
            }
            // Handed over after COMPUTING_AFTER of CPU time in this run, not
            // of wall time: a kernel thread preempted by other processes
            // would only gain a rival for its CPU.
            let Some(cpu) = cpu else {
                return Next::Soon;
            };
            let base = match s.cpu_base {
                Some(b) => b,
                None => {
                    s.wall_base = now;
                    *s.cpu_base.insert(cpu)
                }
            };
            let ran = cpu.saturating_sub(base);
            if stuck >= YIELD_AFTER {
                // A run seen at two looks while others wait: the thread
                // yields at its next runtime call, if it has not by its own
                // clock (which does not time a run of few calls). No signal
                // and no look of its own (see `crate::sched::handoff`).
                h.request_yield();
            }
            let left = (COMPUTING_AFTER.as_nanos() as u64).saturating_sub(ran);
            if left > 0 {
                // The CPU time still missing comes at the rate it came so
                // far (wall time per CPU time, at least 1).
                let wall = now.duration_since(s.wall_base).as_nanos() as f64;
                let rate = if ran > 0 {
                    (wall / ran as f64).max(1.0)
                } else {
                    1.0
                };
                return Next::After(
                    Duration::from_nanos((left as f64 * rate) as u64).max(MIN_PERIOD),
                );
            }
            s.computing = true;
        }
        None => return Next::Soon,
    }
    if !provision(shared, core) {
        return Next::Soon;
    }
    h.request();
    handoff::signal_thread(tid);
    s.last_handoff = Some(now);
    Next::Soon
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
