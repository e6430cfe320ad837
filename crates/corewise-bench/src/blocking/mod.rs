//! `corewise-bench blocking`: how late a ticker thread wakes while one
//! thread per core makes blocking std calls, corewise against tokio, Go and
//! kernel threads.
//!
//! A ticker should wake every `--interval-ms` (the runtime's own sleep:
//! `corewise::sleep`, `tokio::time::sleep_until`, Go `time.Sleep`,
//! `std::thread::sleep`) and records its lateness, actual wake time minus
//! due time, for `--duration-ms`. Due times already passed when it wakes
//! are dropped (as a Go `time.Ticker` drops ticks), so a starved ticker
//! shows as few observed ticks and a long maximum. Meanwhile `--blockers`
//! threads (default one per CPU of the run) call, in a loop, with no yield:
//!
//! - `sleep`: `std::thread::sleep(1 ms)`; Go: `syscall.Nanosleep(1 ms)`,
//!   which goes through `syscall.Syscall`, so the M really blocks in the
//!   kernel (`time.Sleep` would only park the goroutine);
//! - `fs`: `std::fs::read` of a 4 KiB file; Go: `os.ReadFile` (regular
//!   files bypass Go's netpoller: a blocking system call on the M);
//! - `compute`: a busy loop with no system call.
//!
//! Every (peer, kind) pair runs in a child process confined to the run's
//! CPUs (`--cpus`, default the first two the process may use): corewise
//! with one core per CPU, the ticker on core 0 and blocker `i` on core
//! `i % cores`; tokio's multi-thread runtime with one worker per CPU, the
//! blockers plain tasks (no `spawn_blocking`); Go (bench/go-blocking,
//! built with `go build` when `go` exists) with GOMAXPROCS = CPUs; std
//! threads pinned like corewise's, the operating system's floor. A child
//! whose peer has not finished `--grace-ms` after its blockers were told to
//! stop reports the ticks it recorded as `stalled`; one that does not
//! report at all is killed by its PID.

mod child;

use crate::child_proc::output_within;
use crate::error::BenchError;
use crate::stats::{median_sorted, percentile_sorted};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Command line of `corewise-bench blocking`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A shorter run (1 s per peer and kind instead of 3 s).
    #[arg(long)]
    pub quick: bool,
    /// Blocking kinds to run (default all: sleep,fs,compute).
    #[arg(long, value_delimiter = ',')]
    pub kind: Option<Vec<String>>,
    /// Peers to run (default all: corewise,tokio,go,std).
    #[arg(long, value_delimiter = ',')]
    pub peers: Option<Vec<String>>,
    /// CPUs of the run, one runtime core (tokio worker, GOMAXPROCS) each
    /// (default: the first two CPUs this process may use).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Option<Vec<usize>>,
    /// Blocking threads (default: one per CPU of the run).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub blockers: Option<u64>,
    /// The ticker's period, ms.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub interval_ms: u64,
    /// How long the blockers run per peer and kind, ms (default 3000;
    /// quick 1000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub duration_ms: Option<u64>,
    /// How long a peer may take to finish after its blockers were told to
    /// stop before it is reported as stalled, ms.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub grace_ms: u64,
    /// Internal: run one peer and kind (`PEER:KIND`) and print its outcome.
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

/// Who runs the ticker and the blockers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// corewise user threads.
    Corewise,
    /// tokio tasks on the multi-thread runtime.
    Tokio,
    /// Go goroutines.
    Go,
    /// Kernel threads.
    Std,
}

impl Peer {
    const ALL: [Peer; 4] = [Peer::Corewise, Peer::Tokio, Peer::Go, Peer::Std];

    /// The name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Corewise => "corewise",
            Peer::Tokio => "tokio",
            Peer::Go => "go",
            Peer::Std => "std",
        }
    }
}

