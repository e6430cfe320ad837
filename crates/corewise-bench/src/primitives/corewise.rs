//! The `corewise` column.
//!
//! One corewise runtime on cpu A (core 0) and cpu B (core 1), default
//! settings (so its idle cores spin for the default budget, then sleep).
//! Every measuring thread is itself a user thread: the parent or notifier on
//! core 0, the child or waiter on core 1 (placed with `Builder::core`).
//! Creation uses `spawn_detached` (no join cell), as Arachne's
//! `createThread`; spawn+join uses the joinable `spawn`.

use super::common::{self, spin_until, Collector, Stamp};
use super::{Cost, Ctx, Op, RuntimeReport};
use crate::error::BenchError;
use crate::procstat;
use corewise::sync::{Condvar, Mutex};
use corewise::thread::Builder;
use corewise::{Runtime, SpawnError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn rt_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Runtime {
        runtime: "corewise",
        message: e.to_string(),
    }
}

/// Runs `f` as a user thread on runtime core `core` and returns its result.
fn on_core<T: Send + 'static>(
    rt: &Runtime,
    core: usize,
    f: impl FnOnce() -> Result<T, BenchError> + Send + 'static,
) -> Result<T, BenchError> {
    Builder::new()
        .core(core)
        .spawn_in(rt, f)
        .map_err(rt_err)?
        .join()
        .map_err(rt_err)?
}

