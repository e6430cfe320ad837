//! The three pools, the open-loop generator that drives the measured pool,
//! and the closed loop that keeps a neighbour's pool saturated.
//!
//! Every task `i` has a *scheduled* submission time `t0 + i / rate`. The
//! generator (one OS thread, outside any pool) sleeps until that time and
//! hands the task over; latencies are measured from the scheduled time, so
//! a generator that falls behind (a full corewise slot table, a CFS delay
//! of the generator beside busy neighbours) adds to the measured latency
//! instead of silently lowering the offered load (no coordinated
//! omission). Tasks stamp their own start and end with the shared clock.
//!
//! The pools take the task body as a [`Task`] closure, so a neighbour
//! process runs exactly the same pool code with a body that only computes
//! `fib(N)` and hands a credit back to its closed loop ([`saturate`]).

use super::fib::fib;
use crate::clock::Clock;
use crate::error::BenchError;
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Start and end stamps of every task of one run.
#[derive(Debug)]
pub struct Stamps {
    /// Start ticks (0: not started).
    pub start: Vec<AtomicU64>,
    /// End ticks (0: not finished).
    pub end: Vec<AtomicU64>,
    /// Finished tasks.
    pub done: AtomicUsize,
    /// Set when the run gives up: tasks not yet started are skipped.
    pub abandon: AtomicBool,
}

impl Stamps {
    /// Room for `n` tasks.
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Stamps {
            start: (0..n).map(|_| AtomicU64::new(0)).collect(),
            end: (0..n).map(|_| AtomicU64::new(0)).collect(),
            done: AtomicUsize::new(0),
            abandon: AtomicBool::new(false),
        })
    }

    /// Runs task `i`: stamps, `fib(n)`, stamps.
    #[inline]
    pub fn run(&self, clock: &Clock, i: usize, n: u32) {
        if self.abandon.load(Ordering::Relaxed) {
            return;
        }
        self.start[i].store(clock.now().max(1), Ordering::Relaxed);
        black_box(fib(black_box(n)));
        self.end[i].store(clock.now().max(1), Ordering::Relaxed);
        self.done.fetch_add(1, Ordering::Release);
    }
}

/// Where the generator puts tasks.
pub trait Submit {
    /// Hands task `i` to the pool.
    fn submit(&mut self, i: usize) -> Result<(), BenchError>;
    /// No more tasks will come; returns once every submitted task has run
    /// or been skipped (after `Stamps::abandon`).
    fn finish(self: Box<Self>) -> Result<(), BenchError>;
    /// A reader, for another thread (a sampler), of the cores (or
    /// workers) the pool uses; it answers `None` once the pool is shutting
    /// down.
    fn probe(&self) -> Probe;
    /// The runtime's budget handle (its published neighbour cap and how
    /// often it changed), for pools that have one.
    fn budget(&self) -> Option<corewise::budget::BudgetHandle> {
        None
    }
}

/// See [`Submit::probe`].
pub type Probe = Arc<dyn Fn() -> Option<usize> + Send + Sync>;

/// The body of a task, called with the task's index on a pool thread.
pub type Task = Arc<dyn Fn(usize) + Send + Sync>;

/// The task parameters of a measured run.
#[derive(Debug, Clone)]
pub struct Work {
    /// The clock.
    pub clock: Clock,
    /// The stamps.
    pub stamps: Arc<Stamps>,
    /// `fib` argument.
    pub n: u32,
}

impl Work {
    /// The measured task: stamps start, `fib(n)`, stamps end.
    pub fn task(&self) -> Task {
        let w = self.clone();
        Arc::new(move |i| w.stamps.run(&w.clock, i, w.n))
    }
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<usize>,
    closed: bool,
}

