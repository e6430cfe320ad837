//! The neighbour share of the friendlypool paper (§5.2), read from
//! nanosecond counters.
//!
//! Under a fair scheduler, a process's share of the host's busy CPU time is
//! its share of the CPUs while everyone is busy. The paper sizes the active
//! pool as
//!
//! ```text
//! active = ceil(O · cpu_self / cpu_all · CPUs)
//! ```
//!
//! with `cpu_self` the process's CPU time and `cpu_all` the busy time of the
//! whole host, both as deltas over one window, `CPUs` the host's CPUs and
//! `O` the overcommit factor (1.0 by default). The paper reads both from
//! clock ticks (`/proc/<pid>/stat`, `/proc/stat`); over a 10 ms window that
//! is zero, one or two ticks, and the cap flapped. Here both are
//! nanosecond counters advanced by the same scheduler accounting
//! (`update_curr`):
//!
//! * `cpu_self`: the process CPU clock (`CLOCK_PROCESS_CPUTIME_ID`, or
//!   `clock_getcpuclockid(pid)` for another process): one system call, no
//!   file, every thread included.
//! * `cpu_all`: `cpuacct.usage` of the root of the cgroup v1 `cpuacct`
//!   hierarchy (every task of the host, in ns), read with `pread` on a file
//!   kept open. Without that hierarchy (a v2-only host), or if a
//!   once-a-second comparison shows that it misses most of the host's busy
//!   time (a cgroup namespace), the busy time of `/proc/stat` in clock
//!   ticks is the fallback; smoothing then does more of the work. [`NeighbourShare::host_cgroup`] measures the share among
//!   the processes of one cgroup instead (the tests use it).
//!
//! The raw share of each window goes through a [`ShareFilter`] (a moving
//! average and a dead band), so the cap changes only when the share has
//! really moved. Measurements behind these choices are in
//! `docs/architecture.md`.
//!
//! **An idle host.** The formula is a fair-share estimate and only means
//! something while there is demand to share. When the host's busy time
//! over the window is at most [`NeighbourConfig::idle_fraction`] of its
//! capacity (CPUs × window; 5 % by default) there are no neighbours to
//! crowd and the window counts as share 1 (alone). The ratio is also
//! clamped to 1 (the two counters are read at slightly different moments).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroup::{parse_mountinfo, read_required, under_root};
use super::{BudgetError, ShareFilter};

/// Settings of a [`NeighbourShare`].
///
/// ```
/// use corewise::budget::NeighbourConfig;
/// let c = NeighbourConfig { overcommit: 1.5, ..NeighbourConfig::default() };
/// assert_eq!(c.window, std::time::Duration::from_millis(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NeighbourConfig {
    /// The overcommit factor `O` (finite, > 0; default 1.0). Above 1 trades
    /// tail latency for throughput.
    pub overcommit: f64,
    /// The sampling window (default 10 ms).
    pub window: Duration,
    /// Host busy time at or below this fraction of its capacity over a
    /// window counts as idle: share 1, no neighbours (default 0.05; in
    /// `[0, 1)`).
    pub idle_fraction: f64,
    /// Weight of the newest window in the moving average of the share
    /// (default 0.3: a step is 97 % followed after 10 windows, 100 ms; in
    /// `(0, 1]`).
    pub smoothing: f64,
    /// Half-width of the dead band around each cap boundary, in cores
    /// (default 0.1; in `[0, 0.5]`). See [`ShareFilter`].
    pub band: f64,
}

impl Default for NeighbourConfig {
    fn default() -> Self {
        NeighbourConfig {
            overcommit: 1.0,
            window: Duration::from_millis(10),
            idle_fraction: 0.05,
            smoothing: 0.3,
            band: 0.1,
        }
    }
}

impl NeighbourConfig {
    fn validate(&self) -> Result<(), BudgetError> {
        if !(self.overcommit.is_finite() && self.overcommit > 0.0) {
            return Err(BudgetError::Config(format!(
                "overcommit factor must be finite and > 0, got {}",
                self.overcommit
            )));
        }
        if !(0.0..1.0).contains(&self.idle_fraction) {
            return Err(BudgetError::Config(format!(
                "idle_fraction must be in [0, 1), got {}",
                self.idle_fraction
            )));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(BudgetError::Config(format!(
                "smoothing must be in (0, 1], got {}",
                self.smoothing
            )));
        }
        if !(0.0..=0.5).contains(&self.band) {
            return Err(BudgetError::Config(format!(
                "band must be in [0, 0.5], got {}",
                self.band
            )));
        }
        if self.window.is_zero() {
            return Err(BudgetError::Config("window must be > 0".into()));
        }
        Ok(())
    }

    fn filter(&self, host_cpus: usize, budget: usize) -> ShareFilter {
        ShareFilter::new(
            self.overcommit,
            host_cpus,
            self.smoothing,
            self.band,
            budget,
        )
    }
}

/// One reading of the CPU-time counters.
///
/// ```
/// use corewise::budget::{NeighbourConfig, NeighbourShare};
/// // A stand-in for a cgroup's `cpuacct.usage`: the busy time is ours to set.
/// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-times", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("cpuacct.usage"), "5000000\n").unwrap();
/// let share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap().host_cgroup(&dir).unwrap();
/// let t = share.read_times().unwrap();
/// assert_eq!(t.busy_ns, 5_000_000);
/// assert!(t.self_ns > 0); // this process has run
/// assert!(t.at <= std::time::Instant::now());
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// CPU time of the process, in nanoseconds.
    pub self_ns: u64,
    /// Busy time of the host (or of the measured cgroup), in nanoseconds.
    pub busy_ns: u64,
    /// When it was read.
    pub at: Instant,
}

