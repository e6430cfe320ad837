//! `corewise-bench cores`: how the cores a runtime holds follow its load
//! (Arachne's Figure 4 "Colocation" experiment, without memcached).
//!
//! **Load.** An open-loop generator (one OS thread, outside the runtime)
//! creates one corewise user thread per task; a task is a naive `fib(k)`
//! with `k` calibrated so one task takes about `--task-us` (25 µs) on an
//! idle CPU. The offered load steps through [`ramp_levels`]: 1 %, 10 %,
//! 20 % … 100 % of the machine's CPUs, then back down to 10 % and 1 %, each
//! level held for `--step-secs` (1 s, about 21 s in all; `--quick` 0.25 s).
//! The rate at level `f` is `f · CPUs / t(task)`. Arrival times are fixed
//! in advance ([`arrivals`]); latency is measured from the scheduled time,
//! so a generator that falls behind shows up as latency. At the top levels
//! the generator itself needs CPU on the same machine, so "100 %" is an
//! overload by the generator's own share (expected, and visible).
//!
//! **Measurements.** A sampler thread reads `rt.active_cores()` every 10 ms.
//! Task latency (scheduled submission → end) is bucketed by submission time
//! into 100 ms windows (p50, p99). The table summarises each level.
//! `--neighbours N` runs N CPU-bound neighbour processes alongside (the
//! colocation half of Arachne's experiment); they are killed by PID.
//!
//! **Arbiters.** `--arbiter local,daemon`: `Local` (in-process grants from
//! the CPU budget) and `Daemon`, a client of a corewise-arbiter already
//! running on `--arbiter-socket PATH` (`Builder::arbiter_socket`). The
//! benchmark does not start a daemon itself (that moves every task of the
//! machine into cpusets); without a socket, or when the runtime falls back
//! to the in-process arbiter because the daemon is unreachable, the daemon
//! run is listed as skipped with the reason.

use crate::clock::Clock;
use crate::error::BenchError;
use crate::neighbours::children::Neighbours;
use crate::neighbours::fib;
use crate::neighbours::plot::{Canvas, Chart, Series, PALETTE};
use crate::neighbours::pools::{drop_with_timeout, Stamps};
use crate::stats::percentile_sorted;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Command-line arguments of `cores`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Write the time series as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw cores and latency over time into this PNG file.
    #[arg(long, default_value = "cores.png")]
    pub png: PathBuf,
    /// 0.25 s per level (about 6 s per arbiter) instead of 1 s.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per load level (overrides --quick).
    #[arg(long, value_parser = step_secs)]
    pub step_secs: Option<f64>,
    /// Target duration of one task, µs (10..=1000).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(10..=1000))]
    pub task_us: u64,
    /// Peak load as a fraction of the CPUs (0 < peak <= 2).
    #[arg(long, default_value_t = 1.0, value_parser = peak)]
    pub peak: f64,
    /// Arbiters to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "local")]
    pub arbiter: Vec<ArbiterKind>,
    /// Socket of a running corewise-arbiter (for `--arbiter daemon`).
    #[arg(long)]
    pub arbiter_socket: Option<PathBuf>,
    /// CPU-bound neighbour processes to run alongside (0..=16).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub neighbours: u32,
    /// Switch the runtime's neighbour cap off (on by default, as in the
    /// runtime): on a shared machine the cap counts other users' processes
    /// as neighbours and holds the runtime down to its fair share.
    #[arg(long)]
    pub no_neighbour_cap: bool,
}

fn step_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if v.is_finite() && (0.01..=60.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?}: must be between 0.01 and 60"))
    }
}

fn peak(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if v.is_finite() && v > 0.0 && v <= 2.0 {
        Ok(v)
    } else {
        Err(format!("{s:?}: must be in (0, 2]"))
    }
}

/// Where the runtime's cores come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArbiterKind {
    /// In-process arbiter (the default of `corewise::Runtime`).
    Local,
    /// The corewise-arbiter daemon.
    Daemon,
}

