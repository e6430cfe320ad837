//! The `tokio` column.
//!
//! Same-core ops run in a current-thread runtime driven by a thread pinned
//! to cpu A. Cross-core ops target a second current-thread runtime driven by
//! a thread pinned to cpu B; the parent/notifier is a plain thread on cpu A
//! that uses that runtime's `Handle`. Creation throughput and idle CPU use a
//! multi-thread runtime with 2 workers.

use super::common::{self, on_cpu, spin_until, Collector, Stamp};
use super::{Cost, Ctx, Op, RuntimeReport};
use crate::affinity;
use crate::error::BenchError;
use crate::procstat;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::Notify;

fn rt_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Runtime {
        runtime: "tokio",
        message: e.to_string(),
    }
}

fn current_thread() -> Result<Runtime, BenchError> {
    Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(rt_err)
}

/// A current-thread runtime driven by its own thread pinned to `cpu`.
struct Remote {
    handle: Handle,
    stop: Arc<Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Remote {
    fn start(cpu: usize) -> Result<Remote, BenchError> {
        let rt = current_thread()?;
        let handle = rt.handle().clone();
        let stop = Arc::new(Notify::new());
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tokio-remote".into())
            .spawn(move || {
                if affinity::pin_current(cpu).is_ok() {
                    rt.block_on(s2.notified());
                }
            })
            .map_err(|e| BenchError::Thread(e.to_string()))?;
        Ok(Remote {
            handle,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs every tokio measurement.
pub fn run(ctx: &Ctx) -> Result<RuntimeReport, BenchError> {
    let mut r = RuntimeReport::new("tokio");
    let clock = ctx.clock;
    let (a, b) = (ctx.cpu_a, ctx.cpu_b);
    let to = ctx.wait_timeout;
    let remote = Remote::start(b)?;

    // create_cross_core: Handle::spawn from cpu A onto the runtime on cpu B.
    let create = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        while !c.done() {
            let stamp = Arc::new(Stamp::new());
            let s2 = stamp.clone();
            let t0 = clock.start();
            drop(remote.handle.spawn(async move {
                s2.record(clock.now());
            }));
            let (t1, cpu) = stamp.wait("tokio create_cross_core", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
            common::busy_wait(ctx.settle);
        }
        Ok(c)
    })?;
    r.notes.extend(create.note("tokio", Op::CreateCrossCore));
    r.push(Op::CreateCrossCore, create.kept);

    // Same-core ops inside a current-thread runtime on cpu A.
    let (sj, ny, ow) = on_cpu(a, || {
        let rt = current_thread()?;
        let n = ctx.samples(Cost::Cheap);
        let w = ctx.warmup(Cost::Cheap);
        let sj = rt
            .block_on(rt.spawn(async move {
                let mut v = Vec::with_capacity(n);
                for i in 0..n + w {
                    let t0 = clock.start();
                    let _ = tokio::spawn(async {}).await;
                    let t1 = clock.now();
                    if i >= w {
                        v.push(clock.delta_ns(t0, t1));
                    }
                }
                v
            }))
            .map_err(rt_err)?;
        let ny = rt
            .block_on(rt.spawn(async move {
                let mut v = Vec::with_capacity(n);
                for i in 0..n + w {
                    let t0 = clock.start();
                    for _ in 0..10 {
                        tokio::task::yield_now().await;
                    }
                    let t1 = clock.now();
                    if i >= w {
                        v.push(clock.delta_ns(t0, t1) / 10.0);
                    }
                }
                v
            }))
            .map_err(rt_err)?;
        let ow = rt
            .block_on(async move {
                let counter = Arc::new(AtomicU64::new(0));
                let stop = Arc::new(AtomicBool::new(false));
                let (c2, s2) = (counter.clone(), stop.clone());
                let follower = tokio::spawn(async move {
                    while !s2.load(Ordering::Acquire) {
                        let c = c2.load(Ordering::Acquire);
                        if c % 2 == 1 {
                            c2.store(c + 1, Ordering::Release);
                        }
                        tokio::task::yield_now().await;
                    }
                });
                let leader = tokio::spawn(async move {
                    let batch = 20u64;
                    let mut v = Vec::with_capacity(n / 2);
                    for i in 0..(n + w) / 2 {
                        let start = counter.load(Ordering::Acquire);
                        let t0 = clock.start();
                        loop {
                            let c = counter.load(Ordering::Acquire);
                            if c >= start + batch {
                                break;
                            }
                            if c.is_multiple_of(2) {
                                counter.store(c + 1, Ordering::Release);
                            }
                            tokio::task::yield_now().await;
                        }
                        let t1 = clock.now();
                        if i >= w / 2 {
                            let done = counter.load(Ordering::Acquire) - start;
                            v.push(clock.delta_ns(t0, t1) / done.max(1) as f64);
                        }
                    }
                    stop.store(true, Ordering::Release);
                    v
                });
                let v = leader.await;
                let _ = follower.await;
                v
            })
            .map_err(rt_err)?;
        Ok((sj, ny, ow))
    })?;
    r.push(Op::SpawnJoinSameCore, sj);
    r.push(Op::NullYield, ny);
    r.push(Op::OneWayYield, ow);

    // condvar_notify_cross_core: a task on cpu B waits in Notify::notified.
    let notify = Arc::new(Notify::new());
    let ready = Arc::new(AtomicU64::new(0));
    let quit = Arc::new(AtomicBool::new(false));
    let stamp = Arc::new(Stamp::new());
    let (n2, rd, q2, st) = (notify.clone(), ready.clone(), quit.clone(), stamp.clone());
    let waiter = remote.handle.spawn(async move {
        let mut round = 0;
        loop {
            round += 1;
            let fut = n2.notified();
            rd.store(round, Ordering::Release);
            fut.await;
            if q2.load(Ordering::Acquire) {
                return;
            }
            st.record(clock.now());
        }
    });
    let cv = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        let mut round = 0;
        while !c.done() {
            round += 1;
            spin_until("tokio notify ready", to, || {
                ready.load(Ordering::Acquire) >= round
            })?;
            common::busy_wait(ctx.settle);
            stamp.clear();
            let t0 = clock.start();
            notify.notify_one();
            let (t1, cpu) = stamp.wait("tokio notify wake", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c.kept)
    });
    quit.store(true, Ordering::Release);
    notify.notify_one();
    drop(waiter);
    r.push(Op::CondvarNotifyCrossCore, cv?);

    // signal_cross_core: a fresh task on cpu B awaits a oneshot each round.
    let sig = on_cpu(a, || {
        let mut c = Collector::new(ctx.samples(Cost::CrossCore), ctx.warmup(Cost::CrossCore));
        while !c.done() {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let ready = Arc::new(AtomicBool::new(false));
            let stamp = Arc::new(Stamp::new());
            let (rd, st) = (ready.clone(), stamp.clone());
            drop(remote.handle.spawn(async move {
                rd.store(true, Ordering::Release);
                if rx.await.is_ok() {
                    st.record(clock.now());
                }
            }));
            spin_until("tokio oneshot ready", to, || ready.load(Ordering::Acquire))?;
            common::busy_wait(ctx.settle);
            let t0 = clock.start();
            let _ = tx.send(());
            let (t1, cpu) = stamp.wait("tokio oneshot wake", to)?;
            c.offer(clock.delta_ns(t0, t1), cpu == b);
        }
        Ok(c.kept)
    })?;
    r.push(Op::SignalCrossCore, sig);
    drop(remote);

    // Creation throughput and idle CPU: multi-thread runtime, 2 workers,
    // worker i pinned to cpu A / cpu B.
    let tids = Arc::new(Mutex::new(Vec::<i32>::new()));
    let t2 = tids.clone();
    let next = Arc::new(AtomicU64::new(0));
    let cpus = [a, b];
    let mt = Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
            let _ = affinity::pin_current(cpus[i % 2]);
            if let Ok(mut g) = t2.lock() {
                g.push(procstat::current_tid());
            }
        })
        .build()
        .map_err(rt_err)?;
    let n = ctx.throughput_children(Cost::Cheap);
    let secs = mt
        .block_on(mt.spawn(async move {
            let done = Arc::new(AtomicU64::new(0));
            let start = Instant::now();
            for _ in 0..n {
                let d = done.clone();
                drop(tokio::spawn(async move {
                    d.fetch_add(1, Ordering::Relaxed);
                }));
            }
            while done.load(Ordering::Acquire) < n as u64 {
                tokio::task::yield_now().await;
            }
            start.elapsed().as_secs_f64()
        }))
        .map_err(rt_err)?;
    r.creation_throughput_per_s = Some(n as f64 / secs);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let ids = tids.lock().map(|g| g.clone()).unwrap_or_default();
    r.idle_cpu_percent = Some(procstat::idle_cpu_percent(&ids, ctx.idle_window));
    drop(mt);
    r.note("tokio: same-core ops on a current_thread runtime pinned to cpu A; cross-core ops target a current_thread runtime pinned to cpu B; throughput and idle CPU from a multi-thread runtime with 2 pinned workers");
    Ok(r)
}