/// What the blockers call in their loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `std::thread::sleep(1 ms)`.
    Sleep,
    /// `std::fs::read` of a small file.
    Fs,
    /// A busy loop.
    Compute,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Sleep, Kind::Fs, Kind::Compute];

    /// The name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sleep => "sleep",
            Kind::Fs => "fs",
            Kind::Compute => "compute",
        }
    }
}

/// The items of `all` named in `given` (all of them when `None`).
fn pick<T: Copy>(
    given: &Option<Vec<String>>,
    all: &[T],
    name: fn(T) -> &'static str,
    what: &str,
) -> Result<Vec<T>, BenchError> {
    let Some(given) = given else {
        return Ok(all.to_vec());
    };
    given
        .iter()
        .map(|g| {
            all.iter().copied().find(|a| name(*a) == g).ok_or_else(|| {
                let names: Vec<&str> = all.iter().map(|a| name(*a)).collect();
                BenchError::Machine(format!("unknown {what} {g:?} (one of {names:?})"))
            })
        })
        .collect()
}

/// What one child reports (one JSON line on stdout); the Go program
/// prints the same fields.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// corewise, tokio, go or std.
    pub peer: String,
    /// sleep, fs or compute.
    pub kind: String,
    /// `None` when the run completed (stalled or not); else why not.
    pub error: Option<String>,
    /// The peer had not finished when the watchdog gave up on it.
    #[serde(default)]
    pub stalled: bool,
    /// Due times in the duration.
    pub expected: u64,
    /// Lateness of each observed tick, µs.
    #[serde(default)]
    pub lateness_us: Vec<f64>,
    /// Blocking calls made by all blockers together.
    #[serde(default)]
    pub blocker_calls: u64,
}

/// One row of the table and of the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// corewise, tokio, go or std.
    pub peer: String,
    /// sleep, fs or compute.
    pub kind: String,
    /// Why the cell has no figures, or what stopped it.
    pub error: Option<String>,
    /// The peer did not finish in time (figures are what it recorded).
    pub stalled: bool,
    /// Ticks due in the duration.
    pub expected: u64,
    /// Ticks observed.
    pub observed: u64,
    /// Median lateness, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile lateness, ms.
    pub p99_ms: Option<f64>,
    /// Largest lateness, ms.
    pub max_ms: Option<f64>,
    /// Blocking calls made by all blockers together.
    pub blocker_calls: u64,
}

impl Record {
    /// Summarises a child's outcome.
    pub fn of(o: &Outcome) -> Self {
        let mut v: Vec<f64> = o
            .lateness_us
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .map(|us| us / 1e3)
            .collect();
        v.sort_by(f64::total_cmp);
        Record {
            peer: o.peer.clone(),
            kind: o.kind.clone(),
            error: o.error.clone(),
            stalled: o.stalled,
            expected: o.expected,
            observed: v.len() as u64,
            p50_ms: median_sorted(&v),
            p99_ms: percentile_sorted(&v, 99.0),
            max_ms: v.last().copied(),
            blocker_calls: o.blocker_calls,
        }
    }
}

/// corewise's p99 lateness against another peer's, for one kind.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// sleep, fs or compute.
    pub kind: String,
    /// The peer compared with (go or tokio).
    pub against: String,
    /// corewise p99 / that peer's p99.
    pub ratio: f64,
}

/// The JSON object written by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// CPUs of the run.
    pub cpus: Vec<usize>,
    /// Blocking threads per run.
    pub blockers: u64,
    /// The ticker's period, ms.
    pub interval_ms: u64,
    /// Length of each run, ms.
    pub duration_ms: u64,
    /// One record per (peer, kind).
    pub records: Vec<Record>,
    /// corewise's p99 against Go's and tokio's, per kind.
    pub ratios: Vec<Ratio>,
    /// The notes printed under the table.
    pub notes: Vec<String>,
}

