//! The runtime: its builder, its shared state, and its kernel threads.
//!
//! A runtime owns one [`Core`] per CPU it may use and one kernel thread per
//! core. Each kernel thread asks the arbiter for its core, runs the
//! dispatcher while it holds it, and gives it back when told (see
//! [`crate::arbiter`]). The shared state is leaked on purpose: a
//! [`ThreadId`](crate::ThreadId) is a pointer to a slot, and leaking the
//! (small) core tables keeps every `ThreadId` safe to signal even after its
//! runtime is gone. The stacks, the big part, are unmapped at shutdown.

use crate::arbiter::{ArbiterChoice, ArbiterKind, CoreArbiter, Local};
use crate::budget::{BudgetWatcher, NeighbourConfig};
use crate::error::{BuildError, JoinError, SpawnError};
use crate::policy::{
    CoreLoad, CorePolicy, DefaultPolicy, PolicyConfig, RuntimePolicy, ThreadClass, PRIORITIES,
};
use crate::sched::{Core, ThreadContext};
use crate::shim::{AtomicBool, AtomicU64, Ordering};
use crate::thread::{Builder as ThreadBuilder, JoinHandle};
use std::time::{Duration, Instant};

/// Default user-thread stack size.
///
/// ```
/// assert_eq!(corewise::DEFAULT_STACK_SIZE, 256 * 1024);
/// // With the default stack a user thread can hold a 64 KiB array on it.
/// let rt = corewise::Runtime::new().unwrap();
/// let sum = rt
///     .block_on(|| {
///         let buf = std::hint::black_box([1u8; 64 * 1024]);
///         buf.iter().map(|&b| b as usize).sum::<usize>()
///     })
///     .unwrap();
/// assert_eq!(sum, 64 * 1024);
/// ```
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;
/// Default time a core with nothing to run spins before it sleeps.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(corewise::DEFAULT_IDLE_SPIN, Duration::from_micros(50));
/// // Twice the default: quicker wakeups after short idle gaps, more CPU burnt.
/// let rt = corewise::Runtime::builder()
///     .idle_spin(corewise::DEFAULT_IDLE_SPIN * 2)
///     .build()
///     .unwrap();
/// assert_eq!(rt.block_on(|| 1).unwrap(), 1);
/// ```
pub const DEFAULT_IDLE_SPIN: Duration = Duration::from_micros(50);

pub(crate) struct Shared {
    pub(crate) cores: Box<[Core]>,
    pub(crate) cpus: Vec<usize>,
    pub(crate) stack_size: usize,
    pub(crate) idle_spin_ticks: u64,
    pub(crate) policy: RuntimePolicy,
    pub(crate) arbiter: Box<dyn CoreArbiter>,
    /// Cores whose kernel thread runs the dispatcher now.
    pub(crate) active_mask: AtomicU64,
    pub(crate) shutdown: AtomicBool,
    /// I/O settings, the back end resolved at build time.
    pub(crate) io: crate::io::IoConfig,
    /// Bounds on the cores asked for, and the estimation window.
    pub(crate) min_cores: usize,
    pub(crate) window: Duration,
    /// The CPU budget and neighbour cap, kept current by a watcher thread.
    pub(crate) budget: crate::budget::BudgetHandle,
    /// A limit set at run time with `Runtime::set_max_cores`.
    pub(crate) max_override: std::sync::atomic::AtomicUsize,
    /// Thread contexts (each with its stack) that exist, and the most
    /// there may be: the limit on live threads.
    pub(crate) contexts: std::sync::atomic::AtomicUsize,
    pub(crate) max_threads: usize,
    /// Contexts with no thread that no core keeps (see `crate::sched::park`).
    pub(crate) spares: std::sync::Mutex<crate::sched::park::SparePool>,
    /// Live threads that are in no slot: parked, or waiting for a slot.
    pub(crate) detached: std::sync::atomic::AtomicUsize,
    /// Threads placed while no candidate core ran: any running core takes
    /// them.
    pub(crate) homeless: crate::sched::inbox::Inbox<ThreadContext>,
    /// Spawners waiting for the thread limit.
    pub(crate) limit_wait: crate::sched::park::LimitWait,
    /// Core owners and spare kernel threads (see `crate::sched::kthread`).
    pub(crate) kthreads: crate::sched::kthread::KernelThreads,
    /// Whether a core stuck in a blocking call is handed to a spare kernel
    /// thread (see `crate::sched::handoff`).
    pub(crate) handoff: bool,
    /// Figures for `Runtime::stats` (see [`Figures`]).
    figures: Figures,
}

/// The figures `Runtime::stats` reports beyond the cores' own counters:
/// the last window's utilization and load factor of each core (`f64`
/// bits, written by the core manager), the cores last asked for, and how
/// often a core was taken or given back.
struct Figures {
    utilization: Box<[AtomicU64]>,
    load_factor: Box<[AtomicU64]>,
    requested: std::sync::atomic::AtomicUsize,
    cores_added: AtomicU64,
    cores_released: AtomicU64,
    /// Each core's counters when its figures were last computed (clock,
    /// idle and load ticks), by the core manager or, while it sleeps (see
    /// [`manage_cores`]), by `Runtime::stats`.
    samples: std::sync::Mutex<Vec<(u64, u64, u64)>>,
    /// The core manager sleeps until the cores the runtime may hold change.
    dormant: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// A kernel thread took core `k` from the arbiter.
    pub(crate) fn core_taken(&self, k: usize) {
        self.figures.cores_added.fetch_add(1, Ordering::Relaxed);
        self.policy.core_added(k);
    }

    /// A kernel thread gave its core back to the arbiter.
    pub(crate) fn core_given_back(&self) {
        self.figures.cores_released.fetch_add(1, Ordering::Relaxed);
    }
}

