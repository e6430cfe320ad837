//! The user-thread API: create, join, yield, sleep, and the low-level
//! `block`/`signal` pair that every other way of waiting is built on.
//!
//! `block` and `signal` follow Arachne: a signal makes the thread runnable
//! (its `wakeup_time` becomes 0); a signal that arrives while the thread
//! still runs is kept, so the next `block` returns at once. Wakeups may be
//! spurious (a signal meant for an earlier thread of the same slot, or one
//! consumed late), so callers re-check their condition in a loop, exactly as
//! with a condition variable.
//!
//! Thread-local storage: `std::thread_local!` inside a user thread is per
//! *kernel* thread. Every user thread that runs on the same core sees the
//! same value, and a user thread can move to another core whenever it
//! blocks or yields (it is placed again by load when woken, and moved when
//! its core is released), so the value it sees can change between two
//! lines of one function, and a reference obtained before a switch must not
//! be used after it (std's `with` closure does not allow that anyway, but
//! raw pointers to it would dangle on another core). Use
//! [`corewise::thread_local!`](crate::thread_local) for values that belong
//! to the user thread; keep `std::thread_local!` for per-core caches that
//! tolerate the switch.
//!
//! Scoped threads are [`scope`] / [`Scope`], as in `std::thread`.
//!
//! The engine behind it is the crate-private `sched` module; this module is
//! the public front only.

use crate::error::{JoinError, SpawnError};
use crate::policy::ThreadClass;
use crate::runtime::Runtime;
use crate::sched::coroutine::switch_out;
use crate::sched::current::current_slot;
use crate::sched::spawn::{spawn_job, SpawnOptions};
use crate::sched::{ThreadContext, BLOCKED};
use crate::shim::Ordering;
use crate::sync::packet::Packet;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::scope::{scope, Scope, ScopedJoinHandle};

/// Identifies a user thread, for [`signal`].
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let id = rt.block_on(|| corewise::current().unwrap()).unwrap();
/// println!("{id}");
/// ```
#[derive(Clone, Copy)]
pub struct ThreadId {
    slot: &'static ThreadContext,
    generation: u32,
}

impl ThreadId {
    pub(crate) fn new(slot: &'static ThreadContext) -> Self {
        Self::of_generation(slot, slot.generation().load(Ordering::Relaxed))
    }

    /// The thread of `slot` whose spawner published `generation`.
    pub(crate) fn of_generation(slot: &'static ThreadContext, generation: u32) -> Self {
        Self { slot, generation }
    }

    /// The runtime core the thread runs on.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (id, core) = rt
    ///     .block_on(|| (corewise::current().unwrap(), corewise::current_core().unwrap()))
    ///     .unwrap();
    /// assert_eq!(id.core(), core);
    /// assert!(core < rt.cores());
    /// ```
    pub fn core(&self) -> usize {
        self.slot.core().index
    }
}

impl PartialEq for ThreadId {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.slot, other.slot) && self.generation == other.generation
    }
}

impl Eq for ThreadId {}

impl std::fmt::Debug for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadId({self})")
    }
}

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "core {} slot {} gen {}",
            self.slot.core().index,
            self.slot.index(),
            self.generation
        )
    }
}

/// Waits for a user thread and takes its result.
///
/// `join` from a user thread blocks that thread only (its core runs other
/// threads meanwhile); from an OS thread it parks the OS thread.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let h = rt.spawn(|| "done").unwrap();
/// assert_eq!(h.join().unwrap(), "done");
/// let p = rt.spawn(|| -> u32 { panic!("boom") }).unwrap();
/// assert_eq!(p.join().unwrap_err().message, "boom");
/// ```
pub struct JoinHandle<T> {
    packet: Arc<Packet<std::thread::Result<T>>>,
    id: ThreadId,
}

