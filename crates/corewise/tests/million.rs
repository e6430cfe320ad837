//! A million user threads parked at once: created, parked on stacks that
//! earlier threads used deeply, woken and joined, with the resident memory
//! each parked thread costs.
//!
//! Ignored by default (it needs about 10 GiB of address space for page
//! tables and a few seconds); `test.sh` runs it in release mode:
//! `cargo test -p corewise --release --test million -- --ignored --nocapture`.
//! `COREWISE_MILLION=N` changes the count.

use corewise::sync::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A gate user threads wait at until it opens.
struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
    waiting: AtomicUsize,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(false),
            cond: Condvar::new(),
            waiting: AtomicUsize::new(0),
        })
    }

    fn wait(&self) {
        let mut g = self.open.lock();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        while !*g {
            g = self.cond.wait(g);
        }
    }

    fn open(&self) {
        *self.open.lock() = true;
        self.cond.notify_all();
    }

    /// Waits (on a kernel thread, outside the runtime) for `n` waiters.
    fn until_waiting(&self, n: usize) {
        let start = Instant::now();
        while self.waiting.load(Ordering::Relaxed) < n {
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "only {} of {n} threads reached the gate",
                self.waiting.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Uses about 48 KiB of stack, as a deep call chain would.
#[inline(never)]
fn deep() -> u8 {
    let mut buf = [0u8; 48 * 1024];
    for (i, b) in buf.iter_mut().enumerate().step_by(512) {
        *b = i as u8;
    }
    std::hint::black_box(&mut buf);
    buf[1024]
}

/// Spawns `n` threads that wait at `gate` and then run `after`; returns
/// once all of them wait there.
fn park_at<T: Send + 'static>(
    rt: &corewise::Runtime,
    gate: &Arc<Gate>,
    n: usize,
    after: fn() -> T,
) -> Vec<corewise::JoinHandle<T>> {
    let handles = (0..n)
        .map(|_| {
            let g = gate.clone();
            rt.spawn(move || {
                g.wait();
                after()
            })
            .unwrap()
        })
        .collect();
    gate.until_waiting(n);
    handles
}

fn status_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn map_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

#[test]
#[ignore = "a million threads: run in release with --ignored (test.sh does)"]
fn a_million_threads_park_wake_and_join() {
    let n: usize = std::env::var("COREWISE_MILLION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rt = corewise::Runtime::builder()
        .max_threads(n + 1024)
        .build()
        .unwrap();
    let rss0 = status_kib("VmRSS:");
    let maps0 = map_count();

    // Round 1: n threads at once, each wakes, runs deep, and exits, so the
    // stacks round 2 gets were all used deeply before.
    let gate = Gate::new();
    let t = Instant::now();
    let handles = park_at(&rt, &gate, n, deep);
    let created1 = t.elapsed();
    let t = Instant::now();
    gate.open();
    for h in handles {
        h.join().unwrap();
    }
    let ran1 = t.elapsed();
    let rss1 = status_kib("VmRSS:");

    // Round 2: n threads parked at once, on reused stacks.
    let gate = Gate::new();
    let t = Instant::now();
    let handles = park_at(&rt, &gate, n, || 1u32);
    let created2 = t.elapsed();
    // Let every dispatcher's sweep take its blocked threads out of their slots.
    std::thread::sleep(Duration::from_millis(50));
    let rss2 = status_kib("VmRSS:");
    let pte = status_kib("VmPTE:");
    let maps2 = map_count();
    let t = Instant::now();
    gate.open();
    let sum: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let woken = t.elapsed();
    assert_eq!(sum as usize, n);

    let t = Instant::now();
    drop(rt);
    let dropped = t.elapsed();
    let per_thread = (rss2.saturating_sub(rss0)) * 1024 / n;
    println!(
        "{n} threads: created+parked (round 1) {created1:?}, woken, run deep and joined \
         {ran1:?}; created+parked (round 2) {created2:?}; \
         woken and joined in {woken:?}; RSS {rss0} -> {rss1} (after round 1) -> {rss2} KiB \
         (parked): {per_thread} B per parked thread; page tables {pte} KiB; \
         mappings {maps0} -> {maps2}; runtime dropped in {dropped:?}"
    );
    assert!(
        per_thread <= 8 * 1024,
        "a parked thread costs {per_thread} B of RSS (target: at most 8 KiB)"
    );
    assert!(
        maps2 - maps0 < n / 100,
        "{} mappings for {n} threads: stacks must not cost a mapping each",
        maps2 - maps0
    );
}