impl Figures {
    fn new(n: usize) -> Self {
        let zeros = || (0..n).map(|_| AtomicU64::new(0)).collect();
        Self {
            utilization: zeros(),
            load_factor: zeros(),
            requested: std::sync::atomic::AtomicUsize::new(0),
            cores_added: AtomicU64::new(0),
            cores_released: AtomicU64::new(0),
            samples: std::sync::Mutex::new(vec![(0, 0, 0); n]),
            dormant: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn set_load(&self, core: usize, utilization: f64, load_factor: f64) {
        self.utilization[core].store(utilization.to_bits(), Ordering::Relaxed);
        self.load_factor[core].store(load_factor.to_bits(), Ordering::Relaxed);
    }
}

/// The default limit on live user threads: one per 16 KiB of physical
/// memory (a parked thread costs about 8 KiB: its context and the stack
/// pages it touched), at least 65 536.
fn default_max_threads() -> usize {
    let info = rustix::system::sysinfo();
    let bytes = u128::from(info.totalram) * u128::from(info.mem_unit.max(1));
    ((bytes / (16 * 1024)) as usize).max(65_536)
}

/// The entry point: builds a runtime with default settings, runs `f` as a
/// user thread in it and returns `f`'s result, once `f` and every thread
/// it left running have ended. Inside `f`, [`spawn`](crate::spawn),
/// [`corewise::net`](crate::net), [`corewise::sync`](crate::sync) and the
/// rest work as on any user thread. A panic in `f` comes back as
/// [`RunError::Join`]; `f` may borrow from the caller.
///
/// ```
/// let greeting = String::from("hello");
/// let n = corewise::run(|| {
///     let h = corewise::spawn(|| 2 + 2).unwrap();
///     greeting.len() + h.join().unwrap()
/// })?;
/// assert_eq!(n, 9);
/// # Ok::<(), corewise::RunError>(())
/// ```
///
/// For other settings use [`Builder::run`]; to keep the runtime for
/// several calls, [`Runtime::new`] and [`Runtime::block_on`].
pub fn run<F, T>(f: F) -> Result<T, RunError>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    Builder::default().run(f)
}

/// Configures and starts a [`Runtime`].
///
/// ```
/// use std::time::Duration;
/// let rt = corewise::Runtime::builder()
///     .stack_size(128 * 1024)
///     .idle_spin(Duration::from_micros(20))
///     .build()
///     .unwrap();
/// assert!(rt.cores() >= 1);
/// ```
#[must_use = "a Builder does nothing until `build` or `run`"]
pub struct Builder {
    cpus: Option<Vec<usize>>,
    stack_size: usize,
    idle_spin: Duration,
    policy: Option<Box<dyn CorePolicy>>,
    io: crate::io::IoConfig,
    policy_config: PolicyConfig,
    neighbour: Option<NeighbourConfig>,
    neighbour_cgroup: Option<std::path::PathBuf>,
    arbiter: ArbiterChoice,
    priority: usize,
    max_threads: Option<usize>,
    handoff: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            cpus: None,
            stack_size: DEFAULT_STACK_SIZE,
            idle_spin: DEFAULT_IDLE_SPIN,
            policy: None,
            io: crate::io::IoConfig::default(),
            policy_config: PolicyConfig::default(),
            neighbour: Some(NeighbourConfig::default()),
            neighbour_cgroup: None,
            arbiter: ArbiterChoice::Auto,
            priority: 0,
            max_threads: None,
            handoff: true,
        }
    }
}

impl Builder {
    /// The most user threads that may live at once outside the cores'
    /// dispatch slots (default: one per 16 KiB of physical memory, at least
    /// 65 536). A spawn beyond it fails with [`SpawnError::ThreadLimit`],
    /// or waits with `spawn_wait` (or `wait_at_limit`). Each thread
    /// reserves a stack of `stack_size` bytes of address space; only the
    /// pages it touches use memory.
    ///
    /// The limit bounds memory, so it counts the thread contexts made
    /// beyond the 56 each core keeps in its slots (those exist once, are
    /// reused, and counting them would put a shared counter on every
    /// spawn): up to 56 threads per core more than `n` may live, and a
    /// small `n` is a limit on threads that wait, not on all of them.
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().max_threads(1_000_000).build().unwrap();
    /// assert_eq!(rt.block_on(|| 1).unwrap(), 1);
    /// ```
    pub fn max_threads(mut self, n: usize) -> Self {
        self.max_threads = Some(n);
        self
    }

    /// Use only these CPUs (intersected with the process's affinity).
    ///
    /// ```
    /// use corewise::BuildError;
    /// let cpu = corewise::cpu_budget().unwrap().cpus().iter().next().unwrap();
    /// let rt = corewise::Runtime::builder().cpus([cpu]).build().unwrap();
    /// assert_eq!(rt.cpus(), [cpu]);
    /// // CPUs outside the process's affinity are dropped; none left is an error.
    /// let err = corewise::Runtime::builder().cpus([100_000]).build().err().unwrap();
    /// assert!(matches!(err, BuildError::NoCpus { .. }));
    /// ```
    pub fn cpus(mut self, cpus: impl IntoIterator<Item = usize>) -> Self {
        self.cpus = Some(cpus.into_iter().collect());
        self
    }

    /// Stack size of every user thread (default 256 KiB; a guard page is
    /// added below it). Stacks are address space reserved in large chunks;
    /// only the pages a thread touches use memory, and pages an earlier
    /// thread used are given back when a thread parks on a reused stack
    /// (a parked thread costs about 5 KiB in all).
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().stack_size(64 * 1024).build().unwrap();
    /// assert_eq!(rt.block_on(|| 2).unwrap(), 2);
    /// ```
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// How long a core with nothing runnable spins, at most, before
    /// sleeping in the kernel. Longer: lower wakeup latency after short idle
    /// gaps; shorter: less CPU burnt while idle. A core that keeps sleeping
    /// through gaps longer than this spins less and less (down to not at
    /// all), and spins this long again as soon as a gap is shorter.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = corewise::Runtime::builder().idle_spin(Duration::ZERO).build().unwrap();
    /// rt.block_on(|| ()).unwrap();
    /// // Without spinning, an idle core goes to sleep in the kernel at once.
    /// let start = std::time::Instant::now();
    /// while rt.core_stats().iter().all(|c| c.sleeps == 0) {
    ///     assert!(start.elapsed() < Duration::from_secs(5));
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// ```
    pub fn idle_spin(mut self, spin: Duration) -> Self {
        self.idle_spin = spin;
        self
    }

    /// The I/O back end (default: io_uring where the kernel allows it,
    /// else epoll; the environment variable `COREWISE_IO=epoll` overrides).
    ///
    /// ```
    /// use corewise::IoBackend;
    /// // epoll works on every Linux kernel; io_uring is used where it is allowed.
    /// let rt = corewise::Runtime::builder().io_backend(IoBackend::Epoll).build().unwrap();
    /// assert_eq!(rt.io_backend(), IoBackend::Epoll);
    /// assert_eq!(rt.block_on(corewise::io::backend).unwrap(), Some(IoBackend::Epoll));
    /// ```
    pub fn io_backend(mut self, backend: crate::io::IoBackend) -> Self {
        self.io.backend = Some(backend);
        self
    }

