//! The cost of a cross-core condition-variable notify, with the mutex and
//! the condition variable on cache lines of their own (in `primitives` they
//! share an allocation, so whether they share a line depends on where the
//! allocator put it, and the figure moves from run to run with it).
//!
//! A user thread on core 1 waits on the condition variable; one on core 0
//! locks the mutex, sets the flag, unlocks and notifies, N times (default
//! 20 000, 5 µs apart, the first 1 000 not counted). The time is from just
//! before `notify_one` to the waiter holding the mutex again. The run also
//! measures the two cores' cache-line round trip (a line written in turn
//! by each), the floor of any cross-core wakeup, and prints both with
//! their ratio.
//!
//! `cargo run --release --example notify_cost [N]`

mod probe;

use corewise::sync::{Condvar, Mutex};
use corewise::thread::Builder;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A value alone on its cache line (and the next, against the adjacent
/// line prefetcher).
#[repr(align(128))]
struct Line<T>(T);

/// The time-stamp counter: cheap and the same on both cores.
#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` exists on every x86_64 CPU and only reads the counter.
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// Nanoseconds of the monotonic clock, elsewhere.
#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Counter ticks per nanosecond, over 50 ms.
fn ticks_per_ns() -> f64 {
    let (t, i) = (ticks(), Instant::now());
    std::thread::sleep(Duration::from_millis(50));
    (ticks() - t) as f64 / i.elapsed().as_nanos() as f64
}

/// The median of `v`.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n = probe::count(20_000).max(2_000);
    let rt = corewise::Runtime::builder()
        .cpus([0, 1])
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap_or_else(|e| probe::fail("notify_cost", format!("no runtime on cpus 0 and 1: {e}")));
    let tpn = ticks_per_ns();
    let leak = |v| &*Box::leak(Box::new(Line(AtomicU64::new(v))));
    let (ready, stamp, ball) = (leak(0), leak(0), leak(0));

    // The round trip: a line written by core 0, then core 1, 100 000 times.
    const TRIPS: u64 = 100_000;
    let pong = Builder::new()
        .core(1)
        .spawn_in(&rt, move || {
            for i in 0..TRIPS {
                while ball.0.load(Ordering::Acquire) != 2 * i + 1 {}
                ball.0.store(2 * i + 2, Ordering::Release);
            }
        })
        .unwrap_or_else(|e| probe::fail("notify_cost", e));
    let round_trip = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            let t = ticks();
            for i in 0..TRIPS {
                ball.0.store(2 * i + 1, Ordering::Release);
                while ball.0.load(Ordering::Acquire) != 2 * i + 2 {}
            }
            (ticks() - t) as f64 / tpn / TRIPS as f64
        })
        .unwrap_or_else(|e| probe::fail("notify_cost", e))
        .join()
        .unwrap_or_else(|e| probe::fail("notify_cost", e));
    pong.join()
        .unwrap_or_else(|e| probe::fail("notify_cost", e));

    let m: &'static Line<Mutex<bool>> = Box::leak(Box::new(Line(Mutex::new(false))));
    let cv: &'static Line<Condvar> = Box::leak(Box::new(Line(Condvar::new())));
    let waiter = Builder::new()
        .core(1)
        .spawn_in(&rt, move || {
            for round in 1..=n {
                let mut g = m.0.lock();
                ready.0.store(round, Ordering::Release);
                while !*g {
                    g = cv.0.wait(g);
                }
                let t = ticks();
                *g = false;
                drop(g);
                stamp.0.store(t, Ordering::Release);
            }
        })
        .unwrap_or_else(|e| probe::fail("notify_cost", e));
    let mut notify: Vec<f64> = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            let mut v = Vec::with_capacity(n as usize);
            for round in 1..=n {
                while ready.0.load(Ordering::Acquire) < round {
                    std::hint::spin_loop();
                }
                let settle = ticks();
                while ticks() - settle < (5_000.0 * tpn) as u64 {}
                stamp.0.store(0, Ordering::Relaxed);
                *m.0.lock() = true;
                let t0 = ticks();
                cv.0.notify_one();
                let t1 = loop {
                    match stamp.0.load(Ordering::Acquire) {
                        0 => std::hint::spin_loop(),
                        t => break t,
                    }
                };
                if round > 1_000 {
                    v.push(t1.saturating_sub(t0) as f64 / tpn);
                }
            }
            v
        })
        .unwrap_or_else(|e| probe::fail("notify_cost", e))
        .join()
        .unwrap_or_else(|e| probe::fail("notify_cost", e));
    waiter
        .join()
        .unwrap_or_else(|e| probe::fail("notify_cost", e));
    let med = median(&mut notify);
    let p90 = notify[notify.len() * 9 / 10];
    println!(
        "round trip {round_trip:.0} ns; cross-core notify median {med:.0} ns ({:.2} RT), p90 {p90:.0} ns",
        med / round_trip
    );
}