/// The paper's formula with this module's idle rule, as a pure function
/// (no smoothing, no dead band: what the cap would be from one window).
///
/// `self_delta` and `all_delta` are CPU time over a window in any one unit;
/// `capacity` is `host_cpus × window` in the same unit (used only for the
/// idle rule). Returns a cap in `[1, budget.max(1)]`.
///
/// ```
/// use corewise::budget::neighbour_cap;
/// // Two CPUs saturated, we got a third of the time: ceil(2/3) = 1.
/// assert_eq!(neighbour_cap(1.0, 0.05, 40, 120, 2, 120, 2), 1);
/// // Alone and busy: the whole host.
/// assert_eq!(neighbour_cap(1.0, 0.05, 100, 100, 2, 200, 2), 2);
/// // Idle host: no neighbours to crowd, allow the whole budget.
/// assert_eq!(neighbour_cap(1.0, 0.05, 0, 0, 2, 200, 2), 2);
/// ```
pub fn neighbour_cap(
    overcommit: f64,
    idle_fraction: f64,
    self_delta: u64,
    all_delta: u64,
    host_cpus: usize,
    capacity: u64,
    budget: usize,
) -> usize {
    let budget = budget.max(1);
    if all_delta == 0 || (all_delta as f64) <= idle_fraction * capacity as f64 {
        return budget;
    }
    let ratio = (self_delta as f64 / all_delta as f64).min(1.0);
    // A hair below the exact product so 1/3 · 3 does not round up to 2.
    let active = (overcommit * ratio * host_cpus as f64 - 1e-9).ceil();
    if active.is_nan() || active < 1.0 {
        1
    } else if active >= budget as f64 {
        budget
    } else {
        active as usize
    }
}

/// Whose CPU time is `cpu_self`.
#[derive(Debug, Clone, Copy)]
enum OwnClock {
    /// `CLOCK_PROCESS_CPUTIME_ID`.
    Process,
    /// The CPU clock of another process.
    Other(libc::clockid_t),
}