/// Runs the benchmark (or, with `--child`, one peer and kind).
pub fn run(args: &Args) -> Result<(), BenchError> {
    let cpus = match &args.cpus {
        Some(c) => c.clone(),
        None => crate::affinity::allowed_cpus()?
            .into_iter()
            .take(2)
            .collect(),
    };
    let allowed = crate::affinity::allowed_cpus()?;
    if cpus.is_empty() {
        return Err(BenchError::Machine("no CPU to run on".into()));
    }
    if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(BenchError::Machine(format!(
            "cpu {c} is not one this process may use ({allowed:?})"
        )));
    }
    let plan_of = |kind| child::Plan {
        kind,
        blockers: args
            .blockers
            .map_or(cpus.len(), |b| usize::try_from(b).unwrap_or(usize::MAX)),
        cpus: cpus.clone(),
        interval: Duration::from_millis(args.interval_ms),
        duration: Duration::from_millis(args.duration_ms.unwrap_or(if args.quick {
            1_000
        } else {
            3_000
        })),
        grace: Duration::from_millis(args.grace_ms),
    };
    if let Some(spec) = &args.child {
        let (peer, kind) = spec.split_once(':').unwrap_or((spec, ""));
        let peer = pick(&Some(vec![peer.into()]), &Peer::ALL, Peer::name, "peer")?[0];
        let kind = pick(&Some(vec![kind.into()]), &Kind::ALL, Kind::name, "kind")?[0];
        let out = child::run(peer, plan_of(kind));
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", serde_json::to_string(&out)?)
            .and_then(|()| stdout.flush())
            .map_err(|e| BenchError::io("writing the outcome", e))?;
        // A stalled peer may hold threads that never return: leave now
        // rather than shut it down.
        std::process::exit(0);
    }
    let peers = pick(&args.peers, &Peer::ALL, Peer::name, "peer")?;
    let kinds = pick(&args.kind, &Kind::ALL, Kind::name, "kind")?;
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current_exe", e))?;
    let go = peers
        .contains(&Peer::Go)
        .then(|| crate::primitives::go::build_bench_program("go-blocking"));
    let mut records = Vec::new();
    for kind in &kinds {
        let plan = plan_of(*kind);
        for peer in &peers {
            eprintln!(
                "blocking: {} {} ({} blockers, {} ms)",
                peer.name(),
                kind.name(),
                plan.blockers,
                plan.duration.as_millis()
            );
            let cmd = match (peer, &go) {
                (Peer::Go, Some(Err(e))) => Err(format!("skipped: {e}")),
                (Peer::Go, Some(Ok(bin))) => Ok(go_command(bin, &plan)),
                _ => Ok(child_command(&exe, *peer, &plan)),
            };
            let outcome = match cmd {
                Ok(mut cmd) => {
                    crate::affinity::confine_child(&mut cmd, &plan.cpus);
                    run_child(cmd, *peer, &plan)
                }
                Err(e) => Outcome {
                    peer: peer.name().into(),
                    kind: kind.name().into(),
                    error: Some(e),
                    expected: child::expected_ticks(plan.interval, plan.duration),
                    ..Outcome::default()
                },
            };
            records.push(Record::of(&outcome));
        }
    }
    let plan = plan_of(Kind::Sleep);
    let results = Results {
        cpus: cpus.clone(),
        blockers: plan.blockers as u64,
        interval_ms: args.interval_ms,
        duration_ms: plan.duration.as_millis() as u64,
        ratios: ratios(&records),
        notes: notes(&plan, &peers),
        records,
    };
    print!("{}", markdown(&results));
    if let Some(p) = &args.json {
        write_json(&results, p)?;
    }
    Ok(())
}

