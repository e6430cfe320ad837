//! `corewise-bench primitives`: the primitive costs of every runtime.
//!
//! Each runtime has a *runner*: a plain function of type [`Runner`] that
//! takes the shared [`Ctx`] (clock, CPUs, sample counts) and returns a
//! [`RuntimeReport`] holding raw samples in nanoseconds per [`Op`], plus
//! creation throughput and idle CPU. [`RUNNERS`] lists them in column order;
//! all run in one invocation, one after the other, so they see the same
//! machine state. Summaries, tables and JSON are made here, not by runners.

pub mod common;
mod corewise;
pub(crate) mod go;
mod may_rt;
mod std_thread;
mod tokio_rt;

use crate::affinity;
use crate::clock::Clock;
use crate::error::BenchError;
use crate::output;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `corewise-bench primitives`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Fewer samples: the whole run takes under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Also write the results as one JSON object to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// The "home" CPU: parents and same-core runs are pinned here.
    #[arg(long, default_value_t = 0)]
    pub cpu_a: usize,
    /// The "other" CPU: cross-core children and waiters run here.
    #[arg(long, default_value_t = 1)]
    pub cpu_b: usize,
    /// Clock: `tsc` (rdtsc calibrated to ns, when the TSC is invariant) or
    /// `mono` (clock_gettime(CLOCK_MONOTONIC)).
    #[arg(long, default_value = "tsc", value_parser = ["tsc", "mono"])]
    pub clock: String,
    /// Only these runtimes (comma separated: corewise,std,tokio,may,go).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Pause (µs) between "the waiter is about to block" and the notify of
    /// cross-core ops, so the waiter is really blocked. A runtime whose idle
    /// cores spin longer than this is measured while still spinning.
    #[arg(long, default_value_t = 20)]
    pub settle_us: u64,
    /// Skip the Go peer even when `go` is available.
    #[arg(long)]
    pub no_go: bool,
    /// Directory of the Go peer's sources (default: bench/go-primitives of
    /// this workspace).
    #[arg(long, value_name = "DIR")]
    pub go_dir: Option<PathBuf>,
    /// A runtime's run across which the cache-line round trip moved by more
    /// than a quarter (the host moved the vCPUs) is run again, up to this
    /// many more times; the first run with a steady round trip is kept, or
    /// the last one, marked uncertain.
    #[arg(long, default_value_t = 3)]
    pub steady_retries: u32,
}

/// Whether two round trips measured around one run agree (within a
/// quarter): the vCPUs stayed where they were.
fn steady(before: f64, after: f64) -> bool {
    before.max(after) <= 1.25 * before.min(after)
}

/// The measured operations (rows of the latency table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// From the parent's create call (parent on cpu A) until the child runs
    /// on cpu B.
    CreateCrossCore,
    /// Spawn and join of a child that does nothing, on one core.
    SpawnJoinSameCore,
    /// A yield with no other thread runnable.
    NullYield,
    /// One yield hand-off between two threads on one core.
    OneWayYield,
    /// From notify (cpu A) until the waiter, blocked in a condition
    /// variable, runs on cpu B.
    CondvarNotifyCrossCore,
    /// From signal (cpu A) until the blocked thread runs on cpu B.
    SignalCrossCore,
}

impl Op {
    /// Every op, in table order.
    pub const ALL: [Op; 6] = [
        Op::CreateCrossCore,
        Op::SpawnJoinSameCore,
        Op::NullYield,
        Op::OneWayYield,
        Op::CondvarNotifyCrossCore,
        Op::SignalCrossCore,
    ];

    /// The name used in JSON and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Op::CreateCrossCore => "create_cross_core",
            Op::SpawnJoinSameCore => "spawn_join_same_core",
            Op::NullYield => "null_yield",
            Op::OneWayYield => "one_way_yield",
            Op::CondvarNotifyCrossCore => "condvar_notify_cross_core",
            Op::SignalCrossCore => "signal_cross_core",
        }
    }

    /// Parses [`Op::name`].
    pub fn from_name(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether the op crosses cores (reported also in round trips).
    pub fn cross_core(self) -> bool {
        matches!(
            self,
            Op::CreateCrossCore | Op::CondvarNotifyCrossCore | Op::SignalCrossCore
        )
    }
}

/// How expensive one sample of an op is; decides sample counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Creating a kernel thread per sample.
    OsThread,
    /// A cross-core wake-up with a settle pause per sample.
    CrossCore,
    /// A cheap user-level operation.
    Cheap,
}

/// Everything a runner needs. Shared by all runners of one invocation.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// The clock every sample is taken with.
    pub clock: Clock,
    /// The home CPU (parents, same-core runs).
    pub cpu_a: usize,
    /// The other CPU (cross-core children and waiters).
    pub cpu_b: usize,
    /// `--quick` was given.
    pub quick: bool,
    /// How long a notifier waits after the waiter announced it is about to
    /// block, so that the waiter really is blocked (and its core idle) when
    /// the notify comes.
    pub settle: Duration,
    /// Wall time over which idle CPU is measured.
    pub idle_window: Duration,
    /// Upper bound on any single wait inside a measurement.
    pub wait_timeout: Duration,
    /// Where the Go peer's sources are.
    pub go_dir: PathBuf,
    /// Where built helper binaries go.
    pub build_dir: PathBuf,
}

