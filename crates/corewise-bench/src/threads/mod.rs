//! `corewise-bench threads`: many threads at once, corewise against tokio
//! tasks, Go goroutines, may coroutines and std threads.
//!
//! Scenarios (each a size flag, so they can be tried small):
//! - `sleepers`: spawn N threads that each sleep 10 ms, join them all: wall
//!   time and peak RSS.
//! - `parked`: N threads blocked at once on a condition: time to create them,
//!   RSS per parked thread (RSS delta / N), time to wake them all and join.
//!
//! Every (scenario, runtime) pair runs in a child process of this program
//! (`--child`), so runtimes never share an address space and each peak RSS
//! (VmHWM of `/proc/self/status`, read by the child at its end) is that
//! runtime's alone. A runtime that cannot reach N (no thread slot, no stack
//! mapping, no kernel thread) is reported in the table as `failed: ...`
//! with the count it reached; the benchmark never panics on it.
//!
//! - `connections`: echo servers (corewise on each back end: a user thread
//!   per connection; tokio: a task per connection; Go: a goroutine per
//!   connection; the plain epoll loop) with N connections open and `--active` of them
//!   carrying `--rate` requests/s in total: p50/p99 and server peak RSS.
//!   The process's RLIMIT_NOFILE soft limit is raised to its hard limit
//!   first (children inherit it). The servers take turns for `--rounds`
//!   rounds (3 by default, 1 quick; the order reverses every round) and the
//!   table gives each server's p50 and p99 over every request of its
//!   rounds (the notes list every round's p99, and the pooled p99.9): on a
//!   shared machine a single run's p99 moved between 50 and 700 µs for the
//!   same server within minutes, as the host's stalls came and went; only
//!   rounds interleaved side by side compare servers. On a virtual machine
//!   each round also reads the host's steal time of the server's and the
//!   generator's CPU (/proc/stat): a round during which the host took
//!   more than `--max-steal` (2 %) of either is run again, up to
//!   `--steal-retries` (2) times; the notes list every round's steal, and
//!   p50 and p99 over the rounds within the limit beside those over all
//!   (on 2026-12-02 the host took 3-66 % of the server's CPU in some ten
//!   second rounds, and those rounds' medians were in milliseconds).
//!
//! The Go column (when `go` exists) comes from bench/go-threads, built and
//! run by [`go`]: GOMAXPROCS=2 in `sleepers` and `parked`, and in
//! `connections` GOMAXPROCS=1 pinned to the one server CPU, as every other
//! echo server is.

mod child;
mod connections;
mod go;
mod map_count;

use crate::error::BenchError;
use crate::stats::percentile_sorted;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

/// Command line of `corewise-bench threads`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Smaller N (10 000 sleepers, 100 000 parked).
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run (default sleepers,parked).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Option<Vec<String>>,
    /// Runtimes to run (default all: corewise,tokio,go,may,std in every
    /// scenario; corewise-epoll,epoll-loop in `connections` only).
    #[arg(long, value_delimiter = ',')]
    pub runtimes: Option<Vec<String>>,
    /// Threads in `sleepers` (default 100 000; quick 10 000).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Threads in `parked` (default 1 000 000; quick 100 000).
    #[arg(long)]
    pub parked: Option<usize>,
    /// Raise the kernel's vm.max_map_count to this for the run (root; the
    /// old value is restored afterwards, also on error), so runtimes that
    /// map each stack on its own (may, std) can reach 1 000 000 threads.
    #[arg(long, value_name = "N")]
    pub max_map_count: Option<u64>,
    /// std threads are skipped in a scenario above this many threads.
    #[arg(long, default_value_t = 100_000)]
    pub std_max: usize,
    /// Connections open in `connections` (default 10 000; quick 1 000).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Connections carrying requests in `connections` (default 1 000; quick 100).
    #[arg(long)]
    pub active: Option<usize>,
    /// Total request rate in `connections`, per second, spread round-robin
    /// over the active connections on an open-loop schedule. The rate a
    /// run can sustain is at most `active * in_flight / round trip`; above
    /// it requests wait in the generator and their wait counts in the
    /// latency (measured from the scheduled send time).
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Rounds of `connections`, the servers taking turns (default 3;
    /// quick 1); the table gives p50 and p99 over every request of them.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: Option<u64>,
    /// In `connections`, a server's round during which the host took more
    /// than this share (percent) of the server's or the generator's CPU
    /// (steal time, from /proc/stat) is run again, up to `--steal-retries`
    /// times; every round's steal is listed in the notes.
    #[arg(long, default_value_t = 2.0)]
    pub max_steal: f64,
    /// Runs again of one round at most when the host took more than
    /// `--max-steal` (0: never; the last run is kept).
    #[arg(long, default_value_t = 2)]
    pub steal_retries: u32,
    /// Requests in flight at most per active connection in `connections`
    /// (pipelined on the connection; a due request beyond that waits for a
    /// reply).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub in_flight: u64,
    /// Internal: run the `connections` load generator
    /// (`PORT:CONNS:ACTIVE:RATE:MS:IN_FLIGHT`).
    #[arg(long, hide = true)]
    pub load: Option<String>,
    /// A scenario child that has not reported after this many seconds is
    /// killed and its cell reads `failed: no result within ...`.
    #[arg(long, default_value_t = 120)]
    pub child_timeout: u64,
    /// Internal: run a corewise thread-per-connection server (`KIND:CPU`).
    #[arg(long, hide = true)]
    pub serve_tpc: Option<String>,
    /// Internal: run one scenario (`SCENARIO:RUNTIME:N`) and print its outcome.
    #[arg(long, hide = true)]
    pub child: Option<String>,
}

