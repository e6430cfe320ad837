//! The neighbour share of the friendlypool paper (§5.2).
//!
//! Under a fair scheduler, a process's share of the host's busy CPU time is
//! its share of the CPUs while everyone is busy. The paper sizes the active
//! pool as
//!
//! ```text
//! active = ceil(O · cpu_self / cpu_all · CPUs)
//! ```
//!
//! where `cpu_self` is the process's CPU time (utime + stime of
//! `/proc/<pid>/stat`), `cpu_all` the non-idle time of the whole host (the
//! `cpu` line of `/proc/stat`: user + nice + system + irq + softirq +
//! steal; guest time is already inside user and nice), both as deltas over
//! one window; `CPUs` the host's CPUs (the `cpuN` lines) and `O` the
//! overcommit factor (1.0 by default). Both counters advance in clock ticks,
//! so the paper's window is one tick (10 ms at 100 Hz); shorter windows
//! only see noise. The result is clamped to `[1, budget]`.
//!
//! **An idle host.** The formula is a fair-share estimate and only means
//! something while there is demand to share. When the host is (nearly) idle
//! `cpu_all` is ≈ 0 and the ratio is 0/0 or pure tick noise; a process that
//! is itself idle would then see `ceil(0) → 1` and could never grow when
//! its load arrives. The paper does not spell this case out (it argues from
//! "alone on the host, the usage will be 100%"), so this module decides:
//! when the host's busy time over the window is at most
//! [`NeighbourConfig::idle_fraction`] of its capacity (CPUs × window; 5% by
//! default, i.e. zero ticks for a 10 ms window on a small machine) there are
//! no neighbours to crowd, and the cap is the whole budget. When the host is
//! busy the paper's formula applies unchanged, and it lets a busy process
//! grow by itself: whoever runs gets a larger share of the host's demand in
//! the next window. The ratio is also clamped to 1 (the two files are
//! updated at slightly different moments, so self can exceed all by a tick).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroup::{read_required, under_root};
use super::BudgetError;

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
    /// The sampling window (default 10 ms, one tick at 100 Hz).
    pub window: Duration,
    /// Host busy time at or below this fraction of its capacity over a
    /// window counts as idle, and the cap is then the whole budget
    /// (default 0.05; in `[0, 1)`).
    pub idle_fraction: f64,
}

impl Default for NeighbourConfig {
    fn default() -> Self {
        NeighbourConfig {
            overcommit: 1.0,
            window: Duration::from_millis(10),
            idle_fraction: 0.05,
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
        if self.window.is_zero() {
            return Err(BudgetError::Config("window must be > 0".into()));
        }
        Ok(())
    }
}

/// One reading of the CPU-time counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// utime + stime of the process, in clock ticks.
    pub self_ticks: u64,
    /// Non-idle time of the whole host, in clock ticks.
    pub busy_ticks: u64,
    /// CPUs of the host (`cpuN` lines of `/proc/stat`).
    pub host_cpus: usize,
    /// When it was read.
    pub at: Instant,
}

/// The paper's formula with this module's idle rule, as a pure function.
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
/// ```
#[derive(Debug)]
pub struct NeighbourShare {
    config: NeighbourConfig,
    budget: usize,
    stat_file: PathBuf,
    proc_stat_file: PathBuf,
    ticks_per_sec: u64,
    last: CpuTimes,
    cap: usize,
}

impl NeighbourShare {
    /// Starts measuring this process; the first cap is the whole `budget`.
    pub fn new(budget: usize, config: NeighbourConfig) -> Result<Self, BudgetError> {
        Self::build(None, Path::new("/"), budget, config)
    }

    /// Starts measuring process `pid` instead.
    pub fn for_pid(pid: u32, budget: usize, config: NeighbourConfig) -> Result<Self, BudgetError> {
        Self::build(Some(pid), Path::new("/"), budget, config)
    }

    fn build(
        pid: Option<u32>,
        root: &Path,
        budget: usize,
        config: NeighbourConfig,
    ) -> Result<Self, BudgetError> {
        config.validate()?;
        let stat_file = match pid {
            Some(p) => under_root(root, &Path::new("/proc").join(p.to_string()).join("stat")),
            None => under_root(root, Path::new("/proc/self/stat")),
        };
        let proc_stat_file = under_root(root, Path::new("/proc/stat"));
        let mut share = NeighbourShare {
            config,
            budget: budget.max(1),
            stat_file,
            proc_stat_file,
            ticks_per_sec: rustix::param::clock_ticks_per_second().max(1),
            last: CpuTimes {
                self_ticks: 0,
                busy_ticks: 0,
                host_cpus: 1,
                at: Instant::now(),
            },
            cap: budget.max(1),
        };
        share.last = share.read_times()?;
        Ok(share)
    }