impl<T> JoinHandle<T> {
    /// Blocks until the thread ends; its panic comes back as an error.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = rt.spawn(|| vec![1, 2, 3]).unwrap();
    /// assert_eq!(h.join().unwrap(), [1, 2, 3]);
    /// let failed = rt.spawn(|| -> () { panic!("bad input") }).unwrap();
    /// assert_eq!(failed.join().unwrap_err().message, "bad input");
    /// ```
    pub fn join(self) -> Result<T, JoinError> {
        match self.packet.wait() {
            Ok(v) => Ok(v),
            Err(payload) => Err(JoinError::from_panic(payload)),
        }
    }

    /// Whether the thread has ended.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (tx, rx) = corewise::sync::channel::<()>(1);
    /// let h = rt.spawn(move || rx.recv().unwrap()).unwrap();
    /// assert!(!h.is_finished()); // it waits for the message
    /// tx.send(()).unwrap();
    /// while !h.is_finished() {
    ///     std::thread::yield_now();
    /// }
    /// h.join().unwrap();
    /// ```
    pub fn is_finished(&self) -> bool {
        self.packet.is_done()
    }

    /// The thread's id.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = rt.spawn(|| corewise::current().unwrap()).unwrap();
    /// let id = h.thread();
    /// assert_eq!(h.join().unwrap(), id);
    /// ```
    pub fn thread(&self) -> ThreadId {
        self.id
    }
}

impl<T> std::fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinHandle").field("id", &self.id).finish()
    }
}

/// Options for a new user thread.
///
/// ```
/// use corewise::{thread::Builder, ThreadClass};
/// let rt = corewise::Runtime::new().unwrap();
/// let h = Builder::new()
///     .name("worker")
///     .class(ThreadClass::Normal)
///     .core(0)
///     .spawn_in(&rt, || corewise::current_core())
///     .unwrap();
/// assert_eq!(h.join().unwrap(), Some(0));
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a thread Builder does nothing until one of its spawn methods"]
pub struct Builder {
    opts: SpawnOptions,
}

impl Builder {
    /// Default options: `Normal`, placed by the policy, fail at the thread
    /// limit.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = corewise::thread::Builder::new().spawn_in(&rt, || 5).unwrap();
    /// assert_eq!(h.join().unwrap(), 5);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The thread's class.
    ///
    /// ```
    /// use corewise::{thread::Builder, ThreadClass};
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = Builder::new()
    ///     .class(ThreadClass::Exclusive)
    ///     .spawn_in(&rt, || corewise::current_core())
    ///     .unwrap();
    /// assert!(h.join().unwrap().is_some());
    /// ```
    pub fn class(mut self, class: ThreadClass) -> Self {
        self.opts.class = class;
        self
    }

    /// Create the thread on this runtime core, bypassing the policy.
    ///
    /// ```
    /// use corewise::{thread::Builder, SpawnError};
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = Builder::new().core(0).spawn_in(&rt, corewise::current_core).unwrap();
    /// assert_eq!(h.join().unwrap(), Some(0));
    /// let err = Builder::new().core(64).spawn_in(&rt, || ()).unwrap_err();
    /// assert_eq!(err, SpawnError::CoreUnavailable(64));
    /// ```
    pub fn core(mut self, core: usize) -> Self {
        self.opts.core = Some(core);
        self
    }

