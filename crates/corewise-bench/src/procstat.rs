//! Per-thread CPU time of this process, from /proc.

use std::collections::HashSet;
use std::time::Duration;

/// Kernel thread ids of this process's threads.
pub fn thread_ids() -> HashSet<i32> {
    let mut out = HashSet::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Some(id) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                out.insert(id);
            }
        }
    }
    out
}

/// The calling thread's kernel thread id.
pub fn current_tid() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// CPU time (ns) thread `tid` of this process has used so far: from
/// `schedstat` when present, else from `stat` (clock-tick resolution).
/// A thread that has exited counts as 0.
pub fn thread_cpu_ns(tid: i32) -> u64 {
    let base = format!("/proc/self/task/{tid}");
    if let Ok(s) = std::fs::read_to_string(format!("{base}/schedstat")) {
        if let Some(v) = s.split_whitespace().next().and_then(|x| x.parse().ok()) {
            return v;
        }
    }
    let Ok(s) = std::fs::read_to_string(format!("{base}/stat")) else {
        return 0;
    };
    // Fields after the command name (which may contain spaces) start at ')'.
    let Some(rest) = s.rfind(')').map(|i| &s[i + 1..]) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; rest starts at field 3.
    let ticks: u64 = [11usize, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|x| x.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    ticks * (1_000_000_000 / hz)
}

/// CPU the given threads use over `window` of wall time, as a percentage of
/// one core. The caller makes sure the threads are idle meanwhile.
pub fn idle_cpu_percent(tids: &[i32], window: Duration) -> f64 {
    let before: u64 = tids.iter().map(|&t| thread_cpu_ns(t)).sum();
    let start = std::time::Instant::now();
    std::thread::sleep(window);
    let wall = start.elapsed().as_nanos() as f64;
    let after: u64 = tids.iter().map(|&t| thread_cpu_ns(t)).sum();
    100.0 * after.saturating_sub(before) as f64 / wall.max(1.0)
}

/// Threads of this process that are not in `before`.
pub fn new_threads_since(before: &HashSet<i32>) -> Vec<i32> {
    let mut v: Vec<i32> = thread_ids().difference(before).copied().collect();
    v.sort_unstable();
    v
}

/// Time the hypervisor has taken from each CPU of this machine so far (the
/// `steal` column of `/proc/stat`), in ns, indexed by CPU number; empty
/// where the kernel does not report it. On a virtual machine a vCPU the
/// host deschedules stalls whatever runs on it, so a latency measured while
/// the host took a large share of the CPU measures the host.
pub fn steal_ns() -> Vec<u64> {
    let Ok(s) = std::fs::read_to_string("/proc/stat") else {
        return Vec::new();
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick_ns = 1_000_000_000 / if hz > 0 { hz as u64 } else { 100 };
    let mut out = Vec::new();
    for line in s.lines() {
        let mut f = line.split_whitespace();
        let Some(cpu) = f
            .next()
            .and_then(|c| c.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        // user nice system idle iowait irq softirq steal
        let Some(steal) = f.nth(7).and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        if out.len() <= cpu {
            out.resize(cpu + 1, 0);
        }
        out[cpu] = steal * tick_ns;
    }
    out
}

/// The share of `wall` (ns) that the host took from `cpu` between two
/// [`steal_ns`] readings, in percent (`None` when either lacks the CPU).
pub fn steal_percent(before: &[u64], after: &[u64], cpu: usize, wall: u64) -> Option<f64> {
    let (a, b) = (before.get(cpu)?, after.get(cpu)?);
    Some(100.0 * b.saturating_sub(*a) as f64 / wall.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_read_for_every_cpu_and_only_grows() {
        let a = steal_ns();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(a.len() >= cpus, "{a:?} for {cpus} CPUs");
        let b = steal_ns();
        assert!(a.iter().zip(&b).all(|(x, y)| y >= x), "{a:?} then {b:?}");
    }

    #[test]
    fn steal_percent_is_the_share_of_the_wall_time() {
        assert_eq!(steal_percent(&[0, 10], &[0, 30], 1, 1_000), Some(2.0));
        assert_eq!(steal_percent(&[0, 30], &[0, 10], 1, 1_000), Some(0.0));
        assert_eq!(steal_percent(&[], &[0, 30], 1, 1_000), None);
    }
}
