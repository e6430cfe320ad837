//! The runtime as a client of the `corewise-arbiter` daemon.
//!
//! The daemon owns the machine's managed cores and gives each application
//! whole cores by priority (0 highest); see the `corewise-arbiter` crate. This
//! module maps the runtime's kernel threads onto its client protocol:
//!
//! - **One daemon socket per kernel thread.** Kernel thread `k ≥ 1` opens its
//!   [`CoreThread`] on itself the first time it asks for a core (the daemon
//!   confines the thread id that attached) and sleeps in the daemon's
//!   `block_until_core_available`; it returns confined to the granted core's
//!   cpuset, and the CPU it returns is the granted core.
//! - **`must_release_core` is a memory read** of the shared page the daemon
//!   writes: true only for the kernel thread whose core is asked back, was
//!   taken by force (preempted: the daemon already moved the thread to the
//!   unmanaged set), or, in the runtime's own shutdown. A preempted kernel
//!   thread therefore behaves exactly like one that was asked: its threads
//!   migrate, it reports the release and asks again (the client reads the
//!   daemon's `Preempted` notice on the way).
//! - **Kernel thread 0 is the floor.** An application can hold no managed
//!   core at all (a higher-priority application took the only one, the
//!   daemon is busy, or it has not answered yet), and user threads must
//!   still run. Kernel thread 0 never asks the daemon: it runs the
//!   dispatcher, unconfined (that is, in the daemon's unmanaged set, shared
//!   with everything else), whenever the runtime wants cores but no other
//!   kernel thread holds a healthy (not asked back) daemon core, and gives
//!   its place back as soon as one does. So at most `kthreads - 1` daemon
//!   cores are requested, and the runtime never has zero cores.
//! - **Blocking handoff.** When a kernel thread that holds a daemon core
//!   blocks in the kernel and a spare kernel thread takes the core over
//!   ([`CoreArbiter::core_handed_over`]), the spare sends `ReplaceThread`
//!   on the blocked thread's socket: the daemon moves the spare into the
//!   core's cpuset and the blocked thread out, and from then on the socket
//!   is the spare's. The core stays one core to the daemon.
//! - **Requests.** The runtime sends the policy's desired cores, capped by
//!   the CPU budget, and this arbiter shifts its priority levels by the
//!   application's priority ([`Builder::priority`](crate::Builder::priority)):
//!   the runtime's level `i` is the daemon's level `priority + i` (clamped to
//!   the lowest). A request is only sent when it changes.
//!
//! **Noticing a release while asleep.** The daemon asks for a core by
//! writing the shared page and takes it by force after its reclaim timeout
//! (10 ms by default); it does not wake the application. An idle dispatcher
//! sleeps on its futex or ring, so it would not look at the page. Two ways
//! out: the daemon could futex-wake a word in the page (a protocol change
//! in the daemon, and a wake per release for every holder), or the
//! dispatcher sleeps with a bounded timeout while it holds a daemon core.
//! This module takes the second ([`CoreArbiter::release_poll`], default
//! [`DEFAULT_RELEASE_POLL`] = 2 ms, well inside the 10 ms timeout): it
//! needs nothing from the daemon, and costs an idle core one futex timeout
//! and a re-scan of its slots every 2 ms, about 500 wakeups a second per
//! idle core. Measured (`tests/daemon.rs`, `idle_cpu_cost`, debug build, on
//! a loaded 2-CPU machine, the in-process daemon thread counted too): an
//! idle runtime costs about 4.5 % of one CPU with the daemon against 0.8 %
//! with `Local`, so the futex wake is the better long-term answer if idle
//! cost matters. Busy dispatchers read the page on every rotation anyway.
//!
//! **The daemon going away.** The runtime notices when a socket to the
//! daemon reaches end-of-file or fails (the daemon exited, or crashed:
//! kill -9 closes its sockets too), or when the daemon announces an orderly
//! exit in the shared page. It logs the loss once, at warn level, and from
//! then on runs on its CPU budget without the daemon:
//!
//! - it no longer believes it holds any daemon core: every kernel thread
//!   that held one is told to release it (`must_release_core`), so its user
//!   threads migrate as after any release;
//! - each kernel thread, the next time it asks for a core, leaves the dead
//!   daemon's cpusets for the daemon's cgroup root and widens its affinity
//!   to the budget's CPUs ([`super::escape`]; without the right to write the
//!   cgroup files it runs where it is);
//! - kernel threads `1..=wanted` then run without a grant, like the
//!   in-process arbiter's, so the runtime keeps the cores its policy wants
//!   within its budget (the floor steps back as usual);
//! - every estimation window the core manager's request tries to connect
//!   again, with a backoff from 50 ms doubling to 2 s (no busy loop; a
//!   daemon that is still down costs one failed `connect` per attempt).
//!   Once a daemon answers, the runtime registers again and sends its
//!   request; the kernel threads running without a grant are told to
//!   release, and attach their threads to the new daemon when they ask for
//!   a core again. Answers still in flight from the old connection are
//!   recognised by its generation and ignored.
//!
//! Why reconnect rather than stay unmanaged: a daemon restarted by its
//! service manager re-partitions the machine; an application that never
//! comes back would run unconfined beside the applications it does
//! manage, and take cores it is no longer told to give back.
//!
//! ```no_run
//! // A runtime whose cores come from the daemon at /run/corewise-arbiter.sock,
//! // at priority 2 (0 is the highest).
//! let rt = corewise::Runtime::builder()
//!     .arbiter_socket("/run/corewise-arbiter.sock")
//!     .priority(2)
//!     .build()?;
//! assert_eq!(rt.arbiter_kind(), corewise::arbiter::ArbiterKind::Daemon);
//! # Ok::<(), corewise::BuildError>(())
//! ```

