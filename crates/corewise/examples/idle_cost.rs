//! What a default runtime (neighbour awareness on) costs when idle, and
//! what its budget watcher costs when busy.
//!
//! `cargo run --release --example idle_cost [SECONDS]` (default 10):
//! 1. idle: the process's utime + stime (`/proc/self/stat`) and its CPU
//!    clock over SECONDS with the runtime built and nothing to run;
//! 2. busy: the CPU time of the helper threads (`corewise-budget`, the
//!    watcher, and `corewise-monitor`, the handoff monitor, which samples
//!    the neighbour share when every dispatcher sits in one long run, as
//!    here (otherwise the dispatchers do, between runs); from
//!    `/proc/self/task/N/schedstat`) and their wakeups (voluntary context
//!    switches) over SECONDS while one spinning user thread per core keeps
//!    every core busy.
//!
//! Both as a percentage of one core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn stat_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rfind(')').map_or("", |i| &s[i + 1..]);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

fn cpu_clock_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The sum of `read(task directory)` over this process's threads named
/// `name` (the kernel keeps 15 bytes of a name).
fn sum_over_threads(name: &str, read: impl Fn(&std::path::Path) -> Option<u64>) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            total += read(&p).unwrap_or(0);
        }
    }
    total
}

/// Run time in ns of this process's threads named `name`.
fn threads_named_ns(name: &str) -> u64 {
    sum_over_threads(name, |p| {
        let s = std::fs::read_to_string(p.join("schedstat")).ok()?;
        s.split_whitespace().next()?.parse().ok()
    })
}

/// Voluntary context switches (wakeups after a sleep) of this process's
/// threads named `name`.
fn threads_named_switches(name: &str) -> u64 {
    sum_over_threads(name, |p| {
        let s = std::fs::read_to_string(p.join("status")).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
            .trim()
            .parse()
            .ok()
    })
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10.0);
    let window = Duration::from_secs_f64(secs);
    let hz = rustix::param::clock_ticks_per_second() as f64;
    let rt = corewise::Runtime::new().unwrap();
    assert_eq!(rt.block_on(|| 1).unwrap(), 1);
    // Let the cores fall asleep.
    std::thread::sleep(Duration::from_millis(500));

    let (t0, c0, w0) = (
        stat_ticks(),
        cpu_clock_ns(),
        threads_named_ns("corewise-budget"),
    );
    let start = Instant::now();
    std::thread::sleep(window);
    let wall = start.elapsed().as_secs_f64();
    let (t1, c1, w1) = (
        stat_ticks(),
        cpu_clock_ns(),
        threads_named_ns("corewise-budget"),
    );
    println!(
        "idle {secs} s: utime+stime {:.3} % of a core ({} ticks), CPU clock {:.3} %, watcher thread {:.3} %",
        (t1 - t0) as f64 / hz / wall * 100.0,
        t1 - t0,
        (c1 - c0) as f64 / 1e9 / wall * 100.0,
        (w1 - w0) as f64 / 1e9 / wall * 100.0,
    );

    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..rt.cores())
        .map(|_| {
            let stop = stop.clone();
            rt.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..10_000 {
                        std::hint::spin_loop();
                    }
                    corewise::yield_now();
                }
            })
            .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Run time (ns) and wakeups of the watcher and the monitor thread.
    let helpers = || {
        ["corewise-budget", "corewise-monito"]
            .map(|name| (threads_named_ns(name), threads_named_switches(name)))
    };
    let before = helpers();
    let start = Instant::now();
    std::thread::sleep(window);
    let wall = start.elapsed().as_secs_f64();
    let after = helpers();
    let [(w, ws), (m, ms)] = [0, 1].map(|i| {
        (
            (after[i].0 - before[i].0) as f64 / 1e9 / wall * 100.0,
            (after[i].1 - before[i].1) as f64 / wall,
        )
    });
    let active = rt.active_cores();
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    println!(
        "busy {secs} s ({active} cores active at the end): watcher thread {w:.3} % of a core ({ws:.0} wakeups/s), monitor thread {m:.3} % ({ms:.0} wakeups/s)",
    );
}
