//! Measures the candidate sources of the neighbour share on this kernel:
//! the cost of one read and the smallest step the counter moves by while a
//! spinner keeps one CPU busy. `cargo run --release --example share_signals`.
//!
//! Sources that do not exist here are reported as missing.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The first number found after `key` (or the first number of the file).
fn number(text: &str, key: &str) -> Option<u64> {
    let rest = if key.is_empty() {
        text
    } else {
        &text[text.find(key)? + key.len()..]
    };
    rest.split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

/// Busy time of the aggregate `cpu` line of /proc/stat, in ticks.
fn proc_stat_busy(text: &str) -> Option<u64> {
    let line = text.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some(
        v.iter()
            .take(8)
            .enumerate()
            .filter(|(i, _)| *i != 3 && *i != 4)
            .map(|(_, x)| x)
            .sum(),
    )
}

fn process_cputime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Name, unit, path and parser of a file source.
type Candidate = (
    &'static str,
    &'static str,
    &'static str,
    fn(&str) -> Option<u64>,
);

struct Source {
    name: &'static str,
    unit: &'static str,
    read: Box<dyn FnMut() -> Option<u64>>,
}

fn file_source(
    name: &'static str,
    unit: &'static str,
    path: &'static str,
    parse: fn(&str) -> Option<u64>,
) -> Option<Source> {
    let file = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; 8192];
    Some(Source {
        name,
        unit,
        read: Box::new(move || {
            let n = file.read_at(&mut buf, 0).ok()?;
            parse(std::str::from_utf8(&buf[..n]).ok()?)
        }),
    })
}

fn main() {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let task_schedstat: &'static str =
        Box::leak(format!("/proc/self/task/{tid}/schedstat").into_boxed_str());
    let mut sources: Vec<Source> = vec![Source {
        name: "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)",
        unit: "ns",
        read: Box::new(|| Some(process_cputime_ns())),
    }];
    let candidates: [Candidate; 8] = [
        (
            "/proc/self/stat utime+stime",
            "tick",
            "/proc/self/stat",
            |t| {
                let rest = &t[t.rfind(')')? + 1..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            },
        ),
        (
            "/proc/self/task/N/schedstat run",
            "ns",
            task_schedstat,
            |t| number(t, ""),
        ),
        ("/proc/stat busy", "tick", "/proc/stat", proc_stat_busy),
        (
            "v1 cpuacct.usage (root)",
            "ns",
            "/sys/fs/cgroup/cpuacct/cpuacct.usage",
            |t| number(t, ""),
        ),
        (
            "v2 cpu.stat usage_usec (root)",
            "us",
            "/sys/fs/cgroup/unified/cpu.stat",
            |t| number(t, "usage_usec"),
        ),
        (
            "v2 cpu.stat usage_usec (root, /sys/fs/cgroup)",
            "us",
            "/sys/fs/cgroup/cpu.stat",
            |t| number(t, "usage_usec"),
        ),
        (
            "/proc/pressure/cpu some total",
            "us",
            "/proc/pressure/cpu",
            |t| number(t, "total="),
        ),
        ("/proc/loadavg running", "threads", "/proc/loadavg", |t| {
            number(t.split_whitespace().nth(3)?, "")
        }),
    ];
    for (name, unit, path, parse) in candidates {
        match file_source(name, unit, path, parse) {
            Some(s) => sources.push(s),
            None => println!("{name}: missing ({path})"),
        }
    }
    // One CPU kept busy by a spinner thread of this process.
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::hint::black_box(Instant::now());
            }
        });
        measure(&mut sources);
        done.store(true, Ordering::Relaxed);
    });
}

/// Prints each source's read cost and step sizes.
fn measure(sources: &mut [Source]) {
    std::thread::sleep(Duration::from_millis(50));
    println!(
        "{:<48} {:>10} {:>14} {:>14}",
        "source", "read µs", "min step", "median step"
    );
    for s in sources.iter_mut() {
        let n = 20_000u32;
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box((s.read)());
        }
        let cost = t.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        // Steps: read every 1 ms for 200 ms, collect the non-zero deltas.
        let mut steps = Vec::new();
        let mut last = (s.read)();
        for _ in 0..200 {
            std::thread::sleep(Duration::from_millis(1));
            let now = (s.read)();
            if let (Some(a), Some(b)) = (last, now) {
                if b != a {
                    steps.push(b.abs_diff(a));
                }
            }
            last = now;
        }
        steps.sort_unstable();
        let (min, med) = match steps.first() {
            Some(&m) => (m, steps[steps.len() / 2]),
            None => (0, 0),
        };
        println!(
            "{:<48} {:>10.2} {:>11} {:<2} {:>11} {:<2} ({} changes in 200 reads)",
            s.name,
            cost,
            min,
            s.unit,
            med,
            s.unit,
            steps.len()
        );
    }
}
