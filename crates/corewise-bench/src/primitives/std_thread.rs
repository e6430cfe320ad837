//! The `std` column: kernel threads through `std::thread`.

use super::common::{self, on_cpu, spin_until, Collector, Stamp};
use super::{Cost, Ctx, Op, RuntimeReport};
use crate::affinity;
use crate::error::BenchError;
use crate::procstat;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

fn spawn<F: FnOnce() + Send + 'static>(f: F) -> Result<std::thread::JoinHandle<()>, BenchError> {
    std::thread::Builder::new()
        .spawn(f)
        .map_err(|e| BenchError::Thread(e.to_string()))
}

fn join(h: std::thread::JoinHandle<()>) -> Result<(), BenchError> {
    h.join()
        .map_err(|_| BenchError::Thread("std child panicked".into()))
}

/// Runs every std measurement.
pub fn run(ctx: &Ctx) -> Result<RuntimeReport, BenchError> {
    let mut r = RuntimeReport::new("std");
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;

    // create_cross_core: the child moves itself to cpu B (a new thread
    // inherits the parent's cpu-A pin) and stamps the clock once there.
    let create = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::OsThread), ctx.warmup(Cost::OsThread));
        while !c.done() {
            let stamp = Arc::new(Stamp::new());
            let s2 = stamp.clone();
            let t0 = clock.start();
            let h = spawn(move || {
                let _ = affinity::pin_current(b);
                s2.record(clock.now());
            })?;
            let (t1, cpu) = stamp.wait("std create_cross_core", to)?;
            join(h)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c)
    })?;
    r.notes.extend(create.note("std", Op::CreateCrossCore));
    r.push(Op::CreateCrossCore, create.kept);

    // spawn_join_same_core: child inherits the cpu-A pin.
    let sj = on_cpu(a, || {
        let n = ctx.samples(Cost::OsThread);
        let w = ctx.warmup(Cost::OsThread);
        let mut v = Vec::with_capacity(n);
        for i in 0..n + w {
            let t0 = clock.start();
            join(spawn(|| {})?)?;
            let t1 = clock.now();
            if i >= w {
                v.push(clock.delta_ns(t0, t1));
            }
        }
        Ok(v)
    })?;
    r.push(Op::SpawnJoinSameCore, sj);

    // null_yield: sched_yield with nothing else of ours on cpu A.
    let ny = on_cpu(a, || {
        Ok(common::batched(
            ctx,
            ctx.samples(Cost::Cheap),
            ctx.warmup(Cost::Cheap),
            10,
            std::thread::yield_now,
        ))
    })?;
    r.push(Op::NullYield, ny);

    // one_way_yield: two threads pinned to cpu A hand the core back and
    // forth with sched_yield.
    let counter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (counter.clone(), stop.clone());
    let follower = spawn(move || {
        if affinity::pin_current(a).is_ok() {
            common::pingpong_follower(&c2, &s2, std::thread::yield_now);
        }
    })?;
    let ow = on_cpu(a, || {
        Ok(common::pingpong_leader(
            ctx,
            &counter,
            &stop,
            ctx.samples(Cost::Cheap) / 2,
            ctx.warmup(Cost::Cheap) / 2,
            20,
            std::thread::yield_now,
        ))
    });
    stop.store(true, Ordering::Release);
    join(follower)?;
    r.push(Op::OneWayYield, ow?);

    // condvar_notify_cross_core: waiter on cpu B blocked in Condvar::wait.
    r.push(Op::CondvarNotifyCrossCore, condvar(ctx)?);
    // signal_cross_core: park / unpark.
    r.push(Op::SignalCrossCore, park_unpark(ctx)?);

    // Creation throughput: one unpinned creator, children do nothing,
    // joined in batches of 64 to bound the number of live threads.
    let n = ctx.throughput_children(Cost::OsThread);
    let start = Instant::now();
    let mut hs = Vec::with_capacity(64);
    for _ in 0..n {
        hs.push(spawn(|| {})?);
        if hs.len() == 64 {
            for h in hs.drain(..) {
                join(h)?;
            }
        }
    }
    for h in hs.drain(..) {
        join(h)?;
    }
    r.creation_throughput_per_s = Some(n as f64 / start.elapsed().as_secs_f64());

    // Idle CPU: std has no runtime; two parked threads stand in for one.
    let tids = Arc::new(Mutex::new(Vec::new()));
    let quit = Arc::new(AtomicBool::new(false));
    let mut idle = Vec::new();
    for _ in 0..2 {
        let (t, q) = (tids.clone(), quit.clone());
        idle.push(spawn(move || {
            if let Ok(mut g) = t.lock() {
                g.push(procstat::current_tid());
            }
            while !q.load(Ordering::Acquire) {
                std::thread::park();
            }
        })?);
    }
    spin_until("std idle start", to, || {
        tids.lock().map(|g| g.len() == 2).unwrap_or(true)
    })?;
    let ids = tids.lock().map(|g| g.clone()).unwrap_or_default();
    r.idle_cpu_percent = Some(procstat::idle_cpu_percent(&ids, ctx.idle_window));
    quit.store(true, Ordering::Release);
    for h in idle {
        h.thread().unpark();
        join(h)?;
    }
    r.note("std idle CPU: two parked threads (std has no runtime of its own)");
    Ok(r)
}

