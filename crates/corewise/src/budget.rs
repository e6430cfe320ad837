//! The CPU budget: how many cores this process may use, and why.
//!
//! A runtime that starts one kernel thread per CPU of the machine
//! overcommits whenever the process is confined: by its affinity mask
//! (`taskset`), by a cpuset cgroup, or by a CFS bandwidth quota, which
//! `sched_getaffinity` and `sysconf(_SC_NPROCESSORS_ONLN)` do not show. The
//! friendlypool paper (Jeffery, Jensen, Mortier) measures what that costs in
//! tail latency. So the budget is
//!
//! ```text
//! cores = |affinity ∩ cpuset| capped by ceil(quota / period)
//! ```
//!
//! read for the process's cgroup **and every parent up to the mount
//! root**, because a parent's limit binds its children; the tightest limit
//! wins. cgroup v1, v2 and hybrid layouts are handled (see [`cgroup`
//! lookup](BudgetProbe)). `COREWISE_MAX_CORES` overrides the quota-derived
//! figure (see [`MAX_CORES_ENV`]).
//!
//! Limits change while a process runs (an orchestrator resizes a
//! container), so [`BudgetWatcher`] re-reads the budget periodically and
//! publishes the core count in an atomic that the runtime's kernel threads
//! read with one load.
//!
//! The second half is the paper's neighbour share ([`NeighbourShare`]):
//! even without limits, when neighbours keep the host busy the process's
//! fair share is `ceil(O · cpu_self / cpu_all · CPUs)` cores, and using more
//! threads than that only adds preemption.
//!
//! ```
//! let budget = corewise::cpu_budget().unwrap();
//! assert!(budget.cores() >= 1 && budget.cores() <= budget.cpus().len());
//! println!("{budget}");
//! ```

pub(crate) mod cgroup;
mod filter;
mod neighbour;
mod watch;

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub use corewise_arbiter::cpulist::{CpuList, CpuListError, MAX_CPU_ID};
pub use filter::{ShareFilter, OFFSET};
pub use neighbour::{neighbour_cap, CpuTimes, NeighbourConfig, NeighbourShare};
pub use watch::{BudgetHandle, BudgetWatcher, WatcherBuilder, DEFAULT_REFRESH_INTERVAL};

/// The environment variable that overrides the core count.
///
/// `COREWISE_MAX_CORES=N` (N ≥ 1) replaces the figure derived from CFS
/// quotas, as `GOMAXPROCS` does for Go: an operator who knows better (a
/// burstable quota, a deliberate overcommit) has the last word. It cannot
/// give more cores than the CPUs the process may run on (affinity ∩
/// cpuset). Unset, empty or blank means no override; anything else that is
/// not a positive integer is [`BudgetError::Env`].
///
/// ```
/// use corewise::budget::{BudgetError, BudgetProbe, BudgetReason, MAX_CORES_ENV};
/// // An empty directory as the file-system root: no cgroup limits at all.
/// let root = std::env::temp_dir().join(format!("corewise-doc-{}-env", std::process::id()));
/// std::fs::create_dir_all(&root).unwrap();
/// let probe = || BudgetProbe::new().root(&root).affinity("0-3".parse().unwrap());
/// std::env::set_var(MAX_CORES_ENV, "2");
/// let b = probe().read().unwrap();
/// assert_eq!((b.cores(), b.reason()), (2, &BudgetReason::EnvOverride { value: 2 }));
/// std::env::set_var(MAX_CORES_ENV, "two");
/// assert!(matches!(probe().read(), Err(BudgetError::Env { .. })));
/// std::env::remove_var(MAX_CORES_ENV);
/// assert_eq!(probe().read().unwrap().cores(), 4);
/// std::fs::remove_dir_all(&root).unwrap();
/// ```
pub const MAX_CORES_ENV: &str = "COREWISE_MAX_CORES";

