//! Creation throughput from one spawner, round by round, each round
//! between two measurements of the cores' cache-line round trip.
//!
//! A user thread on core 0 creates N detached threads (default 500 000)
//! that power of two choices places on cores 0 and 1; each only counts
//! itself in its core's counter. A round ends when all have run. This is
//! the loop of `corewise-bench primitives`' creation-throughput row, with
//! the round trip taken just before and just after each round: on a VM
//! whose host moves the two vCPUs (a round trip of ~65 ns on one
//! placement and ~310 ns on another, on the same AMD EPYC host), a round
//! whose two round trips differ ran across a move, and two builds are
//! compared round by round at the same placement.
//!
//! `cargo run --release --example creation_rate [N] [ROUNDS]` (ROUNDS
//! default 3).

mod probe;

use corewise::thread::Builder;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A counter alone on its cache line (and the next, against the adjacent
/// line prefetcher).
#[repr(align(128))]
#[derive(Default)]
struct Line(AtomicU64);

/// The mean round trip (ns) of a line written in turn by a user thread on
/// core 0 and one on core 1, over 20 000 trips.
fn round_trip(rt: &corewise::Runtime) -> f64 {
    const TRIPS: u64 = 20_000;
    let ball: &'static Line = Box::leak(Box::default());
    let pong = Builder::new()
        .core(1)
        .spawn_in(rt, move || {
            for i in 0..TRIPS {
                while ball.0.load(Ordering::Acquire) != 2 * i + 1 {}
                ball.0.store(2 * i + 2, Ordering::Release);
            }
        })
        .unwrap_or_else(|e| probe::fail("creation_rate", e));
    let ns = Builder::new()
        .core(0)
        .spawn_in(rt, move || {
            let t = Instant::now();
            for i in 0..TRIPS {
                ball.0.store(2 * i + 1, Ordering::Release);
                while ball.0.load(Ordering::Acquire) != 2 * i + 2 {}
            }
            t.elapsed().as_nanos() as f64 / TRIPS as f64
        })
        .unwrap_or_else(|e| probe::fail("creation_rate", e))
        .join()
        .unwrap_or_else(|e| probe::fail("creation_rate", e));
    pong.join()
        .unwrap_or_else(|e| probe::fail("creation_rate", e));
    ns
}

fn main() {
    let n = probe::count(500_000).max(1_000);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let rt = corewise::Runtime::builder()
        .cpus([0, 1])
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap_or_else(|e| {
            probe::fail("creation_rate", format!("no runtime on cpus 0 and 1: {e}"))
        });
    for round in 1..=rounds {
        let before = round_trip(&rt);
        let counters: &'static [Line] = Box::leak((0..2).map(|_| Line::default()).collect());
        let secs = Builder::new()
            .core(0)
            .spawn_in(&rt, move || {
                let start = Instant::now();
                for _ in 0..n {
                    loop {
                        match Builder::new().spawn_detached(move || {
                            let c = &counters[corewise::current_core().unwrap_or(0).min(1)];
                            c.0.store(c.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                        }) {
                            Ok(_) => break,
                            Err(corewise::SpawnError::ThreadLimit { .. }) => corewise::yield_now(),
                            Err(e) => probe::fail("creation_rate", e),
                        }
                    }
                }
                let total = || {
                    counters
                        .iter()
                        .map(|c| c.0.load(Ordering::Relaxed))
                        .sum::<u64>()
                };
                while total() < n {
                    corewise::yield_now();
                }
                start.elapsed().as_secs_f64()
            })
            .unwrap_or_else(|e| probe::fail("creation_rate", e))
            .join()
            .unwrap_or_else(|e| probe::fail("creation_rate", e));
        let after = round_trip(&rt);
        println!(
            "round {round}: round trip {before:.0} / {after:.0} ns, {:.2} M/s, threads on core 0 / 1: {} / {}",
            n as f64 / secs / 1e6,
            counters[0].0.load(Ordering::Relaxed),
            counters[1].0.load(Ordering::Relaxed)
        );
    }
}