    /// SQPOLL mode (off by default): a kernel thread polls each core's
    /// submission ring, so submitting costs no system call (FlexSC's
    /// syscall core). `Some(cpu)` pins the pollers to `cpu`, which must not
    /// be one of the runtime's CPUs.
    ///
    /// ```
    /// use corewise::BuildError;
    /// let cpu = corewise::cpu_budget().unwrap().cpus().iter().next().unwrap();
    /// // The poller may not share a CPU with the runtime's cores.
    /// let err = corewise::Runtime::builder().cpus([cpu]).sqpoll(Some(cpu)).build().err().unwrap();
    /// assert!(matches!(err, BuildError::Invalid(_)));
    /// // Where io_uring (or its SQPOLL mode) is not allowed the runtime falls
    /// // back to epoll, where SQPOLL does not apply.
    /// let rt = corewise::Runtime::builder().sqpoll(None).build().unwrap();
    /// assert_eq!(rt.block_on(corewise::io::backend).unwrap(), Some(rt.io_backend()));
    /// ```
    pub fn sqpoll(mut self, cpu: Option<usize>) -> Self {
        self.io.sqpoll = Some(cpu);
        self
    }

    /// Hold at least `n` cores (default 1), whatever the load, if the CPU
    /// budget allows; the neighbour cap never goes below it.
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().min_cores(2).build().unwrap();
    /// // Two cores held from the start, idle or not (if the budget has two).
    /// let budget = rt.budget().cores().min(rt.cores());
    /// assert!(rt.active_cores() >= 2.min(budget));
    /// ```
    pub fn min_cores(mut self, n: usize) -> Self {
        self.policy_config.min_cores = n.max(1) as u32;
        self
    }

    /// Hold at most `n` cores (default: every CPU of the budget).
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().max_cores(1).build().unwrap();
    /// let busy: Vec<_> = (0..4).map(|i| rt.spawn(move || i).unwrap()).collect();
    /// assert_eq!(busy.into_iter().map(|h| h.join().unwrap()).sum::<i32>(), 6);
    /// assert_eq!(rt.active_cores(), 1);
    /// assert!(rt.stats().requested_cores <= 1);
    /// ```
    pub fn max_cores(mut self, n: usize) -> Self {
        self.policy_config.max_cores = n.max(1) as u32;
        self
    }

    /// Settings of the default policy's core estimation.
    ///
    /// ```
    /// use corewise::PolicyConfig;
    /// use std::time::Duration;
    /// let config = PolicyConfig {
    ///     window: Duration::from_millis(20),
    ///     max_cores: 1,
    ///     ..PolicyConfig::default()
    /// };
    /// let rt = corewise::Runtime::builder().policy_config(config).build().unwrap();
    /// let s = rt.stats();
    /// assert_eq!(s.window, Duration::from_millis(20));
    /// assert_eq!(s.active_cores, 1);
    /// ```
    pub fn policy_config(mut self, config: PolicyConfig) -> Self {
        self.policy_config = config;
        self
    }

    /// Neighbour awareness (friendlypool): cap the active cores at the
    /// process's share of the machine, `ceil(O · cpu_self / cpu_all · CPUs)`;
    /// `None` switches the cap off. Default: on, `O = 1`.
    ///
    /// ```
    /// use corewise::budget::NeighbourConfig;
    /// let off = corewise::Runtime::builder().neighbour_awareness(None).build().unwrap();
    /// assert_eq!(off.budget().active_cores(), off.budget().cores()); // no cap
    /// let config = NeighbourConfig { overcommit: 2.0, ..NeighbourConfig::default() };
    /// let on = corewise::Runtime::builder().neighbour_awareness(Some(config)).build().unwrap();
    /// let cap = on.budget().active_cores();
    /// assert!(cap >= 1 && cap <= on.budget().cores());
    /// ```
    pub fn neighbour_awareness(mut self, config: Option<NeighbourConfig>) -> Self {
        self.neighbour = config;
        self
    }

    /// Neighbour awareness among the processes of one cgroup (its v1
    /// `cpuacct` directory `dir`, e.g. the processes of one job) instead of
    /// the whole host: `cpu_all` is their CPU time. The build fails if
    /// `dir` has no `cpuacct.usage`.
    ///
    /// ```
    /// let built = corewise::Runtime::builder().neighbour_cgroup("/nonexistent").build();
    /// assert!(built.is_err());
    /// ```
    pub fn neighbour_cgroup(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.neighbour_cgroup = Some(dir.into());
        self
    }

    /// Whether a core whose kernel thread stays blocked in the kernel (a
    /// std call, a futex, a page fault) or computes inside one user
    /// thread's run is handed to a spare kernel thread on the same CPU, so
    /// that its other threads go on (default: on; Go's handoff). Off, such
    /// a call stalls the core's other threads, as in Arachne, and each
    /// core's io_uring is created single-issuer with deferred task running.
    /// Handoff needs an arbiter that can place the spare (both built-in
    /// ones can: the in-process one sets the spare's affinity, the daemon
    /// puts it in the core's cpuset; see
    /// [`CoreArbiter::core_handed_over`]).
    /// `COREWISE_HANDOFF=off` ([`HANDOFF_ENV`]) switches it off for every
    /// runtime of the process. The handoff monitor also samples the
    /// neighbour share on its wakeups; without it the budget watcher
    /// thread wakes for each share window while the runtime is busy.
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().blocking_handoff(true).build().unwrap();
    /// let ticks = rt
    ///     .block_on(|| {
    ///         let blocker = corewise::spawn(|| std::thread::sleep(std::time::Duration::from_millis(50))).unwrap();
    ///         let mut ticks = 0;
    ///         while !blocker.is_finished() {
    ///             corewise::sleep(std::time::Duration::from_millis(5));
    ///             ticks += 1;
    ///         }
    ///         ticks
    ///     })
    ///     .unwrap();
    /// assert!(ticks > 1);
    /// ```
    pub fn blocking_handoff(mut self, on: bool) -> Self {
        self.handoff = on;
        self
    }

    /// The core policy (default: [`DefaultPolicy`]).
    ///
    /// ```
    /// use corewise::DefaultPolicy;
    /// // The default policy, limited to one core.
    /// let rt = corewise::Runtime::builder().policy(DefaultPolicy::new(1)).build().unwrap();
    /// let cores: Vec<_> = (0..4).map(|_| rt.spawn(corewise::current_core).unwrap()).collect();
    /// assert!(cores.into_iter().all(|h| h.join().unwrap().is_some()));
    /// assert_eq!(rt.active_cores(), 1);
    /// ```
    pub fn policy(mut self, policy: impl CorePolicy) -> Self {
        self.policy = Some(Box::new(policy));
        self
    }

    /// Where cores come from (default [`ArbiterChoice::Auto`]: the daemon
    /// named by `COREWISE_ARBITER` if set, else the in-process arbiter); see
    /// [`crate::arbiter`].
    ///
    /// ```
    /// use corewise::{ArbiterChoice, ArbiterKind, BuildError};
    /// let rt = corewise::Runtime::builder().arbiter(ArbiterChoice::Local).build().unwrap();
    /// assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
    /// let missing = ArbiterChoice::Daemon("/nonexistent/corewise-arbiter.sock".into());
    /// let err = corewise::Runtime::builder().arbiter(missing).build().err().unwrap();
    /// assert!(matches!(err, BuildError::ArbiterUnreachable { .. }));
    /// ```
    pub fn arbiter(mut self, choice: ArbiterChoice) -> Self {
        self.arbiter = choice;
        self
    }