use super::{ArbiterError, ArbiterKind, CoreArbiter};
use crate::policy::PRIORITIES;
use corewise_arbiter::client::{Client, ClientError, CoreThread};
use corewise_arbiter::protocol::PRIORITY_LEVELS;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an idle dispatcher sleeps at most before it reads the shared
/// page again (see the module docs for the trade-off).
///
/// ```
/// use corewise::arbiter::{CoreArbiter, Local, DEFAULT_RELEASE_POLL};
/// use std::time::Duration;
/// assert_eq!(DEFAULT_RELEASE_POLL, Duration::from_millis(2));
/// // The daemon's client polls this often; the in-process arbiter tells its
/// // kernel threads itself and needs no bound.
/// assert_eq!(Local::new(vec![0]).release_poll(), None);
/// ```
pub const DEFAULT_RELEASE_POLL: Duration = Duration::from_millis(2);

/// The same bound while the daemon is gone: kernel threads running without
/// a grant look for a reconnection this often.
const GONE_POLL: Duration = Duration::from_millis(50);

/// First and longest wait between two attempts to reach a lost daemon.
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// When to try reaching a lost daemon next.
struct Retry {
    next: Instant,
    backoff: Duration,
}

/// The kernel thread that runs when no daemon core is held.
const FLOOR: usize = 0;

/// A kernel thread's side of the protocol.
#[derive(Default)]
struct Slot {
    /// Its daemon socket; only the kernel thread that owns core `k` locks
    /// it (and never contends: the runtime calls the arbiter for `k` only
    /// from `k`'s owner, which after a handoff is the spare that took the
    /// core over; the owner it replaced is blocked in user code, not here).
    thread: Mutex<Option<CoreThread>>,
    /// A duplicate of the socket, so that [`CoreArbiter::shutdown`] can wake
    /// the kernel thread out of its blocking read.
    interrupt: Mutex<Option<OwnedFd>>,
    /// Holds a daemon core now.
    holding: AtomicBool,
    /// ... which the daemon wants back (as last seen by its dispatcher).
    releasing: AtomicBool,
    /// Runs without a grant, on the budget, while the daemon is gone.
    local: AtomicBool,
    /// Has left the dead daemon's cpusets since the loss.
    escaped: AtomicBool,
    /// The connection generation its socket belongs to.
    generation: AtomicU64,
}

