//! The runtime's kernel threads: each core has one owner that runs its
//! dispatcher; spares wait in a pool for a core handed over by a stuck
//! owner (see [`crate::sched::handoff`]).
//!
//! A kernel thread is not bound to a core for life any more: the one that
//! started a core may lose it to a spare while a user thread blocks, and
//! then becomes a spare itself. Whoever owns core `k` when the arbiter takes
//! it back waits for core `k` again, as the original thread did; whoever
//! owns it at shutdown tears it down. Spares unused for [`SPARE_LIFETIME`]
//! exit, so after a burst of blocking calls the runtime is back to one
//! kernel thread per core.

use crate::error::BuildError;
use crate::runtime::Shared;
use crate::sched::dispatch::Outcome;
use crate::sched::Core;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an unused spare kernel thread waits before it exits.
pub(crate) const SPARE_LIFETIME: Duration = Duration::from_secs(1);

/// One kernel thread of a runtime (records are leaked and reused). Aligned
/// to its own cache lines: its thread writes `in_user` on every switch.
#[repr(align(128))]
pub(crate) struct KernelThread {
    tid: AtomicI32,
    /// The core whose dispatcher it runs (null: it is a spare).
    owned: AtomicPtr<Core>,
    /// A spare's assignment: the core handed to it.
    assigned: AtomicPtr<Core>,
    /// The futex word a spare waits on (1: woken).
    word: AtomicU32,
    /// Whether a thread lives on this record.
    alive: AtomicBool,
    /// Set while the thread runs a user thread's own code (see
    /// [`crate::sched::handoff`]); read by the handoff handler.
    pub(crate) in_user: AtomicBool,
    /// Set by the handler when it gave the thread's core away.
    pub(crate) lost: AtomicBool,
    /// A request that the running user thread yield when its runtime call
    /// returns (see [`crate::sched::handoff::Entry`]): set by the handler
    /// (a handoff it had to decline) or by a spawn that found every slot
    /// taken; cleared when the run ends.
    pub(crate) preempt: AtomicBool,
    /// Runtime calls left before the running thread next reads the clock
    /// to see how long its run has lasted (see [`Self::slice_over`]).
    calls_to_clock: AtomicU32,
    /// The run of the first such read (its core's dispatch count; a new
    /// count is a new run, so the dispatch path clears nothing) and the
    /// clock then. Only this kernel thread touches them.
    run_seen: AtomicU64,
    run_seen_at: AtomicU64,
}

/// Runtime calls between two clock reads of [`KernelThread::slice_over`]:
/// a countdown costs a load and a store per call, a clock read ten
/// nanoseconds.
const CALLS_PER_CLOCK: u32 = 32;

/// A user thread whose run has lasted this long while other threads wait
/// for its core yields at its next runtime call (a spawn, an I/O call):
/// cheap for it, and its core's timers and waiting threads are not held
/// up until the monitor hands the core over ([`COMPUTING_AFTER`]).
///
/// [`COMPUTING_AFTER`]: crate::sched::handoff::COMPUTING_AFTER
pub(crate) const YIELD_AFTER: Duration = Duration::from_millis(1);

impl KernelThread {
    fn new() -> Self {
        Self {
            tid: AtomicI32::new(0),
            owned: AtomicPtr::new(std::ptr::null_mut()),
            assigned: AtomicPtr::new(std::ptr::null_mut()),
            word: AtomicU32::new(0),
            alive: AtomicBool::new(true),
            in_user: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            preempt: AtomicBool::new(false),
            calls_to_clock: AtomicU32::new(CALLS_PER_CLOCK),
            run_seen: AtomicU64::new(u64::MAX),
            run_seen_at: AtomicU64::new(0),
        }
    }