impl OwnClock {
    fn for_pid(pid: u32) -> Result<Self, BudgetError> {
        let raw = libc::pid_t::try_from(pid)
            .map_err(|_| BudgetError::Config(format!("invalid pid {pid}")))?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `clock` is a valid place for the result; the call reads
        // nothing else.
        let rc = unsafe { libc::clock_getcpuclockid(raw, &mut clock) };
        if rc != 0 {
            return Err(BudgetError::Config(format!(
                "no CPU clock for pid {pid}: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(OwnClock::Other(clock))
    }

    fn read_ns(self) -> Result<u64, BudgetError> {
        let ts = match self {
            OwnClock::Process => rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime),
            OwnClock::Other(clock) => {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: `ts` is a valid timespec to write; a clock of an
                // exited process fails with an error, not UB.
                if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
                    return Err(BudgetError::Config(format!(
                        "process CPU clock: {}",
                        std::io::Error::last_os_error()
                    )));
                }
                rustix::time::Timespec {
                    tv_sec: ts.tv_sec,
                    tv_nsec: ts.tv_nsec as _,
                }
            }
        };
        Ok((ts.tv_sec.max(0) as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec.max(0) as u64))
    }
}

/// Where `cpu_all` comes from: a file kept open and re-read with `pread`.
#[derive(Debug)]
struct HostCounter {
    file: File,
    path: PathBuf,
    /// `Some(ns per tick)`: `/proc/stat` busy ticks; `None`: a cgroup's
    /// `cpuacct` counter in ns.
    ticks: Option<u64>,
    /// The CPUs counted, ascending; `None`: all of them (the aggregate
    /// `cpu` line, or `cpuacct.usage`). With a list: the `cpuN` lines, or
    /// the columns of `cpuacct.usage_percpu`.
    cpus: Option<Vec<usize>>,
}

impl HostCounter {
    fn open(path: PathBuf, ticks: Option<u64>) -> Result<Self, BudgetError> {
        Self::open_for(path, ticks, None)
    }

    fn open_for(
        path: PathBuf,
        ticks: Option<u64>,
        cpus: Option<Vec<usize>>,
    ) -> Result<Self, BudgetError> {
        let file = File::open(&path).map_err(|source| BudgetError::Read {
            path: path.clone(),
            source,
        })?;
        let counter = HostCounter {
            file,
            path,
            ticks,
            cpus,
        };
        counter.read_ns()?;
        Ok(counter)
    }

    /// The same counter over `cpus` only (`None`: every CPU). A cgroup
    /// counter switches between `cpuacct.usage` and
    /// `cpuacct.usage_percpu` of its directory.
    fn over(&self, cpus: Option<Vec<usize>>) -> Result<Self, BudgetError> {
        let path = match (self.ticks, self.path.parent()) {
            (None, Some(dir)) => dir.join(if cpus.is_some() {
                "cpuacct.usage_percpu"
            } else {
                "cpuacct.usage"
            }),
            _ => self.path.clone(),
        };
        Self::open_for(path, self.ticks, cpus)
    }

    /// The root of the cgroup v1 `cpuacct` hierarchy if it is mounted
    /// under `root`, else `/proc/stat`.
    fn host(root: &Path) -> Result<Self, BudgetError> {
        let mountinfo = under_root(root, Path::new("/proc/self/mountinfo"));
        if let Ok(text) = std::fs::read_to_string(&mountinfo) {
            let mounts = parse_mountinfo(&text, &mountinfo).unwrap_or_default();
            let acct = mounts.iter().find(|m| {
                m.fstype == "cgroup"
                    && m.root == "/"
                    && m.super_options.iter().any(|o| o == "cpuacct")
            });
            if let Some(m) = acct {
                let usage = under_root(root, Path::new(&m.mount_point)).join("cpuacct.usage");
                if let Ok(c) = HostCounter::open(usage, None) {
                    return Ok(c);
                }
            }
        }
        let hz = rustix::param::clock_ticks_per_second().max(1);
        HostCounter::open(
            under_root(root, Path::new("/proc/stat")),
            Some(1_000_000_000 / hz),
        )
    }

    fn read_ns(&self) -> Result<u64, BudgetError> {
        let mut small = [0u8; 4096];
        let mut large = Vec::new();
        let buf: &mut [u8] = match &self.cpus {
            // The aggregate line comes first; a cgroup total is one number.
            None => &mut small,
            // One read (a second read at an offset would see a newer
            // snapshot): room for every `cpuN` line, or column, up to the
            // highest CPU counted, at the widest a line can be.
            Some(cpus) => {
                let last = cpus.last().copied().unwrap_or(0);
                large.resize(4096 + 256 * (last + 1), 0);
                &mut large
            }
        };
        let n = self
            .file
            .read_at(buf, 0)
            .map_err(|source| BudgetError::Read {
                path: self.path.clone(),
                source,
            })?;
        let text = std::str::from_utf8(&buf[..n])
            .map_err(|_| BudgetError::parse(&self.path, "not UTF-8".into()))?;
        match (self.ticks, &self.cpus) {
            (Some(ns_per_tick), None) => {
                let (busy, _) = parse_proc_stat(text, &self.path)?;
                Ok(busy.saturating_mul(ns_per_tick))
            }
            (Some(ns_per_tick), Some(cpus)) => {
                let busy = parse_proc_stat_cpus(text, &self.path, cpus)?;
                Ok(busy.saturating_mul(ns_per_tick))
            }
            (None, None) => text
                .trim()
                .parse()
                .map_err(|_| BudgetError::parse(&self.path, format!("bad usage {text:?}"))),
            (None, Some(cpus)) => parse_usage_percpu(text, &self.path, cpus),
        }
    }

    /// Whether the counter has nanosecond resolution.
    fn is_ns(&self) -> bool {
        self.ticks.is_none()
    }
}

/// Whether the `cpuacct` root really counts the whole host: inside a cgroup
/// namespace it counts the namespace only. Once a second (while sampled)
/// its busy time is compared with `/proc/stat`'s, which always covers the
/// host.
#[derive(Debug)]
struct CrossCheck {
    stat: HostCounter,
    every: Duration,
    at: Instant,
    stat_ns: u64,
    host_ns: u64,
}

/// The neighbour-aware cap on active cores, updated from CPU-time deltas.
///
/// Call [`update`](Self::update) once per window from a control thread (or
/// [`sample`](Self::sample), which first sleeps out the rest of the window)
/// and give the runtime the returned cap; see the module documentation of
/// [`crate::budget`] for the formula and the idle rule.
///
/// ```
/// use corewise::budget::{NeighbourConfig, NeighbourShare};
/// let mut share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
/// let cap = share.sample().unwrap();
/// assert!((1..=2).contains(&cap));
/// assert!(share.share().is_some_and(|s| (0.0..=1.0).contains(&s)));
/// ```
#[derive(Debug)]
pub struct NeighbourShare {
    config: NeighbourConfig,
    budget: usize,
    own: OwnClock,
    host: HostCounter,
    /// While `host` is the `cpuacct` root: `/proc/stat` and the time and
    /// host count of the last cross-check (see [`Self::cross_check`]).
    check: Option<CrossCheck>,
    /// The CPUs of the formula: those counted, all of the host's unless
    /// [`Self::restrict_to`] narrowed them.
    host_cpus: usize,
    /// Every CPU of the host (its `cpuN` lines).
    all_cpus: usize,
    /// The CPUs counted, ascending (`None`: all of them).
    counted: Option<Vec<usize>>,
    last: CpuTimes,
    share: Option<f64>,
    filter: ShareFilter,
}

impl NeighbourShare {
    /// Starts measuring this process; the first cap is the whole `budget`.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
    /// assert_eq!(share.cap(), 2); // the whole budget until the first update
    /// assert_eq!(share.share(), None);
    /// let bad = NeighbourConfig { overcommit: 0.0, ..NeighbourConfig::default() };
    /// assert!(NeighbourShare::new(2, bad).is_err());
    /// ```
    pub fn new(budget: usize, config: NeighbourConfig) -> Result<Self, BudgetError> {
        Self::build(OwnClock::Process, Path::new("/"), budget, config)
    }

    /// Starts measuring process `pid` instead.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let me = std::process::id();
    /// assert!(NeighbourShare::for_pid(me, 2, NeighbourConfig::default()).is_ok());
    /// ```
    pub fn for_pid(pid: u32, budget: usize, config: NeighbourConfig) -> Result<Self, BudgetError> {
        Self::build(OwnClock::for_pid(pid)?, Path::new("/"), budget, config)
    }

    fn build(
        own: OwnClock,
        root: &Path,
        budget: usize,
        config: NeighbourConfig,
    ) -> Result<Self, BudgetError> {
        config.validate()?;
        let stat = under_root(root, Path::new("/proc/stat"));
        let (_, host_cpus) = parse_proc_stat(&read_required(&stat)?, &stat)?;
        let host = HostCounter::host(root)?;
        let check = if host.is_ns() {
            let hz = rustix::param::clock_ticks_per_second().max(1);
            let stat = HostCounter::open(stat, Some(1_000_000_000 / hz))?;
            Some(CrossCheck {
                stat_ns: stat.read_ns()?,
                host_ns: host.read_ns()?,
                stat,
                every: Duration::from_secs(1),
                at: Instant::now(),
            })
        } else {
            None
        };
        let budget = budget.max(1);
        let mut share = NeighbourShare {
            config,
            budget,
            own,
            host,
            check,
            host_cpus,
            all_cpus: host_cpus,
            counted: None,
            last: CpuTimes {
                self_ns: 0,
                busy_ns: 0,
                at: Instant::now(),
            },
            share: None,
            filter: config.filter(host_cpus, budget),
        };
        share.last = share.read_times()?;
        Ok(share)
    }

    /// Measures `cpu_all` as the CPU time of the processes in cgroup
    /// directory `dir` of the v1 `cpuacct` hierarchy (its `cpuacct.usage`)
    /// instead of the whole host's: the share of this process among them.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let s = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
    /// // Not a cgroup directory: an error naming the file.
    /// let err = s.host_cgroup("/nonexistent").unwrap_err();
    /// assert!(err.to_string().contains("cpuacct.usage"));
    /// ```
    pub fn host_cgroup(mut self, dir: impl AsRef<Path>) -> Result<Self, BudgetError> {
        self.host = HostCounter::open(dir.as_ref().join("cpuacct.usage"), None)?
            .over(self.counted.clone())?;
        self.check = None;
        self.rebase()?;
        Ok(self)
    }

    /// Counts the share over `cpus` only: the CPUs this process may run
    /// on (its affinity mask and cpusets, [`crate::budget::CpuBudget::cpus`]).
    ///
    /// A process confined to some CPUs competes only with what runs there:
    /// counted against the whole host, a neighbour on its own CPUs weighs
    /// as little as one on any other, and the idle CPUs elsewhere make the
    /// host look idle. Over the process's CPUs, the formula's `CPUs` is
    /// their number and `cpu_all` their busy time (the `cpuN` lines of
    /// `/proc/stat`, or the columns of `cpuacct.usage_percpu`). A set that
    /// covers every CPU counts the whole host as before. The smoothed share
    /// starts over when the set changes; the same set again costs nothing.
    ///
    /// ```
    /// use corewise::budget::{cpu_budget, NeighbourConfig, NeighbourShare};
    /// let budget = cpu_budget().unwrap();
    /// let mut share = NeighbourShare::new(budget.cores(), NeighbourConfig::default()).unwrap();
    /// share.restrict_to(budget.cpus()).unwrap();
    /// assert_eq!(share.host_cpus(), budget.cpus().len());
    /// ```
    pub fn restrict_to(&mut self, cpus: &crate::budget::CpuList) -> Result<(), BudgetError> {
        let list = cpus.to_vec();
        let counted = (!list.is_empty() && list.len() < self.all_cpus).then_some(list);
        if counted == self.counted {
            return Ok(());
        }
        // Both counters are opened before either is replaced: a failure
        // (a CPU without a line: the set is stale) leaves the old ones.
        let host = self.host.over(counted.clone())?;
        let stat = match &self.check {
            Some(c) => Some(c.stat.over(counted.clone())?),
            None => None,
        };
        if let (Some(c), Some(stat)) = (&mut self.check, stat) {
            (c.at, c.stat_ns, c.host_ns) = (Instant::now(), stat.read_ns()?, host.read_ns()?);
            c.stat = stat;
        }
        self.host = host;
        self.host_cpus = counted.as_ref().map_or(self.all_cpus, Vec::len);
        self.counted = counted;
        self.filter.set_host_cpus(self.host_cpus);
        self.rebase()
    }

    /// Reads the counters now, without updating anything.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
    /// let (a, b) = (share.read_times().unwrap(), share.read_times().unwrap());
    /// // Both are counters: they never go back.
    /// assert!(b.self_ns >= a.self_ns && b.busy_ns >= a.busy_ns && b.at >= a.at);
    /// ```
    pub fn read_times(&self) -> Result<CpuTimes, BudgetError> {
        let busy_ns = self.host.read_ns()?;
        let self_ns = self.own.read_ns()?;
        Ok(CpuTimes {
            self_ns,
            busy_ns,
            at: Instant::now(),
        })
    }

    /// Starts the next window now without taking a sample (after a pause
    /// in which the process was idle: a window spanning it would read as a
    /// tiny share).
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// // A stand-in for a cgroup's `cpuacct.usage`: the busy time is ours to set.
    /// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-rebase", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("cpuacct.usage"), "0\n").unwrap();
    /// let mut share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap().host_cgroup(&dir).unwrap();
    /// // Neighbours were busy for 10 s while this process paused...
    /// std::fs::write(dir.join("cpuacct.usage"), "10000000000\n").unwrap();
    /// share.rebase().unwrap(); // ...which the next window leaves out.
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// share.update().unwrap();
    /// assert_eq!(share.share(), Some(1.0)); // an idle window: alone
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn rebase(&mut self) -> Result<(), BudgetError> {
        self.last = self.read_times()?;
        Ok(())
    }

    /// Reads the counters, feeds the share over the time since the last
    /// update to the filter and returns the cap. Less than a tenth of the
    /// window since then carries no information: the cap is left as it was
    /// and the window keeps growing.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// // A stand-in for a cgroup's `cpuacct.usage`: the busy time is ours to set.
    /// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-update", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("cpuacct.usage"), "0\n").unwrap();
    /// let config = NeighbourConfig { smoothing: 1.0, ..NeighbourConfig::default() };
    /// let mut share = NeighbourShare::new(2, config).unwrap().host_cgroup(&dir).unwrap();
    /// // Neighbours burn 10 s of CPU time within this window: a tiny share.
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// std::fs::write(dir.join("cpuacct.usage"), "10000000000\n").unwrap();
    /// assert_eq!(share.update().unwrap(), 1);
    /// assert!(share.share().unwrap() < 0.01);
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn update(&mut self) -> Result<usize, BudgetError> {
        let now = self.read_times()?;
        let elapsed = now.at.saturating_duration_since(self.last.at);
        if elapsed < self.config.window / 10 {
            return Ok(self.cap());
        }
        let self_delta = now.self_ns.saturating_sub(self.last.self_ns);
        let all_delta = now.busy_ns.saturating_sub(self.last.busy_ns);
        let capacity = elapsed.as_nanos() as f64 * self.host_cpus as f64;
        let share = if all_delta == 0 || all_delta as f64 <= self.config.idle_fraction * capacity {
            1.0
        } else {
            (self_delta as f64 / all_delta as f64).min(1.0)
        };
        self.share = Some(share);
        self.filter.push(share);
        self.cross_check()?;
        self.last = now;
        Ok(self.cap())
    }

    /// Falls back to `/proc/stat` for good if, over the last check period
    /// with the host at least half a CPU busy by `/proc/stat`, the
    /// `cpuacct` root saw less than half of that busy time: it does not
    /// count the whole host (a cgroup namespace), and a share of the
    /// namespace would ignore the neighbours outside it.
    fn cross_check(&mut self) -> Result<(), BudgetError> {
        let Some(c) = &mut self.check else {
            return Ok(());
        };
        let elapsed = c.at.elapsed();
        if elapsed < c.every {
            return Ok(());
        }
        let (stat_ns, host_ns) = (c.stat.read_ns()?, self.host.read_ns()?);
        let d_stat = stat_ns.saturating_sub(c.stat_ns) as f64;
        let d_host = host_ns.saturating_sub(c.host_ns) as f64;
        (c.at, c.stat_ns, c.host_ns) = (Instant::now(), stat_ns, host_ns);
        if d_stat >= 0.5 * elapsed.as_nanos() as f64 && d_host < 0.5 * d_stat {
            if let Some(c) = self.check.take() {
                self.host = c.stat;
                self.last = self.read_times()?;
            }
        }
        Ok(())
    }

    /// Sleeps until a full window has passed since the last update, then
    /// [`update`](Self::update)s.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// use std::time::{Duration, Instant};
    /// let config = NeighbourConfig { window: Duration::from_millis(5), ..NeighbourConfig::default() };
    /// let mut share = NeighbourShare::new(2, config).unwrap();
    /// let t = Instant::now();
    /// let cap = share.sample().unwrap(); // sleeps out the window first
    /// assert!(t.elapsed() >= Duration::from_millis(4));
    /// assert!((1..=2).contains(&cap));
    /// ```
    pub fn sample(&mut self) -> Result<usize, BudgetError> {
        let since = self.last.at.elapsed();
        if since < self.config.window {
            std::thread::sleep(self.config.window - since);
        }
        self.update()
    }

    /// The cap from the last update (the budget before the first).
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// // A stand-in for a cgroup's `cpuacct.usage`: the busy time is ours to set.
    /// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-cap", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("cpuacct.usage"), "0\n").unwrap();
    /// let mut share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap().host_cgroup(&dir).unwrap();
    /// assert_eq!(share.cap(), 2);
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// std::fs::write(dir.join("cpuacct.usage"), "10000000000\n").unwrap();
    /// let cap = share.update().unwrap();
    /// assert_eq!((cap, share.cap()), (1, 1));
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn cap(&self) -> usize {
        self.filter.cap().min(self.budget)
    }

    /// The raw share of the last window (`None` before the first update).
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// // A stand-in for a cgroup's `cpuacct.usage` that nobody advances: an idle host.
    /// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-rawshare", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("cpuacct.usage"), "0\n").unwrap();
    /// let mut share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap().host_cgroup(&dir).unwrap();
    /// assert_eq!(share.share(), None);
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// share.update().unwrap();
    /// assert_eq!(share.share(), Some(1.0)); // idle: no neighbours to crowd
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn share(&self) -> Option<f64> {
        self.share
    }

    /// The smoothed share the cap follows (`None` before the first update).
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// // A stand-in for a cgroup's `cpuacct.usage`: the busy time is ours to set.
    /// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-smooth", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("cpuacct.usage"), "0\n").unwrap();
    /// let config = NeighbourConfig { smoothing: 0.5, ..NeighbourConfig::default() };
    /// let mut share = NeighbourShare::new(2, config).unwrap().host_cgroup(&dir).unwrap();
    /// assert_eq!(share.smoothed(), None);
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// share.update().unwrap(); // idle window: share 1
    /// std::thread::sleep(std::time::Duration::from_millis(2));
    /// std::fs::write(dir.join("cpuacct.usage"), "10000000000\n").unwrap();
    /// share.update().unwrap(); // busy neighbours: share about 0
    /// let s = share.smoothed().unwrap();
    /// assert!((0.5..0.51).contains(&s), "{s}"); // halfway with a weight of 0.5
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn smoothed(&self) -> Option<f64> {
        self.filter.smoothed()
    }

    /// The CPUs the share is counted over (the `CPUs` of the formula): the
    /// host's, or those of [`restrict_to`](Self::restrict_to).
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
    /// // The host's CPUs: at least those this process may use.
    /// assert!(share.host_cpus() >= std::thread::available_parallelism().unwrap().get());
    /// ```
    pub fn host_cpus(&self) -> usize {
        self.host_cpus
    }

    /// Whether `cpu_all` has nanosecond resolution (the cgroup counter)
    /// rather than clock ticks (`/proc/stat`).
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let dir = std::env::temp_dir().join(format!("corewise-doc-{}-ns", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("cpuacct.usage"), "0\n").unwrap();
    /// let share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
    /// // The host counter is `cpuacct.usage` (ns) or `/proc/stat` (ticks); a
    /// // cgroup's counter is always in ns.
    /// assert!(share.host_cgroup(&dir).unwrap().host_counter_is_ns());
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn host_counter_is_ns(&self) -> bool {
        self.host.is_ns()
    }

    /// The budget the cap is clamped to.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let share = NeighbourShare::new(3, NeighbourConfig::default()).unwrap();
    /// assert_eq!(share.budget(), 3);
    /// assert_eq!(NeighbourShare::new(0, NeighbourConfig::default()).unwrap().budget(), 1);
    /// ```
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Changes the budget (for example after [`crate::budget::BudgetWatcher`]
    /// saw a new one); the current cap is clamped to it at once.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let mut share = NeighbourShare::new(4, NeighbourConfig::default()).unwrap();
    /// assert_eq!(share.cap(), 4);
    /// share.set_budget(2);
    /// assert_eq!((share.budget(), share.cap()), (2, 2)); // clamped at once
    /// ```
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget.max(1);
        self.filter.set_budget(self.budget);
    }

    /// The settings.
    ///
    /// ```
    /// use corewise::budget::{NeighbourConfig, NeighbourShare};
    /// let config = NeighbourConfig { overcommit: 1.5, ..NeighbourConfig::default() };
    /// let share = NeighbourShare::new(2, config).unwrap();
    /// assert_eq!(share.config(), &config);
    /// ```
    pub fn config(&self) -> &NeighbourConfig {
        &self.config
    }

    /// Changes the settings (validated as in [`new`](Self::new)); the
    /// filter starts over.
    ///
    /// ```
    /// use corewise::budget::{BudgetError, NeighbourConfig, NeighbourShare};
    /// use std::time::Duration;
    /// let mut share = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
    /// let slower = NeighbourConfig { window: Duration::from_millis(50), ..NeighbourConfig::default() };
    /// share.set_config(slower).unwrap();
    /// assert_eq!(share.config().window, Duration::from_millis(50));
    /// let bad = NeighbourConfig { smoothing: 0.0, ..NeighbourConfig::default() };
    /// assert!(matches!(share.set_config(bad), Err(BudgetError::Config(_))));
    /// assert_eq!(share.config(), &slower); // a rejected config changes nothing
    /// ```
    pub fn set_config(&mut self, config: NeighbourConfig) -> Result<(), BudgetError> {
        config.validate()?;
        self.config = config;
        self.filter = config.filter(self.host_cpus, self.budget);
        Ok(())
    }
}

/// The host's busy ticks and CPU count from `/proc/stat`.
pub(crate) fn parse_proc_stat(text: &str, path: &Path) -> Result<(u64, usize), BudgetError> {
    let mut busy = None;
    let mut cpus = 0usize;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(name) = fields.next() else { continue };
        if name == "cpu" {
            busy = Some(busy_of_fields(fields, path, name)?);
        } else if cpu_line_index(name).is_some() {
            cpus += 1;
        }
    }
    match busy {
        Some(b) => Ok((b, cpus.max(1))),
        None => Err(BudgetError::parse(path, "no aggregate cpu line".into())),
    }
}

/// The CPU a `/proc/stat` line is about (`cpu3` is 3; the aggregate
/// `cpu` line and every other line are none).
fn cpu_line_index(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("cpu")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Busy time of the fields of one `/proc/stat` cpu line (after its name):
/// user, nice, system, irq, softirq and steal.
fn busy_of_fields<'a>(
    fields: impl Iterator<Item = &'a str>,
    path: &Path,
    name: &str,
) -> Result<u64, BudgetError> {
    let mut vals = [0u64; 8];
    let mut n = 0;
    for (slot, f) in vals.iter_mut().zip(fields) {
        *slot = f.parse().map_err(|_| {
            BudgetError::parse(path, format!("bad number {f:?} on the {name} line"))
        })?;
        n += 1;
    }
    if n < 4 {
        return Err(BudgetError::parse(
            path,
            format!("{name} line has fewer than 4 fields"),
        ));
    }
    // user nice system idle iowait irq softirq steal
    let [user, nice, system, _idle, _iowait, irq, softirq, steal] = vals;
    Ok(user
        .saturating_add(nice)
        .saturating_add(system)
        .saturating_add(irq)
        .saturating_add(softirq)
        .saturating_add(steal))
}

/// Busy ticks of the CPUs `cpus` (ascending) from `/proc/stat`'s `cpuN`
/// lines; an error if one of them has no line (it went offline: the
/// caller's list is stale).
fn parse_proc_stat_cpus(text: &str, path: &Path, cpus: &[usize]) -> Result<u64, BudgetError> {
    let mut busy = 0u64;
    let mut found = 0;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(name) = fields.next() else { continue };
        let Some(cpu) = cpu_line_index(name) else {
            continue;
        };
        if cpus.binary_search(&cpu).is_ok() {
            busy = busy.saturating_add(busy_of_fields(fields, path, name)?);
            found += 1;
        }
    }
    if found != cpus.len() {
        return Err(BudgetError::parse(
            path,
            format!(
                "{} of {} counted CPUs have no line",
                cpus.len() - found,
                cpus.len()
            ),
        ));
    }
    Ok(busy)
}

/// Busy ns of the CPUs `cpus` from `cpuacct.usage_percpu` (one column per
/// possible CPU).
fn parse_usage_percpu(text: &str, path: &Path, cpus: &[usize]) -> Result<u64, BudgetError> {
    let columns: Vec<&str> = text.split_whitespace().collect();
    let mut busy = 0u64;
    for &cpu in cpus {
        let col = columns
            .get(cpu)
            .ok_or_else(|| BudgetError::parse(path, format!("no column for CPU {cpu}")))?;
        let v: u64 = col
            .parse()
            .map_err(|_| BudgetError::parse(path, format!("bad usage {col:?} of CPU {cpu}")))?;
        busy = busy.saturating_add(v);
    }
    Ok(busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let text = "cpu  10 1 5 100 7 2 3 4 9 9\ncpu0 5 0 2 50 3 1 1 2 0 0\ncpu1 5 1 3 50 4 1 2 2 0 0\nintr 1 2\nctxt 5\n";
        assert_eq!(parse_proc_stat(text, Path::new("s")).unwrap(), (25, 2));
        // Old kernels: only four fields.
        assert_eq!(
            parse_proc_stat("cpu 1 2 3 4\n", Path::new("s")).unwrap(),
            (6, 1)
        );
        for bad in ["", "cpu x 1 2 3", "cpu 1 2", "intr 1"] {
            let e = parse_proc_stat(bad, Path::new("/proc/stat")).unwrap_err();
            assert!(e.to_string().contains("/proc/stat"), "{bad:?}");
        }
    }

    #[test]
    fn formula() {
        // Paper: alone → all CPUs; two equal apps on 16 CPUs → 8 each.
        assert_eq!(neighbour_cap(1.0, 0.05, 160, 160, 16, 160, 16), 16);
        assert_eq!(neighbour_cap(1.0, 0.05, 80, 160, 16, 160, 16), 8);
        // Overcommit factor scales it, clamped to the budget.
        assert_eq!(neighbour_cap(1.5, 0.05, 80, 160, 16, 160, 16), 12);
        assert_eq!(neighbour_cap(3.0, 0.05, 80, 160, 16, 160, 10), 10);
        // Exactly a third of 3 CPUs is 1, not 2.
        assert_eq!(neighbour_cap(1.0, 0.0, 1, 3, 3, 3, 3), 1);
        // Busy neighbours, we are idle: 1, never 0.
        assert_eq!(neighbour_cap(1.0, 0.05, 0, 200, 2, 200, 2), 1);
        // Self a tick ahead of all: ratio clamped to 1.
        assert_eq!(neighbour_cap(1.0, 0.05, 5, 4, 2, 4, 2), 2);
        // Idle host (0/0 or below the idle fraction): the whole budget.
        assert_eq!(neighbour_cap(1.0, 0.05, 0, 0, 2, 2, 2), 2);
        assert_eq!(neighbour_cap(1.0, 0.05, 0, 5, 2, 200, 2), 2);
        assert_eq!(neighbour_cap(1.0, 0.05, 0, 0, 2, 2, 0), 1);
    }

    #[test]
    fn config_validation() {
        for bad in [
            NeighbourConfig {
                overcommit: 0.0,
                ..Default::default()
            },
            NeighbourConfig {
                overcommit: f64::NAN,
                ..Default::default()
            },
            NeighbourConfig {
                idle_fraction: 1.0,
                ..Default::default()
            },
            NeighbourConfig {
                window: Duration::ZERO,
                ..Default::default()
            },
            NeighbourConfig {
                smoothing: 0.0,
                ..Default::default()
            },
            NeighbourConfig {
                band: 0.6,
                ..Default::default()
            },
        ] {
            assert!(matches!(
                NeighbourShare::new(2, bad),
                Err(BudgetError::Config(_))
            ));
        }
    }

    #[test]
    fn update_too_soon_keeps_cap() {
        let mut s = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
        assert_eq!(s.cap(), 2);
        s.set_budget(1);
        assert_eq!(s.update().unwrap(), 1);
        assert!(NeighbourShare::for_pid(u32::MAX, 2, NeighbourConfig::default()).is_err());
    }

    #[test]
    fn host_counter_choice() {
        // This process: the cpuacct root when mounted (nanoseconds).
        let s = NeighbourShare::new(2, NeighbourConfig::default()).unwrap();
        let acct = Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists();
        assert_eq!(s.host_counter_is_ns(), acct);
        // A root without a cpuacct mount: /proc/stat ticks.
        let dir = std::env::temp_dir().join(format!("corewise-nb-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("proc/self")).unwrap();
        std::fs::write(
            dir.join("proc/stat"),
            "cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 5 0 2 50 0 0 0 0 0 0\ncpu1 5 0 3 50 0 0 0 0 0 0\n",
        )
        .unwrap();
        std::fs::write(dir.join("proc/self/mountinfo"), "").unwrap();
        let s = NeighbourShare::build(OwnClock::Process, &dir, 2, NeighbourConfig::default());
        let _ = std::fs::remove_dir_all(&dir);
        let s = s.unwrap();
        assert!(!s.host_counter_is_ns());
        assert_eq!(s.host_cpus(), 2);
        let hz = rustix::param::clock_ticks_per_second().max(1);
        assert_eq!(s.last.busy_ns, 15 * (1_000_000_000 / hz));
    }

    #[test]
    fn counts_only_the_cpus_it_is_restricted_to() {
        let text = "cpu  10 1 5 100 7 2 3 4 9 9\ncpu0 5 0 2 50 3 1 1 2 0 0\ncpu2 5 1 3 50 4 1 2 2 0 0\nintr 1 2\n";
        let p = Path::new("s");
        assert_eq!(parse_proc_stat_cpus(text, p, &[0]).unwrap(), 11);
        assert_eq!(parse_proc_stat_cpus(text, p, &[2]).unwrap(), 14);
        assert_eq!(parse_proc_stat_cpus(text, p, &[0, 2]).unwrap(), 25);
        // CPU 1 is offline (no line): the list is stale, an error.
        assert!(parse_proc_stat_cpus(text, p, &[0, 1]).is_err());
        assert_eq!(parse_usage_percpu("7 11 13 \n", p, &[0, 2]).unwrap(), 20);
        assert!(parse_usage_percpu("7 11\n", p, &[3]).is_err());
        assert!(parse_usage_percpu("7 x\n", p, &[1]).is_err());

        // Through a share built on a fake root: 4 CPUs, restricted to 1-2.
        let dir = std::env::temp_dir().join(format!("corewise-nb-cpus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc/self")).unwrap();
        std::fs::create_dir_all(dir.join("acct")).unwrap();
        std::fs::write(
            dir.join("proc/stat"),
            "cpu  40 0 0 100\ncpu0 1 0 0 25\ncpu1 2 0 0 25\ncpu2 3 0 0 25\ncpu3 4 0 0 25\n",
        )
        .unwrap();
        std::fs::write(dir.join("proc/self/mountinfo"), "").unwrap();
        let ticks = NeighbourShare::build(OwnClock::Process, &dir, 4, NeighbourConfig::default())
            .and_then(|mut s| {
                s.restrict_to(&"1-2".parse().unwrap())?;
                Ok(s)
            });
        // The cgroup counter: `cpuacct.usage_percpu` instead of the total.
        std::fs::write(dir.join("acct/cpuacct.usage"), "1000\n").unwrap();
        std::fs::write(dir.join("acct/cpuacct.usage_percpu"), "100 200 300 400\n").unwrap();
        std::fs::write(
            dir.join("proc/self/mountinfo"),
            "40 30 0:35 / /acct rw - cgroup cgroup rw,cpuacct\n",
        )
        .unwrap();
        let ns = NeighbourShare::build(OwnClock::Process, &dir, 4, NeighbourConfig::default())
            .and_then(|mut s| {
                s.restrict_to(&"1-2".parse().unwrap())?;
                let restricted = (s.host_cpus(), s.last.busy_ns);
                // Every CPU again: the whole host's counter.
                s.restrict_to(&"0-3".parse().unwrap())?;
                Ok((restricted, (s.host_cpus(), s.last.busy_ns)))
            });
        let _ = std::fs::remove_dir_all(&dir);
        let ticks = ticks.unwrap();
        let hz = rustix::param::clock_ticks_per_second().max(1);
        assert_eq!(ticks.host_cpus(), 2);
        assert_eq!(ticks.last.busy_ns, 5 * (1_000_000_000 / hz));
        assert!(!ticks.host_counter_is_ns());
        assert_eq!(ns.unwrap(), ((2, 500), (4, 1000)));
    }

    #[test]
    fn a_cpuacct_root_that_misses_host_load_is_dropped() {
        let dir = std::env::temp_dir().join(format!("corewise-nb-ns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc/self")).unwrap();
        std::fs::create_dir_all(dir.join("acct")).unwrap();
        let stat = |busy: u64| {
            std::fs::write(
                dir.join("proc/stat"),
                format!("cpu  {busy} 0 0 100 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n"),
            )
            .unwrap();
        };
        stat(10);
        std::fs::write(dir.join("acct/cpuacct.usage"), "1000\n").unwrap();
        std::fs::write(
            dir.join("proc/self/mountinfo"),
            "40 30 0:35 / /acct rw - cgroup cgroup rw,cpuacct\n",
        )
        .unwrap();
        let built = NeighbourShare::build(OwnClock::Process, &dir, 2, NeighbourConfig::default());
        let mut s = built.unwrap();
        assert!(s.host_counter_is_ns());
        s.check.as_mut().unwrap().every = Duration::ZERO;
        // The host's busy time grows, the cgroup root's keeps up: kept.
        let hz = rustix::param::clock_ticks_per_second().max(1);
        std::thread::sleep(Duration::from_millis(20));
        stat(10 + hz); // a whole CPU-second more
        std::fs::write(dir.join("acct/cpuacct.usage"), "990001000\n").unwrap();
        s.update().unwrap();
        assert!(s.host_counter_is_ns());
        // It grows, the cgroup root's does not: /proc/stat from now on.
        std::thread::sleep(Duration::from_millis(20));
        stat(10 + 2 * hz);
        s.update().unwrap();
        let dropped = !s.host_counter_is_ns();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(dropped, "the cpuacct root was kept");
    }
}
