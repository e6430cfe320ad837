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