impl ArbiterKind {
    /// Name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ArbiterKind::Local => "local",
            ArbiterKind::Daemon => "daemon",
        }
    }
}

/// Builds the runtime for `arbiter`; `Ok(Err(reason))` when this build
/// cannot use that arbiter.
pub fn build_runtime(
    arbiter: ArbiterKind,
    socket: Option<&std::path::Path>,
    neighbour_cap: bool,
) -> Result<Result<corewise::Runtime, String>, BenchError> {
    let b = corewise::Runtime::builder()
        .neighbour_awareness(neighbour_cap.then(corewise::budget::NeighbourConfig::default));
    let err = |e: corewise::BuildError| BenchError::Runtime {
        runtime: "corewise",
        message: e.to_string(),
    };
    match arbiter {
        ArbiterKind::Local => b
            .arbiter(corewise::ArbiterChoice::Local)
            .build()
            .map(Ok)
            .map_err(err),
        ArbiterKind::Daemon => {
            let Some(socket) = socket else {
                return Ok(Err(
                    "skipped: --arbiter-socket PATH (a running corewise-arbiter) not given".into(),
                ));
            };
            let rt = b.arbiter_socket(socket).build().map_err(err)?;
            if rt.arbiter_kind() == corewise::ArbiterKind::Daemon {
                Ok(Ok(rt))
            } else {
                let hung = !drop_with_timeout(rt, Duration::from_secs(10));
                Ok(Err(format!(
                    "skipped: the daemon at {} could not be reached; the runtime fell back to \
                     the in-process arbiter{}",
                    socket.display(),
                    if hung { " (and its shutdown hung)" } else { "" }
                )))
            }
        }
    }
}

/// The load levels, as fractions of `peak`: 1 %, 10 % … 100 %, 90 % …
/// 10 %, 1 %.
pub fn ramp_levels(peak: f64) -> Vec<f64> {
    let mut v = vec![0.01];
    v.extend((1..=10).map(|k| f64::from(k) / 10.0));
    v.extend((1..=9).rev().map(|k| f64::from(k) / 10.0));
    v.push(0.01);
    v.into_iter().map(|f| f * peak).collect()
}

/// Scheduled arrival times (seconds from the start) of an open-loop
/// generator at rate `levels[i] · per_level_rate` during level `i`, each
/// level lasting `step` seconds. Arrivals are evenly spaced within a level.
pub fn arrivals(levels: &[f64], step: f64, full_rate: f64) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, f) in levels.iter().enumerate() {
        let rate = f * full_rate;
        if !(rate.is_finite() && rate > 0.0 && step > 0.0) {
            continue;
        }
        let start = i as f64 * step;
        let count = (rate * step).round() as usize;
        out.extend((0..count).map(|k| start + k as f64 / rate));
    }
    out
}

/// Level index of time `t` (seconds), clamped to the last level.
pub fn level_at(t: f64, step: f64, levels: usize) -> usize {
    if step <= 0.0 || levels == 0 || t <= 0.0 {
        return 0;
    }
    ((t / step).floor() as usize).min(levels - 1)
}

/// One active-cores sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CoreSample {
    /// Seconds since the start of the ramp.
    pub t_s: f64,
    /// `rt.active_cores()`.
    pub active_cores: usize,
}

/// Latency of the tasks submitted in one 100 ms window.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatWindow {
    /// Window start, seconds since the start of the ramp.
    pub t_s: f64,
    /// Offered load at that time, fraction of the CPUs.
    pub offered: f64,
    /// Tasks completed of those submitted in the window.
    pub count: usize,
    /// Median task latency, µs.
    pub p50_us: f64,
    /// 99th-percentile task latency, µs.
    pub p99_us: f64,
}

/// Summary of one load level.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Level {
    /// Offered load, fraction of the CPUs.
    pub offered: f64,
    /// Offered rate, tasks/s.
    pub rate_per_s: f64,
    /// Mean of the active-cores samples in the level.
    pub mean_cores: f64,
    /// Largest sample in the level.
    pub max_cores: usize,
    /// Completed tasks submitted in the level.
    pub completed: usize,
    /// Median task latency, µs.
    pub p50_us: f64,
    /// 99th-percentile task latency, µs.
    pub p99_us: f64,
}