/// What one child reports (one JSON line on stdout).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// `None` when the scenario completed; else why it stopped.
    pub error: Option<String>,
    /// Threads asked for.
    pub n: usize,
    /// sleepers: spawn to last join, ms.
    pub wall_ms: Option<f64>,
    /// connections: median latency, µs.
    pub p50_us: Option<f64>,
    /// connections: 99th percentile latency, µs.
    pub p99_us: Option<f64>,
    /// parked: time to create all N and have them blocked, ms.
    pub create_ms: Option<f64>,
    /// parked: time to wake all N and join them, ms.
    pub wake_ms: Option<f64>,
    /// parked: (RSS with N parked - RSS before) / N, bytes.
    pub rss_per_thread_bytes: Option<f64>,
    /// Peak RSS of the child process (VmHWM), KiB.
    pub peak_rss_kib: Option<u64>,
    /// connections: the share of the generator's run the host took from
    /// the server's CPU (steal time), percent (pooled: the largest of the
    /// rounds').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_steal_pct: Option<f64>,
    /// connections: the same for the generator's CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_steal_pct: Option<f64>,
    /// connections: runs of this round made again because the host took
    /// more than `--max-steal` of a CPU (the last one is kept; pooled: the
    /// rounds' sum).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steal_retries: u32,
    /// connections: every request's latency, µs (from the generator to
    /// this process, so that the rounds' requests are pooled; left out of
    /// `--json`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latencies_us: Vec<f32>,
}

/// The JSON object written by `--json`: the table's columns, its notes and
/// one record per (scenario, runtime) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// Columns, in the table's order.
    pub runtimes: Vec<&'static str>,
    /// The notes printed under the table (vm.max_map_count, GOMAXPROCS).
    pub notes: Vec<String>,
    /// One entry per cell.
    pub records: Vec<Record>,
}

/// One row of the results.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// sleepers or parked.
    pub scenario: String,
    /// corewise, tokio, go, may, std, corewise-epoll or epoll-loop.
    pub runtime: String,
    /// The child's outcome (`error: "skipped: ..."` when not run).
    #[serde(flatten)]
    pub outcome: Outcome,
}

const RUNTIMES: [&str; 7] = [
    "corewise",
    "tokio",
    "go",
    "may",
    "std",
    "corewise-epoll",
    "epoll-loop",
];
const SCENARIOS: [&str; 3] = ["sleepers", "parked", "connections"];
/// Runtimes that take part in `connections` (the echo servers), and the
/// echo server each names.
fn echo_server(rt: &str) -> Option<&'static str> {
    match rt {
        "corewise" => Some("corewise-uring"),
        "corewise-epoll" => Some("corewise-epoll"),
        "tokio" => Some("tokio"),
        "go" => Some("go"),
        "epoll-loop" => Some("epoll-loop"),
        _ => None,
    }
}