impl Ctx {
    /// Number of kept samples for an op of the given cost.
    pub fn samples(&self, cost: Cost) -> usize {
        match (cost, self.quick) {
            (Cost::OsThread, false) => 2_000,
            (Cost::OsThread, true) => 300,
            (Cost::CrossCore, false) => 5_000,
            (Cost::CrossCore, true) => 1_000,
            (Cost::Cheap, false) => 10_000,
            (Cost::Cheap, true) => 2_000,
        }
    }

    /// Number of discarded warm-up samples before the kept ones.
    pub fn warmup(&self, cost: Cost) -> usize {
        (self.samples(cost) / 10).max(20)
    }

    /// Number of children for the creation-throughput measurement.
    pub fn throughput_children(&self, cost: Cost) -> usize {
        match (cost, self.quick) {
            (Cost::OsThread, false) => 10_000,
            (Cost::OsThread, true) => 2_000,
            (_, false) => 500_000,
            (_, true) => 100_000,
        }
    }
}

/// Raw samples of one op, in nanoseconds per operation.
#[derive(Clone, Debug)]
pub struct OpSamples {
    /// The op.
    pub op: Op,
    /// One value per sample, ns.
    pub samples_ns: Vec<f64>,
}

/// What a runner hands back.
#[derive(Clone, Debug)]
pub struct RuntimeReport {
    /// Column name: one of corewise, std, tokio, may, go.
    pub runtime: &'static str,
    /// Samples per op; an op the runtime cannot do is simply absent.
    pub ops: Vec<OpSamples>,
    /// Children created per second by one creating thread.
    pub creation_throughput_per_s: Option<f64>,
    /// CPU an idle instance of the runtime uses, % of one core.
    pub idle_cpu_percent: Option<f64>,
    /// Remarks printed under the table (e.g. samples rejected because they
    /// ran on the wrong core).
    pub notes: Vec<String>,
    /// The cache-line round trip around this runtime's run (the mean of the
    /// measurements just before and just after it), ns; set by the driver.
    pub round_trip_ns: Option<f64>,
    /// A bare one-way wake (no runtime) around this runtime's run
    /// (median and p99, each the mean of the measurements just before and
    /// just after it; see [`common::bare_wake`]), ns; set by the driver.
    pub bare_wake_ns: Option<(f64, f64)>,
}

impl RuntimeReport {
    /// An empty report for `runtime`.
    pub fn new(runtime: &'static str) -> Self {
        RuntimeReport {
            runtime,
            ops: Vec::new(),
            creation_throughput_per_s: None,
            idle_cpu_percent: None,
            notes: Vec::new(),
            round_trip_ns: None,
            bare_wake_ns: None,
        }
    }

    /// Adds the samples of one op.
    pub fn push(&mut self, op: Op, samples_ns: Vec<f64>) {
        self.ops.push(OpSamples { op, samples_ns });
    }

    /// Adds a note.
    pub fn note(&mut self, s: impl Into<String>) {
        self.notes.push(s.into());
    }
}

/// A bare one-way wake's median and p99 (ns), printed as it is measured.
fn bare_wake(ctx: &Ctx) -> Result<(f64, f64), BenchError> {
    let v = common::bare_wake(ctx)?;
    let s = crate::stats::Summary::of(&v).ok_or(BenchError::Timeout("bare wake"))?;
    eprintln!(
        "bare one-way wake (no runtime): {:.1} / {:.1} ns (median / p99)",
        s.median, s.p99
    );
    Ok((s.median, s.p99))
}

/// The shape every runner has.
pub type Runner = fn(&Ctx) -> Result<RuntimeReport, BenchError>;

/// The runners, in column order.
pub const RUNNERS: &[(&str, Runner)] = &[
    ("corewise", corewise::run),
    ("std", std_thread::run),
    ("tokio", tokio_rt::run),
    ("may", may_rt::run),
    ("go", go::run),
];