/// Why the budget could not be read.
///
/// ```
/// use corewise::budget::{BudgetError, BudgetProbe};
/// let err = BudgetProbe::new().max_cores(Some(0)).read().unwrap_err();
/// assert!(matches!(err, BudgetError::Config(_)));
/// // Another process's budget starts from its `/proc/<pid>/cgroup`: under
/// // an empty root that file is missing, and the error names it.
/// let root = std::env::temp_dir().join(format!("corewise-doc-{}-err", std::process::id()));
/// std::fs::create_dir_all(&root).unwrap();
/// let err = BudgetProbe::for_pid(1).root(&root).read().unwrap_err();
/// assert!(matches!(&err, BudgetError::Missing { path } if path.ends_with("proc/1/cgroup")), "{err}");
/// std::fs::remove_dir_all(&root).unwrap();
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// A file or directory that must exist does not (for example
    /// `cpu.cfs_period_us` next to a set `cpu.cfs_quota_us`, or the
    /// process's cgroup directory after the cgroup was removed).
    #[error("missing {}", path.display())]
    Missing {
        /// The missing path.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file's content is not what the kernel writes there.
    #[error("cannot parse {}: {detail}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// `COREWISE_MAX_CORES` is set to something other than a positive
    /// integer.
    #[error("invalid {MAX_CORES_ENV}={value:?}: {detail}")]
    Env {
        /// The variable's value.
        value: String,
        /// What is wrong with it.
        detail: &'static str,
    },
    /// `sched_getaffinity` failed (for another process: it may have exited).
    #[error("sched_getaffinity for {target}: {source}")]
    Affinity {
        /// `self` or the pid.
        target: String,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// No CPU is left (cannot happen for a running process unless its
    /// limits changed while they were being read).
    #[error("no CPU left after intersecting affinity {affinity} with cpusets {cpuset}")]
    NoCpus {
        /// The affinity mask.
        affinity: CpuList,
        /// The intersection of the cpusets.
        cpuset: CpuList,
    },
    /// A setting is out of range.
    #[error("invalid budget setting: {0}")]
    Config(String),
    /// The watcher's background thread could not be started.
    #[error("cannot start the budget watcher thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl BudgetError {
    pub(crate) fn parse(path: &Path, detail: String) -> Self {
        BudgetError::Parse {
            path: path.to_path_buf(),
            detail,
        }
    }
}

/// A CFS bandwidth limit found on one cgroup: `quota_us` of CPU time per
/// `period_us`.
///
/// ```
/// use corewise::budget::{BudgetProbe, BudgetReason};
/// let root = std::env::temp_dir().join(format!("corewise-doc-{}-quota", std::process::id()));
/// let write = |rel: &str, text: &str| {
///     let p = root.join(rel);
///     std::fs::create_dir_all(p.parent().unwrap()).unwrap();
///     std::fs::write(p, text).unwrap();
/// };
/// // A fake cgroup v2 tree: the process in /app, which may use 1.5 CPUs.
/// write("proc/self/cgroup", "0::/app\n");
/// write("proc/self/mountinfo", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
/// write("sys/fs/cgroup/app/cpu.max", "150000 100000\n");
/// let b = BudgetProbe::new().root(&root).max_cores(None).affinity("0-3".parse().unwrap()).read().unwrap();
/// let BudgetReason::Quota(q) = b.reason() else { panic!("{b}") };
/// assert_eq!((q.quota_us, q.period_us), (150_000, 100_000));
/// assert!(q.path.ends_with("sys/fs/cgroup/app"));
/// assert_eq!(q.cores(), 2);
/// std::fs::remove_dir_all(&root).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaLimit {
    /// The cgroup directory whose `cpu.cfs_quota_us` / `cpu.max` set it.
    pub path: PathBuf,
    /// CPU time allowed per period, in microseconds.
    pub quota_us: u64,
    /// The period, in microseconds (never 0).
    pub period_us: u64,
}

impl QuotaLimit {
    /// `ceil(quota / period)`, at least 1: the cores the quota can keep
    /// busy.
    ///
    /// ```
    /// use corewise::budget::QuotaLimit;
    /// let q = QuotaLimit { path: "/cg".into(), quota_us: 150_000, period_us: 100_000 };
    /// assert_eq!(q.cores(), 2);
    /// ```
    pub fn cores(&self) -> usize {
        let period = self.period_us.max(1);
        let cores = self.quota_us.div_ceil(period).max(1);
        usize::try_from(cores).unwrap_or(usize::MAX)
    }

    /// `quota / period` as a fraction of CPUs.
    ///
    /// ```
    /// use corewise::budget::QuotaLimit;
    /// let q = QuotaLimit { path: "/sys/fs/cgroup/app".into(), quota_us: 150_000, period_us: 100_000 };
    /// assert_eq!(q.cpus(), 1.5);
    /// assert_eq!(q.cores(), 2); // what 1.5 CPUs of time can keep busy
    /// ```
    pub fn cpus(&self) -> f64 {
        self.quota_us as f64 / self.period_us.max(1) as f64
    }

    /// Whether `self` allows strictly less CPU time than `other`
    /// (exact, no floating point).
    fn tighter_than(&self, other: &QuotaLimit) -> bool {
        u128::from(self.quota_us) * u128::from(other.period_us.max(1))
            < u128::from(other.quota_us) * u128::from(self.period_us.max(1))
    }
}

/// Which limit decided the core count.
///
/// ```
/// use corewise::budget::{BudgetProbe, BudgetReason};
/// // An empty directory as the file-system root: no cgroup limits at all.
/// let root = std::env::temp_dir().join(format!("corewise-doc-{}-reason", std::process::id()));
/// std::fs::create_dir_all(&root).unwrap();
/// let probe = BudgetProbe::new().root(&root).affinity("0-3".parse().unwrap());
/// let b = probe.clone().max_cores(None).read().unwrap();
/// assert_eq!(b.reason(), &BudgetReason::Affinity);
/// let b = probe.max_cores(Some(2)).read().unwrap();
/// assert_eq!(b.reason(), &BudgetReason::EnvOverride { value: 2 });
/// assert_eq!(b.reason().to_string(), "env override COREWISE_MAX_CORES=2");
/// std::fs::remove_dir_all(&root).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetReason {
    /// The affinity mask: nothing tighter applies.
    Affinity,
    /// A cpuset: the cgroup directory whose CPU list last narrowed the set
    /// (walking from the top of the hierarchy down).
    Cpuset {
        /// The cgroup directory.
        path: PathBuf,
    },
    /// A CFS quota, the tightest found on the process's cgroup and its
    /// parents.
    Quota(QuotaLimit),
    /// [`MAX_CORES_ENV`].
    EnvOverride {
        /// The variable's value.
        value: usize,
    },
}