    /// A name, shown in the stack-overflow message.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = corewise::thread::Builder::new()
    ///     .name("parser-1")
    ///     .spawn_in(&rt, || -> u8 { panic!("bad token") }) // the panic message names `parser-1`
    ///     .unwrap();
    /// assert_eq!(h.join().unwrap_err().message, "bad token");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.opts.name = Some(name.into());
        self
    }

    /// When the runtime's thread limit (`Runtime::builder().max_threads`)
    /// is reached: wait until a thread ends (true) or fail with
    /// [`SpawnError::ThreadLimit`] (false, the default). A spawn never
    /// waits or fails for lack of a free slot on a core: the thread then
    /// waits for one in the runtime, not in the spawner.
    ///
    /// ```
    /// use corewise::{sync::Semaphore, thread::Builder, SpawnError};
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::builder().max_threads(1).build().unwrap();
    /// // Start threads that wait for a permit until the runtime refuses one.
    /// let permits = Arc::new(Semaphore::new(0));
    /// let mut waiting = Vec::new();
    /// let err = loop {
    ///     let p = permits.clone();
    ///     match Builder::new().spawn_in(&rt, move || p.acquire()) {
    ///         Ok(h) => waiting.push(h),
    ///         Err(e) => break e,
    ///     }
    /// };
    /// assert_eq!(err, SpawnError::ThreadLimit { limit: 1 });
    /// // One thread may end now: a spawn that waits at the limit gets its place.
    /// permits.release();
    /// let late = Builder::new().wait_at_limit(true).spawn_in(&rt, || "started").unwrap();
    /// assert_eq!(late.join().unwrap(), "started");
    /// for _ in 1..waiting.len() {
    ///     permits.release();
    /// }
    /// waiting.into_iter().for_each(|h| h.join().unwrap());
    /// ```
    pub fn wait_at_limit(mut self, wait: bool) -> Self {
        self.opts.wait = wait;
        self
    }

    /// The name this option had while a spawn could fail for want of a free
    /// slot: now the same as [`wait_at_limit`](Self::wait_at_limit).
    ///
    /// ```
    /// use corewise::thread::Builder;
    /// let old = Builder::new().wait_for_slot(true);
    /// assert_eq!(format!("{old:?}"), format!("{:?}", Builder::new().wait_at_limit(true)));
    /// let rt = corewise::Runtime::new().unwrap();
    /// assert_eq!(old.spawn_in(&rt, || 2).unwrap().join().unwrap(), 2);
    /// ```
    pub fn wait_for_slot(self, wait: bool) -> Self {
        self.wait_at_limit(wait)
    }

    pub(crate) fn into_options(self) -> SpawnOptions {
        self.opts
    }

    /// Creates the thread in the runtime of the calling user thread.
    ///
    /// ```
    /// use corewise::{thread::Builder, SpawnError};
    /// // From an OS thread there is no runtime to spawn into.
    /// assert_eq!(Builder::new().spawn(|| ()).unwrap_err(), SpawnError::NotInRuntime);
    /// let rt = corewise::Runtime::new().unwrap();
    /// let v = rt
    ///     .block_on(|| Builder::new().name("child").spawn(|| 10).unwrap().join().unwrap())
    ///     .unwrap();
    /// assert_eq!(v, 10);
    /// ```
    pub fn spawn<F, T>(self, f: F) -> Result<JoinHandle<T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let shared = current_slot()
            .ok_or(SpawnError::NotInRuntime)?
            .core()
            .runtime();
        spawn_joinable(shared, self.opts, f)
    }

    /// Creates the thread in `rt` (from any thread).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = corewise::thread::Builder::new()
    ///     .name("from-main")
    ///     .spawn_in(&rt, || corewise::current().is_some())
    ///     .unwrap();
    /// assert!(h.join().unwrap()); // it ran as a user thread
    /// ```
    pub fn spawn_in<F, T>(self, rt: &Runtime, f: F) -> Result<JoinHandle<T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn_joinable(rt.shared(), self.opts, f)
    }

    /// Creates a thread nobody joins (no result cell is allocated); a panic
    /// is reported by the panic hook and otherwise ignored.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let done = Arc::new(AtomicBool::new(false));
    /// let d = done.clone();
    /// rt.block_on(move || {
    ///     corewise::thread::Builder::new()
    ///         .spawn_detached(move || d.store(true, Ordering::Release))
    ///         .unwrap();
    /// })
    /// .unwrap();
    /// drop(rt); // dropping the runtime waits for its threads, detached ones too
    /// assert!(done.load(Ordering::Acquire));
    /// ```
    pub fn spawn_detached<F>(self, f: F) -> Result<ThreadId, SpawnError>
    where
        F: FnOnce() + Send + 'static,
    {
        let shared = current_slot()
            .ok_or(SpawnError::NotInRuntime)?
            .core()
            .runtime();
        spawn_job(shared, self.opts, detached(f))
    }

    /// [`spawn_detached`](Self::spawn_detached) into `rt`.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (tx, rx) = corewise::sync::channel(1);
    /// let id = corewise::thread::Builder::new()
    ///     .spawn_detached_in(&rt, move || tx.send(corewise::current().unwrap()).unwrap())
    ///     .unwrap();
    /// assert_eq!(rx.recv().unwrap(), id);
    /// ```
    pub fn spawn_detached_in<F>(self, rt: &Runtime, f: F) -> Result<ThreadId, SpawnError>
    where
        F: FnOnce() + Send + 'static,
    {
        spawn_job(rt.shared(), self.opts, detached(f))
    }
}

