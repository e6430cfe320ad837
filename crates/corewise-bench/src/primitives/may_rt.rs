//! The `may` column: stackful coroutines, 2 workers pinned to cpus 0 and 1.
//!
//! may offers no placement: a coroutine spawned or woken from a thread that
//! is not a worker goes to the workers' global queues round-robin, and idle
//! workers steal. So every sample records the CPU the measured coroutine ran
//! on, and samples where it ran on the wrong CPU are rejected (the count is
//! reported as a note). Parents and notifiers of cross-core ops are plain
//! threads pinned to cpu A.

use super::common::{self, on_cpu, spin_until, Collector, Stamp};
use super::{Cost, Ctx, Op, RuntimeReport};
use crate::affinity;
use crate::error::BenchError;
use crate::procstat;
use may::coroutine::{self as co, JoinHandle};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn may_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Runtime {
        runtime: "may",
        message: e.to_string(),
    }
}

/// Spawns a coroutine.
fn go<F, T>(f: F) -> Result<JoinHandle<T>, BenchError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: may marks spawning unsafe because a coroutine must not hold
    // thread-local state across yields nor block its worker for long; the
    // closures of this module touch only atomics, may's own primitives and
    // the clock.
    unsafe { co::Builder::new().spawn(f) }.map_err(may_err)
}

/// Runs `f` in a coroutine that runs on cpu `cpu` (retrying the spawn until
/// the scheduler puts it there) and returns its result.
fn in_coroutine_on<T: Send + 'static>(
    cpu: usize,
    f: impl Fn() -> T + Send + Sync + 'static,
) -> Result<T, BenchError> {
    let f = Arc::new(f);
    for _ in 0..64 {
        let f2 = f.clone();
        let h = go(move || (affinity::current_cpu() == cpu).then(|| f2()))?;
        match h.join() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => continue,
            Err(_) => return Err(may_err("coroutine panicked")),
        }
    }
    Err(may_err(format!("could not get a coroutine onto cpu {cpu}")))
}

/// Runs every may measurement.
pub fn run(ctx: &Ctx) -> Result<RuntimeReport, BenchError> {
    let before = procstat::thread_ids();
    may::config().set_workers(2);
    may::config().set_worker_pin(true);
    let mut r = RuntimeReport::new("may");
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;

    // Start the scheduler and learn its threads before anything else.
    go(|| ())?.join().map_err(|_| may_err("first coroutine"))?;
    std::thread::sleep(std::time::Duration::from_millis(20));
    let may_tids = procstat::new_threads_since(&before);

    // create_cross_core: spawned from a plain thread on cpu A.
    let create = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        while !c.done() {
            let stamp = Arc::new(Stamp::new());
            let s2 = stamp.clone();
            let t0 = clock.start();
            let h = go(move || s2.record(clock.now()))?;
            let (t1, cpu) = stamp.wait("may create_cross_core", to)?;
            let _ = h.join();
            c.offer(clock.delta_ns(t0, t1), cpu == b);
            common::busy_wait(ctx.settle);
        }
        Ok(c)
    })?;
    r.notes.extend(create.note("may", Op::CreateCrossCore));
    r.push(Op::CreateCrossCore, create.kept);

    // Same-core ops, from a coroutine on cpu A's worker; samples during
    // which the coroutine(s) changed CPU are rejected.
    let n = ctx.samples(Cost::Cheap);
    let w = ctx.warmup(Cost::Cheap);
    let sj = in_coroutine_on(a, move || {
        let mut c = Collector::new(n, w);
        while !c.done() {
            let t0 = clock.start();
            let res = go(affinity::current_cpu).map(|h| h.join());
            let t1 = clock.now();
            match res {
                Ok(Ok(cpu)) => c.offer(clock.delta_ns(t0, t1), cpu == a),
                _ => c.rejected += 1,
            }
        }
        c
    })?;
    r.notes.extend(sj.note("may", Op::SpawnJoinSameCore));
    r.push(Op::SpawnJoinSameCore, sj.kept);

    let ny = in_coroutine_on(a, move || {
        let mut c = Collector::new(n, w);
        while !c.done() {
            let t0 = clock.start();
            for _ in 0..10 {
                co::yield_now();
            }
            let t1 = clock.now();
            c.offer(clock.delta_ns(t0, t1) / 10.0, affinity::current_cpu() == a);
        }
        c
    })?;
    r.notes.extend(ny.note("may", Op::NullYield));
    r.push(Op::NullYield, ny.kept);

    let ow = in_coroutine_on(a, move || {
        let counter = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let fcpu = Arc::new(AtomicU64::new(u64::MAX));
        let (c2, s2, f2) = (counter.clone(), stop.clone(), fcpu.clone());
        let follower = go(move || {
            common::pingpong_follower(&c2, &s2, || {
                f2.store(affinity::current_cpu() as u64, Ordering::Relaxed);
                co::yield_now();
            })
        });
        let mut c = Collector::new(n / 2, w / 2);
        let batch = 20u64;
        while follower.is_ok() && !c.done() {
            let start = counter.load(Ordering::Acquire);
            let t0 = clock.start();
            let mut spins = 0u64;
            loop {
                let v = counter.load(Ordering::Acquire);
                if v >= start + batch {
                    break;
                }
                if v.is_multiple_of(2) {
                    counter.store(v + 1, Ordering::Release);
                }
                co::yield_now();
                spins += 1;
                if spins > 100_000_000 {
                    break;
                }
            }
            let t1 = clock.now();
            let done = counter.load(Ordering::Acquire) - start;
            let same = affinity::current_cpu() == a
                && fcpu.load(Ordering::Relaxed) == a as u64
                && done >= batch;
            c.offer(clock.delta_ns(t0, t1) / done.max(1) as f64, same);
        }
        stop.store(true, Ordering::Release);
        if let Ok(h) = follower {
            let _ = h.join();
        }
        c
    })?;
    r.notes.extend(ow.note("may", Op::OneWayYield));
    r.push(Op::OneWayYield, ow.kept);

    let cv = condvar(ctx, &mut r.notes)?;
    r.push(Op::CondvarNotifyCrossCore, cv);
    let sig = park_unpark(ctx, &mut r.notes)?;
    r.push(Op::SignalCrossCore, sig);

    // Creation throughput: one plain creating thread spawns children that
    // only bump a counter (spawns from a non-worker thread go to the two
    // workers' queues round-robin). At most 4096 children are outstanding:
    // may gives each its own mmap'ed stack, and unbounded spawning exhausts
    // the process's map count.
    let nthr = ctx.throughput_children(Cost::Cheap);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    for i in 0..nthr as u64 {
        if i >= 4096 && i % 256 == 0 {
            spin_until("may throughput drain", to, || {
                done.load(Ordering::Acquire) + 4096 >= i
            })?;
        }
        let d = done.clone();
        drop(go(move || {
            d.fetch_add(1, Ordering::Relaxed);
        })?);
    }
    spin_until("may throughput end", to, || {
        done.load(Ordering::Acquire) >= nthr as u64
    })?;
    let secs = start.elapsed().as_secs_f64();
    r.creation_throughput_per_s = Some(nthr as f64 / secs);

    std::thread::sleep(std::time::Duration::from_millis(50));
    r.idle_cpu_percent = Some(procstat::idle_cpu_percent(&may_tids, ctx.idle_window));
    r.note(format!(
        "may idle CPU: the {} threads may started (workers, timer, io)",
        may_tids.len()
    ));
    Ok(r)
}

