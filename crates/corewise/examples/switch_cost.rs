//! The cost of a switch between user threads, alone: two user threads on
//! one core yield to each other N times each (default 5 000 000), and the
//! run prints the mean one-way yield.
//!
//! `cargo run --release --example switch_cost [N]`
//!
//! It is also the probe for instruction counts, which stay the same from
//! run to run on a noisy machine where timings do not. Two runs under
//! callgrind, for N and 2N, give the instructions of one one-way yield as
//! their difference divided by 2N:
//!
//! ```text
//! RUSTFLAGS='--cfg rustix_use_libc' cargo build --release --example switch_cost
//! COREWISE_IO=epoll valgrind --tool=callgrind target/release/examples/switch_cost 100000
//! COREWISE_IO=epoll valgrind --tool=callgrind target/release/examples/switch_cost 200000
//! ```
//!
//! (rustix's own auxv reader faults under valgrind, and valgrind does not
//! know io_uring.)

mod probe;

fn main() {
    let n = probe::count(5_000_000);
    let rt = probe::runtime_on_cpu0("switch_cost");
    let t = std::time::Instant::now();
    let run = rt.block_on(move || {
        let other = corewise::thread::Builder::new().core(0).spawn(move || {
            for _ in 0..n {
                corewise::yield_now()
            }
        })?;
        for _ in 0..n {
            corewise::yield_now()
        }
        other.join().map_err(|e| e.to_string())?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    match run
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    {
        Ok(()) => println!(
            "{:.1} ns per one-way yield ({n} yields per thread)",
            t.elapsed().as_nanos() as f64 / (2 * n) as f64
        ),
        Err(e) => probe::fail("switch_cost", e),
    }
}