/// This program as the child that runs `peer` with `plan`.
fn child_command(exe: &Path, peer: Peer, plan: &child::Plan) -> Command {
    let mut c = Command::new(exe);
    let cpus: Vec<String> = plan.cpus.iter().map(ToString::to_string).collect();
    c.args([
        "blocking",
        "--child",
        &format!("{}:{}", peer.name(), plan.kind.name()),
        "--cpus",
        &cpus.join(","),
        "--blockers",
        &plan.blockers.to_string(),
        "--interval-ms",
        &plan.interval.as_millis().to_string(),
        "--duration-ms",
        &plan.duration.as_millis().to_string(),
        "--grace-ms",
        &plan.grace.as_millis().to_string(),
    ]);
    c
}

/// The Go program with `plan`, GOMAXPROCS = the plan's CPUs.
fn go_command(bin: &Path, plan: &child::Plan) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "-kind",
        plan.kind.name(),
        "-blockers",
        &plan.blockers.to_string(),
        "-interval-us",
        &plan.interval.as_micros().to_string(),
        "-duration-ms",
        &plan.duration.as_millis().to_string(),
        "-grace-ms",
        &plan.grace.as_millis().to_string(),
    ])
    .env("GOMAXPROCS", plan.cpus.len().to_string());
    c
}

/// Runs one child; one that does not report in time (its own watchdog
/// failed too) is killed and counts as stalled.
fn run_child(cmd: Command, peer: Peer, plan: &child::Plan) -> Outcome {
    let base = Outcome {
        peer: peer.name().into(),
        kind: plan.kind.name().into(),
        expected: child::expected_ticks(plan.interval, plan.duration),
        ..Outcome::default()
    };
    // Setup (10 s at most in the child) plus the run and its grace.
    let deadline = Duration::from_secs(20) + plan.duration + plan.interval + plan.grace;
    let out = match output_within(cmd, deadline) {
        Ok(out) => out,
        Err(e @ crate::child_proc::ChildFailure::Killed(_)) => {
            return Outcome {
                stalled: true,
                error: Some(format!("stalled: {e}")),
                ..base
            }
        }
        Err(e) => {
            return Outcome {
                error: Some(format!("failed: {e}")),
                ..base
            }
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().last().map(serde_json::from_str::<Outcome>) {
        Some(Ok(o)) => o,
        _ => Outcome {
            error: Some(format!(
                "failed: child exited with {}: {}",
                out.status,
                crate::threads::crash_reason(&String::from_utf8_lossy(&out.stderr))
            )),
            ..base
        },
    }
}

/// corewise's p99 over Go's and tokio's, for every kind where both ran to
/// the end (a stalled or failed cell's figures are partial: its row says
/// so, and it has no ratio).
fn ratios(records: &[Record]) -> Vec<Ratio> {
    let p99 = |peer: &str, kind: &str| {
        records
            .iter()
            .find(|r| r.peer == peer && r.kind == kind && r.error.is_none() && !r.stalled)
            .and_then(|r| r.p99_ms)
    };
    let mut out = Vec::new();
    for kind in Kind::ALL.map(Kind::name) {
        let Some(cw) = p99("corewise", kind) else {
            continue;
        };
        for against in ["go", "tokio"] {
            if let Some(p) = p99(against, kind).filter(|p| *p > 0.0) {
                out.push(Ratio {
                    kind: kind.into(),
                    against: against.into(),
                    ratio: cw / p,
                });
            }
        }
    }
    out
}

fn notes(plan: &child::Plan, peers: &[Peer]) -> Vec<String> {
    let mut n = vec![format!(
        "cpus {:?}; {} blockers; ticker every {} ms for {} ms; lateness = wake time - due time, \
         due times missed while late are dropped",
        plan.cpus,
        plan.blockers,
        plan.interval.as_millis(),
        plan.duration.as_millis()
    )];
    if peers.contains(&Peer::Corewise) {
        n.push(format!(
            "corewise: {} cores on those cpus, ticker on core 0, blocker i on core i % {}",
            plan.cpus.len(),
            plan.cpus.len()
        ));
    }
    if peers.contains(&Peer::Tokio) {
        n.push(format!(
            "tokio: multi-thread runtime, {} workers, blockers are tasks (no spawn_blocking); \
             its timer rounds sleeps up to whole ms",
            plan.cpus.len()
        ));
    }
    if peers.contains(&Peer::Go) {
        n.push(format!(
            "go: GOMAXPROCS={}; sleep = syscall.Nanosleep (blocks the M in the kernel), \
             fs = os.ReadFile",
            plan.cpus.len()
        ));
    }
    if peers.contains(&Peer::Std) {
        n.push("std: kernel threads pinned like corewise's: the operating system's floor".into());
    }
    n
}

/// Lateness in ms, with precision for small values.
fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(x) if x < 1.0 => format!("{x:.3}"),
        Some(x) if x < 100.0 => format!("{x:.2}"),
        Some(x) => format!("{x:.0}"),
    }
}