    /// Reads the counters now, without updating anything.
    pub fn read_times(&self) -> Result<CpuTimes, BudgetError> {
        let stat = read_required(&self.proc_stat_file)?;
        let (busy_ticks, host_cpus) = parse_proc_stat(&stat, &self.proc_stat_file)?;
        let own = read_required(&self.stat_file)?;
        let self_ticks = parse_pid_stat(&own, &self.stat_file)?;
        Ok(CpuTimes {
            self_ticks,
            busy_ticks,
            host_cpus,
            at: Instant::now(),
        })
    }

    /// Reads the counters and returns the cap over the time since the last
    /// update. Less than one clock tick since then carries no information:
    /// the cap is left as it was and the window keeps growing.
    pub fn update(&mut self) -> Result<usize, BudgetError> {
        let now = self.read_times()?;
        let elapsed = now.at.saturating_duration_since(self.last.at);
        let tick = Duration::from_nanos(1_000_000_000 / self.ticks_per_sec);
        if elapsed < tick {
            return Ok(self.cap);
        }
        let self_delta = now.self_ticks.saturating_sub(self.last.self_ticks);
        let all_delta = now.busy_ticks.saturating_sub(self.last.busy_ticks);
        let capacity_ticks =
            elapsed.as_secs_f64() * self.ticks_per_sec as f64 * now.host_cpus as f64;
        self.cap = neighbour_cap(
            self.config.overcommit,
            self.config.idle_fraction,
            self_delta,
            all_delta,
            now.host_cpus,
            capacity_ticks as u64,
            self.budget,
        );
        self.last = now;
        Ok(self.cap)
    }

    /// Sleeps until a full window has passed since the last update, then
    /// [`update`](Self::update)s.
    pub fn sample(&mut self) -> Result<usize, BudgetError> {
        let since = self.last.at.elapsed();
        if since < self.config.window {
            std::thread::sleep(self.config.window - since);
        }
        self.update()
    }

    /// The cap from the last update (the budget before the first).
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The budget the cap is clamped to.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Changes the budget (for example after [`crate::budget::BudgetWatcher`]
    /// saw a new one); the current cap is clamped to it at once.
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget.max(1);
        self.cap = self.cap.min(self.budget);
    }

    /// The settings.
    pub fn config(&self) -> &NeighbourConfig {
        &self.config
    }

    /// Changes the settings (validated as in [`new`](Self::new)).
    pub fn set_config(&mut self, config: NeighbourConfig) -> Result<(), BudgetError> {
        config.validate()?;
        self.config = config;
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
            let mut vals = [0u64; 8];
            let mut n = 0;
            for (slot, f) in vals.iter_mut().zip(fields) {
                *slot = f.parse().map_err(|_| {
                    BudgetError::parse(path, format!("bad number {f:?} on the cpu line"))
                })?;
                n += 1;
            }
            if n < 4 {
                return Err(BudgetError::parse(
                    path,
                    "cpu line has fewer than 4 fields".into(),
                ));
            }
            // user nice system idle iowait irq softirq steal
            let [user, nice, system, _idle, _iowait, irq, softirq, steal] = vals;
            busy = Some(
                user.saturating_add(nice)
                    .saturating_add(system)
                    .saturating_add(irq)
                    .saturating_add(softirq)
                    .saturating_add(steal),
            );
        } else if name.len() > 3
            && name.starts_with("cpu")
            && name.as_bytes()[3..].iter().all(u8::is_ascii_digit)
        {
            cpus += 1;
        }
    }
    match busy {
        Some(b) => Ok((b, cpus.max(1))),
        None => Err(BudgetError::parse(path, "no aggregate cpu line".into())),
    }
}

/// utime + stime from `/proc/<pid>/stat` (fields 14 and 15; the command
/// name in field 2 may hold spaces and parentheses, so fields are counted
/// from the last `)`).
pub(crate) fn parse_pid_stat(text: &str, path: &Path) -> Result<u64, BudgetError> {
    let Some(close) = text.rfind(')') else {
        return Err(BudgetError::parse(
            path,
            "no ')' after the command name".into(),
        ));
    };
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state), so field k is rest[k - 3].
    let (Some(u), Some(s)) = (rest.get(11), rest.get(12)) else {
        return Err(BudgetError::parse(path, "fewer than 15 fields".into()));
    };
    let parse = |f: &str| {
        f.parse::<u64>()
            .map_err(|_| BudgetError::parse(path, format!("bad tick count {f:?}")))
    };
    Ok(parse(u)?.saturating_add(parse(s)?))
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
    fn parses_pid_stat() {
        let text = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 1 0 5 0 0\n";
        assert_eq!(parse_pid_stat(text, Path::new("s")).unwrap(), 21);
        for bad in ["", "42 (x) S 1 2", "42 (x) S 1 42 42 0 -1 4 1 0 0 0 x 4"] {
            assert!(parse_pid_stat(bad, Path::new("s")).is_err(), "{bad:?}");
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
}
