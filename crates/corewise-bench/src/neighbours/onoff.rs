//! The on/off scenario of `neighbours`: one CPU-bound neighbour (an
//! ignorant pool, `CPUs` workers, closed loop) that starts and stops every
//! `period`, beside a corewise pool under the same open-loop fib load as
//! the cells. It shows how the runtime's neighbour cap and the cores it
//! holds follow, and whether they stay put in between.
//!
//! Every 5 ms a sampler records the time, whether the neighbour runs (from
//! the moment it printed `ready` to the moment it was killed), the cap the
//! runtime's watcher publishes and the cores the runtime holds. The
//! *settled* value of each state (neighbour on / off) is the most frequent
//! one over the second halves of that state's phases; the *follow time* of
//! a transition is the time from the transition to the first sample with
//! the new state's settled value (none if it is not reached within the
//! phase). Changes within the second halves count as flapping.
//!
//! **On a shared host** (`--on-off-cgroup`): other load counts as
//! neighbours too, and on a busy machine it alone can hold the cap at one
//! core, so there is nothing to follow. With this flag the benchmark moves
//! itself into a `cpuacct` cgroup of its own (the neighbour, started later,
//! inherits it) and the runtime measures its share among the processes of
//! that cgroup ([`corewise::Builder::neighbour_cgroup`]): the
//! benchmark's neighbour is then the only neighbour. Needs root and the
//! cgroup v1 `cpuacct` hierarchy; the process moves back and the directory
//! is removed when the scenario ends.

use super::children::{Neighbours, PoolSpec};
use super::plot::{Canvas, Chart, Series, PALETTE};
use super::pools::{drive, CorewisePool, Share, Stamps, Submit, Work};
use super::PoolKind;
use crate::clock::Clock;
use crate::error::BenchError;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Settings of one on/off run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tick clock of the task stamps.
    pub clock: Clock,
    /// CPUs of the budget.
    pub cpus: usize,
    /// `fib` argument.
    pub n: u32,
    /// Offered rate, tasks/s.
    pub rate: f64,
    /// How corewise measures its neighbour share.
    pub share: Share,
    /// Time between the neighbour's starts and stops.
    pub period: Duration,
    /// On/off cycles (each two periods), after one period off.
    pub cycles: usize,
    /// Measure the share among the benchmark's own processes only.
    pub own_cgroup: bool,
}

