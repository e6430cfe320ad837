//! Core handoff: a user thread that blocks in the kernel (a std call, a
//! futex, a page fault) or computes for long does not stall the other
//! threads of its core. The core goes to a spare kernel thread, as Go's
//! `sysmon` retakes the P of an M that sits in a system call.
//!
//! Go sees a goroutine enter and leave the kernel (`entersyscall`); corewise
//! cannot: a user thread calls whatever it likes. So the runtime knows
//! instead where a kernel thread is *not* in user code, and hands the core
//! over only while it is:
//!
//! - **Who may touch a core.** A core's private state (its slots' contexts,
//!   its ring, its timers and queues) belongs to the one kernel thread that
//!   owns the core. Each kernel thread's record has an `in_user` flag, set
//!   while it runs a user thread's own code and clear while it runs the
//!   dispatcher, a switch, or a runtime call that touches its core
//!   ([`Entry`]: spawning, I/O, thread exit). A thread finds its kernel
//!   thread's record through its context, which the dispatcher points at
//!   it before each run (no thread-local on the switch path).
//! - **Detection** ([`crate::sched::monitor`]): a monitor thread, asleep
//!   while every core sleeps, samples each core's dispatch counter; a core
//!   whose counter has not moved and that is not idle is stuck in one run.
//!   The kernel thread's state in `/proc/self/task/TID/stat` says whether it
//!   is blocked (`S`, `D`) or computing (`R`): a blocked core is handed over
//!   after [`BLOCKED_AFTER`], a computing one after [`COMPUTING_AFTER`] of
//!   CPU time and only if other threads wait for the core (with one warning
//!   per thread).
//! - **Yielding instead.** A thread whose run has lasted
//!   [`YIELD_AFTER`](crate::sched::kthread::YIELD_AFTER) while others wait
//!   for its core yields at its next runtime call: [`Entry`]'s drop counts
//!   the calls and reads the clock every few dozen
//!   ([`KernelThread::slice_over`]); a run that clock does not time (few
//!   calls) gets the kernel thread's `preempt` flag from the monitor when
//!   a look finds it still running ([`CoreHandoff::request_yield`]). A
//!   thread that spends its run in
//!   runtime calls (a loop of spawns or I/O calls) was found inside one by
//!   nearly every handoff signal, which the handler must decline there:
//!   the monitor asked again every few hundred microseconds (250 signals in
//!   one 100 000-thread spawning loop) and the core's timers waited up to
//!   [`COMPUTING_AFTER`]. (The monitor used to ask for these yields with a
//!   signal after a look at every long run: a wakeup and a signal per
//!   task of a few milliseconds, which showed beside busy neighbours.) A
//!   handoff signal declined inside a runtime call sets the kernel
//!   thread's `preempt` flag, which the same drop checks. A spawn that
//!   finds every slot of its cores taken asks its own thread to yield too
//!   (see [`crate::sched::spawn`]).
//! - **The switch of owners** happens on the stuck kernel thread itself: the
//!   monitor provisions a spare kernel thread and a spare context, sets the
//!   core's request flag and sends the thread [`SIGNAL`]. The handler runs
//!   on that thread, between two of its instructions (a blocking call is
//!   interrupted, and restarted after the handler with `SA_RESTART`), so it
//!   reads `in_user` with no race at all: if the thread is in user code,
//!   the handler takes the running user thread out of its slot (a spare
//!   context takes the slot), marks the kernel thread `lost`, makes the
//!   spare the core's owner and wakes it. Otherwise it declines, and the
//!   monitor asks again later. The handler only uses atomics and one futex
//!   wake (async-signal-safe).
//! - **Coming back.** The spare runs the core's dispatcher on the same CPU.
//!   The handed-off user thread keeps its kernel thread; at its next switch
//!   or runtime call (the [`Entry`] check) it switches out, and its old
//!   dispatcher, seeing `lost`, places it on a core like a woken thread and
//!   becomes a spare itself (see [`crate::sched::kthread`]). Spares wait in
//!   a pool and exit after [`crate::sched::kthread::SPARE_LIFETIME`] unused,
//!   so the runtime returns to one kernel thread per core.
//!
//! The cost on the dispatch path is a store and a load per run (the
//! context's kernel thread, is `lost` set?) and, in a switch, a load and
//! two stores of `in_user`; in a runtime call, a load and a store of the
//! yield countdown.