/// Runtimes that take part in `sleepers` and `parked`.
fn thread_runtime(rt: &str) -> bool {
    matches!(rt, "corewise" | "tokio" | "go" | "may" | "std")
}

/// Raises the soft RLIMIT_NOFILE to the hard limit.
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Runs the benchmark (or, with `--child`, one scenario).
pub fn run(args: &Args) -> Result<(), BenchError> {
    if let Some(spec) = &args.child {
        let out = child::run(spec);
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    if let Some(spec) = &args.serve_tpc {
        connections::serve_tpc(spec);
    }
    if let Some(spec) = &args.load {
        println!("{}", serde_json::to_string(&connections::load(spec))?);
        return Ok(());
    }
    raise_nofile();
    // Held until the end of `run`: dropping it restores the old value.
    let raised = args.max_map_count.map(map_count::Raised::to).transpose()?;
    let mut notes = vec![match &raised {
        Some(r) => r.note(),
        None => format!(
            "vm.max_map_count = {} (current; --max-map-count N raises it for the run)",
            map_count::current().map_or("?".into(), |v| v.to_string())
        ),
    }];
    let scenarios = pick(&args.scenarios, &SCENARIOS, "scenario")?;
    let runtimes = pick(&args.runtimes, &RUNTIMES, "runtime")?;
    let n_of = |s: &str| match s {
        "sleepers" => args
            .threads
            .unwrap_or(if args.quick { 10_000 } else { 100_000 }),
        _ => args
            .parked
            .unwrap_or(if args.quick { 100_000 } else { 1_000_000 }),
    };
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current_exe", e))?;
    let go_peer = runtimes.contains(&"go").then(go::GoPeer::build);
    let timeout = std::time::Duration::from_secs(args.child_timeout);
    let mut records = Vec::new();
    for s in &scenarios {
        let n = n_of(s);
        if *s == "connections" {
            let servers: Vec<&'static str> = runtimes
                .iter()
                .copied()
                .filter(|r| echo_server(r).is_some())
                .collect();
            let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 }) as usize;
            let mut runs: Vec<Vec<Outcome>> = vec![Vec::new(); servers.len()];
            for round in 0..rounds {
                let mut order: Vec<usize> = (0..servers.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for k in order {
                    let mut run = connections_run(args, servers[k], go_peer.as_ref(), &exe, round);
                    let mut retries = 0;
                    while retries < args.steal_retries && stolen(&run, args.max_steal) {
                        retries += 1;
                        eprintln!(
                            "threads: the host took {} % of the server's CPU and {} % of the generator's: again",
                            pct(run.server_steal_pct),
                            pct(run.load_steal_pct)
                        );
                        run = connections_run(args, servers[k], go_peer.as_ref(), &exe, round);
                    }
                    run.steal_retries = retries;
                    runs[k].push(run);
                }
            }
            notes.push(format!(
                "connections: steal, the share of each round the host took from the server's / the generator's CPU (%), and runs made again above --max-steal {}: {}",
                args.max_steal,
                per_server(&servers, &runs, |o| {
                    let rounds: Vec<String> = o
                        .iter()
                        .map(|x| format!("{}/{}", pct(x.server_steal_pct), pct(x.load_steal_pct)))
                        .collect();
                    let again: u32 = o.iter().map(|x| x.steal_retries).sum();
                    format!("[{}] again {again}", rounds.join(", "))
                })
            ));
            if rounds > 1 {
                let per_round = per_server(&servers, &runs, |o| {
                    let p99: Vec<String> = o
                        .iter()
                        .map(|x| x.p99_us.map_or("-".into(), |v| format!("{v:.0}")))
                        .collect();
                    format!("[{}]", p99.join(", "))
                });
                notes.push(format!(
                    "connections: {rounds} rounds, servers taking turns; the table's p50 and p99 are over every request of every round (one host stall of tens of ms decides a round's p99); p99 (µs) per round: {per_round}"
                ));
                let tails = per_server(&servers, &runs, |o| {
                    let all = pooled(o);
                    match percentile_sorted(&all, 99.9) {
                        Some(q) => format!("{q:.0} ({} requests)", all.len()),
                        None => "-".into(),
                    }
                });
                notes.push(format!("connections: p99.9 (µs) over every round: {tails}"));
                let calm = per_server(&servers, &runs, |o| {
                    let kept: Vec<&Outcome> =
                        o.iter().filter(|x| !stolen(x, args.max_steal)).collect();
                    let all = pooled(kept.iter().copied());
                    match (percentile_sorted(&all, 50.0), percentile_sorted(&all, 99.0)) {
                        (Some(m), Some(q)) => {
                            format!("{m:.1} / {q:.1} ({} of {} rounds)", kept.len(), o.len())
                        }
                        _ => "- (no round)".into(),
                    }
                });
                notes.push(format!(
                    "connections: p50 / p99 (µs) over the rounds within --max-steal only: {calm}"
                ));
            }
            for (r, o) in servers.iter().zip(runs) {
                records.push(Record {
                    scenario: s.to_string(),
                    runtime: r.to_string(),
                    outcome: pooled_outcome(o),
                });
            }
            continue;
        }
        for r in &runtimes {
            let outcome = if !thread_runtime(r) {
                continue;
            } else if *r == "std" && n > args.std_max {
                Outcome {
                    error: Some(format!("skipped: {n} > --std-max {}", args.std_max)),
                    n,
                    ..Outcome::default()
                }
            } else if let Some(g) = go_peer.as_ref().filter(|_| *r == "go") {
                eprintln!("threads: {s} {r} n={n}");
                match g.command(s, n, go::PROCS) {
                    Ok(cmd) => run_child(cmd, n, timeout),
                    Err(e) => skipped(e, n),
                }
            } else {
                eprintln!("threads: {s} {r} n={n}");
                let mut cmd = Command::new(&exe);
                cmd.args(["threads", "--child", &format!("{s}:{r}:{n}")]);
                run_child(cmd, n, timeout)
            };
            records.push(Record {
                scenario: s.to_string(),
                runtime: r.to_string(),
                outcome,
            });
        }
    }
    if runtimes.contains(&"go") {
        notes.push(format!(
            "go: GOMAXPROCS={} in sleepers and parked; in connections GOMAXPROCS=1 pinned to the server CPU",
            go::PROCS
        ));
    }
    print!("{}", markdown(&records, &runtimes, &notes));
    if let Some(p) = &args.json {
        let results = Results {
            runtimes,
            notes,
            records,
        };
        let text = serde_json::to_string_pretty(&results)?;
        std::fs::write(p, text + "\n")
            .map_err(|e| BenchError::io(format!("writing {}", p.display()), e))?;
    }
    Ok(())
}