    /// Take cores from the `corewise-arbiter` daemon listening on `socket`.
    /// If it cannot be reached, [`build`](Self::build) fails with
    /// [`BuildError::ArbiterUnreachable`]; for a fallback to the in-process
    /// arbiter use [`arbiter_socket_or_local`](Self::arbiter_socket_or_local).
    ///
    /// ```
    /// let err = corewise::Runtime::builder()
    ///     .arbiter_socket("/nonexistent/corewise-arbiter.sock")
    ///     .build()
    ///     .err()
    ///     .unwrap();
    /// assert!(matches!(err, corewise::BuildError::ArbiterUnreachable { .. }));
    /// ```
    pub fn arbiter_socket(self, socket: impl Into<std::path::PathBuf>) -> Self {
        self.arbiter(ArbiterChoice::Daemon(socket.into()))
    }

    /// Take cores from the daemon listening on `socket` if it can be
    /// reached at start; otherwise log one warning (through `tracing`) and
    /// use the in-process arbiter ([`Runtime::arbiter_kind`] tells which).
    ///
    /// ```
    /// use corewise::ArbiterKind;
    /// let rt = corewise::Runtime::builder()
    ///     .arbiter_socket_or_local("/nonexistent/corewise-arbiter.sock")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
    /// ```
    pub fn arbiter_socket_or_local(self, socket: impl Into<std::path::PathBuf>) -> Self {
        self.arbiter(ArbiterChoice::DaemonOrLocal(socket.into()))
    }

    /// Priority of the runtime's core requests to the daemon, `0..8`, 0 the
    /// highest (default 0): an application at a higher priority takes cores
    /// from lower ones. The in-process arbiter ignores it.
    ///
    /// ```
    /// use corewise::{BuildError, PRIORITIES};
    /// // The in-process arbiter ignores it, but the level must be valid.
    /// let rt = corewise::Runtime::builder().priority(PRIORITIES - 1).build().unwrap();
    /// assert_eq!(rt.block_on(|| 1).unwrap(), 1);
    /// let err = corewise::Runtime::builder().priority(PRIORITIES).build().err().unwrap();
    /// assert!(matches!(err, BuildError::Invalid(_)));
    /// ```
    pub fn priority(mut self, level: usize) -> Self {
        self.priority = level;
        self
    }