/// A plain pool: `workers` OS threads pulling from one locked FIFO. With
/// one worker per CPU it is the paper's "ignorant" pool; with the
/// neighbour-free share of the CPUs it is the "optimal" static split.
pub struct StdPool {
    q: Arc<(Mutex<Queue>, Condvar)>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl StdPool {
    /// Starts `workers` threads running `task`.
    pub fn start(workers: usize, task: &Task) -> Result<Self, BenchError> {
        let q: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let mut pool = StdPool {
            q,
            workers: Vec::new(),
        };
        for k in 0..workers.max(1) {
            let q = Arc::clone(&pool.q);
            let t = Arc::clone(task);
            let h = std::thread::Builder::new()
                .name(format!("pool-worker-{k}"))
                .spawn(move || worker(&q, &*t))
                .map_err(|e| BenchError::Thread(format!("pool worker: {e}")));
            match h {
                Ok(h) => pool.workers.push(h),
                Err(e) => {
                    pool.close();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    fn close(&mut self) {
        let (m, cv) = &*self.q;
        if let Ok(mut g) = m.lock() {
            g.closed = true;
        }
        cv.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(q: &(Mutex<Queue>, Condvar), task: &(dyn Fn(usize) + Send + Sync)) {
    let (m, cv) = q;
    loop {
        let item = {
            let Ok(mut g) = m.lock() else { return };
            loop {
                if let Some(i) = g.items.pop_front() {
                    break Some(i);
                }
                if g.closed {
                    break None;
                }
                g = match cv.wait(g) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
        };
        match item {
            Some(i) => task(i),
            None => return,
        }
    }
}

impl Submit for StdPool {
    fn submit(&mut self, i: usize) -> Result<(), BenchError> {
        let (m, cv) = &*self.q;
        m.lock()
            .map_err(|_| BenchError::Thread("pool queue poisoned".into()))?
            .items
            .push_back(i);
        cv.notify_one();
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), BenchError> {
        self.close();
        Ok(())
    }

    fn probe(&self) -> Probe {
        let n = self.workers.len();
        Arc::new(move || Some(n))
    }
}

impl Drop for StdPool {
    fn drop(&mut self) {
        self.close();
    }
}

/// Tasks as corewise user threads, one per task, created from the
/// generator (an OS thread) with `wait_for_slot(true)`.
pub struct CorewisePool {
    // Shared only with probes, which hold a `Weak` and upgrade it for the
    // length of one `active_cores` call.
    rt: Option<Arc<corewise::Runtime>>,
    task: Task,
}

/// How a corewise pool measures its neighbour share: the overcommit
/// factor and the sampling window and smoothing of its
/// [`NeighbourConfig`](corewise::budget::NeighbourConfig).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Overcommit factor O of the cap.
    pub overcommit: f64,
    /// Sampling window, ms.
    pub window_ms: f64,
    /// Weight of the newest window in the moving average.
    pub smoothing: f64,
}

impl Share {
    /// The runtime's configuration for these settings.
    pub fn config(&self) -> corewise::budget::NeighbourConfig {
        corewise::budget::NeighbourConfig {
            overcommit: self.overcommit,
            window: Duration::from_secs_f64(self.window_ms / 1000.0),
            smoothing: self.smoothing,
            ..corewise::budget::NeighbourConfig::default()
        }
    }
}

impl Default for Share {
    /// The runtime's defaults.
    fn default() -> Self {
        let d = corewise::budget::NeighbourConfig::default();
        Share {
            overcommit: d.overcommit,
            window_ms: d.window.as_secs_f64() * 1000.0,
            smoothing: d.smoothing,
        }
    }
}

impl CorewisePool {
    /// Builds the runtime: every allowed CPU, default policy, neighbour
    /// awareness with `share` (None: off).
    pub fn start(task: &Task, share: Option<Share>) -> Result<Self, BenchError> {
        Self::start_in(task, share, None)
    }

    /// [`start`](Self::start), with the neighbour share measured among the
    /// processes of `cgroup` (a `cpuacct` directory) when given.
    pub fn start_in(
        task: &Task,
        share: Option<Share>,
        cgroup: Option<&std::path::Path>,
    ) -> Result<Self, BenchError> {
        let nb = share.map(|s| s.config());
        let mut builder = corewise::Runtime::builder().neighbour_awareness(nb);
        if let Some(dir) = cgroup {
            builder = builder.neighbour_cgroup(dir);
        }
        let rt = builder.build().map_err(|e| BenchError::Runtime {
            runtime: "corewise",
            message: e.to_string(),
        })?;
        Ok(CorewisePool {
            rt: Some(Arc::new(rt)),
            task: Arc::clone(task),
        })
    }
}

impl Submit for CorewisePool {
    fn submit(&mut self, i: usize) -> Result<(), BenchError> {
        let Some(rt) = self.rt.as_deref() else {
            return Err(BenchError::Runtime {
                runtime: "corewise",
                message: "runtime already stopped".into(),
            });
        };
        let t = Arc::clone(&self.task);
        corewise::thread::Builder::new()
            .wait_for_slot(true)
            .spawn_detached_in(rt, move || t(i))
            .map(|_| ())
            .map_err(|e| BenchError::Runtime {
                runtime: "corewise",
                message: format!("spawn: {e}"),
            })
    }

    fn finish(mut self: Box<Self>) -> Result<(), BenchError> {
        // Dropping the runtime waits for its user threads, then stops its
        // kernel threads: nothing keeps running afterwards. A user thread
        // that never finishes (a runtime bug) is reported, not waited for.
        match self.rt.take() {
            Some(rt) => {
                let rt = unwrap_shared(rt, Duration::from_secs(1))?;
                if drop_with_timeout(rt, Duration::from_secs(10)) {
                    Ok(())
                } else {
                    Err(BenchError::Timeout(
                        "corewise runtime shutdown (a user thread never finished)",
                    ))
                }
            }
            None => Ok(()),
        }
    }

    fn budget(&self) -> Option<corewise::budget::BudgetHandle> {
        self.rt.as_ref().map(|rt| rt.budget().clone())
    }

    fn probe(&self) -> Probe {
        let weak = self.rt.as_ref().map(Arc::downgrade);
        Arc::new(move || {
            weak.as_ref()
                .and_then(std::sync::Weak::upgrade)
                .map(|r| r.active_cores())
        })
    }
}

/// Takes the runtime back from its `Arc` once no probe holds it (probes
/// hold it only for one atomic load, so this waits microseconds).
fn unwrap_shared(
    mut rt: Arc<corewise::Runtime>,
    limit: Duration,
) -> Result<corewise::Runtime, BenchError> {
    let start = std::time::Instant::now();
    loop {
        match Arc::try_unwrap(rt) {
            Ok(r) => return Ok(r),
            Err(a) if start.elapsed() < limit => {
                rt = a;
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(_) => return Err(BenchError::Timeout("a probe kept the runtime alive")),
        }
    }
}

/// Drops `rt` on a helper thread; `false` if that did not finish within
/// `limit` (the helper is then left blocked; process exit ends it).
pub fn drop_with_timeout(rt: corewise::Runtime, limit: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("runtime-drop".into())
        .spawn(move || {
            drop(rt);
            let _ = tx.send(());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(limit).is_ok(),
        Err(_) => false,
    }
}

/// Scheduled submission time of task `i`, in ticks after `t0`.
pub fn scheduled_ticks(t0: u64, i: usize, interval_ticks: f64) -> u64 {
    t0 + (i as f64 * interval_ticks).round() as u64
}

/// What [`drive`] saw.
#[derive(Debug, Clone, Default)]
pub struct Driven {
    /// Every task finished before the drain deadline.
    pub complete: bool,
    /// When the drain deadline passed with tasks unfinished (ticks).
    pub abandoned_at: Option<u64>,
}

/// Drives `pool` open-loop: `n` tasks, one every `interval_ticks` (ticks of
/// `clock`), starting at `t0`. Then waits until every task finished or
/// `drain` has passed after the last *scheduled* submission (then sets
/// `abandon`), and shuts the pool down. The deadline is absolute, so a
/// pool whose submissions block (a full slot table) gets no extra time;
/// tasks not submitted by then are skipped.
pub fn drive(
    pool: Box<dyn Submit>,
    clock: &Clock,
    stamps: &Stamps,
    t0: u64,
    interval_ticks: f64,
    n: usize,
    drain: Duration,
) -> Result<Driven, BenchError> {
    let mut pool = pool;
    let end = scheduled_ticks(t0, n, interval_ticks);
    let deadline = end + (drain.as_nanos() as f64 * clock.ticks_per_ns()) as u64;
    let mut abandoned_at = None;
    for i in 0..n {
        let target = scheduled_ticks(t0, i, interval_ticks);
        if clock.now() >= deadline {
            abandoned_at = Some(clock.now());
            stamps.abandon.store(true, Ordering::Relaxed);
            break;
        }
        let now = clock.now();
        if target > now {
            let ns = clock.delta_ns(now, target);
            std::thread::sleep(Duration::from_nanos(ns as u64));
        }
        if let Err(e) = pool.submit(i) {
            stamps.abandon.store(true, Ordering::Relaxed);
            let _ = pool.finish();
            return Err(e);
        }
    }
    let mut complete = abandoned_at.is_none();
    while complete && stamps.done.load(Ordering::Acquire) < n {
        if clock.now() >= deadline {
            abandoned_at = Some(clock.now());
            stamps.abandon.store(true, Ordering::Relaxed);
            complete = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    pool.finish()?;
    Ok(Driven {
        complete,
        abandoned_at,
    })
}

/// A counter of tasks in flight, for a closed loop.
#[derive(Debug, Default)]
pub struct Credits {
    used: Mutex<usize>,
    freed: Condvar,
}

impl Credits {
    /// Takes a credit if fewer than `max` are out, waiting at most `wait`
    /// for one to come back; `false` if none came.
    pub fn acquire(&self, max: usize, wait: Duration) -> bool {
        let Ok(mut g) = self.used.lock() else {
            return false;
        };
        if *g >= max {
            g = match self.freed.wait_timeout_while(g, wait, |u| *u >= max) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
        if *g >= max {
            return false;
        }
        *g += 1;
        true
    }

    /// Gives a credit back (a task finished).
    pub fn release(&self) {
        if let Ok(mut g) = self.used.lock() {
            *g = g.saturating_sub(1);
        }
        self.freed.notify_one();
    }

    /// Credits out now.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.used.lock().map_or(0, |g| *g)
    }
}

/// The task of a saturating neighbour: `fib(n)`, then a credit back.
pub fn neighbour_task(credits: &Arc<Credits>, n: u32) -> Task {
    let c = Arc::clone(credits);
    Arc::new(move |_| {
        black_box(fib(black_box(n)));
        c.release();
    })
}

/// Closed loop: keeps `in_flight` tasks submitted to `pool` (each created
/// with [`neighbour_task`] over the same `credits`) until `keep_going`
/// returns false; checked at least every 100 ms. Returns the number of
/// tasks submitted.
pub fn saturate(
    pool: &mut dyn Submit,
    credits: &Credits,
    in_flight: usize,
    mut keep_going: impl FnMut() -> bool,
) -> Result<u64, BenchError> {
    let mut i = 0u64;
    while keep_going() {
        if credits.acquire(in_flight.max(1), Duration::from_millis(100)) {
            pool.submit(i as usize)?;
            i += 1;
        }
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_is_evenly_spaced() {
        assert_eq!(scheduled_ticks(100, 0, 2.5), 100);
        assert_eq!(scheduled_ticks(100, 4, 2.5), 110);
        assert_eq!(scheduled_ticks(0, 3, 1_000_000.0), 3_000_000);
    }

    #[test]
    fn std_pool_runs_every_task() {
        let clock = Clock::monotonic();
        let stamps = Stamps::new(20);
        let work = Work {
            clock,
            stamps: Arc::clone(&stamps),
            n: 10,
        };
        let pool = StdPool::start(2, &work.task()).expect("pool");
        let t0 = clock.now();
        let ok = drive(
            Box::new(pool),
            &clock,
            &stamps,
            t0,
            100_000.0,
            20,
            Duration::from_secs(5),
        )
        .expect("drive");
        assert!(ok.complete);
        assert_eq!(stamps.done.load(Ordering::Relaxed), 20);
        assert!(stamps.end.iter().all(|e| e.load(Ordering::Relaxed) > 0));
    }

    #[test]
    fn closed_loop_keeps_the_pool_full() {
        let credits = Arc::new(Credits::default());
        let task = neighbour_task(&credits, 15);
        let mut pool = StdPool::start(2, &task).expect("pool");
        let start = std::time::Instant::now();
        let mut peak = 0;
        let n = saturate(&mut pool, &credits, 4, || {
            peak = peak.max(credits.in_flight());
            start.elapsed() < Duration::from_millis(100)
        })
        .expect("saturate");
        assert!(n >= 4, "{n}");
        assert!(peak <= 4, "{peak}");
        Box::new(pool).finish().expect("finish");
        assert_eq!(credits.in_flight(), 0);
    }

    #[test]
    fn credits_time_out_when_all_are_out() {
        let c = Credits::default();
        assert!(c.acquire(1, Duration::ZERO));
        assert!(!c.acquire(1, Duration::from_millis(5)));
        c.release();
        assert!(c.acquire(1, Duration::ZERO));
        assert_eq!(c.in_flight(), 1);
    }
}