/// A `cpuacct` cgroup holding this process, for `--on-off-cgroup`; dropping
/// moves the process back to the hierarchy's root and removes it.
struct OwnGroup {
    root: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl OwnGroup {
    fn create() -> Result<Self, BenchError> {
        let root = ["/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|r| r.join("cpuacct.usage").is_file())
            .ok_or_else(|| BenchError::Machine("no cgroup v1 cpuacct hierarchy".into()))?;
        let dir = root.join(format!("corewise-bench-onoff-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .map_err(|e| BenchError::io(format!("creating {}", dir.display()), e))?;
        let group = OwnGroup { root, dir };
        std::fs::write(
            group.dir.join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| BenchError::io(format!("moving into {}", group.dir.display()), e))?;
        Ok(group)
    }
}

impl Drop for OwnGroup {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.root.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One 5 ms sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t_s: f64,
    /// Whether the neighbour ran.
    pub neighbour: bool,
    /// The runtime's published cap.
    pub cap: usize,
    /// Cores the runtime held.
    pub cores: usize,
}

/// Follow times of one signal (cap or cores), ms; `None`: not reached
/// within the phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Follow {
    /// Settled value with the neighbour off and on.
    pub settled_off_on: (usize, usize),
    /// After each start of the neighbour.
    pub to_on_ms: Vec<Option<f64>>,
    /// After each stop.
    pub to_off_ms: Vec<Option<f64>>,
    /// Changes within the second halves of the phases, per second of them.
    pub flaps_per_s: f64,
}

impl Follow {
    /// The largest follow time, `None` if any transition was not followed.
    pub fn worst_ms(&self) -> Option<f64> {
        self.to_on_ms
            .iter()
            .chain(&self.to_off_ms)
            .try_fold(0.0f64, |m, x| x.map(|v| m.max(v)))
    }

    /// The median follow time of the transitions that were followed.
    pub fn median_ms(&self) -> Option<f64> {
        let mut v: Vec<f64> = self
            .to_on_ms
            .iter()
            .chain(&self.to_off_ms)
            .flatten()
            .copied()
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The samples.
    pub samples: Vec<Sample>,
    /// Transition times (s) and the state after them.
    pub transitions: Vec<(f64, bool)>,
    /// The published cap.
    pub cap: Follow,
    /// The cores held.
    pub cores: Follow,
    /// Cap changes the runtime's watcher published, per second.
    pub cap_changes_per_s: f64,
}

/// The most frequent value (the smallest on a tie), if any.
fn mode(v: impl Iterator<Item = usize>) -> Option<usize> {
    let mut counts = std::collections::BTreeMap::new();
    for x in v {
        *counts.entry(x).or_insert(0usize) += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(x, _)| x)
}

/// Follow times and flapping of `value` over `samples`, given the
/// transitions (time, new state) and the end time.
pub fn follow(
    samples: &[Sample],
    transitions: &[(f64, bool)],
    end_s: f64,
    value: impl Fn(&Sample) -> usize,
) -> Follow {
    // Phases: [start, end) with their state.
    let mut phases: Vec<(f64, f64, bool)> = Vec::new();
    let mut start = (0.0, false);
    for &(t, on) in transitions {
        phases.push((start.0, t, start.1));
        start = (t, on);
    }
    phases.push((start.0, end_s, start.1));
    let second_half = |on: bool| {
        phases
            .iter()
            .filter(move |p| p.2 == on)
            .flat_map(|&(a, b, _)| {
                samples
                    .iter()
                    .filter(move |s| s.t_s >= (a + b) / 2.0 && s.t_s < b)
            })
    };
    let settled = |on: bool| mode(second_half(on).map(&value));
    let (off, on) = (settled(false).unwrap_or(0), settled(true).unwrap_or(0));
    let mut f = Follow {
        settled_off_on: (off, on),
        ..Follow::default()
    };
    let (mut flaps, mut half_secs) = (0usize, 0.0);
    for &(a, b, state) in &phases {
        let mid = (a + b) / 2.0;
        let tail: Vec<usize> = samples
            .iter()
            .filter(|s| s.t_s >= mid && s.t_s < b)
            .map(&value)
            .collect();
        flaps += tail.windows(2).filter(|w| w[0] != w[1]).count();
        half_secs += b - mid;
        if a == 0.0 {
            continue;
        }
        let want = if state { on } else { off };
        let reached = samples
            .iter()
            .find(|s| s.t_s >= a && s.t_s < b && value(s) == want)
            .map(|s| ((s.t_s - a) * 1000.0).max(0.0));
        if state {
            f.to_on_ms.push(reached);
        } else {
            f.to_off_ms.push(reached);
        }
    }
    f.flaps_per_s = if half_secs > 0.0 {
        flaps as f64 / half_secs
    } else {
        0.0
    };
    f
}

/// Runs the scenario.
pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let total = s.period.mul_f64((2 * s.cycles + 1) as f64);
    let count = (s.rate * total.as_secs_f64()).ceil() as usize;
    let stamps = Stamps::new(count);
    let work = Work {
        clock: s.clock,
        stamps: Arc::clone(&stamps),
        n: s.n,
    };
    let group = if s.own_cgroup {
        Some(OwnGroup::create()?)
    } else {
        None
    };
    let pool = CorewisePool::start_in(
        &work.task(),
        Some(s.share),
        group.as_ref().map(|g| g.dir.as_path()),
    )?;
    let probe = pool.probe();
    let handle = pool
        .budget()
        .ok_or_else(|| BenchError::Machine("corewise pool without a runtime".into()))?;
    let spec = PoolSpec {
        kind: PoolKind::Ignorant,
        cpus: s.cpus,
        processes: 2,
        n: s.n,
        share: s.share,
        lifetime_s: total.as_secs_f64() + 30.0,
    };
    let interval = 1e9 / s.rate * s.clock.ticks_per_ns();
    let t0 = s.clock.now() + (2_000_000.0 * s.clock.ticks_per_ns()) as u64;
    let start = Instant::now();
    let on = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let transitions = Mutex::new(Vec::new());
    let changes0 = handle.active_changes();
    let sink: Box<dyn Submit> = Box::new(pool);
    let (driven, samples, toggled) = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| {
            let mut out = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(cores) = probe() {
                    out.push(Sample {
                        t_s: start.elapsed().as_secs_f64(),
                        neighbour: on.load(Ordering::Relaxed),
                        cap: handle.active_cores(),
                        cores,
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            out
        });
        let toggler = sc.spawn(|| -> Result<(), BenchError> {
            let mut next = start + s.period;
            let mut guard: Option<Neighbours> = None;
            for _ in 0..2 * s.cycles {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                if let Some(mut g) = guard.take() {
                    g.stop();
                    on.store(false, Ordering::Relaxed);
                    lock(&transitions).push((start.elapsed().as_secs_f64(), false));
                } else {
                    guard = Some(Neighbours::start_pools(1, &spec, Duration::from_secs(10))?);
                    on.store(true, Ordering::Relaxed);
                    lock(&transitions).push((start.elapsed().as_secs_f64(), true));
                }
                next += s.period;
            }
            Ok(())
        });
        let driven = drive(
            sink,
            &s.clock,
            &stamps,
            t0,
            interval,
            count,
            Duration::from_secs(3),
        );
        let toggled = toggler
            .join()
            .unwrap_or_else(|_| Err(BenchError::Thread("the on/off toggler panicked".into())));
        stop.store(true, Ordering::Relaxed);
        (driven, sampler.join().unwrap_or_default(), toggled)
    });
    toggled?;
    driven?;
    let end_s = start.elapsed().as_secs_f64();
    let transitions = std::mem::take(&mut *lock(&transitions));
    Ok(Report {
        cap: follow(&samples, &transitions, end_s, |x| x.cap),
        cores: follow(&samples, &transitions, end_s, |x| x.cores),
        cap_changes_per_s: (handle.active_changes() - changes0) as f64 / end_s.max(1e-9),
        samples,
        transitions,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A line of text per signal: settled values, follow times, flapping.
pub fn summary(r: &Report) -> String {
    let ms = |v: &[Option<f64>]| {
        v.iter()
            .map(|x| x.map_or("-".to_string(), |m| format!("{m:.0}")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let line = |name: &str, f: &Follow| {
        let same = if f.settled_off_on.0 == f.settled_off_on.1 {
            " (the same with and without the neighbour: nothing to follow; for the \
             cap, other load on the host can be the reason, see --on-off-cgroup)"
        } else {
            ""
        };
        format!(
            "{name}: settled {} off / {} on{same}; follow ms after starts [{}], after stops [{}]; \
             median {}, worst {}; changes in the settled halves {:.2}/s",
            f.settled_off_on.0,
            f.settled_off_on.1,
            ms(&f.to_on_ms),
            ms(&f.to_off_ms),
            f.median_ms().map_or("-".into(), |m| format!("{m:.0} ms")),
            f.worst_ms()
                .map_or("not followed".into(), |m| format!("{m:.0} ms")),
            f.flaps_per_s
        )
    };
    format!(
        "{}\n{}\ncap changes published: {:.2}/s over the whole run",
        line("cap  ", &r.cap),
        line("cores", &r.cores),
        r.cap_changes_per_s
    )
}

/// Cap, cores and the neighbour's on/off against time.
pub fn draw(r: &Report, title: &str) -> Canvas {
    let mut cv = Canvas::new(1200, 420);
    let pts = |f: &dyn Fn(&Sample) -> f64| r.samples.iter().map(|s| (s.t_s, f(s))).collect();
    let top = r
        .samples
        .iter()
        .map(|s| s.cap.max(s.cores))
        .max()
        .unwrap_or(1) as f64;
    let chart = Chart {
        title: "corewise beside a neighbour that starts and stops".into(),
        x_label: "seconds".into(),
        y_label: "cores".into(),
        log_y: false,
        y_range: Some((0.0, top + 0.5)),
        series: vec![
            Series {
                name: "neighbour on (1) / off (0)".into(),
                color: PALETTE[0],
                points: pts(&|s| if s.neighbour { 1.0 } else { 0.0 }),
                markers: false,
            },
            Series {
                name: "published cap".into(),
                color: PALETTE[1],
                points: pts(&|s| s.cap as f64 + 0.05),
                markers: false,
            },
            Series {
                name: "cores held".into(),
                color: PALETTE[2],
                points: pts(&|s| s.cores as f64 - 0.05),
                markers: false,
            },
        ],
    };
    chart.draw(&mut cv, 0, 24, 1200, 396);
    cv.text(10, 6, title, [0, 0, 0], 1);
    cv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t_s: f64, neighbour: bool, cap: usize) -> Sample {
        Sample {
            t_s,
            neighbour,
            cap,
            cores: cap,
        }
    }

    #[test]
    fn follow_times_and_flaps() {
        // Off until 1 s (cap 2), on until 2 s (cap 1 from 1.05 s), off
        // until 3 s (cap 2 from 2.2 s).
        let mut v = Vec::new();
        for i in 0..300 {
            let t = f64::from(i) / 100.0;
            let (on, cap) = match t {
                t if t < 1.0 => (false, 2),
                t if t < 1.05 => (true, 2),
                t if t < 2.0 => (true, 1),
                t if t < 2.2 => (false, 1),
                _ => (false, 2),
            };
            v.push(s(t, on, cap));
        }
        let f = follow(&v, &[(1.0, true), (2.0, false)], 3.0, |x| x.cap);
        assert_eq!(f.settled_off_on, (2, 1));
        assert_eq!(f.to_on_ms.len(), 1);
        assert!((f.to_on_ms[0].unwrap() - 50.0).abs() < 1e-6);
        assert!((f.to_off_ms[0].unwrap() - 200.0).abs() < 1e-6);
        assert_eq!(f.worst_ms().map(f64::round), Some(200.0));
        assert_eq!(f.flaps_per_s, 0.0);
        // A cap that never comes back is "not followed".
        let stuck: Vec<Sample> = v.iter().map(|x| s(x.t_s, x.neighbour, 1)).collect();
        let f = follow(&stuck, &[(1.0, true), (2.0, false)], 3.0, |x| x.cap);
        assert_eq!(f.settled_off_on, (1, 1));
        assert!(f.worst_ms().is_some());
        assert_eq!(mode([1, 2, 2, 1].into_iter()), Some(1));
        assert_eq!(mode(std::iter::empty()), None);
    }
}