impl fmt::Display for BudgetReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetReason::Affinity => f.write_str("affinity"),
            BudgetReason::Cpuset { path } => write!(f, "cpuset at {}", path.display()),
            BudgetReason::Quota(q) => write!(
                f,
                "quota at {} ({}/{} = {:.2} CPUs)",
                q.path.display(),
                q.quota_us,
                q.period_us,
                q.cpus()
            ),
            BudgetReason::EnvOverride { value } => {
                write!(f, "env override {MAX_CORES_ENV}={value}")
            }
        }
    }
}

/// The CPU budget of a process: the CPUs it may run on, how many cores to
/// use, and which limit decided that.
///
/// ```
/// let b = corewise::cpu_budget().unwrap();
/// // Display: "2 cores of CPUs 0-1 (limited by affinity)"
/// assert!(b.to_string().contains("limited by"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuBudget {
    cpus: CpuList,
    cores: usize,
    reason: BudgetReason,
    quota: Option<QuotaLimit>,
}

impl CpuBudget {
    /// The CPUs the process may run on: affinity ∩ every cpuset.
    ///
    /// ```
    /// let b = corewise::cpu_budget().unwrap();
    /// assert!(!b.cpus().is_empty());
    /// // Every CPU of the budget is one this thread may run on.
    /// let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    /// let online: corewise::CpuList = online.trim().parse().unwrap();
    /// assert!(b.cpus().is_subset(&online));
    /// ```
    pub fn cpus(&self) -> &CpuList {
        &self.cpus
    }

    /// How many cores to use: at least 1, at most `cpus().len()`.
    ///
    /// ```
    /// use corewise::budget::BudgetProbe;
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-cores", std::process::id()));
    /// let write = |rel: &str, text: &str| {
    ///     let p = root.join(rel);
    ///     std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    ///     std::fs::write(p, text).unwrap();
    /// };
    /// // A fake cgroup v2 tree: 4 CPUs allowed, 2.5 CPUs of quota.
    /// write("proc/self/cgroup", "0::/app\n");
    /// write("proc/self/mountinfo", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    /// write("sys/fs/cgroup/app/cpu.max", "250000 100000\n");
    /// let b = BudgetProbe::new().root(&root).max_cores(None).affinity("0-3".parse().unwrap()).read().unwrap();
    /// assert_eq!((b.cores(), b.cpus().len()), (3, 4));
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Which limit decided [`cores`](Self::cores).
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetReason};
    /// let b = BudgetProbe::new().max_cores(None).read().unwrap();
    /// // Whatever decided it, the reason is one of the limits the probe reads.
    /// match b.reason() {
    ///     BudgetReason::Affinity | BudgetReason::Cpuset { .. } => assert_eq!(b.cores(), b.cpus().len()),
    ///     BudgetReason::Quota(q) => assert_eq!(b.cores(), q.cores()),
    ///     other => panic!("no override was given, yet {other}"),
    /// }
    /// ```
    pub fn reason(&self) -> &BudgetReason {
        &self.reason
    }

    /// The tightest CFS quota found, whether or not it decided the count.
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetReason};
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-q", std::process::id()));
    /// let write = |rel: &str, text: &str| {
    ///     let p = root.join(rel);
    ///     std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    ///     std::fs::write(p, text).unwrap();
    /// };
    /// // A fake cgroup v2 tree whose quota (8 CPUs) is looser than the 4 CPUs.
    /// write("proc/self/cgroup", "0::/app\n");
    /// write("proc/self/mountinfo", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    /// write("sys/fs/cgroup/app/cpu.max", "800000 100000\n");
    /// let b = BudgetProbe::new().root(&root).max_cores(None).affinity("0-3".parse().unwrap()).read().unwrap();
    /// assert_eq!(b.quota().unwrap().cores(), 8); // found...
    /// assert_eq!((b.cores(), b.reason()), (4, &BudgetReason::Affinity)); // ...but not deciding
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn quota(&self) -> Option<&QuotaLimit> {
        self.quota.as_ref()
    }
}

impl fmt::Display for CpuBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.cores == 1 { "" } else { "s" };
        write!(
            f,
            "{} core{s} of CPUs {} (limited by {})",
            self.cores, self.cpus, self.reason
        )
    }
}

/// The CPU budget of this process, with `COREWISE_MAX_CORES` applied.
///
/// ```
/// let b = corewise::cpu_budget().unwrap();
/// let affinity = std::thread::available_parallelism().unwrap().get();
/// assert!(b.cores() <= affinity.max(b.cpus().len()));
/// ```
pub fn cpu_budget() -> Result<CpuBudget, BudgetError> {
    BudgetProbe::new().read()
}

/// The CPU budget of process `pid` (its cgroups and its main thread's
/// affinity), with `COREWISE_MAX_CORES` of *this* process applied.
///
/// ```
/// let me = std::process::id();
/// assert_eq!(corewise::cpu_budget_of(me).unwrap().cores(), corewise::cpu_budget().unwrap().cores());
/// ```
pub fn cpu_budget_of(pid: u32) -> Result<CpuBudget, BudgetError> {
    BudgetProbe::for_pid(pid).read()
}