fn detached<F: FnOnce() + Send + 'static>(f: F) -> impl FnOnce() + Send + 'static {
    move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        // A destructor's panic was reported by the panic hook; nobody joins.
        let _ = crate::local::exit_current();
    }
}

fn spawn_joinable<F, T>(
    shared: &'static crate::runtime::Shared,
    opts: SpawnOptions,
    f: F,
) -> Result<JoinHandle<T>, SpawnError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let packet = Arc::new(Packet::new());
    let theirs = Arc::clone(&packet);
    let id = spawn_job(shared, opts, move || {
        let mut r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        // The thread's `thread_local!` values go before `join` returns; a
        // destructor's panic is the thread's if it had none of its own.
        if let Some(p) = crate::local::exit_current() {
            if r.is_ok() {
                r = Err(p);
            }
        }
        theirs.complete(r);
    })?;
    Ok(JoinHandle { packet, id })
}

/// Creates a `Normal` user thread in the caller's runtime (call it from a
/// user thread; from an OS thread use [`Runtime::spawn`]).
///
/// When every slot of the thread's cores is taken (the cores are behind),
/// the calling user thread lets its core's other threads run before
/// `spawn` returns, so a spawning loop cannot pile up threads faster than
/// they start. Like any call that may switch, it should not be made while
/// holding a `std::sync::Mutex` that other user threads take.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let sum = rt.block_on(|| {
///     let hs: Vec<_> = (0..10u64).map(|i| corewise::spawn(move || i * i).unwrap()).collect();
///     hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
/// });
/// assert_eq!(sum.unwrap(), 285);
/// ```
pub fn spawn<F, T>(f: F) -> Result<JoinHandle<T>, SpawnError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new().spawn(f)
}

/// Creates a user thread of `class` in the caller's runtime.
///
/// ```
/// use corewise::ThreadClass;
/// let rt = corewise::Runtime::new().unwrap();
/// let ok = rt.block_on(|| corewise::spawn_with(ThreadClass::Normal, || 1).unwrap().join().unwrap());
/// assert_eq!(ok.unwrap(), 1);
/// ```
pub fn spawn_with<F, T>(class: ThreadClass, f: F) -> Result<JoinHandle<T>, SpawnError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new().class(class).spawn(f)
}

/// Like [`spawn`], but when the runtime's thread limit is reached it waits
/// (blocking, not polling) until a thread ends instead of failing.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let v = rt.block_on(|| corewise::spawn_wait(|| 3).unwrap().join().unwrap());
/// assert_eq!(v.unwrap(), 3);
/// ```
pub fn spawn_wait<F, T>(f: F) -> Result<JoinHandle<T>, SpawnError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new().wait_at_limit(true).spawn(f)
}

/// The calling user thread's id (`None` on an OS thread).
///
/// ```
/// assert!(corewise::current().is_none());
/// ```
pub fn current() -> Option<ThreadId> {
    current_slot().map(ThreadId::new)
}