use crate::sched::current::current_slot;
use crate::sched::kthread::KernelThread;
use crate::sched::{Core, ThreadContext};
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

/// The signal that asks a stuck kernel thread to give its core away
/// (`SIGURG`, as Go uses: rarely used by programs, ignored by default).
pub(crate) const SIGNAL: libc::c_int = libc::SIGURG;

/// A core stuck in one run with its kernel thread blocked in the kernel is
/// handed over after this long.
pub(crate) const BLOCKED_AFTER: Duration = Duration::from_micros(200);

/// A core stuck in one run with its kernel thread computing (or in a
/// system call that does not sleep) is handed over after this long.
pub(crate) const COMPUTING_AFTER: Duration = Duration::from_millis(10);

thread_local! {
    /// This kernel thread's record, if it is one of a runtime's.
    static KTHREAD: Cell<*const KernelThread> = const { Cell::new(std::ptr::null()) };
}

/// Registers the calling thread as a runtime kernel thread.
pub(crate) fn set_kthread(kt: &'static KernelThread) {
    KTHREAD.with(|k| k.set(kt));
}

/// The calling thread's record, if it is a runtime kernel thread (for the
/// dispatcher, which never changes kernel threads).
pub(crate) fn this_kthread() -> Option<&'static KernelThread> {
    // SAFETY: records are leaked ('static).
    unsafe { KTHREAD.with(|k| k.get()).as_ref() }
}

/// The kernel thread running `slot`'s thread now (set by the dispatcher
/// before each run, so a thread finds its kernel thread's flags without a
/// thread-local).
#[inline]
fn kthread_of(slot: &ThreadContext) -> Option<&'static KernelThread> {
    // SAFETY: records are leaked ('static).
    unsafe { slot.kthread.get().as_ref() }
}

/// Whether `slot`'s kernel thread is marked in user code (tests).
#[cfg(test)]
pub(crate) fn in_user_code(slot: &ThreadContext) -> bool {
    kthread_of(slot).is_some_and(|kt| kt.in_user.load(Ordering::Relaxed))
}

/// `slot`'s thread runs its own code from now on.
#[inline]
pub(crate) fn user_code_begins(slot: &ThreadContext) {
    if let Some(kt) = kthread_of(slot) {
        compiler_fence(Ordering::SeqCst);
        kt.in_user.store(true, Ordering::Relaxed);
    }
}

/// `slot`'s thread leaves its own code; returns whether it was in it.
#[inline]
pub(crate) fn user_code_ends(slot: &ThreadContext) -> bool {
    // A load and a store, not a swap (a locked instruction on x86): only
    // this thread writes the flag, and its signal handler only reads it.
    let was = kthread_of(slot).is_some_and(|kt| {
        let was = kt.in_user.load(Ordering::Relaxed);
        kt.in_user.store(false, Ordering::Relaxed);
        was
    });
    compiler_fence(Ordering::SeqCst);
    was
}

/// Whether the core of the kernel thread running `slot`'s thread was
/// handed over (`yield_now` switches out then even with nothing else to
/// run).
#[inline]
pub(crate) fn core_lost(slot: &ThreadContext) -> bool {
    kthread_of(slot).is_some_and(|kt| kt.lost.load(Ordering::Relaxed))
}

/// A runtime call that touches the caller's core (its ring, its
/// reservations, its spare contexts, its slot): while it lives the core is
/// not handed over, and it starts on a kernel thread that owns its core.
/// On a plain OS thread it does nothing.
///
/// ```ignore
/// let _entry = Entry::enter();
/// // ... use the current core's private state ...
/// ```
#[must_use]
pub(crate) struct Entry {
    slot: Option<&'static ThreadContext>,
    was_user: bool,
}