/// Where the override comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MaxCores {
    Env,
    Fixed(Option<usize>),
}

/// A configurable reader of the budget: which process, which file-system
/// root, where the override comes from.
///
/// Lookup: `/proc/<pid>/cgroup` gives the cgroup path per hierarchy;
/// `/proc/<pid>/mountinfo` where each hierarchy is mounted (v1: a `cgroup`
/// mount whose options name `cpu` or `cpuset`; v2: the `cgroup2` mount).
/// From the process's directory up to the mount point, each level's
/// `cpu.cfs_quota_us`/`cpu.cfs_period_us` or `cpu.max`, and
/// `cpuset.effective_cpus`/`cpuset.cpus` or `cpuset.cpus.effective`, are
/// read. A controller mounted nowhere, or (v2) not enabled for a cgroup,
/// does not limit.
///
/// ```
/// use corewise::budget::BudgetProbe;
/// let b = BudgetProbe::new().max_cores(Some(1)).read().unwrap();
/// assert_eq!(b.cores(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct BudgetProbe {
    pid: Option<u32>,
    root: PathBuf,
    max_cores: MaxCores,
    affinity: Option<CpuList>,
    /// Skip the core arbiter daemon's cpusets (see [`Self::under_arbiter`]).
    skip_arbiter_sets: bool,
}

impl Default for BudgetProbe {
    fn default() -> Self {
        Self::new()
    }
}

impl BudgetProbe {
    /// Reads this process's budget from `/`, override from the environment.
    ///
    /// ```
    /// use corewise::budget::BudgetProbe;
    /// let b = BudgetProbe::new().read().unwrap();
    /// assert!(b.cores() >= 1 && b.cores() <= b.cpus().len());
    /// ```
    pub fn new() -> Self {
        BudgetProbe {
            pid: None,
            root: PathBuf::from("/"),
            max_cores: MaxCores::Env,
            affinity: None,
            skip_arbiter_sets: false,
        }
    }

    /// For a runtime whose cores come from the core arbiter daemon: the
    /// daemon's own cpusets (`corewise-unmanaged`, `corewise-core<N>`) say
    /// where the daemon put a thread at the moment, not what the process
    /// may use (the unmanaged set shrinks with every core the daemon grants,
    /// the process's own grants included), so they are skipped, and
    /// `cpus` (the runtime's CPUs) stands in for the affinity the daemon
    /// narrowed the same way. Quotas and every other cpuset still count.
    pub(crate) fn under_arbiter(mut self, cpus: CpuList) -> Self {
        self.affinity = Some(cpus);
        self.skip_arbiter_sets = true;
        self
    }

    /// Reads process `pid`'s budget instead.
    ///
    /// ```
    /// use corewise::budget::{BudgetError, BudgetProbe};
    /// let me = std::process::id();
    /// let mine = BudgetProbe::for_pid(me).max_cores(None).read().unwrap();
    /// assert_eq!(mine.cpus(), BudgetProbe::new().max_cores(None).read().unwrap().cpus());
    /// assert!(matches!(BudgetProbe::for_pid(0).read(), Err(BudgetError::Config(_))));
    /// ```
    pub fn for_pid(pid: u32) -> Self {
        BudgetProbe {
            pid: Some(pid),
            ..Self::new()
        }
    }

    /// Reads `/proc` and the cgroup mounts under `root` instead of `/`
    /// (for tests with a fake tree; mount points from mountinfo are taken
    /// relative to it).
    ///
    /// ```
    /// use corewise::budget::{BudgetProbe, BudgetReason};
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-root", std::process::id()));
    /// let write = |rel: &str, text: &str| {
    ///     let p = root.join(rel);
    ///     std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    ///     std::fs::write(p, text).unwrap();
    /// };
    /// // A fake cgroup v2 tree: the process in /a/b, whose parent allows CPUs 0-1.
    /// write("proc/self/cgroup", "0::/a/b\n");
    /// write("proc/self/mountinfo", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    /// write("sys/devices/system/cpu/online", "0-7\n");
    /// write("sys/fs/cgroup/a/cpuset.cpus.effective", "0-1\n");
    /// write("sys/fs/cgroup/a/b/cpuset.cpus.effective", "0-1\n");
    /// let b = BudgetProbe::new().root(&root).max_cores(None).affinity("0-7".parse().unwrap()).read().unwrap();
    /// assert_eq!(b.cpus().to_string(), "0-1");
    /// assert_eq!(b.reason(), &BudgetReason::Cpuset { path: root.join("sys/fs/cgroup/a") });
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    /// Uses `max` as the override instead of reading [`MAX_CORES_ENV`]
    /// (`None`: no override).
    ///
    /// ```
    /// use corewise::budget::BudgetProbe;
    /// let all = BudgetProbe::new().max_cores(None).read().unwrap();
    /// let one = BudgetProbe::new().max_cores(Some(1)).read().unwrap();
    /// assert_eq!(one.cores(), 1);
    /// assert_eq!(one.cpus(), all.cpus()); // the override limits the count, not the CPUs
    /// ```
    pub fn max_cores(mut self, max: Option<usize>) -> Self {
        self.max_cores = MaxCores::Fixed(max);
        self
    }