/// One `connections` run of `runtime`'s echo server (round `round`, from 0).
fn connections_run(
    args: &Args,
    runtime: &str,
    go_peer: Option<&go::GoPeer>,
    exe: &std::path::Path,
    round: usize,
) -> Outcome {
    let server = echo_server(runtime).unwrap_or(runtime);
    let (c, a) = (
        args.connections
            .unwrap_or(if args.quick { 1_000 } else { 10_000 }),
        args.active.unwrap_or(if args.quick { 100 } else { 1_000 }),
    );
    eprintln!(
        "threads: connections {runtime} conns={c} active={a} round {}",
        round + 1
    );
    let cpu = connections::server_cpu();
    let serve = match (server, go_peer) {
        ("go", Some(g)) => g.command("serve", c, 1).map(|mut cmd| {
            connections::pin_child(&mut cmd, cpu);
            cmd
        }),
        _ => Ok(connections::server_command(exe, server, cpu, c)),
    };
    match serve {
        Ok(serve) => connections::measure(
            serve,
            c,
            a,
            args.rate,
            args.in_flight,
            if args.quick { 2_000 } else { 10_000 },
        ),
        Err(e) => skipped(e, c),
    }
}

/// Whether the host took more than `max` percent of the server's or the
/// generator's CPU during `run` (a failed run is never made again).
fn stolen(run: &Outcome, max: f64) -> bool {
    run.error.is_none()
        && [run.server_steal_pct, run.load_steal_pct]
            .iter()
            .any(|s| s.is_some_and(|s| s > max))
}