impl Entry {
    /// Enters; if the core was handed over while the caller ran user code,
    /// first moves the calling user thread to a core (it resumes on that
    /// core's owner).
    #[inline]
    pub(crate) fn enter() -> Self {
        let slot = current_slot();
        let was_user = slot.is_some_and(|s| {
            let was = user_code_ends(s);
            if core_lost(s) {
                move_to_a_core(s);
            }
            was
        });
        Self { slot, was_user }
    }

    /// `slot`'s thread leaves user code for good (its function returned):
    /// as [`enter`](Self::enter), but nothing to drop.
    #[inline]
    pub(crate) fn leave_user_code(slot: &ThreadContext) {
        user_code_ends(slot);
        if core_lost(slot) {
            move_to_a_core(slot);
        }
    }
}

impl Drop for Entry {
    #[inline]
    fn drop(&mut self) {
        if let (true, Some(s)) = (self.was_user, self.slot) {
            user_code_begins(s);
            // Not while unwinding: the panic count is per kernel thread, and
            // the thread may resume on another.
            if kthread_of(s).is_some_and(|kt| kt.preempt.load(Ordering::Relaxed) || kt.slice_over())
                && !std::thread::panicking()
            {
                yield_for_preemption(s);
            }
        }
    }
}

/// Asks the running user thread (in a runtime call that holds an
/// [`Entry`]) to yield when the call returns.
pub(crate) fn yield_after_call(slot: &ThreadContext) {
    if let Some(kt) = kthread_of(slot) {
        kt.preempt.store(true, Ordering::Relaxed);
    }
}

/// The running thread was asked to yield (the monitor asked for the core
/// while it was in a runtime call, see `try_hand_over`; a spawn found
/// every slot taken) or its run has lasted long while others wait
/// ([`KernelThread::slice_over`]): it yields now, back in its own code, so
/// the core's other threads run (as a computing thread that Go preempts
/// goes to the back of the queue), instead of taking a signal every few
/// hundred microseconds that finds it in the next call.
#[cold]
#[inline(never)]
fn yield_for_preemption(slot: &ThreadContext) {
    // The dispatcher clears the request when the run ends (`run_thread`).
    slot.wakeup().set_runnable();
    // SAFETY: `slot` is the running thread's own slot, in its own code.
    unsafe { crate::sched::coroutine::switch_out(slot) };
}

/// The kernel thread lost its core while this user thread ran: switch out
/// as runnable; the old dispatcher places the thread (see `dispatch::run`).
#[cold]
#[inline(never)]
fn move_to_a_core(slot: &ThreadContext) {
    slot.wakeup().set_runnable();
    // SAFETY: `slot` is the running thread's own slot.
    unsafe { crate::sched::coroutine::switch_out(slot) };
}

/// A core's handoff state: written by the monitor and the handler.
pub(crate) struct CoreHandoff {
    /// Kernel thread id of the core's owner (0: none).
    pub(crate) owner_tid: AtomicI32,
    /// The owner's record (null: none), for the monitor's yield request.
    owner: AtomicPtr<KernelThread>,
    /// Set by the monitor before it signals the owner.
    requested: AtomicBool,
    /// The spare kernel thread and context provisioned for a handoff.
    spare: crate::sched::handover::Handover<(&'static KernelThread, &'static ThreadContext)>,
    /// Handoffs of this core so far.
    pub(crate) count: AtomicU64,
    /// The handed-off thread, for the monitor's report: the handler writes
    /// `report` (its context address, generation and name) and then sets
    /// `report_ready`; the monitor reads it and clears the flag.
    report_ready: AtomicBool,
    report: UnsafeCell<Report>,
}

/// What the handler reports about a handed-off thread.
#[derive(Clone, Copy)]
pub(crate) struct Report {
    pub(crate) context: usize,
    pub(crate) generation: u32,
    pub(crate) name_len: u8,
    pub(crate) name: [u8; 48],
}

// SAFETY: `report` is written only by the handler while `report_ready` is
// clear and read only by the monitor while it is set (release/acquire).
unsafe impl Sync for CoreHandoff {}