    /// In a runtime call of the running user thread (only this kernel
    /// thread calls it): whether its run has lasted [`YIELD_AFTER`] while
    /// other threads wait for its core, so that it yields now. The run's
    /// length is measured from the first of its calls that read the clock;
    /// a clock is read every [`CALLS_PER_CLOCK`] calls, and a new dispatch
    /// count of the core says a new run began. While the core's runs are
    /// long the dispatcher marks each run's start ([`Self::run_starts`]).
    /// A run this clock does not time (fewer than 33 calls) gets the
    /// monitor's yield request (`CoreHandoff::request_yield`) at a look it
    /// makes anyway. Before, the monitor looked at every long run and
    /// signalled it, a wakeup and a signal per run of a few milliseconds
    /// (see `docs/architecture.md`, "Blocking handoff").
    #[inline]
    pub(crate) fn slice_over(&self) -> bool {
        let left = self.calls_to_clock.load(Ordering::Relaxed);
        if left > 1 {
            self.calls_to_clock.store(left - 1, Ordering::Relaxed);
            return false;
        }
        self.slice_check()
    }

    /// The dispatcher read the clock (`now`) just before run `run` of its
    /// core (it does after every run while runs are long): that run's
    /// length counts from there, not from its first clock read in a
    /// runtime call, so a run of few calls yields too.
    #[inline]
    pub(crate) fn run_starts(&self, run: u64, now: u64) {
        self.run_seen.store(run, Ordering::Relaxed);
        self.run_seen_at.store(now, Ordering::Relaxed);
    }

    #[cold]
    #[inline(never)]
    fn slice_check(&self) -> bool {
        self.calls_to_clock
            .store(CALLS_PER_CLOCK, Ordering::Relaxed);
        let Some(core) = self.owned() else {
            return false;
        };
        let run = core.stats.dispatches.load(Ordering::Relaxed);
        let now = crate::clock::now();
        if self.run_seen.load(Ordering::Relaxed) != run {
            self.run_starts(run, now);
            return false;
        }
        let since = self.run_seen_at.load(Ordering::Relaxed);
        now.wrapping_sub(since) >= crate::clock::duration_to_ticks(YIELD_AFTER)
            && core.has_other_work()
    }

    /// The kernel thread's id.
    pub(crate) fn tid(&self) -> i32 {
        self.tid.load(Ordering::Acquire)
    }

    /// The core it owns, if any.
    pub(crate) fn owned(&self) -> Option<&'static Core> {
        // SAFETY: only pointers to cores of leaked runtimes are stored.
        unsafe { self.owned.load(Ordering::Acquire).as_ref() }
    }

    /// It owns no core from now on (the handler gave it away).
    pub(crate) fn disown(&self) {
        self.owned.store(std::ptr::null_mut(), Ordering::Release);
    }

    fn own(&self, core: &'static Core) {
        self.owned
            .store(core as *const Core as *mut Core, Ordering::Release);
    }

    /// Hands `core` to this spare and wakes it (async-signal-safe: atomics
    /// and one futex wake).
    pub(crate) fn assign(&self, core: &'static Core) {
        self.assigned
            .store(core as *const Core as *mut Core, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        self.word.store(1, Ordering::SeqCst);
        let _ = rustix::thread::futex::wake(&self.word, rustix::thread::futex::Flags::PRIVATE, 1);
    }

    fn take_assigned(&self) -> Option<&'static Core> {
        let p = self.assigned.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: as in `owned`.
        unsafe { p.as_ref() }
    }
}

/// The kernel threads of a runtime: join handles, every record (for the
/// shutdown wake), and the pool of idle spares.
#[derive(Default)]
pub(crate) struct KernelThreads {
    handles: Mutex<Vec<(usize, JoinHandle<()>)>>,
    records: Mutex<Vec<&'static KernelThread>>,
    idle: Mutex<Vec<&'static KernelThread>>,
    live: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KernelThreads {
    /// Kernel threads alive now (owners and spares).
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// A record for a new kernel thread (a dead one reused if any).
    fn record(&self) -> &'static KernelThread {
        let mut records = lock(&self.records);
        if let Some(r) = records.iter().find(|r| !r.alive.load(Ordering::Acquire)) {
            r.alive.store(true, Ordering::Release);
            r.tid.store(0, Ordering::Release);
            r.word.store(0, Ordering::Release);
            return r;
        }
        let r: &'static KernelThread = Box::leak(Box::new(KernelThread::new()));
        records.push(r);
        r
    }