/// Runs every corewise measurement.
pub fn run(ctx: &Ctx) -> Result<RuntimeReport, BenchError> {
    let mut r = RuntimeReport::new("corewise");
    // Both cores held throughout (the measurements place threads on each),
    // whatever the neighbours on this shared machine are doing.
    let rt = Runtime::builder()
        .cpus([ctx.cpu_a, ctx.cpu_b])
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .map_err(rt_err)?;
    if rt.cpus() != [ctx.cpu_a.min(ctx.cpu_b), ctx.cpu_a.max(ctx.cpu_b)] {
        return Err(BenchError::Machine(format!(
            "corewise got cpus {:?}",
            rt.cpus()
        )));
    }
    // Runtime core indices follow CPU order.
    let core_of = |cpu: usize| rt.cpus().iter().position(|&c| c == cpu).unwrap_or(0);
    let (ca, cb) = (core_of(ctx.cpu_a), core_of(ctx.cpu_b));
    let (cpu_b, clock, to, settle) = (ctx.cpu_b, ctx.clock, ctx.wait_timeout, ctx.settle);

    // create_cross_core: a user thread on core A creates a thread on core B.
    let c = ctx.clone();
    let create = on_core(&rt, ca, move || {
        let mut col = Collector::new(c.samples(Cost::CrossCore), c.warmup(Cost::CrossCore));
        while !col.done() {
            let stamp = Arc::new(Stamp::new());
            let s2 = stamp.clone();
            let t0 = clock.start();
            Builder::new()
                .core(cb)
                .spawn_detached(move || s2.record(clock.now()))
                .map_err(rt_err)?;
            let (t1, cpu) = stamp.wait("corewise create_cross_core", to)?;
            col.offer(clock.delta_ns(t0, t1), cpu == cpu_b);
            common::busy_wait(settle);
        }
        Ok(col)
    })?;
    r.notes.extend(create.note("corewise", Op::CreateCrossCore));
    r.push(Op::CreateCrossCore, create.kept);

    // Same-core ops on core A.
    let c = ctx.clone();
    let sj = on_core(&rt, ca, move || {
        let (n, w) = (c.samples(Cost::Cheap), c.warmup(Cost::Cheap));
        let mut v = Vec::with_capacity(n);
        for i in 0..n + w {
            let t0 = clock.start();
            Builder::new()
                .core(ca)
                .spawn(|| ())
                .map_err(rt_err)?
                .join()
                .map_err(rt_err)?;
            let t1 = clock.now();
            if i >= w {
                v.push(clock.delta_ns(t0, t1));
            }
        }
        Ok(v)
    })?;
    r.push(Op::SpawnJoinSameCore, sj);

    let c = ctx.clone();
    let ny = on_core(&rt, ca, move || {
        let (n, w) = (c.samples(Cost::Cheap), c.warmup(Cost::Cheap));
        Ok(common::batched(&c, n, w, 100, corewise::yield_now))
    })?;
    r.push(Op::NullYield, ny);

    let counter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (counter.clone(), stop.clone());
    let follower = Builder::new()
        .core(ca)
        .spawn_in(&rt, move || {
            common::pingpong_follower(&c2, &s2, corewise::yield_now)
        })
        .map_err(rt_err)?;
    let c = ctx.clone();
    let ow = on_core(&rt, ca, move || {
        let (n, w) = (c.samples(Cost::Cheap), c.warmup(Cost::Cheap));
        Ok(common::pingpong_leader(
            &c,
            &counter,
            &stop,
            n / 2,
            w / 2,
            20,
            corewise::yield_now,
        ))
    })?;
    follower.join().map_err(rt_err)?;
    r.push(Op::OneWayYield, ow);

    // condvar_notify_cross_core: the waiter blocks in a Condvar on core B;
    // the notifier is a user thread on core A.
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let ready = Arc::new(AtomicU64::new(0));
    let quit = Arc::new(AtomicBool::new(false));
    let stamp = Arc::new(Stamp::new());
    let (p2, rd, q2, st) = (pair.clone(), ready.clone(), quit.clone(), stamp.clone());
    let waiter = Builder::new()
        .core(cb)
        .spawn_in(&rt, move || {
            let (m, cv) = &*p2;
            let mut round = 0;
            loop {
                round += 1;
                let mut g = m.lock();
                rd.store(round, Ordering::Release);
                while !*g {
                    g = cv.wait(g);
                }
                let t = clock.now();
                *g = false;
                drop(g);
                if q2.load(Ordering::Acquire) {
                    return;
                }
                st.record(t);
            }
        })
        .map_err(rt_err)?;
    let c = ctx.clone();
    let (p3, rd3, st3) = (pair.clone(), ready.clone(), stamp.clone());
    let cv = on_core(&rt, ca, move || {
        let mut col = Collector::new(c.samples(Cost::CrossCore), c.warmup(Cost::CrossCore));
        let mut round = 0;
        let (m, cv) = &*p3;
        while !col.done() {
            round += 1;
            spin_until("corewise condvar ready", to, || {
                rd3.load(Ordering::Acquire) >= round
            })?;
            common::busy_wait(settle);
            st3.clear();
            *m.lock() = true;
            let t0 = clock.start();
            cv.notify_one();
            let (t1, cpu) = st3.wait("corewise condvar wake", to)?;
            col.offer(clock.delta_ns(t0, t1), cpu == cpu_b);
        }
        Ok(col.kept)
    });
    quit.store(true, Ordering::Release);
    *pair.0.lock() = true;
    pair.1.notify_one();
    waiter.join().map_err(rt_err)?;
    r.push(Op::CondvarNotifyCrossCore, cv?);

    // signal_cross_core: the waiter blocks (corewise::block) on core B.
    let flag = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(AtomicU64::new(0));
    let stamp = Arc::new(Stamp::new());
    let (f2, rd, st) = (flag.clone(), ready.clone(), stamp.clone());
    let c = ctx.clone();
    let rounds = c.samples(Cost::CrossCore) * 6 + 1_000;
    let waiter = Builder::new()
        .core(cb)
        .spawn_in(&rt, move || {
            for round in 1..=rounds as u64 {
                rd.store(round, Ordering::Release);
                // The thread runs again when `block` returns: the time is
                // taken there, before the flag's line is read.
                let mut woke = None;
                loop {
                    let v = f2.load(Ordering::Acquire);
                    if v >= round {
                        if v == u64::MAX {
                            return;
                        }
                        break;
                    }
                    corewise::block();
                    woke = Some(clock.now());
                }
                st.record(woke.unwrap_or_else(|| clock.now()));
            }
        })
        .map_err(rt_err)?;
    let waiter_id = waiter.thread();
    let (f3, rd3, st3) = (flag.clone(), ready.clone(), stamp.clone());
    let sig = on_core(&rt, ca, move || {
        let mut col = Collector::new(c.samples(Cost::CrossCore), c.warmup(Cost::CrossCore));
        let mut round = 0u64;
        while !col.done() && round < rounds as u64 {
            round += 1;
            spin_until("corewise signal ready", to, || {
                rd3.load(Ordering::Acquire) >= round
            })?;
            common::busy_wait(settle);
            st3.clear();
            f3.store(round, Ordering::Release);
            let t0 = clock.start();
            corewise::signal(waiter_id);
            let (t1, cpu) = st3.wait("corewise signal wake", to)?;
            col.offer(clock.delta_ns(t0, t1), cpu == cpu_b);
        }
        Ok(col.kept)
    });
    flag.store(u64::MAX, Ordering::Release);
    corewise::signal(waiter_id);
    waiter.join().map_err(rt_err)?;
    r.push(Op::SignalCrossCore, sig?);

    // Creation throughput: one creating user thread on core A; children are
    // placed by the default policy (power of two choices over both cores)
    // and only count themselves, each in its own core's counter (a shared
    // counter would measure that line's ping-pong, not thread creation).
    let n = ctx.throughput_children(Cost::Cheap);
    let counters: &'static [PaddedCounter] =
        Box::leak((0..rt.cores()).map(|_| PaddedCounter::default()).collect());
    let secs = on_core(&rt, ca, move || {
        let start = Instant::now();
        for _ in 0..n {
            loop {
                match Builder::new().spawn_detached(move || {
                    let c = &counters[corewise::current_core().unwrap_or(0)];
                    c.0.store(c.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }) {
                    Ok(_) => break,
                    Err(SpawnError::ThreadLimit { .. }) => corewise::yield_now(),
                    Err(e) => return Err(rt_err(e)),
                }
            }
        }
        let total = || {
            counters
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        while total() < n as u64 {
            corewise::yield_now();
        }
        Ok(start.elapsed().as_secs_f64())
    })?;
    r.creation_throughput_per_s = Some(n as f64 / secs);

    // Idle CPU of the runtime's kernel threads.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let tids = core_thread_ids();
    r.idle_cpu_percent = Some(procstat::idle_cpu_percent(&tids, ctx.idle_window));
    r.note(format!(
        "corewise: one runtime on cpus {:?}, default idle spin {:?}; parents/notifiers are user threads on cpu A, children/waiters on cpu B",
        rt.cpus(),
        corewise::DEFAULT_IDLE_SPIN
    ));
    drop(rt);
    Ok(r)
}

/// A counter alone in its cache line; only threads of one core write it
/// (one at a time: a core runs one user thread at a time).
#[derive(Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU64);

/// Kernel thread ids of the runtime's core threads (named corewise-core-N).
fn core_thread_ids() -> Vec<i32> {
    procstat::thread_ids()
        .into_iter()
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .map(|c| c.starts_with("corewise-core"))
                .unwrap_or(false)
        })
        .collect()
}