impl Default for CoreHandoff {
    fn default() -> Self {
        Self {
            owner_tid: AtomicI32::new(0),
            owner: AtomicPtr::new(std::ptr::null_mut()),
            requested: AtomicBool::new(false),
            spare: crate::sched::handover::Handover::new(),
            count: AtomicU64::new(0),
            report_ready: AtomicBool::new(false),
            report: UnsafeCell::new(Report {
                context: 0,
                generation: 0,
                name_len: 0,
                name: [0; 48],
            }),
        }
    }
}

impl CoreHandoff {
    /// Whether a spare kernel thread and context are provisioned.
    pub(crate) fn provisioned(&self) -> bool {
        self.spare.is_full()
    }

    /// Provisions a spare kernel thread and context; gives them back if a
    /// pair is provisioned already.
    pub(crate) fn provision(
        &self,
        kt: &'static KernelThread,
        ctx: &'static ThreadContext,
    ) -> Result<(), (&'static KernelThread, &'static ThreadContext)> {
        self.spare.put((kt, ctx))
    }

    /// Takes back what is provisioned (the core is quiet again, or the
    /// runtime shuts down).
    pub(crate) fn unprovision(&self) -> Option<(&'static KernelThread, &'static ThreadContext)> {
        self.spare.take()
    }

    /// Records the core's owner (`None`: it has none now).
    pub(crate) fn set_owner(&self, kt: Option<&'static KernelThread>) {
        self.owner.store(
            kt.map_or(std::ptr::null_mut(), |k| std::ptr::from_ref(k).cast_mut()),
            Ordering::Release,
        );
        self.owner_tid
            .store(kt.map_or(0, |k| k.tid()), Ordering::Release);
    }

    /// Asks the owner's running thread to yield at its next runtime call:
    /// sets the owner's `preempt` flag, which [`Entry`]'s drop reads. No
    /// signal: a thread that computes without runtime calls is not helped
    /// by one, and one that makes them finds the flag. If the run ended
    /// meanwhile, the next run's first call yields once, which is harmless.
    pub(crate) fn request_yield(&self) {
        // SAFETY: only records of kernel threads, which are leaked
        // ('static), are stored.
        if let Some(kt) = unsafe { self.owner.load(Ordering::Acquire).as_ref() } {
            kt.preempt.store(true, Ordering::Relaxed);
        }
    }

    /// Asks the owner to hand the core over (the caller then signals it).
    pub(crate) fn request(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// Withdraws a request (the core made progress).
    pub(crate) fn withdraw(&self) {
        self.requested.store(false, Ordering::Relaxed);
    }

    /// The handler's report of a handed-off thread, if one is ready.
    pub(crate) fn take_report(&self) -> Option<Report> {
        if !self.report_ready.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: the flag is set: the handler finished writing and will
        // not write again until the flag is cleared below.
        let r = unsafe { *self.report.get() };
        self.report_ready.store(false, Ordering::Release);
        Some(r)
    }

    /// In the handler: records the handed-off thread, if the last report
    /// was read.
    fn write_report(&self, ctx: &ThreadContext) {
        if self.report_ready.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the flag is clear: the monitor does not read `report`.
        let r = unsafe { &mut *self.report.get() };
        r.context = ctx as *const ThreadContext as usize;
        r.generation = ctx.generation().load(Ordering::Relaxed);
        let name = ctx.name().unwrap_or("").as_bytes();
        let n = name.len().min(r.name.len());
        r.name[..n].copy_from_slice(&name[..n]);
        r.name_len = n as u8;
        self.report_ready.store(true, Ordering::Release);
    }
}

impl Report {
    /// The thread's name (cut at 48 bytes), if it had one.
    pub(crate) fn name(&self) -> Option<String> {
        (self.name_len > 0)
            .then(|| String::from_utf8_lossy(&self.name[..self.name_len as usize]).into_owned())
    }
}

/// Installs the handoff signal's handler, once per process.
pub(crate) fn install_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no handler" value; handler,
        // flags and mask are filled in before it is installed, and the old
        // action goes into memory we own (leaked).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let old: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
            if libc::sigaction(SIGNAL, &action, old) == 0 {
                PREVIOUS.store(old, Ordering::Release);
            }
        }
    });
}