/// The [`CoreArbiter`] backed by the `corewise-arbiter` daemon (see the
/// module docs).
///
/// ```no_run
/// // Needs a `corewise-arbiter` daemon listening on the socket; the doctest
/// // only compiles.
/// use corewise::arbiter::{ArbiterKind, CoreArbiter, Daemon};
/// let d = Daemon::connect("/run/corewise-arbiter.sock", 2, 0)?;
/// assert_eq!(d.kind(), ArbiterKind::Daemon);
/// assert!(!d.daemon_gone());
/// # Ok::<(), corewise::arbiter::ArbiterError>(())
/// ```
pub struct Daemon {
    socket: PathBuf,
    /// The application's connection; taken at shutdown.
    client: Mutex<Option<Client>>,
    priority: usize,
    slots: Box<[Slot]>,
    /// Cores the runtime wants, before the cap of daemon-capable threads.
    wanted: AtomicUsize,
    last_sent: Mutex<Option<[u32; PRIORITY_LEVELS]>>,
    floor_active: AtomicBool,
    /// The daemon is gone (or shutting down): the runtime runs on its budget
    /// and tries to reconnect.
    gone: AtomicBool,
    /// Counts connections to the daemon; news from an older one is stale.
    generation: AtomicU64,
    retry: Mutex<Retry>,
    /// The CPU budget, for kernel threads leaving a dead daemon's cpusets.
    cpus: Vec<usize>,
    shutdown: AtomicBool,
    release_poll: Duration,
    lock: Mutex<()>,
    changed: Condvar,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("socket", &self.socket)
            .field("priority", &self.priority)
            .field("kthreads", &self.slots.len())
            .field("granted", &self.granted())
            .field("gone", &self.gone.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Daemon {
    /// Registers the application with the daemon at `socket`, for a runtime
    /// of `kthreads` kernel threads asking at `priority` (0 highest; values
    /// past the lowest level are clamped to it).
    ///
    /// ```no_run
    /// use corewise::arbiter::{CoreArbiter, Daemon};
    /// let d = Daemon::connect("/run/corewise-arbiter.sock", 2, 0)?;
    /// d.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
    /// # Ok::<(), corewise::arbiter::ArbiterError>(())
    /// ```
    pub fn connect(
        socket: impl AsRef<Path>,
        kthreads: usize,
        priority: usize,
    ) -> Result<Self, ArbiterError> {
        let socket = socket.as_ref().to_path_buf();
        let client = Client::connect(&socket)?;
        Ok(Self {
            socket,
            client: Mutex::new(Some(client)),
            priority: priority.min(PRIORITY_LEVELS - 1),
            slots: (0..kthreads.max(1)).map(|_| Slot::default()).collect(),
            wanted: AtomicUsize::new(0),
            last_sent: Mutex::new(None),
            floor_active: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            retry: Mutex::new(Retry {
                next: Instant::now(),
                backoff: RECONNECT_FIRST,
            }),
            cpus: Vec::new(),
            shutdown: AtomicBool::new(false),
            release_poll: DEFAULT_RELEASE_POLL,
            lock: Mutex::new(()),
            changed: Condvar::new(),
        })
    }

    /// The same arbiter for a runtime of `kthreads` kernel threads (call it
    /// before the runtime starts them).
    ///
    /// ```no_run
    /// // Needs a `corewise-arbiter` daemon listening on the socket; the doctest
    /// // only compiles.
    /// use corewise::arbiter::{CoreArbiter, Daemon};
    /// let d = Daemon::connect("/run/corewise-arbiter.sock", 1, 0)?.with_kthreads(4);
    /// d.set_requested_cores([4, 0, 0, 0, 0, 0, 0, 0]);
    /// assert!(d.daemon_cores() <= 3); // kernel thread 0 is the floor, not a daemon core
    /// # Ok::<(), corewise::arbiter::ArbiterError>(())
    /// ```
    pub fn with_kthreads(mut self, kthreads: usize) -> Self {
        self.slots = (0..kthreads.max(1)).map(|_| Slot::default()).collect();
        self
    }

    /// The same arbiter for a runtime whose CPU budget is `cpus` (where its
    /// kernel threads go when the daemon is lost).
    pub(crate) fn with_cpus(mut self, cpus: Vec<usize>) -> Self {
        self.cpus = cpus;
        self
    }

    /// Whether the daemon is known to be gone (it closed a connection or
    /// announced its exit) and not reconnected yet.
    ///
    /// ```no_run
    /// // Needs a `corewise-arbiter` daemon listening on the socket; the doctest
    /// // only compiles.
    /// use corewise::arbiter::Daemon;
    /// let d = Daemon::connect("/run/corewise-arbiter.sock", 2, 0)?;
    /// assert!(!d.daemon_gone()); // connected just now
    /// # Ok::<(), corewise::arbiter::ArbiterError>(())
    /// ```
    pub fn daemon_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Daemon cores held now (the floor not counted).
    ///
    /// ```no_run
    /// // Needs a `corewise-arbiter` daemon listening on the socket; the doctest
    /// // only compiles.
    /// use corewise::arbiter::{CoreArbiter, Daemon};
    /// let d = Daemon::connect("/run/corewise-arbiter.sock", 2, 0)?;
    /// assert_eq!(d.daemon_cores(), 0); // nothing asked for yet
    /// # Ok::<(), corewise::arbiter::ArbiterError>(())
    /// ```
    pub fn daemon_cores(&self) -> usize {
        self.slots
            .iter()
            .skip(1)
            .filter(|s| s.holding.load(Ordering::Acquire))
            .count()
    }

    fn notify(&self) {
        let _g = lock(&self.lock);
        self.changed.notify_all();
    }

    /// Daemon cores held and not asked back.
    fn healthy(&self) -> usize {
        self.slots
            .iter()
            .skip(1)
            .filter(|s| s.holding.load(Ordering::Acquire) && !s.releasing.load(Ordering::Acquire))
            .count()
    }

    fn floor_wanted(&self) -> bool {
        !self.shutdown.load(Ordering::Acquire)
            && self.wanted.load(Ordering::Acquire) > 0
            && self.healthy() == 0
    }

    /// Records that the daemon of connection `generation` is gone; logs it
    /// once per loss. News about an older connection is ignored.
    fn lost(&self, generation: u64, why: &dyn std::fmt::Display) {
        // Lock order: `retry`, then `client`, then `last_sent`.
        let first = {
            let mut client = lock(&self.client);
            if generation != self.generation.load(Ordering::Acquire) {
                return;
            }
            let first = !self.gone.swap(true, Ordering::AcqRel);
            if first {
                client.take();
            }
            first
        };
        if first && !self.shutdown.load(Ordering::Acquire) {
            tracing::warn!(
                socket = %self.socket.display(),
                reason = %why,
                "core arbiter daemon lost; running on the CPU budget without it, reconnecting"
            );
            *lock(&self.retry) = Retry {
                next: Instant::now() + RECONNECT_FIRST,
                backoff: RECONNECT_FIRST,
            };
        }
        self.notify();
    }

    /// Tries to reach the daemon again, if the backoff allows it now.
    fn try_reconnect(&self) {
        let mut retry = lock(&self.retry);
        let now = Instant::now();
        if now < retry.next {
            return;
        }
        match Client::connect(&self.socket) {
            Ok(c) => {
                let mut client = lock(&self.client);
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                *client = Some(c);
                self.generation.fetch_add(1, Ordering::AcqRel);
                self.gone.store(false, Ordering::Release);
                self.slots[FLOOR].escaped.store(false, Ordering::Release);
                drop(client);
                *lock(&self.last_sent) = None;
                tracing::info!(socket = %self.socket.display(), "core arbiter daemon is back; registered again");
                self.notify();
            }
            Err(e) => {
                retry.backoff = (retry.backoff * 2).min(RECONNECT_MAX);
                retry.next = now + retry.backoff;
                tracing::debug!(error = %e, retry_in = ?retry.backoff, "core arbiter daemon still unreachable");
            }
        }
    }

    fn block_floor(&self) -> Option<usize> {
        let mut g = lock(&self.lock);
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            // The floor never attaches, but the daemon put it in its
            // unmanaged set, which a crash leaves without the granted CPUs.
            if self.gone.load(Ordering::Acquire)
                && !self.slots[FLOOR].escaped.swap(true, Ordering::AcqRel)
            {
                super::escape::leave_daemon_cpusets(&self.cpus);
            }
            if self.floor_wanted() {
                self.floor_active.store(true, Ordering::Release);
                return Some(rustix::thread::sched_getcpu());
            }
            // Every change that matters notifies; the timeout is a backstop.
            g = self
                .changed
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sleeps until something changes (or a backstop timeout).
    fn wait_changed(&self) {
        let g = lock(&self.lock);
        if !self.shutdown.load(Ordering::Acquire) {
            let _ = self.changed.wait_timeout(g, Duration::from_millis(100));
        }
    }

    /// Opens kernel thread `slot`'s socket (on the calling kernel thread).
    fn attach(&self, slot: &Slot) -> Result<CoreThread, (u64, ClientError)> {
        let (client, generation) = {
            let c = lock(&self.client);
            (c.clone(), self.generation.load(Ordering::Acquire))
        };
        let client = client.ok_or((generation, ClientError::DaemonGone))?;
        slot.generation.store(generation, Ordering::Release);
        let t = client.thread().map_err(|e| (generation, e))?;
        let dup = t
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| (generation, e.into()))?;
        *lock(&slot.interrupt) = Some(dup);
        Ok(t)
    }

    /// Kernel thread `kthread` while the daemon is gone: out of its
    /// cpusets, then run without a grant if the runtime wants that many
    /// cores. `Some(cpu)`: run now.
    fn run_without_daemon(&self, kthread: usize, slot: &Slot) -> Option<usize> {
        if !slot.escaped.swap(true, Ordering::AcqRel) {
            super::escape::leave_daemon_cpusets(&self.cpus);
        }
        if kthread > self.wanted.load(Ordering::Acquire) {
            return None;
        }
        slot.releasing.store(false, Ordering::Release);
        slot.local.store(true, Ordering::Release);
        slot.holding.store(true, Ordering::Release);
        self.notify();
        Some(rustix::thread::sched_getcpu())
    }
}

impl CoreArbiter for Daemon {
    fn set_requested_cores(&self, per_priority: [u32; PRIORITIES]) {
        let total: usize = per_priority.iter().map(|&n| n as usize).sum();
        self.wanted.store(total, Ordering::Release);
        // Kernel thread 0 is the floor: the others can hold daemon cores.
        let mut left = total.min(self.slots.len() - 1) as u32;
        let mut counts = [0u32; PRIORITY_LEVELS];
        for (i, &n) in per_priority.iter().enumerate() {
            let take = n.min(left);
            left -= take;
            counts[(self.priority + i).min(PRIORITY_LEVELS - 1)] += take;
        }
        if self.gone.load(Ordering::Acquire) && !self.shutdown.load(Ordering::Acquire) {
            // Called every estimation window: the reconnection's clock.
            self.try_reconnect();
        }
        if !self.gone.load(Ordering::Acquire) && !self.shutdown.load(Ordering::Acquire) {
            // A daemon that died while no kernel thread waited on a socket
            // is noticed here, within one estimation window.
            let (client, generation) = {
                let c = lock(&self.client);
                (c.clone(), self.generation.load(Ordering::Acquire))
            };
            if client.is_some_and(|c| !c.is_connected()) {
                self.lost(generation, &"the connection was closed");
            }
        }
        if !self.gone.load(Ordering::Acquire) && !self.shutdown.load(Ordering::Acquire) {
            let mut last = lock(&self.last_sent);
            if *last != Some(counts) {
                let (client, generation) = {
                    let c = lock(&self.client);
                    (c.clone(), self.generation.load(Ordering::Acquire))
                };
                if let Some(client) = client {
                    match client.set_requested_cores(counts) {
                        Ok(ack) => {
                            if ack.clipped {
                                tracing::info!(requested = ?counts, effective = ?ack.effective, "core request clipped by the arbiter's limits");
                            }
                            *last = Some(counts);
                        }
                        Err(e) => {
                            drop(last);
                            self.lost(generation, &e);
                        }
                    }
                }
            }
        }
        self.notify();
    }

    fn block_until_core_available(&self, kthread: usize) -> Result<Option<usize>, ArbiterError> {
        let slot = self
            .slots
            .get(kthread)
            .ok_or(ArbiterError::NoSuchThread(kthread))?;
        if kthread == FLOOR {
            return Ok(self.block_floor());
        }
        let mut me = lock(&slot.thread);
        loop {
            if self.shutdown.load(Ordering::SeqCst) {
                *me = None;
                return Ok(None);
            }
            if self.gone.load(Ordering::Acquire) {
                *me = None;
                *lock(&slot.interrupt) = None;
                if let Some(cpu) = self.run_without_daemon(kthread, slot) {
                    return Ok(Some(cpu));
                }
                self.wait_changed();
                continue;
            }
            if me.is_none() {
                match self.attach(slot) {
                    Ok(t) => {
                        *me = Some(t);
                        slot.escaped.store(false, Ordering::Release);
                    }
                    Err((generation, e)) => {
                        self.lost(generation, &e);
                        continue;
                    }
                }
                // `shutdown` sets its flag before it looks for sockets to
                // interrupt: either it saw ours, or we see its flag.
                continue;
            }
            let Some(t) = me.as_mut() else { continue };
            match t.block_until_core_available() {
                Ok(core) => {
                    if self.shutdown.load(Ordering::SeqCst) {
                        // Closing the socket gives the core back at once.
                        *me = None;
                        return Ok(None);
                    }
                    slot.releasing.store(false, Ordering::Release);
                    slot.holding.store(true, Ordering::Release);
                    self.notify();
                    return Ok(Some(core as usize));
                }
                Err(e) => {
                    *me = None;
                    *lock(&slot.interrupt) = None;
                    if !self.shutdown.load(Ordering::SeqCst) {
                        self.lost(slot.generation.load(Ordering::Acquire), &e);
                    }
                }
            }
        }
    }

    fn must_release_core(&self, kthread: usize) -> bool {
        if self.shutdown.load(Ordering::Relaxed) {
            return true;
        }
        if kthread == FLOOR {
            return self.healthy() > 0;
        }
        let Some(slot) = self.slots.get(kthread) else {
            return true;
        };
        let release = if slot.local.load(Ordering::Relaxed) {
            // Running without a grant: until the daemon is back, or the
            // runtime wants fewer cores.
            Some(
                !self.gone.load(Ordering::Acquire) || kthread > self.wanted.load(Ordering::Relaxed),
            )
        } else if self.gone.load(Ordering::Relaxed) {
            // A dead daemon's core: the runtime no longer holds it.
            Some(slot.holding.load(Ordering::Relaxed))
        } else {
            None
        };
        if let Some(release) = release {
            if !release {
                slot.releasing.store(false, Ordering::Release);
            } else if !slot.releasing.swap(true, Ordering::AcqRel) {
                // The floor may have to take this core's threads.
                self.notify();
            }
            return release;
        }
        // Never contended (see `Slot::thread`); `try_lock` keeps it so.
        let Ok(me) = slot.thread.try_lock() else {
            return false;
        };
        let Some(t) = me.as_ref() else {
            return false;
        };
        if t.client().daemon_shutting_down() {
            drop(me);
            self.lost(
                slot.generation.load(Ordering::Acquire),
                &"the daemon is shutting down",
            );
            return true;
        }
        let release = t.must_release_core();
        if release != slot.releasing.load(Ordering::Relaxed) {
            slot.releasing.store(release, Ordering::Release);
            if release {
                // The floor may have to take this core's threads.
                self.notify();
            }
        }
        release
    }

    fn core_released(&self, kthread: usize) {
        if kthread == FLOOR {
            self.floor_active.store(false, Ordering::Release);
        } else if let Some(slot) = self.slots.get(kthread) {
            if let Ok(me) = slot.thread.try_lock() {
                if let Some(t) = me.as_ref() {
                    if t.was_preempted() {
                        tracing::debug!(kthread, core = ?t.core(), "core was taken back by force");
                    }
                }
            }
            slot.holding.store(false, Ordering::Release);
            slot.releasing.store(false, Ordering::Release);
            slot.local.store(false, Ordering::Release);
        }
        self.notify();
    }

    fn supports_handoff(&self) -> bool {
        true
    }

    /// Under the daemon, a handed-over core's connection is handed over
    /// too: the daemon confines `tid` to the core's cpuset, moves the
    /// blocked thread back to its unmanaged set, and confines `tid` on
    /// every later grant. The floor (kernel thread 0) holds no daemon
    /// core, so its spare runs unconfined as the floor does; while the
    /// daemon is gone, a spare leaves the dead daemon's cpusets as every
    /// kernel thread running without it does.
    ///
    /// ```no_run
    /// use corewise::arbiter::{CoreArbiter, Daemon};
    /// let d = Daemon::connect("/run/corewise-arbiter.sock", 2, 0)?;
    /// assert!(d.supports_handoff());
    /// # Ok::<(), corewise::arbiter::ArbiterError>(())
    /// ```
    fn core_handed_over(&self, kthread: usize, tid: i32) -> Result<(), ArbiterError> {
        let slot = self
            .slots
            .get(kthread)
            .ok_or(ArbiterError::NoSuchThread(kthread))?;
        if self.shutdown.load(Ordering::SeqCst) {
            return Ok(());
        }
        let gone = self.gone.load(Ordering::Acquire);
        if kthread == FLOOR || gone || slot.local.load(Ordering::Acquire) {
            let caller = rustix::thread::gettid().as_raw_nonzero().get();
            if gone && caller == tid {
                super::escape::leave_daemon_cpusets(&self.cpus);
            }
            return Ok(());
        }
        let new = u32::try_from(tid).map_err(|_| ArbiterError::NoSuchThread(kthread))?;
        let mut me = lock(&slot.thread);
        // Not attached (the daemon came back and no owner of `k` has asked
        // it for a core since): the owner attaches itself when it does.
        let Some(t) = me.as_mut() else {
            return Ok(());
        };
        match t.replace_thread(new) {
            Ok(()) => Ok(()),
            // Refused: nothing changed and the connection stays usable.
            Err(e @ ClientError::Refused(_)) => Err(e.into()),
            Err(e) => {
                *me = None;
                *lock(&slot.interrupt) = None;
                drop(me);
                if !self.shutdown.load(Ordering::SeqCst) {
                    self.lost(slot.generation.load(Ordering::Acquire), &e);
                }
                Err(e.into())
            }
        }
    }

    fn granted(&self) -> usize {
        let floor = self.floor_active.load(Ordering::Acquire) || self.floor_wanted();
        self.daemon_cores() + usize::from(floor)
    }

    fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        for slot in self.slots.iter() {
            if let Some(fd) = lock(&slot.interrupt).as_ref() {
                // The blocked read returns end-of-file; the daemon sees the
                // thread leave and frees whatever it held.
                let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
            }
        }
        // The kernel threads' sockets hold the last clones of the client:
        // the application's connection closes when they are done.
        lock(&self.client).take();
        self.notify();
    }

    fn kind(&self) -> ArbiterKind {
        ArbiterKind::Daemon
    }

    fn release_poll(&self) -> Option<Duration> {
        Some(if self.gone.load(Ordering::Relaxed) {
            GONE_POLL
        } else {
            self.release_poll
        })
    }
}
