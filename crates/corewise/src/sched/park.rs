//! Threads are not slots: a thread that stays blocked leaves its slot, and
//! is placed again, on any core its class may use, when it is signalled.
//!
//! Arachne binds a thread to one of its core's 56 slots for life, so a core
//! holds at most 56 threads, blocked or not, and a thread never leaves the
//! core it was created on. Here a slot holds the threads that run or are
//! about to run, and the queue-less dispatch of Arachne stays as it was for
//! them: a signal to a thread in its slot is still one `lock xadd` and a
//! wake of the core. The rest is what this module adds:
//!
//! - **Leaving the slot (parking).** The dispatcher marks, at each sweep
//!   (at most every [`SWEEP_TICKS`], at a clock read it makes anyway), the
//!   slots whose threads are blocked; a thread still blocked and not run at
//!   the next sweep has been blocked for at least one sweep period, and
//!   leaves its slot. So does every blocked thread when the core is about
//!   to sleep in the kernel, and when threads wait for a slot here. A
//!   thread that sleeps (`corewise::sleep`) for longer than a sweep period
//!   leaves as soon as it switches out: it would leave at the next sweep
//!   anyway, and meanwhile every scan of the slots read its lines and the
//!   clock (a burst of 100 000 sleepers ran 10 % faster). Leaving
//!   is one compare-and-swap that sets [`PARKED`](crate::sched::wakeup::PARKED) in
//!   the thread's signal word if no signal came since it last ran; then a
//!   spare context takes the slot (every slot always holds a context, so
//!   creation keeps writing into the slot's line and nothing else).
//! - **Coming back.** A signal is a fetch-and-add on the same word; the
//!   signaller sees the mark in the old value, and the one that clears it
//!   places the thread: power of two choices among the cores its class may
//!   use (so threads rebalance on every wake-up), then a push into that
//!   core's inbox (see [`crate::sched::inbox`]) and a wake of the core. The core
//!   moves it into a free slot on its next pass.
//! - **When every slot is busy.** Threads taken from the inbox wait in a
//!   core-private FIFO ([`CoreSched`]); the dispatcher first parks blocked
//!   threads, then every runnable thread that has had its turn goes to the
//!   back of the FIFO and as many of the oldest waiting threads take their
//!   slots, round robin (see [`make_room`]). Spawn therefore never fails for want of
//!   a slot: a thread created while every slot of its cores is taken gets a
//!   spare context and waits in an inbox like a woken one.
//! - **Sleepers.** A thread parked with a deadline gets an entry in the
//!   parking core's timer heap; the dispatcher fires due entries (a signal)
//!   at its clock reads and sleeps no longer than the earliest one.
//! - **Cores that come and go.** A core being released closes its inbox,
//!   fires its timers, parks its blocked threads and places the others on
//!   the remaining cores. At each sweep a core that has at least two more
//!   threads than the least loaded active core moves runnable threads there
//!   (half the difference), so a core that was just added receives running
//!   threads, not only new ones.
//!
//! Pinned threads (`Builder::core`) and `Exclusive` threads never leave
//! their slot for load: their core is part of their contract.

use super::placement::{place, place_in};
use super::stack::GiveBack;
use crate::clock;
use crate::error::SpawnError;
use crate::policy::{CoreMask, CorePolicy};
use crate::runtime::Shared;
use crate::sched::{Core, ThreadContext, BLOCKED};
use crate::shim::Ordering;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Minimum time between two sweeps of a core's blocked threads (in clock
/// ticks, set at start from [`SWEEP`]): a thread leaves its slot after
/// being blocked for one to two sweep periods.
pub(crate) static SWEEP_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The sweep period.
pub(crate) const SWEEP: std::time::Duration = std::time::Duration::from_micros(100);

/// Spare contexts a core keeps for itself before it gives them to the
/// runtime's pool.
const LOCAL_SPARES: usize = 64;

/// A core's private scheduling state (see the module docs).
#[derive(Default)]
pub(crate) struct CoreSched {
    /// Runnable threads handed to this core that wait for a free slot,
    /// oldest first.
    pending: VecDeque<&'static ThreadContext>,
    /// Deadlines of threads parked by this core: (ticks, context address).
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    /// Contexts with no thread, to fill the slots threads leave.
    spares: Vec<&'static ThreadContext>,
}

impl CoreSched {
    /// Whether threads wait for a slot here.
    #[inline]
    pub(crate) fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The earliest timer, if any.
    #[inline]
    pub(crate) fn next_timer(&self) -> Option<u64> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }
}

/// Shutting down, with no thread parked anywhere (the runtime's `detached`
/// count is 0) and none in a slot of `core`: drops the timers left here.
/// Each was for a thread woken before its
/// deadline (a timer is not removed then; it would fire as a spurious
/// signal), so no thread needs them; waiting for them made a runtime's drop
/// sit out, for example, a socket's whole read timeout on the epoll back
/// end after the read had been answered.
pub(crate) fn drop_stale_timers(core: &'static Core) {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    s.timers.clear();
    publish_timers(core, s);
}

