//! The cost of a thread's life on one core, alone: one user thread
//! creates N detached threads (default 2 000 000) on its own core, each of
//! which bumps a counter and ends; the run prints the mean time per
//! thread (spawn, run and exit; the creator yields while every slot is
//! taken).
//!
//! `cargo run --release --example spawn_cost [N]`
//!
//! As with `switch_cost`, two runs under callgrind, for N and 2N, give
//! the instructions of one thread's life as their difference divided by
//! N:
//!
//! ```text
//! RUSTFLAGS='--cfg rustix_use_libc' cargo build --release --example spawn_cost
//! COREWISE_IO=epoll valgrind --tool=callgrind target/release/examples/spawn_cost 100000
//! COREWISE_IO=epoll valgrind --tool=callgrind target/release/examples/spawn_cost 200000
//! ```

mod probe;

use std::sync::atomic::{AtomicU64, Ordering};

static DONE: AtomicU64 = AtomicU64::new(0);

fn main() {
    let n = probe::count(2_000_000);
    let rt = probe::runtime_on_cpu0("spawn_cost");
    let t = std::time::Instant::now();
    let run = rt.block_on(move || {
        for _ in 0..n {
            loop {
                match corewise::thread::Builder::new().spawn_detached(|| {
                    DONE.store(DONE.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }) {
                    Ok(_) => break,
                    Err(corewise::SpawnError::ThreadLimit { .. }) => corewise::yield_now(),
                    Err(e) => return Err(e),
                }
            }
        }
        while DONE.load(Ordering::Relaxed) < n {
            corewise::yield_now();
        }
        Ok(())
    });
    match run {
        Ok(Ok(())) => println!(
            "{:.1} ns per thread ({n} threads)",
            t.elapsed().as_nanos() as f64 / n as f64
        ),
        Ok(Err(e)) => probe::fail("spawn_cost", format!("spawn failed: {e}")),
        Err(e) => probe::fail("spawn_cost", e),
    }
}
