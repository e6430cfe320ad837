//! A busy runtime wakes no helper thread of its own to sample the
//! neighbour share: the handoff monitor, awake every 10 ms while the
//! runtime is busy anyway, takes the samples, and the budget watcher
//! thread keeps only a backstop. Without the monitor the watcher thread
//! samples on its own schedule (see `docs/architecture.md`, "Samples on
//! the monitor's wakeups").
//!
//! One test in its own binary: the watcher thread is found by name in
//! `/proc/self/task`, so no other runtime may run in the process; the two
//! configurations run one after the other.

use corewise::Runtime;
use std::time::{Duration, Instant};

/// Voluntary context switches (sleeps) of this process's threads named
/// `name` (a kernel thread name is cut to 15 bytes).
fn sleeps_of(name: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != &name[..name.len().min(15)] {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// Computes for `d` without a runtime call.
fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Keeps both cores of `rt` busy with 2 ms runs for 1.5 s and returns the
/// share samples taken and the budget watcher thread's sleeps in the last
/// second.
fn busy_second(rt: &Runtime) -> (u64, u64) {
    let budget = rt.budget().clone();
    rt.block_on(move || {
        let end = Instant::now() + Duration::from_millis(1500);
        let workers: Vec<_> = (0..4)
            .map(|_| {
                corewise::spawn(move || {
                    while Instant::now() < end {
                        spin(Duration::from_millis(2));
                        corewise::thread::yield_now();
                    }
                })
                .unwrap()
            })
            .collect();
        corewise::sleep(Duration::from_millis(400));
        let before = (budget.reads(), sleeps_of("corewise-budget"));
        corewise::sleep(Duration::from_secs(1));
        let after = (budget.reads(), sleeps_of("corewise-budget"));
        for w in workers {
            w.join().unwrap();
        }
        (after.0 - before.0, after.1 - before.1)
    })
    .unwrap()
}

#[test]
fn a_busy_runtime_samples_the_share_on_the_monitors_wakeups() {
    let rt = Runtime::builder().min_cores(2).build().unwrap();
    if rt.budget().cores() < 2 {
        eprintln!("skipped: the neighbour share is sampled only with a budget of 2 CPUs or more");
        return;
    }
    let (reads, watcher) = busy_second(&rt);
    drop(rt);
    // 10 ms windows: about 100 samples in the second.
    assert!(reads >= 30, "{reads} share samples in a busy second");
    // Nothing for the samples or the budget re-read: the monitor takes both.
    assert!(
        watcher <= 5,
        "the budget watcher woke {watcher} times in a busy second"
    );

    // Without the monitor the watcher thread samples each window itself.
    let rt = Runtime::builder()
        .min_cores(2)
        .blocking_handoff(false)
        .build()
        .unwrap();
    let (reads, watcher) = busy_second(&rt);
    drop(rt);
    assert!(
        reads >= 30,
        "{reads} share samples in a busy second without the monitor"
    );
    assert!(
        watcher >= 30,
        "the budget watcher woke only {watcher} times in a busy second without the monitor"
    );
}