/// A percentage for the notes, `?` when it was not measured.
fn pct(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.1}"))
}

/// Whether a count is zero (a field left out of the JSON then).
fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// One note's figure for every server, each after its name: `figure` of
/// the server's rounds.
fn per_server(
    servers: &[&str],
    runs: &[Vec<Outcome>],
    figure: impl Fn(&[Outcome]) -> String,
) -> String {
    servers
        .iter()
        .zip(runs)
        .map(|(r, o)| format!("{r} {}", figure(o)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every request's latency of `runs`, sorted.
fn pooled<'a>(runs: impl IntoIterator<Item = &'a Outcome>) -> Vec<f32> {
    let mut all: Vec<f32> = runs
        .into_iter()
        .flat_map(|o| o.latencies_us.iter().copied())
        .collect();
    all.sort_by(f32::total_cmp);
    all
}

/// One server's rounds as one cell: the first failure if a round failed,
/// else p50 and p99 over every request of every round and the highest
/// peak RSS. (The median of the rounds' p99 weighed a round whose p99 one
/// host stall decided as much as a quiet one; pooled, every request counts
/// once.)
fn pooled_outcome(runs: Vec<Outcome>) -> Outcome {
    if let Some(failed) = runs.iter().find(|o| o.error.is_some()) {
        let mut failed = failed.clone();
        failed.latencies_us = Vec::new();
        return failed;
    }
    let all = pooled(&runs);
    Outcome {
        error: None,
        n: runs.first().map_or(0, |o| o.n),
        p50_us: percentile_sorted(&all, 50.0),
        p99_us: percentile_sorted(&all, 99.0),
        peak_rss_kib: runs.iter().filter_map(|o| o.peak_rss_kib).max(),
        server_steal_pct: runs
            .iter()
            .filter_map(|o| o.server_steal_pct)
            .reduce(f64::max),
        load_steal_pct: runs
            .iter()
            .filter_map(|o| o.load_steal_pct)
            .reduce(f64::max),
        steal_retries: runs.iter().map(|o| o.steal_retries).sum(),
        ..Outcome::default()
    }
}

fn pick(
    given: &Option<Vec<String>>,
    all: &[&'static str],
    what: &str,
) -> Result<Vec<&'static str>, BenchError> {
    match given {
        None => Ok(all.to_vec()),
        Some(v) => v
            .iter()
            .map(|g| {
                all.iter().copied().find(|a| a == g).ok_or_else(|| {
                    BenchError::Machine(format!("unknown {what} {g:?} (one of {all:?})"))
                })
            })
            .collect(),
    }
}

/// A cell that was not measured, saying why.
fn skipped(why: String, n: usize) -> Outcome {
    Outcome {
        error: Some(why),
        n,
        ..Outcome::default()
    }
}

/// Runs one scenario in a child process (`cmd` prints the outcome as its
/// last stdout line); a child that dies is a failed cell.
fn run_child(cmd: Command, n: usize, timeout: std::time::Duration) -> Outcome {
    let fail = |e: String| skipped(e, n);
    let out = match crate::child_proc::output_within(cmd, timeout) {
        Ok(out) => out,
        Err(e) => return fail(format!("failed: {e}")),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().last().map(serde_json::from_str::<Outcome>) {
        Some(Ok(o)) => o,
        _ => fail(format!(
            "failed: child exited with {}: {} (vm.max_map_count = {})",
            out.status,
            crash_reason(&String::from_utf8_lossy(&out.stderr)),
            std::fs::read_to_string("/proc/sys/vm/max_map_count")
                .map_or("?".into(), |s| s.trim().to_string())
        )),
    }
}

/// The line that says why a runtime's child died: the one after a panic
/// header (a runtime that cannot map a stack panics or aborts), else the
/// last non-empty line.
pub(crate) fn crash_reason(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .position(|l| l.contains("panicked at"))
        .and_then(|i| lines.get(i + 1))
        .or(lines.last())
        .map_or(String::new(), |l| l.to_string())
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1}"))
}

/// The markdown table: one row per scenario and figure, a column per runtime.
pub fn markdown(records: &[Record], runtimes: &[&str], notes: &[String]) -> String {
    let mut s = String::new();
    let _ = write!(s, "| scenario | figure |");
    for r in runtimes {
        let _ = write!(s, " {r} |");
    }
    let _ = write!(s, "\n|---|---|");
    for _ in runtimes {
        s.push_str("---|");
    }
    s.push('\n');
    type Cell = fn(&Outcome) -> String;
    let figures: [(&str, &str, Cell); 9] = [
        ("sleepers", "wall (ms)", |o| ms(o.wall_ms)),
        ("sleepers", "peak RSS (MiB)", |o| {
            o.peak_rss_kib
                .map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0))
        }),
        ("parked", "create (ms)", |o| ms(o.create_ms)),
        ("parked", "RSS per parked thread (bytes)", |o| {
            o.rss_per_thread_bytes
                .map_or("–".into(), |b| format!("{b:.0}"))
        }),
        ("parked", "wake + join (ms)", |o| ms(o.wake_ms)),
        ("parked", "peak RSS (MiB)", |o| {
            o.peak_rss_kib
                .map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0))
        }),
        ("connections", "p50 (µs)", |o| ms(o.p50_us)),
        ("connections", "p99 (µs)", |o| ms(o.p99_us)),
        ("connections", "server peak RSS (MiB)", |o| {
            o.peak_rss_kib
                .map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0))
        }),
    ];
    let mut shown_err = std::collections::HashSet::new();
    for (scen, label, cell) in figures {
        let rows: Vec<&Record> = records.iter().filter(|r| r.scenario == scen).collect();
        if rows.is_empty() {
            continue;
        }
        let n = rows[0].outcome.n;
        let _ = write!(s, "| {scen} (N = {n}) | {label} |");
        for rt in runtimes {
            match rows.iter().find(|r| r.runtime == *rt) {
                Some(r) => match &r.outcome.error {
                    Some(e) if shown_err.insert((scen, *rt)) => {
                        let _ = write!(s, " {e} |");
                    }
                    Some(_) => s.push_str(" – |"),
                    None => {
                        let _ = write!(s, " {} |", cell(&r.outcome));
                    }
                },
                None => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    // Ratios to tokio, measured side by side in this run.
    if let Some(t) = records
        .iter()
        .find(|r| r.scenario == "sleepers" && r.runtime == "tokio")
        .and_then(|r| r.outcome.wall_ms)
    {
        s.push_str("\nsleepers wall time / tokio's:");
        for r in records.iter().filter(|r| r.scenario == "sleepers") {
            if let Some(w) = r.outcome.wall_ms {
                let _ = write!(s, " {} {:.2}x;", r.runtime, w / t);
            }
        }
        s.push('\n');
    }
    s.push('\n');
    for n in notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(server: f64, load: f64) -> Outcome {
        Outcome {
            server_steal_pct: Some(server),
            load_steal_pct: Some(load),
            latencies_us: vec![10.0, 20.0],
            ..Outcome::default()
        }
    }

    #[test]
    fn a_round_is_stolen_when_either_cpu_lost_more_than_the_limit() {
        assert!(!stolen(&round(2.0, 0.1), 2.0));
        assert!(stolen(&round(2.1, 0.1), 2.0));
        assert!(stolen(&round(0.0, 5.0), 2.0));
        let unmeasured = Outcome::default();
        assert!(!stolen(&unmeasured, 2.0));
        let failed = Outcome {
            error: Some("failed: server exited".into()),
            ..round(50.0, 50.0)
        };
        assert!(!stolen(&failed, 2.0), "a failed run is never made again");
    }

    #[test]
    fn pooled_rounds_keep_the_largest_steal_and_count_every_retry() {
        let mut a = round(0.5, 0.1);
        a.steal_retries = 1;
        let mut b = round(3.0, 0.0);
        b.steal_retries = 2;
        let p = pooled_outcome(vec![a, b]);
        assert_eq!(p.server_steal_pct, Some(3.0));
        assert_eq!(p.load_steal_pct, Some(0.1));
        assert_eq!(p.steal_retries, 3);
        assert!(p.p50_us.is_some() && p.p99_us.is_some(), "{p:?}");
    }
}
