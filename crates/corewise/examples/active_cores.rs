//! Watches a busy default runtime's active cores: how many cores its
//! neighbour awareness lets it hold where it runs.
//!
//! `cargo run --release -p corewise --example active_cores [SECONDS]`
//! (default 4) builds a default runtime (neighbour awareness on), keeps
//! four user threads per allowed CPU busy, and prints the runtime's CPUs,
//! its CPU budget and, every 100 ms, `Runtime::active_cores`. Start it
//! beside a neighbour (`sh -c 'while :; do :; done' &`), confined or not
//! (`taskset -c 0,1 ...`), to see the cap follow the process's share of
//! the CPUs it may use; `docs/benchmarks.md` has the runs in an 8-CPU
//! guest (`scripts/guest.sh -c 8`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4.0);
    let rt = match corewise::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("active_cores: cannot build the runtime: {e}");
            std::process::exit(1);
        }
    };
    let budget = rt.budget().snapshot();
    println!(
        "runtime CPUs {:?}; budget {} cores of CPUs {}",
        rt.cpus(),
        budget.cores(),
        budget.cpus()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..4 * rt.cpus().len().max(1) {
        let stop = stop.clone();
        let spawned = rt.spawn(move || {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                // Let the runtime move the thread when a core goes.
                corewise::yield_now();
            }
            x
        });
        match spawned {
            Ok(h) => busy.push(h),
            Err(e) => eprintln!("active_cores: spawn: {e}"),
        }
    }
    let samples = (secs * 10.0).ceil().max(1.0) as usize;
    let mut seen = Vec::with_capacity(samples);
    for _ in 0..samples {
        std::thread::sleep(Duration::from_millis(100));
        seen.push(rt.active_cores());
    }
    stop.store(true, Ordering::Relaxed);
    for h in busy {
        let _ = h.join();
    }
    println!("active cores every 100 ms: {seen:?}");
}
