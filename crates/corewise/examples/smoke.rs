//! Smoke run: a few primitive costs measured in a loop, for quick checks.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
fn main() {
    let rt = corewise::Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    let n = 2_000_000u32;
    let t = std::time::Instant::now();
    rt.block_on(move || {
        for _ in 0..n {
            corewise::yield_now()
        }
    })
    .unwrap();
    println!("null yield {:?}", t.elapsed() / n);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let other = corewise::thread::Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            let mut k = 0u64;
            while !s2.load(Ordering::Relaxed) {
                corewise::yield_now();
                k += 1;
            }
            k
        })
        .unwrap();
    let t = std::time::Instant::now();
    corewise::thread::Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            for _ in 0..n {
                corewise::yield_now()
            }
        })
        .unwrap()
        .join()
        .unwrap();
    let el = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let k = other.join().unwrap();
    println!(
        "one-way yield {:?} ({} + {k} yields)",
        el / (n + k as u32),
        n
    );
}