fn condvar(ctx: &Ctx, notes: &mut Vec<String>) -> Result<Vec<f64>, BenchError> {
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;
    // (go round, waiting round)
    let shared = Arc::new((
        may::sync::Mutex::new((0u64, 0u64)),
        may::sync::Condvar::new(),
    ));
    let stamp = Arc::new(Stamp::new());
    let (sh, st) = (shared.clone(), stamp.clone());
    let waiter = go(move || {
        let (m, cv) = &*sh;
        let Ok(mut g) = m.lock() else { return };
        let mut round = 0;
        loop {
            round += 1;
            g.1 = round;
            while g.0 < round {
                g = match cv.wait(g) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
            if g.0 == u64::MAX {
                return;
            }
            st.record(clock.now());
        }
    })?;
    let res = on_cpu(a, || {
        let (m, cv) = &*shared;
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        let mut round = 0;
        while !c.done() {
            round += 1;
            spin_until("may condvar ready", to, || {
                m.lock().map(|g| g.1 >= round).unwrap_or(true)
            })?;
            common::busy_wait(ctx.settle);
            stamp.clear();
            m.lock().map_err(|_| may_err("poisoned"))?.0 = round;
            let t0 = clock.start();
            cv.notify_one();
            let (t1, cpu) = stamp.wait("may condvar wake", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c)
    });
    if let Ok(mut g) = shared.0.lock() {
        g.0 = u64::MAX;
    }
    shared.1.notify_all();
    let _ = waiter.join();
    let c = res?;
    notes.extend(c.note("may", Op::CondvarNotifyCrossCore));
    Ok(c.kept)
}

fn park_unpark(ctx: &Ctx, notes: &mut Vec<String>) -> Result<Vec<f64>, BenchError> {
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;
    let ready = Arc::new(AtomicU64::new(0));
    let goflag = Arc::new(AtomicU64::new(0));
    let stamp = Arc::new(Stamp::new());
    let (rd, g2, st) = (ready.clone(), goflag.clone(), stamp.clone());
    let waiter = go(move || {
        let mut round = 0;
        loop {
            round += 1;
            rd.store(round, Ordering::Release);
            // The thread runs again when the park returns: the time is
            // taken there, before the flag's line is read.
            let mut woke = None;
            loop {
                let g = g2.load(Ordering::Acquire);
                if g == u64::MAX {
                    return;
                }
                if g >= round {
                    break;
                }
                co::park();
                woke = Some(clock.now());
            }
            st.record(woke.unwrap_or_else(|| clock.now()));
        }
    })?;
    let handle = waiter.coroutine().clone();
    let res = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        let mut round = 0;
        while !c.done() {
            round += 1;
            spin_until("may park ready", to, || {
                ready.load(Ordering::Acquire) >= round
            })?;
            common::busy_wait(ctx.settle);
            stamp.clear();
            goflag.store(round, Ordering::Release);
            let t0 = clock.start();
            handle.unpark();
            let (t1, cpu) = stamp.wait("may park wake", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c)
    });
    goflag.store(u64::MAX, Ordering::Release);
    handle.unpark();
    let _ = waiter.join();
    let c = res?;
    notes.extend(c.note("may", Op::SignalCrossCore));
    Ok(c.kept)
}