/// The calling thread's name: a user thread's is the one given to
/// [`Builder::name`] (`None` if it had none); an OS thread's is std's.
///
/// Use it where std code calls `std::thread::current().name()`: inside a
/// user thread, std names the kernel thread that runs it (such as
/// `corewise-core-0`), which changes as the thread moves between cores.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let h = corewise::thread::Builder::new()
///     .name("worker-7")
///     .spawn_in(&rt, corewise::thread::current_name)
///     .unwrap();
/// assert_eq!(h.join().unwrap().as_deref(), Some("worker-7"));
/// let unnamed = rt.spawn(corewise::thread::current_name).unwrap();
/// assert_eq!(unnamed.join().unwrap(), None);
/// // An OS thread: std's name.
/// let os = std::thread::Builder::new()
///     .name("plain".into())
///     .spawn(corewise::thread::current_name)
///     .unwrap();
/// assert_eq!(os.join().unwrap().as_deref(), Some("plain"));
/// ```
pub fn current_name() -> Option<String> {
    match current_slot() {
        Some(slot) => slot.name().map(str::to_owned),
        None => std::thread::current().name().map(str::to_owned),
    }
}

/// The runtime core the caller runs on (`None` on an OS thread).
///
/// ```
/// assert_eq!(corewise::current_core(), None);
/// ```
pub fn current_core() -> Option<usize> {
    current_slot().map(|s| s.core().index)
}

/// Lets other runnable threads on this core run. With none, it returns at
/// once (a few ns). On an OS thread it is `std::thread::yield_now`.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| for _ in 0..10 { corewise::yield_now() }).unwrap();
/// ```
///
/// It is always inlined, so the switch lands in the caller's frame: the
/// dispatcher resumes a thread with a call and the thread switches out
/// with a return, and when both sit at one call depth the processor's
/// return-address predictor gets both right. A `yield_now` that was a
/// function of its own made the return out of it after each resume, and
/// the switch after each call into it, go where the predictor did not
/// expect: two mispredicted returns a yield, which took a one-way yield
/// from 13-17 ns to 38-44 ns on an Intel host.
#[inline(always)]
pub fn yield_now() {
    let Some(slot) = current_slot() else {
        std::thread::yield_now();
        return;
    };
    if !yield_wanted(slot) {
        return;
    }
    slot.wakeup().set_runnable();
    // SAFETY: `slot` is the running thread's own slot.
    unsafe { switch_out(slot) };
}

/// Whether the running thread in `slot` must switch out to yield: another
/// thread could run on its core, or (with nothing else to run) the core
/// was handed over, and its old dispatcher places the thread on a core.
/// Out of line: it returns before the switch, so it costs a call, not a
/// mispredicted return (see [`yield_now`]).
#[inline(never)]
fn yield_wanted(slot: &ThreadContext) -> bool {
    slot.core().other_runnable(slot.index()) || crate::sched::handoff::core_lost(slot)
}

/// Blocks the calling user thread until it is signalled (or spuriously).
/// On an OS thread it parks the thread (`std::thread::park`).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let me = rt.block_on(|| {
///     corewise::signal(corewise::current().unwrap());
///     corewise::block(); // returns at once: the signal was kept
/// });
/// assert!(me.is_ok());
/// ```
#[inline]
pub fn block() {
    match current_slot() {
        Some(slot) => block_ticks(slot, BLOCKED),
        None => std::thread::park(),
    }
}

/// Blocks until signalled or `deadline`, whichever is first (or spuriously).
///
/// ```
/// use std::time::{Duration, Instant};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| corewise::block_until(Instant::now() + Duration::from_millis(1))).unwrap();
/// ```
pub fn block_until(deadline: Instant) {
    match current_slot() {
        Some(slot) => block_ticks(slot, crate::clock::instant_to_ticks(deadline)),
        None => std::thread::park_timeout(deadline.saturating_duration_since(Instant::now())),
    }
}

#[inline]
fn block_ticks(slot: &ThreadContext, ticks: u64) {
    if slot.wakeup().block_until(ticks) {
        // SAFETY: `slot` is the running thread's own slot.
        unsafe { switch_out(slot) };
    }
}