    /// Starts kernel thread `k`, the first owner of core `k`; returns once it
    /// has made the core's contexts and ring.
    pub(crate) fn start_core(&self, shared: &'static Shared, k: usize) -> Result<(), BuildError> {
        let me = self.record();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::Builder::new()
            .name(format!("corewise-core-{k}"))
            .spawn(move || first_owner(shared, me, k, tx))?;
        self.live.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).push((me as *const KernelThread as usize, h));
        match rx.recv() {
            Ok(r) => r,
            Err(_) => Err(BuildError::Os(std::io::Error::other(
                "a kernel thread died during start-up",
            ))),
        }
    }

    /// An idle spare from the pool, or a new one.
    pub(crate) fn take_spare(
        &self,
        shared: &'static Shared,
    ) -> std::io::Result<&'static KernelThread> {
        if let Some(kt) = lock(&self.idle).pop() {
            return Ok(kt);
        }
        let me = self.record();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::Builder::new()
            .name("corewise-spare".into())
            .spawn(move || {
                register(me);
                let _ = tx.send(());
                serve(shared, me, Job::Spare { to_pool: false });
            });
        let h = match h {
            Ok(h) => h,
            Err(e) => {
                me.alive.store(false, Ordering::Release);
                return Err(e);
            }
        };
        self.live.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).push((me as *const KernelThread as usize, h));
        let _ = rx.recv();
        Ok(me)
    }

    /// Puts a spare that was provisioned but not used back into the pool.
    pub(crate) fn return_spare(&self, kt: &'static KernelThread) {
        lock(&self.idle).push(kt);
        kt.wake();
    }

    /// Shutdown: wakes every kernel thread and joins them all.
    pub(crate) fn join_all(&self) {
        for r in lock(&self.records).iter() {
            r.wake();
        }
        loop {
            let next = lock(&self.handles).pop();
            match next {
                Some((_, h)) => {
                    let _ = h.join();
                }
                None => break,
            }
        }
    }

    /// Whether `kt` is in the idle pool; removes it if so.
    fn leave_pool(&self, kt: &'static KernelThread) -> bool {
        let mut idle = lock(&self.idle);
        match idle.iter().position(|r| std::ptr::eq(*r, kt)) {
            Some(i) => {
                idle.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// A kernel thread ends: its record may be reused, its handle is
    /// dropped (unless shutdown is joining it).
    fn retire(&self, kt: &'static KernelThread) {
        let me = kt as *const KernelThread as usize;
        let handle = {
            let mut handles = lock(&self.handles);
            handles
                .iter()
                .position(|(r, _)| *r == me)
                .map(|i| handles.swap_remove(i).1)
        };
        drop(handle);
        self.live.fetch_sub(1, Ordering::Relaxed);
        kt.alive.store(false, Ordering::Release);
    }
}

/// Registers the calling thread under `me`.
fn register(me: &'static KernelThread) {
    crate::sched::coroutine::ensure_signal_stack();
    me.tid.store(
        rustix::thread::gettid().as_raw_nonzero().get(),
        Ordering::Release,
    );
    crate::sched::handoff::set_kthread(me);
}

/// Kernel thread `k` at start: makes core `k`'s contexts and ring, then
/// waits for the core.
fn first_owner(
    shared: &'static Shared,
    me: &'static KernelThread,
    k: usize,
    started: std::sync::mpsc::Sender<Result<(), BuildError>>,
) {
    register(me);
    let core = &shared.cores[k];
    // Every slot gets its stack now: creating a thread never maps memory.
    for slot in (0..crate::sched::occupancy::SLOTS).map(|i| core.slot(i)) {
        // SAFETY: this kernel thread owns the core; nothing runs yet.
        if let Err(e) = unsafe { slot.context(shared.stack_size) } {
            let _ = started.send(Err(BuildError::Os(e)));
            shared.kthreads.retire(me);
            return;
        }
    }
    if let Err(e) = core.io.start(&shared.io, &core.gate) {
        let _ = started.send(Err(BuildError::Os(e)));
        shared.kthreads.retire(me);
        return;
    }
    let _ = started.send(Ok(()));
    serve(shared, me, Job::Wait(k));
}

/// What a kernel thread does next.
enum Job {
    /// Wait for the arbiter to grant core `k`.
    Wait(usize),
    /// Run core `k`'s dispatcher.
    Own(usize),
    /// Wait for a core handed over (`to_pool`: join the idle pool first;
    /// a new spare goes to the monitor directly).
    Spare { to_pool: bool },
}

fn serve(shared: &'static Shared, me: &'static KernelThread, mut job: Job) {
    loop {
        job = match job {
            Job::Wait(k) => {
                let core = &shared.cores[k];
                match shared.arbiter.block_until_core_available(k) {
                    Ok(Some(cpu)) => {
                        core.cpu.store(cpu, Ordering::Relaxed);
                        crate::sched::park::reopen(core);
                        core.active.store(true, Ordering::SeqCst);
                        shared.active_mask.fetch_or(1 << k, Ordering::AcqRel);
                        shared.core_taken(k);
                        shared.budget.dispatcher_awake();
                        Job::Own(k)
                    }
                    Ok(None) => {
                        finish_core(shared, core);
                        break;
                    }
                    Err(e) => {
                        tracing::error!(core = k, error = %e, "core grant failed; kernel thread stops");
                        finish_core(shared, core);
                        break;
                    }
                }
            }
            Job::Own(k) => {
                let core = &shared.cores[k];
                me.own(core);
                core.handoff.set_owner(Some(me));
                match crate::sched::dispatch::run(core) {
                    Outcome::Released => {
                        me.disown();
                        core.handoff.set_owner(None);
                        shared.budget.dispatcher_asleep();
                        // `dispatch::run` took the core out of the active set
                        // before it moved the threads away.
                        shared.arbiter.core_released(k);
                        shared.core_given_back();
                        Job::Wait(k)
                    }
                    // The handler gave the core to a spare; this thread
                    // placed the user thread it ran and is a spare now.
                    Outcome::Lost => Job::Spare { to_pool: true },
                }
            }
            Job::Spare { to_pool } => {
                if to_pool {
                    lock(&shared.kthreads.idle).push(me);
                }
                match wait_as_spare(shared, me) {
                    Some(core) => {
                        name_self(&format!("corewise-core-{}", core.index));
                        if let Err(e) = shared.arbiter.core_handed_over(core.index, me.tid()) {
                            tracing::warn!(core = core.index, error = %e, "cannot place a spare kernel thread on its core's CPU");
                        }
                        Job::Own(core.index)
                    }
                    None => break,
                }
            }
        };
    }
    shared.kthreads.retire(me);
}

/// A spare waits for a core; `None`: it exits (unused for
/// [`SPARE_LIFETIME`], or shutdown).
fn wait_as_spare(shared: &'static Shared, me: &'static KernelThread) -> Option<&'static Core> {
    name_self("corewise-spare");
    let mut deadline = Instant::now() + SPARE_LIFETIME;
    loop {
        me.word.store(0, Ordering::SeqCst);
        if let Some(core) = me.take_assigned() {
            return Some(core);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            shared.kthreads.leave_pool(me);
            return None;
        }
        let now = Instant::now();
        if now >= deadline {
            if shared.kthreads.leave_pool(me) {
                return None;
            }
            // Provisioned for a core (out of the pool): it waits until
            // used or returned.
            deadline = now + SPARE_LIFETIME;
            continue;
        }
        let _ = rustix::thread::futex::wait(
            &me.word,
            rustix::thread::futex::Flags::PRIVATE,
            0,
            Some(&rustix::time::Timespec {
                tv_sec: (deadline - now).as_secs() as i64,
                tv_nsec: (deadline - now).subsec_nanos() as _,
            }),
        );
    }
}

/// Names the calling thread (what `ps -L` and `top -H` show).
fn name_self(name: &str) {
    if let Ok(c) = std::ffi::CString::new(name) {
        let _ = rustix::thread::set_name(&c);
    }
}

/// The last owner of `core` at shutdown: stops its ring and unmaps its
/// contexts' stacks.
fn finish_core(shared: &'static Shared, core: &'static Core) {
    core.io.stop();
    for slot in (0..crate::sched::occupancy::SLOTS).map(|i| core.slot(i)) {
        // SAFETY: the dispatcher has returned for good and the core has no
        // threads; this thread is its last owner.
        unsafe { slot.drop_context() };
    }
    // Spare contexts this core kept: their stacks go too.
    crate::sched::park::drop_spares(shared, Some(core));
}