    /// Builds the runtime, runs `f` in a user thread of it and returns the
    /// result once `f` and every thread still running have ended (the
    /// runtime is dropped before `run` returns). See [`run`].
    ///
    /// ```
    /// let v = corewise::Runtime::builder()
    ///     .max_cores(1)
    ///     .run(|| corewise::spawn(|| 40).unwrap().join().unwrap() + 2)
    ///     .unwrap();
    /// assert_eq!(v, 42);
    /// ```
    pub fn run<F, T>(self, f: F) -> Result<T, RunError>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        self.build()?.block_on(f)
    }

    /// Starts the kernel threads and waits until they hold their cores.
    ///
    /// First it sizes the process's file-descriptor table for
    /// `min(RLIMIT_NOFILE soft limit, 65 536)` descriptors, so that no later
    /// socket or file waits for the kernel to grow the table (in a process
    /// with several threads each growth waits for an RCU grace period,
    /// 10-20 ms, inside whatever call made the descriptor).
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().max_cores(1).build().unwrap();
    /// assert_eq!(rt.block_on(|| 1 + 1).unwrap(), 2);
    /// ```
    pub fn build(self) -> Result<Runtime, BuildError> {
        crate::clock::init();
        crate::sched::park::init();
        crate::thread::install_panic_hook();
        if self.max_threads == Some(0) {
            return Err(BuildError::Invalid("max_threads must be at least 1".into()));
        }
        if self.stack_size < 16 * 1024 || self.stack_size > (1 << 30) {
            return Err(BuildError::Invalid(format!(
                "stack size {} is outside 16 KiB..1 GiB",
                self.stack_size
            )));
        }
        // Before the kernel threads start: later fds never wait for the
        // table to grow (see `crate::fdtable`).
        crate::fdtable::reserve();
        let affinity = rustix::thread::sched_getaffinity(None).map_err(std::io::Error::from)?;
        let allowed: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| affinity.is_set(c))
            .collect();
        let mut cpus: Vec<usize> = match &self.cpus {
            Some(req) => req
                .iter()
                .copied()
                .filter(|c| allowed.contains(c))
                .collect(),
            None => allowed.clone(),
        };
        cpus.sort_unstable();
        cpus.dedup();
        // With the daemon, the affinity is the daemon's doing (a process in
        // its unmanaged set sees only the unmanaged CPUs): one kernel thread
        // per online CPU (or per CPU asked for), whichever the daemon grants.
        let arbiter = crate::arbiter::choose(&self.arbiter, self.priority)?;
        if arbiter.is_some() {
            cpus = match &self.cpus {
                Some(req) => req.clone(),
                None => crate::arbiter::online_cpus().unwrap_or(cpus),
            };
            cpus.sort_unstable();
            cpus.dedup();
        }
        if cpus.is_empty() {
            return Err(BuildError::NoCpus {
                requested: self.cpus.unwrap_or_default(),
                allowed,
            });
        }
        if cpus.len() > 64 {
            return Err(BuildError::TooManyCpus(cpus.len()));
        }
        if self.priority >= PRIORITIES {
            return Err(BuildError::Invalid(format!(
                "priority {} is outside 0..{PRIORITIES}",
                self.priority
            )));
        }
        if let Some(Some(c)) = self.io.sqpoll {
            if cpus.contains(&c) {
                return Err(BuildError::Invalid(format!(
                    "the SQPOLL CPU {c} is one of the runtime's CPUs {cpus:?}"
                )));
            }
        }
        let mut io = self.io.clone();
        let handoff = self.handoff
            && handoff_allowed_by_env()
            && arbiter.as_ref().is_none_or(|a| a.supports_handoff());
        io.shared_issuer = handoff;
        io.resolve();
        let n = cpus.len();
        // The CPU budget (affinity, cpusets, quotas, COREWISE_MAX_CORES),
        // re-read every second, and the neighbour share, every window. With
        // one CPU the share could only ever cap at 1 core, so it is not
        // sampled: its 100 wakeups a second would each preempt the one
        // dispatcher for tens of microseconds, for nothing.
        if let Some(dir) = &self.neighbour_cgroup {
            if !dir.join("cpuacct.usage").is_file() {
                return Err(BuildError::Invalid(format!(
                    "neighbour cgroup {}: no cpuacct.usage",
                    dir.display()
                )));
            }
        }
        // With the daemon, its cpusets say where it put a thread, not the
        // budget (see `BudgetProbe::under_arbiter`).
        let probe = if arbiter.is_some() {
            crate::budget::BudgetProbe::new().under_arbiter(cpus.iter().copied().collect())
        } else {
            crate::budget::BudgetProbe::new()
        };
        let watcher = BudgetWatcher::builder()
            .probe(probe)
            .neighbour(if n > 1 { self.neighbour } else { None })
            .neighbour_cgroup(self.neighbour_cgroup.clone())
            .spawn()
            .map_err(|e| BuildError::Invalid(format!("CPU budget: {e}")))?;
        // The dispatchers report their kernel sleeps: the watcher reads
        // nothing while all of them sleep.
        watcher.handle().track_activity();
        let mut policy_config = self.policy_config.clone();
        policy_config.max_cores = policy_config.max_cores.min(n as u32).max(1);
        policy_config.min_cores = policy_config.min_cores.clamp(1, policy_config.max_cores);
        let min_cores = policy_config.min_cores as usize;
        let window = policy_config.window;
        let policy = match self.policy {
            Some(p) => RuntimePolicy::Custom(p),
            None => RuntimePolicy::Default(DefaultPolicy::with_config(policy_config)),
        };
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            cores: (0..n).map(Core::new).collect(),
            cpus: cpus.clone(),
            stack_size: self.stack_size,
            idle_spin_ticks: crate::clock::duration_to_ticks(self.idle_spin),
            policy,
            arbiter: match arbiter {
                Some(d) => Box::new(d.with_kthreads(n).with_cpus(cpus.clone())),
                None => Box::new(Local::new(cpus.clone())),
            },
            active_mask: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            io,
            min_cores,
            window,
            budget: watcher.handle().clone(),
            max_override: std::sync::atomic::AtomicUsize::new(usize::MAX),
            contexts: std::sync::atomic::AtomicUsize::new(n * crate::sched::occupancy::SLOTS),
            max_threads: self.max_threads.unwrap_or_else(default_max_threads),
            spares: std::sync::Mutex::new(crate::sched::park::SparePool::default()),
            detached: std::sync::atomic::AtomicUsize::new(0),
            homeless: crate::sched::inbox::Inbox::new_open(),
            limit_wait: crate::sched::park::LimitWait::default(),
            kthreads: crate::sched::kthread::KernelThreads::default(),
            handoff,
            figures: Figures::new(n),
        }));
        for core in shared.cores.iter() {
            core.link(shared);
        }
        let mut rt = Runtime {
            shared,
            manager: None,
            monitor: None,
        };
        for k in 0..n {
            shared.kthreads.start_core(shared, k)?;
        }
        request_cores(shared);
        let expect = shared.arbiter.granted();
        let start = Instant::now();
        while (shared.active_mask.load(Ordering::Acquire).count_ones() as usize) < expect {
            if start.elapsed() > Duration::from_secs(10) {
                return Err(BuildError::Os(std::io::Error::other(
                    "kernel threads did not take their cores within 10 s",
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let manager = std::thread::Builder::new()
            .name("corewise-cores".into())
            .spawn(move || manage_cores(shared, watcher))?;
        // A new neighbour cap is applied at once, not at the next window.
        let manager_thread = manager.thread().clone();
        shared
            .budget
            .on_active_change(Box::new(move || manager_thread.unpark()));
        // A change before the callback was set is seen too (the manager may
        // already sleep until the next change, see `manage_cores`).
        manager.thread().unpark();
        rt.manager = Some(manager);
        if shared.handoff {
            // The monitor, awake every 10 ms or less while the runtime is
            // busy, samples the neighbour share and does the budget
            // re-reads on those wakeups. Without it the watcher thread
            // does both on its own schedule (never a dispatcher: see
            // `sched::monitor`).
            shared.budget.share_ticks_elsewhere(WATCHER_BACKSTOP);
            shared.budget.budget_ticks_elsewhere(WATCHER_BACKSTOP);
            crate::sched::handoff::install_handler();
            rt.monitor = Some(
                std::thread::Builder::new()
                    .name("corewise-monitor".into())
                    .spawn(move || crate::sched::monitor::run(shared))?,
            );
        }
        Ok(rt)
    }
}

/// How late a share sample or a budget re-read may be before the watcher
/// thread does it itself (see `BudgetHandle::share_ticks_elsewhere` and
/// `budget_ticks_elsewhere`): the monitor falls that far behind only when
/// it gets no CPU.
const WATCHER_BACKSTOP: Duration = Duration::from_secs(1);

/// Environment variable that switches blocking handoff off for every
/// runtime of the process when set to `0`, `off` or `false` (see
/// [`Builder::blocking_handoff`]).
///
/// ```
/// assert_eq!(corewise::HANDOFF_ENV, "COREWISE_HANDOFF");
/// ```
pub const HANDOFF_ENV: &str = "COREWISE_HANDOFF";

/// Whether [`HANDOFF_ENV`] leaves blocking handoff on.
fn handoff_allowed_by_env() -> bool {
    !matches!(
        std::env::var(HANDOFF_ENV).as_deref(),
        Ok("0") | Ok("off") | Ok("false")
    )
}

/// Asks the arbiter for what the policy wants, within the CPU budget and the
/// neighbour cap (which never go below `min_cores` unless the budget itself
/// is smaller).
fn request_cores(shared: &'static Shared) {
    let desired: u32 = shared.policy.desired_cores().iter().sum();
    let (lo, hi) = core_range(shared);
    let total = (desired as usize).clamp(lo, hi);
    let mut per = [0u32; PRIORITIES];
    per[0] = total as u32;
    let before = shared.arbiter.granted();
    shared.figures.requested.store(total, Ordering::Relaxed);
    shared.arbiter.set_requested_cores(per);
    if shared.arbiter.granted() < before {
        // Busy cores look at once, not at the end of a rotation.
        for c in shared.cores.iter() {
            c.stats.release_check.store(true, Ordering::Relaxed);
        }
    }
    if shared.arbiter.granted() != before {
        // A core asleep would not notice that it must go.
        for c in shared.cores.iter() {
            c.gate.wake();
        }
    }
}

/// The fewest and the most cores the runtime may ask for now: `min_cores`
/// and the neighbour cap, within the CPU budget, the runtime's CPUs and
/// `set_max_cores` (the cap never goes below `min_cores` unless the budget
/// itself is smaller).
fn core_range(shared: &Shared) -> (usize, usize) {
    let budget = &shared.budget;
    let hard = budget
        .cores()
        .min(shared.cpus.len())
        .min(shared.max_override.load(Ordering::Relaxed))
        .max(1);
    let soft = budget.active_cores().max(shared.min_cores).min(hard);
    (shared.min_cores.min(hard), soft)
}

/// Turns each core's counters since its last sample into utilization and
/// load factor, publishes them for `Runtime::stats`, and returns those of
/// the active cores. A core sampled less than `min_age` clock ticks ago
/// keeps its figures (and is left out).
fn sample_loads(shared: &Shared, min_age: u64) -> Vec<CoreLoad> {
    let active = shared.active_mask.load(Ordering::Acquire);
    let mut last = shared
        .figures
        .samples
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut loads = Vec::with_capacity(shared.cores.len());
    for (k, c) in shared.cores.iter().enumerate() {
        let now = crate::clock::now();
        let (t0, idle0, load0) = last[k];
        if now.wrapping_sub(t0) < min_age {
            continue;
        }
        let idle_now = c.stats.idle.until(now);
        let load_now = c.stats.load_ticks.load(Ordering::Relaxed);
        last[k] = (now, idle_now, load_now);
        if active & (1 << k) == 0 {
            shared.figures.set_load(k, 0.0, 0.0);
            continue;
        }
        let dt = now.wrapping_sub(t0).max(1) as f64;
        // Not wrapping: a dispatcher ends an idle period at the time of its
        // last clock read, which may come before this sample's, after this
        // sample counted the period as still going on up to now; the idle
        // ticks then go back a little, and a wrapped difference read as a
        // window spent idle (utilization 0 with 8 threads runnable: the
        // default policy recorded 0 as the utilization to scale back down
        // below, and the runtime kept its second core for good).
        let idle = idle_now.saturating_sub(idle0) as f64;
        let l = CoreLoad {
            core: k,
            utilization: (1.0 - idle / dt).clamp(0.0, 1.0),
            load_factor: (load_now.wrapping_sub(load0) as f64 / dt).max(0.0),
        };
        shared.figures.set_load(k, l.utilization, l.load_factor);
        loads.push(l);
    }
    loads
}

/// The core manager: every estimation window it turns the dispatchers'
/// counters into per-core utilization and load factor, lets the policy
/// estimate, and asks the arbiter for the result (within the budget).
///
/// While the runtime may hold only one number of cores (`min_cores` equals
/// the cap: a process confined to one CPU, or capped by its neighbours to
/// its minimum) no estimate can change what it asks for, so the manager
/// sleeps until that range changes (the budget watcher, `set_max_cores`)
/// or the runtime stops; `Runtime::stats` computes the figures meanwhile.
/// Not under an arbiter that counts on a request every window
/// ([`CoreArbiter::needs_periodic_requests`]: the daemon's client notices
/// a daemon that died while no kernel thread waited on its socket, and
/// tries to reconnect, on those calls).
/// Its wakeup every window cost a thread-per-connection server on one CPU
/// a context switch and its work in the middle of requests 20 times a
/// second (its p99 at 2 000 requests/s: 220 µs in five runs, 153 µs
/// without those wakeups, tokio's 166 µs).
fn manage_cores(shared: &'static Shared, watcher: BudgetWatcher) {
    // The watcher's thread lives as long as this one.
    let _watcher = watcher;
    sample_loads(shared, 0);
    let mut dormant = false;
    while !shared.shutdown.load(Ordering::Acquire) {
        if dormant {
            shared.figures.dormant.store(true, Ordering::SeqCst);
            std::thread::park();
            shared.figures.dormant.store(false, Ordering::SeqCst);
        } else {
            std::thread::park_timeout(shared.window);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            break;
        }
        let (lo, hi) = core_range(shared);
        if dormant {
            // Start a window now: the samples of the dormant spell (or of
            // the last `stats` call) describe a time no estimate used.
            dormant = false;
            if lo < hi {
                sample_loads(shared, 0);
                request_cores(shared);
                continue;
            }
        }
        let loads = sample_loads(shared, 0);
        if lo < hi {
            shared.policy.estimate(&loads);
        }
        request_cores(shared);
        dormant = lo >= hi && !shared.arbiter.needs_periodic_requests();
    }
}

/// A core-aware user-thread runtime.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let h = rt.spawn(|| 6 * 7).unwrap();
/// assert_eq!(h.join().unwrap(), 42);
/// ```
///
/// Dropping the runtime waits for its user threads to finish, then stops
/// its kernel threads and frees the stacks. Dropped while its thread
/// panics, it does not wait: the threads run on, detached, so that a
/// thread waiting for something the panicking code would have done cannot
/// turn the panic into a hang.
pub struct Runtime {
    shared: &'static Shared,
    manager: Option<std::thread::JoinHandle<()>>,
    monitor: Option<std::thread::JoinHandle<()>>,
}

impl Runtime {
    /// A runtime on every CPU of the process's affinity, default settings.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// // One core per CPU the process may run on.
    /// assert_eq!(rt.cores(), corewise::cpu_budget().unwrap().cpus().len());
    /// assert_eq!(rt.block_on(|| 2 + 2).unwrap(), 4);
    /// ```
    pub fn new() -> Result<Self, BuildError> {
        Builder::default().build()
    }

    /// A builder for a runtime with other settings.
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().max_cores(1).stack_size(64 * 1024).build().unwrap();
    /// assert_eq!(rt.active_cores(), 1);
    /// ```
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Creates a `Normal` user thread.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let handles: Vec<_> = (1..=3).map(|i| rt.spawn(move || i * 10).unwrap()).collect();
    /// let total: i32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    /// assert_eq!(total, 60);
    /// ```
    pub fn spawn<F, T>(&self, f: F) -> Result<JoinHandle<T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        ThreadBuilder::new().spawn_in(self, f)
    }

    /// Creates a user thread of `class`.
    ///
    /// ```
    /// use corewise::ThreadClass;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let h = rt.spawn_with(ThreadClass::Exclusive, || corewise::current_core()).unwrap();
    /// let core = h.join().unwrap().unwrap();
    /// assert!(core < rt.cores());
    /// ```
    pub fn spawn_with<F, T>(&self, class: ThreadClass, f: F) -> Result<JoinHandle<T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        ThreadBuilder::new().class(class).spawn_in(self, f)
    }

    /// Runs `f` in a user thread and waits for its result. `f` may borrow
    /// from the caller (it has ended when `block_on` returns). Called from
    /// an OS thread, it parks that thread; from a user thread, it blocks
    /// only that thread. At the thread limit it waits for a thread to end.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// assert_eq!(rt.block_on(|| corewise::current().is_some()).unwrap(), true);
    /// let words = vec!["a", "bc"];
    /// assert_eq!(rt.block_on(|| words.concat()).unwrap(), "abc");
    /// ```
    pub fn block_on<F, T>(&self, f: F) -> Result<T, RunError>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        self.scope(|s| {
            Ok(ThreadBuilder::new()
                .wait_at_limit(true)
                .spawn_scoped(s, f)?
                .join()?)
        })
    }

    /// Number of cores (kernel threads) the runtime may use.
    ///
    /// ```
    /// let cpu = corewise::cpu_budget().unwrap().cpus().iter().next().unwrap();
    /// let rt = corewise::Runtime::builder().cpus([cpu]).build().unwrap();
    /// assert_eq!(rt.cores(), 1);
    /// ```
    pub fn cores(&self) -> usize {
        self.shared.cores.len()
    }

    /// The I/O back end every core uses (chosen once, at build time).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// // io_uring where the kernel allows it, else epoll: every core uses the same.
    /// let backend = rt.io_backend();
    /// let seen = rt.block_on(corewise::io::backend).unwrap();
    /// assert_eq!(seen, Some(backend));
    /// ```
    pub fn io_backend(&self) -> crate::io::IoBackend {
        self.shared
            .io
            .backend
            .unwrap_or(crate::io::IoBackend::Epoll)
    }

    /// Which arbiter the runtime's cores come from (the in-process one when
    /// a daemon was asked for but could not be reached).
    ///
    /// ```
    /// use corewise::{ArbiterChoice, ArbiterKind};
    /// let rt = corewise::Runtime::builder().arbiter(ArbiterChoice::Local).build().unwrap();
    /// assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
    /// assert_eq!(rt.stats().arbiter, ArbiterKind::Local);
    /// ```
    pub fn arbiter_kind(&self) -> ArbiterKind {
        self.shared.arbiter.kind()
    }

    /// The CPUs behind the runtime's cores, by core index.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// assert_eq!(rt.cpus().len(), rt.cores());
    /// let budget = corewise::cpu_budget().unwrap();
    /// assert!(rt.cpus().iter().all(|&c| budget.cpus().contains(c)));
    /// ```
    pub fn cpus(&self) -> &[usize] {
        &self.shared.cpus
    }

    /// Limits the cores the runtime holds to `n` (at least 1) from now on,
    /// below whatever the policy and the budget allow; `usize::MAX` lifts
    /// the limit. Cores above the limit are released: their threads move
    /// to the remaining cores.
    ///
    /// ```
    /// let rt = corewise::Runtime::builder().min_cores(2).build().unwrap();
    /// rt.set_max_cores(1);
    /// assert_eq!(rt.block_on(|| 7).unwrap(), 7);
    /// ```
    pub fn set_max_cores(&self, n: usize) {
        self.shared.max_override.store(n.max(1), Ordering::Relaxed);
        request_cores(self.shared);
        // The range of cores the manager may choose from changed.
        if let Some(m) = &self.manager {
            m.thread().unpark();
        }
    }

    /// The CPU budget and neighbour cap the runtime follows (the cap is
    /// [`BudgetHandle::active_cores`](crate::budget::BudgetHandle::active_cores)).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let b = rt.budget();
    /// assert!(b.active_cores() >= 1 && b.active_cores() <= b.cores());
    /// ```
    pub fn budget(&self) -> &crate::budget::BudgetHandle {
        &self.shared.budget
    }

    /// Number of cores the runtime holds now.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// assert!(rt.active_cores() >= 1 && rt.active_cores() <= rt.cores());
    /// rt.set_max_cores(1);
    /// let start = std::time::Instant::now();
    /// while rt.active_cores() > 1 {
    ///     assert!(start.elapsed() < std::time::Duration::from_secs(5));
    ///     std::thread::sleep(std::time::Duration::from_millis(1));
    /// }
    /// ```
    pub fn active_cores(&self) -> usize {
        self.shared.active_mask.load(Ordering::Acquire).count_ones() as usize
    }

    /// Statistics of each core (the `cores` of [`stats`](Self::stats)).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let stats = rt.core_stats();
    /// assert_eq!(stats.len(), rt.cores());
    /// assert!(stats.iter().enumerate().all(|(i, c)| c.core == i));
    /// assert_eq!(stats.iter().filter(|c| c.active).count(), rt.stats().active_cores);
    /// ```
    pub fn core_stats(&self) -> Vec<CoreStats> {
        core_stats(self.shared)
    }

    /// A snapshot of the runtime's figures: per core, its threads,
    /// utilization, load factor and counters; the cores asked for, granted
    /// and held, and how often a core was taken or given back. The counters
    /// are read one after another, not atomically together.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| corewise::yield_now()).unwrap();
    /// let s = rt.stats();
    /// assert_eq!(s.cores.len(), rt.cores());
    /// assert!(s.active_cores >= 1 && s.cores_added >= 1);
    /// assert!(s.cores.iter().map(|c| c.dispatches).sum::<u64>() >= 1);
    /// for c in &s.cores {
    ///     println!("core {} on CPU {}: {} threads, {:.0} % busy", c.core, c.cpu, c.threads, c.utilization * 100.0);
    /// }
    /// ```
    pub fn stats(&self) -> RuntimeStats {
        stats_of(self.shared)
    }

    pub(crate) fn shared(&self) -> &'static Shared {
        self.shared
    }
}

