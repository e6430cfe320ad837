//! One (scenario, runtime) run inside a child process of the benchmark.
//!
//! Each runner returns `Err(message)` at the first thread it cannot create,
//! naming how many it had created, so the table can say how far it got.

use super::Outcome;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLEEP: Duration = Duration::from_millis(10);

/// A line of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`).
fn status_kib(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn sysctl(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Adds the kernel's limits to a failure that may be one of them: a
/// mapping per stack (`vm.max_map_count`) or, for kernel threads, a pid
/// each (`kernel.pid_max`).
fn spawn_failed(i: usize, e: impl std::fmt::Display) -> String {
    format!(
        "failed after {i} threads: {e} (vm.max_map_count = {}, kernel.pid_max = {})",
        sysctl("/proc/sys/vm/max_map_count"),
        sysctl("/proc/sys/kernel/pid_max")
    )
}

/// Runs `SCENARIO:RUNTIME:N`.
pub fn run(spec: &str) -> Outcome {
    let mut parts = spec.split(':');
    let (scen, rt, n) = (parts.next(), parts.next(), parts.next());
    let n: usize = n.and_then(|n| n.parse().ok()).unwrap_or(0);
    let mut out = Outcome {
        n,
        ..Outcome::default()
    };
    let res = match (scen, rt) {
        (Some("sleepers"), Some(rt)) => sleepers(rt, n).map(|w| out.wall_ms = Some(w)),
        (Some("parked"), Some(rt)) => parked(rt, n).map(|(c, per, w)| {
            out.create_ms = Some(c);
            out.rss_per_thread_bytes = Some(per);
            out.wake_ms = Some(w);
        }),
        _ => Err(format!("bad child spec {spec:?}")),
    };
    out.error = res.err();
    out.peak_rss_kib = status_kib("VmHWM:");
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn sleepers(rt: &str, n: usize) -> Result<f64, String> {
    match rt {
        "corewise" => {
            let r = corewise_rt()?;
            r.block_on(move || {
                let t0 = Instant::now();
                let mut hs = Vec::with_capacity(n);
                for i in 0..n {
                    hs.push(
                        corewise::spawn(|| corewise::sleep(SLEEP))
                            .map_err(|e| spawn_failed(i, e))?,
                    );
                }
                for h in hs {
                    h.join().map_err(|e| format!("failed: join: {e}"))?;
                }
                Ok(ms(t0.elapsed()))
            })
            .map_err(|e| format!("failed: {e}"))?
        }
        "tokio" => {
            let r = tokio_rt()?;
            r.block_on(async move {
                let t0 = Instant::now();
                let hs: Vec<_> = (0..n)
                    .map(|_| tokio::spawn(tokio::time::sleep(SLEEP)))
                    .collect();
                for h in hs {
                    h.await.map_err(|e| format!("failed: join: {e}"))?;
                }
                Ok(ms(t0.elapsed()))
            })
        }
        "may" => {
            may_setup();
            let t0 = Instant::now();
            let mut hs = Vec::with_capacity(n);
            for _ in 0..n {
                hs.push(may_go(|| may::coroutine::sleep(SLEEP)));
            }
            for h in hs {
                h.join()
                    .map_err(|_| "failed: coroutine panicked".to_string())?;
            }
            Ok(ms(t0.elapsed()))
        }
        "std" => {
            let t0 = Instant::now();
            let mut hs = Vec::with_capacity(n);
            for i in 0..n {
                hs.push(
                    std::thread::Builder::new()
                        .spawn(|| std::thread::sleep(SLEEP))
                        .map_err(|e| spawn_failed(i, e))?,
                );
            }
            for h in hs {
                h.join()
                    .map_err(|_| "failed: thread panicked".to_string())?;
            }
            Ok(ms(t0.elapsed()))
        }
        other => Err(format!("unknown runtime {other}")),
    }
}

/// corewise on up to two cores, like the tokio and may columns' two workers.
fn corewise_rt() -> Result<corewise::Runtime, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
    corewise::Runtime::builder()
        .min_cores(cores)
        .max_cores(cores)
        .neighbour_awareness(None)
        .build()
        .map_err(|e| format!("failed: {e}"))
}

fn tokio_rt() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("failed: {e}"))
}

fn may_setup() {
    may::config().set_workers(2);
}

fn may_go<F: FnOnce() + Send + 'static>(f: F) -> may::coroutine::JoinHandle<()> {
    // SAFETY: may marks spawning unsafe because a coroutine must not hold
    // thread-local state across a yield or block the worker on an OS call;
    // these bodies only sleep or wait on may's own primitives.
    unsafe { may::coroutine::spawn(f) }
}

/// Waits (from the spawner) until `count` reaches `n`.
fn until(count: &AtomicUsize, n: usize, mut pause: impl FnMut()) {
    while count.load(Ordering::Acquire) < n {
        pause();
    }
}