/// The markdown table, the ratios and the notes.
pub fn markdown(res: &Results) -> String {
    let mut s = String::from(
        "| peer | kind | ticks expected / observed | lateness p50 (ms) | p99 (ms) | max (ms) \
         | blocking calls | note |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in &res.records {
        let note = r
            .error
            .as_deref()
            .unwrap_or(if r.stalled { "stalled" } else { "" });
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} | {} | {} | {} | {} | {} |",
            r.peer,
            r.kind,
            r.expected,
            r.observed,
            fmt_ms(r.p50_ms),
            fmt_ms(r.p99_ms),
            fmt_ms(r.max_ms),
            r.blocker_calls,
            note
        );
    }
    if !res.ratios.is_empty() {
        s.push_str("\ncorewise p99 lateness / peer's:");
        for r in &res.ratios {
            let _ = write!(s, " {} vs {} {:.2}x;", r.kind, r.against, r.ratio);
        }
        s.push('\n');
    }
    s.push('\n');
    for n in &res.notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

/// Writes `res` as one JSON object to `path`.
fn write_json(res: &Results, path: &Path) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(res)?;
    std::fs::write(path, text + "\n")
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(peer: &str, kind: &str, lateness_us: Vec<f64>) -> Outcome {
        Outcome {
            peer: peer.into(),
            kind: kind.into(),
            expected: 100,
            lateness_us,
            ..Outcome::default()
        }
    }

    #[test]
    fn record_summarises_in_ms() {
        let r = Record::of(&outcome("go", "fs", vec![3000.0, 1000.0, 2000.0]));
        assert_eq!(r.observed, 3);
        assert_eq!(r.p50_ms, Some(2.0));
        assert_eq!(r.p99_ms, Some(3.0));
        assert_eq!(r.max_ms, Some(3.0));
        let empty = Record::of(&outcome("go", "fs", vec![]));
        assert_eq!((empty.observed, empty.p99_ms), (0, None));
    }

    #[test]
    fn ratios_need_both_sides() {
        let recs: Vec<Record> = [
            outcome("corewise", "sleep", vec![8000.0]),
            outcome("go", "sleep", vec![2000.0]),
            outcome("tokio", "sleep", vec![]),
            outcome("go", "fs", vec![1000.0]),
            Outcome {
                stalled: true,
                error: Some("stalled: test".into()),
                ..outcome("corewise", "compute", vec![5000.0])
            },
            outcome("go", "compute", vec![1000.0]),
        ]
        .iter()
        .map(Record::of)
        .collect();
        let r = ratios(&recs);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!((r[0].kind.as_str(), r[0].against.as_str()), ("sleep", "go"));
        assert_eq!(r[0].ratio, 4.0);
    }

    #[test]
    fn unknown_names_are_errors() {
        let e = pick(&Some(vec!["nope".into()]), &Peer::ALL, Peer::name, "peer");
        assert!(matches!(e, Err(BenchError::Machine(_))));
        let all = pick(&None, &Kind::ALL, Kind::name, "kind").expect("all kinds");
        assert_eq!(all, Kind::ALL.to_vec());
    }
}