/// The figures of the runtime the calling user thread runs in (`None` on
/// an OS thread): [`Runtime::stats`] for code that has no `&Runtime`.
///
/// ```
/// assert!(corewise::runtime_stats().is_none());
/// let cores = corewise::run(|| corewise::runtime_stats().unwrap().cores.len()).unwrap();
/// assert!(cores >= 1);
/// ```
pub fn runtime_stats() -> Option<RuntimeStats> {
    crate::sched::current::current_slot().map(|s| stats_of(s.core().runtime()))
}

fn core_stats(shared: &Shared) -> Vec<CoreStats> {
    let f = &shared.figures;
    if f.dormant.load(Ordering::SeqCst) {
        // The core manager sleeps (see `manage_cores`): figures older than
        // a window are computed here, over the time since their last sample.
        sample_loads(shared, crate::clock::duration_to_ticks(shared.window));
    }
    let bits = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
    shared
        .cores
        .iter()
        .map(|c| CoreStats {
            core: c.index,
            cpu: c.cpu.load(Ordering::Relaxed),
            active: c.active.load(Ordering::Relaxed),
            threads: c.mask.count(),
            queued: c.queued.load(Ordering::Relaxed),
            utilization: bits(&f.utilization[c.index]),
            load_factor: bits(&f.load_factor[c.index]),
            dispatches: c.stats.dispatches.load(Ordering::Relaxed),
            sleeps: c.stats.sleeps.load(Ordering::Relaxed),
            sleeping: c.gate.is_sleeping(),
        })
        .collect()
}