/// One arbiter's run, as written by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// Arbiter.
    pub arbiter: ArbiterKind,
    /// Per level.
    pub levels: Vec<Level>,
    /// Active cores every 10 ms.
    pub cores: Vec<CoreSample>,
    /// Latency per 100 ms window.
    pub latency: Vec<LatWindow>,
    /// Whether every task finished before the drain limit.
    pub drained: bool,
    /// Whether dropping the runtime did not finish within 10 s.
    pub shutdown_hung: bool,
    /// Tasks submitted that never ran to the end (abandoned or stuck).
    pub unfinished: usize,
}

/// The JSON document.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// CPUs of the budget.
    pub cpus: usize,
    /// fib argument of one task.
    pub fib_n: u32,
    /// Calibrated task time, µs.
    pub task_us: f64,
    /// Seconds per level.
    pub step_s: f64,
    /// Neighbour processes alongside.
    pub neighbours: u32,
    /// Whether the runtime's neighbour cap was on.
    pub neighbour_cap: bool,
    /// One per arbiter run.
    pub runs: Vec<Run>,
    /// Arbiters skipped, with the reason.
    pub skipped: Vec<String>,
}

struct Setup {
    clock: Clock,
    cpus: usize,
    n: u32,
    task: Duration,
    levels: Vec<f64>,
    step: f64,
}

fn pcts(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let us = |x: Option<f64>| (x.unwrap_or(0.0) / 100.0).round() / 10.0;
    (
        us(percentile_sorted(v, 50.0)),
        us(percentile_sorted(v, 99.0)),
    )
}