    /// Uses `cpus` as the affinity mask instead of asking the kernel.
    ///
    /// ```
    /// use corewise::budget::BudgetProbe;
    /// let b = BudgetProbe::new().max_cores(None).affinity("0".parse().unwrap()).read().unwrap();
    /// assert_eq!(b.cpus().to_vec(), [0]);
    /// assert_eq!(b.cores(), 1);
    /// ```
    pub fn affinity(mut self, cpus: CpuList) -> Self {
        self.affinity = Some(cpus);
        self
    }

    /// Reads the budget now.
    ///
    /// ```
    /// use corewise::budget::BudgetProbe;
    /// // An empty directory as the file-system root: no cgroup limits at all.
    /// let root = std::env::temp_dir().join(format!("corewise-doc-{}-read", std::process::id()));
    /// std::fs::create_dir_all(&root).unwrap();
    /// let probe = BudgetProbe::new().root(&root).max_cores(None).affinity("0-5".parse().unwrap());
    /// let b = probe.read().unwrap();
    /// assert_eq!(b.cores(), 6);
    /// assert_eq!(b.to_string(), "6 cores of CPUs 0-5 (limited by affinity)");
    /// std::fs::remove_dir_all(&root).unwrap();
    /// ```
    pub fn read(&self) -> Result<CpuBudget, BudgetError> {
        let max_cores = match &self.max_cores {
            MaxCores::Env => env_max_cores()?,
            MaxCores::Fixed(Some(0)) => {
                return Err(BudgetError::Config("max_cores must be at least 1".into()))
            }
            MaxCores::Fixed(v) => *v,
        };
        let affinity = match &self.affinity {
            Some(a) => a.clone(),
            None => read_affinity(self.pid)?,
        };
        let proc_dir = match self.pid {
            Some(pid) => cgroup::under_root(&self.root, &Path::new("/proc").join(pid.to_string())),
            None => cgroup::under_root(&self.root, Path::new("/proc/self")),
        };
        let cgroup_file = proc_dir.join("cgroup");
        let mountinfo_file = proc_dir.join("mountinfo");
        // No /proc/<pid>/cgroup: a kernel without cgroups; nothing limits.
        let lines = match cgroup::read_optional(&cgroup_file)? {
            Some(text) => cgroup::parse_proc_cgroup(&text, &cgroup_file)?,
            None if self.pid.is_none() => Vec::new(),
            None => return Err(BudgetError::Missing { path: cgroup_file }),
        };
        let mounts = if lines.is_empty() {
            Vec::new()
        } else {
            let text = cgroup::read_required(&mountinfo_file)?;
            cgroup::parse_mountinfo(&text, &mountinfo_file)?
        };

        let mut cpusets: Vec<(PathBuf, CpuList)> = Vec::new();
        let mut quotas: Vec<QuotaLimit> = Vec::new();
        let v2 = cgroup::locate_v2(&lines, &mounts, &self.root);
        if let Some(cpu) = cgroup::locate_v1(&lines, &mounts, "cpu", &self.root) {
            collect_quotas(&cpu, &mut quotas)?;
        }
        if let Some(cpuset) = cgroup::locate_v1(&lines, &mounts, "cpuset", &self.root) {
            collect_cpusets(&cpuset, &mut cpusets)?;
        }
        if let Some(v2) = &v2 {
            collect_quotas(v2, &mut quotas)?;
            collect_cpusets(v2, &mut cpusets)?;
        }
        if self.skip_arbiter_sets {
            cpusets.retain(|(dir, _)| !crate::arbiter::is_daemon_set(dir));
        }
        let online = cgroup::read_optional(&cgroup::under_root(
            &self.root,
            Path::new("/sys/devices/system/cpu/online"),
        ))
        .ok()
        .flatten()
        .and_then(|t| CpuList::parse(&t).ok())
        .filter(|l| !l.is_empty());
        combine(affinity, online, &cpusets, &quotas, max_cores)
    }
}

fn collect_quotas(loc: &cgroup::Located, out: &mut Vec<QuotaLimit>) -> Result<(), BudgetError> {
    cgroup::require_dir(&loc.leaf)?;
    for dir in loc.levels_top_down() {
        if let Some(q) = cgroup::read_quota(&dir, loc.version)? {
            out.push(q);
        }
    }
    Ok(())
}

fn collect_cpusets(
    loc: &cgroup::Located,
    out: &mut Vec<(PathBuf, CpuList)>,
) -> Result<(), BudgetError> {
    cgroup::require_dir(&loc.leaf)?;
    for dir in loc.levels_top_down() {
        if let Some(set) = cgroup::read_cpuset(&dir, loc.version)? {
            out.push((dir, set));
        }
    }
    Ok(())
}

fn env_max_cores() -> Result<Option<usize>, BudgetError> {
    match std::env::var(MAX_CORES_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(BudgetError::Env {
            value: v.to_string_lossy().into_owned(),
            detail: "not UTF-8",
        }),
        Ok(v) => parse_max_cores(&v),
    }
}