/// Returns (create ms, RSS bytes per parked thread, wake+join ms).
fn parked(rt: &str, n: usize) -> Result<(f64, f64, f64), String> {
    let per = move |before: Option<u64>, after: Option<u64>| {
        (after.unwrap_or(0) as f64 - before.unwrap_or(0) as f64) * 1024.0 / n.max(1) as f64
    };
    let parked = Arc::new(AtomicUsize::new(0));
    match rt {
        "corewise" => {
            use corewise::sync::{Condvar, Mutex};
            let r = corewise_rt()?;
            r.block_on(move || {
                let gate = Arc::new((Mutex::new(false), Condvar::new()));
                let before = status_kib("VmRSS:");
                let t0 = Instant::now();
                let mut hs = Vec::with_capacity(n);
                for i in 0..n {
                    let (g, p) = (gate.clone(), parked.clone());
                    let h = corewise::spawn(move || {
                        let mut open = g.0.lock();
                        p.fetch_add(1, Ordering::Release);
                        while !*open {
                            open = g.1.wait(open);
                        }
                    });
                    match h {
                        Ok(h) => hs.push(h),
                        Err(e) => {
                            // Release the ones already parked before failing.
                            *gate.0.lock() = true;
                            gate.1.notify_all();
                            for h in hs {
                                let _ = h.join();
                            }
                            return Err(spawn_failed(i, e));
                        }
                    }
                }
                until(&parked, n, corewise::yield_now);
                let create = t0.elapsed();
                let after = status_kib("VmRSS:");
                let t1 = Instant::now();
                *gate.0.lock() = true;
                gate.1.notify_all();
                for h in hs {
                    h.join().map_err(|e| format!("failed: join: {e}"))?;
                }
                Ok((ms(create), per(before, after), ms(t1.elapsed())))
            })
            .map_err(|e| format!("failed: {e}"))?
        }
        "tokio" => {
            let r = tokio_rt()?;
            r.block_on(async move {
                let (tx, rx) = tokio::sync::watch::channel(false);
                let before = status_kib("VmRSS:");
                let t0 = Instant::now();
                let hs: Vec<_> = (0..n)
                    .map(|_| {
                        let (mut rx, p) = (rx.clone(), parked.clone());
                        tokio::spawn(async move {
                            p.fetch_add(1, Ordering::Release);
                            let _ = rx.wait_for(|open| *open).await;
                        })
                    })
                    .collect();
                while parked.load(Ordering::Acquire) < n {
                    tokio::task::yield_now().await;
                }
                let create = t0.elapsed();
                let after = status_kib("VmRSS:");
                let t1 = Instant::now();
                let _ = tx.send(true);
                for h in hs {
                    h.await.map_err(|e| format!("failed: join: {e}"))?;
                }
                Ok((ms(create), per(before, after), ms(t1.elapsed())))
            })
        }
        "may" => {
            use may::sync::{Condvar, Mutex};
            may_setup();
            let gate = Arc::new((Mutex::new(false), Condvar::new()));
            let before = status_kib("VmRSS:");
            let t0 = Instant::now();
            let mut hs = Vec::with_capacity(n);
            for _ in 0..n {
                let (g, p) = (gate.clone(), parked.clone());
                hs.push(may_go(move || {
                    let mut open = g.0.lock().expect("may mutex");
                    p.fetch_add(1, Ordering::Release);
                    while !*open {
                        open = g.1.wait(open).expect("may condvar");
                    }
                }));
            }
            until(&parked, n, || {
                std::thread::sleep(Duration::from_micros(100))
            });
            let create = t0.elapsed();
            let after = status_kib("VmRSS:");
            let t1 = Instant::now();
            *gate.0.lock().map_err(|_| "failed: poisoned")? = true;
            gate.1.notify_all();
            for h in hs {
                h.join()
                    .map_err(|_| "failed: coroutine panicked".to_string())?;
            }
            Ok((ms(create), per(before, after), ms(t1.elapsed())))
        }
        "std" => {
            use std::sync::{Condvar, Mutex};
            let gate = Arc::new((Mutex::new(false), Condvar::new()));
            let before = status_kib("VmRSS:");
            let t0 = Instant::now();
            let mut hs = Vec::with_capacity(n);
            for i in 0..n {
                let (g, p) = (gate.clone(), parked.clone());
                let h = std::thread::Builder::new().spawn(move || {
                    let mut open = g.0.lock().unwrap_or_else(|e| e.into_inner());
                    p.fetch_add(1, Ordering::Release);
                    while !*open {
                        open = g.1.wait(open).unwrap_or_else(|e| e.into_inner());
                    }
                });
                match h {
                    Ok(h) => hs.push(h),
                    Err(e) => {
                        *gate.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
                        gate.1.notify_all();
                        for h in hs {
                            let _ = h.join();
                        }
                        return Err(spawn_failed(i, e));
                    }
                }
            }
            until(&parked, n, || {
                std::thread::sleep(Duration::from_micros(100))
            });
            let create = t0.elapsed();
            let after = status_kib("VmRSS:");
            let t1 = Instant::now();
            *gate.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            gate.1.notify_all();
            for h in hs {
                h.join()
                    .map_err(|_| "failed: thread panicked".to_string())?;
            }
            Ok((ms(create), per(before, after), ms(t1.elapsed())))
        }
        other => Err(format!("unknown runtime {other}")),
    }
}