fn stats_of(shared: &Shared) -> RuntimeStats {
    let cores = core_stats(shared);
    let queued: usize = cores.iter().map(|c| c.queued as usize).sum();
    let f = &shared.figures;
    RuntimeStats {
        requested_cores: f.requested.load(Ordering::Relaxed),
        granted_cores: shared.arbiter.granted(),
        active_cores: shared.active_mask.load(Ordering::Acquire).count_ones() as usize,
        cores_added: f.cores_added.load(Ordering::Relaxed),
        cores_released: f.cores_released.load(Ordering::Relaxed),
        parked: shared
            .detached
            .load(Ordering::Relaxed)
            .saturating_sub(queued),
        arbiter: shared.arbiter.kind(),
        window: shared.window,
        handoffs: shared
            .cores
            .iter()
            .map(|c| c.handoff.count.load(Ordering::Relaxed))
            .sum(),
        kernel_threads: shared.kthreads.live(),
        cores,
    }
}

/// A snapshot of a runtime's figures ([`Runtime::stats`]).
///
/// ```
/// use corewise::{ArbiterChoice, ArbiterKind, PolicyConfig};
/// let rt = corewise::Runtime::builder().arbiter(ArbiterChoice::Local).build().unwrap();
/// rt.block_on(|| ()).unwrap();
/// let s = rt.stats();
/// assert_eq!(s.cores.len(), rt.cores());
/// assert_eq!(s.arbiter, ArbiterKind::Local);
/// assert_eq!(s.window, PolicyConfig::default().window);
/// assert!(s.cores_added >= 1); // the cores taken at start count
/// assert!(s.kernel_threads >= s.active_cores);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RuntimeStats {
    /// Each core of the runtime, held or not, by index.
    pub cores: Vec<CoreStats>,
    /// Cores the runtime last asked its arbiter for (the policy's estimate
    /// within the CPU budget, the neighbour cap and `set_max_cores`).
    pub requested_cores: usize,
    /// Cores the arbiter grants now.
    pub granted_cores: usize,
    /// Cores whose kernel thread runs the dispatcher now (follows
    /// `granted_cores` within a moment).
    pub active_cores: usize,
    /// Times a core was taken since start (its kernel thread began to
    /// dispatch); the cores at start count.
    pub cores_added: u64,
    /// Times a core was given back since start.
    pub cores_released: u64,
    /// Live threads in no core's slots or queues: blocked long enough to
    /// have left their slot.
    pub parked: usize,
    /// Where the cores come from.
    pub arbiter: ArbiterKind,
    /// Times a core was handed to a spare kernel thread because its user
    /// thread blocked in the kernel or computed for long (see
    /// [`Builder::blocking_handoff`]).
    pub handoffs: u64,
    /// The runtime's kernel threads alive now: one per core that ever ran,
    /// plus spares (which exit after a second unused).
    pub kernel_threads: usize,
    /// The estimation window that `utilization` and `load_factor` cover.
    pub window: Duration,
}