/// Sets the sweep period in ticks (once the clock is calibrated).
pub(crate) fn init() {
    SWEEP_TICKS.store(
        clock::duration_to_ticks(SWEEP).max(1),
        std::sync::atomic::Ordering::Relaxed,
    );
    SHORT_PARK_TICKS.store(
        clock::duration_to_ticks(SHORT_PARK),
        std::sync::atomic::Ordering::Relaxed,
    );
    POOL_GRACE_TICKS.store(
        clock::duration_to_ticks(POOL_GRACE),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// A context with no thread: the calling core's own spares first, then the
/// runtime's pool, else a new one (within the thread limit).
pub(crate) fn take_spare(
    shared: &'static Shared,
    here: Option<&'static Core>,
) -> Result<&'static ThreadContext, SpawnError> {
    // SAFETY: `here` is the core of the calling kernel thread (the caller
    // checked), and no other reference to its state is live.
    let local = here.map(|core| &mut unsafe { core.sched() }.spares);
    pop_spare(shared, local)
}

/// A spare from `local` (a core's own list), else the runtime's pool, else
/// a new context.
fn pop_spare(
    shared: &'static Shared,
    local: Option<&mut Vec<&'static ThreadContext>>,
) -> Result<&'static ThreadContext, SpawnError> {
    if let Some(c) = local.and_then(|l| l.pop()) {
        return Ok(c);
    }
    if let Some(c) = shared
        .spares
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop()
    {
        return Ok(c);
    }
    match new_context(shared) {
        Err(SpawnError::ThreadLimit { .. }) => wait_for_cleaning(shared),
        r => r,
    }
}

/// At the thread limit with the pool empty: spares out of the pool while
/// their pages are given back count against the limit, so wait for them
/// (a few hundred microseconds at most) rather than fail.
#[cold]
fn wait_for_cleaning(shared: &'static Shared) -> Result<&'static ThreadContext, SpawnError> {
    loop {
        {
            let mut pool = shared.spares.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = pool.pop() {
                return Ok(c);
            }
            if pool.cleaning == 0 {
                break;
            }
        }
        std::thread::yield_now();
    }
    new_context(shared)
}

/// Creates a context and its stack, counting it against the thread limit.
pub(crate) fn new_context(shared: &'static Shared) -> Result<&'static ThreadContext, SpawnError> {
    let n = shared.contexts.fetch_add(1, Ordering::Relaxed);
    if n >= shared.max_threads {
        shared.contexts.fetch_sub(1, Ordering::Relaxed);
        return Err(SpawnError::ThreadLimit {
            limit: shared.max_threads,
        });
    }
    let ctx = ThreadContext::new_spare();
    // SAFETY: the context is new: nobody else can reach it yet.
    if let Err(e) = unsafe { ctx.context(shared.stack_size) } {
        shared.contexts.fetch_sub(1, Ordering::Relaxed);
        // The leaked context (a few cache lines) is not reused: it has no
        // stack. Mapping failures are rare and reported.
        return Err(SpawnError::Stack(e.to_string()));
    }
    Ok(ctx)
}

/// Keeps a context with no thread in `local` (a core's own list, up to
/// [`LOCAL_SPARES`]), or gives it to the runtime's pool.
fn keep_spare(
    shared: &'static Shared,
    local: &mut Vec<&'static ThreadContext>,
    ctx: &'static ThreadContext,
) {
    if local.len() < LOCAL_SPARES {
        local.push(ctx);
        return;
    }
    return_spare(shared, ctx);
}

/// Spares beyond the cores' own: the remains of a burst. Taken newest first
/// (their stacks are warm). A burst of a million threads that ran deep and
/// ended must not keep a million used stacks, but contexts that cycle
/// through the pool while threads come and go must not have their pages
/// given back only to fault them in again at the next spawn. So the used
/// stacks beyond [`DIRTY_SPARES`] are given back, the oldest first and in
/// batches of one system call (see [`GiveBack`]) made outside the pool's
/// lock, when a core is about to sleep ([`tidy_spares`]), or by the threads
/// that keep ending once the pool has held too many for [`POOL_GRACE`].
#[derive(Default)]
pub(crate) struct SparePool {
    /// Spares whose stacks hold no pages of earlier threads.
    clean: Vec<&'static ThreadContext>,
    /// Spares that may hold an earlier thread's pages, oldest first.
    dirty: VecDeque<&'static ThreadContext>,
    /// Spares out of the pool while their pages are given back.
    cleaning: usize,
    /// When the pool last went above [`DIRTY_SPARES`] used stacks (clock
    /// ticks; 0 while it is not).
    over_since: u64,
}

/// How long the pool may hold more than [`DIRTY_SPARES`] used stacks
/// while threads keep ending, before those threads give the excess back.
const POOL_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// [`POOL_GRACE`] in clock ticks (set at start).
static POOL_GRACE_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Spares in the pool that may keep an earlier thread's stack pages.
const DIRTY_SPARES: usize = 1024;

impl SparePool {
    /// The newest spare.
    pub(crate) fn pop(&mut self) -> Option<&'static ThreadContext> {
        let c = self.dirty.pop_back().or_else(|| self.clean.pop());
        if self.dirty.len() <= DIRTY_SPARES {
            self.over_since = 0;
        }
        c
    }

    /// Adds a spare. When the pool has held too many used stacks for
    /// [`POOL_GRACE`], returns the oldest of them, taken out of the pool:
    /// the caller gives their pages back and returns them with
    /// [`cleaned`](Self::cleaned).
    #[must_use]
    fn push(&mut self, ctx: &'static ThreadContext) -> Option<Vec<&'static ThreadContext>> {
        if ctx.stack_used.get() {
            self.dirty.push_back(ctx);
        } else {
            self.clean.push(ctx);
        }
        if self.dirty.len() <= DIRTY_SPARES {
            return None;
        }
        let now = clock::now().max(1);
        if self.over_since == 0 {
            self.over_since = now;
            return None;
        }
        let grace = POOL_GRACE_TICKS.load(std::sync::atomic::Ordering::Relaxed);
        if now.wrapping_sub(self.over_since) < grace {
            return None;
        }
        self.excess(DIRTY_SPARES / 2)
    }

    /// Takes out up to `most` of the oldest used stacks beyond
    /// [`DIRTY_SPARES`] / 2, to be given back.
    fn excess(&mut self, most: usize) -> Option<Vec<&'static ThreadContext>> {
        let n = self.dirty.len().saturating_sub(DIRTY_SPARES / 2).min(most);
        if n == 0 {
            return None;
        }
        let batch: Vec<_> = self.dirty.drain(..n).collect();
        self.cleaning += batch.len();
        if self.dirty.len() <= DIRTY_SPARES {
            self.over_since = 0;
        }
        Some(batch)
    }

    /// Takes back spares [`push`](Self::push) handed out, their pages given
    /// back.
    fn cleaned(&mut self, batch: Vec<&'static ThreadContext>) {
        self.cleaning -= batch.len();
        self.clean.extend(batch);
    }

    /// Empties the pool.
    pub(crate) fn take_all(&mut self) -> Vec<&'static ThreadContext> {
        let mut all = std::mem::take(&mut self.clean);
        all.extend(self.dirty.drain(..));
        all
    }
}

