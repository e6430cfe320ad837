//! A busy runtime wakes no helper thread to sample the neighbour share:
//! the dispatchers take the samples between runs, and the budget watcher
//! thread keeps only its once-a-second re-read (see `docs/architecture.md`,
//! "The neighbour share signal"). The handoff monitor is off here, so that
//! nothing else could take the samples: before, the watcher thread woke for
//! every 10 ms window then.
//!
//! One test in its own binary: the watcher thread is found by name in
//! `/proc/self/task`, so no other runtime may run in the process.

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

#[test]
fn a_busy_runtime_samples_the_share_on_its_dispatchers_without_a_helper_wakeup() {
    let rt = Runtime::builder()
        .min_cores(2)
        .blocking_handoff(false)
        .build()
        .unwrap();
    if rt.budget().cores() < 2 {
        eprintln!("skipped: the neighbour share is sampled only with a budget of 2 CPUs or more");
        return;
    }
    let budget = rt.budget().clone();
    let (reads, watcher) = rt
        .block_on(move || {
            // Four threads keep both cores busy with 2 ms runs for 1.6 s.
            let end = Instant::now() + Duration::from_millis(1600);
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
            // The first half second lets every core reach its long runs
            // (and the dispatchers their clock read after each); the next
            // second is counted.
            corewise::sleep(Duration::from_millis(500));
            let before = (budget.reads(), sleeps_of("corewise-budget"));
            corewise::sleep(Duration::from_secs(1));
            let after = (budget.reads(), sleeps_of("corewise-budget"));
            for w in workers {
                w.join().unwrap();
            }
            (after.0 - before.0, after.1 - before.1)
        })
        .unwrap();
    // 10 ms windows: about 100 samples in the second.
    assert!(reads >= 30, "{reads} share samples in a busy second");
    // The budget re-read (once a second), and nothing for the samples.
    assert!(
        watcher <= 5,
        "the budget watcher woke {watcher} times in a busy second"
    );
}
