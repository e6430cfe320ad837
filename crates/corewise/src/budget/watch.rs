//! Keeping the budget current for the runtime.
//!
//! Reading the budget walks a dozen small files, far too slow for a
//! dispatcher loop, and limits change rarely (an orchestrator resizes a
//! container). So the figure lives in atomics: one `AtomicUsize` load gives
//! a kernel thread the current core count. Either a background OS thread
//! re-reads it every interval ([`WatcherBuilder::spawn`]), or the runtime
//! calls [`BudgetHandle::refresh_if_due`] from a loop it already has, which
//! costs a clock read and one atomic load until the interval has passed and
//! then lets exactly one caller do the reading (`try_lock`, nobody waits).
//!
//! A failed re-read keeps the last good budget and records the error
//! ([`BudgetHandle::last_error`]): a cgroup file vanishing for a moment must
//! not shrink or stop the runtime.
//!
//! With a neighbour share configured the watcher also updates a
//! [`NeighbourShare`] every window and publishes
//! `active = min(budget, neighbour cap)` in a second atomic.
//!
//! **Nothing while idle.** A runtime that reports its dispatchers
//! ([`BudgetHandle::track_activity`], then `dispatcher_awake` /
//! `dispatcher_asleep` around every kernel sleep) lets the watcher thread
//! block on a futex while every dispatcher sleeps: no `/proc` or cgroup
//! reads, no timer wakeups. The first dispatcher to wake wakes it; it then
//! starts a fresh share window (a window spanning the pause would read as
//! a tiny share) and re-reads the budget if a re-read fell due meanwhile.
//! The count is one atomic add per kernel sleep and wake, which already
//! cost a system call each; the futex wake is only issued on the 0 → 1
//! transition while the watcher waits.
//!
//! **No wakeup of its own for a share window.** A busy runtime's handoff
//! monitor wakes every 10 ms anyway (its bound for finding a core blocked
//! in the kernel); it takes the share samples and the budget re-reads on
//! those wakeups (the crate-internal `share_tick_if_due` and
//! `budget_tick_if_due`), and the watcher thread keeps only a backstop: it
//! does either itself when one is a second late (the monitor got no CPU).
//! In a runtime without the monitor (`blocking_handoff(false)`) the watcher
//! thread does both on its own schedule, a wakeup per window while the
//! runtime is busy. The dispatchers do not sample: a sample reads the
//! process CPU clock, and read there, inside a CPU-bound kernel thread's
//! run, it lengthened the task latency tail of the processes beside it
//! (`docs/architecture.md`, "Samples on the monitor's wakeups").

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{BudgetError, BudgetProbe, CpuBudget, NeighbourConfig, NeighbourShare};

/// How often the budget is re-read unless configured otherwise.
///
/// ```
/// use corewise::budget::{BudgetWatcher, DEFAULT_REFRESH_INTERVAL};
/// use std::time::Duration;
/// assert_eq!(DEFAULT_REFRESH_INTERVAL, Duration::from_secs(1));
/// // A watcher with the default interval has nothing due for a second.
/// let w = BudgetWatcher::builder().build().unwrap();
/// assert!(!w.handle().refresh_if_due());
/// ```
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Set in [`Shared::awake`] when the watcher stops, so that a waiting
/// watcher's futex word is no longer 0.
const STOPPING: u32 = 1 << 31;

/// A futex wake count that wakes every waiter (the watcher and the handoff
/// monitor): the kernel reads the count as a signed int, so `u32::MAX`
/// would be -1 and wake one.
const WAKE_ALL: u32 = i32::MAX as u32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Worker {
    probe: BudgetProbe,
    interval: Duration,
    neighbour: Option<NeighbourShare>,
    next_budget: Instant,
    next_share: Option<Instant>,
    /// The runtime was idle at a tick (or the watcher waited while it
    /// was): the next busy tick starts a fresh share window instead of
    /// sampling one that spans the pause.
    paused: bool,
}

