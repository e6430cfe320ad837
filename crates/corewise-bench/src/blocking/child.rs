//! One (peer, kind) run inside a child process of `blocking`: the ticker,
//! the blockers and the watchdog that reports a stall instead of hanging.
//!
//! The child's main thread only keeps time: it starts the peer on a driver
//! thread, tells the blockers to stop when the duration is up, and gives
//! the peer `interval + grace` more to finish. A peer that has not finished
//! by then is reported as stalled with the ticks recorded so far (the
//! caller prints the outcome and exits without shutting the peer down).

use super::{Kind, Outcome, Peer};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The shape of one run, the same for every peer.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What the blockers call.
    pub kind: Kind,
    /// Blocking threads (tasks, goroutines).
    pub blockers: usize,
    /// The CPUs of the run; a runtime gets one core (worker) per CPU.
    pub cpus: Vec<usize>,
    /// The ticker's period.
    pub interval: Duration,
    /// How long the blockers run.
    pub duration: Duration,
    /// How long after the duration (plus one interval) the peer may take to
    /// finish before it counts as stalled.
    pub grace: Duration,
}

/// What the ticker, the blockers and the watchdog share.
struct Shared {
    plan: Plan,
    /// The small file the `fs` blockers read.
    file: PathBuf,
    /// The ticker's start; the blockers are started after it is set.
    start: OnceLock<Instant>,
    /// Set by the watchdog when the duration is up.
    stop: AtomicBool,
    /// Blocking calls made, all blockers together.
    calls: AtomicU64,
    /// Lateness of each tick, µs.
    lateness_us: Mutex<Vec<f64>>,
}

impl Shared {
    /// Records the wake-up at `now` for `due` and returns the next due
    /// time, or `None` when the run is over. Due times that have already
    /// passed are dropped (as a Go `time.Ticker` drops ticks), so a starved
    /// ticker shows as few ticks and one long lateness, not as a burst.
    fn tick(&self, start: Instant, due: Instant, now: Instant) -> Option<Instant> {
        let late = now.saturating_duration_since(due).as_secs_f64() * 1e6;
        if let Ok(mut v) = self.lateness_us.lock() {
            v.push(late);
        }
        if now >= start + self.plan.duration {
            return None;
        }
        let period = self.plan.interval.as_nanos().max(1);
        let k = now.saturating_duration_since(start).as_nanos() / period + 1;
        Some(start + self.plan.interval * u32::try_from(k).unwrap_or(u32::MAX))
    }

    /// The ticker of the peers that sleep synchronously (corewise, std):
    /// `sleep` is the peer's sleep.
    fn ticker(&self, sleep: impl Fn(Duration)) {
        let start = Instant::now();
        let _ = self.start.set(start);
        let mut due = start + self.plan.interval;
        loop {
            sleep(due.saturating_duration_since(Instant::now()));
            match self.tick(start, due, Instant::now()) {
                Some(next) => due = next,
                None => break,
            }
        }
    }