/// A runtime could not be built, or a user thread could not be created or
/// panicked.
///
/// ```
/// use corewise::{BuildError, RunError};
/// let err = corewise::run(|| -> u8 { panic!("failed") }).unwrap_err();
/// assert!(matches!(&err, RunError::Join(e) if e.message == "failed"));
/// let err = corewise::Runtime::builder().stack_size(1).run(|| ()).unwrap_err();
/// assert!(matches!(err, RunError::Build(BuildError::Invalid(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The runtime could not be built ([`run`], [`Builder::run`]).
    #[error("cannot start the corewise runtime: {0}")]
    Build(#[from] BuildError),
    /// Creation failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The thread panicked.
    #[error(transparent)]
    Join(#[from] JoinError),
}

/// A snapshot of one core's counters.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| ()).unwrap();
/// for c in rt.core_stats() {
///     assert!((0.0..=1.0).contains(&c.utilization));
///     if c.active {
///         assert!(rt.cpus().contains(&c.cpu)); // a held core knows its CPU
///     }
/// }
/// assert!(rt.core_stats().iter().map(|c| c.dispatches).sum::<u64>() >= 1);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CoreStats {
    /// Core index within the runtime.
    pub core: usize,
    /// CPU the core's kernel thread runs on (`usize::MAX` before its grant).
    pub cpu: usize,
    /// Whether the runtime holds this core now.
    pub active: bool,
    /// User threads in the core's slots now (running, runnable or blocked
    /// for less than a sweep period).
    pub threads: u32,
    /// Threads handed to the core that wait for a free slot there.
    pub queued: u32,
    /// Share of the last estimation window the core spent running threads
    /// (0..=1; 0 for a core not held).
    pub utilization: f64,
    /// Average runnable threads over the last window (Arachne's load
    /// factor; above 1 means threads waited for the core).
    pub load_factor: f64,
    /// User-thread runs started by its dispatcher.
    pub dispatches: u64,
    /// Times its kernel thread went to sleep for lack of work.
    pub sleeps: u64,
    /// Whether it sleeps now.
    pub sleeping: bool,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let shared = self.shared;
        shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(m) = self.manager.take() {
            m.thread().unpark();
            let _ = m.join();
        }
        shared.arbiter.shutdown();
        for c in shared.cores.iter() {
            c.gate.wake();
        }
        let inside = crate::sched::current::current_slot()
            .map(|s| std::ptr::eq(s.core().runtime(), shared))
            .unwrap_or(false);
        if inside {
            // Joining our own kernel thread would deadlock; they exit on
            // their own once their threads are done.
            return;
        }
        if std::thread::panicking() {
            // Dropped while unwinding: the threads may be waiting for
            // something the panicking code was about to do, and waiting for
            // them would turn the panic into a hang. They run on, detached
            // like std threads whose handles were dropped (the shared state
            // is never freed, so that is sound), and the panic goes on.
            return;
        }
        if let Some(m) = self.monitor.take() {
            m.thread().unpark();
            let _ = m.join();
        }
        shared.kthreads.join_all();
        // Every kernel thread is gone and no thread is left: the pooled
        // spare contexts' stacks are unmapped too.
        crate::sched::park::drop_spares(shared, None);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A spawn from outside the runtime at an instant when no core runs
    /// (one given back and the next not running yet: a lost arbiter
    /// daemon, a grant moving) waits for the next core instead of failing.
    /// The instant is held open here by hiding the active cores from the
    /// spawn; the core keeps running and takes the thread.
    #[test]
    fn a_spawn_while_no_core_runs_waits_for_one() {
        let rt = Runtime::builder().max_cores(1).build().unwrap();
        assert_eq!(rt.spawn(|| 1).unwrap().join().unwrap(), 1);
        let hidden = rt.shared.active_mask.swap(0, Ordering::AcqRel);
        assert_ne!(hidden, 0, "the runtime held a core");
        let spawned = rt.spawn(|| 7);
        rt.shared.active_mask.fetch_or(hidden, Ordering::AcqRel);
        assert_eq!(
            spawned.expect("spawn with no core running").join().unwrap(),
            7
        );
    }
}
