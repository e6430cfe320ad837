//! Measurement helpers shared by the runners.

use super::Ctx;
use crate::affinity;
use crate::error::BenchError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Runs `f` on a new kernel thread pinned to `cpu` and returns its result.
/// The caller's own affinity is left alone.
pub fn on_cpu<T: Send>(
    cpu: usize,
    f: impl FnOnce() -> Result<T, BenchError> + Send,
) -> Result<T, BenchError> {
    std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name(format!("bench-cpu{cpu}"))
            .spawn_scoped(s, move || {
                affinity::pin_current(cpu)?;
                f()
            })
            .map_err(|e| BenchError::Thread(e.to_string()))?;
        h.join()
            .map_err(|_| BenchError::Thread("measuring thread panicked".into()))?
    })
}

/// Waits until `done()` holds: spins, and yields the CPU now and then so a
/// thread that shares the core can run. Fails after `timeout`.
#[inline]
pub fn spin_until(
    what: &'static str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<(), BenchError> {
    let mut spins: u32 = 0;
    let mut start: Option<Instant> = None;
    while !done() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) {
            std::thread::yield_now();
            let s = *start.get_or_insert_with(Instant::now);
            if s.elapsed() > timeout {
                return Err(BenchError::Timeout(what));
            }
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// Busy-waits for `d` (used as the settle pause; sleeping would add the
/// notifier's own wake-up to the next sample's surroundings).
pub fn busy_wait(d: Duration) {
    let s = Instant::now();
    while s.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// A timestamp plus the CPU it was taken on, published by one thread and
/// read by another. `tick == 0` means "not yet".
#[derive(Debug, Default)]
pub struct Stamp {
    tick: AtomicU64,
    cpu: AtomicU64,
}

impl Stamp {
    /// A fresh, empty stamp.
    pub const fn new() -> Self {
        Stamp {
            tick: AtomicU64::new(0),
            cpu: AtomicU64::new(u64::MAX),
        }
    }

    /// Records `tick` (taken by the caller as its very first action) and the
    /// caller's CPU.
    #[inline]
    pub fn record(&self, tick: u64) {
        self.cpu
            .store(affinity::current_cpu() as u64, Ordering::Relaxed);
        self.tick.store(tick.max(1), Ordering::Release);
    }

    /// The recorded (tick, cpu), if any.
    #[inline]
    pub fn get(&self) -> Option<(u64, usize)> {
        let t = self.tick.load(Ordering::Acquire);
        (t != 0).then(|| (t, self.cpu.load(Ordering::Relaxed) as usize))
    }

    /// Clears the stamp for the next round.
    pub fn clear(&self) {
        self.tick.store(0, Ordering::Release);
    }

    /// Waits for the stamp and returns it.
    pub fn wait(&self, what: &'static str, timeout: Duration) -> Result<(u64, usize), BenchError> {
        let mut out = None;
        spin_until(what, timeout, || {
            out = self.get();
            out.is_some()
        })?;
        out.ok_or(BenchError::Timeout(what))
    }
}

/// Collects samples and counts those rejected because the measured thread
/// ran on the wrong CPU.
#[derive(Debug, Default)]
pub struct Collector {
    /// Kept samples, ns.
    pub kept: Vec<f64>,
    /// Samples thrown away because of placement.
    pub rejected: usize,
    warm_left: usize,
    want: usize,
}

impl Collector {
    /// Wants `want` samples after `warmup` discarded ones.
    pub fn new(want: usize, warmup: usize) -> Self {
        Collector {
            kept: Vec::with_capacity(want),
            rejected: 0,
            warm_left: warmup,
            want,
        }
    }

    /// Whether enough samples have been kept.
    pub fn full(&self) -> bool {
        self.kept.len() >= self.want
    }

    /// Whether to stop trying: full, or so many rejections that the
    /// runtime evidently will not place the thread where asked.
    pub fn done(&self) -> bool {
        self.full() || self.rejected > 4 * self.want + 1_000
    }

    /// Offers one sample; `placed_ok` says whether the measured thread ran
    /// where the op requires.
    pub fn offer(&mut self, ns: f64, placed_ok: bool) {
        if !placed_ok {
            self.rejected += 1;
        } else if self.warm_left > 0 {
            self.warm_left -= 1;
        } else if !self.full() {
            self.kept.push(ns);
        }
    }

    /// A note for the report when samples were rejected.
    pub fn note(&self, runtime: &str, op: super::Op) -> Option<String> {
        (self.rejected > 0).then(|| {
            format!(
                "{runtime} {}: kept {} samples, rejected {} that ran on the wrong cpu",
                op.name(),
                self.kept.len(),
                self.rejected
            )
        })
    }
}

/// Lines the round-trip probe cycles through.
const PROBE_LINES: usize = 16;

/// Median round trip (ns) of a cache line between `cpu_a` and `cpu_b`: two
/// pinned threads bounce a counter in a 64-byte-aligned line. Each sample is
/// the mean of a batch of 64 round trips.
///
/// The batches cycle through [`PROBE_LINES`] lines, each in a page of its
/// own: what one line's round trip costs depends on its address (the L3
/// slice that homes it; per-line medians on an AMD EPYC host ranged from
/// 44 to 59 ns, each line the same from run to run), so one line would
/// make the yardstick of every cross-core ratio an accident of where the
/// probe's stack or heap happened to lie. The median over all batches is
/// the round trip of a typical line, like the lines a runtime's own
/// cross-core protocol touches.
pub fn cache_line_round_trip(ctx: &Ctx) -> Result<f64, BenchError> {
    #[repr(C, align(4096))]
    struct Page {
        line: AtomicU64,
    }
    let pages: Vec<Page> = (0..PROBE_LINES)
        .map(|_| Page {
            line: AtomicU64::new(0),
        })
        .collect();
    let stop = AtomicBool::new(false);
    let clock = ctx.clock;
    let batch: u64 = 64;
    let samples = if ctx.quick { 2_000 } else { 10_000 };
    let warm = samples / 10;
    let timeout = ctx.wait_timeout;
    std::thread::scope(|s| {
        // Both sides follow the same schedule: batch i uses line
        // i % PROBE_LINES, so no word tells the echo which line is live.
        let echo = s.spawn(|| -> Result<(), BenchError> {
            affinity::pin_current(ctx.cpu_b)?;
            let mut spins: u64 = 0;
            let start = Instant::now();
            let mut k = 0usize;
            let mut echoed: u64 = 0;
            loop {
                let line = &pages[k].line;
                let v = line.load(Ordering::Acquire);
                if v % 2 == 1 {
                    line.store(v + 1, Ordering::Release);
                    spins = 0;
                    echoed += 1;
                    if echoed == batch {
                        echoed = 0;
                        k = (k + 1) % PROBE_LINES;
                    }
                } else if stop.load(Ordering::Relaxed) {
                    return Ok(());
                } else {
                    spins += 1;
                    if spins.is_multiple_of(1 << 24) && start.elapsed() > timeout * 8 {
                        return Err(BenchError::Timeout("cache-line round trip"));
                    }
                    std::hint::spin_loop();
                }
            }
        });
        let lead = s.spawn(|| -> Result<Vec<f64>, BenchError> {
            affinity::pin_current(ctx.cpu_a)?;
            let mut v = Vec::with_capacity(samples);
            let mut x = [0u64; PROBE_LINES];
            for i in 0..samples + warm {
                let k = i % PROBE_LINES;
                let line = &pages[k].line;
                let t0 = clock.start();
                for _ in 0..batch {
                    line.store(x[k] + 1, Ordering::Release);
                    x[k] += 2;
                    let mut n: u64 = 0;
                    while line.load(Ordering::Acquire) != x[k] {
                        n += 1;
                        if n.is_multiple_of(1 << 26) {
                            return Err(BenchError::Timeout("cache-line round trip"));
                        }
                        std::hint::spin_loop();
                    }
                }
                let t1 = clock.now();
                if i >= warm {
                    v.push(clock.delta_ns(t0, t1) / batch as f64);
                }
            }
            stop.store(true, Ordering::Relaxed);
            Ok(v)
        });
        let lead = lead.join();
        stop.store(true, Ordering::Relaxed);
        let lead = lead.map_err(|_| BenchError::Thread("round-trip thread panicked".into()))?;
        let echoed = echo
            .join()
            .map_err(|_| BenchError::Thread("round-trip thread panicked".into()))?;
        echoed?;
        let v = lead?;
        crate::stats::Summary::of(&v)
            .map(|s| s.median)
            .ok_or(BenchError::Timeout("cache-line round trip"))
    })
}

/// One-way wakes (ns) with no runtime at all: a thread pinned to `cpu_b`
/// polls a line, as an idle dispatcher polls its slots (a load, then a few
/// ns of arithmetic), and takes the time when it sees the line change; a
/// thread on `cpu_a` takes the time and changes the line with a locked add,
/// as a signal does. The same clock reads, settle pause and sample counts
/// as the runners' cross-core ops.
///
/// It is the event `signal`, `notify` and `create` each time once (one
/// write's transfer to a core that polls for it, and two clock reads) done
/// by the simplest code, so a runtime's figure reads against it. The
/// streamed round trip of [`cache_line_round_trip`] is a throughput figure
/// (64 round trips back to back, the clock read once around them), and on
/// some hosts a lone wake costs far more than a streamed round trip: on an
/// Intel Xeon (Emerald Rapids) guest, 307-334 ns against 166, while
/// corewise's signal took 279-294 ns in the same runs (its dispatcher
/// polls less densely: see `poll_delay` in the runtime's dispatcher).
pub fn bare_wake(ctx: &Ctx) -> Result<Vec<f64>, BenchError> {
    #[repr(C, align(128))]
    struct Line(AtomicU64);
    let (flag, ready) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    let stamp = Stamp::new();
    let stop = AtomicBool::new(false);
    let (clock, to, settle) = (ctx.clock, ctx.wait_timeout, ctx.settle);
    let (n, warm) = (
        ctx.samples(super::Cost::CrossCore),
        ctx.warmup(super::Cost::CrossCore),
    );
    std::thread::scope(|s| {
        let poller = s.spawn(|| -> Result<(), BenchError> {
            affinity::pin_current(ctx.cpu_b)?;
            let start = Instant::now();
            let mut round = 0u64;
            let mut spins: u64 = 0;
            loop {
                round += 1;
                ready.0.store(round, Ordering::Release);
                loop {
                    if flag.0.load(Ordering::Acquire) >= round {
                        break;
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    spins += 1;
                    if spins.is_multiple_of(1 << 24) && start.elapsed() > to * 8 {
                        return Err(BenchError::Timeout("bare wake"));
                    }
                    std::hint::black_box(std::hint::black_box(1u64).wrapping_mul(3));
                }
                stamp.record(clock.now());
            }
        });
        let lead = s.spawn(|| -> Result<Vec<f64>, BenchError> {
            affinity::pin_current(ctx.cpu_a)?;
            let mut v = Vec::with_capacity(n);
            for round in 1..=(n + warm) as u64 {
                spin_until("bare wake ready", to, || {
                    ready.0.load(Ordering::Acquire) >= round
                })?;
                busy_wait(settle);
                stamp.clear();
                let t0 = clock.start();
                flag.0.fetch_add(1, Ordering::AcqRel);
                let (t1, _) = stamp.wait("bare wake", to)?;
                if round > warm as u64 {
                    v.push(clock.delta_ns(t0, t1));
                }
            }
            Ok(v)
        });
        let lead = lead.join();
        stop.store(true, Ordering::Relaxed);
        let lead = lead.map_err(|_| BenchError::Thread("bare-wake thread panicked".into()))?;
        let polled = poller
            .join()
            .map_err(|_| BenchError::Thread("bare-wake thread panicked".into()))?;
        let v = lead?;
        polled?;
        Ok(v)
    })
}

/// Measures one-way yield hand-offs between a leader and a follower that
/// share one core. Both call `yield_fn` in a loop; a shared counter tells
/// whose turn it is, and each turn taken increments it. The leader times
/// `batch` increments per sample: ns per hand-off = elapsed / batch.
/// This is the leader's half; the follower runs [`pingpong_follower`].
pub fn pingpong_leader(
    ctx: &Ctx,
    counter: &AtomicU64,
    stop: &AtomicBool,
    samples: usize,
    warmup: usize,
    batch: u64,
    mut yield_fn: impl FnMut(),
) -> Vec<f64> {
    let clock = ctx.clock;
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples + warmup {
        let start = counter.load(Ordering::Acquire);
        let target = start + batch;
        let t0 = clock.start();
        loop {
            let c = counter.load(Ordering::Acquire);
            if c >= target {
                break;
            }
            if c.is_multiple_of(2) {
                counter.store(c + 1, Ordering::Release);
            }
            yield_fn();
        }
        let t1 = clock.now();
        if i >= warmup {
            let done = counter.load(Ordering::Acquire) - start;
            out.push(clock.delta_ns(t0, t1) / done.max(1) as f64);
        }
    }
    stop.store(true, Ordering::Release);
    out
}

/// The follower's half of [`pingpong_leader`]: takes odd turns until
/// `stop` is set.
pub fn pingpong_follower(counter: &AtomicU64, stop: &AtomicBool, mut yield_fn: impl FnMut()) {
    while !stop.load(Ordering::Acquire) {
        let c = counter.load(Ordering::Acquire);
        if c % 2 == 1 {
            counter.store(c + 1, Ordering::Release);
        }
        yield_fn();
    }
}

/// Times `batch` calls of `op` per sample and returns ns per call.
pub fn batched(
    ctx: &Ctx,
    samples: usize,
    warmup: usize,
    batch: u32,
    mut op: impl FnMut(),
) -> Vec<f64> {
    let clock = ctx.clock;
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples + warmup {
        let t0 = clock.start();
        for _ in 0..batch {
            op();
        }
        let t1 = clock.now();
        if i >= warmup {
            out.push(clock.delta_ns(t0, t1) / f64::from(batch));
        }
    }
    out
}