/// Makes `thread` runnable if it is blocked, or makes its next `block`
/// return at once. Signalling a thread that has ended does nothing (or, if
/// its slot is reused meanwhile, wakes the new thread spuriously); a signal
/// that arrives before the thread has first run may be absorbed by its
/// start, as in Arachne. So a thread blocks in a loop on a condition that
/// the signaller sets first:
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// let rt = corewise::Runtime::new().unwrap();
/// let ready = Arc::new(AtomicBool::new(false));
/// let r = ready.clone();
/// let h = rt
///     .spawn(move || {
///         while !r.load(Ordering::Acquire) {
///             corewise::block();
///         }
///     })
///     .unwrap();
/// ready.store(true, Ordering::Release);
/// corewise::signal(h.thread());
/// h.join().unwrap();
/// ```
#[inline]
pub fn signal(thread: ThreadId) {
    let slot = thread.slot;
    // Write first, then check: the swap brings the line over exclusively
    // and the generation (same line) is then a hit. A signal that lands on
    // a newer thread of the slot is a spurious wakeup, which is allowed.
    if slot.wakeup().signal() {
        // The thread had left its slot: the signaller that clears the mark
        // places it again (see `crate::sched::park`).
        crate::sched::park::unpark(slot);
        return;
    }
    if slot.generation().load(Ordering::Relaxed) != thread.generation {
        return;
    }
    slot.core().gate.wake_after_rmw();
}

/// Sleeps for `d`: a user thread blocks (its core runs others or sleeps);
/// an OS thread sleeps.
///
/// ```
/// use std::time::{Duration, Instant};
/// let rt = corewise::Runtime::new().unwrap();
/// let t = Instant::now();
/// rt.block_on(|| corewise::sleep(Duration::from_millis(2))).unwrap();
/// assert!(t.elapsed() >= Duration::from_millis(2));
/// ```
pub fn sleep(d: Duration) {
    let Some(slot) = current_slot() else {
        std::thread::sleep(d);
        return;
    };
    let Some(deadline) = crate::deadline::after(d) else {
        // Beyond the clock's range: until the end of time, as std does.
        loop {
            block_ticks(slot, u64::MAX - 1);
        }
    };
    // The deadline in ticks straight from the tick clock (no second
    // `clock_gettime`), with a margin of 1/4096 for the calibration's error
    // and the system clock's slewing; the `Instant` check after the wake
    // keeps the guarantee (at least `d`).
    let t = crate::clock::duration_to_ticks(d);
    let mut ticks = crate::clock::now()
        .saturating_add(t.saturating_add(t / 4096 + 1))
        .min(u64::MAX - 1);
    // A sleep longer than a sweep period would leave the slot at the next
    // sweep anyway: it leaves it as soon as it switches out.
    let long = d >= crate::sched::park::SWEEP;
    let after = if long {
        crate::sched::context::AfterRun::Park
    } else {
        crate::sched::context::AfterRun::Nothing
    };
    loop {
        slot.after_run.set(after);
        block_ticks(slot, ticks);
        slot.after_run.set(crate::sched::context::AfterRun::Nothing);
        if Instant::now() >= deadline {
            return;
        }
        // Woken early (a stray signal): block again until the deadline.
        ticks = crate::clock::instant_to_ticks(deadline);
    }
}

/// Installs, once per process, a panic hook that names the user thread: a
/// panic in a user thread made with `Builder::name("worker-7")` prints
/// `thread 'worker-7'`, not the name of the kernel thread that ran it. Panics
/// outside user threads go to the hook that was installed before. (A hook a
/// program sets after building a runtime replaces this one.)
pub(crate) fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let Some(slot) = current_slot() else {
                return previous(info);
            };
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("Box<dyn Any>");
            let name = slot.name().unwrap_or("<unnamed>");
            let at = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            let bt = std::backtrace::Backtrace::capture();
            let tail = match bt.status() {
                std::backtrace::BacktraceStatus::Captured => format!("stack backtrace:\n{bt}"),
                _ => "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
                    .to_string(),
            };
            eprint!(
                "\nthread '{name}' (corewise user thread, core {}){at}:\n{msg}\n{tail}",
                slot.core().index
            );
        }));
    });
}