/// Runs `corewise-bench primitives`.
pub fn run(args: &Args) -> Result<(), BenchError> {
    let allowed = affinity::allowed_cpus()?;
    for cpu in [args.cpu_a, args.cpu_b] {
        if !allowed.contains(&cpu) {
            return Err(BenchError::Machine(format!(
                "cpu {cpu} is not in this process's affinity {allowed:?}"
            )));
        }
    }
    if args.cpu_a == args.cpu_b {
        return Err(BenchError::Machine(
            "--cpu-a and --cpu-b must differ".into(),
        ));
    }
    for name in &args.only {
        if !RUNNERS.iter().any(|(n, _)| n == name) {
            return Err(BenchError::Machine(format!("unknown runtime {name:?}")));
        }
    }
    let quick = args.quick;
    let clock = Clock::calibrate(
        args.clock == "tsc",
        Duration::from_millis(if quick { 100 } else { 400 }),
    );
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let go_dir = args
        .go_dir
        .clone()
        .unwrap_or_else(|| manifest.join("../../bench/go-primitives"));
    let build_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .unwrap_or_else(std::env::temp_dir);
    let ctx = Ctx {
        clock,
        cpu_a: args.cpu_a,
        cpu_b: args.cpu_b,
        quick,
        settle: Duration::from_micros(args.settle_us),
        idle_window: Duration::from_secs(2),
        wait_timeout: Duration::from_secs(5),
        go_dir,
        build_dir,
    };
    eprintln!(
        "clock: {} ({:.4} ticks/ns); cpus {} and {}; settle {} us; {} mode",
        clock.source().name(),
        clock.ticks_per_ns(),
        ctx.cpu_a,
        ctx.cpu_b,
        args.settle_us,
        if quick { "quick" } else { "full" }
    );

    // The host may move the two vCPUs relative to each other during the run
    // (on these machines they sometimes share a physical core for a while,
    // and the round trip drops to ~20 ns; on AMD hosts it jumps between
    // ~75 ns and ~420 ns, one L3 or two, and on 2026-12-01 every few
    // seconds), so the round trip is measured before the first run and
    // after every run. Each runtime's cross-core figures are divided by the
    // round trip around its own run (the mean of the measurements just
    // before and after it), and a run across which it moved by more than a
    // quarter is done again (`--steady-retries`); the JSON's
    // `round_trip_ns` is the median of all of them.
    // A bare one-way wake (no runtime) is measured at the same points: the
    // single cross-core event the ops time, done by the simplest code.
    let mut round_trips = vec![common::cache_line_round_trip(&ctx)?];
    eprintln!("cache-line round trip: {:.1} ns", round_trips[0]);
    let mut wakes = vec![bare_wake(&ctx)?];

    let mut reports = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for (name, runner) in RUNNERS {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == name) {
            continue;
        }
        if *name == "go" && args.no_go {
            continue;
        }
        // Each run is followed by a round trip and a bare wake, which are
        // also the "before" of the next run (or of this one's retry).
        let mut tries = 0;
        loop {
            eprintln!("running {name} ...");
            let started = std::time::Instant::now();
            let result = runner(&ctx);
            let rt = common::cache_line_round_trip(&ctx)?;
            eprintln!("cache-line round trip: {rt:.1} ns");
            round_trips.push(rt);
            wakes.push(bare_wake(&ctx)?);
            let i = round_trips.len() - 2;
            match result {
                Ok(mut r) => {
                    eprintln!("  {name} done in {:.1} s", started.elapsed().as_secs_f64());
                    let (before, after) = (round_trips[i], round_trips[i + 1]);
                    if !steady(before, after) && tries < args.steady_retries {
                        tries += 1;
                        eprintln!(
                            "  the round trip moved from {before:.0} to {after:.0} ns: {name} again ({tries} of {})",
                            args.steady_retries
                        );
                        continue;
                    }
                    if tries > 0 {
                        r.note(format!(
                            "{name}: kept run {} (earlier runs had the round trip move across them)",
                            tries + 1
                        ));
                    }
                    reports.push((r, i));
                }
                Err(e) => {
                    eprintln!("  {name} skipped: {e}");
                    skipped.push(format!("{name} skipped: {e}"));
                }
            }
            break;
        }
    }

    let reports: Vec<RuntimeReport> = reports
        .into_iter()
        .map(|(mut r, i)| {
            let (before, after) = (round_trips[i], round_trips[i + 1]);
            r.round_trip_ns = Some((before + after) / 2.0);
            let (wb, wa) = (wakes[i], wakes[i + 1]);
            r.bare_wake_ns = Some(((wb.0 + wa.0) / 2.0, (wb.1 + wa.1) / 2.0));
            if !steady(before, after) {
                r.note(format!(
                    "{}: the round trip moved from {before:.0} to {after:.0} ns across its run (the host moved the vCPUs): its RT ratios are uncertain",
                    r.runtime
                ));
            }
            r
        })
        .collect();
    let rt = crate::stats::Summary::of(&round_trips)
        .map(|s| s.median)
        .unwrap_or(f64::NAN);
    eprintln!(
        "round trips measured: {:?} ns; median {rt:.1} ns",
        round_trips.iter().map(|r| r.round()).collect::<Vec<_>>()
    );
    let wake = crate::stats::Summary::of(&wakes.iter().map(|w| w.0).collect::<Vec<_>>())
        .map(|s| s.median)
        .unwrap_or(f64::NAN);
    let results = output::Results::new(rt, wake, &reports);
    print!("{}", output::markdown(&results, &reports));
    for s in &skipped {
        println!("- {s}");
    }
    if let Some(path) = &args.json {
        output::write_json(&results, path)?;
    }
    Ok(())
}