fn parse_max_cores(value: &str) -> Result<Option<usize>, BudgetError> {
    let t = value.trim();
    if t.is_empty() {
        return Ok(None);
    }
    match t.parse::<usize>() {
        Ok(0) => Err(BudgetError::Env {
            value: value.to_owned(),
            detail: "must be at least 1",
        }),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(BudgetError::Env {
            value: value.to_owned(),
            detail: "not a positive integer",
        }),
    }
}

fn read_affinity(pid: Option<u32>) -> Result<CpuList, BudgetError> {
    let (target, pid) = match pid {
        None => ("self".to_owned(), None),
        Some(p) => {
            let raw = i32::try_from(p)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            let Some(raw) = raw else {
                return Err(BudgetError::Config(format!("invalid pid {p}")));
            };
            (format!("pid {p}"), Some(raw))
        }
    };
    let set = rustix::thread::sched_getaffinity(pid).map_err(|e| BudgetError::Affinity {
        target,
        source: e.into(),
    })?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect())
}

/// Combines the limits into a budget.
///
/// `cpusets` are in hierarchy order, top first. The reason is chosen as:
/// the override if it decided the count; else the tightest quota if it is
/// strictly below the CPU count; else the cpuset level that last narrowed
/// the set (if the cpusets, not the affinity mask, decided the CPU list);
/// else the affinity mask. On a tie between quota and CPU list the CPU list
/// is named, since it is the harder limit.
fn combine(
    affinity: CpuList,
    online: Option<CpuList>,
    cpusets: &[(PathBuf, CpuList)],
    quotas: &[QuotaLimit],
    max_cores: Option<usize>,
) -> Result<CpuBudget, BudgetError> {
    let mut running: Option<CpuList> = online;
    let mut narrowed_at: Option<&Path> = None;
    for (path, set) in cpusets {
        match &running {
            None => running = Some(set.clone()),
            Some(r) => {
                let next = r.intersection(set);
                if next.len() < r.len() {
                    narrowed_at = Some(path);
                }
                running = Some(next);
            }
        }
    }
    let cpuset = running.unwrap_or_else(|| affinity.clone());
    let mut cpus = affinity.intersection(&cpuset);
    if cpus.is_empty() {
        // The kernel keeps affinity within the cpuset, so an empty
        // intersection means a limit changed between the reads; the
        // affinity mask is the kernel's current word.
        cpus = affinity.clone();
    }
    if cpus.is_empty() {
        return Err(BudgetError::NoCpus { affinity, cpuset });
    }
    let list_reason = match narrowed_at {
        Some(path) if cpuset.len() <= affinity.len() && cpus.len() == cpuset.len() => {
            BudgetReason::Cpuset {
                path: path.to_path_buf(),
            }
        }
        _ => BudgetReason::Affinity,
    };
    let mut tightest: Option<&QuotaLimit> = None;
    for q in quotas {
        if tightest.is_none_or(|t| q.tighter_than(t)) {
            tightest = Some(q);
        }
    }
    let n = cpus.len();
    let (cores, reason) = match (max_cores, tightest) {
        (Some(m), _) if m < n => (m, BudgetReason::EnvOverride { value: m }),
        (Some(_), _) => (n, list_reason),
        (None, Some(q)) if q.cores() < n => (q.cores(), BudgetReason::Quota(q.clone())),
        (None, _) => (n, list_reason),
    };
    Ok(CpuBudget {
        cpus,
        cores,
        reason,
        quota: tightest.cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn list(s: &str) -> CpuList {
        CpuList::parse(s).unwrap()
    }

    fn quota(path: &str, q: u64, p: u64) -> QuotaLimit {
        QuotaLimit {
            path: path.into(),
            quota_us: q,
            period_us: p,
        }
    }

    #[test]
    fn combine_picks_tightest() {
        let b = combine(
            list("0-3"),
            None,
            &[],
            &[
                quota("/a", 300_000, 100_000),
                quota("/a/b", 150_000, 100_000),
            ],
            None,
        )
        .unwrap();
        assert_eq!(b.cores(), 2);
        assert_eq!(
            b.reason(),
            &BudgetReason::Quota(quota("/a/b", 150_000, 100_000))
        );
        // Equal ratios: the higher level (first) is kept.
        let b = combine(
            list("0-3"),
            None,
            &[],
            &[quota("/a", 100_000, 100_000), quota("/a/b", 50_000, 50_000)],
            None,
        )
        .unwrap();
        assert_eq!(
            b.reason(),
            &BudgetReason::Quota(quota("/a", 100_000, 100_000))
        );
        // A quota not below the CPU count does not decide it.
        let b = combine(
            list("0-1"),
            None,
            &[],
            &[quota("/a", 400_000, 100_000)],
            None,
        )
        .unwrap();
        assert_eq!((b.cores(), b.reason()), (2, &BudgetReason::Affinity));
        assert_eq!(b.quota().unwrap().cores(), 4);
        // Sub-CPU quota still gives one core.
        let b = combine(list("0-1"), None, &[], &[quota("/a", 1_000, 100_000)], None).unwrap();
        assert_eq!(b.cores(), 1);
    }

    #[test]
    fn combine_cpuset_reason() {
        let sets = vec![
            (PathBuf::from("/cs"), list("0-3")),
            (PathBuf::from("/cs/p"), list("1")),
            (PathBuf::from("/cs/p/c"), list("1")),
        ];
        let b = combine(list("1"), Some(list("0-3")), &sets, &[], None).unwrap();
        assert_eq!(b.cpus().to_vec(), vec![1]);
        assert_eq!(
            b.reason(),
            &BudgetReason::Cpuset {
                path: "/cs/p".into()
            }
        );
        // Affinity narrower than the cpuset: affinity decides.
        let sets = vec![(PathBuf::from("/cs/p"), list("0-2"))];
        let b = combine(list("0"), Some(list("0-3")), &sets, &[], None).unwrap();
        assert_eq!(b.reason(), &BudgetReason::Affinity);
        // Root cpuset equal to the online CPUs restricts nothing.
        let sets = vec![(PathBuf::from("/cs"), list("0-3"))];
        let b = combine(list("0-3"), Some(list("0-3")), &sets, &[], None).unwrap();
        assert_eq!(b.reason(), &BudgetReason::Affinity);
        // Inconsistent reads: fall back to affinity instead of 0 cores.
        let sets = vec![(PathBuf::from("/cs"), list("2"))];
        let b = combine(list("0"), None, &sets, &[], None).unwrap();
        assert_eq!(b.cpus().to_vec(), vec![0]);
        assert!(combine(CpuList::new(), None, &[], &[], None).is_err());
    }

    #[test]
    fn combine_env_override() {
        let q = [quota("/a", 100_000, 100_000)];
        let b = combine(list("0-3"), None, &[], &q, Some(3)).unwrap();
        assert_eq!(
            (b.cores(), b.reason()),
            (3, &BudgetReason::EnvOverride { value: 3 })
        );
        let b = combine(list("0-3"), None, &[], &q, Some(8)).unwrap();
        assert_eq!((b.cores(), b.reason()), (4, &BudgetReason::Affinity));
        assert_eq!(parse_max_cores(" 2\n").unwrap(), Some(2));
        assert_eq!(parse_max_cores("  ").unwrap(), None);
        assert!(parse_max_cores("0").is_err());
        assert!(parse_max_cores("two")
            .unwrap_err()
            .to_string()
            .contains(MAX_CORES_ENV));
    }

    #[test]
    fn display() {
        let b = combine(
            list("0-1"),
            None,
            &[],
            &[quota("/cg/x", 100_000, 100_000)],
            None,
        )
        .unwrap();
        assert_eq!(
            b.to_string(),
            "1 core of CPUs 0-1 (limited by quota at /cg/x (100000/100000 = 1.00 CPUs))"
        );
    }

    /// A fake file-system root with /proc/self and cgroup mounts.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "corewise-budget-unit-{}-{name}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            FakeRoot(dir)
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        fn probe(&self) -> BudgetProbe {
            BudgetProbe::new()
                .root(&self.0)
                .max_cores(None)
                .affinity(list("0-7"))
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn under_the_arbiter_its_sets_do_not_count() {
        // The process in the daemon's unmanaged set, which lacks the CPUs
        // granted at the moment; the daemon's root allows 0-5.
        let r = FakeRoot::new("arbiter");
        r.write("proc/self/cgroup", "0::/d/corewise-unmanaged\n");
        r.write(
            "proc/self/mountinfo",
            "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        r.write("sys/devices/system/cpu/online", "0-7\n");
        r.write("sys/fs/cgroup/d/cpuset.cpus.effective", "0-5\n");
        r.write(
            "sys/fs/cgroup/d/corewise-unmanaged/cpuset.cpus.effective",
            "0-1\n",
        );
        assert_eq!(r.probe().read().unwrap().cores(), 2);
        let b = r.probe().under_arbiter(list("0-7")).read().unwrap();
        assert_eq!(b.cpus().to_string(), "0-5", "{b}");
        assert_eq!(
            b.reason(),
            &BudgetReason::Cpuset {
                path: r.0.join("sys/fs/cgroup/d")
            }
        );
        // Quotas still bind.
        r.write("sys/fs/cgroup/d/cpu.max", "200000 100000\n");
        let b = r.probe().under_arbiter(list("0-7")).read().unwrap();
        assert_eq!(b.cores(), 2, "{b}");
    }

    #[test]
    fn fake_v2_tree() {
        let r = FakeRoot::new("v2");
        r.write("proc/self/cgroup", "0::/a/b\n");
        r.write(
            "proc/self/mountinfo",
            "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        r.write("sys/devices/system/cpu/online", "0-7\n");
        r.write("sys/fs/cgroup/cpuset.cpus.effective", "0-7\n");
        r.write("sys/fs/cgroup/a/cpu.max", "300000 100000\n");
        r.write("sys/fs/cgroup/a/cpuset.cpus.effective", "0-5\n");
        r.write("sys/fs/cgroup/a/b/cpu.max", "max 100000\n");
        r.write("sys/fs/cgroup/a/b/cpuset.cpus.effective", "0-5\n");
        let b = r.probe().read().unwrap();
        assert_eq!(b.cpus().to_string(), "0-5");
        assert_eq!(b.cores(), 3);
        let BudgetReason::Quota(q) = b.reason() else {
            panic!("{b}")
        };
        assert_eq!(q.path, r.0.join("sys/fs/cgroup/a"));
        // Unparsable content names the file.
        r.write("sys/fs/cgroup/a/b/cpu.max", "lots\n");
        let err = r.probe().read().unwrap_err();
        assert!(err.to_string().contains("a/b/cpu.max"), "{err}");
        r.write("sys/fs/cgroup/a/b/cpu.max", "");
        assert!(matches!(r.probe().read(), Err(BudgetError::Parse { .. })));
        // cpu.max absent (controller not enabled) is no limit.
        fs::remove_file(r.0.join("sys/fs/cgroup/a/b/cpu.max")).unwrap();
        fs::remove_file(r.0.join("sys/fs/cgroup/a/cpu.max")).unwrap();
        let b = r.probe().read().unwrap();
        assert_eq!(b.cores(), 6);
        assert_eq!(
            b.reason(),
            &BudgetReason::Cpuset {
                path: r.0.join("sys/fs/cgroup/a")
            }
        );
        // The process's cgroup vanished: an error naming it, not "no limit".
        fs::remove_dir_all(r.0.join("sys/fs/cgroup/a/b")).unwrap();
        let err = r.probe().read().unwrap_err();
        assert!(
            matches!(&err, BudgetError::Missing { path } if path.ends_with("a/b")),
            "{err}"
        );
    }

    #[test]
    fn fake_v1_tree() {
        let r = FakeRoot::new("v1");
        r.write(
            "proc/self/cgroup",
            "3:cpuset:/p\n2:cpu,cpuacct:/p/c\n1:name=systemd:/\n0::/\n",
        );
        r.write(
            "proc/self/mountinfo",
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n\
             41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
        );
        r.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
        r.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
        r.write("sys/fs/cgroup/cpu,cpuacct/p/cpu.cfs_quota_us", "250000\n");
        r.write("sys/fs/cgroup/cpu,cpuacct/p/cpu.cfs_period_us", "100000\n");
        r.write("sys/fs/cgroup/cpu,cpuacct/p/c/cpu.cfs_quota_us", "500000\n");
        r.write(
            "sys/fs/cgroup/cpu,cpuacct/p/c/cpu.cfs_period_us",
            "100000\n",
        );
        r.write("sys/fs/cgroup/cpuset/cpuset.cpus", "0-7\n");
        r.write("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-7\n");
        // noprefix mount: plain "cpus".
        r.write("sys/fs/cgroup/cpuset/p/cpus", "0-3\n");
        fs::create_dir_all(r.0.join("sys/fs/cgroup/unified")).unwrap();
        let b = r.probe().read().unwrap();
        assert_eq!(b.cpus().to_string(), "0-3");
        assert_eq!(b.cores(), 3);
        assert!(b.to_string().contains("cpu,cpuacct/p ("), "{b}");
        // A quota without its period names the missing file.
        fs::remove_file(r.0.join("sys/fs/cgroup/cpu,cpuacct/p/c/cpu.cfs_period_us")).unwrap();
        let err = r.probe().read().unwrap_err();
        assert!(err.to_string().contains("p/c/cpu.cfs_period_us"), "{err}");
        r.write("sys/fs/cgroup/cpu,cpuacct/p/c/cpu.cfs_period_us", " \n");
        assert!(r.probe().read().unwrap_err().to_string().contains("period"));
        r.write("sys/fs/cgroup/cpu,cpuacct/p/c/cpu.cfs_period_us", "100000");
        r.write("sys/fs/cgroup/cpuset/p/cpus", "0-3,x");
        assert!(r
            .probe()
            .read()
            .unwrap_err()
            .to_string()
            .contains("cpuset/p/cpus"));
        // A v1 cpuset level with no cpus file at all is an error.
        fs::remove_file(r.0.join("sys/fs/cgroup/cpuset/p/cpus")).unwrap();
        assert!(matches!(r.probe().read(), Err(BudgetError::Missing { .. })));
    }

    #[test]
    fn no_cgroups_at_all() {
        let r = FakeRoot::new("none");
        let b = r.probe().read().unwrap();
        assert_eq!((b.cores(), b.reason()), (8, &BudgetReason::Affinity));
        // For another pid the cgroup file must exist.
        let err = BudgetProbe::for_pid(1)
            .root(&r.0)
            .affinity(list("0"))
            .max_cores(None)
            .read()
            .unwrap_err();
        assert!(err.to_string().contains("proc/1/cgroup"), "{err}");
    }

    #[test]
    fn real_self_budget_is_sane() {
        let b = BudgetProbe::new().max_cores(None).read().unwrap();
        assert!(b.cores() >= 1 && b.cores() <= b.cpus().len());
        assert!(matches!(
            BudgetProbe::new().max_cores(Some(0)).read(),
            Err(BudgetError::Config(_))
        ));
        assert!(matches!(
            BudgetProbe::for_pid(0).read(),
            Err(BudgetError::Config(_))
        ));
    }
}