struct Shared {
    epoch: Instant,
    cores: AtomicUsize,
    active: AtomicUsize,
    generation: AtomicU64,
    /// Nanoseconds after `epoch` when the next refresh is due (the earlier
    /// of the two below).
    next_due_ns: AtomicU64,
    /// Nanoseconds after `epoch` when the next share window ends
    /// (`u64::MAX`: no neighbour share).
    next_share_ns: AtomicU64,
    /// Nanoseconds after `epoch` when the next budget re-read is due.
    next_budget_ns: AtomicU64,
    /// Budget re-reads and share samples taken.
    reads: AtomicU64,
    /// Times the published `active` changed.
    active_changes: AtomicU64,
    /// Called after `active` changed (the runtime applies the new cap at
    /// once instead of at its next estimation window).
    on_change: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    snapshot: Mutex<Arc<CpuBudget>>,
    last_error: Mutex<Option<Arc<BudgetError>>>,
    worker: Mutex<Worker>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Whether a runtime reports its dispatchers (until then the watcher
    /// never considers itself idle).
    tracking: AtomicBool,
    /// Dispatchers awake (plus [`STOPPING`]); the futex word an idle
    /// watcher waits on for a change from 0.
    awake: AtomicU32,
    /// Whether the watcher thread waits on `awake` (wakers skip the
    /// system call otherwise).
    waiting: AtomicU32,
    /// When the last awake dispatcher went to sleep (ns after `epoch`).
    asleep_at_ns: AtomicU64,
    /// A pause of every dispatcher that outlasted a share window ended:
    /// the next share tick starts a fresh window (the monitor stops
    /// ticking once the runtime has been idle a while, so no tick of its
    /// may see the pause).
    paused_since_tick: AtomicBool,
    /// A pause longer than this counts (the share window; `u64::MAX`:
    /// no neighbour share, nothing to track).
    pause_ns: u64,
    /// Nanoseconds a share window may stay unsampled before the watcher
    /// thread samples it (0: it samples on schedule). Set while the
    /// runtime's handoff monitor samples through `share_tick_if_due`, so
    /// that the watcher thread wakes for the share only if it falls behind.
    share_backstop_ns: AtomicU64,
    /// The same for budget re-reads, set while the handoff monitor does
    /// them on its wakeups (`budget_tick_if_due`).
    budget_backstop_ns: AtomicU64,
}

impl Shared {
    fn nanos_since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn publish(&self, budget: CpuBudget) {
        self.cores.store(budget.cores(), Ordering::Relaxed);
        let mut snap = lock(&self.snapshot);
        if **snap != budget {
            *snap = Arc::new(budget);
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether a tracked runtime has every dispatcher asleep.
    fn is_idle(&self) -> bool {
        self.tracking.load(Ordering::Relaxed) && self.awake.load(Ordering::SeqCst) == 0
    }

    /// Blocks while [`is_idle`](Self::is_idle); returns whether it waited.
    fn wait_while_idle(&self) -> bool {
        if !self.is_idle() {
            return false;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // Dekker with `dispatcher_awake`: it adds to `awake` and then reads
        // `waiting`; this side wrote `waiting` and the futex re-reads
        // `awake` atomically with going to sleep. One of them sees the
        // other.
        while self.awake.load(Ordering::SeqCst) == 0 {
            let _ = rustix::thread::futex::wait(
                &self.awake,
                rustix::thread::futex::Flags::PRIVATE,
                0,
                None,
            );
        }
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Sets a backstop (`share_backstop_ns` or `budget_backstop_ns`); a
    /// watcher thread waiting for a tick on the old terms waits anew.
    fn set_backstop(&self, slot: &AtomicU64, backstop: Duration) {
        let ns = u64::try_from(backstop.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        slot.store(ns, Ordering::Relaxed);
        let _stop = lock(&self.stop);
        self.wake.notify_all();
    }

    /// When the watcher thread takes over the tick due at `due`: that
    /// time plus `backstop` (`None`: nothing due, no neighbour share).
    fn backstopped(&self, due: &AtomicU64, backstop: &AtomicU64) -> Option<Instant> {
        self.instant_of(due)
            .map(|t| t + Duration::from_nanos(backstop.load(Ordering::Relaxed)))
    }

    /// The runtime was idle: the next busy tick starts a fresh share window.
    fn resume(&self) {
        lock(&self.worker).paused = true;
    }

    fn instant_of(&self, ns: &AtomicU64) -> Option<Instant> {
        match ns.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(self.epoch + Duration::from_nanos(n)),
        }
    }

    /// Does whatever is due; returns when the next thing is due.
    ///
    /// While every dispatcher of a tracked runtime sleeps nothing is read
    /// (a tick then only marks the pause); the first tick after it starts a
    /// fresh share window, since one spanning the pause would read as a
    /// tiny share, and re-reads the budget if that fell due meanwhile.
    fn tick(&self, w: &mut Worker, parts: Parts) -> Result<(), Arc<BudgetError>> {
        let now = Instant::now();
        let idle = self.is_idle();
        w.paused |= idle;
        if parts.share && self.paused_since_tick.swap(false, Ordering::Relaxed) {
            w.paused = true;
        }
        let mut result = Ok(());
        let cores_before = self.cores.load(Ordering::Relaxed);
        if parts.force_budget || (parts.budget && !idle && now >= w.next_budget) {
            w.next_budget = now + w.interval;
            self.reads.fetch_add(1, Ordering::Relaxed);
            match w.probe.read() {
                Ok(b) => {
                    let mut restricted = Ok(());
                    if let Some(n) = &mut w.neighbour {
                        n.set_budget(b.cores());
                        restricted = n.restrict_to(b.cpus());
                    }
                    self.publish(b);
                    match restricted {
                        Ok(()) => *lock(&self.last_error) = None,
                        Err(e) => {
                            // The share stays counted over the last set.
                            let e = Arc::new(e);
                            *lock(&self.last_error) = Some(e.clone());
                            result = Err(e);
                        }
                    }
                }
                Err(e) => {
                    // Retried within a second, whatever the interval.
                    w.next_budget = now + w.interval.min(Duration::from_secs(1));
                    let e = Arc::new(e);
                    *lock(&self.last_error) = Some(e.clone());
                    result = Err(e);
                }
            }
        }
        let cores = self.cores.load(Ordering::Relaxed);
        let mut active = cores;
        if let (Some(n), Some(next)) = (&mut w.neighbour, &mut w.next_share) {
            if !parts.share {
                active = n.cap().min(cores);
            } else if cores <= 1 {
                // A cap clamped to [1, 1] says nothing: no sampling (and no
                // wakeups) until a re-read finds a larger budget; that first
                // sample then covers the whole pause, an average to start from.
                // (At least a window ahead: a share-only tick does not move
                // the re-read, which may be due already.)
                *next = w.next_budget.max(now + n.config().window);
            } else if idle || w.paused {
                // Idle: nothing read. Busy after a pause: a fresh window
                // from now. The cap stays as it was either way.
                *next = now + n.config().window;
                active = n.cap().min(cores);
                if !idle && n.rebase().is_ok() {
                    w.paused = false;
                }
            } else if now >= *next {
                *next = now + n.config().window;
                self.reads.fetch_add(1, Ordering::Relaxed);
                match n.update() {
                    Ok(cap) => active = cap.min(cores),
                    Err(e) => {
                        let e = Arc::new(e);
                        *lock(&self.last_error) = Some(e.clone());
                        result = result.and(Err(e));
                    }
                }
            } else {
                active = n.cap().min(cores);
            }
        }
        let active_changed = self.active.swap(active.max(1), Ordering::Relaxed) != active.max(1);
        if active_changed {
            self.active_changes.fetch_add(1, Ordering::Relaxed);
        }
        if active_changed || cores != cores_before {
            if let Some(f) = self.on_change.get() {
                f();
            }
        }
        let mut share_due = w.next_share;
        let mut budget_due = w.next_budget;
        if idle {
            // Nothing is read while idle, so what is overdue cannot be done
            // now: the next tick is a share window (or a budget interval)
            // away, and the first busy one does it. Left in the past, a due
            // time had whoever ticks on it (then the handoff monitor, which
            // slept until it) look every 50 µs while the dispatchers slept:
            // 8 000 wakeups a second on the CPU of a one-core server at
            // 2 000 requests/s.
            let step = match (&w.neighbour, w.next_share) {
                (Some(n), Some(_)) => n.config().window.min(w.interval),
                _ => w.interval,
            };
            share_due = share_due.map(|s| s.max(now + step));
            budget_due = budget_due.max(now + step);
        }
        let share_ns = share_due.map_or(u64::MAX, |s| self.nanos_since_epoch(s));
        let budget_ns = self.nanos_since_epoch(budget_due);
        self.next_share_ns.store(share_ns, Ordering::Relaxed);
        self.next_budget_ns.store(budget_ns, Ordering::Relaxed);
        self.next_due_ns
            .store(share_ns.min(budget_ns), Ordering::Relaxed);
        result
    }
}

/// What a [`Shared::tick`] may do.
#[derive(Debug, Clone, Copy)]
struct Parts {
    /// Re-read the budget if that is due.
    budget: bool,
    /// Re-read the budget whether or not it is due.
    force_budget: bool,
    /// Sample the neighbour share if a window is over.
    share: bool,
}

impl Parts {
    const DUE: Parts = Parts {
        budget: true,
        force_budget: false,
        share: true,
    };
    const FORCED: Parts = Parts {
        budget: true,
        force_budget: true,
        share: true,
    };
    const SHARE: Parts = Parts {
        budget: false,
        force_budget: false,
        share: true,
    };
    const BUDGET: Parts = Parts {
        budget: true,
        force_budget: false,
        share: false,
    };
}

/// A cheap, cloneable reader of a [`BudgetWatcher`]'s figures, for the
/// runtime's kernel threads (`Send + Sync`).
///
/// ```
/// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
/// let h = w.handle().clone();
/// std::thread::spawn(move || assert!(h.cores() >= 1)).join().unwrap();
/// ```
#[derive(Clone)]
pub struct BudgetHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for BudgetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetHandle")
            .field("cores", &self.cores())
            .field("active_cores", &self.active_cores())
            .field("generation", &self.generation())
            .finish()
    }
}

impl BudgetHandle {
    /// The current budget's core count: one relaxed atomic load.
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let w = BudgetWatcher::builder().probe(BudgetProbe::new().max_cores(Some(1))).build().unwrap();
    /// let h = w.handle().clone();
    /// assert_eq!(std::thread::spawn(move || h.cores()).join().unwrap(), 1);
    /// ```
    pub fn cores(&self) -> usize {
        self.shared.cores.load(Ordering::Relaxed)
    }

    /// `min(cores, neighbour cap)` when a neighbour share is configured,
    /// else [`cores`](Self::cores): one relaxed atomic load.
    ///
    /// ```
    /// use corewise::budget::{BudgetWatcher, NeighbourConfig};
    /// let plain = BudgetWatcher::builder().build().unwrap();
    /// assert_eq!(plain.handle().active_cores(), plain.handle().cores()); // no neighbour share
    /// let aware = BudgetWatcher::builder()
    ///     .neighbour(Some(NeighbourConfig::default()))
    ///     .build()
    ///     .unwrap();
    /// let h = aware.handle();
    /// assert!(h.active_cores() >= 1 && h.active_cores() <= h.cores());
    /// ```
    pub fn active_cores(&self) -> usize {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// Increments whenever the published budget changes (CPU list, count
    /// or reason); compare with an old value to notice changes.
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-gen", std::process::id()));
    /// std::fs::create_dir_all(root.join("proc/self")).unwrap();
    /// let probe = BudgetProbe::new().root(&root).max_cores(None).affinity("0-3".parse().unwrap());
    /// let w = BudgetWatcher::builder().probe(probe).build().unwrap();
    /// let h = w.handle();
    /// let seen = h.generation();
    /// h.refresh_now().unwrap();
    /// assert_eq!(h.generation(), seen); // same budget: nothing new
    /// // The process moves into a cgroup with a quota of one CPU.
    /// std::fs::write(root.join("proc/self/cgroup"), "0::/app\n").unwrap();
    /// std::fs::write(root.join("proc/self/mountinfo"), "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n").unwrap();
    /// std::fs::create_dir_all(root.join("sys/fs/cgroup/app")).unwrap();
    /// std::fs::write(root.join("sys/fs/cgroup/app/cpu.max"), "100000 100000\n").unwrap();
    /// h.refresh_now().unwrap();
    /// assert_eq!((h.generation(), h.cores()), (seen + 1, 1));
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// How many times the budget was re-read or the neighbour share
    /// sampled so far (each reads a few files): for cost accounting.
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
    /// let before = w.handle().reads();
    /// w.handle().refresh_now().unwrap();
    /// assert_eq!(w.handle().reads(), before + 1);
    /// ```
    pub fn reads(&self) -> u64 {
        self.shared.reads.load(Ordering::Relaxed)
    }

    /// How many times [`active_cores`](Self::active_cores) changed so far
    /// (a flapping cap shows here).
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
    /// assert_eq!(w.handle().active_changes(), 0);
    /// ```
    pub fn active_changes(&self) -> u64 {
        self.shared.active_changes.load(Ordering::Relaxed)
    }

    /// The whole current budget (takes a short lock).
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetReason, BudgetWatcher};
    /// let w = BudgetWatcher::builder().probe(BudgetProbe::new().max_cores(None)).build().unwrap();
    /// let b = w.handle().snapshot();
    /// assert_eq!(b.cores(), w.handle().cores());
    /// assert!(!matches!(b.reason(), BudgetReason::EnvOverride { .. }));
    /// ```
    pub fn snapshot(&self) -> Arc<CpuBudget> {
        lock(&self.shared.snapshot).clone()
    }

    /// The error of the last re-read, if it failed (the budget then stays
    /// at its last good value).
    ///
    /// ```
    /// use corewise::budget::{BudgetError, BudgetProbe, BudgetWatcher};
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-lasterr", std::process::id()));
    /// std::fs::create_dir_all(root.join("proc/self")).unwrap();
    /// let probe = BudgetProbe::new().root(&root).max_cores(None).affinity("0-3".parse().unwrap());
    /// let w = BudgetWatcher::builder().probe(probe).build().unwrap();
    /// assert!(w.handle().last_error().is_none());
    /// std::fs::write(root.join("proc/self/cgroup"), "garbage\n").unwrap();
    /// assert!(w.handle().refresh_now().is_err());
    /// let err = w.handle().last_error().unwrap();
    /// assert!(matches!(*err, BudgetError::Parse { .. }), "{err}");
    /// assert_eq!(w.cores(), 4); // the last good budget stays
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn last_error(&self) -> Option<Arc<BudgetError>> {
        lock(&self.shared.last_error).clone()
    }

    /// Re-reads what is due, if anything is and no other thread is doing
    /// it; returns whether this call did the work. Until something is due
    /// this is a clock read and one atomic load.
    ///
    /// ```
    /// use std::time::Duration;
    /// let w = corewise::budget::BudgetWatcher::builder()
    ///     .interval(Duration::from_millis(1))
    ///     .build()
    ///     .unwrap();
    /// std::thread::sleep(Duration::from_millis(2));
    /// assert!(w.handle().refresh_if_due());
    /// ```
    pub fn refresh_if_due(&self) -> bool {
        self.tick_if_due(&self.shared.next_due_ns, Parts::DUE)
    }

    /// Does `parts` if the time in `due` has come and no other thread is
    /// ticking; returns whether this call ticked.
    fn tick_if_due(&self, due: &AtomicU64, parts: Parts) -> bool {
        let now = self.shared.nanos_since_epoch(Instant::now());
        if now < due.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(mut w) = self.shared.worker.try_lock() else {
            return false;
        };
        let _ = self.shared.tick(&mut w, parts);
        true
    }

    /// Samples the neighbour share if a window is over and no other thread
    /// is ticking; returns whether this call ticked (it samples, or starts
    /// a fresh window after a pause, or finds the cap clamped to one core
    /// and moves on). Budget re-reads are left to the watcher thread. Until
    /// a window is over this is a clock read and one atomic load.
    pub(crate) fn share_tick_if_due(&self) -> bool {
        self.tick_if_due(&self.shared.next_share_ns, Parts::SHARE)
    }

    /// How long until the current share window ends (zero if it has);
    /// `None` without a neighbour share.
    pub(crate) fn until_share_due(&self) -> Option<Duration> {
        self.shared
            .instant_of(&self.shared.next_share_ns)
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// From now on another thread samples the share on its own wakeups
    /// ([`share_tick_if_due`](Self::share_tick_if_due): the runtime's
    /// handoff monitor) and the watcher thread only samples a window that
    /// is `backstop` late (the monitor got no CPU); it still re-reads the
    /// budget on schedule.
    pub(crate) fn share_ticks_elsewhere(&self, backstop: Duration) {
        self.shared
            .set_backstop(&self.shared.share_backstop_ns, backstop);
    }

    /// From now on another thread re-reads the budget on its own wakeups
    /// ([`budget_tick_if_due`](Self::budget_tick_if_due): the runtime's
    /// handoff monitor, awake every 10 ms or less while the runtime is
    /// busy) and the watcher thread only does a re-read that is
    /// `backstop` late. A thread that wakes once a second to read a dozen
    /// files (~90 µs) held up a ticker beside blocking calls (the
    /// `blocking` benchmark) by about 0.3 ms at the p99, where the
    /// monitor, running often anyway, did not.
    pub(crate) fn budget_ticks_elsewhere(&self, backstop: Duration) {
        self.shared
            .set_backstop(&self.shared.budget_backstop_ns, backstop);
    }

    /// Re-reads the budget if that is due and no other thread is ticking;
    /// returns whether this call ticked.
    pub(crate) fn budget_tick_if_due(&self) -> bool {
        self.tick_if_due(&self.shared.next_budget_ns, Parts::BUDGET)
    }

    /// How long until the next tick is due (zero if it is).
    #[cfg(test)]
    fn until_due(&self) -> Duration {
        self.shared
            .instant_of(&self.shared.next_due_ns)
            .map_or(Duration::MAX, |t| {
                t.saturating_duration_since(Instant::now())
            })
    }

    /// From now on the watcher thread blocks while every dispatcher this
    /// runtime reports is asleep (none is awake until the first
    /// [`dispatcher_awake`](Self::dispatcher_awake)).
    pub(crate) fn track_activity(&self) {
        self.shared.tracking.store(true, Ordering::SeqCst);
    }

    /// Calls `f` (from whichever thread ticks: the watcher's or the
    /// handoff monitor, holding the watcher's state, so it must be quick)
    /// whenever [`active_cores`](Self::active_cores) or
    /// [`cores`](Self::cores) changes; the first call of this sets it.
    pub(crate) fn on_active_change(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.shared.on_change.set(f);
    }

    /// Blocks while this runtime tracks its dispatchers and every one of
    /// them sleeps (the handoff monitor waits here); returns whether it
    /// waited.
    pub(crate) fn wait_while_idle(&self) -> bool {
        self.shared.wait_while_idle()
    }

    /// Whether this runtime tracks its dispatchers and all of them sleep.
    pub(crate) fn all_asleep(&self) -> bool {
        self.shared.is_idle()
    }

    /// A dispatcher starts running or woke from a kernel sleep.
    #[inline]
    pub(crate) fn dispatcher_awake(&self) {
        let shared = &self.shared;
        if shared.awake.fetch_add(1, Ordering::SeqCst) == 0 {
            if shared.waiting.load(Ordering::SeqCst) != 0 {
                rustix::thread::futex::wake(
                    &shared.awake,
                    rustix::thread::futex::Flags::PRIVATE,
                    WAKE_ALL,
                )
                .ok();
            }
            if shared.pause_ns != u64::MAX {
                let since = shared.asleep_at_ns.load(Ordering::Relaxed);
                let now = shared.nanos_since_epoch(Instant::now());
                if now.saturating_sub(since) > shared.pause_ns {
                    shared.paused_since_tick.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// A dispatcher goes to sleep in the kernel or stops running.
    #[inline]
    pub(crate) fn dispatcher_asleep(&self) {
        let shared = &self.shared;
        // A dispatcher that wakes between the count's fall to 0 and this
        // store reads the previous pause's time and may mark a pause that
        // did not happen: one window goes unsampled, nothing else.
        if shared.awake.fetch_sub(1, Ordering::SeqCst) == 1 && shared.pause_ns != u64::MAX {
            let now = shared.nanos_since_epoch(Instant::now());
            shared.asleep_at_ns.store(now, Ordering::Relaxed);
        }
    }

    /// Re-reads the budget now (waiting for a concurrent refresh), and
    /// returns it or the error.
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let w = BudgetWatcher::builder().probe(BudgetProbe::new().max_cores(Some(1))).build().unwrap();
    /// let b = w.handle().refresh_now().unwrap();
    /// assert_eq!(b.cores(), 1);
    /// assert_eq!(*b, *w.snapshot());
    /// ```
    pub fn refresh_now(&self) -> Result<Arc<CpuBudget>, Arc<BudgetError>> {
        let mut w = lock(&self.shared.worker);
        self.shared.tick(&mut w, Parts::FORCED)?;
        drop(w);
        Ok(self.snapshot())
    }
}

/// Settings for a [`BudgetWatcher`].
///
/// ```
/// use corewise::budget::{BudgetProbe, BudgetWatcher, NeighbourConfig};
/// use std::time::Duration;
/// let w = BudgetWatcher::builder()
///     .probe(BudgetProbe::new().max_cores(Some(1)))
///     .interval(Duration::from_millis(100))
///     .neighbour(Some(NeighbourConfig::default()))
///     .build()
///     .unwrap();
/// assert_eq!((w.cores(), w.active_cores()), (1, 1));
/// ```
#[derive(Debug, Clone)]
pub struct WatcherBuilder {
    probe: BudgetProbe,
    interval: Duration,
    neighbour: Option<NeighbourConfig>,
    neighbour_cgroup: Option<std::path::PathBuf>,
}

impl WatcherBuilder {
    /// Reads the budget with `probe` (default: this process,
    /// [`BudgetProbe::new`]).
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-wprobe", std::process::id()));
    /// std::fs::create_dir_all(&root).unwrap();
    /// let probe = BudgetProbe::new().root(&root).max_cores(None).affinity("0-2".parse().unwrap());
    /// let w = BudgetWatcher::builder().probe(probe).build().unwrap();
    /// assert_eq!(w.cores(), 3);
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn probe(mut self, probe: BudgetProbe) -> Self {
        self.probe = probe;
        self
    }

    /// Re-reads the budget every `interval` (default
    /// [`DEFAULT_REFRESH_INTERVAL`]; must be > 0).
    ///
    /// ```
    /// use corewise::budget::{BudgetError, BudgetWatcher};
    /// use std::time::Duration;
    /// let w = BudgetWatcher::builder().interval(Duration::from_millis(1)).build().unwrap();
    /// std::thread::sleep(Duration::from_millis(2));
    /// assert!(w.handle().refresh_if_due()); // a re-read fell due
    /// let zero = BudgetWatcher::builder().interval(Duration::ZERO).build();
    /// assert!(matches!(zero, Err(BudgetError::Config(_))));
    /// ```
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Also tracks the neighbour share with `config` (default: off).
    ///
    /// ```
    /// use corewise::budget::{BudgetWatcher, NeighbourConfig};
    /// use std::time::Duration;
    /// let config = NeighbourConfig { window: Duration::from_millis(2), ..NeighbourConfig::default() };
    /// let w = BudgetWatcher::builder().neighbour(Some(config)).build().unwrap();
    /// std::thread::sleep(Duration::from_millis(3));
    /// assert!(w.handle().refresh_if_due()); // a share window ended
    /// assert!(w.active_cores() >= 1 && w.active_cores() <= w.cores());
    /// ```
    pub fn neighbour(mut self, config: Option<NeighbourConfig>) -> Self {
        self.neighbour = config;
        self
    }

    /// Measures the neighbour share among the processes of cgroup `dir`
    /// (of the v1 `cpuacct` hierarchy) instead of the whole host: see
    /// [`NeighbourShare::host_cgroup`]. The build fails if `dir` has no
    /// `cpuacct.usage`.
    ///
    /// ```
    /// use corewise::budget::{BudgetWatcher, NeighbourConfig};
    /// let built = BudgetWatcher::builder()
    ///     .neighbour(Some(NeighbourConfig::default()))
    ///     .neighbour_cgroup(Some("/nonexistent".into()))
    ///     .build();
    /// assert!(built.is_err());
    /// ```
    pub fn neighbour_cgroup(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.neighbour_cgroup = dir;
        self
    }

    /// A watcher without a thread: the runtime calls
    /// [`BudgetHandle::refresh_if_due`]. Fails if the first read fails.
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
    /// assert!(!w.has_thread()); // the owner calls `refresh_if_due`
    /// assert!(w.cores() >= 1);
    /// ```
    pub fn build(self) -> Result<BudgetWatcher, BudgetError> {
        if self.interval.is_zero() {
            return Err(BudgetError::Config("refresh interval must be > 0".into()));
        }
        let first = self.probe.read()?;
        let mut first_error = None;
        let neighbour = match self.neighbour {
            Some(cfg) => {
                let share = NeighbourShare::new(first.cores(), cfg)?;
                let mut share = match &self.neighbour_cgroup {
                    Some(dir) => share.host_cgroup(dir)?,
                    None => share,
                };
                // Counted over the CPUs the process may use; if that fails
                // the whole host's count stands and the error is kept.
                first_error = share.restrict_to(first.cpus()).err().map(Arc::new);
                Some(share)
            }
            None => None,
        };
        let now = Instant::now();
        let next_share = neighbour.as_ref().map(|n| now + n.config().window);
        let pause_ns = neighbour.as_ref().map_or(u64::MAX, |n| {
            u64::try_from(n.config().window.as_nanos()).unwrap_or(u64::MAX)
        });
        let cores = first.cores();
        let shared = Arc::new(Shared {
            epoch: now,
            cores: AtomicUsize::new(cores),
            active: AtomicUsize::new(cores),
            generation: AtomicU64::new(0),
            next_due_ns: AtomicU64::new(0),
            next_share_ns: AtomicU64::new(u64::MAX),
            next_budget_ns: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            active_changes: AtomicU64::new(0),
            on_change: std::sync::OnceLock::new(),
            snapshot: Mutex::new(Arc::new(first)),
            last_error: Mutex::new(first_error),
            worker: Mutex::new(Worker {
                probe: self.probe,
                interval: self.interval,
                neighbour,
                next_budget: now + self.interval,
                next_share,
                paused: false,
            }),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            tracking: AtomicBool::new(false),
            awake: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            asleep_at_ns: AtomicU64::new(0),
            paused_since_tick: AtomicBool::new(false),
            pause_ns,
            share_backstop_ns: AtomicU64::new(0),
            budget_backstop_ns: AtomicU64::new(0),
        });
        let budget_ns = shared.nanos_since_epoch(now + self.interval);
        let share_ns = next_share.map_or(u64::MAX, |s| shared.nanos_since_epoch(s));
        shared.next_budget_ns.store(budget_ns, Ordering::Relaxed);
        shared.next_share_ns.store(share_ns, Ordering::Relaxed);
        shared
            .next_due_ns
            .store(budget_ns.min(share_ns), Ordering::Relaxed);
        Ok(BudgetWatcher {
            handle: BudgetHandle { shared },
            thread: None,
        })
    }

    /// A watcher with a background OS thread (`corewise-budget`) that
    /// refreshes on schedule; dropping the watcher stops it.
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let w = BudgetWatcher::builder()
    ///     .probe(BudgetProbe::new().max_cores(Some(1)))
    ///     .spawn()
    ///     .unwrap();
    /// assert!(w.has_thread());
    /// assert_eq!(w.cores(), 1);
    /// drop(w); // stops and joins the thread
    /// ```
    pub fn spawn(self) -> Result<BudgetWatcher, BudgetError> {
        let mut watcher = self.build()?;
        let shared = watcher.handle.shared.clone();
        let thread = std::thread::Builder::new()
            .name("corewise-budget".into())
            .spawn(move || loop {
                if shared.wait_while_idle() {
                    if *lock(&shared.stop) {
                        return;
                    }
                    shared.resume();
                }
                {
                    let mut w = lock(&shared.worker);
                    // With a backstop another thread ticks (the handoff
                    // monitor): the thread does only what is that late.
                    let late = |due: &AtomicU64, backstop: &AtomicU64| {
                        backstop.load(Ordering::Relaxed) == 0
                            || shared
                                .backstopped(due, backstop)
                                .is_some_and(|t| Instant::now() >= t)
                    };
                    let share = late(&shared.next_share_ns, &shared.share_backstop_ns);
                    let budget = late(&shared.next_budget_ns, &shared.budget_backstop_ns);
                    // A failed read keeps the last good figures (`last_error`
                    // tells) and is retried within a second (see `tick`).
                    let _ = shared.tick(
                        &mut w,
                        Parts {
                            share,
                            budget,
                            force_budget: false,
                        },
                    );
                }
                let mut stop = lock(&shared.stop);
                loop {
                    if *stop {
                        return;
                    }
                    let now = Instant::now();
                    let budget = shared
                        .backstopped(&shared.next_budget_ns, &shared.budget_backstop_ns)
                        .unwrap_or(now);
                    let share =
                        shared.backstopped(&shared.next_share_ns, &shared.share_backstop_ns);
                    let until = share.map_or(budget, |s| s.min(budget));
                    if now >= until {
                        break;
                    }
                    stop = shared
                        .wake
                        .wait_timeout(stop, until - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            })
            .map_err(BudgetError::Thread)?;
        watcher.thread = Some(thread);
        Ok(watcher)
    }
}

/// Keeps a [`CpuBudget`] (and optionally a neighbour cap) current.
///
/// ```
/// use corewise::budget::BudgetWatcher;
/// let watcher = BudgetWatcher::spawn().unwrap(); // re-reads every second
/// let h = watcher.handle().clone();
/// // In each kernel thread's loop:
/// let allowed = h.cores();
/// assert_eq!(allowed, watcher.snapshot().cores());
/// ```
#[derive(Debug)]
pub struct BudgetWatcher {
    handle: BudgetHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BudgetWatcher {
    /// Settings, starting from this process, a 1 s interval and no
    /// neighbour share.
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let w = BudgetWatcher::builder().probe(BudgetProbe::new().max_cores(Some(1))).build().unwrap();
    /// assert_eq!(w.cores(), 1);
    /// assert!(!w.has_thread());
    /// ```
    pub fn builder() -> WatcherBuilder {
        WatcherBuilder {
            probe: BudgetProbe::new(),
            interval: DEFAULT_REFRESH_INTERVAL,
            neighbour: None,
            neighbour_cgroup: None,
        }
    }

    /// `builder().spawn()`: this process, re-read every second by a
    /// background thread.
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::spawn().unwrap();
    /// assert!(w.has_thread());
    /// assert_eq!(w.cores(), w.snapshot().cores());
    /// ```
    pub fn spawn() -> Result<Self, BudgetError> {
        Self::builder().spawn()
    }

    /// The reader to hand to kernel threads.
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
    /// let h = w.handle().clone(); // for another thread
    /// let cores = std::thread::spawn(move || h.cores()).join().unwrap();
    /// assert_eq!(cores, w.cores());
    /// ```
    pub fn handle(&self) -> &BudgetHandle {
        &self.handle
    }

    /// See [`BudgetHandle::cores`].
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetWatcher};
    /// let w = BudgetWatcher::builder().probe(BudgetProbe::new().max_cores(Some(1))).build().unwrap();
    /// assert_eq!(w.cores(), 1);
    /// ```
    pub fn cores(&self) -> usize {
        self.handle.cores()
    }

    /// See [`BudgetHandle::active_cores`].
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
    /// assert_eq!(w.active_cores(), w.cores()); // no neighbour share configured
    /// ```
    pub fn active_cores(&self) -> usize {
        self.handle.active_cores()
    }

    /// See [`BudgetHandle::snapshot`].
    ///
    /// ```
    /// let w = corewise::budget::BudgetWatcher::builder().build().unwrap();
    /// let b = w.snapshot();
    /// assert_eq!(b.cores(), w.cores());
    /// assert!(b.cores() <= b.cpus().len());
    /// ```
    pub fn snapshot(&self) -> Arc<CpuBudget> {
        self.handle.snapshot()
    }

    /// Whether a background thread refreshes this watcher.
    ///
    /// ```
    /// use corewise::budget::BudgetWatcher;
    /// assert!(BudgetWatcher::spawn().unwrap().has_thread());
    /// assert!(!BudgetWatcher::builder().build().unwrap().has_thread());
    /// ```
    pub fn has_thread(&self) -> bool {
        self.thread.is_some()
    }
}

impl Drop for BudgetWatcher {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let shared = &self.handle.shared;
            *lock(&shared.stop) = true;
            shared.wake.notify_all();
            shared.awake.fetch_or(STOPPING, Ordering::SeqCst);
            rustix::thread::futex::wake(
                &shared.awake,
                rustix::thread::futex::Flags::PRIVATE,
                WAKE_ALL,
            )
            .ok();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_up_changes() {
        // The override is fixed per probe, so swap probes through a fresh
        // watcher: check refresh bookkeeping instead.
        let w = BudgetWatcher::builder()
            .probe(BudgetProbe::new().max_cores(Some(1)))
            .interval(Duration::from_millis(5))
            .build()
            .unwrap();
        let h = w.handle().clone();
        assert_eq!(h.cores(), 1);
        assert_eq!(h.active_cores(), 1);
        assert!(!h.refresh_if_due());
        std::thread::sleep(Duration::from_millis(10));
        assert!(h.refresh_if_due());
        assert_eq!(h.generation(), 0, "same budget, no new generation");
        assert!(h.last_error().is_none());
        assert_eq!(h.refresh_now().unwrap().cores(), 1);
    }

    #[test]
    fn failed_reread_keeps_last_good() {
        let dir = std::env::temp_dir().join(format!("corewise-watch-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("proc/self")).unwrap();
        let probe = BudgetProbe::new()
            .root(&dir)
            .max_cores(None)
            .affinity("0-3".parse().unwrap());
        let w = WatcherBuilder {
            probe,
            interval: Duration::from_secs(3600),
            neighbour: None,
            neighbour_cgroup: None,
        }
        .build()
        .unwrap();
        assert_eq!(w.cores(), 4);
        std::fs::write(dir.join("proc/self/cgroup"), "garbage\n").unwrap();
        assert!(w.handle().refresh_now().is_err());
        assert!(w.handle().last_error().is_some());
        assert_eq!(w.cores(), 4);
        std::fs::remove_file(dir.join("proc/self/cgroup")).unwrap();
        assert!(w.handle().refresh_now().is_ok());
        assert!(w.handle().last_error().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_core_budget_does_not_sample_the_neighbour_share() {
        let dir = std::env::temp_dir().join(format!("corewise-watch-one-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("proc/self")).unwrap();
        let watcher = |cores| {
            WatcherBuilder {
                probe: BudgetProbe::new()
                    .root(&dir)
                    .max_cores(Some(cores))
                    .affinity("0-3".parse().unwrap()),
                interval: Duration::from_secs(3600),
                neighbour: Some(NeighbourConfig::default()),
                neighbour_cgroup: None,
            }
            .build()
            .unwrap()
        };
        let (one, two) = (watcher(1), watcher(2));
        assert_eq!((one.cores(), two.cores()), (1, 2));
        let window = NeighbourConfig::default().window;
        // The first window is due in both; after it only the 2-core
        // watcher has another window due, the 1-core one waits for its
        // next budget re-read.
        for round in 0..2 {
            std::thread::sleep(window + Duration::from_millis(5));
            assert!(two.handle().refresh_if_due(), "round {round}");
            assert_eq!(one.handle().refresh_if_due(), round == 0, "round {round}");
        }
        assert_eq!(one.active_cores(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn thread_runs_and_stops() {
        let w = BudgetWatcher::builder()
            .interval(Duration::from_millis(2))
            .neighbour(Some(NeighbourConfig::default()))
            .spawn()
            .unwrap();
        assert!(w.has_thread());
        std::thread::sleep(Duration::from_millis(30));
        assert!(w.active_cores() >= 1 && w.active_cores() <= w.cores());
        drop(w);
        assert!(BudgetWatcher::builder()
            .interval(Duration::ZERO)
            .build()
            .is_err());
    }

    #[test]
    fn idle_runtime_reads_nothing() {
        let w = BudgetWatcher::builder()
            .probe(BudgetProbe::new().max_cores(Some(2)))
            .interval(Duration::from_millis(5))
            .neighbour(Some(NeighbourConfig::default()))
            .spawn()
            .unwrap();
        let h = w.handle().clone();
        // Untracked: reads on schedule.
        let r0 = h.reads();
        std::thread::sleep(Duration::from_millis(60));
        assert!(h.reads() > r0, "an untracked watcher must keep reading");
        // Tracked with no dispatcher awake: the thread blocks.
        h.track_activity();
        let idle_since = std::time::Instant::now();
        while w.handle().shared.waiting.load(Ordering::SeqCst) == 0 {
            assert!(
                idle_since.elapsed() < Duration::from_secs(5),
                "never blocked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let r1 = h.reads();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(h.reads(), r1, "read while idle");
        // A dispatcher wakes: reading resumes at once.
        h.dispatcher_awake();
        let r2 = h.reads();
        let woke = std::time::Instant::now();
        while h.reads() == r2 {
            assert!(woke.elapsed() < Duration::from_secs(5), "did not resume");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(w.handle().shared.waiting.load(Ordering::SeqCst), 0);
        // Asleep again, then dropped while blocked: the thread stops.
        h.dispatcher_asleep();
        while w.handle().shared.waiting.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(w);
    }

    /// With a long backstop (set by `set_backstop`) the watcher thread
    /// leaves its ticks to another thread, whose calls `others_tick`
    /// makes; with a short one it takes them over when nobody else ticks.
    fn check_backstop(
        h: &BudgetHandle,
        set_backstop: impl Fn(Duration),
        others_tick: impl FnOnce(),
    ) {
        set_backstop(Duration::from_secs(3600));
        // The thread's wait for its first tick may still run out once.
        std::thread::sleep(Duration::from_millis(20));
        let r0 = h.reads();
        std::thread::sleep(Duration::from_millis(100));
        assert!(h.reads() <= r0 + 1, "the thread kept ticking on schedule");
        others_tick();
        // A short backstop: with nobody else ticking the thread takes over
        // (it re-reads the backstop when its current wait runs out).
        set_backstop(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(50));
        let r1 = h.reads();
        std::thread::sleep(Duration::from_millis(200));
        assert!(h.reads() >= r1 + 3, "the backstop did not tick");
    }

    /// Another thread samples the share (`share_tick_if_due`); the
    /// watcher thread samples only a window that is its backstop late.
    #[test]
    fn a_backstop_leaves_the_share_samples_to_another_thread() {
        let w = two_cpu_share(Duration::from_millis(5)).spawn().unwrap();
        let h = w.handle().clone();
        check_backstop(
            &h,
            |b| h.share_ticks_elsewhere(b),
            || {
                let before = h.reads();
                for _ in 0..10 {
                    std::thread::sleep(Duration::from_millis(6));
                    h.share_tick_if_due();
                }
                let sampled = h.reads() - before;
                assert!(sampled >= 5, "only {sampled} of 10 windows were sampled");
                assert!(!h.share_tick_if_due(), "a window due again at once");
            },
        );
        drop(w);
    }

    /// The handoff monitor re-reads the budget on its wakeups
    /// (`budget_tick_if_due`); the watcher thread does only a re-read that
    /// is its backstop late.
    #[test]
    fn a_budget_backstop_leaves_the_re_reads_to_the_monitor() {
        let w = BudgetWatcher::builder()
            .probe(BudgetProbe::new().max_cores(Some(2)))
            .interval(Duration::from_millis(5))
            .spawn()
            .unwrap();
        let h = w.handle().clone();
        check_backstop(
            &h,
            |b| h.budget_ticks_elsewhere(b),
            || {
                let before = h.reads();
                std::thread::sleep(Duration::from_millis(6));
                assert!(h.budget_tick_if_due());
                assert_eq!(h.reads(), before + 1);
                assert!(!h.budget_tick_if_due(), "a re-read due again at once");
            },
        );
        drop(w);
    }

    /// The monitor samples only while the runtime is awake, so a pause of
    /// every dispatcher that outlasts a window is marked when the first
    /// wakes: the next sample starts a fresh window instead of reading one
    /// that spans the pause as a tiny share. A shorter pause is part of its
    /// window.
    #[test]
    fn a_pause_of_every_dispatcher_longer_than_a_window_is_not_sampled() {
        let window = Duration::from_millis(100);
        let w = two_cpu_share(window).build().unwrap();
        let h = w.handle().clone();
        h.track_activity();
        let over = window + Duration::from_millis(10);
        // The first wake starts a window (there was nothing before it).
        h.dispatcher_awake();
        std::thread::sleep(over);
        assert!(h.share_tick_if_due());
        let r0 = h.reads();
        std::thread::sleep(over);
        assert!(h.share_tick_if_due());
        assert_eq!(h.reads(), r0 + 1, "a busy window was not sampled");
        h.dispatcher_asleep();
        std::thread::sleep(Duration::from_millis(1));
        h.dispatcher_awake();
        std::thread::sleep(over);
        assert!(h.share_tick_if_due());
        assert_eq!(
            h.reads(),
            r0 + 2,
            "a window with a short pause was not sampled"
        );
        h.dispatcher_asleep();
        std::thread::sleep(window + window / 2);
        h.dispatcher_awake();
        assert!(h.share_tick_if_due());
        assert_eq!(
            h.reads(),
            r0 + 2,
            "sampled a window that spans a long pause"
        );
        std::thread::sleep(over);
        assert!(h.share_tick_if_due());
        assert_eq!(h.reads(), r0 + 3);
        h.dispatcher_asleep();
    }

    /// A tick while a tracked runtime sleeps reads nothing, and the first
    /// tick after it starts a fresh share window instead of sampling one
    /// that spans the pause.
    #[test]
    fn ticks_skip_an_idle_pause() {
        let w = tracked_watcher(2, Duration::from_secs(3600));
        let h = w.handle().clone();
        // Nobody awake: due ticks read nothing.
        let r0 = h.reads();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(6));
            assert!(h.refresh_if_due());
        }
        assert_eq!(h.reads(), r0, "read while idle");
        // Awake: the first due tick starts a window, the next one samples.
        h.dispatcher_awake();
        std::thread::sleep(Duration::from_millis(6));
        assert!(h.refresh_if_due());
        assert_eq!(h.reads(), r0, "sampled a window that spans the pause");
        std::thread::sleep(Duration::from_millis(6));
        assert!(h.refresh_if_due());
        assert_eq!(h.reads(), r0 + 1);
        h.dispatcher_asleep();
    }

    /// A tick while the runtime sleeps, with a budget re-read overdue (it
    /// waits for a busy tick), still puts the next tick a window ahead:
    /// the thread that ticks sleeps until then instead of finding a tick
    /// due at once, again and again.
    #[test]
    fn an_idle_tick_moves_the_next_one_ahead() {
        for (cpus, interval) in [(1, 5), (2, 5), (2, 3_600_000)] {
            let w = tracked_watcher(cpus, Duration::from_millis(interval));
            let h = w.handle().clone();
            std::thread::sleep(Duration::from_millis(6));
            assert!(h.refresh_if_due(), "{cpus} CPUs: the first tick was due");
            assert!(
                h.until_due() >= Duration::from_millis(2),
                "{cpus} CPUs, interval {interval} ms: next tick due in {:?} after an idle one",
                h.until_due()
            );
            assert!(!h.refresh_if_due(), "{cpus} CPUs: a tick due again at once");
        }
    }

    /// Two CPUs, a neighbour share sampled every `window`, budget re-reads
    /// out of the way (an hour apart).
    fn two_cpu_share(window: Duration) -> WatcherBuilder {
        BudgetWatcher::builder()
            .probe(
                BudgetProbe::new()
                    .max_cores(Some(2))
                    .affinity("0-1".parse().unwrap()),
            )
            .interval(Duration::from_secs(3600))
            .neighbour(Some(NeighbourConfig {
                window,
                ..NeighbourConfig::default()
            }))
    }

    /// A watcher (no thread) of a runtime that tracks its dispatchers, none
    /// awake yet: `cpus` CPUs, a 5 ms share window, budget re-reads every
    /// `interval`.
    fn tracked_watcher(cpus: usize, interval: Duration) -> BudgetWatcher {
        let config = NeighbourConfig {
            window: Duration::from_millis(5),
            ..NeighbourConfig::default()
        };
        let w = BudgetWatcher::builder()
            .probe(
                BudgetProbe::new()
                    .max_cores(Some(cpus))
                    .affinity(if cpus == 1 { "0" } else { "0-1" }.parse().unwrap()),
            )
            .interval(interval)
            .neighbour(Some(config))
            .build()
            .unwrap();
        w.handle().track_activity();
        w
    }
}