fn run_one(s: &Setup, arbiter: ArbiterKind, rt: corewise::Runtime) -> Result<Run, BenchError> {
    let clock = s.clock;
    let full_rate = s.cpus as f64 / s.task.as_secs_f64().max(1e-9);
    let times = arrivals(&s.levels, s.step, full_rate);
    let count = times.len();
    let stamps = Stamps::new(count);
    let tpn = clock.ticks_per_ns();
    let t0 = clock.now() + (5_000_000.0 * tpn) as u64;
    let sched: Vec<u64> = times.iter().map(|t| t0 + (t * 1e9 * tpn) as u64).collect();
    let total_ns = s.levels.len() as f64 * s.step * 1e9;
    // Ten seconds after the last scheduled arrival, whatever is left is
    // abandoned (tasks not yet started are skipped).
    let deadline = t0 + ((total_ns + 10e9) * tpn) as u64;
    let stop = AtomicBool::new(false);
    let mut cores = Vec::new();
    let mut drained = true;
    let mut spawn_err = None;
    let mut submitted_total = 0;
    std::thread::scope(|sc| {
        let sampler = sc.spawn(|| {
            let mut out = Vec::new();
            let start = Instant::now();
            let until = Duration::from_secs_f64(0.005);
            std::thread::sleep(until);
            while !stop.load(Ordering::Relaxed) {
                out.push(CoreSample {
                    t_s: start.elapsed().as_secs_f64() - 0.005,
                    active_cores: rt.active_cores(),
                });
                std::thread::sleep(Duration::from_millis(10));
            }
            out
        });
        let mut i = 0;
        'gen: while i < count {
            let now = clock.now();
            while i < count && sched[i] <= now {
                let st = Arc::clone(&stamps);
                let n = s.n;
                // No `wait_at_limit`: the thread limit is retried here so
                // the generator can give up at the deadline.
                let r = corewise::thread::Builder::new()
                    .spawn_detached_in(&rt, move || st.run(&clock, i, n));
                match r {
                    Ok(_) => i += 1,
                    Err(corewise::SpawnError::ThreadLimit { .. }) => {
                        if clock.now() >= deadline {
                            stamps.abandon.store(true, Ordering::Relaxed);
                            drained = false;
                            break 'gen;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(e) => {
                        spawn_err = Some(e);
                        break 'gen;
                    }
                }
            }
            if i < count {
                let now = clock.now();
                if sched[i] > now {
                    std::thread::sleep(Duration::from_nanos(clock.delta_ns(now, sched[i]) as u64));
                }
            }
        }
        submitted_total = i;
        let submitted = i;
        eprintln!(
            "  {}: {submitted} of {count} tasks submitted; draining",
            arbiter.name()
        );
        while drained && stamps.done.load(Ordering::Acquire) < submitted {
            if clock.now() > deadline {
                stamps.abandon.store(true, Ordering::Relaxed);
                drained = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // A little idle tail shows the cores being given back.
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        cores = sampler.join().unwrap_or_default();
    });
    // Dropping the runtime waits for its user threads and stops its kernel
    // threads. It is done on a helper thread with a time limit: if a user
    // thread never finishes (a runtime bug), the benchmark reports it
    // instead of hanging; the process's exit then ends those threads.
    let shutdown_hung = !drop_with_timeout(rt, Duration::from_secs(10));
    if let Some(e) = spawn_err {
        return Err(BenchError::Runtime {
            runtime: "corewise",
            message: format!("spawn: {e}"),
        });
    }
    // Latency per level and per 100 ms window.
    let nl = s.levels.len();
    let mut per_level: Vec<Vec<f64>> = vec![Vec::new(); nl];
    let total = nl as f64 * s.step;
    let nw = (total / 0.1).ceil() as usize;
    let mut per_win: Vec<Vec<f64>> = vec![Vec::new(); nw.max(1)];
    for (k, t) in times.iter().enumerate() {
        let e = stamps.end[k].load(Ordering::Relaxed);
        if e == 0 {
            continue;
        }
        let lat = clock.delta_ns(sched[k], e);
        per_level[level_at(*t, s.step, nl)].push(lat);
        let w = ((t / 0.1) as usize).min(per_win.len() - 1);
        per_win[w].push(lat);
    }
    let latency = per_win
        .iter_mut()
        .enumerate()
        .map(|(w, v)| {
            let (p50, p99) = pcts(v);
            let t = w as f64 * 0.1;
            LatWindow {
                t_s: (t * 10.0).round() / 10.0,
                offered: s.levels[level_at(t, s.step, nl)],
                count: v.len(),
                p50_us: p50,
                p99_us: p99,
            }
        })
        .collect();
    let levels = per_level
        .iter_mut()
        .enumerate()
        .map(|(l, v)| {
            let (p50, p99) = pcts(v);
            let samples: Vec<usize> = cores
                .iter()
                .filter(|c| c.t_s >= 0.0 && level_at(c.t_s, s.step, nl) == l && c.t_s < total)
                .map(|c| c.active_cores)
                .collect();
            let mean = if samples.is_empty() {
                0.0
            } else {
                samples.iter().sum::<usize>() as f64 / samples.len() as f64
            };
            Level {
                offered: s.levels[l],
                rate_per_s: (s.levels[l] * full_rate).round(),
                mean_cores: (mean * 100.0).round() / 100.0,
                max_cores: samples.iter().copied().max().unwrap_or(0),
                completed: v.len(),
                p50_us: p50,
                p99_us: p99,
            }
        })
        .collect();
    Ok(Run {
        arbiter,
        levels,
        cores,
        latency,
        drained,
        shutdown_hung,
        unfinished: submitted_total.saturating_sub(stamps.done.load(Ordering::Acquire)),
    })
}

/// The markdown table of every run.
pub fn markdown(rep: &Report) -> String {
    let mut s = String::new();
    for r in &rep.runs {
        let _ = writeln!(
            s,
            "arbiter {} ({}):\n\n| level | offered | rate /s | mean cores | max cores \
             | done | p50 (µs) | p99 (µs) |\n|---|---|---|---|---|---|---|---|",
            r.arbiter.name(),
            match (r.drained, r.shutdown_hung) {
                (true, false) => "all tasks done".to_string(),
                (d, h) => format!(
                    "{}{} tasks unfinished{}",
                    if d { "" } else { "NOT drained, " },
                    r.unfinished,
                    if h {
                        "; runtime shutdown HUNG (a user thread never finished)"
                    } else {
                        ""
                    }
                ),
            }
        );
        for (k, l) in r.levels.iter().enumerate() {
            let _ = writeln!(
                s,
                "| {k} | {:.0} % | {:.0} | {:.2} | {} | {} | {:.1} | {:.1} |",
                l.offered * 100.0,
                l.rate_per_s,
                l.mean_cores,
                l.max_cores,
                l.completed,
                l.p50_us,
                l.p99_us
            );
        }
        s.push('\n');
    }
    for k in &rep.skipped {
        let _ = writeln!(s, "- {k}");
    }
    s
}

/// Cores over time (with the offered load in CPUs) above latency over time.
pub fn draw(rep: &Report) -> Canvas {
    let mut cv = Canvas::new(1100, 760);
    let step = rep.step_s;
    let mut cores_series = Vec::new();
    let mut lat_series = Vec::new();
    if let Some(r) = rep.runs.first() {
        let offered: Vec<(f64, f64)> = r
            .levels
            .iter()
            .enumerate()
            .flat_map(|(k, l)| {
                let v = l.offered * rep.cpus as f64;
                [(k as f64 * step, v), ((k + 1) as f64 * step, v)]
            })
            .collect();
        cores_series.push(Series {
            name: "offered load (CPUs)".into(),
            color: PALETTE[5],
            points: offered,
            markers: false,
        });
    }
    for (k, r) in rep.runs.iter().enumerate() {
        cores_series.push(Series {
            name: format!("cores held ({})", r.arbiter.name()),
            color: PALETTE[k % 3],
            points: r
                .cores
                .iter()
                .map(|c| (c.t_s, c.active_cores as f64))
                .collect(),
            markers: false,
        });
        let pick = |f: fn(&LatWindow) -> f64| -> Vec<(f64, f64)> {
            r.latency
                .iter()
                .filter(|w| w.count > 0)
                .map(|w| (w.t_s + 0.05, f(w)))
                .collect()
        };
        lat_series.push(Series {
            name: format!("p99 ({})", r.arbiter.name()),
            color: PALETTE[k % 3],
            points: pick(|w| w.p99_us),
            markers: false,
        });
        lat_series.push(Series {
            name: format!("p50 ({})", r.arbiter.name()),
            color: PALETTE[3 + k % 2],
            points: pick(|w| w.p50_us),
            markers: false,
        });
    }
    let top = Chart {
        title: "cores in use".into(),
        x_label: "time (s)".into(),
        y_label: "cores".into(),
        log_y: false,
        y_range: Some((0.0, rep.cpus as f64 + 0.5)),
        series: cores_series,
    };
    let bottom = Chart {
        title: "task latency per 100 ms".into(),
        x_label: "time (s)".into(),
        y_label: "us (log)".into(),
        log_y: true,
        y_range: None,
        series: lat_series,
    };
    top.draw(&mut cv, 0, 20, 1100, 360);
    bottom.draw(&mut cv, 0, 390, 1100, 370);
    let title = format!(
        "corewise-bench cores: fib({}) {:.1} us tasks, {} CPUs, {} neighbours, neighbour cap {}",
        rep.fib_n,
        rep.task_us,
        rep.cpus,
        rep.neighbours,
        if rep.neighbour_cap { "on" } else { "off" }
    );
    cv.text(10, 6, &title, [0, 0, 0], 1);
    cv
}

/// Runs the benchmark.
pub fn run(args: &Args) -> Result<(), BenchError> {
    let cpus = crate::affinity::allowed_cpus()?.len();
    let cpus = corewise::cpu_budget()
        .map(|b| b.cores())
        .unwrap_or(cpus)
        .clamp(1, cpus.max(1));
    let clock = Clock::calibrate(true, Duration::from_millis(50));
    let cal = fib::n_for(Duration::from_micros(args.task_us), 5, 32);
    let step = args
        .step_secs
        .unwrap_or(if args.quick { 0.25 } else { 1.0 });
    let setup = Setup {
        clock,
        cpus,
        n: cal.n,
        task: cal.task,
        levels: ramp_levels(args.peak),
        step,
    };
    println!(
        "cores: {} CPUs, task fib({}) = {:.1} µs, peak {:.0} % ({:.0} tasks/s), {} levels × {} s, \
         {} neighbours, neighbour cap {}, clock {}; loadavg before: {}",
        cpus,
        cal.n,
        cal.task.as_secs_f64() * 1e6,
        args.peak * 100.0,
        args.peak * cpus as f64 / cal.task.as_secs_f64().max(1e-9),
        setup.levels.len(),
        step,
        args.neighbours,
        if args.no_neighbour_cap { "off" } else { "on" },
        clock.source().name(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut rep = Report {
        cpus,
        fib_n: cal.n,
        task_us: (cal.task.as_secs_f64() * 1e7).round() / 10.0,
        step_s: step,
        neighbours: args.neighbours,
        neighbour_cap: !args.no_neighbour_cap,
        runs: Vec::new(),
        skipped: Vec::new(),
    };
    for &a in &args.arbiter {
        // Killed by PID when this iteration ends, on error too.
        let guard = Neighbours::start(args.neighbours as usize)?;
        if !guard.is_empty() {
            eprintln!("  neighbours: pids {:?}", guard.pids());
            std::thread::sleep(Duration::from_millis(300));
        }
        match build_runtime(a, args.arbiter_socket.as_deref(), !args.no_neighbour_cap)? {
            Ok(rt) => {
                let r = run_one(&setup, a, rt)?;
                let hung = r.shutdown_hung;
                rep.runs.push(r);
                if hung {
                    // Its kernel threads may still run; later runs would
                    // be disturbed, so stop here.
                    rep.skipped
                        .push("later arbiters: skipped after a hung runtime shutdown".into());
                    break;
                }
            }
            Err(why) => rep.skipped.push(format!("arbiter {}: {why}", a.name())),
        }
        drop(guard);
    }
    println!();
    print!("{}", markdown(&rep));
    println!(
        "loadavg after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    draw(&rep).save(&args.png)?;
    println!("plot: {}", args.png.display());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&rep)?;
        std::fs::write(path, text + "\n")
            .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_goes_up_then_down() {
        let l = ramp_levels(1.0);
        assert_eq!(l.len(), 21);
        assert_eq!(l[0], 0.01);
        assert_eq!(l[10], 1.0);
        assert_eq!(l[20], 0.01);
        assert!(l[..=10].windows(2).all(|w| w[0] < w[1]));
        assert!(l[10..].windows(2).all(|w| w[0] > w[1]));
        assert_eq!(ramp_levels(0.5)[10], 0.5);
    }

    #[test]
    fn arrivals_follow_the_rate() {
        // 2 levels of 1 s at 10 % and 100 % of 100 tasks/s.
        let a = arrivals(&[0.1, 1.0], 1.0, 100.0);
        assert_eq!(a.len(), 10 + 100);
        assert_eq!(a[0], 0.0);
        assert!((a[1] - 0.1).abs() < 1e-12);
        assert_eq!(a[10], 1.0);
        assert!((a[11] - 1.01).abs() < 1e-12);
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        assert!(arrivals(&[0.0], 1.0, 100.0).is_empty());
    }

    #[test]
    fn levels_by_time() {
        assert_eq!(level_at(0.0, 0.5, 21), 0);
        assert_eq!(level_at(0.49, 0.5, 21), 0);
        assert_eq!(level_at(0.5, 0.5, 21), 1);
        assert_eq!(level_at(100.0, 0.5, 21), 20);
        assert_eq!(level_at(1.0, 0.0, 21), 0);
    }

    #[test]
    fn bad_cli_numbers_are_errors() {
        assert!(step_secs("0").is_err());
        assert!(step_secs("abc").is_err());
        assert!(peak("3").is_err());
        assert!(peak("inf").is_err());
        assert_eq!(peak("1"), Ok(1.0));
    }
}