struct CvState {
    go: u64,
    waiting: u64,
}

fn condvar(ctx: &Ctx) -> Result<Vec<f64>, BenchError> {
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;
    let shared = Arc::new((Mutex::new(CvState { go: 0, waiting: 0 }), Condvar::new()));
    let stamp = Arc::new(Stamp::new());
    let quit = Arc::new(AtomicBool::new(false));
    let (sh, st, q) = (shared.clone(), stamp.clone(), quit.clone());
    let waiter = spawn(move || {
        if affinity::pin_current(b).is_err() {
            return;
        }
        let (m, cv) = &*sh;
        let Ok(mut g) = m.lock() else { return };
        let mut round = 0;
        loop {
            round += 1;
            g.waiting = round;
            while g.go < round {
                if q.load(Ordering::Acquire) {
                    return;
                }
                g = match cv.wait(g) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
            if g.go == u64::MAX || q.load(Ordering::Acquire) {
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
            // The waiter holds the lock until it is inside wait(); seeing
            // `waiting == round` under the lock means it is blocked.
            spin_until("std condvar ready", to, || {
                m.lock().map(|g| g.waiting >= round).unwrap_or(true)
            })?;
            common::busy_wait(ctx.settle);
            stamp.clear();
            {
                let mut g = m
                    .lock()
                    .map_err(|_| BenchError::Thread("poisoned".into()))?;
                g.go = round;
            }
            let t0 = clock.start();
            cv.notify_one();
            let (t1, cpu) = stamp.wait("std condvar wake", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c.kept)
    });
    quit.store(true, Ordering::Release);
    if let Ok(mut g) = shared.0.lock() {
        g.go = u64::MAX;
    }
    shared.1.notify_all();
    join(waiter)?;
    res
}

fn park_unpark(ctx: &Ctx) -> Result<Vec<f64>, BenchError> {
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;
    let ready = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicU64::new(0));
    let stamp = Arc::new(Stamp::new());
    let (rd, g2, st) = (ready.clone(), go.clone(), stamp.clone());
    let waiter = spawn(move || {
        if affinity::pin_current(b).is_err() {
            return;
        }
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
                std::thread::park();
                woke = Some(clock.now());
            }
            st.record(woke.unwrap_or_else(|| clock.now()));
        }
    })?;
    let th = waiter.thread().clone();
    let res = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        let mut round = 0;
        while !c.done() {
            round += 1;
            spin_until("std park ready", to, || {
                ready.load(Ordering::Acquire) >= round
            })?;
            common::busy_wait(ctx.settle);
            stamp.clear();
            go.store(round, Ordering::Release);
            let t0 = clock.start();
            th.unpark();
            let (t1, cpu) = stamp.wait("std park wake", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c.kept)
    });
    go.store(u64::MAX, Ordering::Release);
    waiter.thread().unpark();
    join(waiter)?;
    res
}