/// Spawners waiting for the thread limit (`spawn_wait`): woken when a
/// context becomes spare or a thread exits.
#[derive(Default)]
pub(crate) struct LimitWait {
    waiters: std::sync::atomic::AtomicUsize,
    lock: crate::sync::Mutex<()>,
    cond: crate::sync::Condvar,
}

impl LimitWait {
    /// Wakes the waiters, if any (one load when there are none).
    #[inline]
    pub(crate) fn notify(&self) {
        if self.waiters.load(Ordering::Acquire) != 0 {
            self.notify_slow();
        }
    }

    #[cold]
    fn notify_slow(&self) {
        let _g = self.lock.lock();
        self.cond.notify_all();
    }

    /// Calls `attempt` until it returns something other than
    /// `Err(ThreadLimit)`, sleeping between tries until a thread exits or a
    /// context becomes spare.
    pub(crate) fn wait_for<T>(
        &self,
        mut attempt: impl FnMut() -> Result<T, SpawnError>,
    ) -> Result<T, SpawnError> {
        loop {
            match attempt() {
                Err(SpawnError::ThreadLimit { .. }) => {}
                r => return r,
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let g = self.lock.lock();
            // Re-check under the lock: a notify between the failed attempt
            // and here would otherwise be missed.
            let r = attempt();
            if !matches!(r, Err(SpawnError::ThreadLimit { .. })) {
                drop(g);
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return r;
            }
            drop(self.cond.wait(g));
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Signals a context directly (a timer, an eviction): what
/// [`crate::thread::signal`] does, without a generation to check.
pub(crate) fn signal_context(ctx: &'static ThreadContext) {
    if ctx.wakeup().signal() {
        unpark(ctx);
    } else {
        ctx.core().gate.wake_after_rmw();
    }
}

/// After a signal found `ctx` parked: the signaller that clears the mark
/// places the thread again.
#[cold]
#[inline(never)]
pub(crate) fn unpark(ctx: &'static ThreadContext) {
    if ctx.invocation.signals.claim_unpark() {
        place(ctx.core().runtime(), ctx, None);
    }
}

/// Moves waiting threads into free slots of `core` (the dispatcher, between
/// runs, with its scan to go on at slot `scan`; `shared` is the core's
/// runtime, which the dispatcher holds). Returns whether it put any
/// there.
///
/// They go into the free slots the scan reaches first, oldest first, so
/// they run in the order they were woken. Taking the lowest free slots
/// instead put the burst of threads woken after a stall partly behind the
/// scan: with 10 000 echo connections, the requests that had waited
/// longest were answered last.
#[inline]
pub(crate) fn service(core: &'static Core, shared: &Shared, scan: usize) -> bool {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    if s.pending.is_empty() && !core.inbox.has_items() && !shared.homeless.has_items() {
        return false;
    }
    service_slow(core, s, scan)
}

#[cold]
fn service_slow(core: &'static Core, s: &mut CoreSched, mut scan: usize) -> bool {
    take_arrivals(core, s);
    let free = crate::sched::occupancy::SLOTS - core.mask.occupied().count_ones() as usize;
    for ctx in s.pending.iter().take(free) {
        ctx.prefetch();
    }
    let mut put = false;
    while let Some(&ctx) = s.pending.front() {
        if !install(core, s, ctx, &mut scan) {
            break;
        }
        ctx.prefetch_stack();
        s.pending.pop_front();
        core.queued.fetch_sub(1, Ordering::Relaxed);
        put = true;
    }
    put
}

/// Slot `i`'s thread ran to its end while threads were counted waiting for
/// a slot here, so its coroutine kept the slot's bit (see
/// `current::exit_slot_thread`): the oldest waiting thread takes the slot
/// (the dispatcher, between runs). Nothing else can claim it meanwhile, so
/// a spawner that comes later waits behind the threads that were first.
/// If none is found after all (counted, but not yet in the inbox), the
/// slot is freed.
pub(crate) fn hand_over(core: &'static Core, i: usize) {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    if s.pending.is_empty() {
        take_arrivals(core, s);
    }
    let Some(next) = s.pending.pop_front() else {
        core.mask.release(i);
        return;
    };
    core.queued.fetch_sub(1, Ordering::Relaxed);
    // The ended thread's context (suspended, no thread) becomes a spare.
    fill_slot(core, s, i, next);
    next.prefetch_stack();
}

/// Moves the threads handed to `core` (its inbox) and to the whole runtime
/// (the shared inbox, counted here from now on) to the back of its FIFO.
fn take_arrivals(core: &'static Core, s: &mut CoreSched) {
    core.inbox.take_all(&mut s.pending);
    let homeless = core.runtime().homeless.take_all(&mut s.pending);
    if homeless > 0 {
        core.queued.fetch_add(homeless as u32, Ordering::Relaxed);
    }
}

/// Puts the runnable `ctx` into the first free slot of `core` at or after
/// `scan` (wrapping), and moves `scan` past it; false when no slot is free.
fn install(
    core: &'static Core,
    s: &mut CoreSched,
    ctx: &'static ThreadContext,
    scan: &mut usize,
) -> bool {
    let Some(j) = core.mask.claim_from(*scan) else {
        return false;
    };
    *scan = j + 1;
    // The slot's free context (no thread: we hold the slot's bit, so no
    // spawner writes it) becomes a spare.
    fill_slot(core, s, j, ctx);
    true
}

/// Puts `ctx`, a thread that waited in no slot, into slot `j`, whose bit the
/// dispatcher holds; the slot's context, which holds no thread, becomes a
/// spare.
fn fill_slot(core: &'static Core, s: &mut CoreSched, j: usize, ctx: &'static ThreadContext) {
    let old = core.slot(j);
    ctx.relocate(core, j);
    core.set_slot(j, ctx);
    core.runtime().detached.fetch_sub(1, Ordering::Relaxed);
    keep_spare(core.runtime(), &mut s.spares, old);
}

/// Takes the thread in slot `i` out (it does not run meanwhile) and puts a
/// spare in its place. The caller made sure the thread will be found again
/// (parked, queued or placed).
pub(crate) fn detach(core: &'static Core, i: usize, spare: &'static ThreadContext) {
    spare.wakeup().reset();
    spare.relocate(core, i);
    core.set_slot(i, spare);
    core.mask.release(i);
}

/// Gives a context with no thread back to the runtime's pool (and, when the
/// pool holds too many used stacks, gives the oldest ones' pages back).
pub(crate) fn return_spare(shared: &'static Shared, ctx: &'static ThreadContext) {
    let batch = shared
        .spares
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(ctx);
    if let Some(batch) = batch {
        clean_spares(shared, batch);
    }
    shared.limit_wait.notify();
}

/// Gives back the pages of spares taken out of the pool, and returns them.
fn clean_spares(shared: &'static Shared, batch: Vec<&'static ThreadContext>) {
    let mut pages = GiveBack::default();
    for c in &batch {
        // SAFETY: a context in the pool runs nowhere: its coroutine is
        // suspended in its slot loop, where it recorded its stack pointer;
        // the pool's lock ordered this after its last owner's writes, and
        // the pool handed it out for us alone.
        unsafe { c.give_back_stack_into(&mut pages) };
    }
    pages.flush();
    shared
        .spares
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .cleaned(batch);
}

/// A core about to sleep: gives back the pages of the pool's used stacks
/// beyond what it keeps warm, a batch at a time until `busy` says work came.
pub(crate) fn tidy_spares(shared: &'static Shared, busy: impl Fn() -> bool) {
    loop {
        let batch = shared
            .spares
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .excess(DIRTY_SPARES);
        let Some(batch) = batch else {
            return;
        };
        clean_spares(shared, batch);
        if busy() {
            return;
        }
    }
}

/// A spare for `core`'s dispatcher (its own, the pool's, or a new one).
fn spare_for(core: &'static Core, s: &mut CoreSched) -> Option<&'static ThreadContext> {
    pop_spare(core.runtime(), Some(&mut s.spares)).ok()
}

/// Parks the blocked thread in slot `i` if it is still blocked; returns
/// whether it left the slot.
fn park(core: &'static Core, s: &mut CoreSched, i: usize, now: u64) -> bool {
    let ctx = core.slot(i);
    if !ctx.is_published() || !ctx.movable() {
        return false;
    }
    let deadline = match ctx.wakeup().due_or_deadline(now) {
        None => return false,
        Some(d) => d,
    };
    let Some(spare) = spare_for(core, s) else {
        return false;
    };
    // Counted before the park can be seen: once parked, a signal from any
    // core may place the thread and a dispatcher install it (which uncounts
    // it) before this line would run, and a count that dips to zero while a
    // thread is detached ends a shutdown early.
    let detached = &core.runtime().detached;
    detached.fetch_add(1, Ordering::Relaxed);
    if !try_park(ctx, deadline, now) {
        // A signal came since it last ran: it is runnable, it stays.
        detached.fetch_sub(1, Ordering::Relaxed);
        s.spares.push(spare);
        return false;
    }
    if deadline != BLOCKED {
        s.timers
            .push(Reverse((deadline, ctx as *const ThreadContext as usize)));
        publish_timers(core, s);
    }
    detach(core, i, spare);
    true
}

/// The thread in slot `i` just switched out to sleep for longer than a
/// sweep period (see [`AfterRun::Park`](crate::sched::context::AfterRun)): parks it now.
pub(crate) fn park_at_once(core: &'static Core, i: usize) {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    park(core, s, i, clock::now());
}

/// Dispatcher of the thread's core, for a blocked thread in a slot that
/// waits until `deadline` ([`BLOCKED`]: no deadline): marks it parked
/// unless a signal came since it last ran (see
/// [`Wakeup::try_park`](crate::sched::wakeup::Wakeup::try_park)). First, if
/// an earlier thread ran to its end on this stack and this one may stay
/// parked a while (see [`parks_long`]), gives back the stack's pages below
/// the thread's stack pointer: whatever the earlier thread left there is
/// dead, and a parked thread should hold only its own frames. Done before
/// the mark, while no other core can resume the thread.
fn try_park(ctx: &'static ThreadContext, deadline: u64, now: u64) -> bool {
    if parks_long(deadline, now) && ctx.stack_used.get() {
        let mut pages = GiveBack::default();
        // SAFETY: we are the dispatcher of the context's core and the thread
        // is suspended in its slot (blocked) until after the flush; the
        // stack pointer was recorded by its last switch out.
        unsafe { ctx.give_back_stack_into(&mut pages) };
        pages.flush();
    }
    ctx.wakeup().try_park()
}

/// Whether a thread parked now until `deadline` may stay parked long enough
/// for the pages an earlier thread left on its stack to matter: it has no
/// deadline, or one more than [`SHORT_PARK`] away. A thread that sleeps
/// briefly is back before then, and giving its pages back would cost a
/// zap now and a page fault at its next deep call (the threads of a
/// 100 000-sleeper burst paid both, on about half their stacks).
#[inline]
fn parks_long(deadline: u64, now: u64) -> bool {
    deadline == BLOCKED
        || deadline.saturating_sub(now)
            > SHORT_PARK_TICKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A park shorter than this keeps the dead pages of earlier threads on the
/// thread's stack (see [`parks_long`]).
const SHORT_PARK: std::time::Duration = std::time::Duration::from_millis(100);

/// [`SHORT_PARK`] in clock ticks (set at start).
static SHORT_PARK_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Before parking threads of the slots in `slots`: gives back, in one
/// system call, the dead stack pages of (at most `most`) blocked threads
/// that run on stacks earlier threads used and may stay parked a while (see
/// [`try_park`]). A thread given back and then not parked (a signal came)
/// loses nothing: the pages lie below its stack pointer.
fn give_back_before_parking(core: &'static Core, mut slots: u64, mut most: usize, now: u64) {
    // Allocates only when a range is added.
    let mut pages = GiveBack::default();
    while slots != 0 && most > 0 {
        let i = slots.trailing_zeros() as usize;
        slots &= slots - 1;
        let ctx = core.slot(i);
        if !ctx.stack_used.get() || !ctx.is_published() || !ctx.movable() {
            continue;
        }
        let Some(deadline) = ctx.wakeup().due_or_deadline(now) else {
            continue;
        };
        most -= 1;
        if parks_long(deadline, now) {
            // SAFETY: we are the dispatcher of the context's core and the
            // thread is suspended in its slot (blocked): nothing runs it
            // before the flush below; its stack pointer was recorded by its
            // last switch out.
            unsafe { ctx.give_back_stack_into(&mut pages) };
        }
    }
    pages.flush();
}

/// Publishes how many parked threads wait on `core`'s timers (the handoff
/// monitor reads it: a core with sleepers has work coming).
#[inline]
fn publish_timers(core: &Core, s: &CoreSched) {
    core.timers_parked
        .store(s.timers.len() as u32, Ordering::Relaxed);
}

/// Fires the timers due at `now`; returns the earliest one left.
pub(crate) fn fire_timers(core: &'static Core, now: u64) -> Option<u64> {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    // Due threads are signalled a batch at a time, their lines fetched
    // together first (see `ThreadContext::prefetch`).
    let mut due = [0usize; 16];
    loop {
        let mut n = 0;
        let mut next = None;
        while n < due.len() {
            match s.timers.peek() {
                Some(&Reverse((t, p))) if t <= now => {
                    s.timers.pop();
                    // SAFETY: timers hold addresses of leaked ('static)
                    // contexts.
                    unsafe { &*(p as *const ThreadContext) }.prefetch();
                    due[n] = p;
                    n += 1;
                }
                Some(&Reverse((t, _))) => {
                    next = Some(t);
                    break;
                }
                None => break,
            }
        }
        publish_timers(core, s);
        for &p in &due[..n] {
            // SAFETY: as above.
            signal_context(unsafe { &*(p as *const ThreadContext) });
        }
        if n < due.len() {
            return next;
        }
    }
}

/// The sweep: parks the threads of `marked` slots that are still blocked
/// (all blocked ones with `force`), then marks the occupied slots for the
/// next sweep, and evens the load out with less loaded cores. Returns the
/// new marks.
pub(crate) fn sweep(core: &'static Core, marked: u64, now: u64, force: bool) -> u64 {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    let mut m = core.mask.occupied() & if force { !0 } else { marked };
    give_back_before_parking(core, m, usize::MAX, now);
    while m != 0 {
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        park(core, s, i, now);
    }
    rebalance(core, s, now);
    core.mask.occupied()
}

/// When threads wait for a slot and every slot is taken: the blocked
/// threads leave their slots to the waiting ones (one in, one out, so no
/// spare context is needed, even at the thread limit), and every runnable
/// thread that has had its turn goes to the back of the queue so that as
/// many waiting ones take theirs, round robin.
///
/// `fresh` are the dispatcher's marks of slots whose threads have not run
/// since a sweep or since they were put in (see `dispatch::run`, which
/// clears a slot's mark when its thread runs): a marked thread keeps its
/// slot until it has run, and every thread put in here is marked. `scan`
/// is the slot the dispatcher's scan goes on from: threads put into free
/// slots go where it reaches first (see [`service`]); the slot holders
/// that make way are still taken lowest slot first (scan order sent out
/// holders about to run, and the p99 of 1 000 echo connections rose).
///
/// Only the thread that had just run used to make way: with 1 000 echo
/// connections on one core, each served by its own thread, the 56 threads
/// in the slots found their next request waiting every time they blocked,
/// and the others waited their turn one swap per 32 runs (p99 38-87 ms
/// against tokio's 13-17 ms).
pub(crate) fn make_room(core: &'static Core, fresh: &mut u64, now: u64, scan: usize) {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    service_slow(core, s, scan);
    if s.pending.is_empty() {
        return;
    }
    let mut m = core.mask.occupied();
    give_back_before_parking(core, m, s.pending.len(), now);
    while m != 0 && !s.pending.is_empty() {
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        let ctx = core.slot(i);
        if !ctx.is_published() || !ctx.movable() {
            continue;
        }
        let Some(deadline) = ctx.wakeup().due_or_deadline(now) else {
            continue;
        };
        if !try_park(ctx, deadline, now) {
            continue;
        }
        if deadline != BLOCKED {
            s.timers
                .push(Reverse((deadline, ctx as *const ThreadContext as usize)));
            publish_timers(core, s);
        }
        swap_in(core, s, i);
        *fresh |= 1 << i;
    }
    // Every slot holds a runnable thread (or one that cannot move): those
    // that have run since they were put in make way, up to as many as wait
    // now (a thread sent back is not taken in again by this call).
    let mut waiting = s.pending.len();
    let mut m = core.mask.occupied() & !*fresh;
    while m != 0 && waiting != 0 {
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        let ctx = core.slot(i);
        if !ctx.is_published() || !ctx.movable() || ctx.wakeup().due_or_deadline(now).is_some() {
            continue;
        }
        // Runnable: its wakeup state says so wherever it goes.
        ctx.wakeup().set_runnable();
        swap_in(core, s, i);
        core.queued.fetch_add(1, Ordering::Relaxed);
        s.pending.push_back(ctx);
        *fresh |= 1 << i;
        waiting -= 1;
    }
}

/// Puts the oldest waiting thread into slot `i`, whose thread the caller has
/// taken out (parked, or queued again); the slot's bit stays set.
fn swap_in(core: &'static Core, s: &mut CoreSched, i: usize) {
    let Some(next) = s.pending.pop_front() else {
        return;
    };
    core.queued.fetch_sub(1, Ordering::Relaxed);
    next.relocate(core, i);
    core.set_slot(i, next);
}

/// Moves runnable threads to the least loaded other core when this one has
/// at least two more (see the module docs).
fn rebalance(core: &'static Core, s: &mut CoreSched, now: u64) {
    let shared = core.runtime();
    let active = shared.active_mask.load(Ordering::Acquire) & !(1u64 << core.index);
    if active == 0 {
        return;
    }
    let mine = core.load() as usize;
    let Some((load, target)) = CoreMask(active)
        .iter()
        .map(|c| (shared.cores[c].load() as usize, c))
        .min()
    else {
        return;
    };
    if mine < load + 2 {
        return;
    }
    let mut budget = (mine - load) / 2;
    let target = &shared.cores[target];
    // Threads waiting for a slot here go first: they are not running.
    while budget > 0 {
        let Some(ctx) = s.pending.pop_back() else {
            break;
        };
        if ctx.movable() && target.inbox.push_counted(ctx, &target.queued) {
            core.queued.fetch_sub(1, Ordering::Relaxed);
            target.gate.wake_after_rmw();
            budget -= 1;
        } else {
            s.pending.push_back(ctx);
            break;
        }
    }
    let mut m = core.mask.occupied();
    while budget > 0 && m != 0 {
        let i = 63 - m.leading_zeros() as usize;
        m &= !(1u64 << i);
        let ctx = core.slot(i);
        if !ctx.is_published() || !ctx.movable() {
            continue;
        }
        let mut now_fn = || now;
        if !ctx.wakeup().is_due(&mut now_fn) {
            continue;
        }
        let Some(spare) = spare_for(core, s) else {
            return;
        };
        detach(core, i, spare);
        shared.detached.fetch_add(1, Ordering::Relaxed);
        if target.inbox.push_counted(ctx, &target.queued) {
            target.gate.wake_after_rmw();
        } else {
            // The target closed meanwhile: keep it here, waiting.
            core.queued.fetch_add(1, Ordering::Relaxed);
            s.pending.push_back(ctx);
        }
        budget -= 1;
    }
}

/// The core is being released: close its inbox, wake its timers' threads,
/// park its blocked threads and place the others on the remaining cores.
/// Returns false when another core cannot take them now (no other core is
/// active, or a slot is still being filled by a spawner).
pub(crate) fn evict_all(core: &'static Core) -> bool {
    let shared = core.runtime();
    let others = shared.active_mask.load(Ordering::Acquire) & !(1u64 << core.index);
    if others == 0 {
        return false;
    }
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    core.inbox.close(&mut s.pending);
    let now = clock::now();
    // Timers fire now (early wakeups are allowed): nobody would fire them.
    core.timers_parked.store(0, Ordering::Relaxed);
    while let Some(Reverse((_, p))) = s.timers.pop() {
        // SAFETY: timers hold addresses of leaked ('static) contexts.
        signal_context(unsafe { &*(p as *const ThreadContext) });
    }
    let mut done = true;
    let mut m = core.mask.occupied();
    while m != 0 {
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        let ctx = core.slot(i);
        if !ctx.is_published() {
            // A spawner is writing it (or holds it in reservation): later.
            done = false;
            continue;
        }
        let Some(spare) = spare_for(core, s) else {
            done = false;
            continue;
        };
        let w = ctx.wakeup();
        // Counted before a park can be seen (see `park`); it stays counted
        // either way: parked, or detached to run elsewhere.
        shared.detached.fetch_add(1, Ordering::Relaxed);
        let parked =
            ctx.movable() && w.due_or_deadline(now) == Some(BLOCKED) && try_park(ctx, BLOCKED, now);
        if !parked {
            // Runnable, sleeping (no timer here any more: wake it early) or
            // bound to this core: it runs elsewhere now.
            w.set_runnable();
            detach(core, i, spare);
            let to = shared.active_mask.load(Ordering::Acquire) & !(1u64 << core.index);
            if !ctx.movable() && to != 0 {
                // A pinned or exclusive thread goes to one core, the one its
                // policy is told about (placement by class could pick, and
                // mark, another).
                let to = to.trailing_zeros() as usize;
                shared.policy.thread_migrated(ctx.class(), core.index, to);
                place_in(shared, ctx, CoreMask::single(to));
            } else {
                core.queued.fetch_add(1, Ordering::Relaxed);
                s.pending.push_back(ctx);
            }
            continue;
        }
        detach(core, i, spare);
    }
    while let Some(ctx) = s.pending.pop_front() {
        core.queued.fetch_sub(1, Ordering::Relaxed);
        place(shared, ctx, Some(core.index));
    }
    // `active` was cleared before this (see `dispatch::release`): after the
    // fence, a spawner that claims a slot here from now on sees the core
    // inactive and chooses again (see `spawn::still_active`), and one that
    // claimed before is seen here.
    crate::shim::fence(Ordering::SeqCst);
    done && core.mask.occupied() == 0
}

/// The core runs again: it takes threads from other cores from now on.
pub(crate) fn reopen(core: &'static Core) {
    core.inbox.open();
}

/// Shutdown: closes the inbox for good unless a thread arrived in it (then
/// it stays open and the thread waits here); returns whether one did.
pub(crate) fn close_for_shutdown(core: &'static Core) -> bool {
    // SAFETY: the dispatcher of `core`, between runs.
    let s = unsafe { core.sched() };
    if core.inbox.close(&mut s.pending) > 0 {
        core.inbox.open();
        return true;
    }
    false
}

/// Shutdown: unmaps the stacks of `core`'s spare contexts (from its kernel
/// thread, once its dispatcher returned for good), or of the runtime's pool
/// (`None`, once every kernel thread is gone).
pub(crate) fn drop_spares(shared: &'static Shared, core: Option<&'static Core>) {
    let spares = match core {
        // SAFETY: called by the core's kernel thread after its dispatcher
        // returned for good; no other reference exists.
        Some(c) => std::mem::take(&mut unsafe { c.sched() }.spares),
        None => shared
            .spares
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take_all(),
    };
    for ctx in spares {
        // SAFETY: a spare holds no thread and nothing runs it: its
        // coroutine is suspended in the slot loop or never started.
        unsafe { ctx.drop_context() };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `n` spares whose stacks an earlier thread used.
    fn used_spares(n: usize) -> Vec<&'static ThreadContext> {
        (0..n)
            .map(|_| {
                let c = ThreadContext::new_spare();
                c.stack_used.set(true);
                c
            })
            .collect()
    }

    #[test]
    fn the_pool_keeps_its_used_stacks_until_the_grace_has_passed() {
        init();
        let mut pool = SparePool::default();
        for c in used_spares(DIRTY_SPARES + 1) {
            assert!(pool.push(c).is_none(), "given back before the grace");
        }
        // The pool has been over for longer than the grace: the next push
        // hands out a batch of the oldest used stacks.
        pool.over_since = clock::now()
            .saturating_sub(POOL_GRACE_TICKS.load(std::sync::atomic::Ordering::Relaxed) + 1)
            .max(1);
        let batch = pool
            .push(used_spares(1)[0])
            .expect("a batch after the grace");
        assert_eq!(batch.len(), DIRTY_SPARES / 2);
        assert_eq!(pool.cleaning, batch.len());
        pool.cleaned(batch);
        assert_eq!(pool.cleaning, 0);
        assert_eq!(pool.dirty.len(), DIRTY_SPARES + 2 - DIRTY_SPARES / 2);
        assert_eq!(pool.over_since, 0);
        // Newest first: the used (warm) stacks before the given-back ones.
        let first = pool.pop().unwrap();
        assert!(first.stack_used.get());
    }

    #[test]
    fn a_pool_that_falls_back_under_its_allowance_restarts_the_grace() {
        init();
        let mut pool = SparePool::default();
        for c in used_spares(DIRTY_SPARES + 1) {
            assert!(pool.push(c).is_none());
        }
        assert_ne!(pool.over_since, 0);
        pool.pop();
        assert_eq!(pool.over_since, 0);
    }

    #[test]
    fn an_idle_core_takes_every_used_stack_beyond_the_allowance() {
        init();
        let mut pool = SparePool::default();
        for c in used_spares(3 * DIRTY_SPARES) {
            let _ = pool.push(c);
        }
        let mut taken = 0;
        while let Some(batch) = pool.excess(DIRTY_SPARES) {
            assert!(batch.len() <= DIRTY_SPARES);
            taken += batch.len();
            pool.cleaned(batch);
        }
        assert_eq!(taken, 3 * DIRTY_SPARES - DIRTY_SPARES / 2);
        assert_eq!(pool.dirty.len(), DIRTY_SPARES / 2);
    }

    #[test]
    fn only_a_long_park_gives_pages_back() {
        init();
        let now = clock::now();
        assert!(parks_long(BLOCKED, now));
        assert!(parks_long(
            now + clock::duration_to_ticks(std::time::Duration::from_secs(1)),
            now
        ));
        assert!(!parks_long(
            now + clock::duration_to_ticks(std::time::Duration::from_millis(10)),
            now
        ));
        assert!(!parks_long(now.saturating_sub(5), now));
    }
}