    /// One blocker: the blocking call in a loop until the watchdog says
    /// stop. No yield, no runtime call: the call is all it does.
    fn blocker(&self) {
        let mut acc = 1u64;
        while !self.stop.load(Ordering::Relaxed) {
            match self.plan.kind {
                Kind::Sleep => std::thread::sleep(Duration::from_millis(1)),
                Kind::Fs => acc += std::fs::read(&self.file).map_or(0, |v| v.len() as u64),
                Kind::Compute => {
                    for _ in 0..100_000 {
                        acc = black_box(
                            acc.wrapping_mul(6_364_136_223_846_793_005)
                                .wrapping_add(1_442_695_040_888_963_407),
                        );
                    }
                }
            }
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
        black_box(acc);
    }

    fn lateness(&self) -> Vec<f64> {
        self.lateness_us
            .lock()
            .map(|v| v.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }
}

/// Runs `peer` with `plan`; never panics, never waits past the watchdog.
pub fn run(peer: Peer, plan: Plan) -> Outcome {
    let mut out = Outcome {
        peer: peer.name().to_string(),
        kind: plan.kind.name().to_string(),
        expected: expected_ticks(plan.interval, plan.duration),
        ..Outcome::default()
    };
    let file = std::env::temp_dir().join(format!("cw-blocking-{}", std::process::id()));
    if plan.kind == Kind::Fs {
        if let Err(e) = std::fs::write(&file, vec![0u8; 4096]) {
            out.error = Some(format!("failed: writing {}: {e}", file.display()));
            return out;
        }
    }
    let shared = Arc::new(Shared {
        plan,
        file,
        start: OnceLock::new(),
        stop: AtomicBool::new(false),
        calls: AtomicU64::new(0),
        lateness_us: Mutex::new(Vec::new()),
    });
    let (done_tx, done_rx) = mpsc::channel();
    let driver = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("blocking-driver".into())
            .spawn(move || {
                let _ = done_tx.send(drive(peer, &shared));
            })
    };
    if let Err(e) = driver {
        out.error = Some(format!("failed: driver thread: {e}"));
        return finish(out, &shared);
    }
    // The ticker sets its start once it runs; setting up a runtime takes
    // far less than this.
    let setup_deadline = Instant::now() + Duration::from_secs(10);
    let start = loop {
        if let Some(s) = shared.start.get() {
            break *s;
        }
        if let Ok(res) = done_rx.try_recv() {
            out.error = Some(res.err().unwrap_or_else(|| "ticker never ran".into()));
            return finish(out, &shared);
        }
        if Instant::now() > setup_deadline {
            out.stalled = true;
            out.error = Some("stalled: the ticker did not start within 10 s".into());
            return finish(out, &shared);
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    std::thread::sleep((start + shared.plan.duration).saturating_duration_since(Instant::now()));
    shared.stop.store(true, Ordering::Relaxed);
    match done_rx.recv_timeout(shared.plan.interval + shared.plan.grace) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => out.error = Some(e),
        Err(_) => {
            out.stalled = true;
            out.error = Some(format!(
                "stalled: not finished {} ms after the blockers were told to stop",
                (shared.plan.interval + shared.plan.grace).as_millis()
            ));
        }
    }
    finish(out, &shared)
}

/// Fills in what was recorded and removes the `fs` file.
fn finish(mut out: Outcome, shared: &Shared) -> Outcome {
    out.lateness_us = shared.lateness();
    out.blocker_calls = shared.calls.load(Ordering::Relaxed);
    remove_file(&shared.file);
    out
}

fn remove_file(p: &Path) {
    if p.exists() {
        let _ = std::fs::remove_file(p);
    }
}

/// Due times in `duration`: the figure "ticks expected".
pub fn expected_ticks(interval: Duration, duration: Duration) -> u64 {
    let i = interval.as_nanos();
    if i == 0 {
        return 0;
    }
    u64::try_from(duration.as_nanos() / i).unwrap_or(u64::MAX)
}

/// Runs the whole scenario on `peer`; returns when the ticker and every
/// blocker have finished.
fn drive(peer: Peer, shared: &Arc<Shared>) -> Result<(), String> {
    match peer {
        Peer::Corewise => corewise_peer(shared),
        Peer::Tokio => tokio_peer(shared),
        Peer::Std => std_peer(shared),
        Peer::Go => Err("the go peer runs as its own program".into()),
    }
}

/// corewise with one core per CPU of the plan: the ticker on core 0, and
/// blocker `i` on core `i % cores`, so with one blocker per core the
/// ticker's core has a blocker too. The blockers call the std function
/// directly (not through `corewise::blocking`).
fn corewise_peer(shared: &Arc<Shared>) -> Result<(), String> {
    let cores = shared.plan.cpus.len();
    let rt = corewise::Runtime::builder()
        .cpus(shared.plan.cpus.iter().copied())
        .min_cores(cores)
        .max_cores(cores)
        .neighbour_awareness(None)
        .build()
        .map_err(|e| format!("failed: corewise runtime: {e}"))?;
    let shared = shared.clone();
    rt.block_on(move || -> Result<(), String> {
        let spawn = |core: usize, name: String, f: Box<dyn FnOnce() + Send>| {
            corewise::thread::Builder::new()
                .core(core)
                .name(name)
                .spawn(f)
                .map_err(|e| format!("failed: corewise spawn: {e}"))
        };
        let s = shared.clone();
        let ticker = spawn(
            0,
            "ticker".into(),
            Box::new(move || s.ticker(corewise::sleep)),
        )?;
        while shared.start.get().is_none() {
            corewise::yield_now();
        }
        let mut hs = Vec::new();
        for i in 0..shared.plan.blockers {
            let s = shared.clone();
            hs.push(spawn(
                i % cores,
                format!("blocker-{i}"),
                Box::new(move || s.blocker()),
            )?);
        }
        ticker.join().map_err(|e| format!("failed: ticker: {e}"))?;
        for h in hs {
            h.join().map_err(|e| format!("failed: blocker: {e}"))?;
        }
        Ok(())
    })
    .map_err(|e| format!("failed: corewise: {e}"))?
}

/// tokio's multi-thread runtime with one worker per CPU of the plan: the
/// ticker is a task sleeping with `tokio::time::sleep_until`, each blocker
/// a task calling the std function in a loop (no `spawn_blocking`).
fn tokio_peer(shared: &Arc<Shared>) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(shared.plan.cpus.len())
        .enable_time()
        .build()
        .map_err(|e| format!("failed: tokio runtime: {e}"))?;
    let shared = shared.clone();
    rt.block_on(async move {
        let s = shared.clone();
        let ticker = tokio::spawn(async move {
            let start = Instant::now();
            let _ = s.start.set(start);
            let mut due = start + s.plan.interval;
            loop {
                tokio::time::sleep_until(due.into()).await;
                match s.tick(start, due, Instant::now()) {
                    Some(next) => due = next,
                    None => break,
                }
            }
        });
        while shared.start.get().is_none() {
            tokio::task::yield_now().await;
        }
        let hs: Vec<_> = (0..shared.plan.blockers)
            .map(|_| {
                let s = shared.clone();
                tokio::spawn(async move { s.blocker() })
            })
            .collect();
        ticker.await.map_err(|e| format!("failed: ticker: {e}"))?;
        for h in hs {
            h.await.map_err(|e| format!("failed: blocker: {e}"))?;
        }
        Ok(())
    })
}

/// The reference: kernel threads, the ticker pinned to the plan's first
/// CPU and blocker `i` to CPU `i % cpus`, the same places as corewise's.
fn std_peer(shared: &Arc<Shared>) -> Result<(), String> {
    let cpus = shared.plan.cpus.clone();
    let pinned = |cpu: usize, name: String, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                // Unpinned is still a valid (if looser) reference: the
                // process is confined to the plan's CPUs anyway.
                let _ = crate::affinity::pin_current(cpu);
                f();
            })
            .map_err(|e| format!("failed: std thread: {e}"))
    };
    let s = shared.clone();
    let ticker = pinned(
        cpus[0],
        "ticker".into(),
        Box::new(move || s.ticker(std::thread::sleep)),
    )?;
    while shared.start.get().is_none() {
        std::thread::sleep(Duration::from_micros(100));
    }
    let mut hs = Vec::new();
    for i in 0..shared.plan.blockers {
        let s = shared.clone();
        hs.push(pinned(
            cpus[i % cpus.len()],
            format!("blocker-{i}"),
            Box::new(move || s.blocker()),
        )?);
    }
    ticker
        .join()
        .map_err(|_| "failed: ticker panicked".to_string())?;
    for h in hs {
        h.join()
            .map_err(|_| "failed: blocker panicked".to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(interval_ms: u64, duration_ms: u64) -> Shared {
        Shared {
            plan: Plan {
                kind: Kind::Sleep,
                blockers: 0,
                cpus: vec![0],
                interval: Duration::from_millis(interval_ms),
                duration: Duration::from_millis(duration_ms),
                grace: Duration::from_millis(100),
            },
            file: PathBuf::new(),
            start: OnceLock::new(),
            stop: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            lateness_us: Mutex::new(Vec::new()),
        }
    }

    #[test]
    fn a_late_wake_drops_the_due_times_it_missed() {
        let s = shared(10, 100);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // On time: the next due time is one period on.
        assert_eq!(s.tick(t0, t0 + ms(10), t0 + ms(10)), Some(t0 + ms(20)));
        // 35 ms late for the 20 ms tick: 30, 40 and 50 have passed and are
        // dropped, so the next one is 60.
        assert_eq!(s.tick(t0, t0 + ms(20), t0 + ms(55)), Some(t0 + ms(60)));
        // At or past the end: no next tick.
        assert_eq!(s.tick(t0, t0 + ms(100), t0 + ms(100)), None);
        assert_eq!(s.lateness(), vec![0.0, 35_000.0, 0.0]);
    }

    #[test]
    fn expected_ticks_counts_due_times() {
        let ms = Duration::from_millis;
        assert_eq!(expected_ticks(ms(10), ms(3000)), 300);
        assert_eq!(expected_ticks(ms(10), ms(5)), 0);
        assert_eq!(expected_ticks(ms(0), ms(5)), 0);
    }
}