static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; the handler restores it.
    let errno = unsafe { *libc::__errno_location() };
    if !try_hand_over() {
        // SAFETY: `PREVIOUS` is null or an action filled in by sigaction;
        // the arguments are the kernel's.
        unsafe {
            crate::sched::coroutine::call_previous(
                PREVIOUS.load(Ordering::Acquire),
                sig,
                info,
                uctx,
            );
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The handler's work: returns false if the signal was not the runtime's
/// (no request for this kernel thread's core).
fn try_hand_over() -> bool {
    let kt = KTHREAD.with(|k| k.get());
    // SAFETY: records are leaked ('static).
    let Some(kt) = (unsafe { kt.as_ref() }) else {
        return false;
    };
    let Some(core) = kt.owned() else {
        return false;
    };
    let h = &core.handoff;
    if !h.requested.swap(false, Ordering::AcqRel) {
        return false;
    }
    if !kt.in_user.load(Ordering::Relaxed) {
        // A handoff in the dispatcher or a runtime call (not now): a user
        // thread yields when its runtime call returns
        // (`Entry`'s drop). A thread that spends its run in runtime calls (a
        // spawning loop) is found there by nearly every signal. The monitor
        // asks again if the core stays stuck (a call blocked in the kernel).
        if current_slot().is_some() {
            kt.preempt.store(true, Ordering::Relaxed);
        }
        return true;
    }
    compiler_fence(Ordering::SeqCst);
    let Some(running) = current_slot() else {
        return true;
    };
    let Some((spare_kt, spare_ctx)) = h.spare.take() else {
        return true;
    };
    // The running thread leaves its slot (it runs on here, detached, until
    // its next switch); the spare context takes the slot.
    h.write_report(running);
    crate::sched::park::detach(core, running.index(), spare_ctx);
    core.runtime().detached.fetch_add(1, Ordering::Relaxed);
    h.count.fetch_add(1, Ordering::Relaxed);
    kt.lost.store(true, Ordering::Relaxed);
    kt.disown();
    h.set_owner(Some(spare_kt));
    spare_kt.assign(core);
    true
}

/// Thread states of `/proc/self/task/TID/stat` as the monitor reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelState {
    /// Running or runnable (`R`): computing, or in a call that does not
    /// sleep.
    Computing,
    /// Asleep in the kernel (`S`, `D`, ...).
    Blocked,
}

/// Reads kernel thread `tid`'s state; `None` if it cannot be read.
pub(crate) fn kernel_state(tid: i32) -> Option<KernelState> {
    let path = format!("/proc/self/task/{tid}/stat");
    let text = std::fs::read(path).ok()?;
    // The command name may hold spaces and parentheses: the state follows
    // the last ')'.
    let end = text.iter().rposition(|&b| b == b')')?;
    let state = *text.get(end + 2)?;
    Some(if state == b'R' {
        KernelState::Computing
    } else {
        KernelState::Blocked
    })
}

/// Kernel thread `tid`'s time on a CPU so far, in nanoseconds (its
/// thread CPU clock, as `pthread_getcpuclockid` makes it: one system call,
/// where reading `/proc/self/task/TID/schedstat` took an open, a read and
/// a close); `None` if it cannot be read (the thread exited).
pub(crate) fn cpu_time_ns(tid: i32) -> Option<u64> {
    // The kernel's encoding of a per-thread CPU clock (posix-cpu-timers):
    // the inverted thread id above three bits, "per thread" (4) and
    // "scheduler time" (2) below. Valid for threads of this process.
    let clock = (!tid << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; an unknown or stale
    // clock id only makes the call fail with EINVAL.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// Sends the handoff signal to kernel thread `tid` of this process.
pub(crate) fn signal_thread(tid: i32) -> bool {
    // SAFETY: tgkill with our own pid and a thread id of ours; a thread
    // that exited meanwhile gives ESRCH.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, SIGNAL) == 0 }
}

/// The old owner, once the handed-off thread switched out: places it on a
/// core like a woken thread. It is made runnable whatever it switched out
/// for (a blocked thread wakes spuriously, which `block` allows; a sleeper
/// sleeps again where it lands), since its wake-up may have gone to the
/// core it left.
pub(crate) fn place_lost(
    shared: &'static crate::runtime::Shared,
    core: &'static Core,
    ctx: &'static ThreadContext,
) {
    ctx.wakeup().set_runnable();
    if ctx.movable() {
        crate::sched::placement::place(shared, ctx, None);
    } else {
        crate::sched::placement::place_in(shared, ctx, crate::policy::CoreMask::single(core.index));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A runtime on CPU 0 alone, without neighbour awareness.
    fn one_core_runtime() -> crate::Runtime {
        crate::Runtime::builder()
            .cpus([0])
            .neighbour_awareness(None)
            .build()
            .unwrap()
    }

    /// A user thread asked to yield (by a spawn that found every slot
    /// taken) yields when its runtime call returns:
    /// on a one-core runtime the thread it spawned runs before the spawn
    /// returns to its caller. Without the request the spawner would keep
    /// the core until it blocks.
    #[test]
    fn a_thread_asked_to_yield_yields_when_its_runtime_call_returns() {
        let rt = one_core_runtime();
        let seen = rt
            .block_on(|| {
                let ran = Arc::new(AtomicBool::new(false));
                let r = ran.clone();
                // Not asked: the new thread waits for the core.
                let h = crate::spawn(move || r.store(true, Ordering::SeqCst)).unwrap();
                let unasked = ran.load(Ordering::SeqCst);
                h.join().unwrap();
                ran.store(false, Ordering::SeqCst);
                let r = ran.clone();
                yield_after_call(current_slot().unwrap());
                let h = crate::spawn(move || r.store(true, Ordering::SeqCst)).unwrap();
                let asked = ran.load(Ordering::SeqCst);
                h.join().unwrap();
                (unasked, asked)
            })
            .unwrap();
        assert_eq!(
            seen,
            (false, true),
            "(ran before an unasked spawn returned, ran before an asked one returned)"
        );
    }

    /// A request to yield that the thread never acted on (it blocked
    /// instead) ends with the run: it does not make a later run on the same
    /// kernel thread yield at its first runtime call.
    #[test]
    fn a_yield_request_ends_with_the_run_that_got_it() {
        let rt = one_core_runtime();
        let early = rt
            .block_on(|| {
                yield_after_call(current_slot().unwrap());
                // Blocks (no runtime call): the run ends here.
                crate::sleep(std::time::Duration::from_millis(1));
                let ran = Arc::new(AtomicBool::new(false));
                let r = ran.clone();
                let h = crate::spawn(move || r.store(true, Ordering::SeqCst)).unwrap();
                let early = ran.load(Ordering::SeqCst);
                h.join().unwrap();
                early
            })
            .unwrap();
        assert!(!early, "the spawn yielded for a request of an earlier run");
    }

    /// The thread CPU clock of another thread of the process reads that
    /// thread's CPU time, as `/proc/self/task/TID/schedstat` counts it, and
    /// fails for a thread that has exited.
    #[test]
    fn another_threads_cpu_clock_reads_its_cpu_time() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // Spins for 30 ms of its own CPU time (on a busy machine that
            // takes longer than 30 ms of wall time), then says so and waits.
            let own = || {
                let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
                ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
            };
            let start = own();
            while own() - start < 30_000_000 {
                std::hint::spin_loop();
            }
            tx.send(rustix::thread::gettid().as_raw_nonzero().get())
                .unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        let clock = cpu_time_ns(tid).expect("a live thread's clock");
        let sched: u64 = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
            .unwrap()
            .split_ascii_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(clock >= 30_000_000, "spun 30 ms, clock says {clock} ns");
        let diff = clock.abs_diff(sched);
        assert!(diff < 5_000_000, "clock {clock} ns, schedstat {sched} ns");
        done_tx.send(()).unwrap();
        t.join().unwrap();
        // `join` returns when the thread's id word is cleared, a moment
        // before the kernel releases the task.
        let gone = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            cpu_time_ns(tid).is_none()
        });
        assert!(gone, "an exited thread has no clock");
    }
}
